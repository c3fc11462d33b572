"""The report's routing section: a run's aggregation plan as tables, and drawn on its topology."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

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


def routing_tables(routing: dict[str, Any]) -> str:
    """The plan's numbers, where each worker's gradient is summed, and the data plane's counters, as tables."""
    scalars = {k: v for k, v in routing.items() if not isinstance(v, (dict, list))}
    rest = {k: v for k, v in routing.items() if k not in scalars and k not in ("worker_nodes", "dataplane")}
    out = [_kv_table({**scalars, **rest})]
    nodes = routing.get("worker_nodes")
    if isinstance(nodes, list) and nodes:
        by_node: dict[str, list[int]] = {}
        for worker, node in enumerate(nodes):
            by_node.setdefault(str(node), []).append(worker)
        rows = "".join(f"<tr><td class=\"left\">{html.escape(node)}</td><td>{len(ws)}</td>"
                       f"<td class=\"left\">{html.escape(', '.join(map(str, ws)))}</td></tr>"
                       for node, ws in sorted(by_node.items()))
        out.append("<table><thead><tr><th class=\"left\">aggregated at</th><th>workers</th>"
                   f"<th class=\"left\">which</th></tr></thead><tbody>{rows}</tbody></table>")
    switches = (routing.get("dataplane") or {}).get("switches") if isinstance(routing.get("dataplane"), dict) else None
    if isinstance(switches, dict) and switches and all(isinstance(c, dict) for c in switches.values()):
        keys = sorted({k for c in switches.values() for k in c})
        head = "".join(f"<th>{html.escape(k.replace('_', ' '))}</th>" for k in keys)
        rows = "".join(f"<tr><td class=\"left\">{html.escape(name)}</td>"
                       + "".join(f"<td>{_value(c.get(k, ''))}</td>" for k in keys) + "</tr>"
                       for name, c in sorted(switches.items()))
        out.append(f"<table><thead><tr><th class=\"left\">switch (data plane)</th>{head}</tr></thead>"
                   f"<tbody>{rows}</tbody></table>")
    return "".join(out)


def _kv_table(values: dict[str, Any]) -> str:
    rows = "".join(f"<tr><td class=\"left\">{html.escape(str(k))}</td><td class=\"left\">{_value(v)}</td></tr>"
                   for k, v in values.items())
    return f"<table class=\"kv\"><tbody>{rows}</tbody></table>"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (dict, list)):
        return f"<code>{html.escape(json.dumps(value))}</code>"
    return html.escape(str(value))
