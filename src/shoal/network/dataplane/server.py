"""The PS side: counts each worker's contribution to each fragment exactly once."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from shoal.network.dataplane.wire import Ack, Aggregate, Fragment, dequantise, fragment_count, fragment_slice


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
