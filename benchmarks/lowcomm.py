"""Low-communication training as it is done today, measured under the held-out protocol (issue 40).

One ``shoal compare`` per study (docs/fair-comparison.md): every scheme tunes
its own knobs (3 points) on the development seeds and runs its kept point on
>= 10 evaluation seeds. The network is communication-bound (1 Gbit/s links
and server), the 16 workers are equally fast, so what is measured is what
each scheme sends and what that costs in time:

- BSP, local SGD (fixed H), post-local SGD (a warm-up of BSP steps, then H),
  AdaComm (periods that shrink with the loss), DiLoCo, Streaming DiLoCo
  (4 fragments, overlap 1) with float32 and with fp4 outer gradients, with
  the least similar fragment first and with fragments of whole tensors, and
  SIM on BSP (study ``lm-1g``);
- on the BN image workload (``shapes-1g``, about three times the cost per run):
  BSP, local SGD, post-local SGD, AdaComm, DiLoCo, Streaming DiLoCo and SIM,
  the schemes of the questions asked on both workloads (issue 40 asks
  whether post-local or AdaComm beats fixed H on either of the two).

The answers, on the evaluation seeds:

- Streaming DiLoCo's bytes to target against BSP's (the ratio of medians) and
  its time to target against tuned DiLoCo's (speed-up of medians, p);
- its peak upload per worker against DiLoCo's (``peak_push_bytes``);
- equal fragments that cut tensors (the default) against fragments of whole
  tensors: time to target and peak upload;
- fp4 against float32 outer gradients: the fp4 run's validation metric at the
  time the float32 run reached the target, relative to the float32 run's at
  that time (what quantising cost) and to the target;
- post-local and AdaComm against fixed-H local SGD: time and bytes to target;
- SIM's signal put to use: Streaming DiLoCo syncing the fragment the workers
  agreed on least first, against the staggered order;
- SIM against the best of local SGD, DiLoCo and Streaming DiLoCo, with the
  bytes each moved, and against the BSP it runs on;
- the Pareto front: the schemes whose medians no other beats on both time
  and bytes to target (``lowcomm-STUDY-pareto.png`` draws every seed).

Usage:
    .venv/bin/python benchmarks/lowcomm.py STUDY [--jobs 2] [--seeds 10] [--tune-seeds 2] [--resume]
    .venv/bin/python benchmarks/lowcomm.py --list

Results: benchmarks/results/lowcomm-STUDY.{json,md} and -pareto.png; runs in runs/evidence/lowcomm-STUDY.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from balance import pairwise
from evidence import LM, SHAPES, compare_study, markdown as evidence_markdown, strip, study_args
from tuned import RESULTS, provenance, write_results

ONE_GBIT = ["cluster.link_gbps=1", "cluster.server_gbps=1"]
STREAMING = "streaming_diloco"
FP4 = "streaming_diloco@sync.streaming_diloco.outer_quantization=fp4"
POST_LOCAL = "localsgd@sync.localsgd.warmup_steps=64"
ADACOMM = "localsgd@sync.localsgd.adaptive=true"
ORDERED = "streaming_diloco@sync.streaming_diloco.fragment_order=least_similar"
WHOLE = "streaming_diloco@sync.streaming_diloco.split_tensors=false"  # fragments of whole tensors (the paper's)
SCHEMES = f"bsp,localsgd,{POST_LOCAL},{ADACOMM},diloco,{STREAMING},{FP4},{ORDERED},{WHOLE},bsp+sim"
LOW_COMM = ("localsgd", "diloco", STREAMING, FP4)

STUDIES: dict[str, dict[str, Any]] = {
    "lm-1g": {**LM, "sets": LM["sets"] + ONE_GBIT, "schemes": SCHEMES, "folder": "lowcomm-lm-1g",
              "title": "byte transformer on the stdlib, 16 equal workers, 1 Gbit/s links and server"},
    # the image workload costs about three times the transformer's per run here: the questions asked on both
    # workloads only (SIM against the low-communication schemes, Streaming DiLoCo against BSP and DiLoCo,
    # post-local and AdaComm against fixed H)
    "shapes-1g": {**SHAPES, "sets": SHAPES["sets"] + ONE_GBIT, "folder": "lowcomm-shapes-1g",
                  "schemes": f"bsp,localsgd,{POST_LOCAL},{ADACOMM},diloco,{STREAMING},bsp+sim",
                  "title": "BN ResNet-18 (width 16) on shapes, 16 equal workers, 1 Gbit/s links and server"},
}


def main(argv: list[str]) -> None:
    args = study_args(__doc__, STUDIES, argv)
    if args is not None:
        run_study(args)


def run_study(args: argparse.Namespace) -> dict[str, Any]:
    name, study = args.study, STUDIES[args.study]
    result, out = compare_study(study, args)
    record = {**provenance(), "study": name, "title": study["title"], "answers": answers_of(result, out),
              "compare": strip(result)}
    write_results(f"lowcomm-{name}", record, report(name, study, result, record["answers"]))
    draw_front(result, RESULTS / f"lowcomm-{name}-pareto.png")
    return record


def draw_front(result: dict[str, Any], path: Path) -> Path | None:
    """The bytes-against-time plane of the study's rows (every evaluation seed and the medians, the front joined),
    beside its results file."""
    from shoal.report.pareto import plot_pareto, points_of

    return plot_pareto(points_of(result["rows"]), path, "virtual seconds")


def answers_of(result: dict[str, Any], out: Path) -> dict[str, Any]:
    """Each question whose schemes the study ran (the image study runs a subset)."""
    rows = {r["scheme"]: r for r in result["rows"]}
    answers: dict[str, Any] = {"streaming_bytes_vs_bsp": bytes_ratio(rows[STREAMING], rows["bsp"]),
                               "streaming_vs_diloco": pairwise(result, STREAMING, "diloco"),
                               "peak_upload_vs_diloco": peak_ratio(rows[STREAMING], rows["diloco"])}
    if FP4 in rows:
        answers["fp4_bytes_vs_bsp"] = bytes_ratio(rows[FP4], rows["bsp"])
        answers["fp4_at_target"] = quality_at_target(out, rows[FP4], rows[STREAMING], result.get("target"))
    for key, scheme in (("post_local_vs_localsgd", POST_LOCAL), ("adacomm_vs_localsgd", ADACOMM)):
        if scheme in rows:
            answers[key] = {**pairwise(result, scheme, "localsgd"),
                            "bytes": bytes_ratio(rows[scheme], rows["localsgd"])}
    if ORDERED in rows:
        answers["least_similar_vs_staggered"] = pairwise(result, ORDERED, STREAMING)
    if WHOLE in rows:
        answers["split_vs_whole_tensors"] = pairwise(result, STREAMING, WHOLE)
        answers["peak_upload_whole_vs_diloco"] = peak_ratio(rows[WHOLE], rows["diloco"])
    low = [s for s in LOW_COMM if s in rows]
    best_low = min(low, key=lambda s: (rows[s]["time_to_target_s"] is None, rows[s]["time_to_target_s"] or 0.0))
    answers["sim_vs_best_low_comm"] = {**pairwise(result, "bsp+sim", best_low),
                                       "bytes": bytes_ratio(rows["bsp+sim"], rows[best_low])}
    answers["sim_at_matched_bytes"] = at_matched_bytes(out, rows["bsp+sim"], rows[best_low])
    answers["sim_vs_bsp"] = {**pairwise(result, "bsp+sim", "bsp"), "bytes": bytes_ratio(rows["bsp+sim"], rows["bsp"])}
    answers["pareto_front"] = front_of(result)
    if FP4 in rows:
        answers["issue_targets"] = issue_targets(answers, pairwise(result, FP4, "diloco"), rows)
    return answers


def issue_targets(answers: dict[str, Any], fp4_vs_diloco: dict[str, Any], rows: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 40's "Done means" for Streaming DiLoCo as the issue states them, each with what was measured and
    whether it holds: with fp4 outer gradients (the paper's setting) >= 100x fewer bytes to
    target than BSP and no later than tuned DiLoCo (medians); a peak upload of at most 1/fragments of DiLoCo's;
    fp4 costing at most 1% of the validation metric at the target against float32."""
    from shoal.config import load_config

    fragments = load_config(None, []).sync.streaming_diloco.fragments
    fewer, cost = answers["fp4_bytes_vs_bsp"]["fewer_x"], answers["fp4_at_target"].get("vs_base", {}).get("median")
    times = [rows[FP4]["time_to_target_s"], rows["diloco"]["time_to_target_s"]]
    peak = answers["peak_upload_vs_diloco"]["ratio"]
    return [
        {"target": "fp4: >= 100x fewer bytes to target than BSP (ratio of medians)", "measured": fewer,
         "met": fewer is not None and fewer >= 100},
        {"target": "fp4: median time to target no later than tuned DiLoCo's", "measured": times,
         "met": None not in times and times[0] <= times[1], "p_value": fp4_vs_diloco["p_value"]},
        {"target": f"peak upload per worker at most 1/{fragments} of DiLoCo's", "measured": peak,
         "met": peak is not None and peak <= 1 / fragments},
        {"target": "fp4 costs at most 1% of the metric at the target against float32 (median)", "measured": cost,
         "met": cost is not None and cost <= 0.01},
    ]


def front_of(result: dict[str, Any]) -> list[str]:
    """The schemes whose medians no other scheme beats on both time and bytes to target, fastest first."""
    from shoal.report.pareto import pareto_front, points_of

    return pareto_front([(p.scheme, *p.median) for p in points_of(result["rows"]) if p.median is not None])


def bytes_ratio(mine: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """How many times fewer bytes ``mine`` moved to the target than ``base``: the ratio of medians (None if either
    median never reached it), its bootstrap 95% interval (seeds resampled independently) and the Mann-Whitney p
    of the per-seed bytes (a seed that never reached the target counts as more bytes than any that did)."""
    from shoal.report.tuning import mann_whitney, speedup_interval

    a, b = mine.get("bytes_to_target"), base.get("bytes_to_target")
    mine_seeds, base_seeds = ([s.get("bytes_to_target") for s in row.get("seeds", [])] for row in (mine, base))
    ci = speedup_interval(base_seeds, mine_seeds)["ci95"]  # None without seeds
    return {"mine": a, "base": b, "fewer_x": None if not a or b is None else round(b / a, 3),
            "ci95": None if ci is None else [None if v is None else round(v, 3) for v in ci],
            "p_value": mann_whitney(mine_seeds, base_seeds)}


def peak_ratio(mine: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``mine``'s largest single upload of a worker over ``base``'s (medians over seeds)."""
    a, b = mine.get("peak_push_bytes"), base.get("peak_push_bytes")
    return {"mine": a, "base": b, "ratio": None if not a or not b else round(a / b, 4)}


def quality_at_target(out: Path, mine: dict[str, Any], base: dict[str, Any], target: float | None) -> dict[str, Any]:
    """Per seed, at the time ``base`` reached the target: ``mine``'s metric (its last evaluation by then) relative
    to the target (``per_seed``, ``median``, ``ci95``) and to ``base``'s own metric at that time (``vs_base``: what
    quantising cost, the quantity issue 40 bounds at 1%). Positive: worse, for a metric where lower is better."""
    vs_target, vs_base = [], []
    for m, b in zip(mine["seeds"], base["seeds"]):
        t = b.get("time_to_target_s")
        if t is None or target is None:
            continue
        value, base_value = _metric_at(out / m["run_dir"], t), _metric_at(out / b["run_dir"], t)
        if value is None:
            continue
        vs_target.append(round((value - target) / abs(target), 6))
        if base_value:
            vs_base.append(round((value - base_value) / abs(base_value), 6))
    return {**_median_of(vs_target), "vs_base": _median_of(vs_base)}


def at_matched_bytes(out: Path, mine: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Per seed, once ``base`` had moved the bytes it needed to reach the target: each scheme's metric at its last
    evaluation within that many bytes (the budget of the seed's ``base`` run), their medians with intervals, and
    the Mann-Whitney p of the two sets of per-seed values. This compares the two at matched bytes rather than each
    at its own bytes to target."""
    from shoal.report.tuning import mann_whitney

    budgets, values = [], {"mine": [], "base": []}
    for m, b in zip(mine["seeds"], base["seeds"]):
        budget = b.get("bytes_to_target")
        if budget is None:
            continue
        pair = _metric_at(out / m["run_dir"], budget, "bytes"), _metric_at(out / b["run_dir"], budget, "bytes")
        if None in pair:
            continue
        budgets.append(budget)
        values["mine"].append(pair[0])
        values["base"].append(pair[1])
    spacing = [_eval_spacing(out / m["run_dir"]) for m in mine["seeds"]]
    return {"mine": mine["scheme"], "base": base["scheme"],
            "budget_bytes": statistics.median(budgets) if budgets else None,
            "mine_eval_every_bytes": statistics.median([b for b in spacing if b is not None] or [0]) or None,
            "values": {k: _median_of(v) for k, v in values.items()},
            "p_value": mann_whitney(values["mine"], values["base"])}


def _eval_spacing(run_dir: Path) -> float | None:
    """The median bytes a run moved between two evaluations: how finely its metric is known against bytes."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    evals = (e for e in map(json.loads, (x for x in lines if '"eval"' in x)) if e["event"] == "eval")
    moved = sorted({e["bytes"] for e in evals if not e.get("refined")})  # the regular cadence, not run.eval_refine's
    return statistics.median(b - a for a, b in zip(moved, moved[1:])) if len(moved) > 1 else None


def _metric_at(run_dir: Path, limit: float, by: str = "t") -> float | None:
    """A run's metric at its last evaluation with ``by`` (``t``: virtual time; ``bytes``: bytes moved so far) at
    most ``limit`` (None: no evaluation by then, or no event log). Last by ``by``, not by line: the refined
    evaluations of run.eval_refine are written when the target is reached, after later regular ones."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    events = (json.loads(line) for line in lines if '"eval"' in line)
    evals = [e for e in events if e["event"] == "eval" and e.get(by, 0) <= limit]
    if not evals:
        return None
    last = max(range(len(evals)), key=lambda k: (evals[k].get(by, 0), k))
    return evals[last].get("value", evals[last].get("accuracy"))


def _median_of(changes: list[float]) -> dict[str, Any]:
    from shoal.report.tuning import interval

    return {"per_seed": changes, "median": statistics.median(changes) if changes else None,
            "ci95": interval(changes)["ci95"] if changes else None}


def report(name: str, study: dict[str, Any], result: dict[str, Any], answers: dict[str, Any]) -> str:
    lines = [evidence_markdown(name, study, result).replace("# Evidence:", "# Low communication:", 1), "",
             "| scheme | median bytes to target | peak upload per worker |", "|---|---:|---:|"]
    for row in result["rows"]:
        lines.append(f"| {row['scheme']} | {_bytes(row.get('bytes_to_target'))} | {_bytes(row.get('peak_push_bytes'))} |")
    return "\n".join(lines + [""] + answer_lines(answers)) + "\n"


def answer_lines(answers: dict[str, Any]) -> list[str]:
    """The study's answers in words, one paragraph each (the results file's and the README's)."""
    s, f = answers["streaming_bytes_vs_bsp"], answers.get("fp4_bytes_vs_bsp")
    with_fp4 = f", with fp4 {_fewer(f)}" if f else ""
    lines = [f"**Bytes to target against BSP** (ratio of medians; where given, its bootstrap 95% interval and the "
             f"Mann-Whitney p of the per-seed bytes): Streaming DiLoCo {_fewer(s)}{with_fp4}."]
    for key, title in (("streaming_vs_diloco", "Streaming DiLoCo against tuned DiLoCo"),
                       ("post_local_vs_localsgd", "Post-local SGD against fixed-H local SGD"),
                       ("adacomm_vs_localsgd", "AdaComm against fixed-H local SGD"),
                       ("split_vs_whole_tensors", "Streaming DiLoCo's equal fragments (tensors cut) against "
                                                  "fragments of whole tensors"),
                       ("least_similar_vs_staggered", "Streaming DiLoCo, least similar fragment first, against "
                                                      "the staggered order"),
                       ("sim_vs_best_low_comm", "SIM against the best low-communication scheme"),
                       ("sim_vs_bsp", "SIM against the BSP it runs on")):
        if key not in answers:
            continue
        a = answers[key]
        sp, ci, p = a["speedup"]["value"], a["speedup"].get("ci95"), a["p_value"]
        interval = f" (95% interval {_x(ci[0])}..{_x(ci[1])})" if ci else ""
        extra = f"; bytes: {_fewer(a['bytes'])}" if "bytes" in a else ""
        lines += ["", f"**{title}** ({a['mine']} vs {a['base']}): speed-up of medians {_x(sp)}{interval}, "
                      f"Mann-Whitney p = {'-' if p is None else f'{p:.3g}'}{extra}."]
    if "sim_at_matched_bytes" in answers:
        lines += ["", matched_bytes_line(answers["sim_at_matched_bytes"])]
    if "pareto_front" in answers:
        lines += ["", "**Pareto front** (medians: no other scheme reaches the target both sooner and with fewer "
                      "bytes; every seed in `-pareto.png` beside the results file): "
                      + ", ".join(f"`{scheme}`" for scheme in answers["pareto_front"]) + "."]
    for target in answers.get("issue_targets", []):
        lines += ["", f"**Issue 40, {target['target']}**: {'met' if target['met'] else '**not met**'} "
                      f"(measured: {_measured(target['measured'])}"
                      + (f", p = {target['p_value']:.3g}" if target.get("p_value") is not None else "") + ")."]
    peak = answers["peak_upload_vs_diloco"]
    whole = answers.get("peak_upload_whole_vs_diloco")
    with_whole = f"; with fragments of whole tensors, {whole['ratio']}" if whole else ""
    lines += ["", f"**Peak upload**: Streaming DiLoCo's is {peak['ratio']} of DiLoCo's{with_whole}."]
    if "fp4_at_target" in answers:
        quality = answers["fp4_at_target"]
        against_float32 = "" if "vs_base" not in quality else \
            f"{_change(quality['vs_base'])} from float32's at that time and "
        lines += ["", f"**fp4 at the target**: when float32 Streaming DiLoCo reached the target, fp4's metric was "
                      f"{against_float32}{_change(quality)} from the target (medians over seeds)."]
    return lines


def matched_bytes_line(matched: dict[str, Any]) -> str:
    """``at_matched_bytes``' answer in words."""
    def said(v: dict[str, Any]) -> str:
        ci = v.get("ci95")
        interval = f" (95% interval {ci[0]:.4g}..{ci[1]:.4g})" if ci and None not in ci else ""
        return "-" if v["median"] is None else f"{v['median']:.4g}{interval}"

    p = matched["p_value"]
    return (f"**SIM at matched bytes** ({matched['mine']} vs {matched['base']}): once {matched['base']} had moved "
            f"the bytes it needed to reach the target (median {_bytes(matched['budget_bytes'])} per seed), the "
            f"metric at each run's last evaluation within that budget was {said(matched['values']['mine'])} for "
            f"{matched['mine']} against {said(matched['values']['base'])} for {matched['base']} (medians over "
            f"seeds); Mann-Whitney p = {'-' if p is None else f'{p:.3g}'}. {matched['mine']} was evaluated every "
            f"{_bytes(matched['mine_eval_every_bytes'])} of its traffic, so its value is that of its last evaluation "
            "by then, not of the exact budget.")


def _measured(value: Any) -> str:
    """A target's measurement in words: a number, or two medians (this row's and the one it is held to)."""
    if isinstance(value, list):
        return " against ".join("never" if v is None else f"{v:.1f} s" for v in value)
    return "-" if value is None else f"{value:.4g}"


def _change(quality: dict[str, Any]) -> str:
    """A median relative change with its interval, in percent."""
    q, ci = quality["median"], quality.get("ci95")
    said = "-" if q is None else f"{100 * q:+.2f}%"
    if ci and None not in ci:
        said += f" (95% interval {100 * ci[0]:+.2f}%..{100 * ci[1]:+.2f}%)"
    return said


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.1f} MB" if value >= 1e6 else f"{value / 1e3:.1f} KB"


def _fewer(ratio: dict[str, Any]) -> str:
    """``bytes_ratio``'s answer in words: "20.00x fewer (interval 18.10x..21.90x, p = 0.00016)", or "16.50x more"
    where the scheme moved more bytes (the ratio and its interval turned over)."""
    value, ci, p = ratio["fewer_x"], ratio.get("ci95"), ratio.get("p_value")
    word = "fewer"
    if value is not None and 0 < value < 1:
        value, word = 1 / value, "more"
        ci = None if not ci else [None if v in (None, 0) else 1 / v for v in reversed(ci)]
    interval = f"interval {_x(ci[0])}..{_x(ci[1])}, " if ci else ""
    said = f"{interval}p = {p:.2g}" if p is not None else interval.removesuffix(", ")
    return f"{_x(value)} {word}" + (f" ({said})" if said else "")


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


if __name__ == "__main__":
    main(sys.argv[1:])
