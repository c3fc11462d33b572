"""Times to target with run.eval_refine against evaluating more often, and what each costs.

For every seed, four runs of one scheme side by side, which train alike (tests/test_eval_refine.py) and differ
only in when they look: an evaluation every K iterations (coarse), the same with run.eval_refine = N (refined),
one every K / N with the same patience of 3 evaluations (fine), and one every K / N whose patience spans the
coarse streak's iterations, 3 N evaluations (fine, same window). Each is an estimator of one run's time to
target: reported are its median over seeds, its spread over seeds (what a comparison's p-value pays for), its
paired difference from the coarse one, the evaluations it made and its wall time.

Usage:
    .venv/bin/python benchmarks/eval_refine.py [--seeds 10] [--schemes bsp,localsgd] [--every 80] [--refine 8]

Results: benchmarks/results/eval_refine.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tuned import ROOT, provenance, write_results

CONFIG = "examples/mnist_bsp.toml"  # LeNet-5 on MNIST, 8 workers: BSP reaches 95% in about ten evaluations of 80


def one_run(scheme: str, seed: int, sets: list[str], out: Path) -> dict[str, Any]:
    """A run's time to target, its regular and refined evaluations, and its wall time."""
    from shoal.config import load_config
    from shoal.runner import train

    summary = train(load_config(str(ROOT / CONFIG), [f"sync.scheme={scheme}", f"run.seed={seed}", *sets]), out)
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    return {"time_to_target_s": summary["time_to_target_s"], "regular": sum(not e.get("refined") for e in evals),
            "refined": sum(bool(e.get("refined")) for e in evals), "wall_s": summary["wall_s"]}


def variants(every: int, refine: int) -> dict[str, list[str]]:
    fine = f"run.eval_every_iterations={every // refine}"
    return {"coarse": [f"run.eval_every_iterations={every}"],
            "refined": [f"run.eval_every_iterations={every}", f"run.eval_refine={refine}"],
            "fine": [fine],
            "fine, same window": [fine, f"run.target_patience={3 * refine}"]}


def measure(schemes: list[str], seeds: int, every: int, refine: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in schemes:
            for seed in range(seeds):
                row = {"seed": seed}
                for i, (name, sets) in enumerate(variants(every, refine).items()):  # side by side: the same load
                    row[name] = one_run(scheme, seed, sets, Path(tmp) / f"{scheme}-{seed}-{i}")
                    print(f"{scheme} seed {seed} {name}: {row[name]}", file=sys.stderr)
                runs.setdefault(scheme, []).append(row)
    return {"config": CONFIG, "every": every, "refine": refine, "runs": runs,
            "summary": {scheme: summarize(rows, every, refine) for scheme, rows in runs.items()}}


def summarize(rows: list[dict[str, Any]], every: int, refine: int) -> dict[str, Any]:
    """Per estimator, over the seeds every estimator reached: median, standard deviation, the paired difference
    from the coarse estimate; and over every seed the evaluations and wall time (against the coarse run's)."""
    names = list(variants(every, refine))
    reached = [r for r in rows if all(r[v]["time_to_target_s"] is not None for v in names)]

    def rounded(value: float) -> float:
        return round(value, 4)

    out: dict[str, Any] = {"seeds": len(rows), "reached_by_all": len(reached)}
    for name in names:
        times = [r[name]["time_to_target_s"] for r in reached]
        shift = [r[name]["time_to_target_s"] - r["coarse"]["time_to_target_s"] for r in reached]
        out[name] = {
            "median_s": rounded(statistics.median(times)) if times else None,
            "stdev_s": rounded(statistics.stdev(times)) if len(times) > 1 else None,
            "median_shift_s": rounded(statistics.median(shift)) if shift else None,
            "largest_shift_s": rounded(max(shift, key=abs)) if shift else None,
            "evaluations": statistics.median(r[name]["regular"] + r[name]["refined"] for r in rows),
            "refined_evaluations": statistics.median(r[name]["refined"] for r in rows),
            "wall_vs_coarse": rounded(statistics.median(r[name]["wall_s"] / r["coarse"]["wall_s"] for r in rows)),
        }
    return out


def markdown(record: dict[str, Any]) -> str:
    every, refine = record["every"], record["refine"]
    prov = record  # the provenance keys sit at the top level, as in every other results file
    lines = [f"# Times to target refined (run.eval_refine = {refine}) against evaluating {refine} times as often", "",
             f"`{prov['command']}`", "",
             f"{record['config']}; per seed four runs side by side that train alike and differ in when they look: "
             f"an evaluation every {every} iterations (coarse), the same with run.eval_refine = {refine} (refined), "
             f"one every {every // refine} with a patience of 3 (fine), and one every {every // refine} with a "
             f"patience of {3 * refine}, the coarse streak's window (fine, same window). Time to target in virtual "
             "seconds over the seeds every estimator reached; shift: against the coarse estimate of the same seed. "
             f"Code {prov['git_commit'][:10]}; {prov['cpu']}.", "",
             "| scheme | estimator | seeds | median (s) | stdev over seeds (s) | median shift (s) | largest shift (s) "
             "| evaluations per run | of them refined | wall time vs coarse |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for scheme, s in record["summary"].items():
        for name in variants(every, refine):
            v = s[name]
            lines.append(f"| {scheme} | {name} | {s['reached_by_all']}/{s['seeds']} | {v['median_s']} | {v['stdev_s']} "
                         f"| {v['median_shift_s']} | {v['largest_shift_s']} | {v['evaluations']} | "
                         f"{v['refined_evaluations']} | {v['wall_vs_coarse']:.2f}x |")
    lines += ["", "Per seed, time to target (s): " + " / ".join(variants(every, refine)), ""]
    for scheme, rows in record["runs"].items():
        cells = ["{}: {}".format(r["seed"], " / ".join(f"{r[n]['time_to_target_s']:.3f}"
                                                       if r[n]["time_to_target_s"] is not None else "never"
                                                       for n in variants(every, refine))) for r in rows]
        lines.append(f"- {scheme}: " + "; ".join(cells))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--schemes", default="bsp,localsgd")
    parser.add_argument("--every", type=int, default=80)
    parser.add_argument("--refine", type=int, default=8)
    args = parser.parse_args(argv)
    if args.every % args.refine:
        parser.error("--every must be a multiple of --refine (the fine run evaluates every every/refine)")
    record = {**provenance(), **measure(args.schemes.split(","), args.seeds, args.every, args.refine)}
    write_results("eval_refine", record, markdown(record))


if __name__ == "__main__":
    main(sys.argv[1:])
