"""Would a sharded parameter server cut ASP's communication on this machine? Ray actor calls, side by side.

Before building the sharded server that the collectives issue asks for
(ASP's per-iteration communication at least 2x lower than today's server
for the 1.9 M-parameter MLP on 4 workers), this measures the data path it
would use with the transport it would use: 4 worker actors, each iteration
moving the model's float32 parameters down and a gradient of the same size
up, with 10 ms of stand-in compute between iterations (Ray's local mode,
loopback; the actors' logic is a vector update, so only transport and
scheduling are timed). Compared, in turn, within each repetition:

- ``pull + push``: today's server path, two calls per iteration to one server;
- ``push_pull x S``: one combined call per iteration to each of S shard
  actors (S = 1, 2, 4) holding 1/S of the vector, all S in parallel.

Usage: .venv/bin/python benchmarks/server_sharding.py [--reps 3]
Writes benchmarks/results/server_sharding.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import numpy as np

from tuned import provenance, write_results

PARAMS = 1_863_690  # the MLP [1024, 1024] on 28 x 28 inputs, 10 classes
WORKERS = 4
ITERATIONS = 40
WARMUP = 5
VARIANTS = [("pull + push", 1), ("push_pull", 1), ("push_pull", 2), ("push_pull", 4)]


class Shard:
    """A server (or one shard of it): a slice of the parameters and a version counter."""

    def __init__(self, size: int) -> None:
        self.params = np.zeros(size, np.float32)
        self.version = 0

    async def pull(self) -> tuple[np.ndarray, int]:
        return self.params, self.version

    async def push(self, grad: np.ndarray) -> int:
        self.params -= 0.01 * grad
        self.version += 1
        return self.version

    async def push_pull(self, grad: np.ndarray) -> tuple[np.ndarray, int]:
        self.params -= 0.01 * grad
        self.version += 1
        return self.params, self.version


class Client:
    """A worker: per iteration, its communication, then 10 ms of stand-in compute."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards

    async def run(self, combined: bool, iterations: int) -> float:
        times = []
        parts = await asyncio.gather(*[s.pull.remote() for s in self.shards])
        grads = [np.ones_like(p) for p, _ in parts]
        for _ in range(iterations):
            start = time.perf_counter()
            if combined:
                parts = await asyncio.gather(*[s.push_pull.remote(g) for s, g in zip(self.shards, grads)])
                np.concatenate([p for p, _ in parts])
            else:
                params, _ = await self.shards[0].pull.remote()
                await self.shards[0].push.remote(np.ones_like(params))
            times.append(time.perf_counter() - start)
            await asyncio.sleep(0.01)
        return statistics.median(times[WARMUP:])


def measure(kind: str, shards: int) -> float:
    """Median per-iteration communication (ms) over the workers, one variant."""
    import ray

    sizes = [PARAMS // shards + (1 if k < PARAMS % shards else 0) for k in range(shards)]
    servers = [ray.remote(Shard).options(num_cpus=0.1, max_concurrency=1000).remote(n) for n in sizes]
    clients = [ray.remote(Client).options(num_cpus=0.1, max_concurrency=10).remote(servers) for _ in range(WORKERS)]
    try:
        per_worker = ray.get([c.run.remote(kind == "push_pull", ITERATIONS) for c in clients])
    finally:
        for actor in servers + clients:
            ray.kill(actor)
    return 1e3 * statistics.median(per_worker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    import ray

    from shoal.backends.ray.session import start_local_ray

    load = os.getloadavg()[0]
    start_local_ray(os.cpu_count() or 2)
    reps = [{f"{k} x{s}": round(measure(k, s), 2) for k, s in VARIANTS} for _ in range(args.reps)]
    ray.shutdown()
    names = [f"{k} x{s}" for k, s in VARIANTS]
    medians = {n: round(statistics.median(r[n] for r in reps), 2) for n in names}
    base = medians["pull + push x1"]
    result = {**provenance(), "machine": {"cpus": os.cpu_count(), "load": round(load, 2)}, "params": PARAMS,
              "workers": WORKERS, "iterations": ITERATIONS, "reps": reps, "median_ms": medians,
              "over_today": {n: round(medians[n] / base, 3) for n in names}}
    lines = ["# A sharded server on Ray actor calls: per-iteration communication, 4 workers, 1.9 M floats", "",
             f"Commit `{result['git_commit'][:10]}`; command: `{result['command']}`; {os.cpu_count()} cores, load "
             f"average before {result['machine']['load']}. Medians over {args.reps} repetitions of the median "
             "worker's median iteration (ms); each repetition runs the variants in turn.", "",
             "| variant | ms per iteration | over today's pull + push | per repetition |", "|---|---:|---:|---|"]
    for n in names:
        lines.append(f"| {n} | {medians[n]} | {result['over_today'][n]:.2f}x | {', '.join(str(r[n]) for r in reps)} |")
    lines += ["", "The issue's bar is 0.5x (at least 2x lower). One combined call saves a round trip; more shards "
              "add calls and processes that compete for the same cores, so on this machine they cost more than "
              "they split.", ""]
    write_results("server_sharding", result, "\n".join(lines))


if __name__ == "__main__":
    main()
