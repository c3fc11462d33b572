"""Why the paper's GSSP collapses on 32 lognormal workers: one variable changed at a time.

LeNet-5 on mnist5k, 32 workers with lognormal speeds (sigma 0.5), SGD with
lr 0.05 and momentum 0.9, seed 0, 12 virtual seconds. The runs differ from
``paper`` (each group server keeps its own momentum, as published) in one
setting each: no momentum at the same lr / (1 - m); deltas exchanged after
every update; two groups; no staleness inside a group; ASP for reference;
and shoal's fixes, momentum decayed on the clock of all updates
(``sync.gssp.group_momentum = "global"``) or at the busiest group's share
(``"busiest"``, the default). The accuracy curve says which change
prevents the collapse.

Usage: .venv/bin/python benchmarks/gssp_collapse.py [--jobs 2]
Writes benchmarks/results/gssp_collapse.{json,md}.
"""

from __future__ import annotations

import argparse
import json

from tuned import RESULTS, run_all, provenance

BASE = [
    "model.name=lenet5", "data.name=mnist5k", "data.batch_size=32", "optimizer.lr=0.05", "optimizer.momentum=0.9",
    "cluster.workers=32", "cluster.profile=lognormal", "cluster.lognormal_sigma=0.5", "cluster.compute_s=0.05",
    "cluster.link_gbps=10", "cluster.server_gbps=10", "run.target_accuracy=0.94", "run.stop_at_target=false",
    "run.eval_every_s=2", "run.max_time_s=12", "run.seed=0", "sync.gssp.staleness=3", "backend.log_iterations=false",
]
PAPER = ["sync.scheme=gssp", "sync.gssp.group_momentum=server", "sync.gssp.split_ratio=1", "sync.gssp.regroup_cooldown_s=0",
         "sync.gssp.transient_factor=0", "sync.gssp.paced=false"]
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "paper": ("the paper's GSSP: own momentum per group server", PAPER),
    "no-momentum": ("momentum 0 at lr 0.5 (the same lr / (1 - m))", PAPER + ["optimizer.momentum=0", "optimizer.lr=0.5"]),
    "exchange-every-1": ("deltas sent after every update", PAPER + ["sync.gssp.exchange_every=1"]),
    "two-groups": ("two groups instead of five", PAPER + ["sync.gssp.groups=2"]),
    "staleness-0": ("BSP inside each group", PAPER + ["sync.gssp.staleness=0"]),
    "global-momentum": ("shoal: momentum decayed on the clock of all updates", PAPER[:1] + [
        "sync.gssp.group_momentum=global", "sync.gssp.split_ratio=1", "sync.gssp.regroup_cooldown_s=0", "sync.gssp.transient_factor=0",
        "sync.gssp.paced=false"]),
    "busiest-momentum": ("shoal's default: every group's momentum decays as the busiest group's does", PAPER[:1] + [
        "sync.gssp.group_momentum=busiest", "sync.gssp.split_ratio=1", "sync.gssp.regroup_cooldown_s=0", "sync.gssp.transient_factor=0",
        "sync.gssp.paced=false"]),
    "asp": ("ASP, same lr and momentum", ["sync.scheme=asp"]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    origin = provenance()
    results = run_all("gssp_collapse", [BASE + v for _, v in VARIANTS.values()], args.jobs)
    rows = [{"variant": name, "what": what, "groups": len(r["groups"]), "final_accuracy": r["final_accuracy"],
             "curve": r["curve"]} for (name, (what, _)), r in zip(VARIANTS.items(), results)]
    times = [t for t, _ in rows[0]["curve"]]
    lines = ["# Why the paper's GSSP collapses (32 lognormal workers, LeNet-5, lr 0.05, momentum 0.9, seed 0)", "",
             f"Commit `{origin['git_commit'][:10]}`; command: `{origin['command']}`.", "",
             "| variant | change | groups | " + " | ".join(f"{t:.0f} s" for t in times) + " |",
             "|---|---|---:|" + "---:|" * len(times)]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['what']} | {r['groups']} | "
                     + " | ".join(f"{a:.2f}" for _, a in r["curve"]) + " |")
    lines += ["", "Cells: test accuracy (1,000 images) at each evaluation."]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gssp_collapse.json").write_text(json.dumps({**origin, "config": BASE, "rows": rows}, indent=1) + "\n")
    (RESULTS / "gssp_collapse.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
