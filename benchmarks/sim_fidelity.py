"""How well the simulator predicts the ray backend: the same configs on both, side by side.

Each config of a fixed set (LeNet-5 on mnist5k, 4 emulated workers at
1/1/2/4x, 0.05 s per batch at 1x, 1 Gbit/s links) runs on ``sim`` (virtual
seconds) and on ``ray`` (wall seconds, emulation on), on the same seeds.
Reported per config: each worker's iteration rate (iterations per second of
the run, mean over the seeds) on both backends and the largest relative
error over the workers; the median time to 90% test accuracy on both and
its relative error (one seed's time to target is chaotic under asynchronous
schemes: different interleavings, different curves). The roadmap's bar: rates
within 15% and time to target within 25% on every config.

Usage: .venv/bin/python benchmarks/sim_fidelity.py [--budget 45] [--seeds 7]
Writes benchmarks/results/sim_fidelity.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tuned import RESULTS, provenance

BASE = [
    "model.name=lenet5", "data.name=mnist5k", "data.batch_size=32", "optimizer.lr=0.05", "optimizer.momentum=0.9",
    "cluster.workers=4", "cluster.speeds=[1, 1, 2, 4]", "cluster.compute_s=0.05", "cluster.link_gbps=1",
    "cluster.server_gbps=1", "run.target_accuracy=0.9", "run.target_patience=2", "run.stop_at_target=false",
    "run.eval_every_s=1", "backend.cpus_per_worker=0.25", "backend.cpus_per_server=0.25",
    "backend.checkpoint_every_s=0", "backend.log_iterations=false",
]
CONFIGS: dict[str, list[str]] = {
    "bsp": ["sync.scheme=bsp"],
    "bsp-allreduce": ["sync.scheme=bsp", "sync.intra_group=allreduce"],
    "asp": ["sync.scheme=asp"],
    "ssp": ["sync.scheme=ssp", "sync.ssp.staleness=3"],
    "gssp": ["sync.scheme=gssp", "sync.gssp.staleness=3"],
    "localsgd": ["sync.scheme=localsgd", "sync.localsgd.local_steps=8"],
}
RATE_BAR, TIME_BAR = 0.15, 0.25


def run(backend: str, overrides: list[str]) -> dict[str, Any]:
    from shoal.config import load_config
    from shoal.runner import train

    cfg = load_config(None, overrides + [f"backend.name={backend}"])
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(cfg, Path(tmp) / "run")
    elapsed = summary["elapsed_s"]
    return {"time_to_target_s": summary["time_to_target_s"], "elapsed_s": elapsed,
            "final_accuracy": summary["final_accuracy"], "iterations": summary["iterations"],
            "rates": [w["iterations"] / elapsed for w in summary["per_worker"]], "wall_s": summary["wall_s"]}


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over seeds: mean iteration rate per worker, median time to target (a seed that never reached it counts as
    slowest; None when the median did not reach it)."""
    times = sorted((r["time_to_target_s"] if r["time_to_target_s"] is not None else float("inf")) for r in runs)
    median = statistics.median(times)
    return {"rates": [statistics.mean(col) for col in zip(*(r["rates"] for r in runs))],
            "time_to_target_s": None if median == float("inf") else median,
            "times": [r["time_to_target_s"] for r in runs]}


def relative(a: float | None, b: float | None) -> float | None:
    """|a - b| / b, None when either is missing."""
    if a is None or b is None or b == 0:
        return None
    return abs(a - b) / b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=45.0, help="seconds per run (virtual on sim, wall on ray)")
    parser.add_argument("--seeds", type=int, default=7,
                        help="seeds per config and backend (the median of 3 chaotic ASP times was 125%% off)")
    args = parser.parse_args()
    origin, start = provenance(), time.perf_counter()
    rows = []
    for name, extra in CONFIGS.items():
        runs = {backend: [run(backend, BASE + extra + [f"run.max_time_s={args.budget}", f"run.seed={seed}"])
                          for seed in range(args.seeds)] for backend in ("sim", "ray")}
        sim, ray = combine(runs["sim"]), combine(runs["ray"])
        rate_error = max(abs(r - s) / s for r, s in zip(ray["rates"], sim["rates"]))
        time_error = relative(ray["time_to_target_s"], sim["time_to_target_s"])
        row = {"config": name, "overrides": extra, "sim": sim, "ray": ray, "runs": runs, "rate_error": rate_error,
               "time_error": time_error, "load": round(os.getloadavg()[0], 2),
               "within": rate_error <= RATE_BAR and time_error is not None and time_error <= TIME_BAR}
        print(json.dumps(row), flush=True)
        rows.append(row)
    lines = ["# Simulator fidelity: the same configs on sim and on ray", "",
             f"Commit `{origin['git_commit'][:10]}`; command: `{origin['command']}`. LeNet-5 / mnist5k, 4 emulated "
             f"workers at 1/1/2/4x (0.05 s per batch at 1x), 1 Gbit/s links, {args.budget:.0f} s per run (virtual "
             f"on sim, wall on ray), {args.seeds} seeds each. Rates: iterations per second per worker (mean over the "
             "seeds), sim / ray; error: the "
             f"largest relative error over the workers (bar {RATE_BAR:.0%}). Time to 90%: median over the seeds, "
             f"sim / ray (per seed in brackets), and its relative error (bar {TIME_BAR:.0%}).", "",
             "| config | rates, sim | rates, ray | rate error | time to 90%, sim / ray (s) | time error | within |",
             "|---|---|---|---:|---|---:|---|"]
    fmt = lambda v: "never" if v is None else f"{v:.1f}"  # noqa: E731
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r['config']} | {', '.join(f'{x:.1f}' for x in r['sim']['rates'])} "
            f"| {', '.join(f'{x:.1f}' for x in r['ray']['rates'])} | {r['rate_error']:.1%} "
            f"| {fmt(r['sim']['time_to_target_s'])} [{', '.join(map(fmt, r['sim']['times']))}] / "
            f"{fmt(r['ray']['time_to_target_s'])} [{', '.join(map(fmt, r['ray']['times']))}] "
            f"| {pct(r['time_error'])} | {'yes' if r['within'] else 'no'} |")
    text = "\n".join(lines) + "\n"
    meta = {**origin, "budget_s": args.budget, "config": BASE, "configs": CONFIGS,
            "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sim_fidelity.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / "sim_fidelity.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
