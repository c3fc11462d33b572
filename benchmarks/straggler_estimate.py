"""How good is the estimate of a run without its straggler (shoal/whatif.py; issue 42)?

The constructed case of the issue: 4 workers under BSP on digits (an MLP),
one of them 4x slower. Per seed, the run names its straggler and estimates,
by a cost-only replay of the 3 other workers, when it would have reached
the target without it; a real run of those 3 workers (same seed) measures
it. The replay predicts the time of a given number of iterations exactly (a
test checks that); how many iterations the 3 workers need for the same
progress it brackets between per update and per sample, and estimates in
between from the run's gradient noise scale (shoal/whatif.py), so the real
runs are compared with the three over seeds.

Usage: .venv/bin/python benchmarks/straggler_estimate.py [--seeds 20]
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
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args(argv)
    from shoal.config import load_config
    from shoal.report.tuning import interval
    from shoal.runner import train

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            slow = train(load_config(None, BASE + ["cluster.workers=4", "cluster.speeds=[1,1,1,4]",
                                                   f"run.seed={seed}"]), Path(tmp) / f"slow-{seed}")
            without = train(load_config(None, BASE + ["cluster.workers=3", "cluster.speeds=[1,1,1]",
                                                      f"run.seed={seed}"]), Path(tmp) / f"without-{seed}")
            estimate = slow["stragglers"]["without_culprit"]
            per_update, per_sample = estimate["time_s"]
            rows.append({"seed": seed, "culprit": slow["stragglers"]["culprit"],
                         "time_to_target_s": slow["time_to_target_s"], "per_update_s": per_update,
                         "per_sample_s": per_sample, "noise_scale": estimate["estimate"]["noise_scale"],
                         "estimate_s": estimate["estimate"]["time_s"], "real_without_s": without["time_to_target_s"]})
    keys = ("per_update_s", "estimate_s", "per_sample_s", "real_without_s")
    median = {key: statistics.median(r[key] for r in rows if r[key] is not None) for key in keys}
    paired = [r["estimate_s"] / r["real_without_s"] for r in rows if r["real_without_s"]]
    real = median["real_without_s"]
    inside = sum(r["per_update_s"] <= r["real_without_s"] <= r["per_sample_s"] for r in rows
                 if r["real_without_s"] is not None)
    result = {**provenance(), "rows": rows, "medians": median, "culprit_named": sum(r["culprit"] == 3 for r in rows),
              "ratios": {k: round(v / real, 4) for k, v in median.items() if k != "real_without_s"},
              "real_inside_range": inside, "paired_ratio": interval(paired)}
    ratio = result["paired_ratio"]
    lines = ["# The estimate without the straggler", "",
             f"`{result['command']}` at {result['git_commit'][:10]}: 4 workers (speeds 1, 1, 1, 4) under BSP on "
             "digits; the estimate is a cost-only replay of the 3 fast workers to the progress the run made by its "
             "target, if progress is per update (3/4 of its iterations), by the run's gradient noise scale, and if it "
             "is per sample (all of them); the real run trains those 3 workers (same seed).", "",
             "| seed | culprit named | time to target with it (s) | per update (s) | noise scale (samples) | "
             "by the noise scale (s) | per sample (s) | real run without it (s) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['culprit']} | {r['time_to_target_s']:.3f} | {r['per_update_s']:.3f} | "
              f"{r['noise_scale']:.1f} | {r['estimate_s']:.3f} | {r['per_sample_s']:.3f} | "
              f"{r['real_without_s']:.3f} |" for r in rows]
    lines += ["", f"Medians: per update {median['per_update_s']:.3f} s ({result['ratios']['per_update_s']:.3f}x the "
                  f"real), by the noise scale {median['estimate_s']:.3f} s ({result['ratios']['estimate_s']:.3f}x; "
                  f"per seed, estimate / real has median {ratio['median']:.3f}, 95% bootstrap interval "
                  f"{ratio['ci95'][0]:.3f}..{ratio['ci95'][1]:.3f}), per sample "
                  f"{median['per_sample_s']:.3f} s ({result['ratios']['per_sample_s']:.3f}x), real {real:.3f} s. The "
                  f"real run fell inside the range in {inside} of {len(rows)} seeds; the slow worker was named in "
                  f"{result['culprit_named']} of {len(rows)} runs.", ""]
    write_results("straggler_estimate", result, "\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
