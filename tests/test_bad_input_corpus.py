"""Every malformed use a new user tried (issue 17's list, and the older ones), through the real entry point.

Each case must exit 2 with exactly one line on stderr, no traceback, and
write nothing: the output folder it names does not appear, and a folder
that existed keeps its files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shoal.cli import main

FAST = ["--set", "data.name=digits", "--set", "model.name=mlp", "--set", "model.hidden=[16]", "--set", "cluster.workers=2",
        "--set", "run.max_time_s=1"]

#: (case, argv after `shoal`, a fragment of the one error line); OUT is replaced by a fresh folder that must stay absent
TRAIN = [
    ("lr inf", ["--set", "optimizer.lr=inf"], "optimizer.lr"),
    ("weight decay inf", ["--set", "optimizer.weight_decay=inf"], "optimizer.weight_decay"),
    ("two decay schedules", ["--set", "optimizer.cosine_epochs=2", "--set", "optimizer.lr_decay_epochs=[1]"],
     "two decay schedules"),
    ("compute inf", ["--set", "cluster.compute_s=inf"], "cluster.compute_s"),
    ("latency inf", ["--set", "cluster.latency_ms=inf"], "cluster.latency_ms"),
    ("lognormal sigma 1000", ["--set", "cluster.profile=lognormal", "--set", "cluster.lognormal_sigma=1000"], "cluster.lognormal_sigma"),
    ("batch larger than a shard", ["--set", "data.batch_size=100000"], "batch_size"),
    ("negative decay epoch", ["--set", "optimizer.lr_decay_epochs=[-1]"], "optimizer.lr_decay_epochs"),
    ("gdtopk densities inverted", ["--set", "compression.compressor=gdtopk", "--set", "compression.gdtopk.final_density_fast=0.5",
                                   "--set", "compression.gdtopk.final_density_slow=0.1"], "final_density_fast"),
    ("unbounded budget", ["--set", "run.max_time_s=inf"], "run.max_time_s"),
    ("groups auto2", ["--set", "sync.scheme=gssp", "--set", "sync.gssp.groups=auto2"], "sync.gssp.groups"),
    ("sim checkpoints without rounds", ["--set", "sync.scheme=asp", "--set", "backend.sim_checkpoint_every_s=1"],
     "backend.sim_checkpoint_every_s"),
    ("balance an asynchronous scheme", ["--set", "sync.scheme=asp", "--set", "sync.balance=batch"], "--set: sync.balance:"),
    ("balance bounds exclude the batch", ["--set", "sync.balance=batch", "--set", "balance.max_batch=8"], "balance"),
    ("balance mode unknown", ["--set", "sync.balance=samples"], "sync.balance"),
    ("section as a number", ["--set", "cluster=3"], "cluster"),
    ("key under a number", ["--set", "run.seed.x=1"], "run.seed"),
    ("misspelt key", ["--set", "optimizer.lrr=0.1"], "did you mean"),
    ("misspelt section", ["--set", "optimiser.lr=0.1"], "did you mean"),
    ("unknown backend", ["--backend", "spark"], "--backend"),
    ("unknown flag", ["--frobnicate"], "frobnicate"),
    ("unclosed array", ["--set", "cluster.speeds=[1,2"], "not valid TOML"),
    ("misspelt scheme", ["--set", "sync.scheme=gsp"], "--set: sync.scheme: unknown scheme 'gsp' (did you mean 'gssp'?)"),
    ("misspelt choice", ["--set", "sync.intra_group=allreduc"], "(did you mean 'allreduce'?)"),
    ("missing config file", ["--config", "nope.toml"], "nope.toml"),
]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["shoal", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return int(exit_info.value.code or 0), capsys.readouterr().err


def assert_one_line(code: int, err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(("case", "args", "fragment"), TRAIN, ids=[c[0] for c in TRAIN])
def test_train_refuses_in_one_line_and_writes_nothing(tmp_path: Path, capsys, monkeypatch, case: str, args: list[str], fragment: str) -> None:
    out = tmp_path / "r"
    monkeypatch.chdir(tmp_path)
    code, err = run_main(["train", "--out", str(out), "-q", *FAST, *args], capsys, monkeypatch)
    assert_one_line(code, err, fragment)
    assert not out.exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("sets", "blamed"), [([], "bad.toml: sync.balance:"), (["--set", "run.seed=3"], "bad.toml with --set: sync.balance:"),
                                              (["--set", "sync.balance=batch"], "error: --set: sync.balance:")])
def test_a_check_across_sections_blames_where_its_key_was_written(tmp_path: Path, capsys, monkeypatch, sets: list[str],
                                                                  blamed: str) -> None:
    """A check that spans sections (balance needs rounds) names its key: on --set when an override wrote it, on the
    file when the file did, and on both when the file's values meet the overrides."""
    (tmp_path / "bad.toml").write_text('[sync]\nscheme = "asp"\nbalance = "batch"\n')
    code, err = run_main(["train", "--config", str(tmp_path / "bad.toml"), "--dry-run", *sets], capsys, monkeypatch)
    assert_one_line(code, err, blamed)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("args", "line"), [
    (["--schemes", "bsp,asp+balance"], "error: scheme asp+balance: sync.balance: 'batch' sizes the work of synchronous"),
    (["--schemes", "bsp@optimizer.lr=-1"], "error: scheme bsp@optimizer.lr=-1: optimizer.lr: Input should be greater"),
    (["--schemes", "bsp", "--set", "optimizer.lr=-1"], "error: --set: optimizer.lr: Input should be greater than 0"),
    (["--schemes", "bsp", "--tune-seeds", "1", "--tune", "optimizer.lr=0.1,-1"], "error: scheme bsp: --tune: optimizer.lr:"),
])
def test_compare_blames_the_scheme_spec_the_set_or_the_tune_that_wrote_a_bad_value(tmp_path: Path, capsys, monkeypatch,
                                                                                 args: list[str], line: str) -> None:
    out = tmp_path / "cmp"
    code, err = run_main(["compare", "--out", str(out), "-q", *FAST, *args], capsys, monkeypatch)
    assert_one_line(code, err, line)
    assert err.startswith(line) and not out.exists()


@pytest.mark.timeout(60)
def test_compare_blames_the_file_for_a_value_it_wrote_that_a_scheme_cannot_take(tmp_path: Path, capsys, monkeypatch):
    (tmp_path / "bal.toml").write_text('[sync]\nscheme = "bsp"\nbalance = "batch"\n')  # fine for bsp, not for asp
    code, err = run_main(["compare", "--config", str(tmp_path / "bal.toml"), "--schemes", "bsp,asp", "--out",
                          str(tmp_path / "cmp"), "-q"], capsys, monkeypatch)
    assert_one_line(code, err, f"error: scheme asp: {tmp_path / 'bal.toml'}: sync.balance: 'batch' sizes the work")


@pytest.mark.parametrize("command", ["train", "compare"])
@pytest.mark.parametrize("target", ["/proc/1/nope", "afile/sub"])
def test_an_unwritable_out_folder_is_one_line(tmp_path: Path, capsys, monkeypatch, command: str, target: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file, not a folder")
    extra = ["--schemes", "bsp"] if command == "compare" else []
    code, err = run_main([command, "--out", target, "-q", *FAST, *extra], capsys, monkeypatch)
    assert_one_line(code, err, "--out")
    assert (tmp_path / "afile").read_text() == "a file, not a folder"


def report_folder(tmp_path: Path, compare: object | None, summary: str | None = None) -> Path:
    folder = tmp_path / "cmp"
    (folder / "bsp").mkdir(parents=True)
    if compare is not None:
        (folder / "compare.json").write_text(compare if isinstance(compare, str) else json.dumps(compare))
    if summary is not None:
        (folder / "bsp" / "summary.json").write_text(summary)
    return folder


@pytest.mark.parametrize(
    ("case", "compare", "summary", "fragment"),
    [
        ("no compare.json", None, None, "compare.json"),
        ("truncated compare.json", '{"schemes": ["bsp"], "rows": [', None, "compare.json"),
        ("no rows", {"schemes": ["bsp"], "rows": []}, None, "rows"),
        ("no schemes", {"rows": [{"scheme": "bsp", "run_dir": "bsp"}]}, None, "schemes"),
        ("rows not objects", {"schemes": ["bsp"], "rows": [1, 2]}, None, "rows"),
        ("truncated summary", {"schemes": ["bsp"], "rows": [{"scheme": "bsp", "run_dir": "bsp"}]}, '{"stop_reason": ', "summary.json"),
    ],
)
def test_report_refuses_a_broken_folder_and_draws_nothing(tmp_path: Path, capsys, monkeypatch, case: str, compare: object,
                                                          summary: str | None, fragment: str) -> None:
    folder = report_folder(tmp_path, compare, summary)
    before = sorted(p.name for p in folder.rglob("*"))
    code, err = run_main(["report", str(folder)], capsys, monkeypatch)
    assert_one_line(code, err, fragment)
    assert sorted(p.name for p in folder.rglob("*")) == before  # no stray PNG, no half-written page


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["route", "--topology", "fattree:k=4", "--save", "/proc/1/x.json"], "--save"),
        (["route", "--topology", "fattree:k=4", "--plot", "/proc/1/x.png"], "--plot"),
        (["route", "--topology", "fattree:k=4", "--seed", "-1"], "--seed"),
        (["route", "--topology", "fattree:k=4", "--workers", "-3"], "--workers"),
        (["route", "--topology", "fattree:k=1000000"], "--topology"),
        (["trace", "nowhere"], "nowhere"),
    ],
)
def test_other_commands_refuse_in_one_line(tmp_path: Path, capsys, monkeypatch, args: list[str], fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = run_main(args, capsys, monkeypatch)
    assert_one_line(code, err, fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("command", "other"), [("train", "compare.json"), ("compare", "summary.json")])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_run_and_a_comparison_never_share_a_folder(tmp_path: Path, capsys, monkeypatch, command: str, other: str,
                                                     overwrite: list[str]) -> None:
    """train --out into a comparison's folder, compare --out into a run's: one line, exit 2, nothing touched."""
    folder = tmp_path / "taken"
    folder.mkdir()
    (folder / other).write_text("{}")
    extra = ["--schemes", "bsp"] if command == "compare" else []
    code, err = run_main([command, "--out", str(folder), "-q", *FAST, *extra, *overwrite], capsys, monkeypatch)
    assert_one_line(code, err, "a folder of its own")
    assert [p.name for p in folder.iterdir()] == [other]


def test_the_python_api_takes_one_override_as_a_string_and_refuses_other_types(tmp_path: Path) -> None:
    import shoal
    from shoal.api import resolve_config

    assert resolve_config(None, "sync.scheme=gssp").sync.scheme == "gssp"
    with pytest.raises(shoal.ConfigError, match="overrides: expected"):
        resolve_config(None, [("sync.scheme", "gssp")])
    assert {"train", "compare", "load_model", "Result", "Config"} <= set(dir(shoal))
