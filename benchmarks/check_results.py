"""Check that every study results file keeps the evaluation protocol's promises (docs/fair-comparison.md).

A study results file (``benchmarks/results/{evidence,balance,lowcomm}-*.json``,
written by evidence.py, balance.py and lowcomm.py) makes claims. Before a
reviewer trusts one, this checks what the closing notes used to check by hand:

- it was written by committed code: its commit is in this repository's
  history and the tree was clean (``git_commit``, ``dirty_tree``);
- the defaults were frozen before it: the recorded defaults commit is clean
  and is the results commit or one of its ancestors;
- tuning and evaluation seeds are disjoint, with >= 10 evaluation seeds;
- every row has a result for each evaluation seed, a bootstrap interval of
  its median time to target, and every row but the best its p-value;
- its markdown table sits beside it.

Usage:
    .venv/bin/python benchmarks/check_results.py [FILE ...]   # default: every study file
    .venv/bin/python benchmarks/check_results.py --reproduces OLD.json NEW.json

Prints one line per problem and exits 1 if there is any (0: every file keeps its promises).
``--reproduces`` compares two versions of one study (an older one from git:
``git show REV:benchmarks/results/NAME.json > OLD.json``): every run both
made, tuning and evaluation, must reach the target at the same virtual time
and end within 1e-6 of the same metric (the simulator is deterministic, so a
run whose config and code path did not change gives the same numbers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tuned import RESULTS, ROOT

STUDY_PREFIXES = ("evidence-", "balance-", "lowcomm-")
MIN_EVAL_SEEDS = 10


def study_files() -> list[Path]:
    """Every study results file."""
    return sorted(p for p in RESULTS.glob("*.json") if p.name.startswith(STUDY_PREFIXES))


def git_ok(*args: str) -> bool:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode == 0


def problems(path: Path) -> list[str]:
    """What ``path`` fails to keep, one line each (empty: nothing)."""
    record = json.loads(path.read_text())
    compare: dict[str, Any] = record.get("compare", {})
    out = [*_provenance_problems(record, compare.get("provenance", {})), *_seed_problems(compare),
           *_row_problems(compare)]
    if not path.with_suffix(".md").exists():
        out.append(f"no {path.with_suffix('.md').name} beside it")
    return [f"{path.name}: {p}" for p in out]


def _provenance_problems(record: dict[str, Any], prov: dict[str, Any]) -> list[str]:
    out = []
    commit, defaults = record.get("git_commit"), prov.get("defaults_commit")
    if not commit or not git_ok("cat-file", "-e", f"{commit}^{{commit}}"):
        out.append(f"its commit {commit!r} is not in this repository's history")
    if record.get("dirty_tree") is not False or prov.get("dirty") is not False:
        out.append("written from a tree with uncommitted changes")
    if not defaults:
        out.append("records no commit at which the defaults were frozen")
    elif prov.get("defaults_dirty") is not False:
        out.append("its defaults were read from a tree with uncommitted changes")
    elif commit and not git_ok("merge-base", "--is-ancestor", defaults, commit):
        out.append(f"its defaults commit {defaults[:10]} is not the results commit or an ancestor of it")
    return out


def _seed_problems(compare: dict[str, Any]) -> list[str]:
    tuning, evaluation = set(compare.get("tuning_seeds", [])), set(compare.get("eval_seeds", []))
    out = []
    if tuning & evaluation:
        out.append(f"tuning and evaluation seeds overlap: {sorted(tuning & evaluation)}")
    if len(evaluation) < MIN_EVAL_SEEDS:
        out.append(f"{len(evaluation)} evaluation seeds, fewer than {MIN_EVAL_SEEDS}")
    return out


def _row_problems(compare: dict[str, Any]) -> list[str]:
    rows, evaluation = compare.get("rows", []), sorted(compare.get("eval_seeds", []))
    if not rows:
        return ["no rows"]
    out = []
    with_p = [r for r in rows if r.get("p_value") is not None]
    for row in rows:
        name = row.get("scheme")
        seeds = sorted(s.get("seed") for s in row.get("seeds", []))
        if seeds != evaluation:
            out.append(f"row {name}: seeds {seeds}, not the evaluation seeds {evaluation}")
        if not (row.get("time_to_target_interval") or {}).get("ci95") and row.get("reached"):
            out.append(f"row {name}: no bootstrap interval of its median time to target")
    if len(with_p) < len(rows) - 1:
        out.append(f"{len(rows) - len(with_p)} rows without a p-value (only the best row may lack one)")
    return out


def run_results(record: dict[str, Any]) -> dict[str, tuple[float | None, float | None]]:
    """Every run of a study results file, tuning and evaluation: run folder -> (time to target, final metric)."""
    out = {}
    for row in record.get("compare", {}).get("rows", []):
        for point in row.get("tuning") or []:
            finals = point.get("final_score", point.get("final_accuracy", []))
            for run_dir, t, final in zip(point["run_dirs"], point["time_to_target_s"], finals):
                out[run_dir] = (t, None if final is None else abs(final))
        for seed in row.get("seeds", []):
            final = seed.get("final_metric", seed.get("final_accuracy"))
            out[seed["run_dir"]] = (seed.get("time_to_target_s"), None if final is None else abs(final))
    return out


def reproduction(old: Path, new: Path) -> tuple[int, list[str]]:
    """How many runs both files made, and one line per run whose numbers differ."""
    before, after = (run_results(json.loads(p.read_text())) for p in (old, new))
    common = sorted(set(before) & set(after))
    differ = []
    for run_dir in common:
        (t0, m0), (t1, m1) = before[run_dir], after[run_dir]
        same_metric = m0 == m1 or (m0 is not None and m1 is not None and abs(m0 - m1) <= 1e-6 * max(abs(m0), 1e-12))
        if t0 != t1 or not same_metric:
            differ.append(f"{run_dir}: time to target {t0} -> {t1}, final metric {m0} -> {m1}")
    return len(common), differ


def defaults_line(old: Path, new: Path) -> str:
    """Whether both files ran with the same defaults, by their digests (docs/fair-comparison.md, rule 5)."""
    digests = [json.loads(p.read_text()).get("compare", {}).get("provenance", {}).get("defaults_digest")
               for p in (old, new)]
    if None in digests:
        return "defaults: a file records no digest"
    if digests[0] == digests[1]:
        return f"defaults: the same (digest {digests[0]})"
    return f"defaults changed: digest {digests[0]} -> {digests[1]}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--reproduces"]:
        if len(argv) != 3:
            print("usage: check_results.py --reproduces OLD.json NEW.json")
            return 2
        common, differ = reproduction(Path(argv[1]), Path(argv[2]))
        for line in differ:
            print(line)
        print(defaults_line(Path(argv[1]), Path(argv[2])))
        print(f"{common - len(differ)} of the {common} runs both files made give the same numbers")
        return 1 if differ else 0
    paths = [Path(a) for a in argv] or study_files()
    found = [line for path in paths for line in problems(path)]
    for line in found:
        print(line)
    if not found:
        print(f"{len(paths)} study results files keep the protocol's promises")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
