"""Scheme specs for `shoal compare`: ``base[+modifier...]`` -> config overrides.

A spec names a synchronisation scheme and what is layered on it, e.g.
``gssp+gdtopk`` or ``bsp+ina-atp`` (in-network aggregation along the atp
plan). The tables below are the whole vocabulary, so adding a feature to the
comparison is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.config import ConfigError

BASES: dict[str, tuple[str, ...]] = {
    "bsp": ("sync.scheme=bsp",),
    "asp": ("sync.scheme=asp",),
    "ssp": ("sync.scheme=ssp",),
    "gssp": ("sync.scheme=gssp",),
}

COMPRESSORS = ("fp16", "topk", "randk", "dgc", "qsgd", "gdtopk")

PLANNERS = ("grid", "rgria", "exact", "geryon", "atp", "switchml")

MODIFIERS: dict[str, tuple[str, ...]] = {
    "sim": ("compression.similarity.enabled=true",),
    **{name: (f"compression.method={name}",) for name in COMPRESSORS},
    "ina": ("network.aggregation=ina",),
    **{f"ina-{algo}": ("network.aggregation=ina", f"network.algorithm={algo}") for algo in PLANNERS},
}


@dataclass(frozen=True)
class Scheme:
    """One parsed spec: its name (also its folder) and the overrides it applies."""

    name: str
    overrides: tuple[str, ...]


def parse_scheme(spec: str) -> Scheme:
    """Turn ``gssp+sim`` into its overrides; ConfigError on unknown or conflicting parts."""
    name = spec.strip().lower()
    base, *mods = name.split("+")
    if base not in BASES:
        raise ConfigError(f"--schemes: unknown scheme {base!r} in {spec!r}; choose from {', '.join(BASES)}")
    overrides = list(BASES[base])
    keys: dict[str, str] = {}
    for mod in mods:
        if mod not in MODIFIERS:
            raise ConfigError(f"--schemes: unknown modifier {mod!r} in {spec!r}; choose from {', '.join(MODIFIERS)}")
        for override in MODIFIERS[mod]:
            key = override.partition("=")[0]
            if key in keys:
                raise ConfigError(f"--schemes: {keys[key]!r} and {mod!r} in {spec!r} both set {key}")
            keys[key] = mod
        overrides.extend(MODIFIERS[mod])
    return Scheme(name, tuple(overrides))


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
