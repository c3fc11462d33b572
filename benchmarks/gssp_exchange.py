"""GSSP's inter-group exchange on a link-bound cluster: compressed with GDTopK, charged at both ends.

LeNet-5 on mnist5k, 16 workers in four speed tiers (1/2/4/8x), links of
0.1 Gbit/s for workers and group servers alike, so a 1 MB model or delta
takes 80 ms, longer than a fast worker's 50 ms batch. gssp exchanges dense
own deltas; gssp+gdtopk compresses uploads *and* exchanged deltas with the
group's GDTopK density (error feedback at the sender). Each copy of a delta
pays the sender's egress and the receiver's ingress. The protocol is
benchmarks/tuned.py (lr tuned per scheme, then every seed). Verdicts:
gssp+gdtopk's exchange bytes are at most 2x its upload bytes, and its
median time to target is not longer than gssp's.

Usage: .venv/bin/python benchmarks/gssp_exchange.py [--jobs 2] [--seeds 5]
Writes benchmarks/results/gssp_exchange.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from tuned import RESULTS, provenance, rows_of, run_protocol, simple_markdown

TARGET = 0.94
LRS = [0.01, 0.02, 0.05, 0.1]
BASE = [
    "model.name=lenet5", "data.name=mnist5k", "data.batch_size=32", "optimizer.momentum=0.9",
    "cluster.workers=16", "cluster.speeds=[1,1,1,1,2,2,2,2,4,4,4,4,8,8,8,8]", "cluster.compute_s=0.05",
    "cluster.link_gbps=0.1", "cluster.server_gbps=0.1", f"run.target_accuracy={TARGET}", "run.target_patience=3",
    "run.stop_at_target=false", "run.eval_every_s=4", "run.max_time_s=300", "sync.ssp.staleness=3", "sync.gssp.staleness=3",
    "backend.log_iterations=false",
]
GSSP = ["sync.scheme=gssp", "sync.gssp.group_momentum=busiest", "sync.gssp.split_ratio=1.5", "sync.gssp.regroup_cooldown_s=5",
        "sync.gssp.transient_factor=2"]
SCHEMES: dict[str, list[str]] = {"gssp": GSSP, "gssp+gdtopk": GSSP + ["compression.method=gdtopk"]}


def verdicts(protocol: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    from shoal.report.tuning import speedup_interval

    def mine(scheme: str) -> list[dict[str, Any]]:
        return [r for r in protocol["runs"] if r["scheme"] == scheme and r["value"] == protocol["chosen"][scheme]]

    gd = mine("gssp+gdtopk")
    ratio = statistics.median(r["bytes_exchange"] / r["bytes_up"] for r in gd)
    times = lambda s: [r["time_to_target_s"] for r in mine(s)]  # noqa: E731
    return {"gdtopk_exchange_over_upload_bytes": round(ratio, 3),
            "gdtopk_speedup_vs_gssp": speedup_interval(times("gssp"), times("gssp+gdtopk"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tune-seeds", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    tune_seeds, final_seeds = list(range(args.tune_seeds)), list(range(args.tune_seeds, args.seeds))
    start, origin = time.perf_counter(), provenance()
    protocol = run_protocol("gssp_exchange", BASE, SCHEMES, "optimizer.lr", LRS, tune_seeds, final_seeds, args.jobs)
    rows = rows_of(protocol, list(SCHEMES))
    checks = verdicts(protocol, rows)
    meta = {**origin, "lrs": LRS, "tune_seeds": tune_seeds, "final_seeds": final_seeds, "target": TARGET,
            "config": BASE, "schemes": SCHEMES, "chosen": protocol["chosen"], "tuning": protocol["tuning"],
            "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    title = "GSSP's exchange on a link-bound cluster (LeNet-5, 16 tiered workers, 0.1 Gbit/s links and servers)"
    text = simple_markdown(title, rows, checks, meta)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gssp_exchange.json").write_text(json.dumps({**meta, "rows": rows, "checks": checks,
                                                            "runs": protocol["runs"],
                                                            "tuning_runs": protocol["tuning_runs"]}, indent=1) + "\n")
    (RESULTS / "gssp_exchange.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
