"""The `sim` backend: a discrete-event simulation on a virtual clock (simpy).

Workers pull parameters, compute a real gradient on exactly what they pulled,
and push it; a server applies updates when its sync policy says so. Compute
and transfer durations come from the cluster profile and the cost model, so
a run is exactly reproducible from its seed. In cost mode the same schedule
runs without any model math.

BSP, ASP and SSP use one server. GSSP uses one server per group; the GSSP
policy object decides membership and when a group server sends its own
delta to its peers, and the backend only carries out those decisions
(sim/groups.py; sim/membership.py for workers joining and leaving).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import simpy
import torch

from shoal.cluster import StragglerModel
from shoal.backends.local_model import LocalModel, pull_bytes
from shoal.backends.sim.balance import SimBalance
from shoal.backends.sim.checkpoints import SimCheckpoints, at
from shoal.backends.sim.compute import SimCompute
from shoal.backends.sim.groups import SimGroups
from shoal.backends.sim.ina import SimInNetwork
from shoal.backends.sim.membership import SimMembership
from shoal.backends.sim.overlap import SimOverlap
from shoal.backends.sim.refining import SimRefine
from shoal.backends.sim.server import Pulled, Push, SimServer
from shoal.compress import GradientCodec
from shoal.compress.similarity import similarity_summary
from shoal.config import Config
from shoal.engine.cost import SharedLink, ring_allreduce_bytes, ring_allreduce_time
from shoal.engine.metrics import RunRecorder, WorkerStats, build_summary, diverged, internal_error
from shoal.engine.noise import NoiseScale
from shoal.engine.refine import sub_ticks
from shoal.engine.replica import Replica
from shoal.engine.setup import RunSetup
from shoal.strategy import AggregationSchedule, Strategy
from shoal.sync import SyncPolicy

ProgressFn = Callable[[dict[str, Any]], None]


class SimBackend(SimGroups, SimMembership, SimCheckpoints, SimBalance, SimOverlap, SimInNetwork, SimRefine,
                 SimCompute):
    """Runs one configured training (or cost-only) simulation to its stopping rule."""

    def __init__(self, setup: RunSetup, recorder: RunRecorder, progress: ProgressFn | None = None,
                 strategy: Strategy | None = None, out: Path | None = None, resume: Path | None = None) -> None:
        """``out``: where checkpoints go (backend.sim_checkpoint_every_s); ``resume``: a run folder to continue from
        its latest checkpoint."""
        self.setup = setup
        self.out = out
        self.resumed = self._load_checkpoint(resume) if resume is not None else None
        self.cfg: Config = setup.cfg
        self.strategy = strategy or Strategy.from_config(setup.cfg, setup.engine.layout)
        self.recorder = recorder
        self.progress = progress
        self.env = simpy.Environment(initial_time=self.resumed[1]["t"] if self.resumed else 0.0)
        self.profile = setup.profile
        n = self.profile.workers
        self.speeds = list(self.profile.speeds)
        self.stragglers = StragglerModel(self.cfg.cluster.stragglers, n, self.cfg.run.seed)
        self.stats = [WorkerStats(id=w, group=0, speed=self.speeds[w]) for w in range(n)]
        self.departed: set[int] = set()  # workers that left (cluster.membership)
        self.gssp = self.strategy.coordinator(n)
        self.balancer = self.strategy.balancer(n)  # sync.balance: each worker's batch size or local steps
        # equal batches only: balanced rounds mix batch sizes, which the estimate's algebra does not cover
        self.noise = NoiseScale(self.cfg.data.batch_size) if self.balancer is None else None
        self.gradients = self._init_compute()
        policy = self.gssp.policy(0) if self.gssp else self.strategy.policy(range(n))
        self.slices = self.strategy.slices
        self.lr = self.cfg.optimizer.lr_at(0.0)
        self.decays = 0  # steps of the decay schedule passed (a warm-up's stairs are not decays)
        self.server_opt = self.strategy.server_optimizer
        self.servers = [self._make_server(policy, self._initial_replica(), self._new_schedule())]
        self.codecs = self._make_codecs(self.strategy.codec)
        self.locals = self._make_local_models()
        self.delta_codecs = self._make_codecs(self.strategy.delta_codec) if self.locals else []
        self.exchange_codecs: list[GradientCodec] = []
        self.force_pull: set[int] = set()
        self.overlap, self.mixing = self._init_overlap()  # Streaming DiLoCo: exchanges beside inner steps
        self.base_version: dict[int, int] = {}  # the server version each worker's local model last synchronised at
        plan = setup.aggregation
        self._switch_links = {s: SharedLink(self.env, bps) for s, bps in plan.switch_bps.items()} if plan else {}
        self._switch_streams: dict[tuple[str, int], list[Any]] = {}
        # all-reduce groups (BSP, GSSP): a worker's push is its part of its group's ring all-reduce (no server)
        self.allreduce = self.cfg.sync.intra_group == "allreduce"
        self.exchanges = 0
        self.bytes_exchange = 0.0
        self.stop = self.env.event()
        self.stop_reason = "time_budget"
        self.wait_start: dict[int, float] = {}  # when each worker waiting at its gate began to wait
        self.next_eval = 0.0
        self.checkpoint_seq = 0
        self.next_checkpoint = self.cfg.backend.sim_checkpoint_every_s
        self._init_refine()  # run.eval_refine: copies of the evaluated model between evaluations
        if self.resumed is not None:
            self._restore(*self.resumed)

    # -- construction -----------------------------------------------------------

    def _initial_replica(self) -> Replica | None:
        if not self.setup.train_mode:
            return None
        params, buffers = self.setup.engine.initial_state()
        return Replica(params, buffers, self.server_opt, track_own=self.gssp is not None, outer=self.strategy.outer_step)

    def _new_schedule(self) -> AggregationSchedule | None:
        return self.strategy.aggregation_schedule()

    def _make_local_models(self) -> list[LocalModel]:
        """SIM, local SGD, DiLoCo: every worker's own model copy, for the tensors it steps locally."""
        if not self.strategy.local_models or not self.setup.train_mode:
            return []
        params, buffers = self.setup.engine.initial_state()
        return [LocalModel(params, buffers, self.cfg.optimizer, self.strategy.layout) for _ in self.stats]

    def _make_codecs(self, make: Callable[[int], GradientCodec | None]) -> list[GradientCodec]:
        """Every worker's codec from the strategy (empty without a compressor)."""
        codecs = [make(w) for w in range(len(self.stats))]
        return [c for c in codecs if c is not None]

    def epoch(self) -> float:
        """Global epochs done so far."""
        return self.setup.epochs(self.recorder.iterations)

    def density(self, worker: int) -> float:
        """Upload density of ``worker`` now (the strategy's rule: fixed, or its group's GDTopK schedule)."""
        return self.strategy.density(self.epoch(), worker, self.gssp)

    def group_density(self, server: int) -> float:
        """GDTopK: the scheduled density of a group (endpoints: the fastest and slowest group)."""
        return self.strategy.group_density(self.epoch(), server, self.gssp)

    def _make_server(self, policy: SyncPolicy, replica: Replica | None,
                     schedule: AggregationSchedule | None = None) -> SimServer:
        server = SimServer(self.env, policy, replica, self.weight(), self.profile.server_bps, schedule, self.slices)
        server.broadcast = self.strategy.broadcast_codec(len(getattr(self, "servers", [])))
        server.noise = self.noise
        return server

    def server_of(self, worker: int) -> SimServer:
        return self.servers[self.gssp.server_of[worker]] if self.gssp else self.servers[0]

    # -- processes ----------------------------------------------------------------

    def _worker(self, w: int, waiting_since: float | None = None) -> Iterator[simpy.Event]:
        """One worker's loop; ``waiting_since``: a resumed worker that was waiting at its gate since then."""
        profile = self.profile
        while not self.stop.triggered and w not in self.departed:
            t0 = self.env.now if waiting_since is None else waiting_since
            waiting_since = None
            while (gate := self.server_of(w).gate(w)) is not None:
                self.wait_start[w] = t0
                yield gate | self.stop
                if self.stop.triggered or w in self.departed:
                    return
            waited = self.env.now - t0

            server = self.server_of(w)
            t1 = self.env.now
            if self.overlap:  # the exchange whose result this step takes must have come back
                yield from self._exchanged(w, server.policy.clocks[w] - 1 - self.overlap)
            pulled_version = server.version
            pulled = self._pull(w, server)
            if self.allreduce:  # every worker holds the replica itself: nothing to download
                pulled = replace(pulled, nbytes=0)
            overlapped = self.overlap and pulled.clock > 0  # its download came with the exchange
            if pulled.nbytes and not overlapped:  # a local step (local SGD between syncs) contacts nobody
                yield self.env.timeout(profile.latency_s)
                yield server.egress.transfer(pulled.nbytes, profile.link_bps)
            pull_s = self.env.now - t1

            work, compute = self._plan_work(w, profile.compute_s * self.speeds[w] * self.stragglers.factor(w))
            finish = self._compute(w, pulled, work)
            yield self.env.timeout(compute)
            if w in self.departed:
                self.gradients.drop(w)
                return
            push, loss = finish()

            t2 = self.env.now
            ring_bytes, ring_s = self._ring(w) if self.allreduce else (0, 0.0)
            if self.allreduce:
                push = replace(push, nbytes=ring_bytes)
                yield self.env.timeout(ring_s)
            elif push.nbytes and self.overlap:  # Streaming DiLoCo: the exchange runs beside the next steps
                self._start_exchange(w, server, push, pulled.clock)
            elif push.nbytes:
                yield self.env.timeout(profile.latency_s)
                if w in self.departed:
                    return
                if self.setup.aggregation is None:
                    yield self.server_of(w).ingress.transfer(push.nbytes, profile.link_bps)
                else:
                    yield from self._push_in_network(w, server, push.nbytes, round_=pulled_version)
            push_s = self.env.now - t2
            if self.stop.triggered or w in self.departed:  # a leaver's last gradient is not applied
                return
            target = self.server_of(w)  # a regroup may have moved this worker while it computed
            self._deliver(w, target, push, staleness=target.version - pulled_version if target is server else None,
                          waited=waited, compute=compute, pull_s=pull_s, push_s=push_s, loss=loss,
                          down_bytes=ring_bytes if self.allreduce else pulled.nbytes, work=work)

    def _ring(self, w: int) -> tuple[int, float]:
        """Bytes each member sends and seconds of the ring all-reduce of ``w``'s group (its members now)."""
        members = len(self.gssp.groups[self.gssp.server_of[w]]) if self.gssp else len(self.stats)
        nbytes = 4 * self.setup.engine.num_params
        return (int(ring_allreduce_bytes(nbytes, members)),
                ring_allreduce_time(nbytes, members, self.profile.link_bps, self.profile.latency_s))

    def _deliver(self, w: int, server: SimServer, push: Push, *, staleness: int | None, waited: float,
                 compute: float, pull_s: float, push_s: float, loss: float | None, down_bytes: int,
                 work: int) -> None:
        """The server takes the push; record it; let GSSP react (exchange, split, regroup)."""
        comm = pull_s + push_s
        due = self._checkpoint_due()
        waiting = server.waiting() if due else []
        server.policy.observe(w, loss)
        if server.policy.flushes:  # a late change counts for less
            push = replace(push, discount=server.policy.discount(server.version - self.base_version.get(w, 0)))
        applied = server.receive(w, push)
        steps = work if self.strategy.balance == "steps" else 1  # an iteration of balanced steps is a whole period
        self._account(w, waited, compute, comm, push.nbytes, down_bytes, steps)
        self.recorder.iteration(
            t=self.env.now, worker=w, group=self.stats[w].group, clock=server.policy.clocks[w],
            staleness=staleness, compute_s=compute, wait_s=waited, comm_s=comm, pull_s=pull_s, loss=loss,
            **({"steps" if self.strategy.balance == "steps" else "batch": work} if self.balancer else {}),
        )
        if self.balancer is not None:
            self._balance(w, server, applied, compute, work)
        for clock in server.finish_measurements():
            self.recorder.event("sim", t=self.env.now, group=self.servers.index(server), clock=clock,
                                **server.schedule.state())
        if diverged(loss):
            self._finish("diverged")
        if self.gssp is not None:
            self._gssp_step(w, server, applied, compute + comm)
        if self.cfg.optimizer.scheduled:
            self._follow_lr()
        every = self.cfg.run.eval_every_iterations
        if every and self.recorder.iterations >= self._next_eval_iterations() and not self.stop.triggered:
            self._evaluate()
        if every and self.refiner is not None and not self.stop.triggered:
            self._keep_by_iterations()
        if self.cfg.run.max_iterations and self.recorder.iterations >= self.cfg.run.max_iterations:
            self._finish("iteration_budget")
        if due and applied and not self.stop.triggered:
            self._maybe_checkpoint(w, waiting)

    def _pull(self, w: int, server: SimServer) -> Pulled:
        """What ``w`` takes from its server; with SIM only the tensors aggregated at its previous clock."""
        if server.replica is None:
            return Pulled(None, None, self.setup.download_bytes)
        params, buffers = server.replica.snapshot()
        if server.schedule is None:
            return Pulled(params, buffers, self.setup.download_bytes)
        clock = server.policy.clocks[w]
        plan = server.schedule.plan(clock)
        changed = clock > 0 and w not in self.force_pull  # the fresh tensors moved by a sync since the last pull
        mixing = self.mixing if changed else 0.0  # an overlapped result
        fresh = (True,) * len(plan) if w in self.force_pull else server.schedule.fresh(clock)
        self.force_pull.discard(w)
        if any(fresh):  # what a change sent later is measured from (its staleness counts the updates since)
            self.base_version[w] = server.version
        values = self.locals[w].pull(params, fresh, mixing)
        server.schedule.record_saved(fresh)  # download
        server.schedule.record_saved(plan)  # upload
        nbytes = pull_bytes(values, self._buffer_values(server.schedule, fresh), fresh, server.broadcast, changed)
        return Pulled(self.locals[w].params, buffers, nbytes, fresh, plan, clock)

    def _buffer_values(self, schedule: AggregationSchedule, moved: tuple[bool, ...]) -> int:
        """Batch-norm values a SIM transfer carries: every time, or (local SGD) only with a sync."""
        return 0 if schedule.periodic and not any(moved) else self.setup.num_buffer_values

    def _next_eval_iterations(self) -> int:
        """run.eval_every_iterations: the next multiple after the last one evaluated at (balanced steps count
        several iterations at once, so a multiple may be stepped over)."""
        every = self.cfg.run.eval_every_iterations
        done = self.recorder.evals[-1]["iterations"] if self.recorder.evals else 0
        return (done // every + 1) * every

    def _follow_lr(self) -> None:
        """Follow the learning-rate schedule; SIM restarts its periods at a step decay (not at a warm-up's or a
        cosine's stair: small changes, and a cosine's would restart them all the time)."""
        opt, epoch = self.cfg.optimizer, self.epoch()
        lr = opt.lr_at(epoch)
        if lr == self.lr:
            return
        decays = opt.decays_at(epoch)
        decayed, self.lr, self.decays = decays != self.decays, lr, decays
        for server in self.servers:
            if server.replica is not None:
                server.replica.set_lr(lr)
            if server.schedule is not None and decayed:
                server.schedule.reset()
        for local in self.locals:
            local.set_lr(lr)
        self.recorder.event(opt.change_event(epoch, decayed), t=self.env.now, epoch=round(epoch, 4), lr=lr)

    def _account(self, w: int, waited: float, compute: float, comm: float, up_bytes: int, down_bytes: int,
                 steps: int = 1) -> None:
        stats = self.stats[w]
        stats.iterations += steps
        stats.wait_s += waited
        stats.compute_s += compute
        stats.comm_s += comm
        stats.sent(up_bytes, down_bytes)
        self.recorder.bytes_up += up_bytes
        self.recorder.bytes_down += down_bytes

    # -- clock, evaluation, stopping -------------------------------------------------

    def _clock(self, first_at: float | None = None) -> Iterator[simpy.Event]:
        """Evaluate every run.eval_every_s (a resumed run: first at the saved time); with run.eval_every_iterations
        only at the start here, then from ``_deliver``."""
        period = self.cfg.run.eval_every_s
        if self.cfg.run.eval_every_iterations:
            if first_at is None:
                self._evaluate()
            return
        if first_at is not None:
            yield from self._keep_until(at(self.env, first_at))
        while True:
            self._evaluate()
            if self.stop.triggered:
                return
            self.next_eval = self.env.now + period  # the time the timeout below lands on
            tick = self.env.timeout(period)
            if self.refiner is not None:
                self._keep_times = sub_ticks(self.env.now, period, self.refiner.factor)
            yield from self._keep_until(tick)

    def _budget(self) -> Iterator[simpy.Event]:
        budget = self.cfg.run.max_time_s
        yield at(self.env, budget) if self.resumed else self.env.timeout(budget)
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
            ev = self.setup.engine.evaluate(params, buffers, ds.x_test, ds.y_test)
            accuracy = ev.accuracy
            reached = self.recorder.evaluation(self.env.now, ev.value, ev.loss, self.cfg.target(),
                                               self.cfg.run.target_patience, accuracy=ev.accuracy)
            self._refine_after(reached)
            if diverged(ev.loss, ev.value):
                self._finish("diverged")
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
            for server in self.servers:  # pushes received in this last moment still make their update
                server.flush_now()

    def run(self) -> dict[str, Any]:
        """Simulate until a stopping rule fires; return the summary record."""
        wall_start = time.perf_counter()
        error = None
        first_eval = None
        if self.resumed is None:
            self.recorder.event("start", t=0.0, scheme=self.cfg.sync.scheme, speeds=self.speeds, lr=self.lr)
            self.recorder.event("groups", t=0.0, groups=self._groups(), reason="start")
            for w in range(self.profile.workers):
                self.env.process(self._worker(w))
        else:  # the closer of the round first, then the waiters in the order the release woke them
            folder, state = self.resumed
            self.recorder.event("resume", t=self.env.now, checkpoint=folder.name)
            for w in state["order"]:
                self.env.process(self._worker(w, state["wait_start"].get(str(w))))
            first_eval = state["next_eval"]
        for process in (self._budget(), self._clock(first_eval), self._speed_changes(), self._membership()):
            self.env.process(process)
        try:
            self.env.run(until=self.stop)
        except KeyboardInterrupt:  # Ctrl-C: what was simulated so far is still a run, with its summary
            self.stop_reason = "interrupted"
        except Exception as err:  # a bug mid-run: the summary of what was simulated is still written
            self.stop_reason, error = "internal_error", internal_error(self.recorder, self.env.now, err)
        try:
            if self.setup.train_mode and (not self.recorder.evals or self.recorder.evals[-1]["t"] < self.env.now):
                self._evaluate()
        except KeyboardInterrupt:  # a second Ctrl-C skips the final evaluation, not the summary
            self.stop_reason = "interrupted"
        except Exception as err:  # noqa: BLE001 - the state may be broken after an internal error
            if self.stop_reason != "internal_error":
                self.stop_reason, error = "internal_error", internal_error(self.recorder, self.env.now, err)
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
                **self._similarity_summary(),
                "batching": self.gradients.summary(),
                **({"evaluations_refined": self.refined_evaluations} if self.refiner is not None else {}),
                "gradient_noise_scale": self._noise_scale(),
                **({"routing": self.setup.aggregation.summary} if self.setup.aggregation else {}),
                **({"error": error} if self.stop_reason == "internal_error" else {}),
            },
        )

    def _noise_scale(self) -> float | None:
        """The run's gradient noise scale in samples (engine/noise.py), or None where it was not measured."""
        value = self.noise.value if self.noise is not None else None
        return None if value is None else round(value, 3)

    def _similarity_summary(self) -> dict[str, Any]:
        """SIM's final state per group server, and the bytes it saved in all."""
        return similarity_summary([s.schedule.state() for s in self.servers if s.schedule is not None])

    def _groups(self) -> list[list[int]]:
        if self.gssp is not None:
            return [list(g) for g in self.gssp.groups]
        return [self.servers[0].policy.workers]
