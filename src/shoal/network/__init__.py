"""GRID: planning where gradients are aggregated inside the network.

Topologies (networkx graphs), planning instances, the one honest evaluator,
and the planners: ``grid`` (shoal's, link- and path-aware), ``rgria`` (the
paper's), ``exact`` (the paper model's optimum) and the baselines
``geryon``, ``atp`` and ``switchml``. See docs/grid.md.

The names below load on first use: every ray worker imports the software
switch (``shoal.network.dataplane``), and should not pay for networkx,
scipy and HiGHS, which only the planners need (about half a second of CPU
per process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shoal.network.algorithms import ALGORITHMS, Result, solve
    from shoal.network.evaluator import Evaluation, Plan, Violation, evaluate
    from shoal.network.instance import Instance, build_instance
    from shoal.network.routing import Routes
    from shoal.network.topology import fat_tree, leaf_spine, load_topology, parse_topology_spec, save_topology

#: each public name and the module that defines it
_WHERE = {
    "ALGORITHMS": "algorithms", "Result": "algorithms", "solve": "algorithms",
    "Evaluation": "evaluator", "Plan": "evaluator", "Violation": "evaluator", "evaluate": "evaluator",
    "Instance": "instance", "build_instance": "instance",
    "Routes": "routing",
    "fat_tree": "topology", "leaf_spine": "topology", "load_topology": "topology",
    "parse_topology_spec": "topology", "save_topology": "topology",
}

__all__ = ["ALGORITHMS", "Evaluation", "Instance", "Plan", "Result", "Routes", "Violation", "build_instance", "evaluate",
           "fat_tree", "leaf_spine", "load_topology", "parse_topology_spec", "save_topology", "solve"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
