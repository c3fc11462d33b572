"""A planning instance: topology + PS + workers + capacities + rates.

The paper's symbols: the PS alpha has ingress bandwidth B (``ps_gbps``),
every worker sends at most T (``worker_gbps``), a programmable switch s sums
at most C_s Gbps of input (node attribute ``capacity_gbps``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from shoal.errors import ConfigError
from shoal.network.topology import hosts, set_link_bandwidth, switches, top_of_rack


@dataclass(frozen=True, eq=False)
class Instance:
    """Everything a planner needs; the graph already carries programmable flags and capacities."""

    graph: nx.Graph
    ps: str
    workers: tuple[str, ...]
    ps_gbps: float = 100.0
    worker_gbps: float = 100.0
    candidates: tuple[str, ...] | None = field(default=None, repr=False)  # set by ``restricted``: a parent's, reused

    @cached_property
    def programmable(self) -> tuple[str, ...]:
        """The candidate aggregation nodes: programmable switches with a positive capacity that
        some worker can reach and that can reach the PS (over positive-bandwidth links)."""
        if self.candidates is not None:
            return self.candidates
        cut = set(self.unreachable)
        return tuple(s for s in self._capable if s not in cut)

    def restricted(self, workers: tuple[str, ...], ps_gbps: float | None = None) -> Instance:
        """The same network and PS for a subset of the workers (planning part of a plan again).

        It keeps this instance's candidate switches, a superset of what the
        subset reaches (a switch no worker of the subset reaches gets no flow), so
        reachability is not searched again.
        """
        return Instance(self.graph, self.ps, workers, self.ps_gbps if ps_gbps is None else ps_gbps, self.worker_gbps, self.programmable)

    @cached_property
    def unreachable(self) -> tuple[str, ...]:
        """Programmable switches left out because no worker's stream could get there, or theirs to the PS."""
        from_workers = _switches_reached(self.graph, self.workers)
        to_ps = _switches_reached(self.graph, [self.ps])
        return tuple(s for s in self._capable if s not in from_workers or s not in to_ps)

    @cached_property
    def _capable(self) -> tuple[str, ...]:
        return tuple(s for s in switches(self.graph) if self.graph.nodes[s]["programmable"] and self.graph.nodes[s]["capacity_gbps"] > 0)

    def capacity(self, switch: str) -> float:
        return float(self.graph.nodes[switch]["capacity_gbps"])

    @cached_property
    def links_constrained(self) -> bool:
        """False in the paper's model: every link has infinite bandwidth."""
        return any(math.isfinite(bw) for _, _, bw in self.graph.edges(data="bandwidth_gbps"))

    def describe(self) -> dict[str, object]:
        """A JSON-able summary (for reports)."""
        return {
            "topology": self.graph.graph.get("name"),
            "switches": len(switches(self.graph)),
            "hosts": len(hosts(self.graph)),
            "workers": len(self.workers),
            "ps": self.ps,
            "programmable": len(self.programmable),
            "unreachable_programmable": list(self.unreachable),
            "ps_gbps": self.ps_gbps,
            "worker_gbps": self.worker_gbps,
            "links_constrained": self.links_constrained,
        }


# --------------------------------------------------------------------------- option parsing


def parse_range(spec: str, option: str) -> tuple[float, float]:
    """``800`` (fixed) or ``100:3200`` (uniform) -> (lo, hi); negative values are errors."""
    parts = spec.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ConfigError(f"{option}: expected a number or LO:HI, got {spec!r}") from None
    if len(values) not in (1, 2) or any(not math.isfinite(v) for v in values):
        raise ConfigError(f"{option}: expected a number or LO:HI, got {spec!r}")
    lo, hi = values[0], values[-1]
    if lo < 0 or hi < 0:
        raise ConfigError(f"{option}: capacities must be >= 0, got {spec!r}")
    if hi < lo:
        raise ConfigError(f"{option}: LO must not exceed HI in {spec!r}")
    return lo, hi


def parse_bandwidth(spec: str, option: str) -> float:
    """A positive number of Gbps, or ``inf`` for unconstrained."""
    if spec.strip().lower() in ("inf", "none", "unconstrained"):
        return math.inf
    try:
        value = float(spec)
    except ValueError:
        raise ConfigError(f"{option}: expected Gbps or 'inf', got {spec!r}") from None
    if not value > 0:
        raise ConfigError(f"{option}: must be positive, got {spec!r}")
    return value


def parse_workers(spec: str | None) -> int | list[str] | None:
    """``N`` (random placement) or ``h1,h2,...`` (explicit)."""
    if spec is None:
        return None
    if re.fullmatch(r"\s*[-+]?\d+\s*", spec):
        n = int(spec)
        if n < 1:
            raise ConfigError(f"--workers: need at least one worker, got {n}")
        return n
    names = [w.strip() for w in spec.split(",") if w.strip()]
    if not names:
        raise ConfigError(f"--workers: expected a count or a comma-separated host list, got {spec!r}")
    return names


# --------------------------------------------------------------------------- building


def rng_for(seed: int, stream: str) -> np.random.Generator:
    """An independent, reproducible random stream per purpose (placement, capacities, ...)."""
    return np.random.default_rng([seed, *stream.encode()])


def build_instance(
    graph: nx.Graph,
    *,
    workers: int | list[str] | None = None,
    ps: str | None = None,
    programmable: str | list[str] = "tor",
    capacity: tuple[float, float] | None = (100.0, 3200.0),
    link_gbps: float | None = None,
    ps_gbps: float = 100.0,
    worker_gbps: float = 100.0,
    seed: int = 0,
    placement: str = "random",
    source: str = "--topology",
    reserved: Collection[str] = (),
) -> Instance:
    """Place the PS and workers, mark programmable switches, draw capacities, validate.

    ``programmable``: ``tor``, ``all``, ``none``, ``random:F`` (fraction of all
    switches), ``file`` (keep the graph's flags), a list of switch names, or a
    path to a JSON list of them. ``capacity`` None keeps the graph's capacities.
    ``placement`` (for a worker count): ``random`` hosts by seed, or ``packed``
    rack by rack in order, each rack filled before the next. ``reserved`` hosts
    (more PSs) are never drawn as workers.
    """
    if seed < 0:
        raise ConfigError(f"--seed: must be >= 0, got {seed}")
    if placement not in ("random", "packed"):
        raise ConfigError(f"--placement: expected random or packed, got {placement!r}")
    _check_positive(ps_gbps, "--ps-gbps")
    _check_positive(worker_gbps, "--worker-gbps")
    g = prepare_network(graph, programmable=programmable, capacity=capacity, link_gbps=link_gbps, seed=seed, source=source)
    the_ps = _place_ps(g, ps, seed, source)
    if isinstance(workers, list) and set(workers) & set(reserved):
        raise ConfigError(f"--ps: {sorted(set(workers) & set(reserved))[0]!r} is also a worker")
    reachable = reachable_hosts(g, the_ps) - set(reserved)
    chosen = _place_workers(g, the_ps, reachable, workers, seed, source, placement)
    return Instance(g, the_ps, tuple(chosen), ps_gbps, worker_gbps)


def prepare_network(graph: nx.Graph, *, programmable: str | list[str] = "tor", capacity: tuple[float, float] | None = (100.0, 3200.0),
                    link_gbps: float | None = None, seed: int = 0, source: str = "--topology") -> nx.Graph:
    """A copy of the graph with link bandwidths, programmable switches and capacities set (what every job on it shares)."""
    g = graph.copy()
    if link_gbps is not None:
        set_link_bandwidth(g, link_gbps)
    _check_not_all_zero(g, source)
    _mark_programmable(g, programmable, seed)
    if capacity is not None:
        _draw_capacities(g, capacity, seed)
    return g


def extra_servers(inst: Instance, spec: int | list[str], seed: int) -> list[str]:
    """The PSs of a sharded model: ``inst.ps`` first, then named hosts or ``spec - 1`` hosts drawn by seed
    among those that are neither workers nor the PS and can reach every worker."""
    busy = set(inst.workers) | {inst.ps}
    if isinstance(spec, list):
        for h in spec:
            if h not in inst.graph or inst.graph.nodes[h]["kind"] != "host":
                raise ConfigError(f"--ps: {h!r} is not a host of the topology")
            if h in set(inst.workers):
                raise ConfigError(f"--ps: {h!r} is also a worker")
        if len(set(spec)) != len(spec):
            raise ConfigError("--ps: a host is listed twice")
        servers = list(spec)
    else:
        pool = sorted(reachable_hosts(inst.graph, inst.ps) - busy)
        if spec - 1 > len(pool):
            raise ConfigError(f"--ps-count {spec}: only {len(pool)} hosts are neither workers nor the PS; ask for fewer --workers")
        picks = rng_for(seed, "servers").choice(len(pool), size=spec - 1, replace=False) if spec > 1 else []
        servers = [inst.ps] + [pool[i] for i in sorted(picks)]
    for h in servers:
        missing = set(inst.workers) - reachable_hosts(inst.graph, h)
        if missing:
            raise ConfigError(f"--ps: no path from worker {sorted(missing)[0]!r} to the PS {h!r}")
    return servers


def _check_positive(value: float, option: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{option}: must be a positive number of Gbps, got {value}")


def _check_not_all_zero(g: nx.Graph, source: str) -> None:
    links = [bw for _, _, bw in g.edges(data="bandwidth_gbps")]
    caps = [g.nodes[s]["capacity_gbps"] for s in switches(g)]
    if links and all(bw == 0 for bw in links):
        what = "every switch capacity and link bandwidth is zero" if all(c == 0 for c in caps) else "every link has zero bandwidth"
        raise ConfigError(f"{source}: {what}: no gradient can reach the PS")


def reachable_hosts(g: nx.Graph, ps: str) -> set[str]:
    """Hosts with a path of positive-bandwidth links to ``ps`` that transits only switches."""
    live = nx.subgraph_view(g, filter_edge=lambda u, v: g[u][v]["bandwidth_gbps"] > 0)
    forwarders = nx.subgraph_view(live, filter_node=lambda n: n == ps or g.nodes[n]["kind"] != "host")
    core = nx.node_connected_component(forwarders, ps)  # ps and the switches it reaches through switches
    return {h for u in core for h in live[u] if h != ps and g.nodes[h]["kind"] == "host"}


def _switches_reached(g: nx.Graph, sources: Iterable[str]) -> set[str]:
    """Switches reachable from any of ``sources`` over positive-bandwidth links, forwarding only through switches.

    That is every switch in a connected component (of the live switch-to-switch links) that a source touches.
    """
    names = switches(g)
    index = {n: i for i, n in enumerate(names)}
    pairs = [(index[u], index[v]) for u, v, bw in g.edges(data="bandwidth_gbps") if bw > 0 and u in index and v in index]
    rows, cols = (list(x) for x in zip(*pairs)) if pairs else ([], [])
    adjacency = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    _, label = connected_components(adjacency, directed=False)
    touched = set()
    for src in sources:
        if src in index:
            touched.add(label[index[src]])
        touched |= {label[index[v]] for v in g[src] if v in index and g[src][v]["bandwidth_gbps"] > 0}
    return {n for n in names if label[index[n]] in touched}


def _place_ps(g: nx.Graph, ps: str | None, seed: int, source: str) -> str:
    ps = ps if ps is not None else g.graph.get("ps")
    all_hosts = hosts(g)
    if ps is None:
        if not all_hosts:
            raise ConfigError(f"{source}: the topology has no host to put the PS on")
        return all_hosts[int(rng_for(seed, "ps").integers(len(all_hosts)))]
    if ps not in g or g.nodes[ps]["kind"] != "host":
        raise ConfigError(f"--ps: {ps!r} is not a host of the topology")
    return ps


def _place_workers(g: nx.Graph, ps: str, reachable: set[str], workers: int | list[str] | None, seed: int, source: str,
                   placement: str = "random") -> list[str]:
    if workers is None:
        workers = g.graph.get("workers") or len(reachable)
    if isinstance(workers, int):
        if not reachable:
            raise ConfigError(f"{source}: no host has a path with positive bandwidth to the PS {ps!r}")
        if workers > len(reachable):
            raise ConfigError(f"--workers: asked for {workers} workers but only {len(reachable)} hosts can reach the PS {ps!r}")
        if placement == "packed":
            return sorted(sorted(reachable, key=lambda h: _natural(_rack(g, h), h))[:workers])
        pool = sorted(reachable)
        picks = rng_for(seed, "workers").choice(len(pool), size=workers, replace=False)
        return sorted(pool[i] for i in picks)
    for w in workers:
        if w not in g or g.nodes[w]["kind"] != "host":
            raise ConfigError(f"{source}: worker {w!r} is not a host of the topology")
        if w == ps:
            raise ConfigError(f"{source}: worker {w!r} is also the PS")
        if w not in reachable:
            raise ConfigError(f"{source}: no path from worker {w!r} to the PS {ps!r} (disconnected, or only zero-bandwidth links)")
    if len(set(workers)) != len(workers):
        raise ConfigError(f"{source}: a worker is listed twice")
    return list(workers)


def _rack(g: nx.Graph, host: str) -> str:
    """A host's top-of-rack switch: its first-named switch neighbour."""
    return min((v for v in g[host] if g.nodes[v]["kind"] == "switch"), default="")


def _natural(*names: str) -> tuple[tuple[int | str, ...], ...]:
    """Sort key that orders e2.10 after e2.9."""
    return tuple(tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)) for n in names)


def _mark_programmable(g: nx.Graph, spec: str | list[str], seed: int) -> None:
    all_sw = switches(g)
    if spec == "file":
        return
    chosen = _programmable_set(g, spec, all_sw, seed)
    for s in all_sw:
        g.nodes[s]["programmable"] = s in chosen


def _programmable_set(g: nx.Graph, spec: str | list[str], all_sw: list[str], seed: int) -> set[str]:
    if isinstance(spec, list):
        names = spec
    elif spec == "tor":
        return set(top_of_rack(g))
    elif spec == "all":
        return set(all_sw)
    elif spec == "none":
        return set()
    elif spec.startswith("random:"):
        frac = _fraction(spec)
        count = round(frac * len(all_sw))
        picks = rng_for(seed, "programmable").choice(len(all_sw), size=count, replace=False)
        return {all_sw[i] for i in picks}
    else:
        names = _read_switch_list(spec)
    unknown = [n for n in names if n not in g or g.nodes[n]["kind"] != "switch"]
    if unknown:
        raise ConfigError(f"--programmable: {unknown[0]!r} is not a switch of the topology")
    return set(names)


def _fraction(spec: str) -> float:
    try:
        frac = float(spec.partition(":")[2])
    except ValueError:
        raise ConfigError(f"--programmable: expected random:FRACTION, got {spec!r}") from None
    if not 0 <= frac <= 1:
        raise ConfigError(f"--programmable: fraction must be in [0, 1], got {spec!r}")
    return frac


def _read_switch_list(spec: str) -> list[str]:
    path = Path(spec)
    if not path.exists():
        raise ConfigError(f"--programmable: {spec!r} is not tor, all, none, random:F, file or an existing JSON file")
    try:
        names = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{spec}: not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{spec}: expected a JSON list of switch names")
    return names


def _draw_capacities(g: nx.Graph, capacity: tuple[float, float], seed: int) -> None:
    lo, hi = capacity
    all_sw = switches(g)
    draws = rng_for(seed, "capacity").uniform(lo, hi, size=len(all_sw)) if hi > lo else np.full(len(all_sw), lo)
    for s, c in zip(all_sw, draws):
        g.nodes[s]["capacity_gbps"] = float(c)
