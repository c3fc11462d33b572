"""Rerun finished runs from their own config.toml and compare them with the originals, evaluation for evaluation.

A study resumed over sessions reuses a run whose config is the same by value, whatever commit made it, and its
runs may come from several machines (compare.json's ``commits`` and ``machines``). A sim run is deterministic
for its config, code and kind of CPU, so rerunning one at the current commit answers two questions at once:

- the same evaluations, bit for bit: the code changes since the run's commit did not change what it computes,
  and this CPU computes as the one that made it;
- any difference: one of the two changed (the report gives both commits and both CPUs, where recorded), and
  the first evaluation that differs.

Where they differ, the report says by how much: whether the schedule (each evaluation's time, iterations and
bytes) is the same, the largest relative difference of the metric over the evaluations, and both times to target.

Usage: .venv/bin/python benchmarks/replay.py RUN_DIR [RUN_DIR ...] [--name NAME]
Results: benchmarks/results/replay-NAME.{json,md} (NAME defaults to "runs"); reruns in /tmp/shoal-replay/, where
a finished rerun made by the same source (src/ unchanged since its commit) is read instead of run again.
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
    if _made_by_this_source(again):
        return compare_runs(run, again)
    command = [sys.executable, "-m", "shoal", "train", "--config", str(run / "config.toml"), "--out", str(again),
               "--overwrite"]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return compare_runs(run, again)


def _made_by_this_source(run: Path) -> bool:
    """Whether ``run`` finished, at a clean commit whose src/ is this checkout's (the same computation)."""
    try:
        code = json.loads((run / "summary.json").read_text()).get("code") or {}
    except (OSError, ValueError):
        return False
    if not code.get("commit") or code.get("dirty"):
        return False
    same = subprocess.run(["git", "diff", "--quiet", code["commit"], "--", "src"], cwd=ROOT, capture_output=True)
    return same.returncode == 0


def compare_runs(original: Path, again: Path) -> dict[str, Any]:
    """Whether two runs evaluated alike (every evaluation's time, iterations, bytes and values) and ended alike."""
    first, second = (json.loads((p / "summary.json").read_text()) for p in (original, again))
    evals = [_evaluations(p) for p in (original, again)]
    differs = next((k for k, (a, b) in enumerate(zip(*evals)) if a != b), None)
    if differs is None and len(evals[0]) != len(evals[1]):
        differs = min(len(evals[0]), len(evals[1]))
    paired = list(zip(*evals))
    return {"run": original.relative_to(ROOT).as_posix(), "evaluations": [len(e) for e in evals],
            "identical": differs is None and all(first.get(k) == second.get(k) for k in SUMMARY_KEYS),
            "first_difference": differs,
            "same_schedule": len(evals[0]) == len(evals[1]) and all(a[:3] == b[:3] for a, b in paired),
            "largest_relative_difference": max((_relative(a[-1], b[-1]) for a, b in paired), default=None),
            "original": {"code": first.get("code"), "machine": first.get("machine"),
                         **{k: first.get(k) for k in SUMMARY_KEYS}},
            "replay": {"code": second.get("code"), "machine": second.get("machine"),
                       **{k: second.get(k) for k in SUMMARY_KEYS}}}


def _relative(a: float | None, b: float | None) -> float:
    """|a - b| / |a|: how far apart two evaluations of the metric are (0 where both are missing or zero)."""
    if a is None or b is None:
        return 0.0 if a == b else float("inf")
    return abs(a - b) / abs(a) if a else abs(b)


def _evaluations(run: Path) -> list[tuple[Any, ...]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    events = (json.loads(line) for line in lines if '"eval"' in line)
    return [(*(e.get(k) for k in EVAL_KEYS), e.get("value", e.get("accuracy"))) for e in events
            if e["event"] == "eval"]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["# Finished runs rerun from their config.toml", "",
             "Each run rerun at the commit below, on this machine, and compared evaluation for evaluation (time, "
             "iterations, bytes, accuracy, loss, metric) and by its summary's time to target, final values, "
             "iterations and bytes.", "",
             "| run | made at | on | rerun at | on | evaluations | the same, bit for bit? | same schedule | "
             "largest relative difference of the metric | time to target (made / rerun) |",
             "|---|---|---|---|---|---:|---|---|---:|---|"]
    for r in rows:
        o, a = r["original"], r["replay"]
        verdict = "yes" if r["identical"] else f"no: from evaluation {r['first_difference']}"
        largest = r["largest_relative_difference"]
        lines.append(f"| {r['run']} | {_commit(o)} | {_cpu(o)} | {_commit(a)} | {_cpu(a)} | "
                     f"{r['evaluations'][0]} | {verdict} | {'yes' if r['same_schedule'] else 'no'} | "
                     f"{'-' if largest is None else f'{largest:.2g}'} | "
                     f"{_seconds(o['time_to_target_s'])} / {_seconds(a['time_to_target_s'])} |")
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _commit(side: dict[str, Any]) -> str:
    code = side.get("code") or {}
    return "unrecorded" if not code.get("commit") else code["commit"][:10] + (" (dirty)" if code.get("dirty") else "")


def _cpu(side: dict[str, Any]) -> str:
    return (side.get("machine") or {}).get("cpu") or "unrecorded"


if __name__ == "__main__":
    main(sys.argv[1:])
