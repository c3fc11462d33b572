"""Rerun finished runs from their own config.toml and compare them with the originals, evaluation for evaluation.

A study resumed over sessions reuses a run whose config is the same by value, whatever commit made it, and its
runs may come from several machines (compare.json's ``commits`` and ``machines``). A sim run is deterministic
for its config, code and kind of CPU, so rerunning one at the current commit answers two questions at once:

- the same evaluations, bit for bit: the code changes since the run's commit did not change what it computes,
  and this CPU computes as the one that made it;
- any difference: one of the two changed (the report gives both commits and both CPUs, where recorded), and
  the first evaluation that differs.

Usage: .venv/bin/python benchmarks/replay.py RUN_DIR [RUN_DIR ...] [--name NAME]
Results: benchmarks/results/replay-NAME.{json,md} (NAME defaults to "runs"); reruns in /tmp/shoal-replay/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tuned import ROOT, provenance, write_results

SCRATCH = Path("/tmp/shoal-replay")
#: what an evaluation event says of the run; equal in every one of them means the same training
EVAL_KEYS = ("t", "iterations", "bytes", "accuracy", "loss", "value")
SUMMARY_KEYS = ("time_to_target_s", "final_accuracy", "final_metric", "iterations", "bytes_up", "bytes_down")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders (config.toml, summary.json)")
    parser.add_argument("--name", default="runs", help="the results file's name: replay-NAME")
    args = parser.parse_args(argv)
    rows = [replay(run.absolute()) for run in args.runs]
    write_results(f"replay-{args.name}", {**provenance(), "rows": rows}, markdown(rows))


def replay(run: Path) -> dict[str, Any]:
    """Rerun ``run`` from its config.toml into the scratch folder, and compare the two."""
    if not (run / "summary.json").is_file():
        sys.exit(f"replay: {run} holds no finished run (summary.json)")
    again = SCRATCH / run.relative_to(ROOT).as_posix().replace("/", "__")
    command = [sys.executable, "-m", "shoal", "train", "--config", str(run / "config.toml"), "--out", str(again),
               "--overwrite"]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return compare_runs(run, again)


def compare_runs(original: Path, again: Path) -> dict[str, Any]:
    """Whether two runs evaluated alike (every evaluation's time, iterations, bytes and values) and ended alike."""
    first, second = (json.loads((p / "summary.json").read_text()) for p in (original, again))
    evals = [_evaluations(p) for p in (original, again)]
    differs = next((k for k, (a, b) in enumerate(zip(*evals)) if a != b), None)
    if differs is None and len(evals[0]) != len(evals[1]):
        differs = min(len(evals[0]), len(evals[1]))
    return {"run": original.relative_to(ROOT).as_posix(), "evaluations": [len(e) for e in evals],
            "identical": differs is None and all(first.get(k) == second.get(k) for k in SUMMARY_KEYS),
            "first_difference": differs,
            "original": {"code": first.get("code"), "machine": first.get("machine"),
                         **{k: first.get(k) for k in SUMMARY_KEYS}},
            "replay": {"code": second.get("code"), "machine": second.get("machine"),
                       **{k: second.get(k) for k in SUMMARY_KEYS}}}


def _evaluations(run: Path) -> list[tuple[Any, ...]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    events = (json.loads(line) for line in lines if '"eval"' in line)
    return [tuple(e.get(k) for k in EVAL_KEYS) for e in events if e["event"] == "eval"]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["# Finished runs rerun from their config.toml", "",
             "Each run rerun at the commit below, on this machine, and compared evaluation for evaluation (time, "
             "iterations, bytes, accuracy, loss, metric) and by its summary's time to target, final values, "
             "iterations and bytes.", "",
             "| run | made at | on | rerun at | on | evaluations | the same, bit for bit? |",
             "|---|---|---|---|---|---:|---|"]
    for r in rows:
        o, a = r["original"], r["replay"]
        verdict = "yes" if r["identical"] else f"no: from evaluation {r['first_difference']}"
        lines.append(f"| {r['run']} | {_commit(o)} | {_cpu(o)} | {_commit(a)} | {_cpu(a)} | "
                     f"{r['evaluations'][0]} | {verdict} |")
    return "\n".join(lines) + "\n"


def _commit(side: dict[str, Any]) -> str:
    code = side.get("code") or {}
    return "unrecorded" if not code.get("commit") else code["commit"][:10] + (" (dirty)" if code.get("dirty") else "")


def _cpu(side: dict[str, Any]) -> str:
    return (side.get("machine") or {}).get("cpu") or "unrecorded"


if __name__ == "__main__":
    main(sys.argv[1:])
