"""ASP's data path on the ray backend: a push and the next pull in one call, against two calls.

4 workers, the MLP [1024, 1024] (1.9 M parameters) on mnist5k, emulation
off, batch 32, ASP; ``backend.combined_pull`` true (one call per iteration
after the first) and false (pull, then push), in turn within each of 3
repetitions. Reported: the median per-iteration communication (pull_s +
push_s of the iteration records, gate waits excluded) and iteration time,
over the records after a warm-up.

Usage: .venv/bin/python benchmarks/asp_data_path.py [--reps 3] [--iterations 240]
Writes benchmarks/results/asp_data_path.{json,md}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
from typing import Any

from tuned import provenance, write_results

WORKERS = 4
WARMUP = 5  # per worker
BASE = ["model.name=mlp", "model.hidden=[1024, 1024]", "data.name=mnist5k", "data.batch_size=32",
        f"cluster.workers={WORKERS}", "cluster.emulate=false", "sync.scheme=asp", "backend.name=ray",
        f"backend.cpus_per_worker={1 / WORKERS}", "backend.cpus_per_server=0.1", "backend.checkpoint_every_s=0",
        "run.target_accuracy=0.999", "run.eval_every_s=100000", "run.max_time_s=1200"]


def run(combined: bool, iterations: int) -> dict[str, Any]:
    from shoal.backends.ray import RayBackend
    from shoal.config import load_config
    from shoal.engine.metrics import RunRecorder
    from shoal.engine.setup import build_setup

    stream = io.StringIO()
    cfg = load_config(None, [*BASE, f"backend.combined_pull={str(combined).lower()}",
                             f"run.max_iterations={iterations}"])
    RayBackend(build_setup(cfg), RunRecorder(stream=stream)).run()
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    records = [r for r in records if r["event"] == "iteration"]
    seen: dict[int, int] = {}
    kept = []
    for r in sorted(records, key=lambda r: r["t"]):
        seen[r["worker"]] = seen.get(r["worker"], 0) + 1
        if seen[r["worker"]] > WARMUP:
            kept.append(r)
    if not kept:  # the start-up run
        return {"records": 0}
    return {"comm_ms": round(1e3 * statistics.median(r["comm_s"] for r in kept), 2),
            "iteration_ms": round(1e3 * statistics.median(r["comm_s"] + r["compute_s"] + r["wait_s"] for r in kept), 2),
            "records": len(kept)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=240)
    args = parser.parse_args()
    import ray

    from shoal.backends.ray.session import ActorPool, start_local_ray

    load = os.getloadavg()[0]
    start_local_ray(os.cpu_count() or 2)
    ActorPool.enabled = True  # the runs share started actors, so start-up is not measured
    run(True, 2 * WORKERS)
    reps = [{name: run(combined, args.iterations) for name, combined in (("two calls", False), ("one call", True))}
            for _ in range(args.reps)]
    ActorPool.clear()
    ray.shutdown()
    med = {name: {k: round(statistics.median(r[name][k] for r in reps), 2) for k in ("comm_ms", "iteration_ms")}
           for name in ("two calls", "one call")}
    ratio = round(med["one call"]["comm_ms"] / med["two calls"]["comm_ms"], 3)
    result = {**provenance(), "machine": {"cpus": os.cpu_count(), "load": round(load, 2)}, "reps": reps,
              "median": med, "comm_one_over_two": ratio}
    lines = ["# ASP on ray: push and next pull in one call, against two calls", "",
             f"4 workers, MLP [1024, 1024] (1.9 M parameters), emulation off, batch 32; commit "
             f"`{result['git_commit'][:10]}`; command: `{result['command']}`; {os.cpu_count()} cores, load average "
             f"before {result['machine']['load']}; medians over {args.reps} repetitions (each runs both in turn) "
             "of the median record after 5 warm-up iterations per worker.", "",
             "| data path | communication per iteration (ms) | iteration (ms) | per repetition (comm ms) |",
             "|---|---:|---:|---|"]
    for name in ("two calls", "one call"):
        lines.append(f"| {name} | {med[name]['comm_ms']} | {med[name]['iteration_ms']} | "
                     f"{', '.join(str(r[name]['comm_ms']) for r in reps)} |")
    lines += ["", f"One call / two calls: {ratio:.2f}x communication (the collectives issue asks for 0.5x from a "
              "sharded server; benchmarks/results/server_sharding.md shows why sharding does not get there here).", ""]
    write_results("asp_data_path", result, "\n".join(lines))


if __name__ == "__main__":
    main()
