"""Seconds per evaluation by examples per forward pass, on one CPU core (engine/gradients.py: EVAL_BATCH_CPU).

Evaluation on the held-out set is a large share of a study run's wall time
(the transformer's 5,000 windows and the ResNet's 5,000 images every 160
iterations). On a CPU core a pass that stays in cache is faster than one
big pass; this measures by how much, for each workload's evaluation, with
the batch sizes interleaved in every repetition so that load affects them
alike, and checks that the metric is the same to float rounding.

Usage:
    .venv/bin/python benchmarks/eval_batch.py [--repeats 3] [--batches 1024,256,64,32]

Results: benchmarks/results/eval_batch.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

from tuned import ROOT, provenance, write_results

WORKLOADS = {  # name: (config, examples evaluated)
    "transformer (stdlib LM)": ("examples/stdlib_lm.toml", 5000),
    "ResNet-18 width 16 (shapes)": ("examples/shapes_bn.toml", 2000),
    "LeNet-5 (MNIST)": ("examples/mnist_bsp.toml", 1000),
}


def measure(config: str, examples: int, batches: list[int], repeats: int) -> dict[str, Any]:
    from shoal.config import load_config
    from shoal.engine.setup import build_setup

    setup = build_setup(load_config(str(ROOT / config), []))
    engine, data = setup.engine, setup.dataset
    params, buffers = engine.initial_state()
    x, y = data.x_test[:examples], data.y_test[:examples]
    engine.evaluate(params, buffers, x[:64], y[:64])  # warm-up
    seconds: dict[int, list[float]] = {b: [] for b in batches}
    values: dict[int, float] = {}
    for _ in range(repeats):
        for b in batches:
            start = time.perf_counter()
            values[b] = engine.evaluate(params, buffers, x, y, batch=b).value
            seconds[b].append(time.perf_counter() - start)
    base = batches[0]
    return {"examples": len(y), "seconds": {b: [round(s, 3) for s in v] for b, v in seconds.items()},
            "median_s": {b: round(statistics.median(v), 3) for b, v in seconds.items()},
            "speedup_vs_first": {b: round(statistics.median(seconds[base]) / statistics.median(v), 2)
                                 for b, v in seconds.items()},
            "max_relative_metric_change": max(abs(values[b] - values[base]) / abs(values[base]) for b in batches)}


def markdown(record: dict[str, Any]) -> str:
    batches = record["batches"]
    lines = ["# Seconds per evaluation by examples per pass (one CPU core)", "",
             f"Commit {record['git_commit'][:10]}; median of {record['repeats']} repetitions, the batch sizes "
             "interleaved; speed-up against the first size.", "",
             "| workload | examples | " + " | ".join(f"batch {b}" for b in batches) + " | metric change |",
             "|---|---:|" + "---:|" * len(batches) + "---:|"]
    for name, r in record["workloads"].items():
        cells = [f"{r['median_s'][b]:.2f} s ({r['speedup_vs_first'][b]:.2f}x)" for b in batches]
        change = f"{r['max_relative_metric_change']:.1e}"
        lines.append(f"| {name} | {r['examples']} | " + " | ".join(cells) + f" | {change} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1024,256,64,32")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    record = {**provenance(), "batches": batches,
              "repeats": args.repeats,
              "workloads": {name: measure(config, n, batches, args.repeats) for name, (config, n) in WORKLOADS.items()}}
    write_results("eval_batch", record, markdown(record))


if __name__ == "__main__":
    main(sys.argv[1:])
