"""Config loading, overrides, and one-line rejections of bad input."""

import re

import pytest

from shoal.config import Config, ConfigError, build_config, load_config, to_toml
import tomllib


def test_defaults_are_valid():
    cfg = load_config(None)
    assert cfg.sync.scheme == "bsp" and cfg.cluster.workers == 8


def test_overrides_are_typed_from_toml():
    cfg = load_config(None, ["cluster.workers=3", "cluster.speeds=[1, 2, 4]", "sync.scheme=ssp", "run.seed=7"])
    assert cfg.cluster.workers == 3 and cfg.cluster.speeds == [1, 2, 4]
    assert cfg.sync.scheme == "ssp" and cfg.run.seed == 7


def test_nested_section_override():
    cfg = load_config(None, ["cluster.stragglers.probability=0.1"])
    assert cfg.cluster.stragglers.probability == 0.1


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("cluster.wokers=3", "cluster.wokers: unknown key"),
        ("bogus.key=1", "bogus: unknown key"),
        ("cluster.workers=0", "cluster.workers"),
        ("cluster.workers=\"many\"", "cluster.workers"),
        ("cluster.link_gbps=-1", "cluster.link_gbps"),
        ("sync.scheme=bogus", "sync.scheme"),
        ("data.name=idx:/does/not/exist", "does not exist"),
        ("data.name=imagenet", "unknown data set"),
        ("run.target_accuracy=1.5", "run.target_accuracy"),
        ("optimizer.lr=0", "optimizer.lr"),
        ("sync.gssp.groups=0", "sync.gssp.groups"),
        ("cluster.speeds=[1, 0, 1, 1, 1, 1, 1, 1]", "cluster.speeds: must be a non-empty list of positive numbers"),
        ("model.hidden=[]", "model.hidden"),
        ("sync.gssp.groups=\"many\"", "sync.gssp.groups"),
        ("sync.gssp.exchange_every=0", "sync.gssp.exchange_every"),
        ("sync.gssp.group_threshold=1.5", "sync.gssp.group_threshold"),
        ("sync.gssp.profile_window=0", "sync.gssp.profile_window"),
        ("compression.method=zip", "compression.method"),
        ("compression.gdtopk.final_density_fast=2", "compression.gdtopk.final_density_fast"),
        ("compression.gdtopk.warmup_epochs=-1", "compression.gdtopk.warmup_epochs"),
        ("cluster.speed_changes=[{worker = 99, at_s = 1.0, speed = 2.0}]", "speed_changes names worker 99"),
        ("cluster.speed_changes=[{worker = 0, at_s = 1.0}]", "cluster.speed_changes.0.speed"),
    ],
)
def test_bad_values_name_the_key(override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    message = str(err.value)
    assert fragment in message and "\n" not in message


def test_speeds_must_match_workers():
    with pytest.raises(ConfigError, match="speeds has 2 entries but workers = 3"):
        load_config(None, ["cluster.workers=3", "cluster.speeds=[1, 2]"])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nseed = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_malformed_override():
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(None, ["workers"])


def test_resolved_config_round_trips_through_toml():
    cfg = load_config(None, ["cluster.speeds=[1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]", "run.seed=3",
                             "cluster.speed_changes=[{worker = 1, at_s = 2.5, speed = 4.0}]", "sync.gssp.groups=3"])
    again = build_config(tomllib.loads(to_toml(cfg)))
    assert again == cfg


def test_examples_load():
    from pathlib import Path

    for path in sorted(Path(__file__).parents[1].glob("examples/*.toml")):
        assert isinstance(load_config(path), Config)


@pytest.mark.parametrize("overrides, fragment", [
    (["sync.intra_group=allreduce", "sync.scheme=asp"], "synchronous: sync.scheme"),
    (["sync.intra_group=allreduce", "compression.method=topk"], "dense gradients"),
    (["sync.intra_group=allreduce", "network.aggregation=ina"], "in-network aggregation"),
    (["sync.intra_group=ring"], "sync.intra_group"),
])
def test_allreduce_groups_refuse_what_they_do_not_run(overrides, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_config(None, overrides)


@pytest.mark.parametrize("overrides, path, reason", [
    ([], "server", "the simulator models the server path"),
    (["backend.name=ray"], "allreduce", "bsp on ray with dense gradients"),
    (["backend.name=ray", "compression.method=topk"], "server", "compresses at the server"),
    (["backend.name=ray", "compression.similarity.enabled=true"], "server", "SIM decides at the server"),
    (["backend.name=ray", "backend.max_restarts=1"], "server", "rejoins from its server"),
    (["backend.name=ray", "sync.scheme=gssp"], "server", "gssp is not one synchronous round"),
    (["backend.name=ray", "sync.scheme=asp"], "server", "asp is not one synchronous round"),
    (["backend.name=ray", "sync.intra_group=server"], "server", "set in the config (auto would take allreduce"),
    (["sync.intra_group=allreduce"], "allreduce", "set in the config (auto would take server"),
])
def test_the_automatic_data_path_is_the_fastest_correct_one_and_says_why(overrides, path, reason):
    cfg = load_config(None, overrides)
    assert cfg.sync.intra_group == path and reason in cfg.data_path()["why"]
    assert f'intra_group = "{path}"' in to_toml(cfg)  # a run's config.toml records the path that ran


def test_scheme_options_live_in_their_own_sections_and_the_section_defaults_are_gssps():
    from shoal.config import GSSPOptions
    from shoal.sync.gssp import GSSP

    cfg = load_config(None, ["sync.scheme=gssp", "sync.gssp.paced=false", "sync.ssp.staleness=5"])
    assert cfg.sync.gssp.paced is False and cfg.sync.ssp.staleness == 5 and cfg.sync.gssp.staleness == 3
    plain = GSSP(8)  # no options: exactly the config's defaults
    assert plain.options == GSSPOptions() == Config().sync.gssp
    assert (plain.split_ratio, plain.transient_factor, plain.paced) == (1.5, 2.0, True)


def test_old_flat_sync_keys_map_into_every_section_that_has_them_with_one_deprecation_each():
    from shoal.errors import ConfigDeprecation

    with pytest.warns(ConfigDeprecation) as said:
        cfg = load_config(None, ["sync.paced=false", "sync.staleness=2", "sync.local_steps=5", "sync.outer_lr=0.5",
                                 "sync.diloco.local_steps=9"])
    assert sorted(str(w.message) for w in said) == [
        "sync.local_steps is deprecated: use sync.localsgd.local_steps and sync.diloco.local_steps",
        "sync.outer_lr is deprecated: use sync.diloco.outer_lr",
        "sync.paced is deprecated: use sync.gssp.paced",
        "sync.staleness is deprecated: use sync.ssp.staleness and sync.gssp.staleness",
    ]
    assert cfg.sync.gssp.paced is False and cfg.sync.ssp.staleness == cfg.sync.gssp.staleness == 2
    assert cfg.sync.localsgd.local_steps == 5 and cfg.sync.diloco.local_steps == 9  # the section's own key wins
    assert cfg.sync.diloco.outer_lr == 0.5
    resolved = tomllib.loads(to_toml(cfg))["sync"]  # written back in sections only: a rerun warns about nothing
    assert "paced" not in resolved and resolved["gssp"]["paced"] is False


def test_the_cli_prints_one_warning_line_per_old_key_and_trains(tmp_path):
    import subprocess
    import sys

    from conftest import FAST

    out = tmp_path / "run"
    sets = FAST + ["sync.scheme=gssp", "sync.paced=false", "sync.staleness=2", "run.max_time_s=1"]
    done = subprocess.run([sys.executable, "-m", "shoal", "train", "-q", "--out", str(out),
                           *[a for o in sets for a in ("--set", o)]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("warning:")] == [
        "warning: sync.paced is deprecated: use sync.gssp.paced",
        "warning: sync.staleness is deprecated: use sync.ssp.staleness and sync.gssp.staleness"]
    assert "Traceback" not in done.stderr and (out / "summary.json").is_file()


def test_the_resolved_config_is_tomlkit_toml_that_reads_back_equal_with_arrays_on_one_line():
    cfg = load_config(None, ["cluster.workers=3", "cluster.speeds=[1.0, 2.5, 4.0]",
                             "cluster.membership=[{at_s = 3.0, add = 1}]", "model.options={width = 3, deep = {a = 1}}",
                             "sync.scheme=gssp", "sync.gssp.groups=2"])
    text = to_toml(cfg)
    assert "speeds = [1.0, 2.5, 4.0]\n" in text and "[sync.gssp]\n" in text and "[[cluster.membership]]\n" in text
    assert build_config(tomllib.loads(text)) == cfg
