"""compare.json rows: one per scheme, the run summary plus the speed-up over BSP.

With several seeds a row holds medians; a seed that never reached the
target counts as infinitely slow, so a median that falls on such a seed is
reported as "not reached" (null) rather than silently ignoring it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

SEED_FIELDS = (
    "seed", "run_dir", "time_to_target_s", "final_accuracy", "best_accuracy", "bytes_up", "bytes_down",
    "bytes_exchange", "iterations", "elapsed_s", "wall_s", "stop_reason",
)
MEDIAN_FIELDS = (
    "final_accuracy", "best_accuracy", "bytes_up", "bytes_down", "bytes_exchange", "iterations", "elapsed_s", "wall_s",
)


def median_time(times: list[float | None]) -> float | None:
    """Median time to target where None (not reached) counts as infinity; None if the median is unreached."""
    if not times:
        return None
    value = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(value) else value


def median_or_none(values: list[Any]) -> Any:
    """Median of the values that are present; None when none are."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def speedup(bsp_time: float | None, time: float | None) -> float | None:
    """BSP's time to target over this scheme's; None when either is missing (or zero)."""
    if bsp_time is None or time is None or time <= 0:
        return None
    return round(bsp_time / time, 6)


def single_row(scheme: str, summary: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """The row of a one-seed comparison: the whole summary, named by the scheme spec."""
    return {**summary, "scheme": scheme, "sync_scheme": summary.get("scheme"), "run_dir": run_dir}


def seeds_row(scheme: str, summaries: list[dict[str, Any]], run_dirs: list[str], seeds: list[int]) -> dict[str, Any]:
    """The row of a multi-seed comparison: medians, plus each seed's key fields."""
    per_seed = [
        {k: v for k, v in {**s, "seed": seed, "run_dir": d}.items() if k in SEED_FIELDS}
        for s, d, seed in zip(summaries, run_dirs, seeds)
    ]
    first = summaries[0]
    row: dict[str, Any] = {
        "scheme": scheme,
        "sync_scheme": first.get("scheme"),
        "backend": first.get("backend"),
        "mode": first.get("mode"),
        "target_accuracy": first.get("target_accuracy"),
        "time_to_target_s": median_time([s.get("time_to_target_s") for s in summaries]),
        "reached": sum(s.get("time_to_target_s") is not None for s in summaries),
    }
    for key in MEDIAN_FIELDS:
        if any(key in s for s in summaries):
            row[key] = median_or_none([s.get(key) for s in summaries])
    row["groups"] = first.get("groups")
    row["per_worker"] = first.get("per_worker")
    row["run_dir"] = run_dirs[0]
    row["seeds"] = per_seed
    return row


def add_speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set ``speedup_vs_bsp`` on every row (None for all when no plain bsp row exists)."""
    bsp = next((r for r in rows if r["scheme"] == "bsp"), None)
    bsp_time = bsp["time_to_target_s"] if bsp is not None else None
    for row in rows:
        row["speedup_vs_bsp"] = speedup(bsp_time, row["time_to_target_s"])
    return rows
