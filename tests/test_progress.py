"""What `shoal train` shows while it runs: percent and ETA of the first budget to end, plain lines off a terminal,
a compact worker table for large clusters."""

from __future__ import annotations

import io
import math

from rich.console import Console

from shoal.progress import TrainProgress, budget_fraction, clock, describe, eta_s, worker_table


def test_the_budget_that_ends_first_sets_the_fraction():
    assert budget_fraction({"t": 30.0, "iterations": 10}, 60.0, 0) == 0.5
    assert budget_fraction({"t": 30.0, "iterations": 90}, 60.0, 100) == 0.9  # the iteration budget is nearer
    assert budget_fraction({"t": 30.0, "iterations": 10}, math.inf, 0) is None  # nothing to extrapolate to
    assert budget_fraction({"t": 80.0, "iterations": 0}, 60.0, 0) == 1.0


def test_eta_extrapolates_the_wall_time_spent():
    assert eta_s(0.25, 10.0) == 30.0
    assert eta_s(None, 10.0) is None and eta_s(0.0, 10.0) is None
    assert clock(65) == "1:05" and clock(3723) == "1:02:03" and clock(None) == "-"


def test_a_line_says_percent_eta_and_missing_values_in_words():
    line = describe({"t": 12.0, "iterations": 300, "accuracy": None, "rates": [10.0, 2.5]}, 0.2, 48.0)
    assert line == "t=12.0s  iters=300  acc -  it/s 10/2.5  20%, ETA 0:48"
    assert describe({"t": 0.0, "iterations": 0, "status": "starting actors: 3/8 ready"}, None, None) == \
        "starting actors: 3/8 ready"


def test_off_a_terminal_progress_is_plain_periodic_lines():
    out = io.StringIO()
    now = [0.0]
    console = Console(file=out, force_terminal=False, width=200)
    with TrainProgress(console, False, 100.0, 0, now=lambda: now[0]) as update:
        for second in range(1, 31):
            now[0] = float(second)
            update({"t": float(second), "iterations": 10 * second, "accuracy": 0.5})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # one line per 10 wall seconds
    assert lines[0].startswith("training: t=1.0s  iters=10  acc=0.5000") and "1%, ETA 1:39" in lines[0]
    assert "\x1b" not in out.getvalue()  # no terminal control codes in a log file


def test_quiet_gives_no_callback():
    with TrainProgress(Console(file=io.StringIO()), True, 10.0, 0) as update:
        assert update is None


def _summary(n: int) -> dict:
    workers = [{"id": w, "group": 0, "speed": 1.0 + w % 4, "iterations": 100 + w, "compute_s": 1.0, "wait_s": 0.5,
                "comm_s": 0.25} for w in range(n)]
    return {"scheme": "asp", "backend": "sim", "stop_reason": "time_budget", "per_worker": workers}


def _text(table) -> str:
    out = io.StringIO()
    Console(file=out, width=120).print(table)
    return out.getvalue()


def test_small_clusters_list_every_worker_and_large_ones_quantiles_and_extremes():
    assert _text(worker_table(_summary(4))).count("\n") < 12
    big = _text(worker_table(_summary(1024)))
    assert big.count("\n") < 25  # not a 1,033-line table
    for label in ("min", "p25", "median", "p75", "max", "slowest", "fastest"):
        assert label in big
    assert "1123" in big and " 100 " in big  # the fastest and slowest workers' iteration counts
