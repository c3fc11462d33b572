"""The `ray` backend: the same sync policies and compressors, driven by real processes.

The driver (this module, in the `shoal train` process) owns the decisions
the simulator makes in one process: GSSP membership (profiling, the split,
regrouping), evaluation, stopping rules, failures and checkpoints. Group
servers and workers are Ray actors (``ray_server``, ``ray_worker``; what
travels between them is in ``ray_wire``; the Ray session in
``ray_session``): a server gates its workers with its pure policy object and applies their gradients; a worker
pulls, computes a real gradient, pads to its emulated speed and link, and
pushes. Time is wall-clock time since the actors were ready.

Shared with the sim backend through the pure modules: GSSP built from the
config, the GDTopK group density, the worker codec, SIM's clock finishing
and summary. Still kept in step by hand: the GSSP split/regroup bookkeeping
and the other summary extras.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import ray

from shoal.backends.ray.collective_groups import CollectiveGroups
from shoal.backends.ray.evaluator import mean_state
from shoal.backends.ray.membership import Membership
from shoal.backends.ray.placement import Reservation
from shoal.backends.ray.recovery import Recovery
from shoal.backends.ray.server_recovery import ServerRecovery
from shoal.backends.ray.wire import first_line
from shoal.backends.ray.start import ActorSetup
from shoal.backends.ray.session import ActorPool, plugin_folders, ray_session, sigterm_as_interrupt, validate
from shoal.compress.similarity import similarity_summary
from shoal.engine.metrics import RunRecorder, WorkerStats, build_summary, diverged, internal_error
from shoal.engine.setup import RunSetup
from shoal.engine.task import Evaluation
from shoal.strategy import Strategy

ProgressFn = Callable[[dict[str, Any]], None]

TICK_S = 0.05  # driver loop period: stop checks, failure detection
DRAIN_S = 0.2  # how often each actor's records are collected

# -- the backend --------------------------------------------------------------------------


class RayBackend(ActorSetup, Membership, CollectiveGroups, Recovery, ServerRecovery):
    """Runs one configured training on Ray actors until a stopping rule fires (or Ctrl-C).

    This class is the driver loop, the records, evaluation and the summary;
    its roles live in mixins: ``ActorSetup`` (ray_start: creating the
    actors), ``Membership`` (ray_membership: GSSP's split and regroups),
    ``CollectiveGroups`` (ray_collective_groups: all-reduce groups),
    ``Recovery`` (ray_recovery: failures, checkpoints, resume), ``ServerRecovery``
    (ray_server_recovery: a dead group server replaced while the run goes on).
    """

    def __init__(self, setup: RunSetup, recorder: RunRecorder, progress: ProgressFn | None = None,
                 out: Path | None = None, resume: Path | None = None, strategy: Strategy | None = None) -> None:
        validate(setup.cfg)
        self.setup, self.cfg, self.recorder, self.progress = setup, setup.cfg, recorder, progress
        self.strategy = strategy or Strategy.from_config(setup.cfg, setup.engine.layout)
        self.out, self.resume = out, resume
        self.profile = setup.profile
        self.n = self.profile.workers
        self.speeds = list(self.profile.speeds)
        self.stats = [WorkerStats(id=w, group=0, speed=self.speeds[w]) for w in range(self.n)]
        self.gssp = self.strategy.coordinator(self.n)
        self.collective = self.cfg.sync.intra_group == "allreduce"  # all-reduce groups: workers only
        self._formed: list[list[int]] = []  # the all-reduce groups as formed now
        self._exchange_totals = {"exchanges": 0, "bytes_exchange": 0}  # all-reduce groups' deltas sent
        self.servers: list[Any] = []
        self.spares: list[Any] = []
        self.standby: list[Any] = []  # warm spare servers (backend.standby_servers) for replacing a dead one
        self.plan = setup.aggregation  # in-network aggregation ([network] aggregation = "ina"), else None
        self.switches: dict[str, Any] = {}
        self.dataplane: dict[str, Any] | None = None
        self.workers: dict[int, Any] = {}
        self.pids: dict[int, int] = {}
        self.devices: dict[int, str] = {}
        self.alive: set[int] = set()
        self.dead: set[int] = set()
        self.restarts = [0] * self.n
        self.departed: set[int] = set()  # workers that left (cluster.membership)
        self._membership_changes = self.cfg.cluster.schedule()
        self._joiner_speeds = iter(self.cfg.cluster.joiner_speeds())
        self.failures: list[dict[str, Any]] = []
        self.epoch = 0
        self.offset = 0.0
        self.t0 = 0.0
        self.stop_reason: str | None = None
        self.error: str | None = None  # an internal error that stopped the run (its traceback is in metrics.jsonl)
        self.started = False
        self.where = "local"
        self.lr = self.cfg.optimizer.lr_at(0.0)
        self.decays = 0  # steps of the decay schedule passed (a warm-up's stairs are not decays)
        self.ckpt_seq = 0
        self.last_checkpoint: str | None = None
        self._run_refs: dict[Any, int] = {}
        self._drains: dict[int, Any] = {}
        self._server_drains: dict[int, Any] = {}
        self._starting: dict[Any, int] = {}
        self._server_totals: dict[int, dict[str, Any]] = {}
        self._regroup_mark = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._keys: dict[Any, tuple[Any, ...]] = {}
        self._drain_sent: dict[int, float] = {}  # when each worker's pending drain was asked (liveness)
        self.reservation: Reservation | None = None  # the start-up actors' placement group (ray_placement)
        self.evaluator: Any = None
        self._eval_pending: tuple[float, Any, list[Any] | None] | None = None  # (t, evaluation, states kept)
        self._speed_changes = sorted(self.cfg.cluster.speed_changes, key=lambda c: c.at_s)
        self._init_server_recovery()
        self._evicted: dict[int, tuple[Any, list[Any]]] = {}  # kept unresponsive workers: (pending drain, run refs)
        self.positions: dict[int, dict[str, Any]] = {}  # each worker's data stream and generators, as last saved

    # -- time ------------------------------------------------------------------------

    def now(self) -> float:
        """Seconds of training: wall time since the actors were ready, plus time before a resume."""
        return time.time() - self.t0

    # -- the driver loop -----------------------------------------------------------------

    def _loop(self) -> None:
        period, next_eval = self.cfg.run.eval_every_s, self.offset
        every, next_eval_at = self.cfg.run.eval_every_iterations, self.recorder.iterations
        next_drain, next_ckpt = 0.0, self.offset + self._ckpt_period()
        while True:
            now = self.now()
            if every and self.recorder.iterations >= next_eval_at:  # as the drained records cross each multiple
                self._submit_evaluation()
                next_eval_at = (self.recorder.iterations // every + 1) * every
            elif not every and now >= next_eval:
                self._submit_evaluation()
                next_eval = max(next_eval + period, self.now() - period / 2)
            self._collect_evaluation()
            if self.stop_reason is not None:
                return
            if now >= self.cfg.run.max_time_s:
                self.stop_reason = "time_budget"
                return
            budget = self.cfg.run.max_iterations
            if budget and self.recorder.iterations >= budget and not self._ranks_stop_themselves():
                self.stop_reason = "iteration_budget"
                return
            if now >= next_ckpt:
                self._checkpoint()
                next_ckpt = self.now() + self._ckpt_period()
            self._apply_speed_changes(now)
            self._apply_membership(now)
            ready, _ = ray.wait(list(self._run_refs), num_returns=1, timeout=TICK_S) if self._run_refs else ([], [])
            if not self._run_refs:
                time.sleep(TICK_S)
            for ref in ready:
                self._worker_ended(ref)
            self._evict_unresponsive()
            self._collect_started()
            self._collect_rejoined()
            self._collect_replacements()
            if self.now() >= next_drain:
                self._drain()
                next_drain = self.now() + (TICK_S if self.cfg.run.max_iterations else DRAIN_S)
            self._tick_progress()

    def _apply_speed_changes(self, now: float) -> None:
        while self._speed_changes and self._speed_changes[0].at_s <= now:
            change = self._speed_changes.pop(0)
            self.speeds[change.worker] = change.speed
            if change.worker in self.alive:
                self.workers[change.worker].set_speed.remote(change.speed)
            self.recorder.event("speed_change", t=now, worker=change.worker, speed=change.speed)

    def _drain(self, wait_s: float = 0.0) -> None:
        """Collect iteration records (workers) and exchange events (servers); issue the next requests."""
        for w in self.alive:
            if w not in self._drains:
                self._drains[w] = self.workers[w].drain.remote(self._density(w))
                self._drain_sent[w] = self.now()
        down = self._servers_down()
        for i, server in enumerate(self.servers):
            if i not in self._server_drains and i not in down:
                self._server_drains[i] = server.drain.remote()
        refs = list(self._drains.values()) + list(self._server_drains.values())
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=wait_s)[0]) if refs else set()
        for w, ref in list(self._drains.items()):
            if ref in ready:
                del self._drains[w]
                try:
                    records = ray.get(ref)
                except ray.exceptions.RayError:
                    continue  # the worker died; its run reference reports it
                for record in records:
                    self._record(record)
        for i, ref in list(self._server_drains.items()):
            if ref in ready:
                del self._server_drains[i]
                try:
                    totals = ray.get(ref)
                except ray.exceptions.ActorDiedError as err:
                    self._server_failed(i, first_line(err))
                    continue
                for event in totals.pop("events"):
                    kind = event.pop("event")
                    event["t"] = round(event["t"], 6)
                    if kind == "exchange":
                        self._note_exchange(i, event["t"])
                    self.recorder.event(kind, **event)
                self._server_totals[i] = totals
        self._after_records()

    def _record(self, r: dict[str, Any]) -> None:
        if "event" in r:  # an all-reduce group's first rank: its delta sent (or not)
            self._rank_event(r)
            return
        w = r["worker"]
        stats = self.stats[w]
        stats.iterations += r.get("steps", 1)  # an iteration of balanced steps is a whole period
        stats.wait_s += r["wait_s"]
        stats.compute_s += r["compute_s"]
        stats.comm_s += r["comm_s"]
        down = r.get("bytes_down", self.setup.download_bytes)
        stats.sent(r["bytes_up"], down)
        self.recorder.bytes_up += r["bytes_up"]
        self.recorder.bytes_down += down
        self.recorder.iteration(
            t=r["t"], worker=w, group=stats.group, clock=r["clock"], staleness=r["staleness"],
            compute_s=r["compute_s"], wait_s=r["wait_s"], comm_s=r["comm_s"], pull_s=r["pull_s"], loss=r["loss"],
            compute_real_s=r["compute_real_s"], **{unit: r[unit] for unit in ("batch", "steps") if unit in r},
        )
        self._recent.append((r["t"], stats.group))
        self._note_applied(r["server"], r["t"])
        if diverged(r["loss"]) and self.stop_reason is None:
            self.stop_reason = "diverged"
        if self.gssp is not None and (transient := self.gssp.observe(w, r["compute_s"] + r["comm_s"])) is not None:
            self.servers[self.gssp.server_of[w]].set_transient.remote(w, transient)

    def _after_records(self) -> None:
        """GSSP decisions on what was observed (none while a dead server is being replaced); lr decay."""
        if self.gssp is not None and not self._servers_down():
            self._pad_profile_of_dead()
            if (groups := self.gssp.initial_split()) is not None:
                self._split(groups)
                self._share_updates()
            elif self.recorder.iterations // self.n > self._regroup_mark:
                self._regroup_mark = self.recorder.iterations // self.n
                self._share_updates()
                if moves := self.gssp.check_regroup(self.now()):
                    self._regroup(moves)
        epoch = self.setup.epochs(self.recorder.iterations)
        lr, decays = self.cfg.optimizer.lr_at(epoch), self.cfg.optimizer.decays_at(epoch)
        if lr != self.lr:
            decayed, self.lr, self.decays = decays != self.decays, lr, decays
            for server in self.servers:
                server.set_lr.remote(lr, decayed)  # at a decay, with SIM the servers also restart their periods
            if self.collective and self.gssp is not None:
                self._configure_groups()
            if self.strategy.local_models:
                for w in self.alive:
                    self.workers[w].set_lr.remote(lr)
            self.recorder.event(self.cfg.optimizer.change_event(epoch, decayed), t=self.now(), epoch=round(epoch, 4),
                                lr=lr)  # as the sim backend

    # -- evaluation, progress -------------------------------------------------------------

    def _state_refs(self) -> list[Any]:
        """References to what is evaluated: each all-reduce group's first rank's replica, else every group server's."""
        if self.collective:
            return self._collective_states()
        down = self._servers_down()  # while a dead server is being replaced, the others are evaluated
        return [s.state.remote() for g, s in enumerate(self.servers) if g not in down]

    def model_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What is evaluated: the replica, or the mean of the group replicas (GSSP)."""
        return mean_state(ray.get(self._state_refs()))

    def _submit_evaluation(self) -> None:
        """Start an evaluation of the current state in the evaluator actor (skipped while one is running)."""
        if self._eval_pending is not None:
            return
        t = self.now()
        refs = self._state_refs()
        if not refs:  # the only server is being replaced
            return
        keep = refs if not self.collective and not self._servers_down() else None
        self._eval_pending = (t, self.evaluator.evaluate.remote(*refs), keep)
        self._record_densities(t)

    def _collect_evaluation(self, wait_s: float = 0.0) -> None:
        """Record the evaluation in flight once it is done (at the time its states were taken)."""
        if self._eval_pending is None:
            return
        t, ref, keep = self._eval_pending
        if ray.wait([ref], timeout=wait_s)[0]:
            self._eval_pending = None
            try:
                evaluation = ray.get(ref)
            except ray.exceptions.RayActorError:  # a server died before handing out its state: skip this one
                self.recorder.event("eval_skipped", t=round(t, 6), reason="a group server died")
                return
            if keep is not None:  # kept once evaluated (so every state exists): a dead server's possible new start
                self._eval_states = (t, keep)
            self._record_evaluation(t, evaluation)

    def _evaluate(self, at: float | None = None) -> None:
        """Evaluate now, on the driver (the final state: the driver's engine keeps it as the run's model)."""
        self._collect_evaluation(wait_s=60.0)
        t = self.now() if at is None else at
        params, buffers = self.model_state()
        ds = self.setup.dataset
        self._record_densities(t)
        self._record_evaluation(t, self.setup.engine.evaluate(params, buffers, ds.x_test, ds.y_test))

    def _record_evaluation(self, t: float, ev: Evaluation) -> None:
        self.recorder.evaluation(round(t, 6), ev.value, ev.loss, self.cfg.target(), self.cfg.run.target_patience,
                                 accuracy=ev.accuracy)
        if self.recorder.time_to_target_s is not None and self.cfg.run.stop_at_target:  # also: reached before a resume
            self.stop_reason = "target_reached"
        if diverged(ev.loss, ev.value) and self.stop_reason is None:
            self.stop_reason = "diverged"
        self._tick_progress(force=True)

    def _record_densities(self, t: float) -> None:
        if self.strategy.compressed and self.gssp is not None:
            densities = [self._density(members[0]) if members else None for members in self._groups()]
            self.recorder.event("densities", t=round(t, 6), densities=densities)

    def group_rates(self, window_s: float = 2.0) -> list[float]:
        """Iterations per second of each group over the last ``window_s`` seconds of records."""
        newest = self._recent[-1][0] if self._recent else 0.0
        while self._recent and self._recent[0][0] < newest - window_s:
            self._recent.popleft()
        counts = [0] * max(1, len(self._groups()))
        for _, group in self._recent:
            if group < len(counts):
                counts[group] += 1
        return [round(c / window_s, 1) for c in counts]

    def _tick_progress(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = self.now()
        if not force and now - getattr(self, "_last_tick", -1.0) < 0.5:
            return
        self._last_tick = now
        self.progress({"t": now, "iterations": self.recorder.iterations, "accuracy": self.recorder.final_accuracy,
                       "rates": self.group_rates(), "failures": len(self.failures)})

    # -- run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Train until a stopping rule fires (or Ctrl-C / SIGTERM); return the summary record."""
        wall_start = time.perf_counter()
        self._status("starting Ray" if not self.cfg.backend.address else f"joining Ray at {self.cfg.backend.address}")
        with ray_session(self.cfg.backend, self._cpus_needed(), plugin_folders(self.cfg)) as where, \
                sigterm_as_interrupt():
            self.where = where
            try:
                self._start()
                self.recorder.event("start", t=round(self.offset, 6), scheme=self.cfg.sync.scheme, speeds=self.speeds,
                                    backend="ray", pids=self.pids, devices=self.devices, lr=self.lr)
                self.recorder.event("groups", t=round(self.offset, 6), groups=self._groups(), reason="start")
                if not self.collective:
                    self._record_servers("start")
                self._loop()
            except KeyboardInterrupt:
                self.stop_reason = "interrupted"
            except Exception as err:  # a bug mid-run: still stop, evaluate, checkpoint and write the summary
                if not self.started:
                    raise
                self.stop_reason, self.error = "internal_error", internal_error(self.recorder, self.now(), err)
            try:
                self._finish()
            except KeyboardInterrupt:
                self.stop_reason = "interrupted"
            finally:
                self._kill_all()
        return self._summary(time.perf_counter() - wall_start)

    def _finish(self) -> None:
        """Stop servers then workers, collect the last records, evaluate and checkpoint the final state.

        Each step is skipped if the actors are gone (a Ctrl-C in a terminal also reaches Ray's processes),
        so a summary of what was recorded is always written.
        """
        if not self.started:
            return
        self.elapsed = self.now()
        self.stop_reason = self.stop_reason or "interrupted"
        # two drains: the first collects the requests already in flight, the second what came after them
        steps = (self._stop_actors, lambda: self._drain(wait_s=5.0), lambda: self._drain(wait_s=5.0),
                 self._collect_dataplane, self._final_evaluation, self._final_checkpoint)
        for step in steps:
            try:
                step()
            except (ray.exceptions.RayError, ConnectionError) as err:
                self.recorder.event("shutdown_error", t=round(self.now(), 6), error=first_line(err))
        self.recorder.event("end", t=round(self.elapsed, 6), reason=self.stop_reason)

    def _stop_actors(self) -> None:
        stops = [s.stop.remote() for s in self.servers]
        ray.wait(stops, num_returns=len(stops), timeout=30)  # a dead server does not keep the workers going
        for w in self.alive:
            self.workers[w].stop.remote()
        # the ranks of an all-reduce group that lost a member wait in the collective for it until the collective's
        # timeout: not worth waiting for (they are ended with the run, their records drained first)
        wait_s = 1.0 if self.collective and self.failures else 10.0
        done, _ = ray.wait(list(self._run_refs), num_returns=len(self._run_refs), timeout=wait_s)
        for ref in done:
            self._run_refs.pop(ref)

    def _final_evaluation(self) -> None:
        """Always (unless no replica is up): servers may have applied updates since the last evaluation."""
        if self.collective or len(self._servers_down()) < len(self.servers):
            self._evaluate(at=self.elapsed)

    def _kill_all(self) -> None:
        """End every actor of this run, or keep the healthy ones for the next run (ActorPool)."""
        running = set(self._run_refs.values())
        reusable = {h._actor_id for w, h in self.workers.items() if w in self.alive and w not in running}
        reusable |= {h._actor_id for h in [*self.servers, *self.spares, *self.standby]}
        pooling = ActorPool.enabled and self.where == "existing" and self.started
        # a rank is kept only from a run whose groups all ended well; the evaluator and servers are kept either way
        if self.collective:
            ranks = {h._actor_id for h in self.workers.values()}
            reusable = reusable | ranks if not self.failures and not self._run_refs else reusable - ranks
        if self.evaluator is not None:
            reusable.add(self.evaluator._actor_id)
        evaluator = [self.evaluator] if self.evaluator is not None else []
        starting = [server for server, *_ in self._replacements.values()]
        for handle in [*self.workers.values(), *self.servers, *self.spares, *self.switches.values(), *evaluator,
                       *starting, *self.standby]:
            if pooling and handle._actor_id in reusable:
                ActorPool.give(self._keys[handle._actor_id], handle)
                continue
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self.reservation is not None:
            self.reservation.release()

    def _summary(self, wall_s: float) -> dict[str, Any]:
        totals = [self._server_totals.get(i, {}) for i in range(len(self.servers))]
        every = totals + self._retired_totals + [self._exchange_totals]  # servers that died count too
        self._count_losses()
        elapsed = getattr(self, "elapsed", self.offset)
        return build_summary(
            recorder=self.recorder, scheme=self.cfg.sync.scheme, backend="ray", mode=self.cfg.backend.mode,
            target_accuracy=self.cfg.run.target_accuracy, elapsed_s=round(elapsed, 3), wall_s=round(wall_s, 3),
            stop_reason=self.stop_reason or "interrupted", groups=self._groups(), workers=self.stats,
            extra={
                "compute_s": self.profile.compute_s,
                "params": self.setup.engine.num_params,
                "group_updates": [t.get("updates", 0) for t in totals],
                "exchanges": sum(t.get("exchanges", 0) for t in every),
                "bytes_exchange": int(sum(t.get("bytes_exchange", 0) for t in every)),
                "emulate": self.cfg.cluster.emulate,
                "ray": self.where,
                "failures": self.failures,
                "restarts": sum(self.restarts),
                "checkpoint": self.last_checkpoint,
                "resumed_from": str(self.resume) if self.resume is not None else None,
                # each worker computes its own gradient in its own process; the noise scale is measured on sim only
                "batching": {"device": "cuda" if self.cfg.backend.gpus_per_worker > 0 else "cpu", "batched": False},
                "gradient_noise_scale": None,
                **({"error": self.error} if self.error else {}),
                **self._similarity_summary(totals),
                **({"routing": {**self.plan.summary, "dataplane": self.dataplane}} if self.plan is not None else {}),
            },
        )

    @staticmethod
    def _similarity_summary(totals: list[dict[str, Any]]) -> dict[str, Any]:
        """SIM's final state per group server, and the bytes it saved in all (as the sim backend's summary)."""
        return similarity_summary([t["similarity"] for t in totals if "similarity" in t])

    def _groups(self) -> list[list[int]]:
        if self.gssp is not None:
            return [list(g) for g in self.gssp.groups]
        return [self._members()]
