"""What the ray backend costs against PyTorch DDP, and what GSSP buys on emulated tiers.

Part 1, overhead, side by side in one run, repeated: for an MLP [1024, 1024]
on mnist5k (1.9 M parameters) and ResNet-18 on CIFAR-shaped synthetic data
(11.2 M), batch 32, on 2 and 4 workers (one torch thread each, emulation off:
real speeds), each repetition measures in turn

- PyTorch DistributedDataParallel (gloo over loopback, one process per rank),
- shoal's BSP on the ray backend as a user gets it by default (``sync.intra_group``
  unset: "auto" takes all-reduce groups, DDP inside the worker actors),
- shoal's BSP through the parameter server (``"server"``, the old path),
- a bare gloo all-reduce of the gradient's bytes (the communication floor),

and reports medians over the repetitions of the per-iteration time (a BSP
round for shoal, one synchronised step for DDP), the compute alone, the
communication a round exposes (per-iteration time minus compute), and the
ratios the roadmap asks for: shoal-allreduce / DDP, and its exposed
communication / the bare all-reduce.

Part 2, GSSP vs BSP: examples/mnist_tiers.toml (8 workers at 1/2/4/8x plus
transient stragglers, emulated) on the ray backend, time to 94% test
accuracy in wall seconds.

Both parts share one embedded local Ray (127.0.0.1 only) with actor reuse.
Usage: .venv/bin/python benchmarks/runtime_overhead.py [--quick] [--only overhead|tiers] [--reps 3]
Writes benchmarks/results/runtime_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET = 0.94
# a small test set: the ray driver evaluates once at t = 0, and on 2 cores a large evaluation would steal the
# workers' CPU during the measured rounds (DDP evaluates nothing)
COMMON = ["data.batch_size=32", "data.test_fraction=0.02", "optimizer.lr=0.05", "optimizer.momentum=0.9"]
WORKLOADS = {
    "mlp": ["model.name=mlp", "model.hidden=[1024, 1024]", "data.name=mnist5k", *COMMON],
    "resnet18": ["model.name=resnet18", "data.name=synthetic", *COMMON],
}
STEPS = {"mlp": 60, "resnet18": 8}  # measured iterations per run (after 3 warm-up ones)
WARMUP = 3


# -- DDP and the bare all-reduce -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(rank: int, world: int, port: int, steps: int, warmup: int, workload: list[str], out: str) -> None:
    """One DDP process: the same model, shard and batches as a shoal worker."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from shoal.config import load_config
    from shoal.engine.setup import build_setup

    torch.set_num_threads(1)
    cfg = load_config(None, workload + [f"cluster.workers={world}"])
    setup = build_setup(cfg)  # seeds the model like shoal does
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = DistributedDataParallel(setup.engine.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    stream = setup.streams[rank]

    def step(sync: bool = True) -> None:
        x, y = stream.next()
        opt.zero_grad(set_to_none=True)
        if sync:
            loss_fn(model(x), y).backward()
        else:
            with model.no_sync():
                loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    synced = (time.perf_counter() - start) / steps
    start = time.perf_counter()
    for _ in range(steps):
        step(sync=False)  # the same work without the all-reduce: compute alone
    local = (time.perf_counter() - start) / steps
    dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"step_s": synced, "compute_s": local}))
    dist.destroy_process_group()


def _allreduce_rank(rank: int, world: int, port: int, values: int, repeats: int, out: str) -> None:
    """One rank of a bare gloo all-reduce of ``values`` float32 (the gradient's size), timed per call."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tensor = torch.ones(values)
    times = []
    for _ in range(repeats + 2):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    Path(out, f"rank{rank}.json").write_text(json.dumps({"allreduce_s": statistics.median(times[2:])}))
    dist.destroy_process_group()


def _spawn(fn: Any, world: int, *args: Any) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(fn, args=(world, _free_port(), *args, tmp), nprocs=world, join=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


def run_ddp(workload: str, workers: int, steps: int) -> dict[str, Any]:
    ranks = _spawn(_ddp_rank, workers, steps, WARMUP, WORKLOADS[workload])
    return {"iteration_s": max(r["step_s"] for r in ranks),
            "compute_s": statistics.mean(r["compute_s"] for r in ranks), "steps": steps}


def run_bare_allreduce(values: int, workers: int, repeats: int = 10) -> float:
    ranks = _spawn(_allreduce_rank, workers, values, repeats)
    return max(r["allreduce_s"] for r in ranks)


# -- shoal on Ray ---------------------------------------------------------------------------------


def _ray_run(overrides: list[str], path: Path | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from shoal.backends.ray import RayBackend
    from shoal.config import load_config
    from shoal.engine.metrics import RunRecorder
    from shoal.engine.setup import build_setup

    stream = io.StringIO()
    cfg = load_config(path, overrides)
    summary = RayBackend(build_setup(cfg), RunRecorder(stream=stream)).run()
    summary["data_path"] = cfg.data_path()  # as shoal train records it
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    return summary, events


def run_shoal_bsp(workload: str, workers: int, intra_group: str, rounds: int) -> dict[str, Any]:
    """BSP, emulation off: per-round time from the iteration records (after the warm-up rounds).

    ``intra_group = "auto"`` sets nothing: the path a user gets by default (on ray: all-reduce groups)."""
    chosen = [] if intra_group == "auto" else [f"sync.intra_group={intra_group}"]
    common = WORKLOADS[workload] + chosen + [
        f"cluster.workers={workers}", "cluster.emulate=false", "sync.scheme=bsp",
        "backend.name=ray", f"backend.cpus_per_worker={1 / workers}", "backend.cpus_per_server=0.1",
        "backend.checkpoint_every_s=0", "run.target_accuracy=0.999", "run.eval_every_s=100000",
        "run.max_time_s=1200",
    ]
    if intra_group == "server":
        _ray_run(common + [f"run.max_iterations={2 * workers}"])  # start (or re-use) the actors
    summary, events = _ray_run(common + [f"run.max_iterations={(rounds + WARMUP) * workers}"])
    its = sorted((e for e in events if e["event"] == "iteration"), key=lambda e: e["t"])
    by_clock: dict[int, float] = {}
    for e in its:
        by_clock[e["clock"]] = max(by_clock.get(e["clock"], 0.0), e["t"])  # a round ends with its last push
    clocks = sorted(c for c in by_clock if c > WARMUP)
    per_round = (by_clock[clocks[-1]] - by_clock[clocks[0]]) / (len(clocks) - 1)
    measured = [e for e in its if e["clock"] > WARMUP]
    mean = lambda key: statistics.mean(e[key] for e in measured)  # noqa: E731
    return {
        "iteration_s": per_round, "rounds": len(clocks) - 1, "compute_s": mean("compute_real_s"),
        "wait_s": mean("wait_s"), "comm_s": mean("comm_s"), "iterations": summary["iterations"],
        "params": summary["params"], "data_path": summary.get("data_path"),
    }


def measure_overhead(reps: int, worker_counts: list[int], quick: bool, workloads: list[str]) -> list[dict[str, Any]]:
    """Every (workload, workers) point: DDP, shoal all-reduce, shoal server, bare all-reduce, in turn, ``reps`` times."""
    rows = []
    for rep in range(reps):
        for workload in workloads:
            steps = max(4, STEPS[workload] // (3 if quick else 1))
            for workers in worker_counts:
                row: dict[str, Any] = {"workload": workload, "workers": workers, "rep": rep,
                                       "load": round(os.getloadavg()[0], 2)}
                row["ddp"] = run_ddp(workload, workers, steps)
                row["shoal_allreduce"] = run_shoal_bsp(workload, workers, "auto", steps)  # the default path
                assert row["shoal_allreduce"]["data_path"]["intra_group"] == "allreduce", row["shoal_allreduce"]
                row["shoal_server"] = run_shoal_bsp(workload, workers, "server", steps)
                row["bare_allreduce_s"] = run_bare_allreduce(row["shoal_allreduce"]["params"], workers)
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the repetitions per (workload, workers), and the ratios."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        for workers in dict.fromkeys(r["workers"] for r in rows):
            mine = [r for r in rows if r["workload"] == workload and r["workers"] == workers]
            if not mine:
                continue
            med = lambda f: statistics.median(f(r) for r in mine)  # noqa: E731
            exposed = lambda r, k: max(r[k]["iteration_s"] - r[k]["compute_s"], 0.0)  # noqa: E731
            point = {
                "workload": workload, "workers": workers, "reps": len(mine), "params": mine[0]["shoal_allreduce"]["params"],
                "ddp_s": med(lambda r: r["ddp"]["iteration_s"]),
                "ddp_compute_s": med(lambda r: r["ddp"]["compute_s"]),
                "allreduce_s": med(lambda r: r["shoal_allreduce"]["iteration_s"]),
                "allreduce_compute_s": med(lambda r: r["shoal_allreduce"]["compute_s"]),
                "server_s": med(lambda r: r["shoal_server"]["iteration_s"]),
                "bare_allreduce_s": med(lambda r: r["bare_allreduce_s"]),
                "ddp_exposed_comm_s": med(lambda r: exposed(r, "ddp")),
                "allreduce_exposed_comm_s": med(lambda r: exposed(r, "shoal_allreduce")),
                "allreduce_over_ddp": med(lambda r: r["shoal_allreduce"]["iteration_s"] / r["ddp"]["iteration_s"]),
                "server_over_ddp": med(lambda r: r["shoal_server"]["iteration_s"] / r["ddp"]["iteration_s"]),
                "allreduce_ratios": [round(r["shoal_allreduce"]["iteration_s"] / r["ddp"]["iteration_s"], 3)
                                     for r in mine],
            }
            point["exposed_comm_over_bare"] = point["allreduce_exposed_comm_s"] / point["bare_allreduce_s"]
            out.append(point)
    return out


def run_tiers(scheme: str, budget_s: float) -> dict[str, Any]:
    """examples/mnist_tiers.toml on the ray backend, as `shoal train --backend ray` runs it."""
    start = time.perf_counter()
    summary, _ = _ray_run([
        f"sync.scheme={scheme}", f"run.target_accuracy={TARGET}", f"run.max_time_s={budget_s}", "backend.name=ray",
        "backend.cpus_per_worker=0.25", "backend.cpus_per_server=0.25", "backend.checkpoint_every_s=0",
    ], ROOT / "examples" / "mnist_tiers.toml")
    return {
        "time_to_target_s": summary["time_to_target_s"], "final_accuracy": summary["final_accuracy"],
        "iterations": summary["iterations"], "elapsed_s": summary["elapsed_s"], "groups": summary["groups"],
        "fast_worker_iterations": summary["per_worker"][0]["iterations"],
        "slow_worker_iterations": summary["per_worker"][-1]["iterations"], "wall_s": round(time.perf_counter() - start, 1),
        "per_worker": summary["per_worker"], "failures": summary["failures"], "exchanges": summary["exchanges"],
    }


# -- report ---------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    points, t = result["overhead"]["points"], result["tiers"]
    ms = lambda v: f"{1e3 * v:.1f}"  # noqa: E731
    lines = [
        "# Ray backend: runtime overhead and GSSP on emulated tiers", "",
        f"Machine: {result['machine']['cpus']} cores; load average before the overhead part "
        f"{result['machine']['load_overhead']}, before the tiers part {result['machine']['load_tiers']}. "
        f"Commit `{result['git_commit'][:10]}`; command: `{result['command']}`.", "",
        "## BSP per iteration: shoal's default path (all-reduce groups), shoal through the server, PyTorch DDP "
        "(gloo, loopback)", "",
        f"Batch 32, one torch thread per rank, emulation off; medians over {result['overhead']['reps']} repetitions, "
        "each running the four measurements in turn (ms; exposed communication = per-iteration time minus "
        "compute alone; bare all-reduce = one gloo all-reduce of the gradient's bytes).", "",
        "| workload | workers | DDP | shoal default (all-reduce) | shoal server | default / DDP (per rep) | server / DDP "
        "| compute (DDP / shoal) | exposed comm (DDP / shoal) | bare all-reduce | shoal exposed / bare |",
        "|---|---:|---:|---:|---:|---|---:|---|---|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p['workload']} ({p['params'] / 1e6:.1f} M) | {p['workers']} | {ms(p['ddp_s'])} | {ms(p['allreduce_s'])} "
            f"| {ms(p['server_s'])} | {p['allreduce_over_ddp']:.2f}x ({', '.join(f'{r:.2f}' for r in p['allreduce_ratios'])}) "
            f"| {p['server_over_ddp']:.2f}x | {ms(p['ddp_compute_s'])} / {ms(p['allreduce_compute_s'])} "
            f"| {ms(p['ddp_exposed_comm_s'])} / {ms(p['allreduce_exposed_comm_s'])} | {ms(p['bare_allreduce_s'])} "
            f"| {p['exposed_comm_over_bare']:.2f}x |")
    lines += ["", "## GSSP vs BSP on the ray backend, examples/mnist_tiers.toml (emulated 1/2/4/8x tiers + stragglers)",
              "", "| scheme | time to 94% (wall s) | final accuracy | iterations | fastest / slowest worker iterations |",
              "|---|---:|---:|---:|---:|"]
    for scheme, r in t.items():
        ttt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        lines.append(f"| {scheme} | {ttt} | {r['final_accuracy']:.3f} | {r['iterations']} | "
                     f"{r['fast_worker_iterations']} / {r['slow_worker_iterations']} |")
    lines += ["", NOTES]
    return "\n".join(lines) + "\n"


NOTES = """## Where the time goes

- shoal's default path (`sync.intra_group` unset: "auto" takes all-reduce
  groups for BSP on ray, `"allreduce"`): each worker actor
  wraps its module in DDP inside one torch.distributed group, so the round
  is DDP's plus the actor's own bookkeeping: a one-value all-reduce every
  ~50 ms of compute (the agreed stop flag, overlapped with the forward
  pass), an iteration record, and the Ray processes (driver loop, raylet,
  each actor's core-worker threads) on the same cores. Its compute column is
  the least of three no-sync forward + backward passes at start-up, so under
  load it reads low and its exposed communication high; DDP's is the same
  step without the all-reduce, measured in turn.
- shoal server (`"server"`): compute, then one actor call that ships the
  full gradient, waits at the barrier while the server applies the round,
  and brings back the next round's full parameter vector
  (`backend.combined_pull`); nothing of it overlaps the compute.
- All ranks share the machine's cores: with more ranks than cores, compute
  and the all-reduce's own threads compete (DDP's own exposed communication
  is 1.6-3x the bare all-reduce here), so exposed communication is an upper
  bound of what a core per rank would show.
"""


def provenance() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {"git_commit": git("rev-parse", "HEAD"),
            "dirty_tree": bool(git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks/*.py"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, one repetition, 2 workers, shorter tier runs")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", default="2,4", help="comma-separated worker counts of the overhead part")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ", ".join(WORKLOADS))
    parser.add_argument("--only", choices=["overhead", "tiers"], help="run one part; the other comes from the last results")
    args = parser.parse_args()
    previous = json.loads((RESULTS / "runtime_overhead.json").read_text()) if args.only else {}
    reps, counts = (1, [2]) if args.quick else (args.reps, [int(n) for n in args.workers.split(",")])
    budget = 60.0 if args.quick else 180.0
    load = os.getloadavg()[0]

    import ray

    from shoal.backends.ray.session import ActorPool, start_local_ray

    start_local_ray(16)  # logical CPUs: the actors' requests must fit; the real cores are shared
    ActorPool.enabled = True
    try:
        if args.only == "tiers":
            overhead = previous["overhead"]
        else:
            rows = measure_overhead(reps, counts, args.quick, args.workloads.split(","))
            overhead = {"reps": reps, "rows": rows, "points": summarise(rows)}
        ActorPool.clear()
        if args.only == "overhead":
            tiers = previous["tiers"]
        else:
            tiers = {scheme: run_tiers(scheme, budget) for scheme in ("gssp", "bsp")}
        print(f"tiers: {tiers}", flush=True)
    finally:
        ActorPool.clear()
        ray.shutdown()

    result = {
        **provenance(),
        "command": ".venv/bin/python benchmarks/runtime_overhead.py" + (" --quick" if args.quick else "")
                   + (f" --only {args.only}" if args.only else "") + (f" --reps {args.reps}" if args.reps != 3 else "")
                   + (f" --workers {args.workers}" if args.workers != "2,4" else "")
                   + (f" --workloads {args.workloads}" if args.workloads != ",".join(WORKLOADS) else ""),
        "machine": {
            "cpus": os.cpu_count(),
            "load_overhead": previous["machine"]["load_overhead"] if args.only == "tiers" else round(load, 2),
            "load_tiers": previous["machine"]["load_tiers"] if args.only == "overhead" else round(load, 2),
        },
        "overhead": overhead,
        "tiers": tiers,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "runtime_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "runtime_overhead.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
