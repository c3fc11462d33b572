"""From a training config to an aggregation plan the backends can follow.

`plan_aggregation` builds the planning instance of the ``[network]``
section (topology, server host, worker hosts, programmable switches and
their capacities; the workers' sending rate T is ``cluster.link_gbps`` and
the server's ingress B is ``cluster.server_gbps``), runs the configured
planner and keeps what training needs: each worker's aggregation node and
the plan's honestly feasible rate, at which every worker can push at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shoal.config import Config
from shoal.errors import ConfigError
from shoal.network.algorithms import Result, solve
from shoal.network.instance import Instance, build_instance
from shoal.network.topology import parse_topology_spec


@dataclass(frozen=True)
class AggregationPlan:
    """Per worker (by index) its aggregation switch, or None for the server; the common push rate."""

    algorithm: str
    rate_bps: float
    node_of: tuple[str | None, ...]
    switch_bps: dict[str, float]
    summary: dict[str, Any] = field(default_factory=dict)

    def members(self, switch: str) -> int:
        """How many workers a switch aggregates."""
        return sum(1 for n in self.node_of if n == switch)


def plan_aggregation(cfg: Config) -> AggregationPlan:
    """Plan where each worker's gradients are summed; bad topology or placement input is a ConfigError."""
    net = cfg.network
    inst, result = planned(cfg)
    assert result.evaluation is not None and result.plan is not None  # planned() refuses a plan-less result
    rate_gbps = min(result.evaluation.min_rate_gbps, cfg.cluster.link_gbps)
    if not rate_gbps > 0:
        raise ConfigError(f"network: the {net.algorithm} plan leaves a worker with no feasible sending rate")
    node_of = tuple(None if result.plan.assignment[h] == inst.ps else result.plan.assignment[h] for h in inst.workers)
    summary = {
        "algorithm": net.algorithm,
        "topology": net.topology,
        "ps_host": inst.ps,
        "rate_gbps": rate_gbps,
        **result.to_json(with_assignment=False),
        "worker_nodes": [n or "server" for n in node_of],
    }
    return AggregationPlan(
        algorithm=net.algorithm,
        rate_bps=rate_gbps * 1e9,
        node_of=node_of,
        switch_bps={s: inst.capacity(s) * 1e9 for s in set(node_of) - {None}},
        summary=summary,
    )


def planned(cfg: Config) -> tuple[Instance, Result]:
    """The ``[network]`` section's planning instance and its planner's scored result (the report draws it again)."""
    net = cfg.network
    graph = _renamed(lambda: parse_topology_spec(net.topology, net.link_gbps))
    low, high = (net.capacity_gbps * 2)[:2]
    inst = _renamed(lambda: build_instance(
        graph,
        workers=list(net.worker_hosts) or cfg.cluster.workers,
        ps=net.ps_host,
        programmable=net.programmable,
        capacity=(low, high),
        ps_gbps=cfg.cluster.server_gbps,
        worker_gbps=cfg.cluster.link_gbps,
        seed=cfg.run.seed,
        source="network.topology",
    ))
    # one level: the backends' software switches send their sums to the server, as a one-level plan says
    result = solve(inst, net.algorithm, seed=cfg.run.seed, **({"two_level": False} if net.algorithm == "grid" else {}))
    if result.evaluation is None or result.plan is None:
        raise ConfigError(f"network: the {net.algorithm} planner ran out of time ({result.notes.get('time_limit')}); try network.algorithm = \"grid\"")
    return inst, result


def _renamed(build: Any) -> Any:
    """Run ``build``; name the config key instead of the `shoal route` option in its errors."""
    try:
        return build()
    except ConfigError as err:
        raise ConfigError(str(err).replace("--topology", "network.topology").replace("--workers", "cluster.workers")
                          .replace("--ps", "network.ps_host").replace("--programmable", "network.programmable")) from None
