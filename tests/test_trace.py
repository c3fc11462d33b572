"""`shoal trace`: a run's metrics.jsonl as a Chrome / Perfetto trace (Trace Event Format, JSON object form)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import FAST
from shoal.report.trace import build_trace, iteration_slices
from test_cli_train import shoal

PHASES = {"X", "M", "C", "i"}


def check_trace_format(doc: dict) -> None:
    """What Perfetto's JSON importer requires of every event we write."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES and isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index") and "args" in e
            continue
        assert isinstance(e["ts"], int) and e["ts"] >= 0 and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")


def test_an_iteration_is_laid_out_backwards_from_its_end_in_run_order():
    record = {"event": "iteration", "t": 1.0, "worker": 3, "group": 1, "clock": 7, "staleness": 2,
              "wait_s": 0.1, "pull_s": 0.05, "comm_s": 0.15, "compute_s": 0.2, "loss": 1.5}
    slices = iteration_slices(record)
    assert [(s["name"], s["ts"], s["dur"]) for s in slices] == [
        ("wait", 550_000, 100_000), ("pull", 650_000, 50_000), ("compute", 700_000, 200_000),
        ("push", 900_000, 100_000)]
    assert all(s["tid"] == 3 and s["args"]["clock"] == 7 for s in slices)
    without_pull = iteration_slices({**record, "pull_s": None, "wait_s": 0.0})
    assert [s["name"] for s in without_pull] == ["compute", "pull+push"]


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
                max_size=30))
def test_slices_never_overlap_within_an_iteration_and_sum_to_its_time(rows):
    t = 10.0
    for worker, wait, pull, push, compute in rows:
        record = {"event": "iteration", "t": t, "worker": worker, "wait_s": wait, "pull_s": pull,
                  "comm_s": pull + push, "compute_s": compute}
        slices = iteration_slices(record)
        for a, b in zip(slices, slices[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1  # rounding to microseconds
        total = sum(s["dur"] for s in slices)
        assert abs(total - round((wait + pull + push + compute) * 1e6)) <= len(slices)
        if slices:
            assert abs(slices[-1]["ts"] + slices[-1]["dur"] - t * 1e6) <= len(slices)


def test_trace_of_a_gssp_run_has_a_track_per_worker_and_group_server(tmp_path):
    sets = [a for o in FAST + ["sync.scheme=gssp", "cluster.speeds=[1,1,4,4]", "run.stop_at_target=false"]
            for a in ("--set", o)]
    run = tmp_path / "run"
    assert shoal("train", *sets, "--out", str(run), "--quiet").returncode == 0
    result = shoal("trace", str(run))
    assert result.returncode == 0, result.stderr
    assert "ui.perfetto.dev" in result.stdout
    doc = json.loads((run / "trace.json").read_text())
    check_trace_format(doc)
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {names[(1, w)] for w in range(4)} == {f"worker {w}" for w in range(4)}
    assert names[(0, 0)] == "run"
    assert any(pid == 2 for pid, _ in names), "the group servers exchange, so they have tracks"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    iterations = [r for r in records if r["event"] == "iteration"]
    compute = defaultdict(float)
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["name"] == "compute":
            compute[e["tid"]] += e["dur"] / 1e6
    for w in range(4):
        assert compute[w] == pytest.approx(sum(r["compute_s"] for r in iterations if r["worker"] == w), abs=1e-3)
    marks = [e["name"] for e in doc["traceEvents"] if e["ph"] == "i" and e["s"] == "g"]
    assert "groups: profiled" in marks and marks[-2].startswith("end")
    summary = json.loads((run / "summary.json").read_text())
    assert marks[-1] == f"stragglers: {summary['stragglers']['verdict']}"  # the run's verdict closes its track
    assert doc["otherData"]["stragglers"] == summary["stragglers"]["verdict"]
    counters = [e["name"] for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counters.count("accuracy") == sum(r["event"] == "eval" for r in records)
    assert counters.count("learning rate") == 1  # the start's: nothing changes it


def test_the_learning_rate_is_a_counter_from_the_start_through_every_stair(tmp_path):
    from shoal.config import load_config
    from shoal.runner import train

    train(load_config(None, FAST + ["optimizer.warmup_epochs=1", "optimizer.cosine_epochs=1",
                                    "run.stop_at_target=false"]), tmp_path / "r")
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    doc = build_trace(records)
    check_trace_format(doc)
    rates = [(e["ts"], e["args"]["lr"]) for e in doc["traceEvents"] if e["name"] == "learning rate"]
    assert rates[0] == (0, pytest.approx(0.1 / 32)) and max(lr for _, lr in rates) == pytest.approx(0.1)
    assert [t for t, _ in rates] == sorted(t for t, _ in rates)
    assert len(rates) == 1 + sum(r["event"] in ("lr_warmup", "lr_cosine") for r in records) > 40


def test_bad_trace_input_is_one_line_exit_2(tmp_path):
    assert build_trace([])["traceEvents"]  # an empty run still names its tracks
    empty = shoal("trace", str(tmp_path))
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1 and "no metrics.jsonl" in empty.stderr
    (tmp_path / "metrics.jsonl").write_text('{"event": "start", "t": 0}\nnot json\n{"event": "end", "t": 1}\n')
    bad = shoal("trace", str(tmp_path))
    assert bad.returncode == 2 and "metrics.jsonl:2: not a JSON line" in bad.stderr
    (tmp_path / "metrics.jsonl").write_text('{"event": "start", "t": 0}\n')
    quiet = shoal("trace", str(tmp_path))
    assert quiet.returncode == 2 and "log_iterations" in quiet.stderr
    assert not (tmp_path / "trace.json").exists()
