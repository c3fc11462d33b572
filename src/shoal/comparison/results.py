"""compare.json: one row per scheme with its interval and p-value, the protocol, the warnings a reader needs,
and where the numbers came from (commit, frozen defaults, CPU)."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from shoal.comparison.plan import PlannedRun, tuning_entries
from shoal.config import Config
from shoal.report.protocol import Protocol
from shoal.report.rows import add_significance, add_speedups, seeds_row, single_row
from shoal.report.schemes import Scheme
from shoal.report.tuning import edge_margins


def build_compare(plan: list[PlannedRun], summaries: list[dict[str, Any]], protocol: Protocol, command: str,
                  tuning: list[tuple[PlannedRun, dict[str, Any]]] = (), base_seed: int = 0,
                  parsed: list[Scheme] = ()) -> dict[str, Any]:
    """compare.json: what was compared and how, and one row per scheme (its evaluation seeds at its kept point) with
    the speed-up over BSP and the p-value against the best baseline."""
    names = list(dict.fromkeys(p.scheme for p in plan))
    rows = []
    for name in names:
        runs = [(p, s) for p, s in zip(plan, summaries) if p.scheme == name]
        if len(runs) == 1:
            row = single_row(name, runs[0][1], runs[0][0].run_dir)
        else:
            row = seeds_row(name, [s for _, s in runs], [p.run_dir for p, _ in runs], [p.seed for p, _ in runs])
        if protocol.tune_seeds:
            row["tuned"] = dict(runs[0][0].point)
            row["tuning"] = tuning_entries(list(tuning), name)
        if runs[0][0].pinned:
            row["pinned"] = dict(runs[0][0].pinned)
        rows.append(row)
    schemes = {s.name: s for s in parsed}
    grids = {n: protocol.scheme_grid(schemes[n]) for n in names if n in schemes} if protocol.tune_seeds else {}
    first = plan[0].cfg
    every_run = list(summaries) + [s for _, s in tuning]  # evaluation and development runs alike
    return {
        "command": command,
        "provenance": provenance(),
        "schemes": names,
        "seeds": protocol.seeds,
        "tune": protocol.grid,
        "tune_seeds": protocol.tune_seeds,
        "widen": protocol.widen,
        "tuning_seeds": protocol.tuning_seeds(base_seed),
        "eval_seeds": protocol.eval_seeds(base_seed),
        "grids": grids,
        "backend": first.backend.name,
        "metric": first.task.metric,
        "target": first.run.target,
        "target_accuracy": first.run.target_accuracy,
        "max_time_s": first.run.max_time_s,
        "rows": add_significance(add_speedups(rows), {n for n, s in schemes.items() if s.baseline}),
        "machines": machines(every_run),
        "commits": commits(every_run),
        "warnings": resolution_warnings(rows, first) + tuning_warnings(rows, grids) + machine_warnings(every_run),
    }


#: evaluations a time to target needs before it means something (docs/fair-comparison.md)
MIN_EVALUATIONS = 20


def resolution_warnings(rows: list[dict[str, Any]], cfg: Config) -> list[str]:
    """Rows whose time to target spans fewer than MIN_EVALUATIONS evaluations: one evaluation tick is then a large
    share of the quantity compared. With run.eval_refine = N a time to target is resolved to 1/N of a period, so a
    tick is that."""
    warnings = []
    every_it, every_s, refine = cfg.run.eval_every_iterations, cfg.run.eval_every_s, cfg.run.eval_refine
    for row in rows:
        ttt = row.get("time_to_target_s")
        if ttt is None:
            continue
        ticks = refine * ((row.get("iterations") or 0) / every_it if every_it else ttt / every_s)
        if ticks < MIN_EVALUATIONS:
            unit = (f"every {every_it} iterations" if every_it else f"every {every_s:g} s") + (
                f", refined {refine}x" if refine > 1 else "")
            warnings.append(f"resolution: {row['scheme']}'s time to target spans {ticks:.0f} evaluations ({unit}), "
                            f"fewer than {MIN_EVALUATIONS}; evaluate more often (run.eval_every_s or "
                            "run.eval_every_iterations)")
    return warnings


def machines(summaries: list[dict[str, Any]]) -> dict[str, int]:
    """How many of the runs each kind of CPU computed ("unrecorded": runs written before summaries said)."""
    return _most_first(Counter((s.get("machine") or {}).get("cpu") or "unrecorded" for s in summaries))


def commits(summaries: list[dict[str, Any]]) -> dict[str, int]:
    """How many of the runs each commit of shoal made (its first 10 hex digits, "+dirty" where src/ had
    uncommitted changes; "unrecorded" outside a git checkout or before summaries said). A comparison resumed over
    weeks reuses a run only when its config is the same by value, not its code: this says which code ran."""
    def label(code: dict[str, Any]) -> str:
        commit = code.get("commit")
        return "unrecorded" if not commit else commit[:10] + ("+dirty" if code.get("dirty") else "")

    return _most_first(Counter(label(s.get("code") or {}) for s in summaries))


def _most_first(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def machine_warnings(summaries: list[dict[str, Any]]) -> list[str]:
    """A comparison whose runs several kinds of CPU computed: each run repeats exactly only on its own kind."""
    kinds = {k: n for k, n in machines(summaries).items() if k != "unrecorded"}
    if len(kinds) < 2:
        return []
    listed = "; ".join(f"{k}: {n}" for k, n in kinds.items())
    return [f"machines: the runs were computed on {len(kinds)} kinds of CPU ({listed}); a run repeats bit for bit "
            "only on its own kind (summary.json's machine.cpu), and a seed rerun on another is another sample of "
            "the same distribution"]


def tuning_warnings(rows: list[dict[str, Any]], grids: dict[str, dict[str, list[Any]]]) -> list[str]:
    """Schemes that kept the smallest or largest value of a grid: their best may lie beyond it."""
    warnings = []
    for row in rows:
        for m in edge_margins(row, grids):
            side = "smallest" if m["kept"] < m["next"] else "largest"  # the next value in lies on the grid's side
            out = "" if m["beyond"] is None else f" (next value out: {m['beyond']})"
            warnings.append(f"tuning: {row['scheme']} kept {m['key']} = {m['kept']}, the {side} value of its "
                            f"grid {grids[row['scheme']][m['key']]}{_margin_words(m)}: its best may lie beyond the "
                            f"grid; widen it{out}: --widen 1 (with --resume) adds a value past each end of every "
                            "scheme's grid alike")
    return warnings


def _margin_words(margin: dict[str, Any]) -> str:
    """The kept end against the next value in, on the development seeds (empty without a tuning record)."""
    if margin["kept_s"] is None:
        return ""
    other = "never" if margin["next_s"] is None else f"{margin['next_s']:.4g} s"
    return f" (median time to target on the development seeds {margin['kept_s']:.4g} s; {margin['next']}: {other})"


def cpu_model() -> str:
    """The processor's model name (``shoal.runner.cpu_model``; imported when asked, as the runner pulls in
    torch)."""
    from shoal.runner import cpu_model as model

    return model()


def provenance() -> dict[str, Any]:
    """Which shoal, when and where a comparison ran (the report's footer)."""
    import importlib.metadata
    import platform

    from shoal import __version__

    return {"shoal": __version__, "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
            "python": platform.python_version(), "platform": platform.platform(terse=True),
            "cpu": cpu_model(), "torch": importlib.metadata.version("torch"), **git_provenance()}


#: where every default lives: the config sections (each key's default) and the schemes (their own grids)
DEFAULT_PATHS = ("src/shoal/config", "src/shoal/sync")


def defaults_digest() -> str:
    """A hash of every default of the config and every scheme's own grid: two comparisons with the same digest ran
    with the same defaults, whatever else changed in the code."""
    import hashlib

    from shoal.registry import SCHEMES

    grids = {name: [list(k) for k in e.item.grid] for name, e in SCHEMES.entries().items()}
    text = json.dumps([Config().model_dump(mode="json"), grids], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_provenance() -> dict[str, Any]:
    """The commit of the code that ran, the commit at which the defaults were last changed (frozen), and the
    defaults' digest.

    ``defaults_dirty`` is true when the defaults' files have uncommitted
    changes: such a results file was not produced with frozen defaults. The
    commits are left out outside a git checkout of shoal (an installed wheel).
    """
    from shoal.runner import code_version, git

    code = code_version()
    if "commit" not in code:
        return {"defaults_digest": defaults_digest()}
    return {"defaults_digest": defaults_digest(), "commit": code["commit"], "dirty": code["dirty"],
            "defaults_commit": git("log", "-1", "--format=%H", "--", *DEFAULT_PATHS) or None,
            "defaults_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", *DEFAULT_PATHS))}
