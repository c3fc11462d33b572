"""Who held back whom: each wait attributed to the worker whose delivery ended it (shoal.engine.stragglers)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from shoal.cli import app
from shoal.engine.stragglers import analyse

from conftest import FAST


def it(t, worker, wait=0.0, compute=0.1, comm=0.0, group=0):
    return {"event": "iteration", "t": t, "worker": worker, "group": group, "wait_s": wait, "compute_s": compute,
            "comm_s": comm}


def test_a_barrier_wait_is_charged_to_the_worker_whose_delivery_ended_it():
    """Two BSP rounds: worker 1 takes 0.4 s, worker 0 0.1 s, so worker 0 waits 0.3 s for it each round."""
    events = [it(0.1, 0), it(0.4, 1, compute=0.4), it(0.5, 0, wait=0.3), it(0.8, 1, compute=0.4),
              {"event": "eval", "t": 0.8}]
    s = analyse(events, 2)
    assert s.waited_s == pytest.approx([0.3, 0.0]) and s.held_back_s == pytest.approx([0.0, 0.3])
    assert s.waited_for == {0: {1: pytest.approx(0.3)}} and s.culprit == 1
    assert s.verdict().startswith("worker 1 held the others back: 100% of all waiting (0.3 s of 0.3 s)")


def test_a_wait_nobody_ended_is_unattributed_and_no_waiting_names_nobody():
    s = analyse([it(0.1, 0), it(0.5, 0, wait=0.2)], 2)  # nothing was delivered at 0.4
    assert s.unattributed_s == pytest.approx(0.2) and s.held_back_s == [0.0, 0.0]
    quiet = analyse([it(0.1, 0), it(0.1, 1), it(0.2, 0), it(0.2, 1)], 2)
    assert quiet.culprit is None and quiet.verdict() == "no worker held the others back (the workers waited 0% of their time)"


@pytest.mark.parametrize("scheme, slow_share", [("bsp", 0.95), ("ssp", 0.95)])
def test_the_simulator_names_the_slow_worker(tmp_path, scheme, slow_share):
    args = [a for s in FAST + [f"sync.scheme={scheme}", "sync.ssp.staleness=1", "cluster.speeds=[1, 1, 1, 4]",
                                "run.stop_at_target=false", "run.max_time_s=1"] for a in ("--set", s)]
    result = CliRunner().invoke(app, ["train", *args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    stragglers = json.loads((tmp_path / "run" / "summary.json").read_text())["stragglers"]
    assert stragglers["culprit"] == 3 and "stragglers: worker 3 held the others back" in result.output
    waited = sum(stragglers["waited_s"])
    assert stragglers["held_back_s"][3] >= slow_share * waited and stragglers["unattributed_s"] <= 0.05 * waited


def test_asynchronous_workers_never_wait(tmp_path):
    args = [a for s in FAST + ["sync.scheme=asp", "cluster.speeds=[1, 1, 1, 4]", "run.max_time_s=1"]
            for a in ("--set", s)]
    result = CliRunner().invoke(app, ["train", *args, "--out", str(tmp_path / "run")])
    stragglers = json.loads((tmp_path / "run" / "summary.json").read_text())["stragglers"]
    assert result.exit_code == 0 and stragglers["culprit"] is None and sum(stragglers["waited_s"]) == 0


def test_the_comparison_report_says_who_held_back_whom(tmp_path):
    args = [a for s in FAST + ["cluster.speeds=[1, 1, 1, 4]", "run.max_time_s=1"] for a in ("--set", s)]
    result = CliRunner().invoke(app, ["compare", *args, "--schemes", "bsp,asp", "--out", str(tmp_path / "cmp"), "-q"])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert "Who held back whom" in page and "<b>bsp</b>: worker 3 held the others back" in page
    assert "<b>asp</b>: no worker held the others back" in page
