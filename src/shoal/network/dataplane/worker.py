"""The worker side: fragments, quantises and reliably sends one gradient (resends until acknowledged, backing off)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, replace

import numpy as np

from shoal.network.dataplane.wire import Ack, Fragment, fragment_count, headroom, quantise


@dataclass
class WorkerCounters:
    sent: int = 0  # first transmissions
    resent: int = 0
    acked: int = 0
    stale_acks: int = 0  # acks for fragments no longer pending (duplicates, late)


@dataclass(frozen=True)
class _Pending:
    fragment: Fragment
    due: float  # when it is resent unless acknowledged first


#: a fragment's n-th resend waits timeout * BACKOFF^n, at most timeout * MAX_BACKOFF
BACKOFF = 2.0
MAX_BACKOFF = 4.0


class Worker:
    """Fragments, quantises and reliably sends one worker's gradients to its aggregation node.

    Time is an argument (``now``), never read: the caller owns the clock.
    A fragment not acknowledged within ``timeout`` is resent, and each
    further resend waits ``backoff`` times longer (capped at
    ``MAX_BACKOFF`` x timeout), as TCP does: a timeout set too short, or a
    congested PS, costs a few resends per fragment instead of one per
    timeout for as long as the round lasts. ``backoff=1`` resends at a
    constant interval. Due times sit in a heap, so resends are found without
    scanning everything.
    """

    def __init__(self, name: str, node: str, fan_in: int, fragment_size: int = 64, timeout: float = 1.0, backoff: float = BACKOFF) -> None:
        if fragment_size < 1:
            raise ValueError(f"fragment_size must be at least 1, got {fragment_size}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if not backoff >= 1:
            raise ValueError(f"backoff must be at least 1, got {backoff}")
        headroom(fan_in)
        self.name, self.node, self.fan_in = name, node, fan_in
        self.fragment_size, self.timeout, self.backoff = fragment_size, timeout, backoff
        self.counters = WorkerCounters()
        self._pending: dict[tuple[int, int], _Pending] = {}
        self._due: list[tuple[float, int, tuple[int, int]]] = []  # (due, order sent, key); stale entries skipped
        self._order = itertools.count()

    def proposal(self, gradient: np.ndarray) -> np.ndarray:
        """The exponent each fragment needs on its own: what this worker proposes when exponents are agreed."""
        return quantise(self._blocks(gradient), self.fan_in)[1]

    def _blocks(self, gradient: np.ndarray) -> np.ndarray:
        g = np.asarray(gradient).reshape(-1)
        f = self.fragment_size
        count = fragment_count(g.size, f)
        padded = np.zeros(count * f, dtype=np.float64)
        padded[: g.size] = g
        return padded.reshape(count, f)

    def fragments(self, round: int, gradient: np.ndarray, agreed: np.ndarray | None = None) -> list[Fragment]:
        """The gradient as tagged, quantised fragments (the last one may be shorter), at ``agreed`` exponents if given."""
        n = np.asarray(gradient).size
        count = fragment_count(n, self.fragment_size)
        q, e = quantise(self._blocks(gradient), self.fan_in, agreed)
        f = self.fragment_size
        last = n - (count - 1) * f
        return [
            Fragment(round, self.node, i, self.name, self.fan_in, q[i] if i < count - 1 else q[i, :last], int(e[i]))
            for i in range(count)
        ]

    def send(self, round: int, gradient: np.ndarray, now: float, agreed: np.ndarray | None = None) -> list[Fragment]:
        """Start a round: every fragment, to be sent now and kept until acknowledged."""
        out = self.fragments(round, gradient, agreed)
        for frag in out:
            self._keep((round, frag.fragment), frag, now + self.timeout)
        self.counters.sent += len(out)
        return out

    def _keep(self, key: tuple[int, int], frag: Fragment, due: float) -> None:
        self._pending[key] = _Pending(frag, due)
        heapq.heappush(self._due, (due, next(self._order), key))

    def _wait(self, attempt: int) -> float:
        """How long the fragment's ``attempt``-th transmission waits for its ack."""
        return self.timeout * min(self.backoff ** attempt, MAX_BACKOFF)

    def on_ack(self, ack: Ack) -> None:
        if ack.worker != self.name:
            raise ValueError(f"worker {self.name} got an ack for {ack.worker}")
        if self._pending.pop((ack.round, ack.fragment), None) is None:
            self.counters.stale_acks += 1
        else:
            self.counters.acked += 1

    def due_resends(self, now: float) -> list[Fragment]:
        """Fragments whose wait has run out, to send again now (attempt + 1, waiting longer)."""
        out = []
        while (top := self._top()) is not None and top[0] <= now:
            heapq.heappop(self._due)
            key = top[2]
            frag = replace(self._pending[key].fragment, attempt=self._pending[key].fragment.attempt + 1)
            self._keep(key, frag, now + self._wait(frag.attempt))
            out.append(frag)
        self.counters.resent += len(out)
        return out

    def _top(self) -> tuple[float, int, tuple[int, int]] | None:
        """The earliest live due entry (acknowledged or superseded ones are dropped on the way)."""
        while self._due:
            due, _, key = self._due[0]
            p = self._pending.get(key)
            if p is not None and p.due == due:
                return self._due[0]
            heapq.heappop(self._due)
        return None

    def next_due(self) -> float | None:
        """When the next resend falls due (None if everything is acknowledged)."""
        top = self._top()
        return None if top is None else top[0]

    @property
    def unacked(self) -> int:
        return len(self._pending)

    def finish_round(self, round: int) -> None:
        """The round's result arrived: forget its (and older) fragments."""
        for key in [k for k in self._pending if k[0] <= round]:
            del self._pending[key]
        if not self._pending:
            self._due.clear()
