"""The held-out protocol of ``shoal compare``, as a pure value: which seeds tune, which evaluate, what is tuned.

Development seeds choose every scheme's values; evaluation seeds, which
follow them and never overlap them, judge the choice (docs/fair-comparison.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shoal.config import key_bounds
from shoal.errors import ConfigError
from shoal.report.schemes import Scheme
from shoal.report.tuning import widened_grid


@dataclass(frozen=True)
class Protocol:
    """Which seeds tune and which evaluate, and what is tuned (docs/fair-comparison.md).

    With ``tune_seeds`` K > 0 every scheme tries every point of its grid (the
    shared ``--tune`` grid times its own knobs' grid) on the K development
    seeds ``run.seed .. run.seed + K - 1``; the point it keeps then runs on the
    ``seeds`` evaluation seeds that follow, which nothing was chosen on.
    """

    seeds: int = 1
    tune_seeds: int = 0
    grid: dict[str, list[Any]] = field(default_factory=dict)
    own_knobs: bool = True
    widen: int = 0

    def check(self, schemes: list[Scheme]) -> None:
        """Refuse a protocol that cannot run, in one line (exit 2)."""
        if self.seeds < 1:
            raise ConfigError(f"--seeds {self.seeds}: must be at least 1")
        if self.tune_seeds < 0:
            raise ConfigError(f"--tune-seeds {self.tune_seeds}: must be at least 0")
        if self.widen < 0:
            raise ConfigError(f"--widen {self.widen}: must be at least 0")
        if self.widen and not self.tune_seeds:
            raise ConfigError("--widen needs --tune-seeds K: it adds values to the grids the development seeds tune")
        if self.grid and not self.tune_seeds:
            raise ConfigError("--tune needs --tune-seeds K: values are chosen on K development seeds, then the "
                              "chosen ones run on the --seeds evaluation seeds that follow them")
        if self.tune_seeds and not any(self.scheme_grid(s) for s in schemes):
            raise ConfigError(f"--tune-seeds {self.tune_seeds}: nothing to tune (no --tune, and no scheme "
                              "with knobs of its own" + ("" if self.own_knobs else " under --no-own-knobs") + ")")

    def scheme_grid(self, scheme: Scheme) -> dict[str, list[Any]]:
        """Every key the scheme tunes: the shared grid, then its own knobs (a key in both is tuned once), less the
        keys the scheme pins; with ``widen`` N, each numeric grid of three or more values has N more past each end
        (``widened_grid``: the grid's own step continued, within the key's limits), every scheme's alike."""
        if not self.tune_seeds:
            return {}
        own = scheme.own_grid() if self.own_knobs else {}
        pinned = {k for k, _ in scheme.pinned}
        tuned = {**self.grid, **{k: v for k, v in own.items() if k not in self.grid}}
        return {k: widened_grid(v, self.widen, key_bounds(k)) if self.widen else v
                for k, v in tuned.items() if k not in pinned}

    def tuning_seeds(self, base: int) -> list[int]:
        return list(range(base, base + self.tune_seeds))

    def eval_seeds(self, base: int) -> list[int]:
        return list(range(base + self.tune_seeds, base + self.tune_seeds + self.seeds))

    def eval_dir(self, scheme: str, k: int) -> str:
        """The folder of evaluation seed ``run.seed + k``."""
        return scheme if self.seeds == 1 and not self.tune_seeds else f"{scheme}/seed-{k}"
