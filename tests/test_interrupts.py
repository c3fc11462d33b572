"""What a run that does not end normally says: Ctrl-C in compare stops everything, a diverged run is loud."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, ROOT, default_sigint

SETS = sum((["-s", o] for o in FAST), [])


def wait_for(path: Path, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_stops_the_whole_comparison_keeps_what_finished_and_exits_130(tmp_path, jobs):
    """Ctrl-C (SIGINT to the terminal's process group) while the third scheme runs: the later schemes never start,
    compare.json lists the finished rows (the cut-short ones are not among them), and no report is drawn."""
    out = tmp_path / "cmp"
    long = "ssp@run.max_iterations=0"  # the one run that would go on for minutes: it is cut short
    schemes = f"bsp,asp,{long},localsgd"
    args = [sys.executable, "-m", "shoal", "compare", "--schemes", schemes, *SETS, "-s", "run.max_time_s=500",
            "-s", "run.max_iterations=200", "-s", "run.stop_at_target=false", "-o", str(out), "--jobs", jobs]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    try:
        wait_for(out / "bsp" / "summary.json", 150)
        wait_for(out / long / "metrics.jsonl", 150)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted:" in err and "--resume" in err and "Traceback" not in err
    result = json.loads((out / "compare.json").read_text())
    assert result["interrupted"] is True and result["runs_planned"] == 4
    rows = {r["scheme"]: r for r in result["rows"]}
    assert rows["bsp"]["interrupted"] is False and long not in rows
    assert not (out / "localsgd" / "summary.json").exists() or jobs == "2"
    assert not (out / "report.html").exists()


@pytest.mark.timeout(120)
def test_a_diverged_run_says_so_in_one_line_and_exits_3(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "shoal", "train", *sum((["--set", o] for o in FAST), []),
                           "--set", "optimizer.lr=1e6", "--out", str(tmp_path / "run"), "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the run diverged") and "optimizer.lr" in lines[0]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stop_reason"] == "diverged"
