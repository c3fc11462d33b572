"""The `sim` backend's server on the virtual clock, and what workers send it and take from it.

A ``SimServer`` holds a replica, a sync policy, its ingress and egress links
(``SharedLink``: max-min fair sharing), the buffered pushes and the workers
waiting at its gate (a heap keyed by the slowest clock each needs), and,
with SIM, the schedule and the per-clock similarity meters.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import simpy
import torch

from shoal.backends.work import sample_weights
from shoal.compress.codec import GradientCodec
from shoal.compress.similarity import SimilarityMeter, SimilaritySchedule
from shoal.engine.cost import SharedLink
from shoal.engine.noise import NoiseScale
from shoal.engine.replica import Replica, masked_slices
from shoal.sync import SyncPolicy
from shoal.sync.localsgd import PeriodicSchedule


@dataclass
class Push:
    """What a worker sent: its (reconstructed) gradient, its batch-norm buffer change, and the bytes.

    With SIM, ``grad`` holds only the tensors in ``grad_mask`` (aggregated as
    gradients), ``delta`` the accumulated local changes of the tensors in
    ``delta_mask`` (re-synchronised by averaging), both at SIM clock ``clock``.
    """

    grad: torch.Tensor | None
    buffer_delta: torch.Tensor | None
    nbytes: int
    delta: torch.Tensor | None = None
    grad_mask: tuple[bool, ...] | None = None
    delta_mask: tuple[bool, ...] | None = None
    clock: int = 0
    samples: int | None = None  # sync.balance = "deadline": the samples this gradient is the mean of (weighed by)
    discount: float = 1.0  # a late change's factor (the policy's discount of its staleness)


@dataclass
class Pulled:
    """What a worker computes on: parameters, buffers, and what the pull cost.

    With SIM, ``fresh`` marks the tensors taken from the server (the rest are
    the worker's local values) and ``plan`` the tensors aggregated at ``clock``.
    """

    params: torch.Tensor | None
    buffers: torch.Tensor | None
    nbytes: int
    fresh: tuple[bool, ...] | None = None
    plan: tuple[bool, ...] | None = None
    clock: int = 0


def weighed_by_samples(pushes: list[Push]) -> list[torch.Tensor]:
    """The pushes' gradients, each scaled so that their 1/N sum is the mean over all their samples (pushes that
    say how many they hold, sync.balance = "deadline"; the others as they are). Empty: no sample in the round."""
    weights = sample_weights([p.samples for p in pushes])
    if weights is None:
        return [p.grad for p in pushes]
    return [p.grad * weight for p, weight in zip(pushes, weights)]


class AfterTheMoment(simpy.Event):
    """An event processed after every other event of the current virtual moment.

    simpy orders its queue by time, then priority, then insertion; this one
    has a priority after the normal one, so events scheduled for the same
    moment later (a transfer finishing as another frees the link) still come
    before it.
    """

    LATE = 2

    def __init__(self, env: simpy.Environment) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, priority=self.LATE)


class SimServer:
    """One (group) server on the virtual clock: replica, policy, links, buffered pushes, waiters."""

    def __init__(self, env: simpy.Environment, policy: SyncPolicy, replica: Replica | None, weight: float,
                 bandwidth_bps: float, schedule: SimilaritySchedule | PeriodicSchedule | None = None,
                 slices: list[slice] | None = None) -> None:
        self.env = env
        self.policy = policy
        self.replica = replica
        self.weight = weight
        self.broadcast: GradientCodec | None = None  # quantises the model changes sent back (Streaming DiLoCo)
        self.noise: NoiseScale | None = None  # measures the gradient noise scale of equal-batch rounds
        self.schedule = schedule
        if isinstance(schedule, PeriodicSchedule):  # local SGD's plan follows the policy's periods
            schedule.follow(policy)
        self.slices = slices or []
        self._meters: dict[int, SimilarityMeter] = {}
        self.ingress = SharedLink(env, bandwidth_bps)
        self.egress = SharedLink(env, bandwidth_bps)
        self.version = 0  # updates this replica holds: its own and those its peers' deltas brought
        self.updates = 0
        self.unsent_updates = 0  # GSSP: own updates not yet sent to the peers
        self._pending: dict[int, Push] = {}
        self._waiters: list[tuple[float, int, simpy.Event, int]] = []
        self._seq = itertools.count()
        self._flush_due = False

    def gate(self, worker: int) -> simpy.Event | None:
        """None if ``worker`` may start now, else an event that fires when it may (or on a regroup)."""
        threshold = self.policy.start_threshold(worker)
        if threshold is None or self.policy.progress >= threshold:
            return None
        event = self.env.event()
        heapq.heappush(self._waiters, (threshold, next(self._seq), event, worker))
        return event

    def waiting(self) -> list[int]:
        """The workers waiting at the gate, in the order a release wakes them."""
        return [entry[3] for entry in sorted(self._waiters)]

    def receive(self, worker: int, push: Push) -> int:
        """Take a push; apply the update the policy releases; return how many updates were applied."""
        self._pending[worker] = push
        batch = self.policy.on_push(worker)
        if batch:
            self._apply([self._pending.pop(w) for w in batch])
        if self.policy.flushes and not self._flush_due:
            self._flush_due = True
            AfterTheMoment(self.env).callbacks.append(self._flush)
        self._wake()
        return 1 if batch else 0

    def flush_now(self) -> None:
        """Apply what a flushing policy holds without waiting for the end of the moment (the run stops now)."""
        if self._flush_due:
            self._flush(None)

    def _flush(self, _: simpy.Event | None) -> None:
        """The end of the moment: apply what the policy releases of every push that arrived in it."""
        if not self._flush_due:
            return
        self._flush_due = False
        batch = self.policy.flush()
        if batch:
            self._apply([self._pending.pop(w) for w in batch])
            self._wake()

    def remove(self, worker: int) -> None:
        """``worker`` left: forget it, apply an update it was holding back (BSP), release the waiters."""
        batch = self.policy.remove(worker)
        self._pending.pop(worker, None)
        pushes = [self._pending.pop(w) for w in batch if w in self._pending]
        if pushes:
            self._apply(pushes)
        self.wake_all()

    def receive_delta(self, params_delta: torch.Tensor | None, buffers_delta: torch.Tensor | None,
                      updates: int) -> None:
        """A peer group server's own delta arrived; it holds ``updates`` updates (staleness counts each)."""
        self.version += updates
        if self.replica is not None and params_delta is not None:
            self.replica.receive_delta(params_delta, buffers_delta)

    def _apply(self, pushes: list[Push]) -> None:
        self.version += 1
        self.updates += 1
        self.unsent_updates += 1
        if self.replica is None:
            return
        if self.schedule is None:
            grads = weighed_by_samples(pushes)
            if grads:
                self.replica.apply(grads, self.weight)
            if self.noise is not None:
                self.noise.add(grads)
        else:
            self._apply_sim(pushes)
        self.replica.add_buffer_deltas([p.buffer_delta for p in pushes if p.buffer_delta is not None], self.weight)

    def _apply_sim(self, pushes: list[Push]) -> None:
        """SIM: one step on the gradient tensors, average in the local changes, measure similarity."""
        assert self.replica is not None
        by_masks: dict[tuple, list[Push]] = {}
        for push in pushes:  # a round shares its masks; they differ only right after a GSSP move
            by_masks.setdefault((push.grad_mask, push.delta_mask), []).append(push)
        for (grad_mask, delta_mask), same in by_masks.items():
            if any(grad_mask):
                frozen = [sl for sl, g in zip(self.slices, grad_mask) if not g]
                self.replica.apply([p.grad if p.discount == 1.0 else p.grad * p.discount for p in same], self.weight,
                                   frozen=frozen)
            if any(delta_mask):
                made = self.replica.add_delta([p.delta if p.discount == 1.0 else p.delta * p.discount for p in same],
                                              self.weight, masked_slices(self.slices, delta_mask))
                if self.broadcast is not None:  # the workers receive the change quantised: hold what they hold
                    self.replica.correct(made, self.broadcast.encode(made, 1.0, delta_mask)[0])
                if self.schedule.periodic:
                    self.schedule.on_round(same[0].clock, [p.delta for p in same], self.slices)
        if self.schedule.periodic:
            return
        for push in pushes:
            if not self.schedule.wants(push.clock):
                continue
            meter = self._meters.setdefault(push.clock, SimilarityMeter())
            for i, sl in enumerate(self.slices):
                if push.grad_mask[i]:
                    meter.add(i, push.grad[sl])
                elif push.delta_mask[i]:
                    meter.add(i, push.delta[sl])

    def finish_measurements(self) -> list[int]:
        """Feed the schedule every clock all members have pushed; return those clocks."""
        if self.schedule is None:
            return []
        return self.schedule.finish_clocks(self._meters, self.policy.min_clock)

    def wake(self) -> None:
        """Release the waiters whose threshold the slowest clock has reached."""
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.policy.progress:
            heapq.heappop(self._waiters)[2].succeed()

    def wake_all(self) -> None:
        """Release every waiter so it re-checks its gate (membership changed)."""
        while self._waiters:
            event = heapq.heappop(self._waiters)[2]
            if not event.triggered:
                event.succeed()
