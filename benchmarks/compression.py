"""Compressors and SIM on a communication-bound setup.

A wide MLP (784-1536-256-10, 1.6 M parameters) on mnist5k, 8 equal workers
with 1 Gbps links, BSP; every method does the same work (300 rounds = 2,400
worker iterations, about 19 epochs), three seeds. Reports time to 90% test
accuracy (virtual seconds), final accuracy (mean of the last 5 evaluations),
upload and download bytes, and the similarity SIM measured.

Usage: .venv/bin/python benchmarks/compression.py [--quick] [--jobs 2] [--from-json F --rerun a,b]
Writes benchmarks/results/compression.{json,md,png}.
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = 0.90

BASE = [
    "model.name=mlp",
    "model.hidden=[1536, 256]",
    "data.name=mnist5k",
    "data.batch_size=32",
    "optimizer.lr=0.005",
    "optimizer.momentum=0.9",
    "cluster.workers=8",
    "cluster.compute_s=0.01",
    "cluster.link_gbps=1",
    "cluster.server_gbps=10",
    "sync.scheme=bsp",
    f"run.target_accuracy={TARGET}",
    "run.stop_at_target=false",
    "run.max_iterations=2400",
    "run.max_time_s=400",
    "run.eval_every_s=0.5",
    "backend.log_iterations=false",
]

SIM = ["compression.similarity.enabled=true"]
METHODS: dict[str, list[str]] = {
    "dense": [],
    "fp16": ["compression.method=fp16"],
    "topk": ["compression.method=topk", "compression.density=0.01"],
    "dgc": ["compression.method=dgc", "compression.density=0.01"],
    "qsgd": ["compression.method=qsgd"],
    "sim": SIM,
    "sim+topk": SIM + ["compression.method=topk", "compression.density=0.01"],
}


def run_one(method: str, seed: int, extra: list[str]) -> dict[str, Any]:
    from shoal.config import load_config
    from shoal.runner import train

    cfg = load_config(None, BASE + METHODS[method] + extra + [f"run.seed={seed}"])
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(cfg, Path(tmp) / "run")
        events = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [(e["t"], e["accuracy"]) for e in events if e["event"] == "eval"]
    sims = [e for e in events if e["event"] == "sim"]
    return {
        "method": method,
        "seed": seed,
        "time_to_target_s": summary["time_to_target_s"],
        "final_accuracy": statistics.mean(a for _, a in evals[-5:]),
        "best_accuracy": summary["best_accuracy"],
        "bytes_up": summary["bytes_up"],
        "bytes_down": summary["bytes_down"],
        "elapsed_s": summary["elapsed_s"],
        "wall_s": summary["wall_s"],
        "curve": evals,
        "similarity": _similarity_stats(sims),
    }


def _similarity_stats(sims: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Quantiles of the raw measured cosine per tensor, and the mean period, over the run."""
    if not sims:
        return None
    names = sims[0]["names"]
    out: dict[str, Any] = {}
    for i, name in enumerate(names):
        values = sorted(e["measured"][i] for e in sims if e["measured"][i] is not None)
        taus = [e["tau"][i] for e in sims]
        q = lambda f: values[min(len(values) - 1, int(f * len(values)))] if values else None  # noqa: E731
        out[name] = {"p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "mean_tau": statistics.mean(taus),
                     "bytes_saved": sims[-1]["bytes_saved"][i]}
    return out


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method: medians over seeds, and ratios against dense."""
    rows = []
    dense = [r for r in runs if r["method"] == "dense"]
    base = aggregate_one(dense) if dense else None
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        row = {"method": method, **aggregate_one(mine),
               "per_seed_time_to_target_s": [r["time_to_target_s"] for r in mine]}
        if base is not None:
            row["bytes_vs_dense"] = (row["bytes_up"] + row["bytes_down"]) / (base["bytes_up"] + base["bytes_down"])
            row["speedup_vs_dense"] = (base["time_to_target_s"] / row["time_to_target_s"]
                                       if base["time_to_target_s"] and row["time_to_target_s"] else None)
            row["accuracy_vs_dense_points"] = 100 * (row["final_accuracy"] - base["final_accuracy"])
        rows.append(row)
    return rows


def aggregate_one(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over seeds; a seed that never reached the target counts as slowest."""
    return {
        "time_to_target_s": median_time([r["time_to_target_s"] for r in runs]),
        "final_accuracy": statistics.median(r["final_accuracy"] for r in runs),
        "bytes_up": statistics.median(r["bytes_up"] for r in runs),
        "bytes_down": statistics.median(r["bytes_down"] for r in runs),
    }


def markdown(rows: list[dict[str, Any]], runs: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| method | time to 90% (s) | speedup vs dense | final acc | vs dense (pts) | up GB | down GB | bytes vs dense |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ttt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        sp = r.get("speedup_vs_dense")
        lines.append(
            f"| {r['method']} | {ttt} | {'-' if sp is None else f'{sp:.2f}x'} | {r['final_accuracy']:.4f} | "
            f"{r.get('accuracy_vs_dense_points', 0):+.2f} | {r['bytes_up'] / 1e9:.2f} | {r['bytes_down'] / 1e9:.2f} | "
            f"{r.get('bytes_vs_dense', 1):.3f} |"
        )
    sims = [r for r in runs if r["method"] == "sim" and r["similarity"]]
    if sims:
        lines += ["", "Measured similarity (SIM, seed " + str(sims[0]["seed"]) + "): raw cosine of each worker's update "
                  "with the aggregate, per tensor; noise floor 1/sqrt(8) = 0.354.", "",
                  "| tensor | p10 | median | p90 | mean tau | MB saved |", "|---|---|---|---|---|---|"]
        for name, s in sims[0]["similarity"].items():
            lines.append(f"| {name} | {s['p10']:.3f} | {s['p50']:.3f} | {s['p90']:.3f} | {s['mean_tau']:.2f} | "
                         f"{s['bytes_saved'] / 1e6:.0f} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for method in METHODS:
        mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        if not mine:
            continue
        t, a = zip(*mine[0]["curve"])
        ax.plot(t, a, label=method)
    ax.axhline(TARGET, color="grey", linestyle=":", label="target")
    ax.set(xlabel="virtual time (s)", ylabel="test accuracy", title="accuracy vs time (seed 0)", ylim=(0.6, 0.97))
    ax.legend()
    rows = aggregate(runs)
    names = [r["method"] for r in rows]
    bx.bar(names, [(r["bytes_up"] + r["bytes_down"]) / 1e9 for r in rows])
    bx.set(ylabel="GB up + down (300 rounds)", title="traffic (median over seeds)")
    bx.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 80 rounds")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--from-json", type=Path, help="reuse the runs of an earlier result file")
    parser.add_argument("--rerun", default="", help="with --from-json: methods to run again (comma-separated)")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="extra override for every run")
    args = parser.parse_args()
    extra = list(args.extra) + (["run.max_iterations=640"] if args.quick else [])
    seeds = 1 if args.quick else args.seeds
    kept: list[dict[str, Any]] = []
    todo = list(METHODS)
    if args.from_json:
        rerun = set(filter(None, args.rerun.split(",")))
        kept = [r for r in json.loads(args.from_json.read_text())["runs"] if r["method"] not in rerun]
        todo = sorted(rerun, key=list(METHODS).index)
    start = time.perf_counter()
    jobs = [(m, s, extra) for m in todo for s in range(seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = kept + list(pool.map(run_one, *zip(*jobs)))
    runs.sort(key=lambda r: (list(METHODS).index(r["method"]), r["seed"]))
    rows = aggregate(runs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "compression_quick" if args.quick else "compression"
    header = (f"# Compression and SIM ({len(runs)} runs, {seeds} seed(s), 8 workers x 1 Gbps, MLP 1.6 M params, "
              f"BSP, 300 rounds; wall {time.perf_counter() - start:.0f} s)")
    (RESULTS / f"{name}.json").write_text(json.dumps({"base": BASE, "extra": extra, "rows": rows, "runs": runs}, indent=1))
    (RESULTS / f"{name}.md").write_text(markdown(rows, runs, header))
    plot(runs, RESULTS / f"{name}.png")
    print(markdown(rows, runs, header))


if __name__ == "__main__":
    main()
