"""Default routing: hop-by-hop ECMP over shortest paths, as a datacenter forwards.

At each hop a flow picks one of the next hops on a shortest path to its
destination by hashing (flow id, node), so a flow's path is deterministic and
different flows spread over equal-cost paths. Hosts never forward, and
zero-bandwidth links are treated as down. Algorithms that do not choose paths
(the paper's model, the baselines) get these paths.
"""

from __future__ import annotations

import zlib
from collections import deque

import networkx as nx


class Routes:
    """Shortest-path ECMP routes on one graph; caches one BFS per destination."""

    def __init__(self, graph: nx.Graph) -> None:
        self.graph = graph
        self._dist: dict[str, dict[str, int]] = {}

    def dist_to(self, dst: str) -> dict[str, int]:
        """Hop distance of every node that can reach ``dst`` (through switches only)."""
        if dst not in self._dist:
            self._dist[dst] = _bfs(self.graph, dst)
        return self._dist[dst]

    def path(self, src: str, dst: str, flow: str | None = None) -> tuple[str, ...]:
        """The ECMP path of ``flow`` (default: ``src``) from ``src`` to ``dst``."""
        dist = self.dist_to(dst)
        if src not in dist:
            raise ValueError(f"no route from {src!r} to {dst!r}")
        key = flow if flow is not None else src
        path = [src]
        node = src
        while node != dst:
            hops = sorted(v for v in self.graph[node] if dist.get(v) == dist[node] - 1 and self._forwards(v, dst) and self.graph[node][v]["bandwidth_gbps"] > 0)
            node = hops[zlib.crc32(f"{key}|{node}".encode()) % len(hops)]
            path.append(node)
        return tuple(path)

    def _forwards(self, node: str, dst: str) -> bool:
        return node == dst or self.graph.nodes[node]["kind"] == "switch"


def _bfs(g: nx.Graph, dst: str) -> dict[str, int]:
    dist = {dst: 0}
    queue = deque([dst])
    while queue:
        u = queue.popleft()
        if u != dst and g.nodes[u]["kind"] == "host":
            continue
        for v, attrs in g[u].items():
            if v not in dist and attrs["bandwidth_gbps"] > 0:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist
