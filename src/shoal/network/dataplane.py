"""The GRID data plane as pure objects: workers, software aggregation switches, the PS.

A plan (``network.Plan.assignment``) sends each worker's gradient to one
aggregation node: a programmable switch or the PS. This module carries that
plan out on real gradients. Everything here is a plain object driven by
messages and an explicit clock (no threads, sockets, sleeps or Ray): the ray
backend wraps one object per actor (``build_nodes`` makes them for a plan,
``Nodes.deliver`` shows the routing) and moves the messages, the sim backend
can read the counters, and ``run_round`` drives a whole round in-process.

Protocol (one round r):

- ``Worker.send`` cuts the flat gradient into fragments of F values, tagged
  (round, aggregation node, fragment id, worker) and quantised to int32
  (below), and keeps each one until it is acknowledged; ``due_resends(now)``
  returns those not acknowledged within ``timeout``.
- ``Switch.receive`` sums fragments addressed to it in a fixed array of
  memory units (slots). A fragment hashes to unit ``(fragment id + r) mod
  slots`` (``probes`` > 1 also tries the next units). Its own unit: add it,
  once per worker (the unit keeps the set of workers seen). A free unit:
  claim it. Otherwise the fragment is not aggregated but forwarded to the
  PS as it is (``fallbacks_collision``: the unit holds another fragment;
  ``fallbacks_full``: every unit is taken), as ATP and SwitchML do. When
  every worker assigned to the switch has contributed, the sum goes to the
  PS and the unit is freed. A resend from a worker the unit has already
  seen means that worker was never acknowledged, so the unit is stuck
  (another contributor fell back, or was lost): the switch flushes the
  partial sum to the PS (``partial_flushes``) and frees the unit. A unit
  left from an older round is stale (rounds are sequential: a fragment of
  round r+1 exists only after the PS finished round r) and is reclaimed.
- ``Server.receive`` takes finished or partial sums (each names the set of
  workers it covers) and single fragments (fallbacks, and workers assigned
  to the PS). Per fragment it keeps disjoint parts, so a contribution is
  counted exactly once: a message whose workers are all covered already is
  a duplicate (re-acknowledged, ignored); one that covers every worker of
  each part it overlaps replaces those parts (a finished sum arriving after
  a fallback of one of its workers); one that overlaps a part only partly
  is rejected, and the workers it alone would have covered resend. The PS
  acknowledges every covered worker, and the round is complete when every
  fragment is covered by every worker.

Quantisation and the error bound. Each worker quantises each fragment on
its own, with no agreement round trip: for a node with K assigned workers
(K = 1 at the PS) the headroom is L = floor((2^31 - 1) / K); with m the
fragment's max |value|, the exponent e is the smallest integer with
m * 2^-e <= L, and q = round(v * 2^-e), so |q| <= L and v = q * 2^e within
2^(e-1). SwitchML instead makes the workers agree on one exponent per block
first (piggybacked on the previous block); here the software switch aligns
exponents itself: a unit's sum is kept at the largest exponent among its
contributors, an incoming fragment with a smaller exponent is shifted right
with rounding, and the sum is shifted when a larger one arrives. Every
aligned contribution stays within L, so K of them always fit in int32 (no
overflow, ever), at the price of at most K - 1 extra roundings of half a
unit. All-zero fragments get exponent ``ZERO_EXP`` and never coarsen a sum.

Hence, per value of a fragment, for a switch with K workers whose largest
|value| in that fragment is M_s (over all its workers):

    |error| < (2K - 1) * M_s / L(K),   L(K) = floor((2^31 - 1) / K),

about 2 K^2 M_s / 2^31 (partial sums and fallbacks of the same workers
together obey the same bound), and for a worker sent to the PS, whose own
largest |value| in the fragment is m_w, |error| < m_w / (2^31 - 1). The
round's sum is the total over nodes plus float64 rounding at the PS, at most
N * 2^-52 * sum_w |v_w| (N workers). ``error_bound`` computes exactly this.
For N workers and K <= K_max it is about N * K_max * M / 2^30, M the largest
|value| in the fragment: below the rounding of summing the N float32
gradients in float32 (about N * M * 2^-24) while K_max <= 64. As in
SwitchML, the shared exponent makes the error relative to the fragment's
largest value, not to each value.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

INT32_MAX = 2**31 - 1
#: exponent of an all-zero fragment: below any real one, so it never coarsens a sum
ZERO_EXP = -1100
#: |q| <= 2^31, so a right shift by more than 32 bits rounds to 0
_MAX_SHIFT = 40


# -- quantisation ----------------------------------------------------------------------


def headroom(fan_in: int) -> int:
    """Largest |q| one contributor may send so that ``fan_in`` of them sum within int32."""
    if fan_in < 1:
        raise ValueError(f"fan_in must be at least 1, got {fan_in}")
    return INT32_MAX // fan_in


def exponents(maxabs: np.ndarray, limit: int) -> np.ndarray:
    """Per fragment, the smallest e with maxabs * 2^-e <= limit (``ZERO_EXP`` where maxabs is 0).

    Found from frexp and then corrected with exact comparisons (ldexp is
    exact), so the headroom is never exceeded by a rounding of the estimate.
    """
    m = np.asarray(maxabs, dtype=np.float64)
    pos = m > 0
    _, e = np.frexp(np.where(pos, m, 1.0) / limit)
    e = e.astype(np.int64)
    m0 = np.where(pos, m, 0.0)
    while (up := np.ldexp(m0, -e) > limit).any():
        e = e + up
    while (down := pos & (np.ldexp(m0, -(e - 1)) <= limit)).any():
        e = e - down
    return np.where(pos, e, ZERO_EXP)


def quantise(blocks: np.ndarray, fan_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of values -> (int32 rows q, one exponent per row) with value ~ q * 2^e, |q| <= headroom."""
    v = np.asarray(blocks, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError("cannot quantise a gradient with inf or nan values")
    limit = headroom(fan_in)
    e = exponents(np.abs(v).max(axis=1, initial=0.0), limit)
    q = np.rint(np.ldexp(v, -e[:, None]))
    return q.astype(np.int32), e


def dequantise(values: np.ndarray, exp: int) -> np.ndarray:
    """int values * 2^exp as float64 (exact: |values| < 2^53)."""
    return np.ldexp(values.astype(np.float64), exp)


def _rshift_round(a: np.ndarray, d: int) -> np.ndarray:
    """round(a / 2^d), ties up, in exact integer arithmetic: error at most half a unit."""
    if d <= 0:
        return a
    if d > _MAX_SHIFT:
        return np.zeros_like(a)
    return (a + (1 << (d - 1))) >> d


def fragment_count(n_values: int, fragment_size: int) -> int:
    return -(-n_values // fragment_size)


def fragment_slice(fragment: int, fragment_size: int, n_values: int) -> slice:
    return slice(fragment * fragment_size, min((fragment + 1) * fragment_size, n_values))


# -- messages ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Fragment:
    """F quantised values of one worker's gradient, addressed to one aggregation node."""

    round: int
    node: str  # the aggregation node it is addressed to (a switch, or the PS)
    fragment: int
    worker: str
    fan_in: int  # workers assigned to `node`: sets the headroom (checked by the switch)
    values: np.ndarray  # int32
    exp: int  # value = values * 2^exp
    attempt: int = 0  # 0 for the first transmission


@dataclass(frozen=True, eq=False)
class Aggregate:
    """A switch's sum of one fragment over a set of its workers (all of them if complete)."""

    round: int
    node: str  # the switch that summed it
    fragment: int
    workers: frozenset[str]
    values: np.ndarray  # int32
    exp: int
    complete: bool


@dataclass(frozen=True)
class Ack:
    """The PS holds ``worker``'s contribution to this fragment: stop resending it."""

    round: int
    fragment: int
    worker: str


Message = Fragment | Aggregate | Ack


# -- worker side -------------------------------------------------------------------------


@dataclass
class WorkerCounters:
    sent: int = 0  # first transmissions
    resent: int = 0
    acked: int = 0
    stale_acks: int = 0  # acks for fragments no longer pending (duplicates, late)


@dataclass(frozen=True)
class _Pending:
    fragment: Fragment
    sent_at: float


class Worker:
    """Fragments, quantises and reliably sends one worker's gradients to its aggregation node.

    Time is an argument (``now``), never read: the caller owns the clock.
    Unacknowledged fragments are kept in send order, so resends are found
    without scanning everything.
    """

    def __init__(self, name: str, node: str, fan_in: int, fragment_size: int = 64, timeout: float = 1.0) -> None:
        if fragment_size < 1:
            raise ValueError(f"fragment_size must be at least 1, got {fragment_size}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        headroom(fan_in)
        self.name, self.node, self.fan_in = name, node, fan_in
        self.fragment_size, self.timeout = fragment_size, timeout
        self.counters = WorkerCounters()
        self._pending: dict[tuple[int, int], _Pending] = {}

    def fragments(self, round: int, gradient: np.ndarray) -> list[Fragment]:
        """The gradient as tagged, quantised fragments (the last one may be shorter)."""
        g = np.asarray(gradient).reshape(-1)
        n, f = g.size, self.fragment_size
        count = fragment_count(n, f)
        padded = np.zeros(count * f, dtype=np.float64)
        padded[:n] = g
        q, e = quantise(padded.reshape(count, f), self.fan_in)
        last = n - (count - 1) * f
        return [
            Fragment(round, self.node, i, self.name, self.fan_in, q[i] if i < count - 1 else q[i, :last], int(e[i]))
            for i in range(count)
        ]

    def send(self, round: int, gradient: np.ndarray, now: float) -> list[Fragment]:
        """Start a round: every fragment, to be sent now and kept until acknowledged."""
        out = self.fragments(round, gradient)
        for frag in out:
            self._pending[(round, frag.fragment)] = _Pending(frag, now)
        self.counters.sent += len(out)
        return out

    def on_ack(self, ack: Ack) -> None:
        if ack.worker != self.name:
            raise ValueError(f"worker {self.name} got an ack for {ack.worker}")
        if self._pending.pop((ack.round, ack.fragment), None) is None:
            self.counters.stale_acks += 1
        else:
            self.counters.acked += 1

    def due_resends(self, now: float) -> list[Fragment]:
        """Fragments unacknowledged for ``timeout`` or more, to send again now (attempt + 1)."""
        out = []
        while self._pending:
            key, p = next(iter(self._pending.items()))
            if p.sent_at + self.timeout > now:
                break
            del self._pending[key]
            frag = replace(p.fragment, attempt=p.fragment.attempt + 1)
            self._pending[key] = _Pending(frag, now)
            out.append(frag)
        self.counters.resent += len(out)
        return out

    def next_due(self) -> float | None:
        """When the next resend falls due (None if everything is acknowledged)."""
        p = next(iter(self._pending.values()), None)
        return None if p is None else p.sent_at + self.timeout

    @property
    def unacked(self) -> int:
        return len(self._pending)

    def finish_round(self, round: int) -> None:
        """The round's result arrived: forget its (and older) fragments."""
        for key in [k for k in self._pending if k[0] <= round]:
            del self._pending[key]


# -- the switch ------------------------------------------------------------------------


@dataclass
class SwitchCounters:
    received: int = 0
    aggregated_fragments: int = 0  # contributions summed in a unit
    completed: int = 0  # finished sums sent to the PS (each covers all workers)
    fallbacks_collision: int = 0  # forwarded unaggregated: its unit holds another fragment
    fallbacks_full: int = 0  # forwarded unaggregated: every unit is taken
    duplicates: int = 0  # resends from a worker the unit had already seen
    partial_flushes: int = 0  # partial sums sent to the PS (a duplicate showed the unit stuck)
    partial_contributions: int = 0  # contributions inside those partial sums
    stale_released: int = 0  # units of a finished round reclaimed
    stale_contributions: int = 0  # contributions in them (the PS had them another way)

    @property
    def fallbacks(self) -> int:
        return self.fallbacks_collision + self.fallbacks_full


@dataclass
class _Unit:
    round: int
    fragment: int
    acc: np.ndarray  # int64, always within int32 (see the module docstring)
    exp: int
    seen: set[str] = field(default_factory=set)


class Switch:
    """A software aggregation switch: a fixed array of ``slots`` memory units, int32 sums."""

    def __init__(self, name: str, workers: Collection[str], slots: int, probes: int = 1) -> None:
        if not workers:
            raise ValueError(f"switch {name} has no workers")
        if slots < 1 or not 1 <= probes <= slots:
            raise ValueError(f"switch {name}: need slots >= 1 and 1 <= probes <= slots, got {slots}, {probes}")
        self.name, self.workers = name, frozenset(workers)
        self.fan_in, self.slots, self.probes = len(self.workers), slots, probes
        self.counters = SwitchCounters()
        self._units: list[_Unit | None] = [None] * slots
        self._occupied = 0

    @property
    def occupied(self) -> int:
        return self._occupied

    def unit_of(self, round: int, fragment: int) -> int:
        """The home unit; consecutive fragments use consecutive units, so F * slots values fit without collision."""
        return (fragment + round) % self.slots

    def receive(self, frag: Fragment) -> list[Fragment | Aggregate]:
        """One fragment in; what goes on to the PS out (a sum, a partial sum, or the fragment itself)."""
        self._check(frag)
        self.counters.received += 1
        probe = [(self.unit_of(frag.round, frag.fragment) + i) % self.slots for i in range(self.probes)]
        own = next((i for i in probe if self._holds(i, frag)), None)
        if own is not None:
            unit = self._units[own]
            if frag.worker in unit.seen:
                self.counters.duplicates += 1
                self.counters.partial_flushes += 1
                self.counters.partial_contributions += len(unit.seen)
                return [self._release(own, complete=False)]
            return self._add(own, frag)
        free = next((i for i in probe if self._claimable(i, frag.round)), None)
        if free is None:
            full = self._occupied == self.slots
            self.counters.fallbacks_full += full
            self.counters.fallbacks_collision += not full
            return [frag]
        self._claim(free, frag)
        return self._add(free, frag)

    def finish_round(self, round: int) -> int:
        """The PS finished ``round``: free its (and older) units; returns how many."""
        stale = [i for i, u in enumerate(self._units) if u is not None and u.round <= round]
        for i in stale:
            self._drop_stale(i)
        return len(stale)

    def _check(self, frag: Fragment) -> None:
        if frag.node != self.name:
            raise ValueError(f"switch {self.name} got a fragment addressed to {frag.node}")
        if frag.worker not in self.workers:
            raise ValueError(f"switch {self.name} got a fragment from {frag.worker}, not one of its workers")
        if frag.fan_in != self.fan_in:
            raise ValueError(f"switch {self.name} aggregates {self.fan_in} workers, fragment quantised for {frag.fan_in}")

    def _holds(self, i: int, frag: Fragment) -> bool:
        u = self._units[i]
        return u is not None and u.round == frag.round and u.fragment == frag.fragment

    def _claimable(self, i: int, round: int) -> bool:
        u = self._units[i]
        return u is None or u.round < round

    def _claim(self, i: int, frag: Fragment) -> None:
        if self._units[i] is not None:
            self._drop_stale(i)
        self._units[i] = _Unit(frag.round, frag.fragment, np.zeros(frag.values.size, np.int64), frag.exp)
        self._occupied += 1

    def _drop_stale(self, i: int) -> None:
        self.counters.stale_released += 1
        self.counters.stale_contributions += len(self._units[i].seen)
        self._units[i] = None
        self._occupied -= 1

    def _add(self, i: int, frag: Fragment) -> list[Fragment | Aggregate]:
        """Sum at the larger exponent (shift the smaller side, rounding); emit when all have come."""
        unit = self._units[i]
        if frag.values.size != unit.acc.size:
            raise ValueError(f"fragment {frag.fragment} from {frag.worker} has {frag.values.size} values, the unit {unit.acc.size}")
        q = frag.values.astype(np.int64)
        if frag.exp > unit.exp:
            unit.acc = _rshift_round(unit.acc, frag.exp - unit.exp)
            unit.exp = frag.exp
        else:
            q = _rshift_round(q, unit.exp - frag.exp)
        unit.acc += q
        unit.seen.add(frag.worker)
        self.counters.aggregated_fragments += 1
        if len(unit.seen) < self.fan_in:
            return []
        self.counters.completed += 1
        return [self._release(i, complete=True)]

    def _release(self, i: int, complete: bool) -> Aggregate:
        unit = self._units[i]
        self._units[i] = None
        self._occupied -= 1
        if unit.acc.size and int(np.abs(unit.acc).max()) > INT32_MAX:
            raise OverflowError(f"switch {self.name}: int32 sum overflowed (a bug: the headroom forbids it)")
        return Aggregate(unit.round, self.name, unit.fragment, frozenset(unit.seen), unit.acc.astype(np.int32), unit.exp, complete)


# -- the PS ----------------------------------------------------------------------------


@dataclass
class ServerCounters:
    direct_fragments: int = 0  # from workers assigned to the PS
    fallback_fragments: int = 0  # forwarded unaggregated by a switch
    aggregates: int = 0  # complete sums from switches
    partial_aggregates: int = 0
    duplicates: int = 0  # every worker already covered: ignored
    superseded: int = 0  # parts replaced by a sum covering them
    overlaps_rejected: int = 0  # overlapped a part only partly: ignored
    late: int = 0  # for a round already finished
    contributions: int = 0  # (fragment, worker) pairs covered


@dataclass(frozen=True, eq=False)
class _Part:
    workers: frozenset[str]
    values: np.ndarray
    exp: int


@dataclass
class _RoundState:
    total: np.ndarray
    parts: dict[int, list[_Part]] = field(default_factory=dict)
    covered: dict[int, set[str]] = field(default_factory=dict)
    done: int = 0  # fragments covered by every worker


class Server:
    """The PS's receiving side: counts each worker's contribution to each fragment exactly once."""

    def __init__(self, name: str, workers: Collection[str], n_values: int, fragment_size: int = 64) -> None:
        if not workers:
            raise ValueError("the PS has no workers")
        self.name, self.workers = name, frozenset(workers)
        self.n_values, self.fragment_size = n_values, fragment_size
        self.n_fragments = fragment_count(n_values, fragment_size)
        self.counters = ServerCounters()
        self._rounds: dict[int, _RoundState] = {}
        self._finished: set[int] = set()

    def receive(self, msg: Fragment | Aggregate) -> list[Ack]:
        """Take a sum or a fragment; acknowledge every worker it (now) covers."""
        workers = frozenset({msg.worker}) if isinstance(msg, Fragment) else msg.workers
        self._check(msg, workers)
        if msg.round in self._finished:
            self.counters.late += 1
            return self._acks(msg, workers)
        self._count_kind(msg)
        st = self._state(msg.round)
        covered = st.covered.setdefault(msg.fragment, set())
        if workers <= covered:
            self.counters.duplicates += 1
            return self._acks(msg, workers)
        parts = st.parts.setdefault(msg.fragment, [])
        overlap = [p for p in parts if p.workers & workers]
        if any(not p.workers <= workers for p in overlap):
            self.counters.overlaps_rejected += 1
            return self._acks(msg, workers & covered)
        self.counters.superseded += len(overlap)
        parts[:] = [p for p in parts if not p.workers & workers] + [_Part(workers, msg.values, msg.exp)]
        self.counters.contributions += len(workers - covered)
        covered |= workers
        if len(covered) == len(self.workers):
            self._fold(st, msg.fragment)
        return self._acks(msg, workers)

    def complete(self, round: int) -> bool:
        if round in self._finished:
            return True
        st = self._rounds.get(round)
        return self.n_fragments == 0 if st is None else st.done == self.n_fragments

    def missing(self, round: int) -> dict[int, frozenset[str]]:
        """Per fragment, the workers whose contribution has not arrived (for diagnosis)."""
        st = self._rounds.get(round)
        covered = {} if st is None else st.covered
        out = {f: self.workers - covered.get(f, set()) for f in range(self.n_fragments)}
        return {f: frozenset(w) for f, w in out.items() if w}

    def result(self, round: int) -> np.ndarray:
        """The round's summed gradient (float64); only once it is complete."""
        if not self.complete(round) or round in self._finished:
            raise RuntimeError(f"round {round} is not complete (or already finished) at the PS")
        st = self._rounds.get(round)
        return np.zeros(self.n_values) if st is None else st.total.copy()

    def finish_round(self, round: int) -> None:
        """Forget the round; later messages for it are acknowledged and ignored."""
        self._rounds.pop(round, None)
        self._finished.add(round)

    def _check(self, msg: Fragment | Aggregate, workers: frozenset[str]) -> None:
        if not workers <= self.workers:
            raise ValueError(f"the PS got a contribution from unknown workers {sorted(workers - self.workers)}")
        if not 0 <= msg.fragment < self.n_fragments:
            raise ValueError(f"fragment {msg.fragment} out of range 0..{self.n_fragments - 1}")
        size = fragment_slice(msg.fragment, self.fragment_size, self.n_values)
        if msg.values.size != size.stop - size.start:
            raise ValueError(f"fragment {msg.fragment} has {msg.values.size} values, expected {size.stop - size.start}")

    def _count_kind(self, msg: Fragment | Aggregate) -> None:
        c = self.counters
        if isinstance(msg, Aggregate):
            c.aggregates += msg.complete
            c.partial_aggregates += not msg.complete
        elif msg.node == self.name:
            c.direct_fragments += 1
        else:
            c.fallback_fragments += 1

    def _state(self, round: int) -> _RoundState:
        if round not in self._rounds:
            self._rounds[round] = _RoundState(np.zeros(self.n_values))
        return self._rounds[round]

    def _fold(self, st: _RoundState, fragment: int) -> None:
        """Sum a fully covered fragment's parts (in a fixed order) and drop them: nothing can replace them now."""
        sl = fragment_slice(fragment, self.fragment_size, self.n_values)
        for part in sorted(st.parts.pop(fragment), key=lambda p: min(p.workers)):
            st.total[sl] += dequantise(part.values, part.exp)
        st.done += 1

    def _acks(self, msg: Fragment | Aggregate, workers: Collection[str]) -> list[Ack]:
        return [Ack(msg.round, msg.fragment, w) for w in sorted(workers)]


# -- a plan, built and run in-process ------------------------------------------------------


def switch_groups(assignment: Mapping[str, str], ps: str) -> dict[str, frozenset[str]]:
    """Aggregation switch -> its workers (the PS's own workers left out)."""
    groups: dict[str, set[str]] = {}
    for worker, node in assignment.items():
        if node != ps:
            groups.setdefault(node, set()).add(worker)
    return {s: frozenset(ws) for s, ws in sorted(groups.items())}


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
) -> Nodes:
    """Workers, switches and the PS for a plan (worker -> aggregation node)."""
    if not assignment:
        raise ValueError("the plan has no workers")
    groups = switch_groups(assignment, ps)
    overlap = set(groups) & set(assignment)
    if overlap:
        raise ValueError(f"names used both as worker and as aggregation node: {sorted(overlap)}")
    size = {s: slots if isinstance(slots, int) else slots[s] for s in groups}
    switches = {s: Switch(s, ws, size[s], min(probes, size[s])) for s, ws in groups.items()}
    fan_in = {w: len(groups[n]) if n != ps else 1 for w, n in assignment.items()}
    workers = {w: Worker(w, n, fan_in[w], fragment_size, timeout) for w, n in sorted(assignment.items())}
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
    fragments, so resends are rare unless messages are lost.
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
                        timeout=timeout if timeout is not None else 4.0 * first_wave + 8)
    loop = _Loop(nodes, _chooser(order), _dropper(drop), max_steps or 200 * first_wave + 1000)
    for w in names:
        loop.send_all([(nodes.workers[w].node, f) for f in nodes.workers[w].send(round, grads[w], 0.0)])
    loop.run(round)
    return loop.result(round)


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


# -- the bound ---------------------------------------------------------------------------


def error_bound(gradients: Mapping[str, np.ndarray], assignment: Mapping[str, str], ps: str,
                fragment_size: int = 64) -> np.ndarray:
    """Per value, the bound on |PS sum - exact sum| of the module docstring, for any order, drops or array size."""
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
        bound += (2 * k - 1) * frag_max(ws) / headroom(k)
    for w in (w for w, node in assignment.items() if node == ps):
        bound += frag_max([w]) / headroom(1)
    sum_abs = np.sum([np.abs(g) for g in grads.values()], axis=0)
    bound += len(grads) * 2.0**-52 * (sum_abs + bound)
    return bound * (1 + 2.0**-40)  # the bound's own float rounding

