"""The `sim` backend: a discrete-event simulation on a virtual clock (simpy).

Workers pull parameters, compute a real gradient on exactly what they pulled,
and push it; a server applies updates when its sync policy says so. Compute
and transfer durations come from the cluster profile and the cost model, so
a run is exactly reproducible from its seed. In cost mode the same schedule
runs without any model math.

BSP, ASP and SSP use one server. GSSP uses one server per group; the GSSP
policy object decides membership and when a group server sends its own
delta to its peers, and this module only carries out those decisions.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import simpy
import torch

from shoal.cluster import StragglerModel
from shoal.compress import GDTopKSchedule, GradientCodec, make_compressor
from shoal.config import Config
from shoal.engine.cost import SharedLink
from shoal.engine.metrics import RunRecorder, WorkerStats, build_summary
from shoal.engine.replica import Replica
from shoal.engine.setup import RunSetup
from shoal.sync import SyncPolicy, make_policy
from shoal.sync.gssp import GSSP

ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class Push:
    """What a worker sent: its (reconstructed) gradient, its batch-norm buffer change, and the bytes."""

    grad: torch.Tensor | None
    buffer_delta: torch.Tensor | None
    nbytes: int


class SimServer:
    """One (group) server on the virtual clock: replica, policy, links, buffered pushes, waiters."""

    def __init__(self, env: simpy.Environment, policy: SyncPolicy, replica: Replica | None, weight: float,
                 bandwidth_bps: float) -> None:
        self.env = env
        self.policy = policy
        self.replica = replica
        self.weight = weight
        self.ingress = SharedLink(env, bandwidth_bps)
        self.egress = SharedLink(env, bandwidth_bps)
        self.version = 0
        self.updates = 0
        self._pending: dict[int, Push] = {}
        self._waiters: list[tuple[int, int, simpy.Event]] = []
        self._seq = itertools.count()

    def gate(self, worker: int) -> simpy.Event | None:
        """None if ``worker`` may start now, else an event that fires when it may (or on a regroup)."""
        threshold = self.policy.start_threshold(worker)
        if threshold is None or self.policy.min_clock >= threshold:
            return None
        event = self.env.event()
        heapq.heappush(self._waiters, (threshold, next(self._seq), event))
        return event

    def receive(self, worker: int, push: Push) -> int:
        """Take a push; apply the update the policy releases; return how many updates were applied."""
        self._pending[worker] = push
        batch = self.policy.on_push(worker)
        if batch:
            self._apply([self._pending.pop(w) for w in batch])
        self._wake()
        return 1 if batch else 0

    def receive_delta(self, params_delta: torch.Tensor | None, buffers_delta: torch.Tensor | None) -> None:
        """A peer group server's own delta arrived."""
        self.version += 1
        if self.replica is not None and params_delta is not None:
            self.replica.receive_delta(params_delta, buffers_delta)

    def _apply(self, pushes: list[Push]) -> None:
        self.version += 1
        self.updates += 1
        if self.replica is None:
            return
        self.replica.apply([p.grad for p in pushes], self.weight)
        self.replica.add_buffer_deltas([p.buffer_delta for p in pushes], self.weight)

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.policy.min_clock:
            heapq.heappop(self._waiters)[2].succeed()

    def wake_all(self) -> None:
        """Release every waiter so it re-checks its gate (membership changed)."""
        while self._waiters:
            event = heapq.heappop(self._waiters)[2]
            if not event.triggered:
                event.succeed()


class SimBackend:
    """Runs one configured training (or cost-only) simulation to its stopping rule."""

    def __init__(self, setup: RunSetup, recorder: RunRecorder, progress: ProgressFn | None = None) -> None:
        self.setup = setup
        self.cfg: Config = setup.cfg
        self.recorder = recorder
        self.progress = progress
        self.env = simpy.Environment()
        self.profile = setup.profile
        n = self.profile.workers
        self.speeds = list(self.profile.speeds)
        self.stragglers = StragglerModel(self.cfg.cluster.stragglers, n, self.cfg.run.seed)
        self.stats = [WorkerStats(id=w, group=0, speed=self.speeds[w]) for w in range(n)]
        self.gssp = self._make_gssp() if self.cfg.sync.scheme == "gssp" else None
        policy = self.gssp.policy(0) if self.gssp else make_policy(self.cfg.sync.scheme, range(n), self.cfg.sync.staleness)
        self.servers = [self._make_server(policy, self._initial_replica())]
        self.codecs = self._make_codecs()
        gd = self.cfg.compression.gdtopk
        self.schedule = GDTopKSchedule(gd.initial_density, gd.warmup_epochs, gd.final_density_fast, gd.final_density_slow)
        self.exchanges = 0
        self.bytes_exchange = 0.0
        self.stop = self.env.event()
        self.stop_reason = "time_budget"

    # -- construction -----------------------------------------------------------

    def _make_gssp(self) -> GSSP:
        s = self.cfg.sync
        return GSSP(
            self.profile.workers, s.staleness, s.exchange_every, groups=s.groups, threshold=s.group_threshold,
            max_groups=s.max_groups, profile_iterations=s.profile_iterations, profile_window=s.profile_window,
            regroup=s.regroup, regroup_margin=s.regroup_margin, regroup_patience=s.regroup_patience,
        )

    def _initial_replica(self) -> Replica | None:
        if not self.setup.train_mode:
            return None
        params, buffers = self.setup.engine.initial_state()
        return Replica(params, buffers, self.cfg.optimizer, track_own=self.gssp is not None)

    def _make_codecs(self) -> list[GradientCodec]:
        method, seed = self.cfg.compression.method, self.cfg.run.seed
        compressors = [make_compressor(method, seed=(seed * 1_000_003 + w) % 2**31) for w in range(len(self.stats))]
        if compressors[0] is None:
            return []
        # Error feedback accumulates what a compressor dropped; for an unbiased
        # compressor that is its variance, which feedback amplifies (measured: the
        # residual of scaled randk grows without bound), so only biased ones use it.
        feedback = self.cfg.compression.error_feedback and not compressors[0].unbiased
        return [GradientCodec(c, self.setup.engine.layout, feedback) for c in compressors]

    def density(self, worker: int) -> float:
        """Upload density of ``worker`` now: fixed for topk, scheduled per group for gdtopk."""
        if self.cfg.compression.method != "gdtopk":
            return self.cfg.compression.density
        epoch = self.recorder.iterations * self.cfg.data.batch_size / max(1, self.setup.n_train)
        times = self.gssp.profiler.times() if self.gssp is not None and self.gssp.grouped else []
        if not times or min(times) <= 0:
            return self.schedule.density(epoch, 1.0, 1.0, 1.0)
        members = self.gssp.groups[self.gssp.server_of[worker]]
        group_time = float(sorted(times[m] for m in members)[len(members) // 2])
        return self.schedule.density(epoch, group_time, min(times), max(times))

    def _make_server(self, policy: SyncPolicy, replica: Replica | None) -> SimServer:
        return SimServer(self.env, policy, replica, 1.0 / self.profile.workers, self.profile.server_bps)

    def server_of(self, worker: int) -> SimServer:
        return self.servers[self.gssp.server_of[worker]] if self.gssp else self.servers[0]

    # -- processes ----------------------------------------------------------------

    def _worker(self, w: int) -> Iterator[simpy.Event]:
        profile = self.profile
        while not self.stop.triggered:
            t0 = self.env.now
            while (gate := self.server_of(w).gate(w)) is not None:
                yield gate | self.stop
                if self.stop.triggered:
                    return
            waited = self.env.now - t0

            server = self.server_of(w)
            t1 = self.env.now
            pulled_version = server.version
            pulled = server.replica.snapshot() if server.replica is not None else None
            yield self.env.timeout(profile.latency_s)
            yield server.egress.transfer(self.setup.download_bytes, profile.link_bps)
            pull_s = self.env.now - t1

            compute = profile.compute_s * self.speeds[w] * self.stragglers.factor(w)
            push, loss = self._compute(w, pulled)
            yield self.env.timeout(compute)

            t2 = self.env.now
            yield self.env.timeout(profile.latency_s)
            yield self.server_of(w).ingress.transfer(push.nbytes, profile.link_bps)
            push_s = self.env.now - t2
            if self.stop.triggered:
                return
            target = self.server_of(w)  # a regroup may have moved this worker while it computed
            self._deliver(w, target, push, staleness=target.version - pulled_version if target is server else None,
                          waited=waited, compute=compute, comm=pull_s + push_s, loss=loss)

    def _deliver(self, w: int, server: SimServer, push: Push, *, staleness: int | None, waited: float,
                 compute: float, comm: float, loss: float | None) -> None:
        """The server takes the push; record it; let GSSP react (exchange, split, regroup)."""
        applied = server.receive(w, push)
        self._account(w, waited, compute, comm, push.nbytes)
        self.recorder.iteration(
            t=self.env.now, worker=w, group=self.stats[w].group, clock=server.policy.clocks[w],
            staleness=staleness, compute_s=compute, wait_s=waited, comm_s=comm, loss=loss,
        )
        if self.gssp is not None:
            self._gssp_step(w, server, applied, compute + comm)
        if self.cfg.run.max_iterations and self.recorder.iterations >= self.cfg.run.max_iterations:
            self._finish("iteration_budget")

    def _compute(self, w: int, pulled: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[Push, float | None]:
        """The worker's push: real (compressed) gradient in train mode, sizes only in cost mode."""
        buffer_bytes = 4 * self.setup.num_buffer_values
        if pulled is None:
            grad_bytes = self.codecs[w].nominal_bytes(self.density(w)) if self.codecs else 4 * self.setup.engine.num_params
            return Push(None, None, grad_bytes + buffer_bytes), None
        x, y = self.setup.streams[w].next()
        grad, buffer_delta, loss = self.setup.engine.gradient(pulled[0], pulled[1], x, y)
        grad_bytes = 4 * grad.numel()
        if self.codecs:
            grad, grad_bytes = self.codecs[w].encode(grad, self.density(w))
        return Push(grad, buffer_delta, grad_bytes + buffer_bytes), round(loss, 6)

    def _account(self, w: int, waited: float, compute: float, comm: float, up_bytes: int) -> None:
        stats = self.stats[w]
        stats.iterations += 1
        stats.wait_s += waited
        stats.compute_s += compute
        stats.comm_s += comm
        self.recorder.bytes_up += up_bytes
        self.recorder.bytes_down += self.setup.download_bytes

    # -- GSSP ---------------------------------------------------------------------

    def _gssp_step(self, w: int, server: SimServer, applied: int, iteration_s: float) -> None:
        gssp = self.gssp
        assert gssp is not None
        gssp.observe(w, iteration_s)
        index = self.servers.index(server)
        if applied and gssp.local_update(index):
            self.env.process(self._exchange(index))
        if (groups := gssp.initial_split()) is not None:
            self._split(groups)
        elif self.recorder.iterations % self.profile.workers == 0 and (moves := gssp.check_regroup()):
            for move in moves:
                self.stats[move.worker].group = move.new
            for s in self.servers:
                s.wake_all()
            self.recorder.event("groups", t=self.env.now, groups=gssp.groups, reason="regroup",
                                moves=[[m.worker, m.old, m.new] for m in moves])

    def _split(self, groups: list[list[int]]) -> None:
        """Replace the single profiling server by one server per group, each a copy of its replica."""
        assert self.gssp is not None
        source = self.servers[0]
        self.servers = [
            self._make_server(self.gssp.policy(g), source.replica.clone(self.cfg.optimizer) if source.replica else None)
            for g in range(len(groups))
        ]
        for g, members in enumerate(groups):
            for w in members:
                self.stats[w].group = g
        source.wake_all()
        self.recorder.event("groups", t=self.env.now, groups=groups, reason="profiled",
                            times=[round(t, 6) for t in self.gssp.profiler.times()])

    def _exchange(self, sender: int) -> Iterator[simpy.Event]:
        """Send the sender's own delta to every peer, without waiting for anyone."""
        replica = self.servers[sender].replica
        delta = replica.take_own_delta() if replica is not None else (None, None)
        nbytes = self.setup.download_bytes
        self.exchanges += 1
        self.recorder.event("exchange", t=self.env.now, group=sender, bytes=nbytes * (len(self.servers) - 1))
        for peer in range(len(self.servers)):
            if peer != sender:
                self.env.process(self._deliver_delta(peer, delta, nbytes))
        yield self.env.timeout(0)

    def _deliver_delta(self, peer: int, delta: tuple[Any, Any], nbytes: int) -> Iterator[simpy.Event]:
        server = self.servers[peer]
        yield self.env.timeout(self.profile.latency_s)
        yield server.ingress.transfer(nbytes, self.profile.server_bps)
        self.bytes_exchange += nbytes
        server.receive_delta(*delta)

    # -- clock, evaluation, stopping -------------------------------------------------

    def _clock(self) -> Iterator[simpy.Event]:
        period = self.cfg.run.eval_every_s
        while True:
            self._evaluate()
            if self.stop.triggered:
                return
            yield self.env.timeout(period)

    def _budget(self) -> Iterator[simpy.Event]:
        yield self.env.timeout(self.cfg.run.max_time_s)
        self._finish("time_budget")

    def _speed_changes(self) -> Iterator[simpy.Event]:
        for change in sorted(self.cfg.cluster.speed_changes, key=lambda c: c.at_s):
            yield self.env.timeout(max(0.0, change.at_s - self.env.now))
            self.speeds[change.worker] = change.speed
            self.recorder.event("speed_change", t=self.env.now, worker=change.worker, speed=change.speed)

    def model_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What is evaluated: the replica, or the mean of the group replicas (GSSP)."""
        snapshots = [s.replica.snapshot() for s in self.servers if s.replica is not None]
        if len(snapshots) == 1:
            return snapshots[0]
        return torch.stack([p for p, _ in snapshots]).mean(0), torch.stack([b for _, b in snapshots]).mean(0)

    def _evaluate(self) -> None:
        accuracy = None
        if self.setup.train_mode:
            params, buffers = self.model_state()
            ds = self.setup.dataset
            accuracy, loss = self.setup.engine.evaluate(params, buffers, ds.x_test, ds.y_test)
            reached = self.recorder.evaluation(self.env.now, accuracy, loss, self.cfg.run.target_accuracy)
            if reached and self.cfg.run.stop_at_target:
                self._finish("target_reached")
        if self.codecs and self.gssp is not None:
            densities = [self.density(members[0]) if members else None for members in self._groups()]
            self.recorder.event("densities", t=self.env.now, densities=densities)
        if self.progress is not None:
            self.progress({"t": self.env.now, "iterations": self.recorder.iterations, "accuracy": accuracy})

    def _finish(self, reason: str) -> None:
        if not self.stop.triggered:
            self.stop_reason = reason
            self.stop.succeed()

    def run(self) -> dict[str, Any]:
        """Simulate until a stopping rule fires; return the summary record."""
        wall_start = time.perf_counter()
        self.recorder.event("start", t=0.0, scheme=self.cfg.sync.scheme, speeds=self.speeds)
        self.recorder.event("groups", t=0.0, groups=self._groups(), reason="start")
        for w in range(self.profile.workers):
            self.env.process(self._worker(w))
        for process in (self._budget(), self._clock(), self._speed_changes()):
            self.env.process(process)
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
            groups=self._groups(),
            workers=self.stats,
            extra={
                "compute_s": self.profile.compute_s,
                "params": self.setup.engine.num_params,
                "group_updates": [s.updates for s in self.servers],
                "exchanges": self.exchanges,
                "bytes_exchange": int(self.bytes_exchange),
            },
        )

    def _groups(self) -> list[list[int]]:
        if self.gssp is not None:
            return [list(g) for g in self.gssp.groups]
        return [self.servers[0].policy.workers]
