"""benchmarks/run_archive.py: a study's finished runs packed into git come back on a fresh checkout as runs that
compare's --resume reads instead of running again; each run's summary says which code made it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from conftest import FAST, ROOT
from shoal.cli import app

sys.path.insert(0, str(ROOT / "benchmarks"))

import run_archive  # noqa: E402


def _compare(out: Path, *extra: str):
    args = ["compare", *[a for o in FAST for a in ("--set", o)], "--set", "run.max_time_s=1.0",
            "--schemes", "bsp,asp", "--seeds", "2", "-q", "--out", str(out), *extra]
    return CliRunner().invoke(app, args)


def test_packed_runs_come_back_and_resume_reads_them_instead_of_running_them(tmp_path):
    runs, archive = tmp_path / "runs", tmp_path / "archive"
    first = _compare(runs / "study")
    assert first.exit_code == 0, first.output
    rows = json.loads((runs / "study" / "compare.json").read_text())["rows"]
    assert (runs / "study" / "bsp" / "seed-0" / "model.safetensors").is_file()  # a run writes its model
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    code = json.loads((runs / "study" / "bsp" / "seed-0" / "summary.json").read_text())["code"]
    assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)  # which code made the run
    assert run_archive.save(runs, archive) == (4, 0)
    assert run_archive.save(runs, archive) == (0, 4)  # the same runs, the same bytes: nothing to commit
    assert sorted(str(p.relative_to(archive)) for p in archive.glob("**/*.tar.gz")) == [
        "study/asp/seed-0.tar.gz", "study/asp/seed-1.tar.gz", "study/bsp/seed-0.tar.gz", "study/bsp/seed-1.tar.gz"]

    fresh = tmp_path / "fresh"  # a new checkout: no runs/
    assert run_archive.restore(fresh, archive) == (4, 0)
    assert not (fresh / "study" / "bsp" / "seed-0" / "model.safetensors").exists()
    again = _compare(fresh / "study", "--resume")
    assert again.exit_code == 0, again.output
    assert json.loads((fresh / "study" / "compare.json").read_text())["rows"] == rows
    assert not (fresh / "study" / "bsp" / "seed-0" / "model.safetensors").exists()  # read, not run again


def test_unfinished_runs_are_not_packed_and_a_run_already_there_is_never_replaced(tmp_path):
    runs, archive = tmp_path / "runs", tmp_path / "archive"
    for name, reason in (("done", "target"), ("cut", "interrupted"), ("crashed", "internal_error")):
        run = runs / "s" / name
        run.mkdir(parents=True)
        (run / "config.toml").write_text(f"# {name}\n")
        (run / "metrics.jsonl").write_text('{"event": "eval", "t": 1.0}\n')
        (run / "summary.json").write_text(json.dumps({"stop_reason": reason}))
    assert run_archive.save(runs, archive) == (1, 0)
    assert [p.name for p in archive.glob("**/*.tar.gz")] == ["done.tar.gz"]

    (runs / "s" / "done" / "summary.json").write_text(json.dumps({"stop_reason": "max_time"}))  # run again since
    assert run_archive.restore(runs, archive) == (0, 1)
    assert json.loads((runs / "s" / "done" / "summary.json").read_text()) == {"stop_reason": "max_time"}
    assert run_archive.save(runs, archive) == (1, 0)  # the newer run replaces its archive


def test_a_file_that_is_not_a_run_archive_is_refused_in_one_line(tmp_path):
    import io
    import tarfile

    bad = tmp_path / "archive" / "s" / "run.tar.gz"
    bad.parent.mkdir(parents=True)
    with tarfile.open(bad, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("../escape.txt"), io.BytesIO(b""))
    done = subprocess.run([sys.executable, "-c", "import sys, run_archive as a; from pathlib import Path; "
                           f"a.restore(Path({str(tmp_path / 'runs')!r}), Path({str(tmp_path / 'archive')!r}))"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT / "benchmarks")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a run archive" in done.stderr
    assert not (tmp_path / "escape.txt").exists()


def test_a_machine_without_git_still_writes_the_summary(tmp_path, monkeypatch):
    """The code's commit is told where git answers; without git a run still ends with its summary, and says
    which CPU and torch computed it either way."""
    from shoal.config import load_config
    from shoal.runner import train

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git binary to be found
    summary = train(load_config(None, FAST + ["run.max_time_s=0.5"]), tmp_path / "run")
    assert summary["code"]["commit"] is None and summary["code"]["version"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["code"] == summary["code"]
    import torch

    from shoal.runner import cpu_model

    assert summary["machine"] == {"cpu": cpu_model(), "torch": torch.__version__}  # what a rerun must share
