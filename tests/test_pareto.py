"""The bytes-against-time view of a comparison (report/pareto.py) and the bytes a run moved to its target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.engine.metrics import RunRecorder
from shoal.report.html import write_report
from shoal.report.pareto import Point, pareto_front, points_of
from shoal.report.rows import seeds_row

from test_report import _evals, _start, _summary, _write_run

pytestmark = pytest.mark.timeout(60)


def test_the_front_keeps_what_nothing_beats_on_both():
    points = [("bsp", 10.0, 900.0), ("diloco", 14.0, 90.0), ("slow", 20.0, 95.0), ("streaming", 15.0, 9.0),
              ("tie", 10.0, 900.0)]
    assert pareto_front(points) == ["bsp", "tie", "diloco", "streaming"]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=12))
def test_no_front_point_is_dominated_and_every_other_point_is(coords):
    points = [(f"s{i}", t, b) for i, (t, b) in enumerate(coords)]
    front = set(pareto_front(points))

    def beats(p, q):
        return p[1] <= q[1] and p[2] <= q[2] and (p[1] < q[1] or p[2] < q[2])

    for p in points:
        assert (p[0] in front) == (not any(beats(q, p) for q in points))


def test_bytes_to_target_are_those_of_the_first_evaluation_of_the_streak():
    recorder = RunRecorder()
    for t, value, moved in ((1.0, 0.5, 100), (2.0, 0.95, 200), (3.0, 0.8, 300), (4.0, 0.96, 400), (5.0, 0.97, 500)):
        recorder.bytes_up = moved
        recorder.evaluation(t, value, 0.1, 0.9, patience=2)
    assert recorder.time_to_target_s == 4.0 and recorder.bytes_to_target == 400


def test_rows_carry_median_bytes_to_target_with_a_missed_seed_as_infinite():
    summaries = [{"time_to_target_s": t, "bytes_to_target": b} for t, b in ((1.0, 10), (2.0, 30), (None, None))]
    assert seeds_row("x", summaries, ["a", "b", "c"], [0, 1, 2])["bytes_to_target"] == 30
    old = [{"time_to_target_s": 1.0}]  # written before the field existed: unknown, not "missed"
    assert seeds_row("x", old, ["a"], [0])["bytes_to_target"] is None
    point = points_of([{"scheme": "x", "time_to_target_s": 2.0, "bytes_to_target": 30,
                        "seeds": [{**s, "seed": i} for i, s in enumerate(summaries)]}])[0]
    assert point == Point("x", ((1.0, 10), (2.0, 30)), (2.0, 30), missed=1)


def test_the_report_draws_bytes_against_time_when_runs_record_them(tmp_path: Path):
    rows = []
    for name, ttt, moved in (("bsp", 3.0, 9_000_000), ("diloco", 3.5, 900_000), ("streaming_diloco", 3.5, 90_000)):
        summary = _summary(name, ttt, 80, bytes_to_target=moved)
        _write_run(tmp_path / name, summary, _start(name) + _evals(0.3))
        rows.append({**summary, "scheme": name, "run_dir": name, "speedup_vs_bsp": 1.0})
    (tmp_path / "compare.json").write_text(json.dumps({"schemes": [r["scheme"] for r in rows], "seeds": 1,
                                                       "backend": "sim", "target_accuracy": 0.9, "rows": rows}))
    page = write_report(tmp_path).read_text()
    assert (tmp_path / "bytes_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Pareto front" in page and 'alt="bytes moved against time to target' in page
