"""The worker side: fragments, quantises and reliably sends one gradient (resends until acknowledged)."""

from __future__ import annotations

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
