"""How long GSSP profiles before its first split: spurious splits on a uniform cluster against speed on tiers.

A worker caught in a transient slow spell while it is profiled looks like a
slow worker, so a uniform cluster splits; profiling longer than a spell
avoids that, but until the split everyone runs as one SSP group, gated by
the slowest worker. This runs both sides of that trade-off with
``sync.gssp.profile_iterations`` = 3 (the default) and 6:

- uniform: the uniform benchmark's cluster (16 equal workers, 4x spells of 5
  iterations, p = 0.05), its tuned lr 0.02, 10 seeds, 6 virtual seconds:
  how many seeds never split;
- tiers: the GSSP benchmark's tiered cluster (1/2/4/8x plus the same
  spells), its tuned lr 0.05, 5 seeds, runs stop at 94% within 60 s: time
  to target.

Usage: .venv/bin/python benchmarks/gssp_profile_length.py [--jobs 2]
Writes benchmarks/results/gssp_profile_length.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import gssp_speedup
import gssp_uniform
from tuned import RESULTS, run_all, provenance

LENGTHS = [3, 6]
UNIFORM_SEEDS, TIER_SEEDS = list(range(10)), list(range(5))


def uniform_config(length: int, seed: int) -> list[str]:
    base = [o for o in gssp_uniform.BASE if not o.startswith("run.max_time_s")]
    return base + gssp_uniform.SCHEMES["gssp"] + ["run.max_time_s=6", "optimizer.lr=0.02", f"run.seed={seed}",
                                                   f"sync.gssp.profile_iterations={length}"]


def tier_config(length: int, seed: int) -> list[str]:
    return gssp_speedup.BASE + gssp_speedup.SCHEMES["gssp"] + [
        "run.max_time_s=60", "run.stop_at_target=true", "optimizer.lr=0.05", f"run.seed={seed}",
        f"sync.gssp.profile_iterations={length}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    start, origin = time.perf_counter(), provenance()
    cases = [("uniform", n, s, uniform_config(n, s)) for n in LENGTHS for s in UNIFORM_SEEDS]
    cases += [("tiers", n, s, tier_config(n, s)) for n in LENGTHS for s in TIER_SEEDS]
    results = run_all("gssp_profile_length", [c[3] for c in cases], args.jobs)
    runs = [{"cluster": c, "profile_iterations": n, "seed": s, "time_to_target_s": r["time_to_target_s"],
             "servers": len(r["groups"]), "groups": r["groups"]} for (c, n, s, _), r in zip(cases, results)]
    lines = ["# GSSP's profiling length: spurious splits (uniform) against time to 94% (tiers)", "",
             f"Commit `{origin['git_commit'][:10]}`; command: `{origin['command']}`. Uniform: 10 seeds, lr 0.02, "
             "6 virtual s (a split shows as more than one group server). Tiers: 5 seeds, lr 0.05, runs stop at 94% "
             "within 60 s (n/r: not reached).", "",
             "| profile_iterations | uniform: seeds that never split | tiers: time to 94% per seed (s) | tiers: median |",
             "|---:|---:|---|---:|"]
    checks: dict[str, Any] = {}
    for n in LENGTHS:
        uni = [r for r in runs if r["cluster"] == "uniform" and r["profile_iterations"] == n]
        tiers = [r["time_to_target_s"] for r in runs if r["cluster"] == "tiers" and r["profile_iterations"] == n]
        never = sum(r["servers"] == 1 for r in uni)
        median = statistics.median(t if t is not None else float("inf") for t in tiers)
        cells = ", ".join("n/r" if t is None else f"{t:.0f}" for t in tiers)
        lines.append(f"| {n} | {never}/{len(uni)} | {cells} | {'n/r' if median == float('inf') else f'{median:.0f}'} |")
        checks[f"profile_{n}"] = {"uniform_never_split": f"{never}/{len(uni)}",
                                  "tiers_median_s": None if median == float("inf") else median}
    text = "\n".join(lines) + "\n"
    meta = {**origin, "lengths": LENGTHS, "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gssp_profile_length.json").write_text(json.dumps({**meta, "checks": checks, "runs": runs}, indent=1)
                                                      + "\n")
    (RESULTS / "gssp_profile_length.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
