"""Reserving a run's actors up front: one placement group, one bundle per actor the run starts with.

A cluster whose nodes cannot hold every worker and server (too few CPUs on
any node for one actor, CPUs held by other jobs) would otherwise start some
actors and leave the rest pending until the start-up timeout. Reserved as
one placement group, the run either gets all of them or fails within
seconds with one line. A restarted worker or a replacement server takes the
bundle its predecessor held; joiners and servers beyond the reservation are
placed outside it, as Ray places any actor.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ray.util import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from shoal.errors import ConfigError


class Reservation:
    """A ready placement group: which bundle each actor holds, and the free ones per kind ("worker", "server").

    An actor that dies or is ended gives its bundle back (``free``), so its
    replacement (a restarted worker, a new server) takes the same bundle;
    with no bundle free an actor is placed outside the group.
    """

    def __init__(self, group: Any, bundles: dict[str, list[int]]) -> None:
        self.group = group
        self._free = {kind: deque(indices) for kind, indices in bundles.items()}
        self._held: dict[Any, tuple[str, int]] = {}

    def take(self, kind: str) -> tuple[dict[str, Any], int | None]:
        """Actor options that place the next actor of ``kind`` in a free bundle, and the bundle ({}, None: none)."""
        free = self._free.get(kind)
        if not free:
            return {}, None
        index = free.popleft()
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=index)}, index

    def bind(self, actor: Any, kind: str, index: int) -> None:
        self._held[actor] = (kind, index)

    def free(self, actor: Any) -> None:
        """``actor`` (an actor id) is gone: its bundle is free for the next actor of its kind."""
        if actor in self._held:
            kind, index = self._held.pop(actor)
            self._free[kind].append(index)

    def release(self) -> None:
        try:
            remove_placement_group(self.group)
        except Exception:  # noqa: BLE001 - Ray already shut down
            pass


def bundle(cpus: float, gpus: float = 0.0) -> dict[str, float]:
    return {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}


def reserve(actors: dict[str, tuple[int, dict[str, float]]], timeout_s: float, where: str) -> Reservation | None:
    """One bundle per actor (``actors``: kind -> (count, resources)), packed; None if nothing needs reserving.

    Raises ConfigError (one line, naming what was asked) if the group is
    not placed within ``timeout_s``; nothing stays reserved then.
    """
    bundles, indices = [], {}
    for kind, (count, resources) in actors.items():
        if count and resources:
            indices[kind] = list(range(len(bundles), len(bundles) + count))
            bundles += [dict(resources) for _ in range(count)]
    if not bundles:
        return None
    group = placement_group(bundles, strategy="PACK")
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        asked = ", ".join(f"{count} {kind}s x {_text(resources)}" for kind, (count, resources) in actors.items()
                          if count and resources)
        raise ConfigError(f"{where} cannot place this run's actors ({asked}; one bundle per actor) within "
                          f"{timeout_s:.0f} s: its nodes lack the free CPUs or GPUs (other jobs may hold them); "
                          "add nodes or request less per actor (backend.cpus_per_worker, cpus_per_server)")
    return Reservation(group, indices)


def _text(resources: dict[str, float]) -> str:
    return " + ".join(f"{v:g} {k}" for k, v in resources.items())
