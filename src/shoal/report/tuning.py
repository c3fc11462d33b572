"""Fair comparisons, as pure functions: tuning grids, the choice per scheme, intervals over seeds.

A speed-up only counts against baselines that got the same tuning budget:
every scheme runs the same grid (``--tune KEY=V1,V2``) and its own knobs'
grid (``SchemeSpec.grid``) on development seeds, and each keeps the grid
point with the best median time to target (an unreached seed counts as
infinitely slow), ties broken by the best median final accuracy; the chosen
point is then judged on evaluation seeds it was not chosen on.
Intervals: min..max over seeds always, and a bootstrap 95% interval of the
median from five seeds on (scipy.stats.bootstrap). Significance: a
two-sided Mann-Whitney U test of the per-seed times against the best
baseline's, an unreached seed counting as slower than any reached one.
"""

from __future__ import annotations

import itertools
import math
import statistics
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from shoal.config import key_bounds, parse_override
from shoal.config.files import Bound
from shoal.errors import ConfigError

BOOTSTRAP_FROM = 5  # seeds needed before a bootstrap interval means anything
BOOTSTRAP_SAMPLES = 2000
LEVEL = 0.95  # the intervals' confidence level
_LO, _HI = int((1 - LEVEL) / 2 * BOOTSTRAP_SAMPLES), int((1 + LEVEL) / 2 * BOOTSTRAP_SAMPLES) - 1


def parse_tune(texts: Sequence[str]) -> dict[str, list[Any]]:
    """``["optimizer.lr=0.01,0.02"]`` -> ``{"optimizer.lr": [0.01, 0.02]}`` (values read as TOML)."""
    grid: dict[str, list[Any]] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise ConfigError(f"--tune {text!r}: expected KEY=V1,V2,...")
        if key in grid:
            raise ConfigError(f"--tune {text!r}: {key} is tuned twice")
        values = [parse_override(f"{key}={v}")[1] for v in raw.split(",") if v.strip()]
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"--tune {text!r}: a value is listed twice")
        grid[key] = values
    return grid


def grid_points(grid: dict[str, list[Any]], pinned: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, with pinned keys left out of the search."""
    keys = [k for k in grid if k not in pinned]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def point_label(point: dict[str, Any]) -> str:
    """A folder name for one grid point: ``optimizer.lr=0.02`` (``default`` when nothing is tuned)."""
    return ",".join(f"{k}={v}" for k, v in point.items()) or "default"


def grid_edges(grid: dict[str, list[Any]], point: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """The keys whose kept value is the smallest or largest of a numeric grid of three or more values, as (key,
    value, "smallest" | "largest"): the best may then lie beyond the grid, which a fair comparison should say
    (with two values every choice is an edge, so those are not flagged)."""
    edges = []
    for key, value in point.items():
        values = [v for v in grid.get(key, []) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(set(values)) < 3 or value not in values:
            continue
        if value == min(values):
            edges.append((key, value, "smallest"))
        elif value == max(values):
            edges.append((key, value, "largest"))
    return edges


def edge_margins(row: dict[str, Any], grids: dict[str, dict[str, list[Any]]]) -> list[dict[str, Any]]:
    """How steep the tuning curve is where a row's grid ends: for each edge it kept (``grid_edges``), the kept
    value and the next value in, each with its median time to target on the development seeds (None: the
    median seed never reached it), from the row's own tuning record.

    A kept end that barely beats its neighbour sits on a flat stretch, where a wider grid is unlikely to move
    the row; one that beats it by a wide margin may have its best beyond the grid.
    """
    grid = grids.get(row["scheme"], {})
    kept = row.get("tuned") or {}
    by_point = {_unordered(e["point"]): e.get("median_time_to_target_s") for e in row.get("tuning") or []}
    margins = []
    for key, value, side in grid_edges(grid, kept):
        values = sorted(v for v in grid[key] if isinstance(v, (int, float)) and not isinstance(v, bool))
        neighbour = values[1] if side == "smallest" else values[-2]
        margins.append({"key": key, "kept": value, "kept_s": by_point.get(_unordered(kept)), "next": neighbour,
                        "next_s": by_point.get(_unordered({**kept, key: neighbour})),
                        "beyond": next(iter(beyond_edge(values, side, bounds=key_bounds(key))), None)})
    return margins


def beyond_edge(values: Sequence[int | float], side: str, steps: int = 1,
                bounds: tuple[Bound | None, Bound | None] = (None, None)) -> list[int | float]:
    """The first ``steps`` values past the grid's ``"smallest"`` or ``"largest"`` end, continuing its own step.

    A grid of positive values with one ratio between its ends' steps (2, 8, 32) goes on by that ratio (128,
    512; 0.5 on the small side); any other grid by the step between its two values nearest the end (0.4, 0.7,
    1.0 -> 1.3 or 0.1). A value that would cross a limit of the key (``bounds``, from its config field: a
    learning rate above 0, a threshold at most 1; a positive grid stays positive) stops at the limit where the
    limit is allowed, else halfway to it. A grid of integers stays integer, rounded toward the grid; the list
    ends early where no new value exists.
    """
    ordered = sorted(values)
    if len(ordered) < 2:
        raise ValueError(f"a grid of {len(ordered)} value(s) has no step to continue")
    end, inner = (ordered[0], ordered[1]) if side == "smallest" else (ordered[-1], ordered[-2])
    low, high = bounds
    if low is None and ordered[0] > 0:
        low = (0, False)
    geometric = len(ordered) >= 3 and ordered[0] > 0 and math.isclose(ordered[1] / ordered[0],
                                                                      ordered[-1] / ordered[-2])
    integer = all(isinstance(v, int) for v in ordered)
    out: list[int | float] = []
    last: int | float = end
    for _ in range(steps):
        value = last * (end / inner) if geometric else last + (end - inner)
        for limit, below in ((low, True), (high, False)):
            if limit is not None and (value <= limit[0] if below else value >= limit[0]):
                value = limit[0] if limit[1] else (last + limit[0]) / 2
        if integer:
            value = math.ceil(value) if side == "smallest" else math.floor(value)
        else:
            value = round(float(value), 12)
        if value == last:
            break
        out.append(value)
        last = value
    return out


def widened_grid(values: Sequence[Any], steps: int, bounds: tuple[Bound | None, Bound | None] = (None, None)
                 ) -> list[Any]:
    """A grid with ``steps`` more values past each end (``beyond_edge``), smallest first; a grid of fewer than
    three numbers (no step to trust, or no order) comes back as it was."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if steps < 1 or len(set(numbers)) < 3 or len(numbers) != len(values):
        return list(values)
    below = beyond_edge(numbers, "smallest", steps, bounds)
    return [*reversed(below), *sorted(numbers), *beyond_edge(numbers, "largest", steps, bounds)]


def _unordered(point: dict[str, Any]) -> str:
    """A grid point's label whatever the order of its keys."""
    return point_label(dict(sorted(point.items())))


def median_time(times: Sequence[float | None]) -> float | None:
    """Median time to target where None (not reached) counts as infinity; None if the median is unreached."""
    if not times:
        return None
    value = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(value) else value


def _rank(median_time_s: float | None, median_final: float | None) -> tuple[float, float]:
    return (math.inf if median_time_s is None else median_time_s, math.inf if median_final is None else -median_final)


def choose(points: Sequence[dict[str, Any]]) -> int:
    """Index of the best grid point: lowest median time to target, then the best median final value of the metric.

    Each point has ``time_to_target_s`` and ``final_accuracy`` lists over seeds, and ``final_score`` (the
    metric signed so that higher is better) where the metric is not accuracy.
    """
    if not points:
        raise ValueError("nothing to choose from")
    ranks = [_rank(median_time(p["time_to_target_s"]),
                   _median([a for a in p.get("final_score", p["final_accuracy"]) if a is not None])) for p in points]
    return min(range(len(points)), key=lambda i: ranks[i])


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def interval(values: Sequence[float | None], seed: int = 0) -> dict[str, Any]:
    """Median, min..max and (from five values on) a bootstrap 95% interval of the median.

    None counts as infinitely large (a time never reached); infinite ends are reported as None.
    """
    xs = [math.inf if v is None else float(v) for v in values]
    if not xs:
        return {"median": None, "min": None, "max": None, "ci95": None, "n": 0}
    out: dict[str, Any] = {"median": _finite(statistics.median(xs)), "min": _finite(min(xs)),
                           "max": _finite(max(xs)), "ci95": None, "n": len(xs)}
    if len(xs) >= BOOTSTRAP_FROM:
        medians = _bootstrap((xs,), lambda x, axis: np.median(x, axis=axis), seed)
        out["ci95"] = [_finite(medians[_LO]), _finite(medians[_HI])]
    return out


def speedup_interval(base: Sequence[float | None], mine: Sequence[float | None], seed: int = 0) -> dict[str, Any]:
    """The speed-up of medians (base / mine) with a bootstrap 95% interval (seeds resampled independently)."""
    b = [math.inf if v is None else float(v) for v in base]
    m = [math.inf if v is None else float(v) for v in mine]
    if not b or not m:
        return {"value": None, "ci95": None}
    value = _ratio(statistics.median(b), statistics.median(m))
    ci = None
    if min(len(b), len(m)) >= BOOTSTRAP_FROM:
        def ratio(bs: np.ndarray, ms: np.ndarray, axis: int) -> np.ndarray:
            return _ratio_sortable(np.median(bs, axis=axis), np.median(ms, axis=axis))

        ratios = _bootstrap((b, m), ratio, seed)
        ci = [_finite(ratios[_LO]), _finite(ratios[_HI])]
    return {"value": value, "ci95": ci}


def mann_whitney(mine: Sequence[float | None], base: Sequence[float | None]) -> float | None:
    """Two-sided Mann-Whitney U p-value of two sets of times to target (scipy.stats.mannwhitneyu).

    A seed that never reached the target (None) counts as slower than every
    seed that did: such seeds share the largest rank. None when a side is
    empty, or when every seed of both sides is unreached (nothing to rank).
    """
    if not mine or not base or all(t is None for t in [*mine, *base]):
        return None
    reached = [float(t) for t in [*mine, *base] if t is not None]
    never = (max(reached) if reached else 0.0) + 1.0  # any value above every reached time ranks the same

    def times(xs: Sequence[float | None]) -> list[float]:
        return [never if t is None else float(t) for t in xs]

    with warnings.catch_warnings():  # all-equal samples: scipy warns and returns p = 1, which is right
        warnings.simplefilter("ignore")
        p = _stats().mannwhitneyu(times(mine), times(base), alternative="two-sided").pvalue
    return None if math.isnan(p) else round(float(p), 6)


def _stats() -> Any:
    """scipy.stats, imported on first use: at the top it would cost every CLI start most of a second."""
    from scipy import stats

    return stats


def _bootstrap(samples: tuple[Sequence[float], ...], statistic: Any, seed: int) -> np.ndarray:
    """The statistic over BOOTSTRAP_SAMPLES resamples (scipy.stats.bootstrap, each sample resampled on its own),
    sorted: the interval is read off as order statistics, so an unreached (infinite) end stays infinite instead of
    turning into NaN in an interpolated percentile."""
    with warnings.catch_warnings():  # scipy's own interval (unused) warns on ties and infinities
        warnings.simplefilter("ignore")
        result = _stats().bootstrap(tuple(np.asarray(x, dtype=float) for x in samples), statistic,
                                    vectorized=True, paired=False, n_resamples=BOOTSTRAP_SAMPLES,
                                    method="percentile", rng=np.random.default_rng(seed))
    return np.sort(result.bootstrap_distribution)


def _ratio(a: float, b: float) -> float | None:
    if math.isinf(a) or math.isinf(b) or b <= 0:
        return None
    return round(a / b, 6)


def _ratio_sortable(a: Any, b: Any) -> Any:
    """a / b with unreached ends ordered sensibly: base unreached = infinitely fast for us, ours = zero."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isinf(b), 0.0, np.where(np.isinf(a), np.inf, a / b))


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else round(float(x), 6)
