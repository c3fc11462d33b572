"""Work sized to speed, measured under the held-out protocol (issue 39).

Each study is one `shoal compare` with the development/evaluation seed
protocol (docs/fair-comparison.md): the six baselines and GSSP of the
evidence study with the same config, seeds and folder (benchmarks/evidence.py:
their finished runs are kept, not rerun), plus the balanced schemes:
balanced BSP (`bsp+balance`), a bounded-time BSP round
(`bsp+balance-deadline`), GSSP with balanced batches inside its groups
(`gssp+balance`) and DiLoCo with local steps sized to speed
(`diloco+balance-steps`); on the lognormal cluster also asynchronous DiLoCo
(outer steps without a barrier, HeLoCo-style). Every scheme gets its own knobs' grid (3 points)
on the development seeds; nobody is tuned on the evaluation seeds.

The questions answered per study, on the evaluation seeds:

- balanced BSP against plain BSP: the speed-up of median times to target
  (bootstrap interval), the Mann-Whitney p-value and the final quality;
- the best heterogeneity scheme against tuned ASP: which wins, with p;
- where the study runs it, asynchronous DiLoCo against DiLoCo (HeLoCo
  reports +22% under heterogeneity);
- on the tiered cluster, whether issue 39's target holds (balanced BSP
  >= 1.46x sooner than plain BSP, p < 0.05, no more than 0.5% worse).

Usage:
    .venv/bin/python benchmarks/balance.py STUDY [--jobs 2] [--seeds 10] [--tune-seeds 2] [--resume]
    .venv/bin/python benchmarks/balance.py --list

Results: benchmarks/results/balance-STUDY.{json,md}. On the BN image
workload a run costs about three times a transformer run on this CPU (93 ms a
ResNet-18 step; a median of 15 against 4.5 minutes in the 1 Gbit/s studies), so
its studies add to the evidence study's baselines only the remedy that won on
the transformer (balanced BSP), named before they run: on each cluster the
evidence study of the same cluster plus balanced BSP (every other run shared).
The other remedies join where a GPU runs the batched simulator.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from evidence import (LM, LOGNORMAL_16, SCHEMES, SHAPES_CURRENT, TIERS_16, compare_study,
                      markdown as evidence_markdown, strip, study_args)
from tuned import provenance, write_results

BALANCED = "bsp+balance,bsp+balance-deadline,gssp+balance,diloco+balance-steps"
#: DiLoCo without the barrier (HeLoCo-style, docs/schemes/diloco.md): added where the runs of its study were still
#: to make when it joined (the lognormal cluster), not to the tiered study, whose runs are gone
ASYNC_DILOCO = "diloco@sync.diloco.asynchronous=true"
#: the heterogeneity remedies, one of which is "shoal's best" per study (the fastest median among them)
REMEDIES = ("gssp", "gssp+balance", "bsp+balance", "bsp+balance-deadline", "diloco+balance-steps", ASYNC_DILOCO)

STUDIES: dict[str, dict[str, Any]] = {
    "lm-tiers": {**LM, "sets": LM["sets"] + [TIERS_16], "schemes": f"{SCHEMES},{BALANCED}", "folder": "lm-tiers-iid",
                 "title": "byte transformer on the stdlib, 16 workers in four speed tiers (1x, 2x, 4x, 8x), IID"},
    "lm-lognormal": {**LM, "sets": LM["sets"] + LOGNORMAL_16, "schemes": f"{SCHEMES},{BALANCED},{ASYNC_DILOCO}",
                     "folder": "lm-lognormal-iid",
                     "title": "byte transformer on the stdlib, 16 lognormal workers (sigma 1), IID"},
    # the tiered study is the evidence study of the same cluster plus balanced BSP (it shares every other run)
    "shapes-tiers": {**SHAPES_CURRENT, "sets": SHAPES_CURRENT["sets"] + [TIERS_16], "schemes": f"{SCHEMES},bsp+balance",
                     "folder": "shapes-tiers-iid",
                     "title": "BN ResNet-18 (width 16) on shapes, 16 workers in four speed tiers, IID"},
    # likewise on the lognormal cluster (evidence.py shapes-lognormal-iid shares every other run)
    "shapes-lognormal": {**SHAPES_CURRENT, "sets": SHAPES_CURRENT["sets"] + LOGNORMAL_16, "schemes": f"{SCHEMES},bsp+balance",
                         "folder": "shapes-lognormal-iid",
                         "title": "BN ResNet-18 (width 16) on shapes, 16 lognormal workers (sigma 1), IID"},
}


def main(argv: list[str]) -> None:
    args = study_args(__doc__, STUDIES, argv)
    if args is not None:
        run_study(args)


def run_study(args: argparse.Namespace) -> dict[str, Any]:
    name, study = args.study, STUDIES[args.study]
    result, _ = compare_study(study, args)
    answers = answers_of(result, tiered=name.endswith("-tiers"))
    record = {**provenance(), "study": name, "title": study["title"], "answers": answers, "compare": strip(result)}
    write_results(f"balance-{name}", record, markdown(name, study, result, answers))
    return record


def answers_of(result: dict[str, Any], tiered: bool = False) -> dict[str, Any]:
    """Each question whose schemes the study ran; on the tiered cluster also issue 39's target."""
    answers: dict[str, Any] = {"balanced_vs_bsp": pairwise(result, "bsp+balance", "bsp"),
                               "best_remedy_vs_asp": pairwise(result, best_remedy(result), "asp")}
    if any(row["scheme"] == ASYNC_DILOCO for row in result["rows"]):  # HeLoCo's claim: +22% under heterogeneity
        answers["async_vs_diloco"] = pairwise(result, ASYNC_DILOCO, "diloco")
    if tiered:
        higher_is_better = result["metric"] == "accuracy"
        answers["issue_target"] = issue_target(answers["balanced_vs_bsp"], higher_is_better)
    return answers


def issue_target(balanced: dict[str, Any], higher_is_better: bool) -> dict[str, Any]:
    """Issue 39's "Done means" on the tiered cluster, as the issue states it: balanced BSP reaches the target
    >= 1.46x sooner than tuned plain BSP (ratio of medians, Mann-Whitney p < 0.05) with a final quality within 0.5%
    of it (no more than 0.5% worse; better by any amount is within)."""
    speedup, p, change = balanced["speedup"]["value"], balanced["p_value"], balanced["final_relative_change"]
    worse = None if change is None else (-change if higher_is_better else change)
    met = speedup is not None and speedup >= 1.46 and p is not None and p < 0.05 and worse is not None \
        and worse <= 0.005
    return {"target": "balanced BSP >= 1.46x sooner than plain BSP (p < 0.05), final quality within 0.5%",
            "measured": {"speedup": speedup, "p_value": p, "final_relative_change": change}, "met": met}


def best_remedy(result: dict[str, Any]) -> str:
    """The heterogeneity remedy with the fastest median time to target (unreached counts as slowest)."""
    rows = {r["scheme"]: r for r in result["rows"] if r["scheme"] in REMEDIES}
    return min(rows, key=lambda s: (rows[s]["time_to_target_s"] is None, rows[s]["time_to_target_s"] or 0.0))


def pairwise(result: dict[str, Any], mine: str, base: str) -> dict[str, Any]:
    """``mine`` against ``base`` on the evaluation seeds: speed-up of medians with its interval, p, final quality."""
    from shoal.report.tuning import mann_whitney, speedup_interval

    rows = {r["scheme"]: r for r in result["rows"]}
    times = {s: [seed["time_to_target_s"] for seed in rows[s]["seeds"]] for s in (mine, base)}
    finals = {s: rows[s].get("final_metric", rows[s].get("final_accuracy")) for s in (mine, base)}
    quality = None
    if finals[mine] is not None and finals[base]:
        quality = round((finals[mine] - finals[base]) / abs(finals[base]), 6)
    return {"mine": mine, "base": base, "speedup": speedup_interval(times[base], times[mine]),
            "p_value": mann_whitney(times[mine], times[base]), "final": finals,
            "final_relative_change": quality, "times": times}


def markdown(name: str, study: dict[str, Any], result: dict[str, Any], answers: dict[str, Any]) -> str:
    lines = [evidence_markdown(name, study, result).replace("# Evidence:", "# Work sized to speed:", 1), ""]
    return "\n".join(lines + answer_lines(answers, result["metric"]))


def answer_lines(answers: dict[str, Any], metric: str = "accuracy") -> list[str]:
    """The study's answers in words, each followed by a blank line (the results file's and the README's);
    ``metric``: what the final quality is measured in."""
    quality_of = f"final {metric} ({'higher' if metric == 'accuracy' else 'lower'} is better)"
    lines: list[str] = []
    for key, title in (("balanced_vs_bsp", "Balanced BSP against plain BSP"),
                       ("best_remedy_vs_asp", "Shoal's best heterogeneity scheme against tuned ASP"),
                       ("async_vs_diloco", "Asynchronous DiLoCo against DiLoCo")):
        if key not in answers:
            continue
        a = answers[key]
        sp, ci, p, change = a["speedup"]["value"], a["speedup"]["ci95"], a["p_value"], a["final_relative_change"]
        speedup = "-" if sp is None else f"{sp:.2f}x"
        interval = "" if not ci else f" (95% interval {_x(ci[0])}..{_x(ci[1])})"
        p_text = "-" if p is None else f"{p:.3g}"
        quality = "-" if change is None else f"{100 * change:+.2f}%"
        mine, base = a["final"][a["mine"]], a["final"][a["base"]]
        lines += [f"**{title}**: {a['mine']} vs {a['base']}: speed-up of medians {speedup}{interval}, "
                  f"Mann-Whitney p = {p_text}; {quality_of} {quality} ({_g(mine)} vs {_g(base)}).", ""]
    if "issue_target" in answers:
        target = answers["issue_target"]
        lines += [f"**Issue 39, {target['target']}**: {'met' if target['met'] else '**not met**'}.", ""]
    return lines


def _g(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main(sys.argv[1:])
