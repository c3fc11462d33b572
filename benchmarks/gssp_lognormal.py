"""GSSP on 32 lognormal workers: does it reach the target at every lr at which ASP does?

LeNet-5 on mnist5k, 32 workers whose speeds are lognormal (sigma 0.5, about
1x..4.6x), no stragglers. Every scheme runs every lr of the grid on every
seed, each run stopping at the target (94%, three evaluations in a row) or
at the 60 s virtual budget. ``gssp-paper`` is the scheme as published: each
group server keeps its own SGD momentum and any goodness-of-fit split is
taken, and groups wait for transient stragglers; ``gssp`` is shoal's (no
group's momentum steps harder than the busiest group's, a 1.5x split floor,
no waiting for transient stragglers). Verdict: at every lr, gssp reaches
the target in at least as many seeds as asp.

Usage: .venv/bin/python benchmarks/gssp_lognormal.py [--jobs 2] [--seeds 5] [--paper-seeds 2]
Writes benchmarks/results/gssp_lognormal.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from tuned import RESULTS, run_all, fmt_interval, provenance

TARGET = 0.94
LRS = [0.01, 0.02, 0.05, 0.1]
BASE = [
    "model.name=lenet5", "data.name=mnist5k", "data.batch_size=32", "optimizer.momentum=0.9",
    "cluster.workers=32", "cluster.profile=lognormal", "cluster.lognormal_sigma=0.5",
    "cluster.compute_s=0.05", "cluster.link_gbps=10", "cluster.server_gbps=10",
    f"run.target_accuracy={TARGET}", "run.target_patience=3", "run.stop_at_target=true",
    "run.eval_every_s=2", "run.max_time_s=60", "sync.ssp.staleness=3", "sync.gssp.staleness=3", "backend.log_iterations=false",
]
SCHEMES: dict[str, list[str]] = {
    "asp": ["sync.scheme=asp"],
    "gssp": ["sync.scheme=gssp", "sync.gssp.group_momentum=busiest", "sync.gssp.paced=true", "sync.gssp.split_ratio=1.5",
             "sync.gssp.transient_factor=2"],
    "gssp-paper": ["sync.scheme=gssp", "sync.gssp.group_momentum=server", "sync.gssp.split_ratio=1", "sync.gssp.regroup_cooldown_s=0",
                   "sync.gssp.transient_factor=0", "sync.gssp.paced=false"],
}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    from shoal.report.tuning import interval

    table: dict[str, dict[str, Any]] = {}
    for scheme in SCHEMES:
        table[scheme] = {}
        for lr in LRS:
            mine = sorted((r for r in runs if r["scheme"] == scheme and r["lr"] == lr), key=lambda r: r["seed"])
            if mine:
                table[scheme][str(lr)] = {
                    "seeds": [r["seed"] for r in mine], "reached": sum(r["time_to_target_s"] is not None for r in mine),
                    "time_to_target_s": [r["time_to_target_s"] for r in mine],
                    "time": interval([r["time_to_target_s"] for r in mine]),
                    "final_accuracy": [r["final_accuracy"] for r in mine],
                    "groups": [len(r["groups"]) for r in mine]}
    verdict = {str(lr): table["gssp"][str(lr)]["reached"] >= table["asp"][str(lr)]["reached"] for lr in LRS}
    return {"table": table, "gssp_reaches_wherever_asp_does": verdict, "all": all(verdict.values())}


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# GSSP on 32 lognormal workers (LeNet-5, mnist5k, sigma 0.5)", "",
        f"Every scheme runs every lr on seeds {meta['seeds']} (gssp-paper: {meta['paper_seeds']}); runs stop at "
        f"{TARGET:.0%} (3 evaluations in a row) or at 60 virtual s. Cells: seeds that reached the target, then the "
        "median [min..max] time to target (n/r = not reached, counted as slowest) and the median final accuracy.",
        "", f"Commit `{meta['git_commit'][:10]}`; command: `{meta['command']}`.", "",
        "| scheme | " + " | ".join(f"lr {lr}" for lr in LRS) + " |", "|---|" + "---|" * len(LRS)]
    for scheme, cells in summary["table"].items():
        row = []
        for lr in LRS:
            c = cells.get(str(lr))
            if c is None:
                row.append("")
                continue
            finals = sorted(c["final_accuracy"])
            row.append(f"{c['reached']}/{len(c['seeds'])}: {fmt_interval(c['time'])} s, final "
                       f"{100 * finals[len(finals) // 2]:.1f}%")
        lines.append(f"| {scheme} | " + " | ".join(row) + " |")
    lines += ["", "GSSP reaches the target in at least as many seeds as ASP at every lr: "
              f"**{'yes' if summary['all'] else 'no'}** ({summary['gssp_reaches_wherever_asp_does']})."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--paper-seeds", type=int, default=2)
    args = parser.parse_args()
    start, origin = time.perf_counter(), provenance()
    tasks = [(s, lr, seed) for seed in range(args.seeds) for lr in LRS for s in SCHEMES
             if s != "gssp-paper" or seed < args.paper_seeds]
    configs = [BASE + SCHEMES[s] + [f"optimizer.lr={lr}", f"run.seed={seed}"] for s, lr, seed in tasks]
    results = run_all("gssp_lognormal", configs, args.jobs)
    runs = [{"scheme": s, "lr": lr, "seed": seed, **r} for (s, lr, seed), r in zip(tasks, results)]
    for r in runs:
        r.pop("curve", None)
    summary = summarise(runs)
    meta = {**origin, "seeds": list(range(args.seeds)), "paper_seeds": list(range(args.paper_seeds)), "lrs": LRS,
            "config": BASE, "schemes": SCHEMES, "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gssp_lognormal.json").write_text(json.dumps({**meta, **summary, "runs": runs}, indent=1) + "\n")
    (RESULTS / "gssp_lognormal.md").write_text(markdown(summary, meta))
    print(markdown(summary, meta))


if __name__ == "__main__":
    main()
