"""The `ray` backend: the same sync policies and compressors, driven by real processes.

The driver (this module, in the `shoal train` process) owns the decisions
the simulator makes in one process: GSSP membership (profiling, the split,
regrouping), evaluation, stopping rules, failures and checkpoints. Group
servers and workers are Ray actors (``ray_server``, ``ray_worker``; what
travels between them is in ``ray_wire``; the Ray session in ``ray_session``): a server gates its
workers with its pure policy object and applies their gradients; a worker
pulls, computes a real gradient, pads to its emulated speed and link, and
pushes. Time is wall-clock time since the actors were ready.

Shared with the sim backend through the pure modules: GSSP built from the
config, the GDTopK group density, the worker codec, SIM's clock finishing
and summary. Still kept in step by hand: the GSSP split/regroup bookkeeping
and the other summary extras.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.backends import checkpoint
from shoal.backends.local_model import aggregation_schedule, outer_step, uses_local_models
from shoal.backends.ray_server import GroupServer
from shoal.backends.ray_session import ActorPool, plugin_folders, ray_session, sigterm_as_interrupt, validate
from shoal.backends.ray_wire import Link
from shoal.backends.ray_worker import Worker
from shoal.backends.ray_switch import SERVER, SwitchActor, worker_name
from shoal.cluster.grouping import choose_groups
from shoal.compress import GDTopKSchedule
from shoal.compress.codec import exchange_codec, server_optimizer
from shoal.compress.similarity import similarity_summary
from shoal.config import ConfigError
from shoal.engine.metrics import RunRecorder, WorkerStats, build_summary, diverged
from shoal.engine.setup import RunSetup
from shoal.sync import SyncPolicy, make_policy
from shoal.sync.gssp import Move, gssp_from_config
from shoal.sync.policies import SSP

ProgressFn = Callable[[dict[str, Any]], None]

TICK_S = 0.05  # driver loop period: stop checks, failure detection
DRAIN_S = 0.2  # how often each actor's records are collected
STARTUP_TIMEOUT_S = 300.0


# -- the backend --------------------------------------------------------------------------


class RayBackend:
    """Runs one configured training on Ray actors until a stopping rule fires (or Ctrl-C)."""

    def __init__(self, setup: RunSetup, recorder: RunRecorder, progress: ProgressFn | None = None,
                 out: Path | None = None, resume: Path | None = None) -> None:
        validate(setup.cfg)
        self.setup, self.cfg, self.recorder, self.progress = setup, setup.cfg, recorder, progress
        self.out, self.resume = out, resume
        self.profile = setup.profile
        self.n = self.profile.workers
        self.speeds = list(self.profile.speeds)
        self.stats = [WorkerStats(id=w, group=0, speed=self.speeds[w]) for w in range(self.n)]
        self.gssp = gssp_from_config(self.cfg.sync, self.n) if self.cfg.sync.scheme == "gssp" else None
        self.schedule = GDTopKSchedule.from_config(self.cfg.compression.gdtopk)
        self.servers: list[Any] = []
        self.spares: list[Any] = []
        self.plan = setup.aggregation  # in-network aggregation ([network] aggregation = "ina"), else None
        self.switches: dict[str, Any] = {}
        self.dataplane: dict[str, Any] | None = None
        self.workers: dict[int, Any] = {}
        self.pids: dict[int, int] = {}
        self.devices: dict[int, str] = {}
        self.alive: set[int] = set()
        self.dead: set[int] = set()
        self.restarts = [0] * self.n
        self.failures: list[dict[str, Any]] = []
        self.epoch = 0
        self.offset = 0.0
        self.t0 = 0.0
        self.stop_reason: str | None = None
        self.started = False
        self.where = "local"
        self.lr = self.cfg.optimizer.lr
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
        self._speed_changes = sorted(self.cfg.cluster.speed_changes, key=lambda c: c.at_s)

    # -- time ------------------------------------------------------------------------

    def now(self) -> float:
        """Seconds of training: wall time since the actors were ready, plus time before a resume."""
        return time.time() - self.t0

    # -- construction ----------------------------------------------------------------

    def _cpus_needed(self) -> float:
        b = self.cfg.backend
        return self.n * b.cpus_per_worker + (1 + self._predicted_spares()) * b.cpus_per_server

    def _predicted_spares(self) -> int:
        """Extra GSSP group servers to start early, so the split does not wait for processes to start."""
        if self.gssp is None:
            return 0
        s = self.cfg.sync
        if isinstance(s.groups, int):
            return min(s.groups, self.n) - 1
        if not self.cfg.cluster.emulate:
            return 0
        times = [self.profile.compute_s * speed for speed in self.speeds]
        return len(choose_groups(times, s.groups, s.group_threshold, s.max_groups, s.split_ratio)) - 1

    def _server_actor(self, index: int) -> Any:
        c, b = self.cfg.cluster, self.cfg.backend
        peer_link = Link(c.latency_ms / 1e3, c.server_gbps * 1e9, c.emulate)
        args = (index, server_optimizer(self.cfg.compression, self.cfg.optimizer), 1.0 / self.n, self.cfg.sync.exchange_every, peer_link, b.torch_threads,
                outer_step(self.cfg))
        return self._actor(GroupServer, {"num_cpus": b.cpus_per_server, "max_concurrency": 10_000}, args)

    def _worker_actor(self, w: int) -> Any:
        b = self.cfg.backend
        x, y = self._shards[w]
        args = (w, self.cfg, x, y, self.setup.dataset.num_classes, self.speeds[w], self.profile.compute_s,
                self.setup.download_bytes, self._density(w))
        options = {"num_cpus": b.cpus_per_worker, "num_gpus": b.gpus_per_worker, "max_concurrency": 1000}
        return self._actor(Worker, options, args)

    def _actor(self, cls: type, options: dict[str, Any], args: tuple[Any, ...]) -> Any:
        """A new actor, or a kept one re-initialised (ActorPool)."""
        import ray

        key = (cls.__name__, *sorted(options.items()))
        handle = ActorPool.take(key) if self.where == "existing" else None
        if handle is not None:  # waited for: an async actor may run later calls before an earlier one
            ray.get(handle.reinit.remote(*args))
        else:
            handle = ray.remote(cls).options(**options).remote(*args)
        self._keys[handle._actor_id] = key
        return handle

    def _put_shards(self) -> None:
        import ray

        ds = self.setup.dataset
        self._shards = []
        for stream in self.setup.streams:
            idx = torch.as_tensor(stream.shard)
            self._shards.append((ray.put(ds.x_train[idx].numpy()), ray.put(ds.y_train[idx].numpy())))

    def _check_resources(self) -> None:
        import ray

        total = ray.cluster_resources()
        gpus = self.cfg.backend.gpus_per_worker * self.n
        if gpus > 0 and total.get("GPU", 0.0) < gpus:
            raise ConfigError(f"backend.gpus_per_worker: {self.n} workers need {gpus:g} GPUs, "
                              f"the Ray cluster has {total.get('GPU', 0.0):g}")
        cpus = self._cpus_needed()
        if not self.cfg.backend.address and total.get("CPU", 0.0) < cpus - 1e-9:  # a joined cluster may autoscale
            raise ConfigError(f"backend.cpus_per_worker / cpus_per_server: the actors request {cpus:g} CPUs, "
                              f"this Ray instance has {total.get('CPU', 0.0):g}; request fractions of a CPU")

    def _start(self) -> None:
        """Create the actors (from the initial state or a checkpoint) and wait until all are ready."""
        import ray

        self._check_resources()
        self._put_shards()
        resumed = self._load_resume() if self.resume is not None else None
        policies = self._initial_policies(resumed)
        self.servers = [self._server_actor(i) for i in range(len(policies))]
        if self.gssp is not None and not self.gssp.grouped:
            self.spares = [self._server_actor(i + 1) for i in range(self._predicted_spares())]
        for w in range(self.n):
            self.workers[w] = self._worker_actor(w)
        self._install_servers(policies, resumed)
        if self.plan is not None:
            self._start_switches()
        pings = {self.workers[w].ping.remote(): w for w in range(self.n)}
        pings |= {s.ping.remote(): -1 for s in self.servers + self.spares + list(self.switches.values())}
        ready, pending = ray.wait(list(pings), num_returns=len(pings), timeout=STARTUP_TIMEOUT_S)
        if pending:
            raise RuntimeError(f"{len(pending)} Ray actors were not placed within {STARTUP_TIMEOUT_S:.0f} s "
                               f"(resources: {ray.available_resources()})")
        for ref in ready:
            if pings[ref] >= 0:
                info = ray.get(ref)
                self.pids[pings[ref]], self.devices[pings[ref]] = info["pid"], info["device"]
        self.t0 = time.time() - self.offset
        ray.get([s.set_peers.remote(self.servers, self.t0) for s in self.servers])
        for w in range(self.n):
            self._launch(w)
        self.started = True

    def _start_switches(self) -> None:
        """One switch actor per aggregation switch of the plan; every worker learns its node, the server the workers."""
        import ray

        plan, net = self.plan, self.cfg.network
        assert plan is not None
        members: dict[str, list[str]] = {}
        for w, node in enumerate(plan.node_of):
            if node is not None:
                members.setdefault(node, []).append(worker_name(w))
        for switch, names in sorted(members.items()):
            self.switches[switch] = ray.remote(SwitchActor).options(num_cpus=0, max_concurrency=1000).remote(
                switch, names, net.switch_slots)
        server, run_id = self.servers[0], uuid.uuid4().hex
        calls = [s.set_server.remote(server) for s in self.switches.values()]
        calls.append(server.ina_setup.remote({worker_name(w): self.workers[w] for w in range(self.n)},
                                             self.setup.engine.num_params, net.fragment_size, run_id))
        for w, node in enumerate(plan.node_of):
            handle = server if node is None else self.switches[node]
            fan_in = 1 if node is None else len(members[node])
            calls.append(self.workers[w].set_ina.remote(worker_name(w), node or SERVER, fan_in, net.fragment_size,
                                                        net.resend_timeout_s, handle, plan.rate_bps, run_id))
        ray.get(calls)

    def _collect_dataplane(self) -> None:
        """The data plane's counters: per switch, the server's receiving side and the workers' senders (summed)."""
        import ray

        if self.plan is None:
            return
        switches = dict(zip(self.switches, ray.get([s.counters.remote() for s in self.switches.values()], timeout=30)))
        totals = ray.get(self.servers[0].drain.remote(), timeout=30)
        for event in totals.pop("events"):
            self.recorder.event(event.pop("event"), **event)
        server = totals.get("dataplane", {})
        senders = ray.get([self.workers[w].ina_counters.remote() for w in sorted(self.alive)], timeout=30)
        workers: dict[str, int] = {}
        for counters in senders:
            for key, value in (counters or {}).items():
                workers[key] = workers.get(key, 0) + value
        net = self.cfg.network
        self.dataplane = {"fragment_size": net.fragment_size, "switch_slots": net.switch_slots,
                          "switches": switches, "server": server, "workers": workers}
        self.recorder.event("dataplane", t=round(self.now(), 6), **self.dataplane)

    def _initial_policies(self, resumed: dict[str, Any] | None) -> list[SyncPolicy]:
        if self.gssp is not None:
            return [self._live_policy(members) for members in self.gssp.groups]
        sync = self.cfg.sync
        return [make_policy(sync.scheme, range(self.n), sync.staleness, sync.local_steps)]

    def _live_policy(self, members: list[int]) -> SSP:
        """The SSP policy a group server runs: its members that are still alive."""
        policy = SSP(members or [0], self.cfg.sync.staleness)
        for w in list(policy.clocks):
            if w not in members or w in self.dead:
                policy.remove(w)
        return policy

    def _install_servers(self, policies: list[SyncPolicy], resumed: dict[str, Any] | None) -> None:
        import ray

        track_own = self.gssp is not None
        if resumed is None:
            params, buffers = self.setup.engine.initial_state()
            ray.get(self.servers[0].install.remote(policies[0], params.numpy(), buffers.numpy(), track_own, self.epoch))
        else:
            folder = str(resumed["folder"])
            ray.get([s.restore.remote(policies[g], folder, f"group-{g}", self.epoch) for g, s in enumerate(self.servers)])
        schedule = aggregation_schedule(self.cfg, self.setup.engine.layout)  # built exactly as the sim builds it
        if schedule is not None:  # SIM periods are not checkpointed: a resume starts them again
            ray.get([s.set_similarity.remote(schedule.restarted(keep_bytes=g == 0), self._slices())
                     for g, s in enumerate(self.servers)])

    def _slices(self) -> list[tuple[int, int]]:
        return [(s.offset, s.offset + s.numel) for s in self.setup.engine.layout]

    def _launch(self, w: int) -> None:
        """Start ``w``'s loop on its current route."""
        self.alive.add(w)
        server = self.server_of(w)
        if uses_local_models(self.cfg) and self.lr != self.cfg.optimizer.lr:
            self.workers[w].set_lr.remote(self.lr)  # a restarted worker's local optimizer follows the decay
        self._run_refs[self.workers[w].run.remote(self.t0, self.epoch, server, self.servers[server])] = w

    def server_of(self, worker: int) -> int:
        return self.gssp.server_of[worker] if self.gssp is not None else 0

    def _density(self, worker: int) -> float:
        """Upload density of ``worker`` now: fixed for topk, scheduled per group for gdtopk (as in sim)."""
        if self.cfg.compression.method != "gdtopk":
            return self.cfg.compression.density
        epoch = self.setup.epochs(self.recorder.iterations)
        if self.gssp is None or not self.gssp.grouped:
            return self.schedule.group_density(epoch, [], [])
        return self._group_density(self.gssp.server_of[worker])

    def _group_density(self, server: int) -> float:
        """GDTopK: a group's scheduled density (endpoints: the fastest and slowest group, as in sim)."""
        if self.cfg.compression.method != "gdtopk" or self.gssp is None:
            return self.cfg.compression.density
        epoch = self.setup.epochs(self.recorder.iterations)
        groups = self.gssp.groups
        return self.schedule.group_density(epoch, self.gssp.profiler.times(), groups[server], groups)

    # -- the driver loop -----------------------------------------------------------------

    def _loop(self) -> None:
        import ray

        period, next_eval = self.cfg.run.eval_every_s, self.offset
        next_drain, next_ckpt = 0.0, self.offset + self._ckpt_period()
        while True:
            now = self.now()
            if now >= next_eval:
                self._evaluate()
                next_eval = max(next_eval + period, self.now() - period / 2)
            if self.stop_reason is not None:
                return
            if now >= self.cfg.run.max_time_s:
                self.stop_reason = "time_budget"
                return
            budget = self.cfg.run.max_iterations
            if budget and self.recorder.iterations >= budget:
                self.stop_reason = "iteration_budget"
                return
            if now >= next_ckpt:
                self._checkpoint()
                next_ckpt = self.now() + self._ckpt_period()
            self._apply_speed_changes(now)
            ready, _ = ray.wait(list(self._run_refs), num_returns=1, timeout=TICK_S) if self._run_refs else ([], [])
            if not self._run_refs:
                time.sleep(TICK_S)
            for ref in ready:
                self._worker_ended(ref)
            self._collect_started()
            if self.now() >= next_drain:
                self._drain()
                next_drain = self.now() + (TICK_S if self.cfg.run.max_iterations else DRAIN_S)
            self._tick_progress()

    def _ckpt_period(self) -> float:
        every = self.cfg.backend.checkpoint_every_s
        return every if every > 0 and self.out is not None else math.inf

    def _apply_speed_changes(self, now: float) -> None:
        while self._speed_changes and self._speed_changes[0].at_s <= now:
            change = self._speed_changes.pop(0)
            self.speeds[change.worker] = change.speed
            if change.worker in self.alive:
                self.workers[change.worker].set_speed.remote(change.speed)
            self.recorder.event("speed_change", t=now, worker=change.worker, speed=change.speed)

    def _drain(self, wait_s: float = 0.0) -> None:
        """Collect iteration records (workers) and exchange events (servers); issue the next requests."""
        import ray

        for w in self.alive:
            if w not in self._drains:
                self._drains[w] = self.workers[w].drain.remote(self._density(w))
        for i, server in enumerate(self.servers):
            if i not in self._server_drains:
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
                totals = ray.get(ref)
                for event in totals.pop("events"):
                    kind = event.pop("event")
                    event["t"] = round(event["t"], 6)
                    self.recorder.event(kind, **event)
                self._server_totals[i] = totals
        self._after_records()

    def _record(self, r: dict[str, Any]) -> None:
        w = r["worker"]
        stats = self.stats[w]
        stats.iterations += 1
        stats.wait_s += r["wait_s"]
        stats.compute_s += r["compute_s"]
        stats.comm_s += r["comm_s"]
        self.recorder.bytes_up += r["bytes_up"]
        self.recorder.bytes_down += r.get("bytes_down", self.setup.download_bytes)
        self.recorder.iteration(
            t=r["t"], worker=w, group=stats.group, clock=r["clock"], staleness=r["staleness"],
            compute_s=r["compute_s"], wait_s=r["wait_s"], comm_s=r["comm_s"], loss=r["loss"],
            compute_real_s=r["compute_real_s"],
        )
        self._recent.append((r["t"], stats.group))
        if diverged(r["loss"]) and self.stop_reason is None:
            self.stop_reason = "diverged"
        if self.gssp is not None and (transient := self.gssp.observe(w, r["compute_s"] + r["comm_s"])) is not None:
            self.servers[self.gssp.server_of[w]].set_transient.remote(w, transient)

    def _after_records(self) -> None:
        """GSSP decisions on what was observed; lr decay."""
        if self.gssp is not None:
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
        lr = self.cfg.optimizer.lr_at(epoch)
        if lr != self.lr:
            self.lr = lr
            for server in self.servers:
                server.set_lr.remote(lr)  # with SIM the servers also restart their periods
            if uses_local_models(self.cfg):
                for w in self.alive:
                    self.workers[w].set_lr.remote(lr)
            self.recorder.event("lr_decay", t=self.now(), epoch=round(epoch, 4), lr=lr)  # as the sim backend

    # -- GSSP membership -------------------------------------------------------------------

    def _split(self, groups: list[list[int]]) -> None:
        """One server per group: group 0 keeps server 0 (fresh optimizer), the others start from its copy."""
        import ray

        self.epoch += 1
        policies = [self._live_policy(members) for members in groups]
        params, buffers, schedule = ray.get(self.servers[0].split.remote(policies[0], self.epoch))
        p_ref, b_ref = ray.put(params), ray.put(buffers)
        while len(self.spares) < len(groups) - 1:
            self.spares.append(self._server_actor(len(self.spares) + 1))
        new, surplus = self.spares[: len(groups) - 1], self.spares[len(groups) - 1 :]
        ray.get([s.install.remote(policies[g + 1], p_ref, b_ref, True, self.epoch) for g, s in enumerate(new)])
        if schedule is not None:  # SIM: every group server runs a restarted copy (group 0 keeps the bytes saved)
            ray.get([s.set_similarity.remote(schedule, self._slices()) for s in new])
        for spare in surplus:
            ray.kill(spare)
        self.spares = []
        self.servers = [self.servers[0], *new]
        ray.get([s.set_peers.remote(self.servers, self.t0) for s in self.servers])
        layout = self.setup.engine.layout
        ray.get([s.set_exchange_codec.remote(exchange_codec(self.cfg.compression, self.cfg.run.seed, g, layout))
                 for g, s in enumerate(self.servers)])
        for g, members in enumerate(groups):
            for w in members:
                self.stats[w].group = g
                if w in self.alive:
                    self.workers[w].set_route.remote(self.epoch, g, self.servers[g])
        self.recorder.event("groups", t=self.now(), groups=groups, reason="profiled",
                            times=[round(t, 6) for t in self.gssp.profiler.times()])

    def _regroup(self, moves: list[Move]) -> None:
        """Carry out the policy's moves: the new server admits, the old one releases, then the route."""
        import ray

        self.epoch += 1
        live = [m for m in moves if m.worker in self.alive]
        ray.get([self.servers[m.new].add_worker.remote(m.worker, self.epoch) for m in live])
        ray.get([self.servers[m.old].remove_worker.remote(m.worker, self.epoch) for m in live])
        for move in moves:
            self.stats[move.worker].group = move.new
        for move in live:
            self.workers[move.worker].set_route.remote(self.epoch, move.new, self.servers[move.new])
        for idle in {m.old for m in moves} & set(self.gssp.idle_servers):
            self.servers[idle].flush_exchange.remote()  # its merged-away group's last updates reach the peers
        self.recorder.event("groups", t=self.now(), groups=self.gssp.groups, reason="regroup",
                            moves=[[m.worker, m.old, m.new] for m in moves])

    def _share_updates(self) -> None:
        """Each group server's share of all updates (GSSP global momentum) and its exchange density."""
        shares = self.gssp.update_shares() if self.cfg.sync.group_momentum == "global" else [None] * len(self.servers)
        for g, (server, share) in enumerate(zip(self.servers, shares)):
            server.set_update_share.remote(share, self._group_density(g))

    def _pad_profile_of_dead(self) -> None:
        """A worker lost while profiling would keep the split from ever happening: count it as profiled."""
        gssp = self.gssp
        if gssp is None or gssp.grouped or not self.dead:
            return
        times = [t for w, t in enumerate(gssp.profiler.times()) if gssp.profiler.count[w] and w not in self.dead]
        for w in self.dead:
            while gssp.profiler.count[w] < gssp.profiler.warmup:
                own = gssp.profiler.times()[w] if gssp.profiler.count[w] else 0.0
                gssp.observe(w, own or (float(np.median(times)) if times else self.profile.compute_s))

    # -- failures ------------------------------------------------------------------------

    def _worker_ended(self, ref: Any) -> None:
        """A worker's loop returned: a failure unless the run is stopping."""
        import ray

        w = self._run_refs.pop(ref)
        try:
            ray.get(ref)
            error = "worker loop ended"
        except ray.exceptions.RayError as err:
            error = _first_line(err)
        if self.stop_reason is None:
            self._fail(w, error)

    def _fail(self, w: int, error: str) -> None:
        """Remove a failed worker from its server's gating (nobody waits for it), then restart or drop it."""
        import ray

        self.alive.discard(w)
        self._drains.pop(w, None)
        if self.plan is not None:  # its switch and the server wait for its fragments: the round cannot finish
            self.failures.append({"t": round(self.now(), 6), "worker": w, "error": error, "restarted": False})
            self.recorder.event("worker_failed", t=self.now(), worker=w, error=error, restarted=False)
            self.dead.add(w)
            self.stop_reason = "worker_failed"
            return
        restart = self.restarts[w] < self.cfg.backend.max_restarts
        self.failures.append({"t": round(self.now(), 6), "worker": w, "error": error, "restarted": restart})
        self.recorder.event("worker_failed", t=self.now(), worker=w, error=error, restarted=restart)
        self.epoch += 1
        ray.get(self.servers[self.server_of(w)].remove_worker.remote(w, self.epoch))
        ray.kill(self.workers[w], no_restart=True)
        if not restart:
            self.dead.add(w)
            return
        self.restarts[w] += 1
        self.workers[w] = self._worker_actor(w)
        self._starting[self.workers[w].ping.remote()] = w

    def _collect_started(self) -> None:
        """Restarted workers that are ready rejoin their group's server (at its slowest clock)."""
        import ray

        if not self._starting:
            return
        ready, _ = ray.wait(list(self._starting), num_returns=len(self._starting), timeout=0)
        for ref in ready:
            w = self._starting.pop(ref)
            self.pids[w] = ray.get(ref)["pid"]
            self.epoch += 1
            server = self.server_of(w)
            ray.get(self.servers[server].add_worker.remote(w, self.epoch))
            self._launch(w)
            self.recorder.event("worker_restarted", t=self.now(), worker=w, restarts=self.restarts[w])

    # -- evaluation, progress, checkpoints ----------------------------------------------------

    def model_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What is evaluated: the replica, or the mean of the group replicas (GSSP)."""
        import ray

        states = ray.get([s.state.remote() for s in self.servers])
        params = [torch.from_numpy(np.array(p)) for p, _ in states]
        buffers = [torch.from_numpy(np.array(b)) for _, b in states]
        if len(states) == 1:
            return params[0], buffers[0]
        return torch.stack(params).mean(0), torch.stack(buffers).mean(0)

    def _evaluate(self, at: float | None = None) -> None:
        t = self.now() if at is None else at
        params, buffers = self.model_state()
        ds = self.setup.dataset
        ev = self.setup.engine.evaluate(params, buffers, ds.x_test, ds.y_test)
        self.recorder.evaluation(round(t, 6), ev.value, ev.loss, self.cfg.target(), self.cfg.run.target_patience,
                                 accuracy=ev.accuracy)
        if self.recorder.time_to_target_s is not None and self.cfg.run.stop_at_target:  # also: reached before a resume
            self.stop_reason = "target_reached"
        if diverged(ev.loss, ev.value) and self.stop_reason is None:
            self.stop_reason = "diverged"
        if self.cfg.compression.method != "none" and self.gssp is not None:
            densities = [self._density(members[0]) if members else None for members in self._groups()]
            self.recorder.event("densities", t=round(t, 6), densities=densities)
        self._tick_progress(force=True)

    def group_rates(self, window_s: float = 2.0) -> list[float]:
        """Iterations per second of each group over the last ``window_s`` seconds of records."""
        newest = self._recent[-1][0] if self._recent else 0.0
        while self._recent and self._recent[0][0] < newest - window_s:
            self._recent.popleft()
        counts = [0] * max(1, len(self.servers))
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

    def _checkpoint(self) -> None:
        """Every group server saves its replica and optimizer; then the run state commits the set."""
        import ray

        if self.out is None:
            return
        root = self.out / "checkpoint"
        self.ckpt_seq += 1
        folder = checkpoint.new_folder(root, self.ckpt_seq)
        ray.get([s.save.remote(str(folder)) for s in self.servers])
        checkpoint.commit(root, folder, self._run_state())
        self.last_checkpoint = str(folder)
        self.recorder.event("checkpoint", t=round(self.now(), 6), path=str(folder))

    def _run_state(self) -> dict[str, Any]:
        r = self.recorder
        return {
            "scheme": self.cfg.sync.scheme, "workers": self.n, "elapsed_s": getattr(self, "elapsed", None) or self.now(),
            "iterations": r.iterations,
            "bytes_up": r.bytes_up, "bytes_down": r.bytes_down, "best_accuracy": r.best_accuracy,
            "time_to_target_s": r.time_to_target_s, "last_eval": r.evals[-1] if r.evals else None,
            "stats": [asdict(s) for s in self.stats], "groups": self._groups(),
            "grouped": bool(self.gssp and self.gssp.grouped),
            "profile_times": self.gssp.profiler.times() if self.gssp else None,
            "failures": self.failures, "restarts": self.restarts, "servers": len(self.servers),
        }

    def _load_resume(self) -> dict[str, Any]:
        """Restore the run state of the last checkpoint; the replicas load in the servers."""
        assert self.resume is not None
        folder, state = checkpoint.latest(self.resume / "checkpoint")
        r = self.recorder
        r.iterations, r.bytes_up, r.bytes_down = state["iterations"], state["bytes_up"], state["bytes_down"]
        r.best_accuracy, r.time_to_target_s = state["best_accuracy"], state["time_to_target_s"]
        if state["last_eval"] is not None:
            r.evals.append(state["last_eval"])
        self.stats = [WorkerStats(**s) for s in state["stats"]]
        self.failures = list(state["failures"])
        self.offset = float(state["elapsed_s"])
        self.ckpt_seq = int(folder.name.rpartition("-")[2])  # numbering goes on, so newer sorts later
        if self.gssp is not None and state["grouped"]:
            self._restore_groups(state["groups"], state["profile_times"])
        self.recorder.event("resume", t=round(self.offset, 6), checkpoint=str(folder))
        return {"folder": folder, **state}

    def _restore_groups(self, groups: list[list[int]], times: list[float]) -> None:
        """Put the GSSP policy back into its grouped state (profile and groups of the checkpoint)."""
        gssp = self.gssp
        assert gssp is not None
        for w, seconds in enumerate(times):
            for _ in range(gssp.profiler.warmup):
                gssp.observe(w, seconds)
        gssp._install(groups)  # GSSP has no public restore yet; _install is its own set-up step
        gssp.grouped = True

    # -- run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Train until a stopping rule fires (or Ctrl-C / SIGTERM); return the summary record."""
        wall_start = time.perf_counter()
        with ray_session(self.cfg.backend, self._cpus_needed(), plugin_folders(self.cfg)) as where, \
                sigterm_as_interrupt():
            self.where = where
            try:
                self._start()
                self.recorder.event("start", t=round(self.offset, 6), scheme=self.cfg.sync.scheme, speeds=self.speeds,
                                    backend="ray", pids=self.pids, devices=self.devices)
                self.recorder.event("groups", t=round(self.offset, 6), groups=self._groups(), reason="start")
                self._loop()
            except KeyboardInterrupt:
                self.stop_reason = "interrupted"
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
        import ray

        if not self.started:
            return
        self.elapsed = self.now()
        self.stop_reason = self.stop_reason or "interrupted"
        steps = (self._stop_actors, lambda: self._drain(wait_s=5.0), self._collect_dataplane, self._final_evaluation,
                 self._final_checkpoint)
        for step in steps:
            try:
                step()
            except (ray.exceptions.RayError, ConnectionError) as err:
                self.recorder.event("shutdown_error", t=round(self.now(), 6), error=_first_line(err))
        self.recorder.event("end", t=round(self.elapsed, 6), reason=self.stop_reason)

    def _stop_actors(self) -> None:
        import ray

        ray.get([s.stop.remote() for s in self.servers], timeout=30)
        for w in self.alive:
            self.workers[w].stop.remote()
        done, _ = ray.wait(list(self._run_refs), num_returns=len(self._run_refs), timeout=10)
        for ref in done:
            self._run_refs.pop(ref)

    def _final_evaluation(self) -> None:
        """Always: servers may have applied updates between the last evaluation and the stop."""
        self._evaluate(at=self.elapsed)

    def _final_checkpoint(self) -> None:
        if self._ckpt_period() < math.inf:
            self._checkpoint()

    def _kill_all(self) -> None:
        """End every actor of this run, or keep the healthy ones for the next run (ActorPool)."""
        import ray

        running = set(self._run_refs.values())
        reusable = {h._actor_id for w, h in self.workers.items() if w in self.alive and w not in running}
        reusable |= {h._actor_id for h in [*self.servers, *self.spares]}
        pooling = ActorPool.enabled and self.where == "existing" and self.started
        for handle in [*self.workers.values(), *self.servers, *self.spares, *self.switches.values()]:
            if pooling and handle._actor_id in reusable:
                ActorPool.give(self._keys[handle._actor_id], handle)
                continue
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _summary(self, wall_s: float) -> dict[str, Any]:
        totals = [self._server_totals.get(i, {}) for i in range(len(self.servers))]
        elapsed = getattr(self, "elapsed", self.offset)
        return build_summary(
            recorder=self.recorder, scheme=self.cfg.sync.scheme, backend="ray", mode=self.cfg.backend.mode,
            target_accuracy=self.cfg.run.target_accuracy, elapsed_s=round(elapsed, 3), wall_s=round(wall_s, 3),
            stop_reason=self.stop_reason or "interrupted", groups=self._groups(), workers=self.stats,
            extra={
                "compute_s": self.profile.compute_s,
                "params": self.setup.engine.num_params,
                "group_updates": [t.get("updates", 0) for t in totals],
                "exchanges": sum(t.get("exchanges", 0) for t in totals),
                "bytes_exchange": int(sum(t.get("bytes_exchange", 0) for t in totals)),
                "emulate": self.cfg.cluster.emulate,
                "ray": self.where,
                "failures": self.failures,
                "restarts": sum(self.restarts),
                "checkpoint": self.last_checkpoint,
                "resumed_from": str(self.resume) if self.resume is not None else None,
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
        return [list(range(self.n))]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    for line in text.splitlines():
        if "Error" in line or "error" in line or "died" in line:
            return line.strip()[:300]
    return (text.splitlines()[0] if text else type(err).__name__)[:300]
