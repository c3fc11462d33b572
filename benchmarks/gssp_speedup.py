"""GSSP against BSP, ASP and SSP on a tiered cluster with transient stragglers.

LeNet-5 on mnist5k, 16 workers in four speed tiers (4 each at 1x, 2x, 4x,
8x) plus transient stragglers; every scheme runs the same virtual time
budget with three seeds. Reports time to 94% test accuracy, final accuracy
and bytes, and draws accuracy against virtual time.

Usage: .venv/bin/python benchmarks/gssp_speedup.py [--quick] [--jobs 2]
Writes benchmarks/results/gssp_speedup.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = 0.94

BASE = [
    "model.name=lenet5",
    "data.name=mnist5k",
    "data.batch_size=32",
    "optimizer.lr=0.05",
    "optimizer.momentum=0.9",
    "cluster.workers=16",
    "cluster.speeds=[1,1,1,1,2,2,2,2,4,4,4,4,8,8,8,8]",
    "cluster.compute_s=0.05",
    "cluster.link_gbps=10",
    "cluster.server_gbps=10",
    "cluster.stragglers.probability=0.05",
    "cluster.stragglers.slowdown=4",
    "cluster.stragglers.duration=5",
    f"run.target_accuracy={TARGET}",
    "run.stop_at_target=false",
    "run.eval_every_s=2",
    "sync.staleness=3",
    "backend.log_iterations=false",
]

SCHEMES: dict[str, list[str]] = {
    "bsp": ["sync.scheme=bsp"],
    "asp": ["sync.scheme=asp"],
    "ssp": ["sync.scheme=ssp"],
    "gssp": ["sync.scheme=gssp"],
    "gssp+gdtopk": ["sync.scheme=gssp", "compression.method=gdtopk"],
}


def run_one(scheme: str, seed: int, budget_s: float) -> dict[str, Any]:
    from shoal.config import load_config
    from shoal.runner import train

    cfg = load_config(None, BASE + SCHEMES[scheme] + [f"run.seed={seed}", f"run.max_time_s={budget_s}"])
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(cfg, Path(tmp) / "run")
        evals = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
                 if '"eval"' in line]
    curve = [(e["t"], e["accuracy"]) for e in evals]
    last = [a for _, a in curve[-5:]]
    return {
        "scheme": scheme,
        "seed": seed,
        "time_to_target_s": summary["time_to_target_s"],
        "final_accuracy": summary["final_accuracy"],
        "final_accuracy_last5": statistics.mean(last),
        "best_accuracy": summary["best_accuracy"],
        "bytes_up": summary["bytes_up"],
        "bytes_down": summary["bytes_down"],
        "bytes_exchange": summary["bytes_exchange"],
        "iterations": summary["iterations"],
        "groups": summary["groups"],
        "wall_s": summary["wall_s"],
        "curve": curve,
    }


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for scheme in SCHEMES:
        mine = [r for r in runs if r["scheme"] == scheme]
        if not mine:
            continue
        ttt = [r["time_to_target_s"] for r in mine]
        reached = [t for t in ttt if t is not None]
        # a seed that never reached the target counts as infinitely slow (censored at the budget)
        median = statistics.median(t if t is not None else math.inf for t in ttt)
        rows.append({
            "scheme": scheme,
            "seeds": len(mine),
            "reached": len(reached),
            "median_time_to_target_s": None if math.isinf(median) else median,
            "time_to_target_s": ttt,
            "final_accuracy": statistics.median(r["final_accuracy_last5"] for r in mine),
            "bytes_up": statistics.median(r["bytes_up"] for r in mine),
            "bytes_exchange": statistics.median(r["bytes_exchange"] for r in mine),
            "iterations": statistics.median(r["iterations"] for r in mine),
        })
    return rows


def verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {r["scheme"]: r for r in rows}
    baseline = [by[s]["median_time_to_target_s"] for s in ("bsp", "ssp") if s in by]
    out: dict[str, Any] = {}
    if "gssp" in by and by["gssp"]["median_time_to_target_s"]:
        finite = [t for t in baseline if t]
        best = min(finite) if finite else None
        out["gssp_speedup_vs_best_of_bsp_ssp"] = (best / by["gssp"]["median_time_to_target_s"]) if best else None
        if "bsp" in by:
            out["gssp_final_minus_bsp_points"] = 100 * (by["gssp"]["final_accuracy"] - by["bsp"]["final_accuracy"])
    if "gssp" in by and "gssp+gdtopk" in by:
        out["gdtopk_upload_reduction"] = by["gssp"]["bytes_up"] / by["gssp+gdtopk"]["bytes_up"]
        out["gdtopk_final_minus_gssp_points"] = 100 * (by["gssp+gdtopk"]["final_accuracy"] - by["gssp"]["final_accuracy"])
    return out


def markdown(rows: list[dict[str, Any]], checks: dict[str, Any], budget: float, seeds: list[int]) -> str:
    def fmt(t: float | None) -> str:
        return "not reached" if t is None else f"{t:.0f}"

    bsp = next((r for r in rows if r["scheme"] == "bsp"), None)
    lines = [
        "# GSSP speed-up (LeNet-5, mnist5k, 16 workers in tiers 1/2/4/8x + transient stragglers)",
        "",
        f"Virtual-time budget {budget:.0f} s per run, seeds {seeds}; time to {TARGET:.0%} test accuracy is the",
        "median over seeds (virtual seconds; a seed that never reached it counts as slower than any that did);",
        "final accuracy is the median over seeds of the mean of the last five evaluations; bytes are medians",
        "per run (upload = worker pushes, exchange = GSSP group-server deltas).",
        "",
        "| scheme | time to 94% (s) | per seed | speed-up vs BSP | final acc. | upload MB | exchange MB | iterations |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        speed = "-"
        if bsp and bsp["median_time_to_target_s"] and r["median_time_to_target_s"]:
            speed = f"{bsp['median_time_to_target_s'] / r['median_time_to_target_s']:.2f}x"
        lines.append(
            f"| {r['scheme']} | {fmt(r['median_time_to_target_s'])} | {', '.join(fmt(t) for t in r['time_to_target_s'])} "
            f"| {speed} | {r['final_accuracy']:.4f} | {r['bytes_up'] / 1e6:.1f} | {r['bytes_exchange'] / 1e6:.1f} "
            f"| {r['iterations']:.0f} |"
        )
    lines += ["", "Checks:", ""] + [f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in checks.items()]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = dict(zip(SCHEMES, ["#444444", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]))
    for scheme in SCHEMES:
        for i, r in enumerate(x for x in runs if x["scheme"] == scheme):
            t, a = zip(*r["curve"])
            ax.plot(t, a, color=colours[scheme], alpha=0.8, lw=1.2, label=scheme if i == 0 else None)
    ax.axhline(TARGET, color="grey", ls=":", lw=1)
    ax.set_ylim(0.5, 1.0)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title("LeNet-5 / mnist5k, 16 workers (1/2/4/8x tiers + stragglers), 3 seeds")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one seed, short budget (a smoke test)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--budget", type=float, default=150.0, help="virtual seconds per run")
    parser.add_argument("--from-json", type=Path, help="start from the runs of an earlier results file")
    parser.add_argument("--rerun", default="", help="with --from-json: comma-separated schemes to run again")
    args = parser.parse_args()
    seeds = [0] if args.quick else [0, 1, 2]
    budget = 20.0 if args.quick else args.budget
    start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    todo = list(SCHEMES)
    if args.from_json:
        earlier = json.loads(args.from_json.read_text())
        seeds, budget = earlier["seeds"], earlier["budget_s"]
        todo = [s for s in args.rerun.split(",") if s]
        runs = [r for r in earlier["runs"] if r["scheme"] not in todo]
    jobs = [(s, seed) for seed in seeds for s in todo]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs += list(pool.map(run_one, [s for s, _ in jobs], [seed for _, seed in jobs], [budget] * len(jobs)))
    rows = aggregate(runs)
    checks = verdicts(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "gssp_speedup_quick" if args.quick else "gssp_speedup"
    payload = {"budget_s": budget, "seeds": seeds, "target": TARGET, "config": BASE, "rows": rows, "checks": checks,
               "runs": runs, "wall_s_last_invocation": round(time.perf_counter() - start, 1),
               "rerun": todo if args.from_json else list(SCHEMES)}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(rows, checks, budget, seeds))
    plot(runs, RESULTS / f"{name}.png")
    print(markdown(rows, checks, budget, seeds))


if __name__ == "__main__":
    main()
