"""Past a tuning grid's edge: would a wider grid have kept another value? (issue 38, rule 2 of fair comparison)

A study warns when a scheme kept the smallest or largest value of its grid: its best may lie beyond it. This
answers the warning on the development seeds only. For each such edge it runs the grid's next value out
(``shoal.report.tuning.beyond_edge``: 32 of [2, 8, 32] -> 128, 1.0 of [0.4, 0.7, 1.0] -> 1.3) on the same
tuning seeds, from the kept runs' own config.toml with that one key changed, and sets its median time to
target beside the kept value's.

- The next value out is no faster: the kept value stands, and the warning is answered.
- It is faster: the row's tuned value would move. That is not a result about the evaluation seeds. Claiming it
  takes the whole protocol again, every scheme's grid widened by as many points.

No evaluation seed runs here.

Usage: .venv/bin/python benchmarks/grid_edges.py STUDY [--schemes a,b] [--jobs 1]
       .venv/bin/python benchmarks/grid_edges.py --list    # how far each study folder's check is
  STUDY: a finished study's folder in runs/evidence (its compare.json), e.g. lowcomm-lm-1g. A run that has
  finished is read, not run again (``--resume`` is accepted for benchmarks/studies.sh, and changes nothing).
Runs: runs/evidence/STUDY/SCHEME/edge/KEY=VALUE/seed-K (a run with a summary.json is read, not rerun).
Results: benchmarks/results/grid_edges-STUDY.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tuned import ROOT, provenance, write_results

from shoal.report.tuning import edge_margins, median_time, point_label

RUNS = ROOT / "runs" / "evidence"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", nargs="?", help="a finished study's folder in runs/evidence, e.g. lowcomm-lm-1g")
    parser.add_argument("--schemes", default="", help="only these rows (comma-separated; default: every edge)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--resume", action="store_true", help="(always: a finished run is read)")
    parser.add_argument("--list", action="store_true", help="how far each study folder's check is")
    args = parser.parse_args(argv)
    if args.list or not args.study:
        list_progress()
        return
    folder = RUNS / args.study
    if not (folder / "compare.json").is_file():
        sys.exit(f"grid_edges: {folder}/compare.json not found: the study has not finished (or is misnamed)")
    compare = json.loads((folder / "compare.json").read_text())
    wanted = {s for s in args.schemes.split(",") if s}
    edges = [e for e in study_edges(compare) if not wanted or e["scheme"] in wanted]
    runs = [(folder, edge, run_dir) for edge in edges for run_dir in edge["kept_runs"]]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(lambda job: run_beyond(*job), runs))
    rows = [judge(folder, edge) for edge in edges]
    write_results(f"grid_edges-{args.study}", {**provenance(), "study": args.study,
                                               "study_commit": study_commit(compare),
                                               "tuning_seeds": compare["tuning_seeds"], "rows": rows},
                  markdown(args.study, compare, rows))


def list_progress() -> None:
    """One line per study folder: how many of its edge runs have finished (benchmarks/studies.sh --status)."""
    for folder in sorted(p for p in RUNS.iterdir() if p.is_dir()) if RUNS.is_dir() else []:
        if not (folder / "compare.json").is_file():
            print(f"{folder.name}: past the grid's edges once the study has finished (no compare.json yet)")
            continue
        edges = study_edges(json.loads((folder / "compare.json").read_text()))
        runs = [beyond_dir(folder, e, run) for e in edges for run in e["kept_runs"]]
        done = sum((run / "summary.json").is_file() for run in runs)
        print(f"{folder.name}: past the grid's edges: {done} of {len(runs)} runs done in runs/evidence/{folder.name}")


def study_edges(compare: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (row, key) that kept an end of its grid, with the next value out and the kept point's tuning runs."""
    edges = []
    for row in compare["rows"]:
        for margin in edge_margins(row, compare["grids"]):
            if margin["beyond"] is None:
                continue
            kept = next(t for t in row["tuning"] if t["point"] == row["tuned"])
            edges.append({"scheme": row["scheme"], **margin, "kept_runs": kept["run_dirs"],
                          "kept_times": kept["time_to_target_s"]})
    return edges


def beyond_dir(folder: Path, edge: dict[str, Any], kept_run: str) -> Path:
    return folder / edge["scheme"] / "edge" / point_label({edge["key"]: edge["beyond"]}) / Path(kept_run).name


def run_beyond(folder: Path, edge: dict[str, Any], kept_run: str) -> None:
    """The kept run's config with the edge's key set to the next value out, unless that run has finished."""
    out = beyond_dir(folder, edge, kept_run)
    if (out / "summary.json").is_file():
        return
    command = [sys.executable, "-m", "shoal", "train", "--config", str(folder / kept_run / "config.toml"),
               "--set", f"{edge['key']}={edge['beyond']}", "--out", str(out)]
    print(" ".join(command), flush=True)
    log = out.with_name(out.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        subprocess.run(command, check=True, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    log.unlink()


def judge(folder: Path, edge: dict[str, Any]) -> dict[str, Any]:
    """The kept value against the next value out, on the same development seeds."""
    times = [json.loads((beyond_dir(folder, edge, run) / "summary.json").read_text()).get("time_to_target_s")
             for run in edge["kept_runs"]]
    kept_s, beyond_s = median_time(edge["kept_times"]), median_time(times)
    moves = beyond_s is not None and (kept_s is None or beyond_s < kept_s)
    return {"scheme": edge["scheme"], "key": edge["key"], "kept": edge["kept"], "kept_s": kept_s,
            "kept_times": edge["kept_times"], "next_in": edge["next"], "next_in_s": edge["next_s"],
            "beyond": edge["beyond"], "beyond_s": beyond_s, "beyond_times": times, "kept_would_move": moves}


def study_commit(compare: dict[str, Any]) -> str:
    return compare["provenance"].get("commit") or "?"


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


def markdown(study: str, compare: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [f"# Past the tuning grid's edge: {study}", "",
             f"Each row kept an end of its grid in the study (commit {study_commit(compare)[:10]}). The grid's "
             f"next value out ran on the same development seeds {compare['tuning_seeds']}, from the kept runs' "
             "config.toml with that key changed. Medians of time to target (s) over those seeds; "
             "no evaluation seed ran.", "",
             "| scheme | key | next in | kept | next out | per-seed (next out) | kept value stands? |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        seeds = ", ".join(_seconds(t) for t in r["beyond_times"])
        verdict = "no: the next value out is faster" if r["kept_would_move"] else "yes"
        lines.append(f"| {r['scheme']} | {r['key']} | {r['next_in']}: {_seconds(r['next_in_s'])} | "
                     f"{r['kept']}: {_seconds(r['kept_s'])} | {r['beyond']}: {_seconds(r['beyond_s'])} | {seeds} | "
                     f"{verdict} |")
    moved = [r["scheme"] for r in rows if r["kept_would_move"]]
    lines += ["", ("Every kept value stands: one step past the edge is no faster on the development seeds."
                   if not moved else
                   f"Would move: {', '.join(moved)}. On the development seeds only: the evaluation-seed numbers "
                   "of the study stand as measured under its grids, and a claim for the wider grid takes the whole "
                   "protocol again, every scheme's grid widened by as many points."), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
