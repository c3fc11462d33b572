"""GRID: planning where gradients are aggregated inside the network.

Topologies (networkx graphs), planning instances, the one honest evaluator,
and the planners: ``grid`` (shoal's, link- and path-aware), ``rgria`` (the
paper's), ``exact`` (the paper model's optimum) and the baselines
``geryon``, ``atp`` and ``switchml``. See docs/grid.md.
"""

from shoal.network.algorithms import ALGORITHMS, Result, solve
from shoal.network.evaluator import Evaluation, Plan, Violation, evaluate
from shoal.network.instance import Instance, build_instance
from shoal.network.routing import Routes
from shoal.network.topology import fat_tree, leaf_spine, load_topology, parse_topology_spec, save_topology

__all__ = [
    "ALGORITHMS",
    "Evaluation",
    "Instance",
    "Plan",
    "Result",
    "Routes",
    "Violation",
    "build_instance",
    "evaluate",
    "fat_tree",
    "leaf_spine",
    "load_topology",
    "parse_topology_spec",
    "save_topology",
    "solve",
]
