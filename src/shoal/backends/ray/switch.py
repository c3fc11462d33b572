"""In-network aggregation on the ray backend: a software switch actor, and the worker and PS sides.

The protocol objects are ``shoal.network.dataplane``'s (pure, no Ray); this
module only moves their messages between actors, batched: a worker sends all
its fragments of a round in one call, a switch forwards what one call
produced (finished sums, partial sums, fallbacks) to the group server in one
call, and the server sends each worker its acknowledgements in one call.
The calls are awaited along the path (worker -> switch -> server), so an
error anywhere fails the sending worker instead of hanging the round.
Resends are driven by the worker's own timer (an asyncio wait, no polling).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any

import numpy as np

from shoal.network import dataplane

SERVER = "server"


def worker_name(w: int) -> str:
    return f"worker-{w}"


class SwitchActor:
    """One programmable switch of the plan: a ``dataplane.Switch`` whose outputs go on to the group server."""

    def __init__(self, name: str, workers: list[str], slots: int, probes: int = 1) -> None:
        # software switches align exponents themselves, which saves the agreement round trip before every push
        self.switch = dataplane.Switch(name, workers, slots, min(probes, slots), align=True)
        self.server: Any = None

    def set_server(self, handle: Any) -> None:
        self.server = handle

    async def receive(self, fragments: list[dataplane.Fragment]) -> None:
        """A worker's fragments (one call per round or resend); forward the outputs in one call."""
        out: list[dataplane.Fragment | dataplane.Aggregate] = []
        for frag in fragments:
            out.extend(self.switch.receive(frag))
        if out:
            await self.server.receive.remote(out)

    def counters(self) -> dict[str, Any]:
        return {**asdict(self.switch.counters), "fan_in": self.switch.fan_in, "slots": self.switch.slots}

    def ping(self) -> int:
        return os.getpid()


class ServerSide:
    """The group server's receiving side: a ``dataplane.Server`` and the acknowledgements to the workers."""

    def __init__(self, workers: dict[str, Any], n_values: int, fragment_size: int, run_id: str = "") -> None:
        self.server = dataplane.Server(SERVER, workers, n_values, fragment_size)
        self.handles = workers  # worker name -> actor handle
        self.run_id = run_id  # tags acks: a reused worker actor ignores late ones of an earlier run

    def receive(self, messages: list[dataplane.Fragment | dataplane.Aggregate]) -> None:
        acks: dict[str, list[dataplane.Ack]] = defaultdict(list)
        for msg in messages:
            for ack in self.server.receive(msg):
                acks[ack.worker].append(ack)
        for worker, batch in acks.items():
            self.handles[worker].on_acks.remote(batch, self.run_id)  # fire and forget: a lost ack costs a resend

    def take(self, round: int) -> np.ndarray | None:
        """The round's summed gradient (float64) and forget the round; None if some contribution is missing."""
        if not self.server.complete(round):
            return None
        total = self.server.result(round)
        self.server.finish_round(round)
        return total

    def counters(self) -> dict[str, Any]:
        return asdict(self.server.counters)


class WorkerSide:
    """A worker's sending side: fragments to its aggregation node, resent until the server acknowledges them."""

    def __init__(self, name: str, node: str, fan_in: int, fragment_size: int, timeout: float, handle: Any,
                 run_id: str = "") -> None:
        self.worker = dataplane.Worker(name, node, fan_in, fragment_size, timeout)
        self.handle = handle  # the switch actor, or the group server
        self.run_id = run_id
        self._acked = asyncio.Event()

    def on_acks(self, acks: list[dataplane.Ack], run_id: str = "") -> None:
        if run_id != self.run_id:
            return
        for ack in acks:
            self.worker.on_ack(ack)
        if not self.worker.unacked:
            self._acked.set()

    def wake(self) -> None:
        """Stop waiting (the worker is stopping)."""
        self._acked.set()

    async def push(self, round: int, gradient: np.ndarray, stopping: Any) -> bool:
        """Send the round's fragments and wait until every one is acknowledged (False: stopped first)."""
        self._acked.clear()
        await self.handle.receive.remote(self.worker.send(round, gradient, time.monotonic()))
        while self.worker.unacked:
            if stopping():
                return False
            due = self.worker.next_due()
            delay = 0.0 if due is None else max(0.0, due - time.monotonic())
            self._acked.clear()
            if self.worker.unacked:
                try:
                    await asyncio.wait_for(self._acked.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
            resend = self.worker.due_resends(time.monotonic())
            if resend and not stopping():
                await self.handle.receive.remote(resend)
        self.worker.finish_round(round)
        return not stopping()

    def counters(self) -> dict[str, int]:
        return asdict(self.worker.counters)
