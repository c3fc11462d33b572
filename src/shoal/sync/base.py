"""The sync-policy protocol, the clock bookkeeping every policy shares, and what a scheme registers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from shoal.plugins import load_class
from shoal.registry import SCHEMES


class SyncPolicy(ABC):
    """Gating rule plus merge rule for one server and the workers it serves.

    A worker's clock counts the pushes the server has received from it. The
    backend asks ``may_start`` before each iteration (or ``start_threshold``
    to wait for the slowest clock to reach a value) and reports each push with
    ``on_push``, which returns the workers whose buffered gradients now form
    one update (empty: keep buffering).
    """

    name: str = "base"
    #: updates are released by ``flush`` at the end of a moment (every push that arrived then), not by a push
    flushes: bool = False

    def __init__(self, workers: Iterable[int]) -> None:
        self.clocks: dict[int, int] = {w: 0 for w in workers}
        if not self.clocks:
            raise ValueError("a policy needs at least one worker")
        self._at_clock: Counter[int] = Counter({0: len(self.clocks)})
        self._min = 0
        self.excused: set[int] = set()  # transient stragglers: not counted in the slowest clock

    @property
    def workers(self) -> list[int]:
        return sorted(self.clocks)

    @property
    def min_clock(self) -> int:
        return self._min

    @property
    def progress(self) -> float:
        """What ``start_threshold`` is compared with: the slowest counted clock (``PacedSSP`` weighs clocks)."""
        return self._min

    def may_start(self, worker: int) -> bool:
        threshold = self.start_threshold(worker)
        return threshold is None or self.progress >= threshold

    @abstractmethod
    def start_threshold(self, worker: int) -> float | None:
        """The ``progress`` that must be reached before ``worker`` starts again (None: never wait)."""

    @abstractmethod
    def _merge(self, worker: int) -> tuple[int, ...]:
        """Which pushes form an update now that ``worker`` pushed."""

    def flush(self) -> tuple[int, ...]:
        """A ``flushes`` policy: the workers whose buffered pushes form an update now (the backend asks once
        every push of the moment has arrived); the others release nothing here."""
        return ()

    def observe(self, worker: int, loss: float | None) -> None:
        """The training loss of ``worker``'s step, reported with its push (adaptive periods use it)."""

    def discount(self, staleness: int) -> float:
        """The factor on a push applied ``staleness`` updates after its worker's base was pulled (1: none)."""
        return 1.0

    def on_push(self, worker: int) -> tuple[int, ...]:
        """Record one push from ``worker``; return the workers whose gradients to apply now."""
        self._tick(worker)
        return self._merge(worker)

    def remove(self, worker: int) -> tuple[int, ...]:
        """Forget ``worker`` (it died or moved); return an update it was holding back, if any."""
        if worker in self.excused:
            self.excused.discard(worker)
            self.clocks.pop(worker)
            return self._release_after_remove()
        if len(self.clocks) - len(self.excused) == 1:  # the last counted worker: count the excused again
            for other in sorted(self.excused):
                self.readmit(other)
        clock = self.clocks.pop(worker)
        self._at_clock[clock] -= 1
        if self.clocks:
            self._advance_min()
        return self._release_after_remove()

    def excuse(self, worker: int) -> bool:
        """Stop counting ``worker`` in the slowest clock (a transient straggler), so nobody waits for it.

        Its pushes still count and are applied; the last counted worker is
        never excused. Returns whether anything changed.
        """
        if worker in self.excused or worker not in self.clocks or len(self.clocks) - len(self.excused) <= 1:
            return False
        self.excused.add(worker)
        self._at_clock[self.clocks[worker]] -= 1
        self._advance_min()
        return True

    def readmit(self, worker: int) -> bool:
        """Count an excused ``worker`` again, at the slowest counted clock if it fell behind it.

        The clocks it lost are skipped rather than waited for: otherwise
        every peer would stall until it caught up. Returns whether anything changed.
        """
        if worker not in self.excused:
            return False
        self.excused.discard(worker)
        clock = max(self.clocks[worker], self._min)
        self.clocks[worker] = clock
        self._at_clock[clock] += 1
        return True

    def add(self, worker: int, clock: int | None = None) -> None:
        """Admit ``worker``; by default at the slowest clock so it gates nobody."""
        clock = self._min if clock is None else clock
        if not self.clocks:
            self._min = clock
        self.clocks[worker] = clock
        self._at_clock[clock] += 1
        self._min = min(self._min, clock)

    def restore_clocks(self, clocks: dict[int, int]) -> None:
        """Set every worker's clock (a resumed run, at a point where no push is buffered and nobody is excused)."""
        self.clocks = dict(clocks)
        self._at_clock = Counter(self.clocks.values())
        self._min = min(self.clocks.values())
        self.excused = set()

    def _release_after_remove(self) -> tuple[int, ...]:
        return ()

    def _tick(self, worker: int) -> None:
        clock = self.clocks[worker]
        self.clocks[worker] = clock + 1
        if worker in self.excused:
            return
        self._at_clock[clock] -= 1
        self._at_clock[clock + 1] += 1
        self._advance_min()

    def _advance_min(self) -> None:
        while self._at_clock[self._min] == 0:
            del self._at_clock[self._min]
            self._min += 1


@dataclass(frozen=True)
class SchemeSpec:
    """What a synchronisation scheme registers (``sync.scheme``): how to build it and what it needs.

    ``policy(workers, sync)`` builds one server's policy from the ``[sync]``
    section; a grouped scheme (GSSP) instead gives ``coordinator(workers,
    sync)``, the pure object that forms groups and builds each group's
    policy. The flags are what config validation and the backends ask
    instead of comparing names.
    """

    name: str
    policy: Callable[[Sequence[int], Any], SyncPolicy] | None = None
    coordinator: Callable[[int, Any], Any] | None = None
    #: workers step their own model copies and average every ``local_steps(sync)`` steps (local SGD, DiLoCo)
    local_steps: Callable[[Any], int] | None = None
    #: steps at the start that average every step before the periods of ``local_steps`` begin (post-local SGD)
    warmup_steps: Callable[[Any], int] | None = None
    #: the server takes an outer Nesterov step ``(lr, momentum) = outer(sync)`` on the mean change (DiLoCo)
    outer: Callable[[Any], tuple[float, float]] | None = None
    #: synchronous rounds: may run as all-reduce groups (``sync.intra_group = "allreduce"``)
    allreduce: bool = False
    #: one synchronous round over every worker: in-network aggregation may sum it
    ina: bool = False
    #: its colour in every report (None: a stable colour from its name)
    color: str | None = None
    #: its own knobs' tuning grid, ``((key, (v1, v2, v3)), ...)``: ``shoal compare --tune-seeds`` tries every
    #: point, and every scheme with knobs gets the same number of points (``OWN_GRID_POINTS``), so no scheme is
    #: tuned harder than another; a scheme without knobs has none
    grid: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    #: an established method: the p-values of a comparison are against the best of these
    baseline: bool = True
    #: the ``sync.balance`` modes it supports (work sized to speed: ``sync/balance.py``)
    balance: tuple[str, ...] = ()
    #: its own aggregation plan ``schedule(sync, layout)`` (which tensors travel at which clock), instead of
    #: "everything every local_steps" (Streaming DiLoCo's fragments)
    schedule: Callable[[Any, Sequence[Any]], Any] | None = None
    #: the slots its plans address, ``sync_layout(sync, layout)``, when not the model's tensors: the layout with
    #: some tensors cut into flat pieces (Streaming DiLoCo's equal fragments); every backend slices the flat
    #: parameters, plans, codecs and outer steps by it
    sync_layout: Callable[[Any, Sequence[Any]], Sequence[Any]] | None = None
    #: ``(steps, mixing) = overlap(sync)``: a sync's result is taken ``steps`` local steps after it was sent,
    #: mixed with the local value as ``mixing * local + (1 - mixing) * global`` (Streaming DiLoCo)
    overlap: Callable[[Any], tuple[int, float]] | None = None
    #: the compressor its outer gradients (local changes) travel with, ``outer_codec(sync)`` ("none": dense)
    outer_codec: Callable[[Any], str] | None = None

    @property
    def local_models(self) -> bool:
        """Whether workers keep their own model copies between averagings."""
        return self.local_steps is not None


#: the tuning budget of every scheme that has knobs: points of its own grid (see ``SchemeSpec.grid``)
OWN_GRID_POINTS = 3


def own_grid_points(spec: SchemeSpec) -> int:
    """How many configurations the scheme's own grid holds (1: nothing to tune)."""
    points = 1
    for _, values in spec.grid:
        points *= len(values)
    return points


def register_scheme(spec: SchemeSpec, help: str) -> SchemeSpec:
    """Add ``spec`` to the scheme registry under its name; its own grid must hold the common budget."""
    if spec.grid and own_grid_points(spec) != OWN_GRID_POINTS:
        raise ValueError(f"scheme {spec.name}: its grid holds {own_grid_points(spec)} points, every scheme's "
                         f"{OWN_GRID_POINTS}")
    SCHEMES.add(spec.name, spec, help)
    return spec


def build_policy(scheme: str, workers: Iterable[int], sync: Any) -> SyncPolicy:
    """The policy of a registered, ungrouped scheme for ``workers`` under a ``[sync]`` section."""
    spec = SCHEMES[scheme]
    if spec.policy is None:
        raise ValueError(f"scheme {scheme!r} forms groups: build it through its coordinator")
    return spec.policy(list(workers), sync)


def load_plugin(spec: str) -> SchemeSpec:
    """A user's scheme from ``python:FILE.py:CLASS``: a SyncPolicy subclass built as ``CLASS(workers, **sync.options)``.

    Class attributes ``allreduce``, ``ina`` and ``color`` say the same as a
    built-in's ``SchemeSpec`` flags (default: none of them).
    """
    cls = load_class(spec, SyncPolicy, "start_threshold(worker) and _merge(worker)")
    return SchemeSpec(spec, policy=lambda workers, sync: cls(workers, **sync.options),
                      allreduce=bool(getattr(cls, "allreduce", False)), ina=bool(getattr(cls, "ina", False)),
                      color=getattr(cls, "color", None), baseline=False)


SCHEMES.accept_plugins(load_plugin)
