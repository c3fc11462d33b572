"""Default routing: hop-by-hop ECMP over shortest paths, as a datacenter forwards.

At each hop a flow picks one of the next hops on a shortest path to its
destination by hashing (flow id, node), so a flow's path is deterministic and
different flows spread over equal-cost paths. Hosts never forward, and
zero-bandwidth links are treated as down. Algorithms that do not choose paths
(the paper's model, the baselines) get these paths.
"""

from __future__ import annotations

import zlib
from functools import cached_property

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path


class Routes:
    """Shortest-path ECMP routes on one graph; caches one BFS per destination."""

    def __init__(self, graph: nx.Graph) -> None:
        self.graph = graph
        self._dist: dict[str, dict[str, int]] = {}
        self._paths: dict[tuple[str, str, str], tuple[str, ...]] = {}

    def dist_to(self, dst: str) -> dict[str, int]:
        """Hop distance of every node that can reach ``dst`` (through switches only)."""
        if dst not in self._dist:
            self._dist[dst] = self._hops.to(dst)
        return self._dist[dst]

    @cached_property
    def _hops(self) -> _Hops:
        return _Hops(self.graph)

    def path(self, src: str, dst: str, flow: str | None = None) -> tuple[str, ...]:
        """The ECMP path of ``flow`` (default: ``src``) from ``src`` to ``dst`` (computed once, then cached)."""
        key = flow if flow is not None else src
        if (src, dst, key) not in self._paths:
            self._paths[(src, dst, key)] = self._walk(src, dst, key)
        return self._paths[(src, dst, key)]

    def _walk(self, src: str, dst: str, key: str) -> tuple[str, ...]:
        dist = self.dist_to(dst)
        if src not in dist:
            raise ValueError(f"no route from {src!r} to {dst!r}")
        path = [src]
        node = src
        while node != dst:
            hops = sorted(v for v in self.graph[node] if dist.get(v) == dist[node] - 1 and self._forwards(v, dst) and self.graph[node][v]["bandwidth_gbps"] > 0)
            node = hops[zlib.crc32(f"{key}|{node}".encode()) % len(hops)]
            path.append(node)
        return tuple(path)

    def _forwards(self, node: str, dst: str) -> bool:
        return node == dst or self.graph.nodes[node]["kind"] == "switch"


class _Hops:
    """Breadth-first hop counts in SciPy over the arcs a stream can take: out of switches, over live links."""

    def __init__(self, g: nx.Graph) -> None:
        self.graph = g
        self.names = list(g.nodes)
        self.index = {n: i for i, n in enumerate(self.names)}
        arcs = [(self.index[u], self.index[v]) for a, b, bw in g.edges(data="bandwidth_gbps") if bw > 0
                for u, v in ((a, b), (b, a)) if g.nodes[u]["kind"] == "switch"]
        tails, heads = (np.array(x, dtype=np.int32) for x in zip(*arcs)) if arcs else (np.zeros(0, np.int32),) * 2
        n = len(self.names)
        self.arcs = sp.csr_matrix((np.ones(len(tails), dtype=np.int8), (tails, heads)), shape=(n, n))

    def to(self, dst: str) -> dict[str, int]:
        """Hops from every node that can reach ``dst``: a stream from x to dst reversed is dst -> ... -> x over the arcs."""
        g = self.graph
        if g.nodes[dst]["kind"] == "switch":
            hops = shortest_path(self.arcs, directed=True, unweighted=True, indices=self.index[dst])
        else:  # a host: one hop to each live neighbour, then on from the switches among them
            live = [v for v in g[dst] if g[dst][v]["bandwidth_gbps"] > 0]
            hops = np.full(len(self.names), np.inf)
            via = [self.index[v] for v in live if g.nodes[v]["kind"] == "switch"]
            if via:
                hops = np.min(np.atleast_2d(shortest_path(self.arcs, directed=True, unweighted=True, indices=via)), axis=0) + 1
            hops[[self.index[v] for v in live]] = 1
            hops[self.index[dst]] = 0
        return {self.names[i]: int(hops[i]) for i in np.flatnonzero(np.isfinite(hops))}
