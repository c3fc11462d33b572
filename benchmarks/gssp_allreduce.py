"""GSSP on ray: all-reduce groups against the paper's SSP group servers, on examples/mnist_tiers.toml.

LeNet-5 on mnist5k, 8 workers in four speed tiers (1x, 2x, 4x, 8x) with
transient 4x spells, emulated as the example configures it; target 94%,
60 s budget. ``sync.intra_group`` = "server" (SSP inside each group, one
group server each) and "allreduce" (each group a DDP process group, deltas
between groups through the object store), in turn within each seed, on one
embedded Ray. Reported per run: time to 94%, final accuracy, iterations,
the groups, and (all-reduce) the pauses the regroups took.

``--model mlp``: the same cluster with the MLP [1024, 1024] (1.9 M
parameters, 31x LeNet-5's), where moving the model through a group server
costs more than the emulated compute.

Usage: .venv/bin/python benchmarks/gssp_allreduce.py [--seeds 0 1 2] [--model lenet5|mlp]
Writes benchmarks/results/gssp_allreduce.{json,md} (``--model mlp``: gssp_allreduce-mlp.*).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
from pathlib import Path
from typing import Any

from tuned import provenance, write_results

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "mnist_tiers.toml"
BASE = ["sync.scheme=gssp", "backend.name=ray", "backend.cpus_per_worker=0.25", "backend.cpus_per_server=0.25",
        "backend.checkpoint_every_s=0", "run.target_accuracy=0.94", "run.max_time_s=60"]
PATHS = ("server", "allreduce")


MODELS = {"lenet5": [], "mlp": ["model.name=mlp", "model.hidden=[1024, 1024]"]}


def run(intra_group: str, seed: int, model: str) -> dict[str, Any]:
    from shoal.backends.ray import RayBackend
    from shoal.config import load_config
    from shoal.engine.metrics import RunRecorder
    from shoal.engine.setup import build_setup

    stream = io.StringIO()
    cfg = load_config(CONFIG, [*BASE, *MODELS[model], f"sync.intra_group={intra_group}", f"run.seed={seed}"])
    summary = RayBackend(build_setup(cfg), RunRecorder(stream=stream)).run()
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    pauses = [round(e["stop_s"] + e["settle_s"] + e["form_s"], 2) for e in events if e["event"] == "regroup_pause"]
    return {"seed": seed, "intra_group": intra_group, "time_to_target_s": summary["time_to_target_s"],
            "final_accuracy": summary["final_accuracy"], "iterations": summary["iterations"],
            "groups": summary["groups"], "regroups": sum(e["event"] == "groups" for e in events) - 1,
            "regroup_pauses_s": pauses, "stop_reason": summary["stop_reason"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--model", choices=sorted(MODELS), default="lenet5")
    args = parser.parse_args()
    import ray

    from shoal.backends.ray.session import start_local_ray

    load = os.getloadavg()[0]
    start_local_ray(max(4, os.cpu_count() or 2))  # logical CPUs: 8 workers and up to 4 group servers at 0.25
    runs = [run(path, seed, args.model) for seed in args.seeds for path in PATHS]
    ray.shutdown()
    medians = {}
    for path in PATHS:
        times = [r["time_to_target_s"] for r in runs if r["intra_group"] == path]
        reached = [t for t in times if t is not None]
        medians[path] = {"reached": len(reached), "of": len(times),
                         "median_time_to_target_s": round(statistics.median(reached), 2) if reached else None}
    result = {**provenance(), "model": args.model, "machine": {"cpus": os.cpu_count(), "load": round(load, 2)}, "runs": runs,
              "medians": medians}
    title = "examples/mnist_tiers.toml" + ("" if args.model == "lenet5" else ", the MLP [1024, 1024]")
    lines = [f"# GSSP on ray: all-reduce groups against SSP group servers ({title})", "",
             f"Target 94%, 60 s budget, seeds {args.seeds}, both paths in turn per seed on one embedded Ray; commit "
             f"`{result['git_commit'][:10]}`; command: `{result['command']}`; {os.cpu_count()} cores, load average "
             f"before {result['machine']['load']}.", "",
             "| intra_group | seed | time to 94% (s) | final | iterations | regroups | regroup pauses (s) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        t = r["time_to_target_s"]
        lines.append(f"| {r['intra_group']} | {r['seed']} | {'-' if t is None else round(t, 1)} | "
                     f"{r['final_accuracy']:.3f} | {r['iterations']} | {r['regroups']} | "
                     f"{', '.join(str(p) for p in r['regroup_pauses_s']) or '-'} |")
    lines += ["", "| intra_group | reached 94% | median time to 94% (s) |", "|---|---:|---:|"]
    for path, m in medians.items():
        lines.append(f"| {path} | {m['reached']} of {m['of']} | {m['median_time_to_target_s'] or '-'} |")
    lines.append("")
    write_results("gssp_allreduce" + ("" if args.model == "lenet5" else f"-{args.model}"), result, "\n".join(lines))


if __name__ == "__main__":
    main()
