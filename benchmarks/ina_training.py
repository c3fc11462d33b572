"""In-network aggregation in training: server aggregation vs the plans of geryon, atp, switchml and grid.

A communication-bound setup on the sim backend: the wide MLP (1.6 M
parameters, 6.4 MB per gradient) on mnist5k, 8 workers, BSP, on a k=4
fat-tree with 10 Gbps links, worker rate T = server ingress B = 10 Gbps and
a quarter of the switches programmable (capacities 10..320 Gbps drawn per
seed). Every plan trains the same model on the same data (the plan changes
timing, not the math), 150 rounds, three seeds (each seed also draws the
placement and the programmable switches).

Reports per plan: push (gradient upload) time per iteration, time per
round, time to 90% and final accuracy, and the reduction of communication
(push) time of grid against each baseline beside the paper's testbed
figures.

Usage: .venv/bin/python benchmarks/ina_training.py [--quick] [--jobs 2]
Writes benchmarks/results/ina_training.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from shoal.report.rows import median_time
from tuned import provenance  # the git commit (and a dirty-tree flag) and the command

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = 0.90
PAPER_REDUCTION = {"atp": 38.4, "switchml": 41.2, "geryon": 60.1}  # % lower communication time than grid's

BASE = [
    "model.name=mlp", "model.hidden=[1536, 256]", "data.name=mnist5k", "data.batch_size=32",
    "optimizer.lr=0.005", "optimizer.momentum=0.9",
    "cluster.workers=8", "cluster.compute_s=0.005", "cluster.link_gbps=10", "cluster.server_gbps=10",
    "network.topology=fattree:k=4", "network.link_gbps=10", "network.programmable=random:0.25",
    "network.capacity_gbps=[10, 320]",
    "sync.scheme=bsp", f"run.target_accuracy={TARGET}", "run.stop_at_target=false",
    "run.max_iterations=1200", "run.max_time_s=600", "run.eval_every_s=0.25",
]
PLANS = ["server", "geryon", "atp", "switchml", "grid"]


def overrides(plan: str) -> list[str]:
    return [] if plan == "server" else ["network.aggregation=ina", f"network.algorithm={plan}"]


def run_one(plan: str, seed: int, extra: list[str]) -> dict[str, Any]:
    from shoal.config import load_config
    from shoal.runner import train

    cfg = load_config(None, BASE + overrides(plan) + extra + [f"run.seed={seed}"])
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(cfg, Path(tmp) / "run")
        events = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    its = [e for e in events if e["event"] == "iteration"]
    rounds = summary["iterations"] / cfg.cluster.workers
    routing = summary.get("routing") or {}
    return {
        "plan": plan,
        "seed": seed,
        "push_s": statistics.mean(e["comm_s"] - e["pull_s"] for e in its),
        "pull_s": statistics.mean(e["pull_s"] for e in its),
        "round_s": summary["elapsed_s"] / rounds,
        "time_to_target_s": summary["time_to_target_s"],
        "final_accuracy": summary["final_accuracy"],
        "rate_gbps": routing.get("rate_gbps"),
        "switches": routing.get("aggregation_switches"),
        "curve": [(e["t"], e["accuracy"]) for e in events if e["event"] == "eval"],
    }


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for plan in PLANS:
        mine = [r for r in runs if r["plan"] == plan]
        if not mine:
            continue
        rows.append({
            "plan": plan,
            "push_ms": 1e3 * statistics.median(r["push_s"] for r in mine),
            "round_ms": 1e3 * statistics.median(r["round_s"] for r in mine),
            "time_to_target_s": median_time([r["time_to_target_s"] for r in mine]),
            "final_accuracy": statistics.median(r["final_accuracy"] for r in mine),
            "rate_gbps": [r["rate_gbps"] for r in mine],
        })
    grid = next((r for r in rows if r["plan"] == "grid"), None)
    for row in rows:
        if grid is not None and row["plan"] != "grid":
            row["grid_push_reduction_pct"] = 100 * (1 - grid["push_ms"] / row["push_ms"])
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| plan | push ms / iteration | round ms | time to 90% (s) | final acc | plan rate (Gbps, per seed) "
             "| grid's push time lower by | paper (testbed) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ttt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
        red = r.get("grid_push_reduction_pct")
        rates = ", ".join("-" if x is None else f"{x:.2f}" for x in r["rate_gbps"])
        paper = PAPER_REDUCTION.get(r["plan"])
        lines.append(f"| {r['plan']} | {r['push_ms']:.2f} | {r['round_ms']:.2f} | {ttt} | {r['final_accuracy']:.4f} | {rates} "
                     f"| {'-' if red is None else f'{red:.1f}%'} | {'-' if paper is None else f'{paper}%'} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    bx.bar([r["plan"] for r in rows], [r["push_ms"] for r in rows], label="push (upload)")
    bx.bar([r["plan"] for r in rows], [r["round_ms"] - r["push_ms"] for r in rows], bottom=[r["push_ms"] for r in rows],
           label="rest of the round", alpha=0.5)
    bx.set(ylabel="ms", title="time per BSP round (median over seeds)")
    bx.legend()
    for plan in PLANS:
        mine = [r for r in runs if r["plan"] == plan and r["seed"] == 0]
        if mine:
            t, a = zip(*mine[0]["curve"])
            ax.plot(t, a, label=plan)
    ax.axhline(TARGET, color="grey", linestyle=":")
    ax.set(xlabel="virtual time (s)", ylabel="test accuracy", title="accuracy vs time (seed 0)", ylim=(0.5, 0.95))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 40 rounds")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    extra = ["run.max_iterations=320"] if args.quick else []
    seeds = 1 if args.quick else args.seeds
    start = time.perf_counter()
    jobs = [(p, s, extra) for s in range(seeds) for p in PLANS]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(run_one, *zip(*jobs)))
    rows = aggregate(runs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "ina_training_quick" if args.quick else "ina_training"
    header = (f"# In-network aggregation in training ({len(runs)} runs, {seeds} seed(s); MLP 1.6 M params, 8 workers, "
              f"BSP, fat-tree k=4 at 10 Gbps; wall {time.perf_counter() - start:.0f} s)")
    (RESULTS / f"{name}.json").write_text(json.dumps({**provenance(), "base": BASE, "rows": rows, "runs": runs}, indent=1))
    (RESULTS / f"{name}.md").write_text(markdown(rows, header))
    plot(runs, rows, RESULTS / f"{name}.png")
    print(markdown(rows, header))


if __name__ == "__main__":
    main()
