"""The report's routing section: a run's aggregation plan as tables, and drawn on its topology."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shoal.report.page import macro
from shoal.report.plots import save_figure
from shoal.report.runs import RunData


def draw_plan(run: RunData, path: Path) -> Path | None:
    """The run's plan on its topology, as `shoal route --plot` draws it, into ``path`` (PNG and SVG);
    None if the run's config cannot be planned again (moved plug-ins, a hand-edited file)."""
    from shoal.config import load_config
    from shoal.errors import ConfigError

    try:
        from shoal.network.plot import plan_figure
        from shoal.network.training import planned

        inst, result = planned(load_config(run.path / "config.toml"))
    except (ConfigError, OSError, ValueError):
        return None
    return save_figure(plan_figure(inst, [result]), path)


def _gbps(v: Any) -> str:
    return f"{v:.3g} Gbit/s"


def _share(v: Any) -> str:
    return f"{v:.1%}"


def _listing(v: Any) -> str:
    """A list or table as words: ``none`` when empty; a violation as its kind, where and by how much."""
    if not v:
        return "none"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_listing(x) if isinstance(x, (dict, list)) else x}" for k, x in v.items())
    items = []
    for x in v:
        if isinstance(x, dict) and "kind" in x:
            items.append(f"{x['kind']} at {x.get('where')} ({x.get('load_gbps', 0):.3g} of "
                         f"{x.get('capacity_gbps', 0):.3g} Gbit/s)")
        else:
            items.append(str(x))
    return "; ".join(items)


#: the plan's keys in reading order: (key, label, how to show the value); other keys follow under their own name
PLAN_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("algorithm", "planner", str), ("status", "status", str), ("topology", "topology", str),
    ("ps_host", "parameter server", str), ("min_rate_gbps", "rate of the slowest flow", _gbps),
    ("bound_gbps", "upper bound on that rate", _gbps), ("claimed_rate_gbps", "rate the planner claimed", _gbps),
    ("rate_gbps", "rate loads are measured at", _gbps), ("bottleneck", "bottleneck", str),
    ("ps_streams", "streams into the server", str), ("ps_load_gbps", "load on the server", _gbps),
    ("max_switch_utilisation", "busiest switch", _share), ("max_link_utilisation", "busiest link", _share),
    ("aggregation_switches", "workers summed at each switch", _listing),
    ("direct_workers", "workers sending straight to the server", str),
    ("second_level", "second-level switches", _listing), ("violations", "capacity violations", _listing),
    ("solve_s", "planning time", lambda v: f"{v:.3g} s"), ("notes", "notes", _listing),
)


def plan_rows(routing: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value as text) for every key of the plan but the per-worker ones, known keys first."""
    known = {key for key, _, _ in PLAN_ROWS}
    rows = [(label, "-" if routing[key] is None else show(routing[key])) for key, label, show in PLAN_ROWS
            if key in routing]
    rows += [(key.replace("_", " "), _listing(v) if isinstance(v, (dict, list)) else str(v))
             for key, v in routing.items() if key not in known and key not in ("worker_nodes", "dataplane")]
    return rows


def routing_data(routing: dict[str, Any]) -> dict[str, Any]:
    """The plan's numbers, where each worker's gradient is summed, and the data plane's counters, for the tables."""
    data: dict[str, Any] = {"pairs": plan_rows(routing), "by_node": [], "switches": [], "switch_keys": []}
    nodes = routing.get("worker_nodes")
    if isinstance(nodes, list) and nodes:
        by_node: dict[str, list[int]] = {}
        for worker, node in enumerate(nodes):
            by_node.setdefault(str(node), []).append(worker)
        data["by_node"] = sorted(by_node.items())
    switches = (routing.get("dataplane") or {}).get("switches") if isinstance(routing.get("dataplane"), dict) else None
    if isinstance(switches, dict) and switches and all(isinstance(c, dict) for c in switches.values()):
        data["switch_keys"] = sorted({k for c in switches.values() for k in c})
        data["switches"] = sorted(switches.items())
    return data


def routing_tables(routing: dict[str, Any]) -> str:
    """The routing tables as HTML, rendered by the report template's macro."""
    return str(macro("routing_tables")(routing_data(routing)))
