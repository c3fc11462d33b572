"""Scheme specs for `shoal compare`: ``base[+modifier...]`` -> config overrides.

A spec names a synchronisation scheme and what is layered on it, e.g.
``gssp+gdtopk``, ``bsp+balance`` (batch sizes in proportion to speed) or
``bsp+ina-atp`` (in-network aggregation along the atp plan), and may pin config values after ``@`` (``bsp@optimizer.lr=0.02``),
which also keeps those keys out of ``--tune`` for that scheme. The
vocabulary is read from the registries (shoal.registry), so a newly
registered scheme, compressor or planner is comparable with no line here;
a user's scheme (the base) or compressor (a modifier) is written as its
``python:FILE.py:CLASS`` spec and names its row by the class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shoal.config import toml_value
from shoal.errors import ConfigError
from shoal.registry import COMPRESSORS, PLANNERS, PLUGIN_PREFIX, SCHEMES


def bases() -> dict[str, tuple[str, ...]]:
    """Every registered scheme as a base, with the override that selects it."""
    return {name: (f"sync.scheme={name}",) for name in SCHEMES}


def modifiers() -> dict[str, tuple[str, ...]]:
    """``sim``, ``balance`` (batch sizes to speed), ``balance-steps`` (local steps to speed), ``balance-deadline``
    (bounded-time rounds), every registered compressor, ``ina`` and ``ina-<planner>`` for every registered planner."""
    return {
        "sim": ("compression.similarity.enabled=true",),
        "balance": ("sync.balance=batch",),
        "balance-steps": ("sync.balance=steps",),
        "balance-deadline": ("sync.balance=deadline",),
        **{name: (f"compression.method={name}",) for name in COMPRESSORS},
        "ina": ("network.aggregation=ina",),
        **{f"ina-{algo}": ("network.aggregation=ina", f"network.algorithm={algo}") for algo in PLANNERS},
    }


@dataclass(frozen=True)
class Scheme:
    """One parsed spec: its name (also its folder) and the overrides it applies."""

    name: str
    overrides: tuple[str, ...]
    pinned: tuple[tuple[str, str], ...] = ()  # (key, value as written) after "@"
    base: str = ""  # the synchronisation scheme (sync.scheme)
    modified: bool = False  # whether modifiers (compression, sim, ina) are layered on the base

    @property
    def baseline(self) -> bool:
        """A plain established scheme (bsp, asp, ssp, localsgd, diloco, ...): what p-values compare against."""
        spec = SCHEMES.get(self.base)
        return not self.modified and spec is not None and spec.baseline

    def own_grid(self) -> dict[str, list[Any]]:
        """The base scheme's own knobs (``SchemeSpec.grid``), without the keys this spec pins."""
        spec = SCHEMES.get(self.base)
        pinned = {k for k, _ in self.pinned}
        return {k: list(v) for k, v in (spec.grid if spec else ()) if k not in pinned}


def parse_scheme(spec: str) -> Scheme:
    """Turn ``gssp+sim@optimizer.lr=0.02`` into its overrides; ConfigError on unknown or conflicting parts."""
    body, *pins = spec.strip().split("@")
    parts = [p if p.startswith(PLUGIN_PREFIX) else p.lower() for p in body.split("+")]
    name = "@".join(["+".join(_short(p) for p in parts), *pins])
    pinned = tuple(_pin(p, spec) for p in pins)
    base, *mods = parts
    known_bases, known_mods = bases(), modifiers()
    if base.startswith(PLUGIN_PREFIX):
        known_bases[base] = (f"sync.scheme={toml_value(base)}",)
    if base not in known_bases:
        raise ConfigError(f"--schemes: unknown scheme {base!r} in {spec!r}; choose from {', '.join(known_bases)} "
                          f"or python:FILE.py:CLASS")
    overrides = list(known_bases[base])
    keys: dict[str, str] = {}
    for mod in mods:
        if mod.startswith(PLUGIN_PREFIX):
            known_mods[mod] = (f"compression.method={toml_value(mod)}",)
        if mod not in known_mods:
            raise ConfigError(f"--schemes: unknown modifier {mod!r} in {spec!r}; choose from {', '.join(known_mods)}")
        for override in known_mods[mod]:
            key = override.partition("=")[0]
            if key in keys:
                raise ConfigError(f"--schemes: {keys[key]!r} and {mod!r} in {spec!r} both set {key}")
            keys[key] = mod
        overrides.extend(known_mods[mod])
    for key, value in pinned:
        if key in keys or any(o.startswith(f"{key}=") for o in known_bases[base]):
            raise ConfigError(f"--schemes: {spec!r} pins {key}, which the scheme itself sets")
        keys[key] = "@"
        overrides.append(f"{key}={value}")
    return Scheme(name, tuple(overrides), pinned, base, bool(mods))


def _short(part: str) -> str:
    """How a part names its row and folder: a plug-in by its class (``python:x/q.py:QuantileSSP`` -> ``QuantileSSP``)."""
    return part.rpartition(":")[2] if part.startswith(PLUGIN_PREFIX) else part


def _pin(text: str, spec: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip() or "." not in key:
        raise ConfigError(f"--schemes: {spec!r}: after @ give section.key=value, e.g. bsp@optimizer.lr=0.02")
    return key.strip(), value.strip()


def parse_schemes(text: str) -> list[Scheme]:
    """Parse a comma-separated list of specs; at least one, no duplicates."""
    specs = [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise ConfigError("--schemes: give at least one scheme, e.g. bsp,ssp,gssp")
    schemes = [parse_scheme(s) for s in specs]
    names = [s.name for s in schemes]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"--schemes: {name!r} is listed twice")
    return schemes
