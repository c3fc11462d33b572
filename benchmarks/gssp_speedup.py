"""GSSP against tuned BSP, ASP, SSP, local SGD and DiLoCo on a tiered cluster with transient stragglers.

LeNet-5 on mnist5k, 16 workers in four speed tiers (4 each at 1x, 2x, 4x,
8x) plus transient stragglers; every scheme runs the same virtual time
budget. The protocol is benchmarks/tuned.py: each scheme's learning rate is
tuned over the same grid on the tuning seeds (runs stop at the target), then
the chosen lr runs the whole budget on every seed; rows report medians over
all seeds with min..max and a bootstrap 90% interval. ``--partition dirichlet:0.5`` shards non-IID.

Usage: .venv/bin/python benchmarks/gssp_speedup.py [--partition iid] [--jobs 2] [--quick]
Writes benchmarks/results/gssp_speedup[-PARTITION].{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tuned import RESULTS, fmt_interval, provenance, rows_of, run_protocol

TARGET = 0.94
LRS = [0.01, 0.02, 0.05, 0.1]

BASE = [
    "model.name=lenet5",
    "data.name=mnist5k",
    "data.batch_size=32",
    "optimizer.momentum=0.9",
    "cluster.workers=16",
    "cluster.speeds=[1,1,1,1,2,2,2,2,4,4,4,4,8,8,8,8]",
    "cluster.compute_s=0.05",
    "cluster.link_gbps=10",
    "cluster.server_gbps=10",
    "cluster.stragglers.probability=0.05",
    "cluster.stragglers.slowdown=4",
    "cluster.stragglers.duration=5",
    f"run.target_accuracy={TARGET}",
    "run.target_patience=3",
    "run.stop_at_target=false",
    "run.eval_every_s=2",
    "sync.ssp.staleness=3",
    "sync.gssp.staleness=3",
    "sync.localsgd.local_steps=8",
    "sync.diloco.local_steps=8",
    "backend.log_iterations=false",
]

SCHEMES: dict[str, list[str]] = {
    "bsp": ["sync.scheme=bsp"],
    "asp": ["sync.scheme=asp"],
    "ssp": ["sync.scheme=ssp"],
    "localsgd": ["sync.scheme=localsgd"],
    "diloco": ["sync.scheme=diloco"],
    # shoal's GSSP: no group's momentum steps harder than the busiest group's, no split under a 1.5x speed
    # ratio, no waiting for transient stragglers, charged exchange
    "gssp": ["sync.scheme=gssp", "sync.gssp.group_momentum=busiest", "sync.gssp.paced=true", "sync.gssp.split_ratio=1.5",
             "sync.gssp.transient_factor=2"],
}
OURS = "gssp"
SYNC_BASELINES = ("bsp", "ssp")


def verdicts(rows: list[dict[str, Any]], runs: list[dict[str, Any]], chosen: dict[str, Any]) -> dict[str, Any]:
    """GSSP's speed-up (median ratio with its bootstrap interval) over each tuned baseline."""
    from shoal.report.tuning import median_time, speedup_interval

    def times(scheme: str) -> list[float | None]:
        return [r["time_to_target_s"] for r in runs if r["scheme"] == scheme and r["value"] == chosen[scheme]]

    by = {r["scheme"]: r for r in rows}
    out: dict[str, Any] = {}
    best_sync = min(SYNC_BASELINES, key=lambda s: (median_time(times(s)) is None, median_time(times(s)) or 0))
    out["best_tuned_of_bsp_ssp"] = best_sync
    out[f"{OURS}_speedup_vs_best_of_bsp_ssp"] = speedup_interval(times(best_sync), times(OURS))
    for other in SCHEMES:
        if other != OURS:
            out[f"{OURS}_speedup_vs_{other}"] = speedup_interval(times(other), times(OURS))
    finals = {s: r["final"]["median"] for s, r in by.items() if r["final"]["median"] is not None}
    out[f"{OURS}_final_minus_best_points"] = round(100 * (finals[OURS] - max(finals.values())), 3)
    return out


def markdown(rows: list[dict[str, Any]], checks: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"# GSSP against tuned baselines (LeNet-5, mnist5k, partition {meta['partition']}, 16 workers in tiers "
        "1/2/4/8x + transient stragglers)",
        "",
        f"Virtual-time budget {meta['budget_s']:.0f} s per run. Each scheme's `optimizer.lr` is tuned over "
        f"{meta['lrs']} on seeds {meta['tune_seeds']} (best median time to {TARGET:.0%}, ties by final accuracy); "
        f"tuning runs stop at the target; the chosen lr then runs the whole budget on seeds "
        f"{meta['tune_seeds'] + meta['final_seeds']}. Time to target needs "
        "`run.target_patience = 3` evaluations in a row at or above it (the first of them is reported). "
        "Cells: median [min..max] (90%: bootstrap interval of the median) over all seeds; n/r = not reached "
        "(an unreached seed counts as slowest). Final accuracy: mean of the last five evaluations.",
        "",
        f"Commit `{meta['git_commit'][:10]}`; command: `{meta['command']}`.",
        "",
        "| scheme | tuned lr | time to 94% (s) | per seed | final acc. (%) | upload MB | exchange MB | iterations |",
        "|---|---:|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        per_seed = ", ".join("n/r" if t is None else f"{t:.0f}" for t in r["time_to_target_s"])
        lines.append(
            f"| {r['scheme']} | {r['tuned']} | {fmt_interval(r['time'])} | {per_seed} "
            f"| {fmt_interval(r['final'], 2, 100)} | {r['bytes_up'] / 1e6:.1f} | {r['bytes_exchange'] / 1e6:.1f} "
            f"| {r['iterations']:.0f} |")
    lines += ["", "Speed-ups of gssp (ratio of median times; 90% bootstrap interval):", ""]
    for k, v in checks.items():
        if isinstance(v, dict):
            ci = ""
            if v.get("ci90"):
                lo, hi = v["ci90"]
                ci = f" (90%: {'0' if lo is None else f'{lo:.2f}'}..{'inf' if hi is None else f'{hi:.2f}'})"
            ratio = "n/a (a median is unreached)" if v["value"] is None else f"{v['value']:.2f}x"
            lines.append(f"- {k}: {ratio}{ci}")
        else:
            lines.append(f"- {k}: {v}")
    lines += ["", "Tuning grid (median time to target over the tuning seeds, s; n/r = not reached):", "",
              "| scheme | " + " | ".join(f"lr {v}" for v in meta["lrs"]) + " |",
              "|---|" + "---:|" * len(meta["lrs"])]
    from shoal.report.tuning import median_time

    for scheme, points in meta["tuning"].items():
        cells = []
        for p in points:
            t = median_time(p["time_to_target_s"])
            cells.append(("n/r" if t is None else f"{t:.0f}") + (" *" if p["value"] == meta["chosen"][scheme] else ""))
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    lines += ["", "`*` = chosen."]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], chosen: dict[str, Any], path: Path, title: str) -> None:
    from shoal.report.plots import median_band

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for scheme in SCHEMES:
        curves = [r["curve"] for r in runs if r["scheme"] == scheme and r["value"] == chosen[scheme]]
        t, med, lo, hi = median_band(curves)
        line, = ax.plot(t, med, lw=1.6, label=f"{scheme} (lr {chosen[scheme]})")
        ax.fill_between(t, lo, hi, color=line.get_color(), alpha=0.18, lw=0)
    ax.axhline(TARGET, color="grey", ls=":", lw=1)
    ax.set_ylim(0.5, 1.0)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("test accuracy (median, band = min..max over seeds)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two lrs, one seed each, short budget (a smoke test)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--budget", type=float, default=150.0, help="virtual seconds per run")
    parser.add_argument("--partition", default="iid", help="data.partition: iid, dirichlet:ALPHA or classes:K")
    parser.add_argument("--tune-seeds", type=int, default=2, help="seeds every grid value runs")
    parser.add_argument("--seeds", type=int, default=5, help="seeds in all at the chosen value")
    args = parser.parse_args()
    lrs = LRS[1:3] if args.quick else LRS
    budget = 20.0 if args.quick else args.budget
    tune_seeds = list(range(1 if args.quick else args.tune_seeds))
    final_seeds = [] if args.quick else list(range(len(tune_seeds), args.seeds))
    base = BASE + [f"run.max_time_s={budget}", f"data.partition={json.dumps(args.partition)}"]
    start, origin = time.perf_counter(), provenance()  # the commit the runs start from
    name = "gssp_speedup" + ("" if args.partition == "iid" else "-" + args.partition.replace(":", "")) + (
        "_quick" if args.quick else "")
    protocol = run_protocol(name, base, SCHEMES, "optimizer.lr", lrs, tune_seeds, final_seeds, args.jobs)
    rows = rows_of(protocol, list(SCHEMES))
    checks = verdicts(rows, protocol["runs"], protocol["chosen"])
    meta = {**origin, "partition": args.partition, "budget_s": budget, "lrs": lrs, "tune_seeds": tune_seeds,
            "final_seeds": final_seeds, "target": TARGET, "config": base, "chosen": protocol["chosen"],
            "tuning": protocol["tuning"], "wall_s_last_invocation": round(time.perf_counter() - start, 1)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({**meta, "rows": rows, "checks": checks,
                                                      "runs": protocol["runs"],
                                                      "tuning_runs": protocol["tuning_runs"]}, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(rows, checks, meta))
    plot(protocol["runs"], protocol["chosen"], RESULTS / f"{name}.png",
         f"LeNet-5 / mnist5k, 16 tiered workers, {args.partition}, tuned lr, {len(tune_seeds + final_seeds)} seeds")
    print(markdown(rows, checks, meta))


if __name__ == "__main__":
    main()
