"""A software aggregation switch: fixed memory units, int32 sums with aligned exponents, ATP-style fallbacks."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from shoal.network.dataplane.wire import INT32_MAX, Aggregate, Fragment, rshift_round


@dataclass
class SwitchCounters:
    received: int = 0
    aggregated_fragments: int = 0  # contributions summed in a unit
    completed: int = 0  # finished sums sent to the PS (each covers all workers)
    fallbacks_collision: int = 0  # forwarded unaggregated: its unit holds another fragment
    fallbacks_full: int = 0  # forwarded unaggregated: every unit is taken
    fallbacks_exponent: int = 0  # forwarded unaggregated: its exponent differs from the unit's (agreed mode)
    duplicates: int = 0  # resends from a worker the unit had already seen
    partial_flushes: int = 0  # partial sums sent to the PS (a duplicate showed the unit stuck)
    partial_contributions: int = 0  # contributions inside those partial sums
    stale_released: int = 0  # units of a finished round reclaimed
    stale_contributions: int = 0  # contributions in them (the PS had them another way)

    @property
    def fallbacks(self) -> int:
        return self.fallbacks_collision + self.fallbacks_full + self.fallbacks_exponent


@dataclass
class _Unit:
    round: int
    fragment: int
    acc: np.ndarray  # int64, always within int32 (see the module docstring)
    exp: int
    seen: set[str] = field(default_factory=set)


class Switch:
    """A software aggregation switch: a fixed array of ``slots`` memory units, int32 sums.

    ``align=False`` (agreed exponents, what a Tofino can do): every
    contribution to a unit must carry the unit's exponent, and one that does
    not is forwarded unaggregated; the sum is plain integer addition.
    ``align=True`` (software only): the switch shifts to the larger
    exponent, a data-dependent shift no switch ASIC performs.
    """

    def __init__(self, name: str, workers: Collection[str], slots: int, probes: int = 1, align: bool = False) -> None:
        if not workers:
            raise ValueError(f"switch {name} has no workers")
        if slots < 1 or not 1 <= probes <= slots:
            raise ValueError(f"switch {name}: need slots >= 1 and 1 <= probes <= slots, got {slots}, {probes}")
        self.name, self.workers = name, frozenset(workers)
        self.fan_in, self.slots, self.probes, self.align = len(self.workers), slots, probes, align
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
            if not self.align and frag.exp != unit.exp:
                self.counters.fallbacks_exponent += 1
                return [frag]
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
            unit.acc = rshift_round(unit.acc, frag.exp - unit.exp)
            unit.exp = frag.exp
        else:
            q = rshift_round(q, unit.exp - frag.exp)
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
