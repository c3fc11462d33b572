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
        ("sync.groups=0", "sync.groups"),
        ("cluster.speeds=[1, 0, 1, 1, 1, 1, 1, 1]", "cluster.speeds: must be a non-empty list of positive numbers"),
        ("model.hidden=[]", "model.hidden"),
        ("sync.groups=\"many\"", "sync.groups"),
        ("sync.exchange_every=0", "sync.exchange_every"),
        ("sync.group_threshold=1.5", "sync.group_threshold"),
        ("sync.profile_window=0", "sync.profile_window"),
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
                             "cluster.speed_changes=[{worker = 1, at_s = 2.5, speed = 4.0}]", "sync.groups=3"])
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
