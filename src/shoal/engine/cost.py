"""Cost model of transfers: latency plus bytes over a bandwidth that is shared.

Sharing model (documented in docs/ARCHITECTURE.md): the server's ingress and
its egress are each a bottleneck of ``server_bps``. The transfers in flight
through one bottleneck share it max-min fairly (water-filling): each flow is
also capped by its worker's own link rate, flows below the fair share keep
their cap, the rest split what is left equally. Rates are recomputed whenever
a flow starts or ends, so a transfer alone on the link runs at
min(link, server) and N simultaneous equal transfers each get server/N.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import simpy


def transfer_time(nbytes: float, bandwidth_bps: float, latency_s: float = 0.0) -> float:
    """Seconds to move ``nbytes`` over an unshared link: latency + size / bandwidth."""
    return latency_s + 8.0 * nbytes / bandwidth_bps


def ring_allreduce_bytes(nbytes: float, workers: int) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce of ``nbytes``: 2 (N - 1) / N of them."""
    return 2.0 * (workers - 1) / workers * nbytes if workers > 1 else 0.0


def ring_allreduce_time(nbytes: float, workers: int, link_bps: float, latency_s: float) -> float:
    """Seconds of a ring all-reduce over links of ``link_bps``: a reduce-scatter then an all-gather.

    Each of the 2 (N - 1) steps moves one N-th of the data over every
    worker's link at once (no shared bottleneck) and pays one latency.
    """
    if workers <= 1:
        return 0.0
    return 2 * (workers - 1) * latency_s + 8.0 * ring_allreduce_bytes(nbytes, workers) / link_bps


@dataclass
class _FlowClass:
    """Flows with the same cap progress at the same rate, so they share one counter."""

    cap: float  # bytes per second
    rate: float = 0.0
    attained: float = 0.0  # bytes every member has received since the class was created
    flows: list[tuple[float, int, simpy.Event]] = field(default_factory=list)  # heap of (finish level, seq, event)


class SharedLink:
    """A bottleneck shared max-min fairly by concurrent flows, on a simpy clock.

    Arrival and departure cost O(classes + log flows), where a class is a
    distinct per-flow cap, so thousands of concurrent equal flows stay cheap.
    """

    def __init__(self, env: simpy.Environment, capacity_bps: float) -> None:
        self.env = env
        self.capacity = capacity_bps / 8.0
        self._classes: dict[float, _FlowClass] = {}
        self._last = env.now
        self._seq = itertools.count()
        self._timer_generation = 0
        self._settle_pending = False
        self.bytes_carried = 0.0

    @property
    def active_flows(self) -> int:
        return sum(len(c.flows) for c in self._classes.values())

    def transfer(self, nbytes: float, cap_bps: float) -> simpy.Event:
        """Start a flow of ``nbytes`` capped at ``cap_bps``; the event fires when it is delivered."""
        done = self.env.event()
        if nbytes <= 0:
            done.succeed()
            return done
        self._advance()
        cap = cap_bps / 8.0
        cls = self._classes.get(cap)
        if cls is None:
            cls = self._classes[cap] = _FlowClass(cap)
        heapq.heappush(cls.flows, (cls.attained + nbytes, next(self._seq), done))
        self.bytes_carried += nbytes
        self._schedule_settle()
        return done

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for cls in self._classes.values():
                cls.attained += cls.rate * dt
        self._last = self.env.now

    def _set_rates(self) -> None:
        """Water-filling: serve the smallest caps first, split the rest equally."""
        remaining, flows_left = self.capacity, self.active_flows
        for cls in sorted(self._classes.values(), key=lambda c: c.cap):
            n = len(cls.flows)
            share = remaining / flows_left if flows_left else 0.0
            cls.rate = min(cls.cap, share)
            remaining -= cls.rate * n
            flows_left -= n

    def _schedule_settle(self) -> None:
        # Many flows often start at the same instant (a BSP round): settle once.
        if not self._settle_pending:
            self._settle_pending = True
            self.env.timeout(0).callbacks.append(self._settle)

    def _settle(self, _event: simpy.Event | None = None) -> None:
        self._settle_pending = False
        self._advance()
        self._complete_finished()
        self._set_rates()
        self._arm_timer()

    def _complete_finished(self) -> None:
        # A flow is done when what is left would take less than the clock can resolve:
        # delays under the float spacing of `now` would never advance time.
        time_tol = 1e-11 * max(1.0, self.env.now)
        for cap in list(self._classes):
            cls = self._classes[cap]
            while cls.flows and cls.flows[0][0] - cls.attained <= cls.rate * time_tol + 1e-9 * cls.flows[0][0]:
                heapq.heappop(cls.flows)[2].succeed()
            if not cls.flows:
                del self._classes[cap]

    def _arm_timer(self) -> None:
        delay = math.inf
        for cls in self._classes.values():
            if cls.rate > 0:
                delay = min(delay, (cls.flows[0][0] - cls.attained) / cls.rate)
        if math.isinf(delay):
            return
        self._timer_generation += 1
        generation = self._timer_generation
        self.env.timeout(max(delay, 0.0)).callbacks.append(
            lambda _e: self._settle() if generation == self._timer_generation else None
        )
