"""GDTopK: top-k with error feedback whose density depends on the group and on time.

Each group's density follows a DGC-style warm-up: it starts at
``initial_density`` and shrinks geometrically to the group's final density
over ``warmup_epochs`` (global epochs: samples processed / training set).
Slower groups keep a higher final density: the final density is interpolated
between ``final_fast`` (the fastest group) and ``final_slow`` (the slowest)
by the group's iteration time on a log scale, the scale grouping uses. The
schedule is pure: the backend asks it for a density and applies it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shoal.compress.sparsify import TopK
from shoal.config import GDTopKConfig
from shoal.registry import COMPRESSORS


@COMPRESSORS.register("gdtopk", "GSSP's grouping dynamic top-k: a density per group that shrinks over a warm-up")
class GDTopK(TopK):
    """Top-k whose density the per-group ``GDTopKSchedule`` sets (``scheduled``)."""

    name = "gdtopk"
    scheduled = True


@dataclass(frozen=True)
class GDTopKSchedule:
    initial_density: float = 0.25
    warmup_epochs: float = 1.0
    final_fast: float = 0.004
    final_slow: float = 0.015

    @classmethod
    def from_config(cls, gd: GDTopKConfig) -> "GDTopKSchedule":
        return cls(gd.initial_density, gd.warmup_epochs, gd.final_density_fast, gd.final_density_slow)

    def final_density(self, group_time: float, fastest: float, slowest: float) -> float:
        """Final density of a group whose iteration time is ``group_time``."""
        if slowest <= fastest * (1 + 1e-9):
            return self.final_fast
        position = math.log(group_time / fastest) / math.log(slowest / fastest)
        position = min(1.0, max(0.0, position))
        return self.final_fast + position * (self.final_slow - self.final_fast)

    def density(self, epoch: float, group_time: float, fastest: float, slowest: float) -> float:
        """Density at global ``epoch`` for a group of iteration time ``group_time``."""
        final = self.final_density(group_time, fastest, slowest)
        if self.warmup_epochs <= 0 or epoch >= self.warmup_epochs or self.initial_density <= final:
            return final
        progress = epoch / self.warmup_epochs
        return final * (self.initial_density / final) ** (1.0 - progress)

    def group_density(self, epoch: float, times: Sequence[float], members: Sequence[int],
                      groups: Sequence[Sequence[int]] = ()) -> float:
        """Density of the group ``members`` (indices into every worker's iteration ``times``).

        A group's time is its members' median; the endpoints are the fastest
        and the slowest *group's* times (``groups``; without them, every
        worker is its own group). Before any time is known (GSSP still
        profiling) every group gets the fastest group's setting.
        """
        if not times or min(times) <= 0 or not members:
            return self.density(epoch, 1.0, 1.0, 1.0)
        medians = [_median(times, g) for g in groups if g] or list(times)
        return self.density(epoch, _median(times, members), min(medians), max(medians))


def _median(times: Sequence[float], members: Sequence[int]) -> float:
    return float(sorted(times[m] for m in members)[len(members) // 2])
