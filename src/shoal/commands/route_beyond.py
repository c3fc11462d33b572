"""`shoal route` beyond one job and one PS: a sharded model (--ps-count), several jobs (--jobs), failures (--fail).

Each mode plans, scores with the joint evaluator and prints a table or JSON;
`route` decides which mode runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from shoal.commands.common import fmt_number, table_console
from shoal.network.algorithms import _clean

if TYPE_CHECKING:
    import networkx as nx

    from shoal.network import Instance
    from shoal.network.joint import Job


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], footer: str = "") -> None:
    console = table_console()
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if footer:
        console.print(footer)


# --------------------------------------------------------------------------- several PSs


def run_sharded(inst: Instance, servers: list[str], algos: list[str], seed: int, time_limit: float, as_json: bool) -> None:
    from shoal.network import solve
    from shoal.network.algorithms.budget import Deadline
    from shoal.network.joint import plan_sharded, plan_sharded_by

    results: dict[str, Any] = {}
    for algo in algos:
        res = plan_sharded(inst, servers, deadline=Deadline(time_limit)) if algo == "grid" else plan_sharded_by(inst, servers, algo, seed, time_limit)
        results[algo] = res
    one_ps = solve(inst, "grid", seed, time_limit_s=time_limit) if "grid" in algos else None
    if as_json:
        out = {"instance": {**inst.describe(), "servers": servers},
               "results": {a: (r.to_json() if r is not None else {"status": "time limit"}) for a, r in results.items()}}
        if one_ps is not None:
            out["one_ps_grid_gbps"] = one_ps.evaluation.min_rate_gbps if one_ps.evaluation else None
        typer.echo(json.dumps(_clean(out), indent=2))
        return
    rows = []
    for algo, r in results.items():
        if r is None:
            rows.append([algo, "time limit", "-", "-", "-", "-", "-"])
            continue
        worst = max((v.factor for v in r.evaluation.violations), default=None)
        rows.append([algo, fmt_number(r.min_rate_gbps, 3), fmt_number(r.stream_rate_gbps, 3), fmt_number(r.bound_gbps), r.evaluation.bottleneck,
                     "0" if worst is None else f"{len(r.evaluation.violations)} (worst x{fmt_number(worst)})", f"{r.solve_s:.3f}"])
    footer = (f"{len(servers)} PSs ({', '.join(servers)}), the model in {len(servers)} equal shards: a worker sends one stream per shard, "
              "so its gradient rate (min rate) is PS count x stream rate. grid plans the shards together; the others plan each shard alone.")
    if one_ps is not None and one_ps.evaluation is not None:
        footer += f" With one PS ({inst.ps}) grid reaches {one_ps.evaluation.min_rate_gbps:.3f} Gbps."
    _table(f"{inst.graph.graph.get('name')}: {len(inst.workers)} workers, {len(servers)} PSs, B={inst.ps_gbps:g} Gbps each, T={inst.worker_gbps:g} Gbps",
           ["algorithm", "min rate Gbps", "stream rate", "bound", "bottleneck", "violations", "solve s"], rows, footer)


# --------------------------------------------------------------------------- several jobs


def run_jobs(graph: nx.Graph, jobs: list[Job], seed: int, time_limit: float, as_json: bool) -> None:
    from shoal.network import solve
    from shoal.network.algorithms.budget import Deadline
    from shoal.network.joint import Part, evaluate_joint, plan_jobs
    from shoal.network.routing import Routes

    routes = Routes(graph)
    joint = plan_jobs(graph, jobs, routes, Deadline(time_limit))
    alone = [solve(j.inst, "grid", seed, routes, time_limit) for j in jobs]  # each job planned as if it had the network to itself
    solo_parts = [Part(j.inst, r.plan, r.evaluation.min_rate_gbps, j.slots) for j, r in zip(jobs, alone) if r.plan is not None and r.evaluation is not None]
    solo = evaluate_joint(graph, solo_parts, routes)
    if as_json:
        out = {"jobs": len(jobs), "joint": joint.to_json(),
               "each_alone": {"rates_gbps": {j.name: p.rate_gbps for j, p in zip(jobs, solo_parts)}, "feasible_together": solo.feasible,
                              "violations": len(solo.violations), "common_slowdown": solo.scale}}
        typer.echo(json.dumps(_clean(out), indent=2))
        return
    rows = [[name, p.inst.ps, str(len(p.inst.workers)), fmt_number(p.rate_gbps, 3), fmt_number(solo_p.rate_gbps, 3), str(p.slots)]
            for name, p, solo_p in zip(joint.names, joint.parts, solo_parts)]
    ev = joint.evaluation
    footer = (f"joint (max-min fair): every job reaches {joint.common_rate_gbps:.3f} Gbps at once, then each is raised as far as the others allow; "
              f"{'feasible' if ev.feasible else f'{len(ev.violations)} violations'} under the joint evaluator. "
              f"Each job planned alone: {'feasible together' if solo.feasible else f'{len(solo.violations)} violations together'}"
              + ("" if solo.feasible else _why(solo)) + ".")
    _table(f"{graph.graph.get('name')}: {len(jobs)} jobs sharing the switches", ["job", "PS", "workers", "joint rate Gbps", "alone Gbps", "slots/switch"],
           rows, footer)


def _why(ev: Any) -> str:
    if any(v.kind == "switch_slots" for v in ev.violations):
        return ": a switch's aggregator slots are over-committed, which no slow-down fixes"
    return f": every job would have to slow to x{ev.scale:.2f}"


# --------------------------------------------------------------------------- failures


def run_failure(inst: Instance, specs: list[str], seed: int, time_limit: float, as_json: bool) -> None:
    from shoal.network import evaluate, solve
    from shoal.network.algorithms.budget import Deadline
    from shoal.network.replan import apply_failure, parse_failures, replan

    failure = parse_failures(inst.graph, specs)
    before = solve(inst, "grid", seed, time_limit_s=time_limit)
    if before.plan is None or before.evaluation is None:
        from shoal.errors import ConfigError

        raise ConfigError("--fail: grid found no plan within the time limit, so there is nothing to repair")
    repaired = replan(inst, before.plan, failure, Deadline(time_limit))  # its time includes applying the failure
    start = time.perf_counter()
    after = apply_failure(inst, failure)
    full = solve(after, "grid", seed, time_limit_s=time_limit)
    full_s = time.perf_counter() - start  # so does this one
    as_is = evaluate(after, before.plan)
    full_rate = full.evaluation.min_rate_gbps if full.evaluation else None
    if as_json:
        out = {"failed": {"links": [list(x) for x in failure.links], "switches": list(failure.switches)},
               "before": {"min_rate_gbps": before.evaluation.min_rate_gbps, "solve_s": before.solve_s},
               "unchanged_plan_after": {"min_rate_gbps": as_is.min_rate_gbps, "bottleneck": as_is.bottleneck},
               "replan": {"min_rate_gbps": repaired.evaluation.min_rate_gbps, "violations": [v.to_json() for v in repaired.evaluation.violations],
                          "affected_workers": list(repaired.affected), "solve_s": repaired.solve_s, "notes": repaired.notes},
               "full_solve": {"min_rate_gbps": full_rate, "solve_s": full_s},
               "speedup": full_s / repaired.solve_s if repaired.solve_s > 0 else None}
        typer.echo(json.dumps(_clean(out), indent=2))
        return
    rows = [["before the failure", fmt_number(before.evaluation.min_rate_gbps, 3), "-", f"{before.solve_s:.3f}"],
            ["same plan after it", fmt_number(as_is.min_rate_gbps, 3), "-", "-"],
            ["incremental re-plan", fmt_number(repaired.evaluation.min_rate_gbps, 3), str(len(repaired.affected)), f"{repaired.solve_s:.3f}"],
            ["full re-solve", fmt_number(full_rate, 3), str(len(inst.workers)), f"{full_s:.3f}"]]
    what = ", ".join([f"{u}-{v}" for u, v in failure.links] + list(failure.switches))
    _table(f"grid after {what} failed: {len(inst.workers)} workers", ["plan", "min rate Gbps", "re-planned workers", "solve s"], rows,
           f"The re-plan keeps every stream the failure did not cut ({repaired.notes.get('method')}); "
           f"{full_s / max(repaired.solve_s, 1e-9):.1f}x faster than solving again.")
