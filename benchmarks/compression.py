"""Compressors, SIM and local SGD on a communication-bound setup, each with its learning rate tuned.

A wide MLP (784-1536-256-10, 1.6 M parameters) on mnist5k, 8 equal workers
with 1 Gbps links; every method does the same work (2,400 worker iterations,
about 19 epochs). The protocol is benchmarks/tuned.py: each method's lr is
tuned over the same grid on the tuning seeds (runs stop at the target), then
the chosen lr runs the whole budget on every seed. Local SGD runs at H = 2
(about SIM's bytes) and H = 8 (SIM's longest period), so SIM is measured
against plain periodic averaging at matched bytes. Reports time to 90% test
accuracy (virtual seconds), final accuracy (mean of the last 5 evaluations)
and bytes, with intervals over seeds.

Usage: .venv/bin/python benchmarks/compression.py [--jobs 2] [--quick]
Writes benchmarks/results/compression.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tuned import RESULTS, fmt_interval, provenance, ratio_text, rows_of, run_protocol

TARGET = 0.90
LRS = [0.002, 0.005, 0.01, 0.02]

BASE = [
    "model.name=mlp",
    "model.hidden=[1536, 256]",
    "data.name=mnist5k",
    "data.batch_size=32",
    "optimizer.momentum=0.9",
    "cluster.workers=8",
    "cluster.compute_s=0.01",
    "cluster.link_gbps=1",
    "cluster.server_gbps=10",
    f"run.target_accuracy={TARGET}",
    "run.target_patience=3",
    "run.stop_at_target=false",
    "run.max_iterations=2400",
    "run.max_time_s=400",
    "run.eval_every_s=0.5",
    "backend.log_iterations=false",
]

SIM = ["sync.scheme=bsp", "compression.similarity.enabled=true", "compression.similarity.rule=snr",
       "compression.similarity.min_snr=1.0"]
METHODS: dict[str, list[str]] = {
    "dense": ["sync.scheme=bsp"],
    "fp16": ["sync.scheme=bsp", "compression.method=fp16"],
    "topk": ["sync.scheme=bsp", "compression.method=topk", "compression.density=0.01"],
    "qsgd": ["sync.scheme=bsp", "compression.method=qsgd"],
    "powersgd": ["sync.scheme=bsp", "compression.method=powersgd", "compression.rank=4"],
    "sim": SIM,
    "sim-h2": SIM + ["compression.similarity.base_period=2"],
    "localsgd-h2": ["sync.scheme=localsgd", "sync.localsgd.local_steps=2"],
    "localsgd-h8": ["sync.scheme=localsgd", "sync.localsgd.local_steps=8"],
}

#: the second workload for SIM against local SGD: LeNet-5 (0.25 M parameters) on 8 workers behind 0.1 Gbit/s links
LENET = [
    "model.name=lenet5", "data.name=mnist5k", "data.batch_size=32", "optimizer.momentum=0.9", "cluster.workers=8",
    "cluster.compute_s=0.01", "cluster.link_gbps=0.1", "cluster.server_gbps=10", f"run.target_accuracy={TARGET}",
    "run.target_patience=3", "run.stop_at_target=false", "run.max_iterations=2400", "run.max_time_s=400",
    "run.eval_every_s=1", "backend.log_iterations=false",
]
LENET_METHODS = ["dense", "sim-h2", "localsgd-h2"]


def with_ratios(rows: list[dict[str, Any]], runs: list[dict[str, Any]], chosen: dict[str, Any]) -> None:
    """Bytes, time and accuracy of each method against dense; SIM against local SGD."""
    from shoal.report.tuning import speedup_interval

    def times(m: str) -> list[float | None]:
        return [r["time_to_target_s"] for r in runs if r["scheme"] == m and r["value"] == chosen[m]]

    dense = next(r for r in rows if r["scheme"] == "dense")
    for r in rows:
        r["bytes_vs_dense"] = (r["bytes_up"] + r["bytes_down"]) / (dense["bytes_up"] + dense["bytes_down"])
        r["speedup_vs_dense"] = speedup_interval(times("dense"), times(r["scheme"]))
        r["speedup_vs_localsgd_h2"] = speedup_interval(times("localsgd-h2"), times(r["scheme"]))
        if r["final"]["median"] is not None and dense["final"]["median"] is not None:
            r["accuracy_vs_dense_points"] = round(100 * (r["final"]["median"] - dense["final"]["median"]), 3)


def markdown(rows: list[dict[str, Any]], runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Compression, SIM and local SGD, each with its lr tuned " + (
            "(8 workers x 1 Gbps, MLP 1.6 M params, 2,400 iterations)" if meta["workload"] == "mlp"
            else "(8 workers x 0.1 Gbps, LeNet-5 0.25 M params, 2,400 iterations)"),
        "",
        f"Each method's `optimizer.lr` is tuned over {meta['lrs']} on seeds {meta['tune_seeds']} (best median time "
        f"to {TARGET:.0%}, 3 evaluations in a row; tuning runs stop at the target); the chosen lr then runs the whole "
        f"budget on seeds {meta['tune_seeds'] + meta['final_seeds']}. Cells: median [min..max] (90%: bootstrap "
        "interval of the median); n/r = not reached. Speed-ups: ratio of median times (90% bootstrap interval).",
        "",
        f"Commit `{meta['git_commit'][:10]}`; command: `{meta['command']}`.",
        "",
        "| method | tuned lr | time to 90% (s) | vs dense | vs localsgd-h2 | final acc. (%) | vs dense (pts) "
        "| up GB | down GB | bytes vs dense |",
        "|---|---:|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scheme']} | {r['tuned']} | {fmt_interval(r['time'], 1)} | {ratio_text(r['speedup_vs_dense'])} "
            f"| {ratio_text(r['speedup_vs_localsgd_h2'])} | {fmt_interval(r['final'], 2, 100)} "
            f"| {r.get('accuracy_vs_dense_points', 0):+.2f} | {r['bytes_up'] / 1e9:.2f} | {r['bytes_down'] / 1e9:.2f} "
            f"| {r['bytes_vs_dense']:.3f} |")
    from shoal.report.tuning import median_time

    lines += ["", "Tuning grid (median time to target over the tuning seeds, s):", "",
              "| method | " + " | ".join(f"lr {v}" for v in meta["lrs"]) + " |", "|---|" + "---:|" * len(meta["lrs"])]
    for m, points in meta["tuning"].items():
        cells = [("n/r" if (t := median_time(p["time_to_target_s"])) is None else f"{t:.1f}")
                 + (" *" if p["value"] == meta["chosen"][m] else "") for p in points]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    sims = sorted((r for r in runs if r["scheme"] == "sim" and r.get("similarity")), key=lambda r: r["seed"])
    if sims:
        lines += ["", f"Measured similarity (SIM, seed {sims[0]['seed']}): raw cosine of each worker's update with the "
                  "aggregate, per tensor; noise floor 1/sqrt(8) = 0.354, which rule snr maps to 0; snr >= 1 "
                  "(the min_snr default) needs a cosine of 0.75.", "",
                  "| tensor | p10 | median | p90 | mean tau | MB saved |", "|---|---|---|---|---|---|"]
        for name, s in sims[0]["similarity"].items():
            if s["p10"] is None:
                continue
            lines.append(f"| {name} | {s['p10']:.3f} | {s['p50']:.3f} | {s['p90']:.3f} | {s['mean_tau']:.2f} | "
                         f"{s['bytes_saved'] / 1e6:.0f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], runs: list[dict[str, Any]], chosen: dict[str, Any], path: Path,
         methods: dict[str, list[str]]) -> None:
    from shoal.report.plots import median_band

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for m in methods:
        t, med, lo, hi = median_band([r["curve"] for r in runs if r["scheme"] == m and r["value"] == chosen[m]])
        line, = ax.plot(t, med, lw=1.4, label=f"{m} (lr {chosen[m]})")
        ax.fill_between(t, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    ax.axhline(TARGET, color="grey", linestyle=":", label="target")
    ax.set(xlabel="virtual time (s)", ylabel="test accuracy (median, band = min..max)", ylim=(0.6, 0.97),
           title="accuracy vs time, tuned lr")
    ax.legend(fontsize=7)
    bx.bar([r["scheme"] for r in rows], [(r["bytes_up"] + r["bytes_down"]) / 1e9 for r in rows])
    bx.set(ylabel="GB up + down (2,400 iterations)", title="traffic (median over seeds)")
    bx.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two lrs, one seed, 640 iterations (a smoke test)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tune-seeds", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workload", choices=["mlp", "lenet"], default="mlp",
                        help="mlp: every method; lenet: SIM against local SGD on a second model")
    args = parser.parse_args()
    lrs = LRS[1:3] if args.quick else LRS
    tune_seeds = list(range(1 if args.quick else args.tune_seeds))
    final_seeds = [] if args.quick else list(range(len(tune_seeds), args.seeds))
    base = (BASE if args.workload == "mlp" else LENET) + (["run.max_iterations=640"] if args.quick else [])
    methods = METHODS if args.workload == "mlp" else {m: METHODS[m] for m in LENET_METHODS}
    name = ("compression" if args.workload == "mlp" else "compression-lenet") + ("_quick" if args.quick else "")
    start, origin = time.perf_counter(), provenance()  # the commit the runs start from
    protocol = run_protocol(name, base, methods, "optimizer.lr", lrs, tune_seeds, final_seeds, args.jobs)
    rows = rows_of(protocol, list(methods))
    with_ratios(rows, protocol["runs"], protocol["chosen"])
    meta = {**origin, "workload": args.workload, "methods": methods, "lrs": lrs, "tune_seeds": tune_seeds, "final_seeds": final_seeds, "target": TARGET,
            "config": base, "chosen": protocol["chosen"], "tuning": protocol["tuning"],
            "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({**meta, "rows": rows, "runs": protocol["runs"],
                                                      "tuning_runs": protocol["tuning_runs"]}, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(rows, protocol["runs"], meta))
    plot(rows, protocol["runs"], protocol["chosen"], RESULTS / f"{name}.png", methods)
    print(markdown(rows, protocol["runs"], meta))


if __name__ == "__main__":
    main()
