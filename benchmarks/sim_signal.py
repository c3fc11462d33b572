"""SIM's similarity signal on the new workloads: does it carry information? (issue 40, item 4)

SIM skips a tensor while the workers' updates for it are similar. Whether
that signal exists is measured here, without letting it change training:
BSP with SIM on and ``max_period = 1`` (every tensor aggregated every
clock, so the runs are plain BSP) records, per clock and tensor, the mean
cosine of each worker's update with the aggregate and the signal-to-noise
ratio it implies (0 at the noise floor 1/sqrt(n) of n workers whose updates
are pure noise). Varied: workers (4, 16), batch size (8, 32, 128) and the
partition: IID, and the workload's non-IID split (the transformer LM:
by_source, each worker a few whole modules; the BN image workload, which
has no sources: dirichlet:0.1, each worker's classes skewed).

Reported per configuration: the median measured cosine over tensors and
clocks against the floor 1/sqrt(n), the share of (tensor, clock) pairs whose
SNR reaches 1 (what SIM's default rule needs before it may skip), and that
share in the first and the last third of the run; a plot per configuration
of each tensor's cosine over clocks with the floor drawn in
(benchmarks/results/sim_signal/*.png).

Usage: .venv/bin/python benchmarks/sim_signal.py [lm|shapes] [--steps 300] [--quick] [--jobs 2] [--resume]
Results: benchmarks/results/sim_signal.{json,md} (lm), sim_signal-shapes.{json,md} (shapes), plots in
benchmarks/results/sim_signal/. Each configuration is a run folder in runs/evidence/sim-signal-WORKLOAD/
(kept in git by benchmarks/run_archive.py); ``--resume`` reads a finished one with the same rounds instead
of running it again (a run of 16 workers at batch 128 takes an hour on this CPU).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tomllib
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from evidence import NHWC
from tuned import RESULTS, ROOT, provenance, write_results

MEASURE = ["compression.similarity.enabled=true", "compression.similarity.max_period=1",
           "compression.similarity.warmup_iterations=0", "compression.similarity.min_numel=0",
           "run.stop_at_target=false", "backend.log_iterations=false", "run.max_time_s=100000"]
#: workload -> its example config, its two partitions, its results file, the plots' prefix, its name in titles
WORKLOADS: dict[str, dict[str, Any]] = {
    "lm": {"config": "examples/stdlib_lm.toml", "partitions": ("iid", "by_source"), "results": "sim_signal",
           "prefix": "", "title": "the transformer LM"},
    "shapes": {"config": "examples/shapes_bn.toml", "partitions": ("iid", "dirichlet:0.1"),
               "results": "sim_signal-shapes", "prefix": "shapes-", "title": "the BN image workload",
               "sets": [NHWC]},
}
RUNS = ROOT / "runs" / "evidence"
Config = tuple[int, int, str]  # workers, batch, partition


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", nargs="?", default="lm", choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=300, help="BSP rounds per run")
    parser.add_argument("--quick", action="store_true", help="4 workers, batch 32, both partitions, 60 rounds")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--resume", action="store_true", help="read the finished runs with the same rounds")
    parser.add_argument("--list", action="store_true", help="how many runs of each workload's grid are done")
    args = parser.parse_args(argv)
    if args.list:
        list_progress(args.steps)
        return
    spec, steps = WORKLOADS[args.workload], 60 if args.quick else args.steps
    grid = grid_of(spec, args.quick)
    # a quick look never replaces the runs of the full grid
    folder = RUNS / f"sim-signal-{args.workload}{'-quick' if args.quick else ''}"
    measure_missing(args.workload, grid, steps, folder, args.jobs, args.resume)
    rows = [row_of(spec, config, finished_events(run_folder(folder, config), steps)) for config in grid]
    write_results(spec["results"], {**provenance(), "workload": args.workload, "steps": steps, "rows": rows},
                  markdown(rows, steps, spec))


def list_progress(steps: int) -> None:
    """One line per workload: how many runs of its full grid have finished."""
    for workload, spec in WORKLOADS.items():
        grid = grid_of(spec, False)
        done = sum(finished_events(run_folder(RUNS / f"sim-signal-{workload}", c), steps) is not None for c in grid)
        print(f"{workload}: SIM's signal on {spec['title']}; {done} of {len(grid)} runs done "
              f"in runs/evidence/sim-signal-{workload}")


def measure_missing(workload: str, grid: list[Config], steps: int, folder: Path, jobs: int, resume: bool) -> None:
    """Run every configuration (with ``resume``: those without a finished run), ``jobs`` at a time. A file
    FOLDER/STOP (``studies.sh --drain``) starts no more runs; those in flight finish, then it exits 130."""
    from shoal.comparison import STOP_FILE

    (folder / STOP_FILE).unlink(missing_ok=True)  # a stop asked of an earlier pass is spent
    todo = [c for c in grid if not (resume and finished_events(run_folder(folder, c), steps) is not None)]
    if not todo:
        return
    with ProcessPoolExecutor(max(1, jobs), mp_context=get_context("spawn")) as pool:
        runs = pool.map(measure, [workload] * len(todo), todo, [steps] * len(todo),
                        [run_folder(folder, c) for c in todo])
        measured = [config for config, run in zip(todo, runs) if run is not None]
    for config in measured:
        print(f"measured {workload} {config}", flush=True)
    if len(measured) < len(todo):
        print(f"sim-signal-{workload}: stopped after the runs in flight; {len(measured)} of {len(todo)} measured, "
              "--resume goes on", file=sys.stderr)
        raise SystemExit(130)


def row_of(spec: dict[str, Any], config: Config, events: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A configuration's row of the results, with its plot drawn."""
    assert events is not None, "every configuration was measured first"
    workers, batch, partition = config
    row = summarise(events, workers, batch, partition)
    name = f"{spec['prefix']}w{workers}-b{batch}-{partition.replace(':', '')}.png"
    title = f"{workers} workers, batch {batch}, {partition}"
    (RESULTS / "sim_signal").mkdir(parents=True, exist_ok=True)
    row["plot"] = str(plot(events, workers, RESULTS / "sim_signal" / name, title).relative_to(ROOT))
    print(json.dumps(row), flush=True)
    return row


def grid_of(spec: dict[str, Any], quick: bool) -> list[Config]:
    """The configurations measured: workers x batch x the workload's two partitions (quick: 4 workers, batch 32)."""
    if quick:
        return [(4, 32, p) for p in spec["partitions"]]
    return list(itertools.product((4, 16), (8, 32, 128), spec["partitions"]))


def run_folder(folder: Path, config: Config) -> Path:
    workers, batch, partition = config
    return folder / f"w{workers}-b{batch}-{partition.replace(':', '')}"


def signal_config(workload: str, config: Config, steps: int) -> Any:
    """The BSP run on ``workload`` that measures similarity every clock and never skips."""
    from shoal.config import load_config

    workers, batch, partition = config
    return load_config(ROOT / WORKLOADS[workload]["config"], MEASURE + WORKLOADS[workload].get("sets", []) + [
        f"cluster.workers={workers}", f"data.batch_size={batch}", f"data.partition={partition}",
        f"run.max_iterations={steps * workers}", f"run.eval_every_iterations={steps * workers}"])


def measure(workload: str, config: Config, steps: int, out: Path) -> Path | None:
    """Run one configuration into ``out`` (replacing an unfinished run there); None, without running it, once
    the study's folder holds STOP."""
    from shoal.comparison.execute import stop_requested
    from shoal.runner import train

    if stop_requested(out.parent):
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    train(signal_config(workload, config, steps), out, overwrite=True)
    return out


def finished_events(run: Path, steps: int) -> list[dict[str, Any]] | None:
    """The sim events of the finished run in ``run`` if it ran ``steps`` rounds, else None (run it)."""
    try:
        summary = json.loads((run / "summary.json").read_text())
        config_text = (run / "config.toml").read_text()
    except (OSError, ValueError):
        return None
    cfg = tomllib.loads(config_text)
    rounds = cfg["run"]["max_iterations"] // cfg["cluster"]["workers"]
    if summary.get("stop_reason") != "iteration_budget" or rounds != steps:
        return None
    with open(run / "metrics.jsonl") as lines:
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


def markdown(rows: list[dict[str, Any]], steps: int, spec: dict[str, Any]) -> str:
    lines = [f"# SIM's similarity signal on {spec['title']}", "",
             f"BSP with SIM measuring and never skipping (`max_period = 1`), {steps} rounds per run on "
             f"{spec['config']}. Floor: 1/sqrt(n), the cosine of pure noise; SNR >= 1: the share of "
             "(tensor, clock) pairs where SIM's default rule would let a tensor be skipped.", "",
             "| workers | batch | partition | median cosine | floor | SNR >= 1 | first third | last third | plot |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['workers']} | {r['batch']} | {r['partition']} | {r['median_cosine']} | {r['floor']} | "
                     f"{r['snr_at_least_1']} | {r['first_third']} | {r['last_third']} | {r['plot']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1:])
