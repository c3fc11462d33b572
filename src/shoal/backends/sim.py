"""The `sim` backend: a discrete-event simulation on a virtual clock (simpy).

Workers pull parameters, compute a real gradient on exactly what they pulled,
and push it; the server applies updates when the sync policy says so. Compute
and transfer durations come from the cluster profile and the cost model, so
a run is exactly reproducible from its seed. In cost mode the same schedule
runs without any model math.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import simpy
import torch

from shoal.cluster import StragglerModel
from shoal.engine.cost import SharedLink
from shoal.engine.metrics import RunRecorder, WorkerStats, build_summary
from shoal.engine.replica import Replica
from shoal.engine.setup import RunSetup
from shoal.sync import SyncPolicy, make_policy

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class Push:
    """What a worker sent: its gradient and its batch-norm buffer change."""

    grad: torch.Tensor | None
    buffer_delta: torch.Tensor | None


class SimServer:
    """One parameter server on the virtual clock: replica, policy, buffered pushes, waiters."""

    def __init__(self, env: simpy.Environment, policy: SyncPolicy, replica: Replica | None, weight: float) -> None:
        self.env = env
        self.policy = policy
        self.replica = replica
        self.weight = weight
        self.version = 0
        self._pending: dict[int, Push] = {}
        self._waiters: list[tuple[int, int, simpy.Event]] = []
        self._seq = itertools.count()

    def gate(self, worker: int) -> simpy.Event | None:
        """None if ``worker`` may start now, else an event that fires when it may."""
        threshold = self.policy.start_threshold(worker)
        if threshold is None or self.policy.min_clock >= threshold:
            return None
        event = self.env.event()
        heapq.heappush(self._waiters, (threshold, next(self._seq), event))
        return event

    def receive(self, worker: int, push: Push) -> int:
        """Take a push; apply the update the policy releases; return how many pushes it merged."""
        self._pending[worker] = push
        batch = self.policy.on_push(worker)
        if batch:
            self._apply([self._pending.pop(w) for w in batch])
        self._wake()
        return len(batch)

    def _apply(self, pushes: list[Push]) -> None:
        self.version += 1
        if self.replica is None:
            return
        self.replica.apply([p.grad for p in pushes], self.weight)
        self.replica.add_buffer_deltas([p.buffer_delta for p in pushes], self.weight)

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.policy.min_clock:
            heapq.heappop(self._waiters)[2].succeed()


class SimBackend:
    """Runs one configured training (or cost-only) simulation to its stopping rule."""

    def __init__(self, setup: RunSetup, recorder: RunRecorder, progress: ProgressFn | None = None) -> None:
        self.setup = setup
        self.cfg = setup.cfg
        self.recorder = recorder
        self.progress = progress
        self.env = simpy.Environment()
        self.profile = setup.profile
        n = self.profile.workers
        self.ingress = SharedLink(self.env, self.profile.server_bps)
        self.egress = SharedLink(self.env, self.profile.server_bps)
        self.stragglers = StragglerModel(self.cfg.cluster.stragglers, n, self.cfg.run.seed)
        self.stats = [WorkerStats(id=w, group=0, speed=self.profile.speeds[w]) for w in range(n)]
        replica = None
        if setup.train_mode:
            params, buffers = setup.engine.initial_state()
            replica = Replica(params, buffers, self.cfg.optimizer)
        policy = make_policy(self.cfg.sync.scheme, range(n), self.cfg.sync.staleness)
        self.server = SimServer(self.env, policy, replica, weight=1.0 / n)
        self.stop = self.env.event()
        self.stop_reason = "time_budget"

    # -- processes -----------------------------------------------------------

    def _worker(self, w: int):  # simpy process
        stats, server, profile = self.stats[w], self.server, self.profile
        while not self.stop.triggered:
            t0 = self.env.now
            gate = server.gate(w)
            if gate is not None:
                yield gate | self.stop
                if self.stop.triggered:
                    return
            waited = self.env.now - t0

            t1 = self.env.now
            pulled_version = server.version
            pulled = server.replica.snapshot() if server.replica is not None else None
            yield self.env.timeout(profile.latency_s)
            yield self.egress.transfer(self.setup.download_bytes, profile.link_bps)
            pull_s = self.env.now - t1

            compute = profile.compute_time(w, self.stragglers.factor(w))
            push, loss = self._compute(w, pulled)
            yield self.env.timeout(compute)

            t2 = self.env.now
            yield self.env.timeout(profile.latency_s)
            yield self.ingress.transfer(self.setup.upload_bytes, profile.link_bps)
            push_s = self.env.now - t2
            if self.stop.triggered:
                return

            staleness = server.version - pulled_version
            server.receive(w, push)
            self._account(w, waited, compute, pull_s + push_s)
            self.recorder.iteration(
                t=self.env.now, worker=w, group=stats.group, clock=server.policy.clocks[w],
                staleness=staleness, compute_s=compute, wait_s=waited, comm_s=pull_s + push_s, loss=loss,
            )
            if self.cfg.run.max_iterations and self.recorder.iterations >= self.cfg.run.max_iterations:
                self._finish("iteration_budget")

    def _compute(self, w: int, pulled: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[Push, float | None]:
        if pulled is None:
            return Push(None, None), None
        x, y = self.setup.streams[w].next()
        grad, buffer_delta, loss = self.setup.engine.gradient(pulled[0], pulled[1], x, y)
        return Push(grad, buffer_delta), round(loss, 6)

    def _account(self, w: int, waited: float, compute: float, comm: float) -> None:
        stats = self.stats[w]
        stats.iterations += 1
        stats.wait_s += waited
        stats.compute_s += compute
        stats.comm_s += comm
        self.recorder.bytes_up += self.setup.upload_bytes
        self.recorder.bytes_down += self.setup.download_bytes

    def _clock(self):  # simpy process: evaluations and progress ticks
        period = self.cfg.run.eval_every_s
        while True:
            self._evaluate()
            if self.stop.triggered:
                return
            yield self.env.timeout(period)

    def _budget(self):  # simpy process
        yield self.env.timeout(self.cfg.run.max_time_s)
        self._finish("time_budget")

    # -- helpers -------------------------------------------------------------

    def _evaluate(self) -> None:
        accuracy = None
        if self.server.replica is not None:
            params, buffers = self.server.replica.snapshot()
            ds = self.setup.dataset
            accuracy, loss = self.setup.engine.evaluate(params, buffers, ds.x_test, ds.y_test)
            reached = self.recorder.evaluation(self.env.now, accuracy, loss, self.cfg.run.target_accuracy)
            if reached and self.cfg.run.stop_at_target:
                self._finish("target_reached")
        if self.progress is not None:
            self.progress({"t": self.env.now, "iterations": self.recorder.iterations, "accuracy": accuracy})

    def _finish(self, reason: str) -> None:
        if not self.stop.triggered:
            self.stop_reason = reason
            self.stop.succeed()

    def run(self) -> dict[str, Any]:
        """Simulate until a stopping rule fires; return the summary record."""
        wall_start = time.perf_counter()
        groups = [self.server.policy.workers]
        self.recorder.event("start", t=0.0, scheme=self.cfg.sync.scheme, speeds=list(self.profile.speeds))
        self.recorder.event("groups", t=0.0, groups=groups)
        for w in range(self.profile.workers):
            self.env.process(self._worker(w))
        self.env.process(self._budget())
        self.env.process(self._clock())
        self.env.run(until=self.stop)
        if self.setup.train_mode and (not self.recorder.evals or self.recorder.evals[-1]["t"] < self.env.now):
            self._evaluate()
        self.recorder.event("end", t=self.env.now, reason=self.stop_reason)
        return build_summary(
            recorder=self.recorder,
            scheme=self.cfg.sync.scheme,
            backend="sim",
            mode=self.cfg.backend.mode,
            target_accuracy=self.cfg.run.target_accuracy,
            elapsed_s=round(self.env.now, 9),
            wall_s=round(time.perf_counter() - wall_start, 3),
            stop_reason=self.stop_reason,
            groups=groups,
            workers=self.stats,
            extra={"compute_s": self.profile.compute_s, "params": self.setup.engine.num_params},
        )
