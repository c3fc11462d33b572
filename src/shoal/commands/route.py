"""`shoal route`: plan in-network gradient aggregation on a topology and compare algorithms."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from shoal.commands.common import fmt_number, table_console, user_errors_exit_2
from shoal.errors import ConfigError

if TYPE_CHECKING:  # the network package (numpy, scipy, highspy) loads only when the command runs
    from rich.console import Console

    from shoal.network import Instance, Result

ALGO_HELP = "grid | rgria | exact | geryon | atp | atp2 | switchml | all, or a comma-separated list."


@user_errors_exit_2
def route(
    topology: Annotated[str, typer.Option(help="fattree:k=8[,hosts=4] | leafspine:spines=30,leaves=30[,hosts=10] | FILE.json")],
    workers: Annotated[Optional[str], typer.Option(help="Worker count (random hosts, by --seed) or host1,host2,...; default: the file's list, else every host but the PS.")] = None,
    ps: Annotated[Optional[str], typer.Option(help="Host of the parameter server; default: the file's, else a random host.")] = None,
    programmable: Annotated[Optional[str], typer.Option(help="tor | all | none | random:FRACTION | file | SWITCHES.json; default: file for JSON topologies, tor otherwise.")] = None,
    capacity: Annotated[Optional[str], typer.Option(help="Switch aggregation capacity, Gbps: C or LO:HI (uniform, by --seed); default: the file's, else 100:3200.")] = None,
    link_gbps: Annotated[Optional[str], typer.Option(help="Bandwidth of every link, Gbps, or inf (the paper's link-free model); default: the file's, else 100.")] = None,
    ps_gbps: Annotated[float, typer.Option(help="PS ingress bandwidth B, Gbps.")] = 100.0,
    worker_gbps: Annotated[float, typer.Option(help="Maximum worker sending rate T, Gbps.")] = 100.0,
    hosts_per_rack: Annotated[Optional[int], typer.Option(help="Hosts under each top-of-rack switch of a generated topology (same as hosts=H in the spec).")] = None,
    placement: Annotated[str, typer.Option(help="random: --workers N hosts drawn by --seed; packed: rack by rack, filling each rack before the next.")] = "random",
    seed: Annotated[int, typer.Option(help="Seeds placement, programmable switches, capacities and rgria's rounding (>= 0).")] = 0,
    time_limit: Annotated[float, typer.Option(help="Seconds each algorithm may plan; it then returns its best plan so far or says it ran out.")] = 60.0,
    algo: Annotated[str, typer.Option(help=ALGO_HELP)] = "grid",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (per algorithm: min_rate_gbps, bound_gbps, ps_load_gbps, ...).")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Draw the topology with each plan into this PNG.")] = None,
    save: Annotated[Optional[Path], typer.Option(help="Write the instance (with capacities, PS, workers) as a topology JSON file.")] = None,
    ps_count: Annotated[int, typer.Option(help="Shard the model over this many PSs (--ps first, the rest drawn by --seed among hosts that are not workers); --ps a,b,c names them.")] = 1,
    jobs: Annotated[Optional[Path], typer.Option(help="A JSON file of several jobs sharing the network (see docs/grid.md); plans them max-min fair.")] = None,
    switch_slots: Annotated[Optional[int], typer.Option(help="Aggregator memory units per switch, shared by --jobs (default: the topology's, else 40000).")] = None,
    fail: Annotated[Optional[list[str]], typer.Option(help="A link A-B or a switch that fails after grid planned; re-plans incrementally and compares with a full solve. Repeatable.")] = None,
) -> None:
    """Plan where gradients are aggregated (GRID) and score every plan with one honest evaluator."""
    from shoal.network import build_instance, parse_topology_spec, solve
    from shoal.network.instance import parse_bandwidth, parse_range, parse_workers
    from shoal.network.routing import Routes
    from shoal.network.topology import save_topology

    algos = _parse_algos(algo)
    _check_output(plot, "--plot", ".png")
    _check_output(save, "--save", ".json")
    if not (time_limit > 0 and math.isfinite(time_limit)):
        raise ConfigError(f"--time-limit: must be a positive number of seconds, got {time_limit}")
    if placement not in ("random", "packed"):
        raise ConfigError(f"--placement: expected random or packed, got {placement!r}")
    from_file = topology.split(":", 1)[0] not in ("fattree", "leafspine")
    if hosts_per_rack is not None and from_file:
        raise ConfigError("--hosts-per-rack: only for fattree:... and leafspine:... topologies (a file lists its hosts)")
    servers = [p.strip() for p in ps.split(",") if p.strip()] if ps is not None and "," in ps else None
    _check_modes(ps_count, servers, jobs, switch_slots, fail, workers, ps, plot, save)
    link = parse_bandwidth(link_gbps, "--link-gbps") if link_gbps is not None else None
    graph = parse_topology_spec(topology, link, hosts_per_rack)
    cap_spec = capacity if capacity is not None else (None if from_file else "100:3200")
    if jobs is not None:
        from shoal.commands.route_beyond import run_jobs
        from shoal.network.instance import prepare_network
        from shoal.network.jobs import load_jobs

        if seed < 0:
            raise ConfigError(f"--seed: must be >= 0, got {seed}")
        net = prepare_network(graph, programmable=programmable or ("file" if from_file else "tor"),
                              capacity=parse_range(cap_spec, "--capacity") if cap_spec is not None else None, seed=seed,
                              source=topology if from_file else "--topology")
        placed = load_jobs(jobs, net, seed=seed, ps_gbps=ps_gbps, worker_gbps=worker_gbps, switch_slots=switch_slots)
        run_jobs(net, placed, seed, time_limit, as_json)
        return
    inst = build_instance(
        graph,
        workers=parse_workers(workers),
        ps=servers[0] if servers else ps,
        reserved=servers or (),
        programmable=programmable or ("file" if from_file else "tor"),
        capacity=parse_range(cap_spec, "--capacity") if cap_spec is not None else None,
        ps_gbps=ps_gbps,
        worker_gbps=worker_gbps,
        seed=seed,
        placement=placement,
        source=topology if from_file else "--topology",
    )
    if inst.unreachable:
        typer.echo(f"note: {len(inst.unreachable)} programmable switch(es) cannot be reached by any worker or cannot reach the PS "
                   f"and are left out: {', '.join(inst.unreachable[:8])}{' ...' if len(inst.unreachable) > 8 else ''}", err=True)
    if servers or ps_count > 1:
        from shoal.commands.route_beyond import run_sharded
        from shoal.network.instance import extra_servers

        run_sharded(inst, extra_servers(inst, servers or ps_count, seed), algos, seed, time_limit, as_json)
        return
    if fail:
        from shoal.commands.route_beyond import run_failure

        run_failure(inst, fail, seed, time_limit, as_json)
        return
    routes = Routes(inst.graph)
    results = [solve(inst, a, seed, routes, time_limit) for a in algos]
    if plot is not None:
        from shoal.network.plot import draw_plans

        draw_plans(inst, results, plot)
    if save is not None:
        save_topology(inst.graph, save, inst.ps, inst.workers)
    if as_json:
        typer.echo(json.dumps({"instance": inst.describe(), "results": {r.algo: r.to_json() for r in results}}, indent=2))
    else:
        _print_table(inst, results)


def _check_modes(ps_count: int, servers: list[str] | None, jobs: Path | None, switch_slots: int | None, fail: list[str] | None,
                 workers: str | None, ps: str | None, plot: Path | None, save: Path | None) -> None:
    """One mode at a time: one PS, a sharded model, several jobs, or a failure."""
    if ps_count < 1:
        raise ConfigError(f"--ps-count: need at least one PS, got {ps_count}")
    if servers is not None and ps_count not in (1, len(servers)):
        raise ConfigError(f"--ps-count {ps_count} contradicts the {len(servers)} hosts named by --ps")
    if switch_slots is not None and switch_slots < 1:
        raise ConfigError(f"--switch-slots: must be >= 1, got {switch_slots}")
    sharded = servers is not None or ps_count > 1
    modes = [name for name, on in (("--ps-count/--ps a,b", sharded), ("--jobs", jobs is not None), ("--fail", bool(fail))) if on]
    if len(modes) > 1:
        raise ConfigError(f"{modes[0]} and {modes[1]} cannot be combined")
    if jobs is not None and (workers is not None or ps is not None):
        raise ConfigError("--jobs: the jobs file places every job's PS and workers; drop --workers and --ps")
    if modes and (plot is not None or save is not None):
        raise ConfigError(f"{modes[0]}: --plot and --save draw or save one job's single plan; drop them")


def _parse_algos(spec: str) -> list[str]:
    from shoal.network import ALGORITHMS

    names = list(ALGORITHMS) if spec.strip() == "all" else [a.strip() for a in spec.split(",") if a.strip()]
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown or not names:
        raise ConfigError(f"--algo: unknown algorithm {unknown[0] if unknown else spec!r}; {ALGO_HELP}")
    return names


def _check_output(path: Path | None, option: str, suffix: str) -> None:
    """Fail before planning, not after, when an output file cannot be written."""
    if path is None:
        return
    if path.suffix.lower() != suffix:
        raise ConfigError(f"{option}: {path}: expected a {suffix} file name")
    if not path.parent.exists():
        raise ConfigError(f"{option}: {path}: folder {path.parent} does not exist")
    if not path.parent.is_dir():
        raise ConfigError(f"{option}: {path}: {path.parent} is not a folder")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise ConfigError(f"{option}: {path}: cannot write there ({err.strerror or err})") from None
    if not existed:
        path.unlink()


def _cells(r: Result) -> list[str]:
    """One plan's numbers, in the table's column order."""
    ev = r.evaluation
    if ev is None or r.plan is None:
        return ["time limit", "-", "-", "-", "-", "-", "-", "-", "no plan", f"{r.solve_s:.3f}"]
    worst = max((v.factor for v in ev.violations), default=None)
    viol = "0" if not ev.violations else f"{len(ev.violations)} (worst x{fmt_number(worst)})"
    return [fmt_number(ev.min_rate_gbps, 3), fmt_number(r.bound_gbps), fmt_number(r.plan.claimed_rate_gbps), str(ev.ps_streams),
            str(len(ev.switch_workers)), fmt_number(ev.max_switch_utilisation), fmt_number(ev.max_link_utilisation), viol,
            ev.bottleneck, f"{r.solve_s:.3f}"]


WIDE_TABLE_COLUMNS = 135  # below this many terminal columns the table is printed with algorithms as columns


def _print_table(inst: Instance, results: Sequence[Result], console: Console | None = None) -> None:
    from rich.table import Table

    d = inst.describe()
    links = "links unconstrained (paper's model)" if not d["links_constrained"] else "link bandwidths enforced"
    title = (f"{d['topology']}: {d['workers']} workers, PS {d['ps']}, {d['programmable']} programmable switches, "
             f"B={d['ps_gbps']:g} Gbps, T={d['worker_gbps']:g} Gbps, {links}")
    columns = ("min rate Gbps", "bound", "claimed", "PS streams", "agg switches", "max switch util", "max link util",
               "violations", "bottleneck", "solve s")
    rows = {r.algo: _cells(r) for r in results}
    console = console or table_console()
    table = Table(title=title)
    if console.width >= WIDE_TABLE_COLUMNS:  # one row per algorithm
        table.add_column("algorithm", no_wrap=True)
        for col in columns:
            table.add_column(col, justify="left" if col == "bottleneck" else "right", overflow="fold",
                             min_width=max(len(word) for word in col.split()))
        for algo, cells in rows.items():
            table.add_row(algo, *cells)
    else:  # a narrow terminal: one column per algorithm, nothing cut
        table.add_column("", no_wrap=True, min_width=max(map(len, columns)))
        for algo in rows:
            table.add_column(algo, justify="right", overflow="fold", min_width=len(algo))
        for i, col in enumerate(columns):
            table.add_row(col, *(cells[i] for cells in rows.values()))
    console.print(table)
    console.print("min rate: the highest rate every worker can send at under the plan, breaking nothing (the evaluator's verdict). "
                  "claimed: the rate the algorithm promised; utilisations and violations are measured at it.")
