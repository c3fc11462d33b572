"""SIM's similarity signal on the transformer LM: does it carry information? (issue 40, item 4)

SIM skips a tensor while the workers' updates for it are similar. Whether
that signal exists is measured here, without letting it change training:
BSP with SIM on and ``max_period = 1`` (every tensor aggregated every
clock, so the runs are plain BSP) records, per clock and tensor, the mean
cosine of each worker's update with the aggregate and the signal-to-noise
ratio it implies (0 at the noise floor 1/sqrt(n) of n workers whose updates
are pure noise). Varied: workers (4, 16), batch size (8, 32, 128) and the
partition (IID, by_source: each worker a few whole modules).

Reported per configuration: the median measured cosine over tensors and
clocks against the floor 1/sqrt(n), the share of (tensor, clock) pairs whose
SNR reaches 1 (what SIM's default rule needs before it may skip), and that
share in the first and the last third of the run; a plot per configuration
of each tensor's cosine over clocks with the floor drawn in
(benchmarks/results/sim_signal/*.png).

Usage: .venv/bin/python benchmarks/sim_signal.py [--steps 300] [--quick] [--resume]
Results: benchmarks/results/sim_signal.{json,md} and benchmarks/results/sim_signal/.
Each finished configuration's row is kept in runs/sim_signal/rows.jsonl; ``--resume`` reuses the rows
measured with the same number of rounds (a run of 16 workers at batch 128 takes an hour on this CPU).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tuned import RESULTS, ROOT, provenance, write_results

MEASURE = ["compression.similarity.enabled=true", "compression.similarity.max_period=1",
           "compression.similarity.warmup_iterations=0", "compression.similarity.min_numel=0",
           "run.stop_at_target=false", "backend.log_iterations=false", "run.max_time_s=100000"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="BSP rounds per run")
    parser.add_argument("--quick", action="store_true", help="4 workers, batch 32, both partitions, 60 rounds")
    parser.add_argument("--resume", action="store_true", help="reuse the rows already measured (same rounds)")
    args = parser.parse_args(argv)
    grid = ([(4, 32, "iid"), (4, 32, "by_source")] if args.quick else
            list(itertools.product((4, 16), (8, 32, 128), ("iid", "by_source"))))
    steps = 60 if args.quick else args.steps
    rows = []
    plots = RESULTS / "sim_signal"
    plots.mkdir(parents=True, exist_ok=True)
    kept = kept_rows(steps) if args.resume else {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers, batch, partition in grid:
            row = kept.get((workers, batch, partition))
            if row is None or not (ROOT / row["plot"]).exists():
                events = measure(workers, batch, partition, steps, Path(tmp) / f"{workers}-{batch}-{partition}")
                row = summarise(events, workers, batch, partition)
                row["plot"] = str(plot(events, workers, plots / f"w{workers}-b{batch}-{partition}.png",
                                       f"{workers} workers, batch {batch}, {partition}").relative_to(ROOT))
                keep_row(row, steps)
            print(json.dumps(row), flush=True)
            rows.append(row)
    write_results("sim_signal", {**provenance(), "steps": steps, "rows": rows}, markdown(rows, steps))


ROWS = ROOT / "runs" / "sim_signal" / "rows.jsonl"


def kept_rows(steps: int) -> dict[tuple[int, int, str], dict[str, Any]]:
    """The rows a previous run of this script measured with ``steps`` rounds, by configuration."""
    if not ROWS.exists():
        return {}
    with open(ROWS) as lines:
        entries = [json.loads(line) for line in lines if line.strip()]
    return {(e["row"]["workers"], e["row"]["batch"], e["row"]["partition"]): e["row"]
            for e in entries if e["steps"] == steps}


def keep_row(row: dict[str, Any], steps: int) -> None:
    """Append a finished configuration's row, so that an interrupted grid resumes after it."""
    ROWS.parent.mkdir(parents=True, exist_ok=True)
    with open(ROWS, "a") as out:
        out.write(json.dumps({"steps": steps, "row": row}) + "\n")


def measure(workers: int, batch: int, partition: str, steps: int, out: Path) -> list[dict[str, Any]]:
    """The sim events of a BSP run on the LM that measures similarity and never skips."""
    from shoal.config import load_config
    from shoal.runner import train

    cfg = load_config(ROOT / "examples" / "stdlib_lm.toml", MEASURE + [
        f"cluster.workers={workers}", f"data.batch_size={batch}", f"data.partition={partition}",
        f"run.max_iterations={steps * workers}", f"run.eval_every_iterations={steps * workers}"])
    train(cfg, out)
    with open(out / "metrics.jsonl") as lines:
        return [json.loads(line) for line in lines if line.startswith('{"event": "sim"')]


def summarise(events: list[dict[str, Any]], workers: int, batch: int, partition: str) -> dict[str, Any]:
    """Median cosine against the floor, and the share of (tensor, clock) pairs with SNR >= 1, overall and by
    thirds of the run."""
    floor = 1 / math.sqrt(workers)
    cosines = [c for e in events for c in e["measured"] if c is not None]
    thirds = [events[: len(events) // 3], events[-(len(events) // 3):]] if len(events) >= 3 else [events, events]

    def share(part: list[dict[str, Any]]) -> float | None:
        values = [s for e in part for s in e["snr"] if s is not None]
        return round(sum(s >= 1 for s in values) / len(values), 4) if values else None

    return {"workers": workers, "batch": batch, "partition": partition, "clocks": len(events), "floor": round(floor, 4),
            "median_cosine": round(statistics.median(cosines), 4) if cosines else None,
            "snr_at_least_1": share(events), "first_third": share(thirds[0]), "last_third": share(thirds[1])}


def plot(events: list[dict[str, Any]], workers: int, path: Path, title: str) -> Path:
    """Each tensor's measured cosine over clocks (thin lines), the noise floor 1/sqrt(n) (dashed)."""
    from matplotlib.figure import Figure

    from shoal.report.plots import save_figure

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    names = events[0]["names"] if events else []
    clocks = [e["clock"] for e in events]
    for i, _ in enumerate(names):
        ax.plot(clocks, [e["measured"][i] for e in events], linewidth=0.7, alpha=0.6)
    ax.axhline(1 / math.sqrt(workers), color="black", linestyle="--", linewidth=1.2,
               label=f"noise floor 1/sqrt({workers})")
    ax.axhline(math.sqrt((1 + 1 / workers) / 2), color="#d62728", linestyle=":", linewidth=1.2,
               label="SNR 1 (SIM's default rule may skip above it)")
    ax.set_xlabel("clock (BSP round)")
    ax.set_ylabel("cosine of a worker's update with the aggregate")
    ax.set_title(f"SIM's signal per tensor: {title}")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def markdown(rows: list[dict[str, Any]], steps: int) -> str:
    lines = ["# SIM's similarity signal on the transformer LM", "",
             f"BSP with SIM measuring and never skipping (`max_period = 1`), {steps} rounds per run on "
             "examples/stdlib_lm.toml. Floor: 1/sqrt(n), the cosine of pure noise; SNR >= 1: the share of "
             "(tensor, clock) pairs where SIM's default rule would let a tensor be skipped.", "",
             "| workers | batch | partition | median cosine | floor | SNR >= 1 | first third | last third | plot |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['workers']} | {r['batch']} | {r['partition']} | {r['median_cosine']} | {r['floor']} | "
                     f"{r['snr_at_least_1']} | {r['first_third']} | {r['last_third']} | {r['plot']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1:])
