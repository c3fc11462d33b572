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


def routing_data(routing: dict[str, Any]) -> dict[str, Any]:
    """The plan's numbers, where each worker's gradient is summed, and the data plane's counters, for the tables."""
    scalars = {k: v for k, v in routing.items() if not isinstance(v, (dict, list))}
    rest = {k: v for k, v in routing.items() if k not in scalars and k not in ("worker_nodes", "dataplane")}
    data: dict[str, Any] = {"pairs": list({**scalars, **rest}.items()), "by_node": [], "switches": [], "switch_keys": []}
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
