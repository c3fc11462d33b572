"""How good is the estimate of a run without its straggler (shoal/whatif.py; issue 42)?

The constructed case of the issue: 4 workers under BSP on digits (an MLP),
one of them 4x slower. Per seed, the run names its straggler and estimates,
by a cost-only replay of the 3 other workers, when it would have reached
the target without it; a real run of those 3 workers (same seed) measures
it. The estimate predicts the time of the same progress exactly (a test
checks that); what it cannot know is the reduced run's own batch noise, so
it is compared with the real runs over seeds: medians and the ratio.

Usage: .venv/bin/python benchmarks/straggler_estimate.py [--seeds 10]
Results: benchmarks/results/straggler_estimate.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from tuned import provenance, write_results

BASE = ["data.name=digits", "model.name=mlp", "model.hidden=[32]", "optimizer.lr=0.1", "cluster.compute_s=0.01",
        "run.eval_every_s=0.02", "run.max_time_s=10", "run.target_accuracy=0.93"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args(argv)
    from shoal.config import load_config
    from shoal.runner import train

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            slow = train(load_config(None, BASE + ["cluster.workers=4", "cluster.speeds=[1,1,1,4]",
                                                   f"run.seed={seed}"]), Path(tmp) / f"slow-{seed}")
            without = train(load_config(None, BASE + ["cluster.workers=3", "cluster.speeds=[1,1,1]",
                                                      f"run.seed={seed}"]), Path(tmp) / f"without-{seed}")
            estimate = slow["stragglers"]["without_culprit"]
            rows.append({"seed": seed, "culprit": slow["stragglers"]["culprit"],
                         "time_to_target_s": slow["time_to_target_s"], "estimate_s": estimate.get("time_s"),
                         "real_without_s": without["time_to_target_s"]})
    estimates = [r["estimate_s"] for r in rows if r["estimate_s"] is not None]
    reals = [r["real_without_s"] for r in rows if r["real_without_s"] is not None]
    median_estimate, median_real = statistics.median(estimates), statistics.median(reals)
    result = {**provenance(), "rows": rows, "median_estimate_s": median_estimate, "median_real_without_s": median_real,
              "ratio": round(median_estimate / median_real, 4), "culprit_named": sum(r["culprit"] == 3 for r in rows)}
    lines = ["# The estimate without the straggler", "",
             f"`{result['command']}` at {result['git_commit'][:10]}: 4 workers (speeds 1, 1, 1, 4) under BSP on "
             "digits; the estimate is a cost-only replay of the 3 fast workers to the progress the run made by its "
             "target; the real run trains those 3 workers (same seed).", "",
             "| seed | culprit named | time to target with it (s) | estimate without it (s) | real run without it (s) |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['culprit']} | {r['time_to_target_s']} | {r['estimate_s']} | {r['real_without_s']} |"
              for r in rows]
    lines += ["", f"Medians: estimate {median_estimate:.3f} s, real {median_real:.3f} s: the estimate is "
                  f"{result['ratio']:.3f}x the real time; the slow worker was named in {result['culprit_named']} of "
                  f"{len(rows)} runs.", ""]
    write_results("straggler_estimate", result, "\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
