"""Wall time per simulated worker-iteration of the sim backend, in train and cost mode; with ``--batched``,
wall seconds per simulated round with gradients computed in a loop against batched (one vmapped call).

Usage: .venv/bin/python benchmarks/sim_speed.py [--quick]
       .venv/bin/python benchmarks/sim_speed.py --batched [--workers 4,16,64] [--rounds 4] [--repeats 2]
           [--schemes bsp,asp,bsp+balance] [--tag NAME]
Writes benchmarks/results/sim_speed.{json,md}; --batched writes sim_speed_batched-DEVICE[-TAG].{json,md}
(DEVICE: cpu, or cuda where torch sees a GPU).

The batched comparison runs the workloads' own configs (LeNet on MNIST, the
BN ResNet-18 on shapes, the byte transformer on the stdlib) under BSP and
ASP, loop and batched back to back in one process, each ``--repeats`` times
(the median is reported). A round is ``workers`` iterations; its wall time
is measured between the first and the last iteration events, so neither
setup nor the final evaluation counts.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from shoal.backends.sim import SimBackend
from shoal.config import load_config
from shoal.engine.metrics import RunRecorder
from shoal.engine.setup import build_setup
from tuned import provenance  # the git commit (and a dirty-tree flag) and the command

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def measure(label: str, overrides: list[str]) -> dict:
    cfg = load_config(ROOT / "examples" / "mnist_bsp.toml", overrides + ["run.max_time_s=1e9", "run.stop_at_target=false"])
    setup = build_setup(cfg)
    start = time.perf_counter()
    summary = SimBackend(setup, RunRecorder(log_iterations=True)).run()
    wall = time.perf_counter() - start
    return {
        "case": label,
        "mode": cfg.backend.mode,
        "scheme": cfg.sync.scheme,
        "workers": cfg.cluster.workers,
        "iterations": summary["iterations"],
        "wall_s": round(wall, 3),
        "us_per_worker_iteration": round(1e6 * wall / summary["iterations"], 1),
        "virtual_s": summary["elapsed_s"],
    }


def cases(quick: bool) -> list[tuple[str, list[str]]]:
    scale = 10 if quick else 1
    big = 1024 // scale
    return [
        ("train lenet5 8w bsp", ["run.max_iterations=400"]),
        ("train lenet5 8w ssp", ["sync.scheme=ssp", "run.max_iterations=400"]),
        (f"cost lenet5 {big}w bsp", ["backend.mode=cost", f"cluster.workers={big}", f"run.max_iterations={big * 100}"]),
        (f"cost lenet5 {big}w ssp", ["backend.mode=cost", "sync.scheme=ssp", f"cluster.workers={big}",
                                     f"run.max_iterations={big * 100}"]),
        (f"cost lenet5 {big}w asp tiers", ["backend.mode=cost", "sync.scheme=asp", f"cluster.workers={big}",
                                           "cluster.profile=tiers", f"run.max_iterations={big * 100}"]),
        (f"cost lenet5 {big}w gssp tiers", ["backend.mode=cost", "sync.scheme=gssp", f"cluster.workers={big}",
                                            "cluster.profile=tiers", f"run.max_iterations={big * 100}"]),
    ]


WORKLOADS = {"lenet5": "mnist_bsp.toml", "resnet18-bn": "shapes_bn.toml", "transformer": "stdlib_lm.toml"}


#: the schemes --batched can time: the scheme and what it sets (balanced BSP: every worker's batch its own size,
#: from lognormal speeds, which the batched path pads into shared calls)
SCHEMES = {"bsp": ["sync.scheme=bsp"], "asp": ["sync.scheme=asp"],
           "bsp+balance": ["sync.scheme=bsp", "sync.balance=batch", "cluster.profile=lognormal",
                           "cluster.lognormal_sigma=1.0", "balance.profile_iterations=1"]}


def round_seconds(config: str, scheme: str, workers: int, rounds: int, batched: bool) -> tuple[float, dict]:
    """Wall seconds per simulated round (``workers`` iterations) of ``rounds`` rounds, and the run's batching."""
    cfg = load_config(ROOT / "examples" / config, [
        *SCHEMES[scheme], f"cluster.workers={workers}", f"run.max_iterations={workers * (rounds + 1)}",
        "run.max_time_s=1e9", "run.stop_at_target=false", "run.eval_every_s=1e9", "run.eval_every_iterations=0",
        "cluster.compute_s=0.05", f"backend.batched={str(batched).lower()}", "backend.log_iterations=false"])
    stamps: list[float] = []
    recorder = RunRecorder(log_iterations=False,
                           listener=lambda kind, _: stamps.append(time.perf_counter()) if kind == "iteration" else None)
    summary = SimBackend(build_setup(cfg), recorder).run()
    first_round_end = stamps[workers - 1]  # the first round warms caches up; the rest are timed
    return (stamps[-1] - first_round_end) / ((len(stamps) - workers) / workers), summary["batching"]


def batched_main(args: argparse.Namespace) -> None:
    import statistics

    import torch

    rows = []
    for name, config in WORKLOADS.items():
        for workers in args.workers:
            for scheme in args.schemes:
                loop, batched, batching = [], [], {}
                for _ in range(args.repeats):
                    loop.append(round_seconds(config, scheme, workers, args.rounds, False)[0])
                    seconds, batching = round_seconds(config, scheme, workers, args.rounds, True)
                    batched.append(seconds)
                row = {"workload": name, "workers": workers, "scheme": scheme, "loop_s": statistics.median(loop),
                       "batched_s": statistics.median(batched), "batching": batching}
                row["speedup"] = row["loop_s"] / row["batched_s"]
                print(json.dumps(row), flush=True)
                rows.append(row)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    meta = {**provenance(), "device": device, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "rounds": args.rounds, "repeats": args.repeats, "date": time.strftime("%Y-%m-%d")}
    lines = [f"# Simulated rounds: gradients in a loop against batched ({device})", "",
             f"`{meta['command']}` at {meta['git_commit'][:10]} on {meta['gpu'] or meta['cpu']}, torch "
             f"{meta['torch']}: wall seconds per round (every worker one iteration), median of {args.repeats} "
             f"back-to-back pairs of {args.rounds} timed rounds.", "",
             "| workload | workers | scheme | loop s/round | batched s/round | speed-up | largest call |",
             "|---|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['workload']} | {r['workers']} | {r['scheme']} | {r['loop_s']:.4f} | {r['batched_s']:.4f} | "
              f"{r['speedup']:.2f}x | {r['batching'].get('largest_call', '-')} |" for r in rows]
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"sim_speed_batched-{device}{'-' + args.tag if args.tag else ''}"
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tenth of the worker count")
    parser.add_argument("--batched", action="store_true", help="loop against batched gradients, per round")
    parser.add_argument("--workers", type=lambda v: [int(w) for w in v.split(",")], default=[4, 16, 64])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--schemes", type=lambda v: v.split(","), default=["bsp", "asp"],
                        help=f"--batched: which of {', '.join(SCHEMES)}")
    parser.add_argument("--tag", default="", help="--batched: a suffix of the results file's name")
    args = parser.parse_args()
    if args.batched:
        batched_main(args)
        return
    rows = [measure(label, overrides) for label, overrides in cases(args.quick)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {**provenance(), "python": sys.version.split()[0], "machine": platform.machine(), "date": time.strftime("%Y-%m-%d")}
    (RESULTS / "sim_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["| case | iterations | wall s | µs per worker-iteration | virtual s |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['iterations']} | {r['wall_s']} | {r['us_per_worker_iteration']} | {r['virtual_s']:.2f} |"
              for r in rows]
    (RESULTS / "sim_speed.md").write_text("# sim backend speed\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
