"""The flow network GRID's search runs on (grid.py): workers, links and candidate aggregation nodes as arcs of a
sparse graph, a max flow at a given stream rate, and its decomposition into each worker's node and path.
Split from grid.py; joint.py, replan.py and the MILP check (grid_milp.py) build on it too."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from shoal.network.instance import Instance

SOURCE, SINK = 0, 1


class FlowNet:
    """The instance as a directed stream network (hosts other than workers and the PS dropped).

    Arcs: every link in both directions (never into a worker or out of the
    PS; hosts do not forward), source -> each worker, each programmable switch
    and the PS -> sink. The sparsity pattern is built once; a max-flow call
    only fills in capacities.
    """

    def __init__(self, inst: Instance) -> None:
        g = inst.graph
        workers = set(inst.workers)
        keep = list(inst.workers) + [n for n, d in g.nodes(data=True) if d["kind"] == "switch" and n != inst.ps] + [inst.ps]
        self.inst = inst
        self.names = ["<source>", "<sink>"] + keep
        self.index = {n: i for i, n in enumerate(self.names)}
        self.prog = list(inst.programmable)
        self.capacity = {s: inst.capacity(s) for s in self.prog}  # Gbps each switch can still sum (others' plans may take some)
        tails, heads, bw = [], [], []
        for u, v, cap in g.edges(data="bandwidth_gbps"):
            for a, b in ((u, v), (v, u)):
                if a in self.index and b in self.index and cap > 0 and a != inst.ps and b not in workers and (a in workers or g.nodes[a]["kind"] == "switch"):
                    tails.append(self.index[a])
                    heads.append(self.index[b])
                    bw.append(cap)
        self.tails, self.heads, self.bw = tails, heads, np.array(bw, dtype=float)
        self._tails_arr, self._heads_arr = np.array(tails, dtype=np.int64), np.array(heads, dtype=np.int64)
        self.out_arcs: dict[int, list[int]] = defaultdict(list)
        for i, t in enumerate(tails):
            self.out_arcs[t].append(i)
        self._arc_of = {(t, h): i for i, (t, h) in enumerate(zip(tails, heads))}
        self._by_tail = np.argsort(self._tails_arr, kind="stable")  # link arcs grouped by tail, for BFS in CSR form
        self._sink_pos = {self.index[s]: i for i, s in enumerate(self.prog + [inst.ps])}
        w = [self.index[x] for x in inst.workers]
        all_t = np.array(tails + [SOURCE] * len(w) + list(self._sink_pos), dtype=np.int64)
        all_h = np.array(heads + w + [SINK] * len(self._sink_pos), dtype=np.int64)
        self._order = np.lexsort((all_h, all_t))
        self._indices = all_h[self._order].astype(np.int32)
        self._indptr = np.searchsorted(all_t[self._order], np.arange(len(self.names) + 1)).astype(np.int32)
        self._ones = np.ones(len(w), dtype=np.int64)

    def arc_index(self, u: str, v: str) -> int | None:
        """The link arc u -> v, if streams can use it."""
        if u not in self.index or v not in self.index:
            return None
        return self._arc_of.get((self.index[u], self.index[v]))

    def arc_flow(self, flow: sp.csr_matrix) -> np.ndarray:
        """Net flow on each link arc."""
        return np.asarray(flow[self._tails_arr, self._heads_arr]).ravel()

    def stream_caps(self, rate: float) -> np.ndarray:
        """Streams each link arc holds at ``rate``."""
        big = len(self.inst.workers) + len(self.prog) + 2
        with np.errstate(divide="ignore", invalid="ignore"):
            caps = np.floor(self.bw / rate * (1 + 1e-9))
        return np.minimum(np.nan_to_num(caps, posinf=big), big).astype(np.int64)

    def max_flow(self, link_caps: np.ndarray, sink_caps: dict[int, int]) -> tuple[int, sp.csr_matrix]:
        """Integer max-flow from the workers to the sinks under these capacities."""
        sinks = np.zeros(len(self._sink_pos), dtype=np.int64)
        for node, cap in sink_caps.items():
            sinks[self._sink_pos[node]] = cap
        data = np.concatenate([link_caps, self._ones, sinks])[self._order].astype(np.int32)
        n = len(self.names)
        res = maximum_flow(sp.csr_matrix((data, self._indices, self._indptr), shape=(n, n)), SOURCE, SINK)
        return int(res.flow_value), res.flow


def stream_path(net: FlowNet, residual: np.ndarray, src: int, dst: int) -> list[int] | None:
    """Shortest path (as arc indices) from a switch to the PS over arcs with room for one stream (BFS in SciPy)."""
    live = net._by_tail[residual[net._by_tail] >= 1]
    n = len(net.names)
    indptr = np.searchsorted(net._tails_arr[live], np.arange(n + 1)).astype(np.int32)
    graph = sp.csr_matrix((np.ones(len(live), dtype=np.int8), net._heads_arr[live].astype(np.int32), indptr), shape=(n, n))
    _, pred = breadth_first_order(graph, src, directed=True, return_predecessors=True)
    if pred[dst] < 0:
        return None
    arcs, v = [], dst
    while v != src:
        u = int(pred[v])
        arcs.append(net._arc_of[(u, v)])
        v = u
    return arcs[::-1]


def decompose(net: FlowNet, flow: sp.csr_matrix) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Split an integral flow into one path per worker (cycles cancelled)."""
    coo = flow.tocoo()
    out: dict[int, dict[int, int]] = defaultdict(dict)
    for u, v, f in zip(coo.row, coo.col, coo.data):
        if f > 0:
            out[int(u)][int(v)] = int(f)
    assignment: dict[str, str] = {}
    paths: dict[str, tuple[str, ...]] = {}
    for w in net.inst.workers:
        walk = [net.index[w]]
        while walk[-1] != SINK:
            u = walk[-1]
            v = next(iter(out[u]))
            _take(out, u, v)
            if v in walk:  # a cycle: it carries no worker, drop it
                walk = walk[: walk.index(v) + 1]
                continue
            walk.append(v)
        path = tuple(net.names[i] for i in walk[:-1])
        assignment[w], paths[w] = path[-1], path
    return assignment, paths


def _take(out: dict[int, dict[int, int]], u: int, v: int) -> None:
    out[u][v] -= 1
    if out[u][v] == 0:
        del out[u][v]
