"""The evidence studies: every scheme on a workload that matters, under the held-out protocol of shoal compare.

Each study is one ``shoal compare`` (shoal.comparison.run_comparison): every
scheme tunes its own knobs (3 points each) on the development seeds, the
point it keeps runs on >= 10 evaluation seeds after them, and each row
carries its median time to target, a bootstrap 95% interval, the share of
seeds that reached the target and a Mann-Whitney p-value against the best
baseline (docs/fair-comparison.md). The results file holds every seed's
numbers, the commit of the code and the commit at which the defaults were
last changed.

Usage:
    .venv/bin/python benchmarks/evidence.py STUDY [--jobs 2] [--seeds 10] [--tune-seeds 2] [--resume]
    .venv/bin/python benchmarks/evidence.py --list

The runs go to runs/evidence/STUDY (``--resume`` keeps its finished runs, so a
study cut off by the end of a session goes on where it stopped); the results
to benchmarks/results/evidence-STUDY.{json,md}.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any

from tuned import ROOT, provenance, write_results

TIERS_16 = "cluster.speeds=[1,1,1,1,2,2,2,2,4,4,4,4,8,8,8,8]"
LOGNORMAL_16 = ["cluster.workers=16", "cluster.profile=lognormal", "cluster.lognormal_sigma=1.0"]
LM = {"config": "examples/stdlib_lm.toml", "sets": ["run.max_time_s=400", "run.max_iterations=10000",
                                                   "backend.log_iterations=false"]}
SCHEMES = "bsp,asp,ssp,gssp,localsgd,diloco"
#: the BN image workload (docs/workloads.md); a run costs about three times a transformer run on this CPU
SHAPES = {"config": "examples/shapes_bn.toml", "sets": ["run.max_time_s=400", "backend.log_iterations=false"]}
#: NHWC convolutions, the same network faster on this CPU (benchmarks/results/conv_layout.md): every image study
#: started after the option existed computes with it; lowcomm.py shapes-1g, started before, keeps SHAPES
NHWC = "model.options={width = 16, channels_last = true}"
#: times to target resolved to 1/8 of the evaluation period (run.eval_refine, docs/fair-comparison.md rule 4): BSP
#: reaches the image target in about 2,240 iterations, 14 evaluations of one every 160, under the protocol's 20.
#: Evaluating every 80 would cost about a fifth more per run (evaluations are a fifth of a run's time) for a tick of
#: 80 iterations; refining costs at most 7 evaluations per run for a tick of 20
REFINED = "run.eval_refine=8"
#: the image workload as a study started from here on runs it (lowcomm.py shapes-1g, started before both, keeps SHAPES)
SHAPES_CURRENT = {**SHAPES, "sets": SHAPES["sets"] + [NHWC, REFINED]}

#: study name -> the config, its overrides and the schemes compared
STUDIES: dict[str, dict[str, Any]] = {
    "lm-tiers-iid": {**LM, "sets": LM["sets"] + [TIERS_16], "schemes": SCHEMES,
                     "title": "byte transformer on the stdlib, 16 workers in four speed tiers (1x, 2x, 4x, 8x), IID"},
    "lm-tiers-by_source": {**LM, "sets": LM["sets"] + [TIERS_16, "data.partition=by_source"], "schemes": SCHEMES,
                           "title": "byte transformer on the stdlib, 16 tiered workers, non-IID (by_source)"},
    "lm-lognormal-iid": {**LM, "sets": LM["sets"] + LOGNORMAL_16, "schemes": SCHEMES,
                         "title": "byte transformer on the stdlib, 16 lognormal workers (sigma 1), IID"},
    "lm-tiers-compression": {**LM, "sets": LM["sets"] + [TIERS_16], "schemes": "bsp,bsp+topk,bsp+powersgd,gssp+gdtopk,bsp+ina",
                             "title": "byte transformer on the stdlib, 16 tiered workers: compression and in-network aggregation"},
    "shapes-tiers-iid": {**SHAPES_CURRENT, "sets": SHAPES_CURRENT["sets"] + [TIERS_16], "schemes": SCHEMES,
                         "title": "BN ResNet-18 (width 16) on shapes, 16 workers in four speed tiers, IID"},
    # the image workload on the other cluster and on non-IID shards: the matrix of issue 38 on both workloads
    # (shapes-lognormal-iid shares every run with balance.py shapes-lognormal)
    "shapes-lognormal-iid": {**SHAPES_CURRENT, "sets": SHAPES_CURRENT["sets"] + LOGNORMAL_16, "schemes": SCHEMES,
                             "title": "BN ResNet-18 (width 16) on shapes, 16 lognormal workers (sigma 1), IID"},
    "shapes-tiers-dirichlet": {**SHAPES_CURRENT,
                               "sets": SHAPES_CURRENT["sets"] + [TIERS_16, 'data.partition="dirichlet:0.5"'],
                               "schemes": SCHEMES,
                               "title": "BN ResNet-18 (width 16) on shapes, 16 tiered workers, non-IID (Dirichlet 0.5)"},
}
for _name, _study in STUDIES.items():
    _study["folder"] = _name  # runs/evidence/STUDY


def main(argv: list[str]) -> None:
    args = study_args(__doc__, STUDIES, argv)
    if args is not None:
        run_study(args)


def run_study(args: argparse.Namespace) -> dict[str, Any]:
    name, study = args.study, STUDIES[args.study]
    result, _ = compare_study(study, args)
    record = {**provenance(), "study": name, "title": study["title"], "compare": strip(result)}
    write_results(f"evidence-{name}", record, markdown(name, study, result))
    return record


def study_parser(doc: str, studies: dict[str, dict[str, Any]]) -> argparse.ArgumentParser:
    """The command line every study script shares (evidence.py, balance.py, lowcomm.py)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("study", nargs="?", choices=sorted(studies))
    parser.add_argument("--list", action="store_true", help="list the studies")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=10, help="evaluation seeds (>= 10 for a claim)")
    parser.add_argument("--tune-seeds", type=int, default=2, help="development seeds")
    parser.add_argument("--resume", action="store_true", help="keep the finished runs (other studies' too)")
    return parser


def study_args(doc: str, studies: dict[str, dict[str, Any]], argv: list[str]) -> argparse.Namespace | None:
    """``study_parser``'s arguments; None after --list or without a study named (the list is printed)."""
    args = study_parser(doc, studies).parse_args(argv)
    if args.list or not args.study:
        list_studies(studies, args)
        return None
    return args


def list_studies(studies: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """One line per study: what it compares, where its runs go and how many of them have finished."""
    for name, study in studies.items():
        walls, planned = progress(study, args.seeds, args.tune_seeds)
        others = () if walls else workload_walls(ROOT / study["config"], ROOT / "runs" / "evidence")
        print(f"{name}: {study['title']} ({study['schemes']}); {len(walls)} of {planned} runs done in "
              f"runs/evidence/{study['folder']}{time_left(walls, planned, args.jobs, others)}")


def time_left(walls: list[float], planned: int, jobs: int, others: tuple[float, ...] = ()) -> str:
    """The wall time the study's remaining runs should take, from the median of its finished ones (a guess: a
    scheme's runs differ several-fold; what is left is often the slow schemes' evaluation seeds). A study with no
    finished run is guessed from ``others``, the runs of other studies on its workload (clusters differ more)."""
    left = planned - len(walls)
    if not left or not (walls or others):
        return ""
    median = statistics.median(walls or others)
    source = "median run" if walls else "guessed from the workload's other studies: median run"
    return f"; about {left * median / max(jobs, 1) / 3600:.1f} h left at --jobs {jobs} ({source} {median / 60:.0f} min)"


@functools.cache  # one scan of the run folders per workload, however many studies have not started
def workload_walls(config: Path, runs: Path) -> tuple[float, ...]:
    """The wall seconds of every finished run under ``runs`` whose model is ``config``'s (its workload)."""
    model = tomllib.loads(config.read_text()).get("model", {}).get("name")
    walls = []
    for summary in runs.glob("*/**/summary.json"):
        try:
            ran = tomllib.loads((summary.parent / "config.toml").read_text()).get("model", {}).get("name")
            wall = json.loads(summary.read_text()).get("wall_s")
        except (OSError, ValueError):
            continue
        if ran == model and wall:
            walls.append(float(wall))
    return tuple(walls)


def compare_study(study: dict[str, Any], args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """Run (or resume) one study's comparison in runs/evidence/FOLDER: its result and that folder. Stopped (Ctrl-C,
    or FOLDER/STOP after the runs in flight: ``studies.sh --drain``), it says so in one line and exits 130."""
    from shoal.comparison import Interrupted, phase_of, run_comparison

    out = ROOT / "runs" / "evidence" / study["folder"]
    sets, tune_seeds = study_protocol(study, args.tune_seeds)
    try:
        result, _ = run_comparison(ROOT / study["config"], study["schemes"], args.seeds, sets, out, overwrite=False,
                                   quiet=False, tune=[], tune_seeds=tune_seeds, jobs=args.jobs, resume=args.resume)
    except Interrupted as stop:
        how = "stopped after the runs in flight" if stop.drained else "interrupted"
        print(f"{study['folder']}: {how}; {len(stop.finished)} of {len(stop.plan)} runs of its {phase_of(stop.plan)} "
              "phase finished, --resume goes on", file=sys.stderr)
        raise SystemExit(130) from None
    return result, out


def study_protocol(study: dict[str, Any], tune_seeds: int) -> tuple[list[str], int]:
    """The study's overrides and development seeds: the same for every study, so that runs of the same config
    pair up seed for seed and folder for folder (``SCHEME/seed-K``) and two studies in one folder share them."""
    return list(study["sets"]), tune_seeds


def progress(study: dict[str, Any], seeds: int, tune_seeds: int) -> tuple[list[float], int]:
    """The wall seconds of each finished run of a study in runs/evidence/FOLDER (under the planned configs), and
    how many runs it plans."""
    from shoal.comparison import Protocol, evaluation_runs, finished_summary, plan_runs
    from shoal.report.schemes import parse_schemes

    out = ROOT / "runs" / "evidence" / study["folder"]
    sets, tune_seeds = study_protocol(study, tune_seeds)
    config, schemes = ROOT / study["config"], parse_schemes(study["schemes"])
    protocol = Protocol(seeds, tune_seeds)
    tuning = plan_runs(config, schemes, protocol, sets) if tune_seeds else []  # without: the evaluation plan
    summaries = [finished_summary(out / run.run_dir, run.cfg) for run in tuning]
    evaluation = [run for s in schemes for run in evaluation_runs(config, s, protocol, sets, {})]
    summaries += [_summary(out / run.run_dir) for run in evaluation]
    walls = [float(s.get("wall_s") or 0.0) for s in summaries if s is not None]
    return walls, len(tuning) + len(evaluation)


def _summary(run_dir: Path) -> dict[str, Any] | None:
    """A finished evaluation run's summary (its config is the kept point's, known only once tuning is done)."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


ALPHA = 0.05  # a difference counts when its p-value is under this


def verdict(row: dict[str, Any], best: dict[str, Any] | None) -> str:
    """wins, loses or ties against the best baseline: the median decides the direction, the p-value whether it
    counts."""
    if best is None or row is best:
        return "best baseline" if row is best else "-"
    p, mine, theirs = row.get("p_value"), row.get("time_to_target_s"), best.get("time_to_target_s")
    if p is None or p >= ALPHA:
        return "ties"
    if mine is None:
        return "loses"
    return "wins" if theirs is None or mine < theirs else "loses"


def strip(result: dict[str, Any]) -> dict[str, Any]:
    """compare.json without the per-worker detail: the results file keeps what a reader checks (every seed)."""
    rows = [{k: v for k, v in row.items() if k not in ("per_worker", "groups")} for row in result["rows"]]
    return {**result, "rows": rows}


def _machines(result: dict[str, Any]) -> str:
    """Which CPUs computed the runs (a study spans sessions, and its machine may change between them); before
    runs recorded it, the CPU that wrote the results."""
    counts = result.get("machines") or {}
    if not counts:
        return str(result["provenance"].get("cpu"))
    if set(counts) == {"unrecorded"}:
        return (f"written on {result['provenance'].get('cpu')}; the runs' CPU is not recorded (they predate "
                "summary.json's machine)")
    return "runs computed on " + ", ".join(f"{cpu} ({n})" for cpu, n in counts.items()) + (
        "; unrecorded: runs written before summary.json said" if "unrecorded" in counts else "")


def _commits(result: dict[str, Any]) -> str:
    """Which commits of shoal made the runs (a study resumed across sessions reuses a run whose config is the same
    by value, whatever code made it)."""
    counts = {k: n for k, n in (result.get("commits") or {}).items()}
    if len(counts) < 2:
        return ""
    listed = ", ".join(f"{commit} ({n})" for commit, n in counts.items())
    return f" Its runs come from {len(counts)} commits: {listed}."


def markdown(name: str, study: dict[str, Any], result: dict[str, Any]) -> str:
    prov = result["provenance"]
    lines = [
        f"# Evidence: {study['title']}", "",
        f"`{result['command']}`", "",
        f"Target: {result['metric']} {'<=' if result['metric'] != 'accuracy' else '>='} "
        f"{result['target'] if result['target'] is not None else result['target_accuracy']}; "
        f"{_tuning(result)} number from evaluation seeds "
        f"{result['eval_seeds'][0]}..{result['eval_seeds'][-1]} ({len(result['eval_seeds'])}). "
        f"Code {str(prov.get('commit'))[:10]}{' (dirty)' if prov.get('dirty') else ''}; defaults frozen at "
        f"{str(prov.get('defaults_commit'))[:10]}{' (uncommitted changes!)' if prov.get('defaults_dirty') else ''}; "
        f"{_machines(result)}.{_commits(result)}", "",
        "| scheme | kept point | median time to target (s) | 95% interval | reached | p vs best baseline | "
        "per-seed times (s) |",
        "|---|---|---:|---|---:|---|---|",
    ]
    for row in result["rows"]:
        iv = (row.get("time_to_target_interval") or {}).get("ci95")
        per_seed = ", ".join("never" if s["time_to_target_s"] is None else f"{s['time_to_target_s']:g}"
                             for s in row.get("seeds", []))
        interval = "-" if not iv else f"{_t(iv[0])}..{_t(iv[1])}"
        lines.append(
            f"| {row['scheme']} | {_point(row.get('tuned'))} | {_t(row['time_to_target_s'])} | {interval} | "
            f"{row.get('reached', 0)}/{len(row.get('seeds', []))} | {_p(row)} | {per_seed} |")
    if result.get("warnings"):  # what compare warned of (a grid edge kept, a coarse resolution) belongs in the file
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in result["warnings"]]
    return "\n".join(lines) + "\n"


def _tuning(result: dict[str, Any]) -> str:
    if result["tuning_seeds"]:
        return f"tuned on development seeds {result['tuning_seeds']}, every"
    return "no scheme has a knob to tune (no development seeds); every"


def _p(row: dict[str, Any]) -> str:
    if row["scheme"] == row.get("versus"):
        return "(best baseline)"
    return "-" if row.get("p_value") is None else f"{row['p_value']:.3g} vs {row['versus']}"


def _point(point: dict[str, Any] | None) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in (point or {}).items()) or "-"


def _t(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}"


if __name__ == "__main__":
    main(sys.argv[1:])
