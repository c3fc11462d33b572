"""The tuned-comparison protocol shared by the benchmarks: same tuning budget for every scheme.

1. Tuning: every scheme runs every grid value on the tuning seeds, each
   run stopping once the target is reached (``run.stop_at_target``); each
   scheme keeps its value by ``shoal.report.tuning.choose`` (best median
   time to target, ties by final accuracy) -- the rule `shoal compare
   --tune` applies.
2. Final: the chosen value runs the whole budget on every seed (the tuning
   seeds again, so final accuracies compare at the same time); rows report
   the median with min..max and a bootstrap 90% interval over all seeds.

Runs are cached by (name, scheme, grid value, seed, config, source of the
package) under runs/bench-cache/, so an interrupted benchmark resumes where
it stopped, and a change to src/shoal runs everything again.
Every results file records the git commit and the command.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from shoal.comparison import cpu_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CACHE = ROOT / "runs" / "bench-cache"


def provenance() -> dict[str, Any]:
    """The commit the numbers come from (with a flag if the tree had changes), the command, the CPU and torch."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks/*.py"))
    return {"git_commit": git("rev-parse", "HEAD"), "dirty_tree": dirty,
            "command": " ".join([".venv/bin/python", *[a if " " not in a else repr(a) for a in sys.argv]]),
            "cpu": cpu_model(), "torch": importlib.metadata.version("torch")}


def write_results(name: str, result: dict[str, Any], markdown: str) -> None:
    """benchmarks/results/NAME.json (with its provenance inside) and NAME.md, and the table on stdout."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)


@functools.cache
def source_hash() -> str:
    """A hash of the package's source: recorded with every cached run, so a reader sees which code made it."""
    digest = hashlib.sha1()
    for path in sorted((ROOT / "src" / "shoal").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def run_one(overrides: list[str], key: str) -> dict[str, Any]:
    """One training run through the runner; its key numbers and accuracy curve (cached)."""
    path = CACHE / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    from shoal.config import load_config
    from shoal.runner import train

    cfg = load_config(None, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(cfg, Path(tmp) / "run")
        events = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
                  if '"eval"' in line or '"sim"' in line]
    curve = [(e["t"], e["accuracy"]) for e in events if e["event"] == "eval"]
    result = {
        "time_to_target_s": summary["time_to_target_s"],
        "final_accuracy": summary["final_accuracy"],
        "final_accuracy_last5": statistics.mean(a for _, a in curve[-5:]),
        "best_accuracy": summary["best_accuracy"],
        "bytes_up": summary["bytes_up"], "bytes_down": summary["bytes_down"],
        "bytes_exchange": summary.get("bytes_exchange", 0), "iterations": summary["iterations"],
        "groups": summary["groups"], "wall_s": summary["wall_s"], "curve": curve,
        "similarity": similarity_stats([e for e in events if e["event"] == "sim"]),
        "source_hash": source_hash(), "cpu": cpu_model(),
    }
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return result


def similarity_stats(sims: list[dict[str, Any]]) -> dict[str, Any] | None:
    """SIM runs: quantiles of the raw measured cosine per tensor, the mean period and the bytes saved."""
    if not sims:
        return None
    out: dict[str, Any] = {}
    for i, name in enumerate(sims[0]["names"]):
        values = sorted(e["measured"][i] for e in sims if e["measured"][i] is not None)
        q = lambda f: values[min(len(values) - 1, int(f * len(values)))] if values else None  # noqa: E731
        out[name] = {"p10": q(0.1), "p50": q(0.5), "p90": q(0.9),
                     "mean_tau": statistics.mean(e["tau"][i] for e in sims), "bytes_saved": sims[-1]["bytes_saved"][i]}
    return out


def _key(name: str, overrides: list[str]) -> str:
    """The cache key: the config and the package's source, so a results file never mixes runs of older code."""
    return f"{name}-{hashlib.sha1(json.dumps([source_hash(), overrides]).encode()).hexdigest()[:16]}"


def run_protocol(name: str, base: list[str], schemes: dict[str, list[str]], tune_key: str, values: list[Any],
                 tune_seeds: list[int], final_seeds: list[int], jobs: int) -> dict[str, Any]:
    """Tune every scheme over ``values`` of ``tune_key`` on ``tune_seeds``, then run the choice on ``final_seeds``."""
    from shoal.report.tuning import choose

    def overrides(scheme: str, value: Any, seed: int, *extra: str) -> list[str]:
        return base + schemes[scheme] + [f"{tune_key}={value}", f"run.seed={seed}", *extra]

    tasks = [(s, v, seed) for seed in tune_seeds for v in values for s in schemes]
    results = run_all(name, [overrides(*t, "run.stop_at_target=true") for t in tasks], jobs)
    tuning_runs = [{"scheme": s, "value": v, "seed": seed, **r} for (s, v, seed), r in zip(tasks, results)]
    chosen: dict[str, Any] = {}
    tuning: dict[str, list[dict[str, Any]]] = {}
    for scheme in schemes:
        points = []
        for v in values:
            mine = [r for r in tuning_runs if r["scheme"] == scheme and r["value"] == v]
            points.append({"value": v, "time_to_target_s": [r["time_to_target_s"] for r in mine],
                           "final_accuracy": [r["final_accuracy_last5"] for r in mine]})
        chosen[scheme] = points[choose(points)]["value"]
        tuning[scheme] = points
    tasks = [(s, chosen[s], seed) for seed in tune_seeds + final_seeds for s in schemes]
    results = run_all(name, [overrides(*t) for t in tasks], jobs)
    runs = [{"scheme": s, "value": v, "seed": seed, **r} for (s, v, seed), r in zip(tasks, results)]
    for run in tuning_runs:
        run.pop("curve")
    return {"chosen": chosen, "tuning": tuning, "runs": runs, "tuning_runs": tuning_runs}


def run_all(name: str, configs: list[list[str]], jobs: int) -> list[dict[str, Any]]:
    keys = [_key(name, o) for o in configs]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_one, configs, keys))


def rows_of(protocol: dict[str, Any], schemes: list[str]) -> list[dict[str, Any]]:
    """Per scheme, at its chosen value over all seeds: medians with intervals."""
    from shoal.report.tuning import interval

    rows = []
    for scheme in schemes:
        value = protocol["chosen"][scheme]
        mine = [r for r in protocol["runs"] if r["scheme"] == scheme and r["value"] == value]
        rows.append({
            "scheme": scheme, "tuned": value, "seeds": sorted(r["seed"] for r in mine),
            "reached": sum(r["time_to_target_s"] is not None for r in mine),
            "time_to_target_s": [r["time_to_target_s"] for r in sorted(mine, key=lambda r: r["seed"])],
            "time": interval([r["time_to_target_s"] for r in mine]),
            "final": interval([r["final_accuracy_last5"] for r in mine]),
            "bytes_up": statistics.median(r["bytes_up"] for r in mine),
            "bytes_down": statistics.median(r["bytes_down"] for r in mine),
            "bytes_exchange": statistics.median(r["bytes_exchange"] for r in mine),
            "iterations": statistics.median(r["iterations"] for r in mine),
        })
    return rows


def fmt_interval(iv: dict[str, Any], digits: int = 0, scale: float = 1.0) -> str:
    """``18 [16..26] (90%: 16..24)`` with "n/r" for values never reached."""
    def f(x: float | None) -> str:
        return "n/r" if x is None else f"{x * scale:.{digits}f}"

    text = f"{f(iv['median'])} [{f(iv['min'])}..{f(iv['max'])}]"
    if iv.get("ci90"):
        text += f" (90%: {f(iv['ci90'][0])}..{f(iv['ci90'][1])})"
    return text


def ratio_text(sp: dict[str, Any]) -> str:
    """A speed-up with its bootstrap interval: ``1.20x (90%: 0.80..1.90)``."""
    if sp.get("value") is None:
        return "n/a (a median is unreached)"
    ci = ""
    if sp.get("ci90"):
        lo, hi = sp["ci90"]
        ci = f" (90%: {'0' if lo is None else f'{lo:.2f}'}..{'inf' if hi is None else f'{hi:.2f}'})"
    return f"{sp['value']:.2f}x{ci}"


def simple_markdown(title: str, rows: list[dict[str, Any]], checks: dict[str, Any], meta: dict[str, Any],
                    extra_columns: dict[str, str] | None = None) -> str:
    """The results table of a tuned comparison: rows, verdicts, the tuning grid, provenance."""
    from shoal.report.tuning import median_time

    extra = extra_columns or {}
    target = meta["target"]
    lines = [
        f"# {title}", "",
        f"Each scheme's `optimizer.lr` is tuned over {meta['lrs']} on seeds {meta['tune_seeds']} (best median time "
        f"to {target:.0%}, 3 evaluations in a row; tuning runs stop at the target); the chosen lr then runs the whole "
        f"budget on seeds {meta['tune_seeds'] + meta['final_seeds']}. Cells: median [min..max] (90%: bootstrap "
        "interval of the median); n/r = not reached (counted as slowest). Final accuracy: mean of the last five "
        "evaluations.", "",
        f"Commit `{meta['git_commit'][:10]}`; command: `{meta['command']}`.", "",
        "| scheme | tuned lr | time to target (s) | per seed | final acc. (%) | upload MB | exchange MB | iterations |"
        + "".join(f" {name} |" for name in extra),
        "|---|---:|---|---|---|---:|---:|---:|" + "---|" * len(extra),
    ]
    for r in rows:
        per_seed = ", ".join("n/r" if t is None else f"{t:.0f}" for t in r["time_to_target_s"])
        lines.append(
            f"| {r['scheme']} | {r['tuned']} | {fmt_interval(r['time'])} | {per_seed} | {fmt_interval(r['final'], 2, 100)}"
            f" | {r['bytes_up'] / 1e6:.1f} | {r['bytes_exchange'] / 1e6:.1f} | {r['iterations']:.0f} |"
            + "".join(f" {r.get(key)} |" for key in extra.values()))
    lines += ["", "Verdicts:", ""]
    for key, value in checks.items():
        lines.append(f"- {key}: {ratio_text(value) if isinstance(value, dict) else value}")
    lines += ["", "Tuning grid (median time to target over the tuning seeds, s; n/r = not reached; * = chosen):", "",
              "| scheme | " + " | ".join(f"lr {v}" for v in meta["lrs"]) + " |", "|---|" + "---:|" * len(meta["lrs"])]
    for scheme, points in meta["tuning"].items():
        cells = [("n/r" if (t := median_time(p["time_to_target_s"])) is None else f"{t:.0f}")
                 + (" *" if p["value"] == meta["chosen"][scheme] else "") for p in points]
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
