"""compare.json rows: one per scheme, the run summary plus the speed-up over BSP.

With several seeds a row holds medians with intervals; a seed that never
reached the target counts as infinitely slow, so a median that falls on such
a seed is reported as "not reached" (null) rather than silently ignoring it.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from shoal.report.tuning import interval, mann_whitney, median_time, speedup_interval

SEED_FIELDS = (
    "seed", "run_dir", "time_to_target_s", "bytes_to_target", "final_accuracy", "best_accuracy", "final_metric",
    "best_metric", "bytes_up", "bytes_down", "bytes_exchange", "peak_push_bytes", "iterations", "elapsed_s", "wall_s",
    "stop_reason", "machine",
)
MEDIAN_FIELDS = (
    "final_accuracy", "best_accuracy", "final_metric", "best_metric", "bytes_up", "bytes_down", "bytes_exchange",
    "peak_push_bytes", "iterations", "elapsed_s", "wall_s",
)


__all__ = ["add_significance", "add_speedups", "median_or_none", "median_time", "seeds_row", "single_row", "speedup", "tuning_entry"]


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
        "time_to_target_interval": interval([s.get("time_to_target_s") for s in summaries]),
        # a seed that never reached the target moved infinitely many bytes to it, as it took infinitely long
        # (runs written before bytes_to_target existed leave it unknown)
        "bytes_to_target": (median_time([s.get("bytes_to_target") for s in summaries])
                            if all("bytes_to_target" in s for s in summaries) else None),
        "reached": sum(s.get("time_to_target_s") is not None for s in summaries),
        "reached_share": round(sum(s.get("time_to_target_s") is not None for s in summaries) / len(summaries), 6),
        "final_accuracy_interval": interval([s.get("final_accuracy") for s in summaries if s.get("final_accuracy")
                                             is not None]),
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
    """Set ``speedup_vs_bsp`` on every row (None for all when no plain bsp row exists).

    Multi-seed rows also get ``speedup_vs_bsp_interval``: the ratio of medians with a bootstrap 95%
    interval (from five seeds on).
    """
    bsp = next((r for r in rows if r["scheme"] == "bsp"), None)
    bsp_time = bsp["time_to_target_s"] if bsp is not None else None
    for row in rows:
        row["speedup_vs_bsp"] = speedup(bsp_time, row["time_to_target_s"])
        if bsp is not None and "seeds" in row and "seeds" in bsp:
            row["speedup_vs_bsp_interval"] = speedup_interval(_seed_times(bsp), _seed_times(row))
    return rows


def best_baseline(rows: list[dict[str, Any]], baselines: set[str]) -> dict[str, Any] | None:
    """The baseline row with the lowest median time to target (unreached: slowest), then the most seeds reached."""
    candidates = [r for r in rows if r["scheme"] in baselines]
    if not candidates:
        return None
    return min(candidates, key=lambda r: (math.inf if r["time_to_target_s"] is None else r["time_to_target_s"],
                                          -r.get("reached", 0)))


def add_significance(rows: list[dict[str, Any]], baselines: set[str]) -> list[dict[str, Any]]:
    """Set ``versus`` (the best baseline's name) and ``p_value`` (Mann-Whitney U of the per-seed times against
    it) on every multi-seed row; the best baseline's own p-value, and every one-seed row's, is None."""
    best = best_baseline(rows, baselines)
    for row in rows:
        row["versus"] = None if best is None else best["scheme"]
        comparable = best is not None and row is not best and "seeds" in row and "seeds" in best
        row["p_value"] = mann_whitney(_seed_times(row), _seed_times(best)) if comparable else None
    return rows


def _seed_times(row: dict[str, Any]) -> list[float | None]:
    return [s.get("time_to_target_s") for s in row["seeds"]]


def final_scores(summaries: list[dict[str, Any]]) -> list[float | None]:
    """Each run's final value of its metric, signed so that higher is better (bits per byte: its negative)."""
    scores = []
    for s in summaries:
        value = s.get("final_metric", s.get("final_accuracy"))
        scores.append(None if value is None else value if s.get("higher_is_better", True) else -value)
    return scores


def tuning_entry(point: dict[str, Any], summaries: list[dict[str, Any]], run_dirs: list[str]) -> dict[str, Any]:
    """One ``--tune`` grid point of a scheme: its values, each seed's time to target and final accuracy, medians."""
    times = [s.get("time_to_target_s") for s in summaries]
    finals = [s.get("final_accuracy") for s in summaries]
    return {"point": point, "time_to_target_s": times, "final_accuracy": finals, "final_score": final_scores(summaries),
            "median_time_to_target_s": median_time(times), "median_final_accuracy": median_or_none(finals),
            "median_final_metric": median_or_none([s.get("final_metric") for s in summaries]),
            "reached": sum(t is not None for t in times), "run_dirs": run_dirs}
