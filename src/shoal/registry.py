"""One registry per kind of component, filled where each component is defined.

A scheme, compressor or planner registers itself with a decorator in its own
module; config validation, CLI help, the generated docs and the report read
the names from here, so adding one is one file. A registry finds its members
by importing every module of its home package the first time it is asked
(the way plug-in systems discover entry points), so this module imports
nothing of shoal and every layer may read it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: how a user's own component is named: ``python:FILE.py:CLASS`` or ``python:package.module:CLASS``
PLUGIN_PREFIX = "python:"


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered item: its name, the object, and one line of help."""

    name: str
    item: T
    help: str = ""


@dataclass(frozen=True)
class Lazy:
    """An item named by its import path (``package.module:attribute``), imported the first time it is used, so a
    registry can list names (config validation, the docs) without importing what the items need (torch)."""

    target: str

    def load(self) -> Any:
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


class Registry(Generic[T]):
    """Names -> items of one kind, discovered from ``home``: a package whose modules register themselves, or a
    module that declares the items by import path (``declare``)."""

    def __init__(self, kind: str, home: str) -> None:
        self.kind = kind
        self.home = home
        self._entries: dict[str, Entry[T]] = {}
        self._discovered = False
        self._load_plugin: Callable[[str], T] | None = None
        self._plugins: dict[str, T] = {}

    def register(self, name: str, help: str = "") -> Callable[[T], T]:
        """Decorator: ``@COMPRESSORS.register("topk", "keep the largest values")`` above a class or function."""

        def add(item: T) -> T:
            self.add(name, item, help)
            return item

        return add

    def add(self, name: str, item: T, help: str = "") -> None:
        """Register ``item`` under ``name``; a second, different item under the same name is a bug."""
        known = self._entries.get(name)
        if known is not None and known.item is not item and _qualname(known.item) != _qualname(item):
            raise ValueError(f"{self.kind} {name!r} is registered twice ({_qualname(known.item)}, {_qualname(item)})")
        self._entries[name] = Entry(name, item, help)

    def declare(self, name: str, target: str, help: str = "") -> None:
        """Register the item at ``target`` (``package.module:attribute``) under ``name`` without importing it."""
        self.add(name, Lazy(target), help)  # type: ignore[arg-type]

    @property
    def takes_plugins(self) -> bool:
        """Whether a ``python:`` spec can name an item of this kind."""
        self._discover()
        return self._load_plugin is not None

    def accept_plugins(self, load: Callable[[str], T]) -> None:
        """Let ``python:FILE.py:CLASS`` names resolve through ``load``, which imports the user's class and checks
        it against the protocol of this kind (the home package sets it: it knows the protocol)."""
        self._load_plugin = load

    def plugin(self, spec: str) -> T:
        """The item of a ``python:`` spec, loaded and checked once per process (a ConfigError when it does not fit)."""
        self._discover()
        if self._load_plugin is None:
            raise ValueError(f"a {self.kind} cannot be a python: plug-in")
        if spec not in self._plugins:
            self._plugins[spec] = self._load_plugin(spec)
        return self._plugins[spec]

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        home = importlib.import_module(self.home)
        for info in pkgutil.walk_packages(getattr(home, "__path__", []), prefix=f"{self.home}."):
            importlib.import_module(info.name)

    def entries(self) -> dict[str, Entry[T]]:
        """Every entry by name (discovering them on first use): the order does not depend on import order."""
        self._discover()
        return dict(sorted(self._entries.items()))

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries())

    def __contains__(self, name: object) -> bool:
        return name in self.entries()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __getitem__(self, name: str) -> T:
        if name.startswith(PLUGIN_PREFIX):
            return self.plugin(name)
        entries = self.entries()
        if name not in entries:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(entries)}")
        return self._resolve(entries[name])

    def get(self, name: str) -> T | None:
        if name.startswith(PLUGIN_PREFIX):
            return self.plugin(name)
        entry = self.entries().get(name)
        return None if entry is None else self._resolve(entry)

    def _resolve(self, entry: Entry[T]) -> T:
        """The entry's item, importing a declared one on first use."""
        if isinstance(entry.item, Lazy):
            self._entries[entry.name] = entry = Entry(entry.name, entry.item.load(), entry.help)
        return entry.item


def _qualname(item: Any) -> str:
    return f"{getattr(item, '__module__', '?')}.{getattr(item, '__qualname__', repr(item))}"


#: synchronisation schemes (``sync.scheme``): ``shoal.sync.base.SchemeSpec`` items
SCHEMES: Registry[Any] = Registry("scheme", "shoal.sync")
#: upload compressors (``compression.method``): ``shoal.compress.base.Compressor`` subclasses
COMPRESSORS: Registry[Any] = Registry("compressor", "shoal.compress")
#: models (``model.name``): factories ``(input_shape, num_classes, *, hidden=None) -> nn.Module``, declared in
#: shoal.catalog by import path (their modules need torch; the names must not)
MODELS: Registry[Any] = Registry("model", "shoal.catalog")
#: built-in data sets (``data.name``): loaders ``(seed, samples) -> shoal.data.formats.Raw``, declared likewise
DATASETS: Registry[Any] = Registry("data set", "shoal.catalog")
#: data file formats (``data.name = "KIND:PATH"``): readers ``(path) -> shoal.data.formats.Raw``, declared likewise
DATA_FORMATS: Registry[Any] = Registry("data file format", "shoal.catalog")
#: in-network aggregation planners (``network.algorithm``, ``shoal route --algo``): planner functions
PLANNERS: Registry[Any] = Registry("planner", "shoal.network.algorithms")
