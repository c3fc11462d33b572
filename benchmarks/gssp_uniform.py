"""GSSP on a uniform cluster with transient stragglers: it should keep one group and match SSP.

LeNet-5 on mnist5k, 16 equal workers with transient stragglers (a 4x slow
spell of 5 iterations starts with probability 0.05 per iteration). Nothing
here is heterogeneous for long, so the right grouping is one group, and GSSP
should then run as SSP does. The protocol is benchmarks/tuned.py: each
scheme's lr is tuned over the same grid on the tuning seeds, then the chosen
lr runs the whole budget on every seed (10 by default). ``gssp-paper`` (no
split floor, no cooldown, waits for transient stragglers: the goodness-of-fit
rule alone) shows what the floor prevents. Verdicts: in how many seeds gssp
never split and in how many it ends with one active group, and its median
time to target against SSP's.

Usage: .venv/bin/python benchmarks/gssp_uniform.py [--jobs 2] [--seeds 10]
Writes benchmarks/results/gssp_uniform.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tuned import RESULTS, provenance, rows_of, run_protocol, simple_markdown

TARGET = 0.94
LRS = [0.01, 0.02, 0.05, 0.1]
BASE = [
    "model.name=lenet5", "data.name=mnist5k", "data.batch_size=32", "optimizer.momentum=0.9",
    "cluster.workers=16", "cluster.profile=uniform", "cluster.compute_s=0.05", "cluster.link_gbps=10",
    "cluster.server_gbps=10", "cluster.stragglers.probability=0.05", "cluster.stragglers.slowdown=4",
    "cluster.stragglers.duration=5", f"run.target_accuracy={TARGET}", "run.target_patience=3",
    "run.stop_at_target=false", "run.eval_every_s=2", "run.max_time_s=60", "sync.ssp.staleness=3", "sync.gssp.staleness=3",
    "backend.log_iterations=false",
]
SCHEMES: dict[str, list[str]] = {
    "ssp": ["sync.scheme=ssp"],
    "gssp": ["sync.scheme=gssp", "sync.gssp.group_momentum=busiest", "sync.gssp.paced=true", "sync.gssp.split_ratio=1.5",
             "sync.gssp.regroup_cooldown_s=5", "sync.gssp.transient_factor=2"],
    "gssp-paper": ["sync.scheme=gssp", "sync.gssp.group_momentum=server", "sync.gssp.split_ratio=1", "sync.gssp.regroup_cooldown_s=0",
               "sync.gssp.transient_factor=0", "sync.gssp.paced=false"],
}


def verdicts(protocol: dict[str, Any]) -> dict[str, Any]:
    from shoal.report.tuning import median_time, speedup_interval

    def mine(scheme: str) -> list[dict[str, Any]]:
        return [r for r in protocol["runs"] if r["scheme"] == scheme and r["value"] == protocol["chosen"][scheme]]

    out: dict[str, Any] = {}
    for scheme in ("gssp", "gssp-paper"):
        runs = mine(scheme)
        # summary groups list every group server, idle ones (merged away) as empty lists
        out[f"{scheme}_never_split_seeds"] = f"{sum(len(r['groups']) == 1 for r in runs)}/{len(runs)}"
        out[f"{scheme}_one_active_group_at_the_end_seeds"] = (
            f"{sum(len([g for g in r['groups'] if g]) == 1 for r in runs)}/{len(runs)}")
        times = [r["time_to_target_s"] for r in runs]
        ssp = [r["time_to_target_s"] for r in mine("ssp")]
        out[f"{scheme}_speedup_vs_ssp"] = speedup_interval(ssp, times)
        m, s = median_time(times), median_time(ssp)
        out[f"{scheme}_time_vs_ssp"] = None if m is None or s is None else round(m / s, 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tune-seeds", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    tune_seeds, final_seeds = list(range(args.tune_seeds)), list(range(args.tune_seeds, args.seeds))
    start, origin = time.perf_counter(), provenance()
    protocol = run_protocol("gssp_uniform", BASE, SCHEMES, "optimizer.lr", LRS, tune_seeds, final_seeds, args.jobs)
    rows = rows_of(protocol, list(SCHEMES))
    for row in rows:
        runs = [r for r in protocol["runs"] if r["scheme"] == row["scheme"] and r["value"] == row["tuned"]]
        row["groups_per_seed"] = [len([g for g in r["groups"] if g]) for r in sorted(runs, key=lambda r: r["seed"])]
    checks = verdicts(protocol)
    meta = {**origin, "lrs": LRS, "tune_seeds": tune_seeds, "final_seeds": final_seeds, "target": TARGET,
            "config": BASE, "schemes": SCHEMES, "chosen": protocol["chosen"], "tuning": protocol["tuning"],
            "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    title = ("GSSP on a uniform cluster with transient stragglers (LeNet-5, mnist5k, 16 equal workers, "
             "4x spells of 5 iterations at p = 0.05)")
    text = simple_markdown(title, rows, checks, meta, extra_columns={"active groups at the end, per seed": "groups_per_seed"})
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gssp_uniform.json").write_text(json.dumps({**meta, "rows": rows, "checks": checks,
                                                           "runs": protocol["runs"],
                                                           "tuning_runs": protocol["tuning_runs"]}, indent=1) + "\n")
    (RESULTS / "gssp_uniform.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
