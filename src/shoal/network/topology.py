"""Datacenter topologies as networkx graphs, and the JSON file format.

A topology is an undirected ``nx.Graph``:

- node attribute ``kind``: ``"host"`` or ``"switch"``;
- switches also carry ``programmable`` (bool), ``capacity_gbps`` (aggregation
  capacity, Gbps of input) and ``tier`` (``core``/``agg``/``edge``,
  ``spine``/``leaf``, or whatever a file says; only used for drawing);
- edge attribute ``bandwidth_gbps``: capacity of the link in each direction
  (links are full duplex); ``math.inf`` means unconstrained, which is the
  paper's link-free model;
- graph attributes ``name`` and, from files, optionally ``ps`` and ``workers``.

Hosts never forward traffic: they are only sources and sinks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.errors import ConfigError

DEFAULT_LINK_GBPS = 100.0
MAX_SWITCHES = 20_000  # generated topologies beyond these sizes are refused (a k = 126 fat-tree has 19,845 switches)
MAX_HOSTS = 250_000
MAX_LINKS = 2_000_000


# --------------------------------------------------------------------------- generators


def fat_tree(k: int = 8, hosts_per_edge: int | None = None, link_gbps: float = DEFAULT_LINK_GBPS) -> nx.Graph:
    """k-ary fat-tree: k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 cores.

    k = 8 gives the paper's 80 switches; hosts per edge switch default to k/2.
    """
    if k < 2 or k % 2:
        raise ConfigError(f"--topology: fattree k must be an even integer >= 2, got {k}")
    half = k // 2
    hosts = half if hosts_per_edge is None else hosts_per_edge
    if hosts < 1:
        raise ConfigError(f"--topology: fattree hosts must be >= 1, got {hosts}")
    _check_size(f"fattree k={k}", 5 * half * half, k * half * hosts, k * half * half * 2 + k * half * hosts)
    g = nx.Graph(name=f"fattree:k={k},hosts={hosts}")
    cores = [f"c{i}" for i in range(half * half)]
    for c in cores:
        _add_switch(g, c, "core")
    for p in range(k):
        for i in range(half):
            agg, edge = f"a{p}.{i}", f"e{p}.{i}"
            _add_switch(g, agg, "agg")
            _add_switch(g, edge, "edge")
            for j in range(half):  # aggregation switch i reaches cores i*half .. i*half+half-1
                g.add_edge(agg, cores[i * half + j], bandwidth_gbps=link_gbps)
        for i in range(half):
            for j in range(half):
                g.add_edge(f"e{p}.{i}", f"a{p}.{j}", bandwidth_gbps=link_gbps)
            _add_hosts(g, f"e{p}.{i}", f"h{p}.{i}", hosts, link_gbps)
    return g


def leaf_spine(spines: int = 30, leaves: int = 30, hosts_per_leaf: int = 10, link_gbps: float = DEFAULT_LINK_GBPS) -> nx.Graph:
    """Two-tier Clos: every leaf links to every spine; hosts hang off leaves."""
    for key, value in (("spines", spines), ("leaves", leaves), ("hosts", hosts_per_leaf)):
        if value < 1:
            raise ConfigError(f"--topology: leafspine {key} must be >= 1, got {value}")
    _check_size(f"leafspine spines={spines},leaves={leaves}", spines + leaves, leaves * hosts_per_leaf, spines * leaves + leaves * hosts_per_leaf)
    g = nx.Graph(name=f"leafspine:spines={spines},leaves={leaves},hosts={hosts_per_leaf}")
    for s in range(spines):
        _add_switch(g, f"s{s}", "spine")
    for leaf in range(leaves):
        _add_switch(g, f"l{leaf}", "leaf")
        for s in range(spines):
            g.add_edge(f"l{leaf}", f"s{s}", bandwidth_gbps=link_gbps)
        _add_hosts(g, f"l{leaf}", f"h{leaf}", hosts_per_leaf, link_gbps)
    return g


def _check_size(what: str, n_switches: int, n_hosts: int, n_links: int) -> None:
    """Refuse, in one line, a topology too big to plan on (instead of building it for minutes)."""
    for count, cap, noun in ((n_switches, MAX_SWITCHES, "switches"), (n_hosts, MAX_HOSTS, "hosts"), (n_links, MAX_LINKS, "links")):
        if count > cap:
            raise ConfigError(f"--topology: {what} has {count:,} {noun}; shoal plans on at most {cap:,}")


def _add_hosts(g: nx.Graph, switch: str, prefix: str, count: int, link_gbps: float) -> None:
    """Hang ``count`` hosts named PREFIX.0, PREFIX.1, ... off ``switch``."""
    for h in range(count):
        host = f"{prefix}.{h}"
        g.add_node(host, kind="host")
        g.add_edge(host, switch, bandwidth_gbps=link_gbps)


def _add_switch(g: nx.Graph, name: str, tier: str) -> None:
    g.add_node(name, kind="switch", tier=tier, programmable=False, capacity_gbps=0.0)


# --------------------------------------------------------------------------- queries


def hosts(g: nx.Graph) -> list[str]:
    """Host names, sorted."""
    return sorted(n for n, d in g.nodes(data=True) if d["kind"] == "host")


def switches(g: nx.Graph) -> list[str]:
    """Switch names, sorted."""
    return sorted(n for n, d in g.nodes(data=True) if d["kind"] == "switch")


def top_of_rack(g: nx.Graph) -> list[str]:
    """Switches with at least one host attached: the top-of-rack (edge, leaf) tier."""
    return [s for s in switches(g) if any(g.nodes[v]["kind"] == "host" for v in g[s])]


def links_constrained(g: nx.Graph) -> bool:
    """True when some link has a finite bandwidth (the paper's model has none)."""
    return any(math.isfinite(bw) for _, _, bw in g.edges(data="bandwidth_gbps"))


def set_link_bandwidth(g: nx.Graph, gbps: float) -> None:
    """Give every link the same bandwidth (math.inf: unconstrained)."""
    nx.set_edge_attributes(g, gbps, "bandwidth_gbps")


# --------------------------------------------------------------------------- --topology specs


_SPEC_KEYS = {"fattree": ("k", "hosts"), "leafspine": ("spines", "leaves", "hosts")}


def parse_topology_spec(spec: str, link_gbps: float | None = None, hosts_per_rack: int | None = None) -> nx.Graph:
    """``fattree:k=8[,hosts=4]``, ``leafspine:spines=30,leaves=30[,hosts=10]`` or a JSON file path.

    ``link_gbps`` overrides every link's bandwidth (generated topologies default to 100 Gbps);
    ``hosts_per_rack`` overrides ``hosts=`` of a generated one.
    """
    kind, _, rest = spec.partition(":")
    if kind not in _SPEC_KEYS:
        if spec.endswith(".json") or Path(spec).exists():
            g = load_topology(spec)
            if link_gbps is not None:
                set_link_bandwidth(g, link_gbps)
            return g
        raise ConfigError(f"--topology: {spec!r} is neither fattree:..., leafspine:... nor an existing JSON file")
    params = _parse_params(kind, rest)
    if hosts_per_rack is not None:
        if "hosts" in params and params["hosts"] != hosts_per_rack:
            raise ConfigError(f"--hosts-per-rack {hosts_per_rack} contradicts hosts={params['hosts']} in --topology")
        params["hosts"] = hosts_per_rack
    bw = DEFAULT_LINK_GBPS if link_gbps is None else link_gbps
    if kind == "fattree":
        return fat_tree(params.get("k", 8), params.get("hosts"), bw)
    return leaf_spine(params.get("spines", 30), params.get("leaves", 30), params.get("hosts", 10), bw)


def _parse_params(kind: str, rest: str) -> dict[str, int]:
    params: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in _SPEC_KEYS[kind]:
            raise ConfigError(f"--topology: bad parameter {item!r} for {kind}; use {', '.join(k + '=INT' for k in _SPEC_KEYS[kind])}")
        try:
            params[key] = int(value)
        except ValueError:
            raise ConfigError(f"--topology: {kind} {key} must be an integer, got {value!r}") from None
    return params


# --------------------------------------------------------------------------- JSON file format


class _Strict(BaseModel):
    """No unknown keys, no coercion ("100" is not a number, 1 is not true), no Infinity or NaN."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


Name = Annotated[str, Field(min_length=1)]


class SwitchSpec(_Strict):
    name: Name
    programmable: bool = False
    capacity_gbps: float = Field(0.0, ge=0, description="Aggregation capacity, Gbps of input; 0 = cannot aggregate.")
    slots: int | None = Field(None, ge=1, description="Aggregator memory units (shared by jobs); default 40,000.")
    tier: str | None = None


class LinkSpec(_Strict):
    a: Name
    b: Name
    bandwidth_gbps: float | None = Field(None, ge=0, description="Per direction; null = unconstrained, 0 = down.")


class TopologySpec(_Strict):
    """The JSON topology file: hosts, switches, links, optionally the PS and workers."""

    name: str | None = None
    hosts: list[Name]
    switches: list[SwitchSpec]
    links: list[LinkSpec]
    ps: Name | None = None
    workers: list[Name] | None = Field(None, min_length=1)


def load_topology(path: str | Path) -> nx.Graph:
    """Read and validate a JSON topology file; every problem is a one-line ConfigError."""
    src = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{src}: no such file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{src}: not UTF-8 text (byte {err.start}); a topology file is JSON") from None
    except IsADirectoryError:
        raise ConfigError(f"{src}: is a folder, not a topology file") from None
    except OSError as err:
        raise ConfigError(f"{src}: cannot read ({err.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{src}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    return topology_from_dict(data, src)


def topology_from_dict(data: Any, source: str = "topology") -> nx.Graph:
    """Validate the parsed JSON and build the graph."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object with hosts, switches and links")
    try:
        spec = TopologySpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_pydantic_line(err, source)) from None
    return _build(spec, source)


def _pydantic_line(err: ValidationError, source: str) -> str:
    """The first problem as ``SOURCE: key.path[i]: message``; a union's alternatives joined with "or"."""
    def key(loc: tuple[int | str, ...]) -> str:
        parts = [p for p in loc if isinstance(p, int) or ("[" not in p and p not in ("int", "str", "float", "bool"))]
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "file"

    errors = err.errors()
    first = errors[0]
    same = [e["msg"] for e in errors if key(e["loc"]) == key(first["loc"])]
    msg = "unknown key" if first["type"] == "extra_forbidden" else " or ".join(dict.fromkeys(same))
    return f"{source}: {key(first['loc'])}: {msg}"


def _build(spec: TopologySpec, source: str) -> nx.Graph:
    g = nx.Graph(name=spec.name or Path(source).stem)
    seen: set[str] = set()
    for name in spec.hosts:
        _check_new(name, seen, source)
        g.add_node(name, kind="host")
    for sw in spec.switches:
        _check_new(sw.name, seen, source)
        g.add_node(sw.name, kind="switch", tier=sw.tier or "switch", programmable=sw.programmable, capacity_gbps=sw.capacity_gbps)
        if sw.slots is not None:
            g.nodes[sw.name]["slots"] = sw.slots
    for i, link in enumerate(spec.links):
        for end in (link.a, link.b):
            if end not in g:
                raise ConfigError(f"{source}: links[{i}]: unknown node {end!r}")
        if link.a == link.b:
            raise ConfigError(f"{source}: links[{i}]: a link from {link.a!r} to itself")
        if g.has_edge(link.a, link.b):
            raise ConfigError(f"{source}: links[{i}]: duplicate link {link.a!r}-{link.b!r}")
        bw = math.inf if link.bandwidth_gbps is None else link.bandwidth_gbps
        g.add_edge(link.a, link.b, bandwidth_gbps=bw)
    _check_hosts(g, spec, source)
    return g


def _check_new(name: str, seen: set[str], source: str) -> None:
    if name in seen:
        raise ConfigError(f"{source}: node {name!r} is defined twice")
    seen.add(name)


def _check_hosts(g: nx.Graph, spec: TopologySpec, source: str) -> None:
    if not spec.hosts:
        raise ConfigError(f"{source}: hosts: no hosts, so no PS and no workers")
    for h in spec.hosts:
        if g.degree(h) == 0:
            raise ConfigError(f"{source}: host {h!r} has no links (disconnected)")
    if spec.ps is not None:
        if spec.ps not in g or g.nodes[spec.ps]["kind"] != "host":
            raise ConfigError(f"{source}: ps: {spec.ps!r} is not one of the hosts")
        g.graph["ps"] = spec.ps
    if spec.workers is not None:
        for w in spec.workers:
            if w not in g or g.nodes[w]["kind"] != "host":
                raise ConfigError(f"{source}: workers: {w!r} is not one of the hosts")
        if len(set(spec.workers)) != len(spec.workers):
            raise ConfigError(f"{source}: workers: a host is listed twice")
        g.graph["workers"] = list(spec.workers)


def topology_to_dict(g: nx.Graph, ps: str | None = None, workers: list[str] | tuple[str, ...] | None = None) -> dict[str, Any]:
    """The JSON form of a graph (inverse of ``topology_from_dict``)."""
    ps = ps if ps is not None else g.graph.get("ps")
    workers = workers if workers is not None else g.graph.get("workers")
    out: dict[str, Any] = {
        "name": g.graph.get("name"),
        "hosts": hosts(g),
        "switches": [
            {"name": s, "programmable": bool(g.nodes[s]["programmable"]), "capacity_gbps": float(g.nodes[s]["capacity_gbps"]), "tier": g.nodes[s].get("tier"),
             **({"slots": int(g.nodes[s]["slots"])} if "slots" in g.nodes[s] else {})}
            for s in switches(g)
        ],
        "links": [
            {"a": a, "b": b, "bandwidth_gbps": None if math.isinf(bw) else float(bw)}
            for a, b, bw in sorted(g.edges(data="bandwidth_gbps"), key=lambda e: (e[0], e[1]))
        ],
    }
    if ps is not None:
        out["ps"] = ps
    if workers is not None:
        out["workers"] = list(workers)
    return out


def save_topology(g: nx.Graph, path: str | Path, ps: str | None = None, workers: list[str] | tuple[str, ...] | None = None) -> None:
    """Write the JSON file that ``load_topology`` reads back to an equal graph."""
    Path(path).write_text(json.dumps(topology_to_dict(g, ps, workers), indent=1) + "\n")
