"""Wall time per simulated worker-iteration of the sim backend, in train and cost mode.

Usage: .venv/bin/python benchmarks/sim_speed.py [--quick]
Writes benchmarks/results/sim_speed.json and sim_speed.md.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tenth of the worker count")
    args = parser.parse_args()
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
