"""A plan's nodes built and connected, a whole round driven in-process, and the error bound."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from shoal.network.dataplane.server import Server, ServerCounters
from shoal.network.dataplane.switch import Switch, SwitchCounters
from shoal.network.dataplane.wire import Ack, Message, agree, fragment_count, headroom
from shoal.network.dataplane.worker import BACKOFF, Worker, WorkerCounters


def switch_groups(assignment: Mapping[str, str], ps: str) -> dict[str, frozenset[str]]:
    """Aggregation switch -> its workers (the PS's own workers left out)."""
    groups: dict[str, set[str]] = {}
    for worker, node in assignment.items():
        if node != ps:
            groups.setdefault(node, set()).add(worker)
    return {s: frozenset(ws) for s, ws in sorted(groups.items())}


EXPONENT_MODES = ("agreed", "aligned")


@dataclass
class Nodes:
    """Every object of one plan: what a backend places (one actor each) and connects."""

    ps: str
    workers: dict[str, Worker]
    switches: dict[str, Switch]
    server: Server

    def deliver(self, dst: str, msg: Message) -> list[tuple[str, Message]]:
        """Hand ``msg`` to node ``dst``; returns the (destination, message) pairs it sends on."""
        if isinstance(msg, Ack):
            self.workers[dst].on_ack(msg)
            return []
        if dst == self.ps:
            return [(a.worker, a) for a in self.server.receive(msg)]
        return [(self.ps, out) for out in self.switches[dst].receive(msg)]


def build_nodes(
    assignment: Mapping[str, str],
    ps: str,
    n_values: int,
    *,
    slots: int | Mapping[str, int] = 1024,
    probes: int = 1,
    fragment_size: int = 64,
    timeout: float = 1.0,
    backoff: float = BACKOFF,
    exponents: str = "agreed",
) -> Nodes:
    """Workers, switches and the PS for a plan (worker -> aggregation node).

    ``exponents``: ``agreed`` (the workers of a switch settle each fragment's
    exponent first and the switch only adds integers) or ``aligned`` (each
    worker picks its own and the software switch shifts to align them).
    """
    if exponents not in EXPONENT_MODES:
        raise ValueError(f"exponents must be one of {EXPONENT_MODES}, got {exponents!r}")
    if not assignment:
        raise ValueError("the plan has no workers")
    groups = switch_groups(assignment, ps)
    overlap = set(groups) & set(assignment)
    if overlap:
        raise ValueError(f"names used both as worker and as aggregation node: {sorted(overlap)}")
    size = {s: slots if isinstance(slots, int) else slots[s] for s in groups}
    switches = {s: Switch(s, ws, size[s], min(probes, size[s]), align=exponents == "aligned") for s, ws in groups.items()}
    fan_in = {w: len(groups[n]) if n != ps else 1 for w, n in assignment.items()}
    workers = {w: Worker(w, n, fan_in[w], fragment_size, timeout, backoff) for w, n in sorted(assignment.items())}
    return Nodes(ps, workers, switches, Server(ps, assignment.keys(), n_values, fragment_size))


@dataclass(frozen=True)
class Envelope:
    """A message in flight in ``run_round`` (serials count every transmission from 0)."""

    serial: int
    dst: str
    msg: Message


Order = Callable[[Sequence[Envelope]], int]


@dataclass
class RoundResult:
    total: np.ndarray  # the PS's summed gradient, float64
    switches: dict[str, SwitchCounters]
    server: ServerCounters
    workers: dict[str, WorkerCounters]
    transmissions: int  # messages sent, resends included
    delivered: int
    dropped: int
    undelivered: int  # still in flight when the PS completed
    stale_units: int  # units freed by finish_round at the end
    time: float  # virtual: one unit per delivery


def run_round(
    gradients: Mapping[str, np.ndarray],
    assignment: Mapping[str, str],
    ps: str,
    *,
    slots: int | Mapping[str, int] = 1024,
    probes: int = 1,
    fragment_size: int = 64,
    order: int | Order | None = None,
    drop: Callable[[Envelope], bool] | Collection[int] | None = None,
    timeout: float | None = None,
    backoff: float = BACKOFF,
    exponents: str = "agreed",
    round: int = 0,
    max_steps: int | None = None,
) -> RoundResult:
    """Run one round of a plan in-process, message by message, and return the PS's sum and all counters.

    ``order`` picks the next message to deliver among those in flight: None
    delivers in send order, an int seeds a random interleaving, a function
    gets the in-flight envelopes and returns an index. ``drop`` loses
    messages (a predicate on the envelope, or a set of serials). Each
    delivery takes one time unit; when nothing is in flight the clock jumps
    to the next resend. ``timeout`` defaults to four times the first wave of
    fragments, so resends are rare unless messages are lost; each further
    resend of a fragment waits ``backoff`` times longer (1: constant).
    """
    names = sorted(assignment)
    if sorted(gradients) != names:
        raise ValueError("gradients and assignment must name the same workers")
    grads = {w: np.asarray(gradients[w]).reshape(-1) for w in names}
    n_values = grads[names[0]].size
    if any(g.size != n_values for g in grads.values()):
        raise ValueError("all gradients must have the same size")
    first_wave = len(names) * fragment_count(n_values, fragment_size)
    nodes = build_nodes(assignment, ps, n_values, slots=slots, probes=probes, fragment_size=fragment_size,
                        timeout=timeout if timeout is not None else 4.0 * first_wave + 8, backoff=backoff, exponents=exponents)
    loop = _Loop(nodes, _chooser(order), _dropper(drop), max_steps or 200 * first_wave + 1000)
    agreed = _agree(nodes, grads, loop) if exponents == "agreed" else {}
    for w in names:
        loop.send_all([(nodes.workers[w].node, f) for f in nodes.workers[w].send(round, grads[w], loop.now, agreed.get(w))])
    loop.run(round)
    return loop.result(round)


def _agree(nodes: Nodes, grads: Mapping[str, np.ndarray], loop: _Loop) -> dict[str, np.ndarray]:
    """The exponent round trip before a round, as SwitchML does it: each worker of a switch proposes the
    exponents its fragments need, the switch answers with the largest per fragment.

    Modelled as a reliable control exchange: two messages per switch worker
    and one round trip (two time units) on the clock; losses apply to the
    gradient fragments only.
    """
    agreed: dict[str, np.ndarray] = {}
    for s, switch in nodes.switches.items():
        members = sorted(switch.workers)
        settled = agree([nodes.workers[w].proposal(grads[w]) for w in members])
        agreed.update(dict.fromkeys(members, settled))
        loop.sent += 2 * len(members)
        loop.delivered += 2 * len(members)
    if agreed:
        loop.now += 2.0
    return agreed


def _chooser(order: int | Order | None) -> Order:
    if order is None:
        return lambda inflight: 0
    if isinstance(order, int):
        rng = random.Random(order)
        return lambda inflight: rng.randrange(len(inflight))
    return order


def _dropper(drop: Callable[[Envelope], bool] | Collection[int] | None) -> Callable[[Envelope], bool]:
    if drop is None:
        return lambda env: False
    if callable(drop):
        return drop
    serials = frozenset(drop)
    return lambda env: env.serial in serials


class _Loop:
    """The in-process network of ``run_round``: a bag of envelopes and a virtual clock."""

    def __init__(self, nodes: Nodes, choose: Order, drop: Callable[[Envelope], bool], max_steps: int) -> None:
        self.nodes, self.choose, self.drop, self.max_steps = nodes, choose, drop, max_steps
        self.inflight: list[Envelope] = []
        self.now = 0.0
        self.sent = self.delivered = self.dropped = 0

    def send_all(self, outgoing: Sequence[tuple[str, Message]]) -> None:
        for dst, msg in outgoing:
            self.inflight.append(Envelope(self.sent, dst, msg))
            self.sent += 1

    def run(self, round: int) -> None:
        for _ in range(self.max_steps):
            if self.nodes.server.complete(round):
                return
            for w in self.nodes.workers.values():
                self.send_all([(w.node, f) for f in w.due_resends(self.now)])
            if not self.inflight:
                self._jump(round)
                continue
            env = self.inflight.pop(self.choose(self.inflight))
            self.now += 1
            if self.drop(env):
                self.dropped += 1
                continue
            self.delivered += 1
            self.send_all(self.nodes.deliver(env.dst, env.msg))
        raise RuntimeError(f"round {round} did not complete in {self.max_steps} steps")

    def _jump(self, round: int) -> None:
        due = [t for w in self.nodes.workers.values() if (t := w.next_due()) is not None]
        if not due:
            raise RuntimeError(f"round {round} is stuck: nothing in flight, nothing to resend, "
                               f"missing {self.nodes.server.missing(round)}")
        self.now = max(self.now, min(due))

    def result(self, round: int) -> RoundResult:
        n = self.nodes
        total = n.server.result(round)
        n.server.finish_round(round)
        stale = sum(s.finish_round(round) for s in n.switches.values())
        for w in n.workers.values():
            w.finish_round(round)
        return RoundResult(
            total, {k: s.counters for k, s in n.switches.items()}, n.server.counters,
            {k: w.counters for k, w in n.workers.items()}, self.sent, self.delivered, self.dropped,
            len(self.inflight), stale, self.now,
        )


# -- the error bound --------------------------------------------------------------------


def error_bound(gradients: Mapping[str, np.ndarray], assignment: Mapping[str, str], ps: str,
                fragment_size: int = 64, exponents: str = "agreed") -> np.ndarray:
    """Per value, the bound on |PS sum - exact sum| of the module docstring, for any order, drops or array size.

    A switch's K contributions err by at most half a unit each at the
    agreed exponent (K M / L), or, aligned, by up to K - 1 more roundings (2K - 1) M / L.
    """
    grads = {w: np.asarray(g, dtype=np.float64).reshape(-1) for w, g in gradients.items()}
    n_values = next(iter(grads.values())).size
    count = fragment_count(n_values, fragment_size)

    def frag_max(ws: Collection[str]) -> np.ndarray:
        padded = np.zeros((len(ws), count * fragment_size))
        for i, w in enumerate(sorted(ws)):
            padded[i, :n_values] = np.abs(grads[w])
        return np.repeat(padded.reshape(len(ws), count, fragment_size).max(axis=(0, 2)), fragment_size)[:n_values]

    bound = np.zeros(n_values)
    for ws in switch_groups(assignment, ps).values():
        k = len(ws)
        bound += (k if exponents == "agreed" else 2 * k - 1) * frag_max(ws) / headroom(k)
    for w in (w for w, node in assignment.items() if node == ps):
        bound += frag_max([w]) / headroom(1)
    sum_abs = np.sum([np.abs(g) for g in grads.values()], axis=0)
    bound += len(grads) * 2.0**-52 * (sum_abs + bound)
    return bound * (1 + 2.0**-40)  # the bound's own float rounding
