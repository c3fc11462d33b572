"""Times to target with run.eval_refine against evaluating that often, and what each costs.

For every seed, three runs of one scheme side by side: evaluating every K iterations (coarse), every K with
run.eval_refine = N (refined), and every K / N (fine, the reference: the same models, judged on a schedule N
times finer). The training is the same in all three (tests/test_eval_refine.py), so they differ only in when
they look. Reported: each time to target against the fine run's, the evaluations each made, and the wall time.

Usage:
    .venv/bin/python benchmarks/eval_refine.py [--seeds 10] [--schemes bsp,asp] [--every 80] [--refine 8]

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


def measure(schemes: list[str], seeds: int, every: int, refine: int) -> dict[str, Any]:
    variants = {"coarse": [f"run.eval_every_iterations={every}"],
                "refined": [f"run.eval_every_iterations={every}", f"run.eval_refine={refine}"],
                "fine": [f"run.eval_every_iterations={every // refine}"]}
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in schemes:
            for seed in range(seeds):
                row = {"seed": seed}
                for name, sets in variants.items():  # side by side: the same load for the three
                    row[name] = one_run(scheme, seed, sets, Path(tmp) / f"{scheme}-{seed}-{name}")
                    print(f"{scheme} seed {seed} {name}: {row[name]}", file=sys.stderr)
                runs.setdefault(scheme, []).append(row)
    return {"config": CONFIG, "every": every, "refine": refine, "runs": runs,
            "summary": {scheme: summarize(rows, every, refine) for scheme, rows in runs.items()}}


def summarize(rows: list[dict[str, Any]], every: int, refine: int) -> dict[str, Any]:
    """Errors against the fine run (virtual seconds and the share of its time), and the costs, as medians."""
    reached = [r for r in rows if all(r[v]["time_to_target_s"] is not None for v in ("coarse", "refined", "fine"))]

    def error(variant: str) -> list[float]:
        return [r[variant]["time_to_target_s"] - r["fine"]["time_to_target_s"] for r in reached]

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 4) if values else None

    out: dict[str, Any] = {"seeds": len(rows), "reached_by_all": len(reached)}
    for variant in ("coarse", "refined"):
        errors = error(variant)
        out[variant] = {
            "median_error_s": median(errors), "median_abs_error_s": median([abs(e) for e in errors]),
            "max_abs_error_s": round(max(abs(e) for e in errors), 4) if errors else None,
            "median_abs_error_share": median([abs(e) / r["fine"]["time_to_target_s"] for e, r in zip(errors, reached)]),
            "equal_to_fine": sum(e == 0 for e in errors),
        }
    for variant in ("coarse", "refined", "fine"):
        out.setdefault(variant, {}).update(
            evaluations=median([r[variant]["regular"] + r[variant]["refined"] for r in rows]),
            refined_evaluations=median([r[variant]["refined"] for r in rows]),
            wall_vs_coarse=median([r[variant]["wall_s"] / r["coarse"]["wall_s"] for r in rows]))
    return out


def markdown(record: dict[str, Any]) -> str:
    every, refine = record["every"], record["refine"]
    lines = [f"# Times to target refined (run.eval_refine = {refine}) against evaluating {refine} times as often", "",
             f"`{record['provenance']['command']}`", "",
             f"{record['config']}; per seed three runs side by side: an evaluation every {every} iterations "
             f"(coarse), the same with run.eval_refine = {refine} (refined), and one every {every // refine} "
             "(fine: the reference, the same models judged on a finer schedule). Errors are against the fine run's "
             f"time to target, medians over seeds. Code {record['provenance']['git_commit'][:10]}; "
             f"{record['provenance']['cpu']}.", "",
             "| scheme | seeds reached | time to target | median error (s) | median abs error (share) | max abs "
             "error (s) | equal to fine | evaluations per run | of them refined | wall time vs coarse |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for scheme, s in record["summary"].items():
        for variant in ("coarse", "refined", "fine"):
            v = s[variant]
            err = (f"{v['median_error_s']} | {v['median_abs_error_share']:.1%} | {v['max_abs_error_s']} | "
                   f"{v['equal_to_fine']}/{s['reached_by_all']}") if variant != "fine" else "- | - | - | -"
            lines.append(f"| {scheme} | {s['reached_by_all']}/{s['seeds']} | {variant} | {err} | "
                         f"{v['evaluations']} | {v['refined_evaluations']} | {v['wall_vs_coarse']:.2f}x |")
    lines += ["", "Per seed (time to target in virtual seconds: coarse / refined / fine):", ""]
    for scheme, rows in record["runs"].items():
        cells = [f"{r['seed']}: {r['coarse']['time_to_target_s']} / {r['refined']['time_to_target_s']} / "
                 f"{r['fine']['time_to_target_s']}" for r in rows]
        lines.append(f"- {scheme}: " + "; ".join(cells))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--schemes", default="bsp,asp")
    parser.add_argument("--every", type=int, default=80)
    parser.add_argument("--refine", type=int, default=8)
    args = parser.parse_args(argv)
    if args.every % args.refine:
        parser.error("--every must be a multiple of --refine (the fine run evaluates every every/refine)")
    record = {"provenance": provenance(), **measure(args.schemes.split(","), args.seeds, args.every, args.refine)}
    write_results("eval_refine", record, markdown(record))


if __name__ == "__main__":
    main(sys.argv[1:])
