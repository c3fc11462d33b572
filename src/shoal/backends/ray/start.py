"""Starting a ray run: the actors (fresh or from the kept pool), their data, the switches and first routes.

A mixin of ``RayBackend`` (backends/ray/driver.py): it reads and sets the driver's
attributes, which ``RayBackend.__init__`` declares.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import torch
import ray

from shoal.backends.ray.data import shard_ref
from shoal.backends.ray.evaluator import Evaluator
from shoal.backends.ray.server import GroupServer
from shoal.backends.ray.placement import bundle, reserve
from shoal.backends.ray.session import ActorPool, pool_key
from shoal.backends.ray.wire import Link, actor_threads
from shoal.backends.ray.worker import Worker
from shoal.backends.ray.switch import SERVER, SwitchActor, worker_name
from shoal.cluster.grouping import choose_groups
from shoal.errors import ConfigError
from shoal.sync import SyncPolicy

STARTUP_TIMEOUT_S = 300.0
CLUSTER_GROW_S = 20.0  # how long a joined cluster may take to offer the CPUs a run requests (autoscaling)
LOCAL_PLACE_S = 5.0  # a local Ray has the CPUs it declared, or other actors hold them: nothing to wait for
EVALUATOR_OPTIONS = {"num_cpus": 0, "max_concurrency": 1}  # no CPU reserved: it works only now and then


def wait_for_cpus(needed: float, cpus: Callable[[], float], timeout_s: float, poll_s: float = 1.0,
                  sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> float:
    """The cluster's CPUs once they reach ``needed``, or what it has after ``timeout_s`` (then too few)."""
    deadline = clock() + timeout_s
    have = cpus()
    while have < needed - 1e-9 and clock() < deadline:
        sleep(poll_s)
        have = cpus()
    return have


def started(ref: Any) -> Any:
    """An actor's answer to its first call; bad input it found while starting (ConfigError) as one line."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as err:  # Ray keeps the constructor's error only as text
        last = str(err).strip().splitlines()[-1] if str(err).strip() else ""
        marker = f"{ConfigError.__module__}.{ConfigError.__name__}: "
        if err.actor_init_failed and marker in last:
            raise ConfigError(last.split(marker, 1)[1]) from None
        raise


class ActorSetup:
    """Creates the group servers, workers and switch actors of a run and starts the workers' loops."""

    def _cpus_needed(self) -> float:
        b = self.cfg.backend
        workers = self.cfg.cluster.total_workers  # joiners (cluster.membership) need their CPUs too
        if self.collective:
            return workers * b.cpus_per_worker
        servers = 1 + self._predicted_spares() + b.standby_servers
        return workers * b.cpus_per_worker + servers * b.cpus_per_server

    def _make_room(self) -> None:
        """Kept actors (ActorPool) hold their CPUs. When the free CPUs and the kept actors this run takes would
        not hold its actors, the other kept actors are ended (those of the other data path, of other sizes);
        when even that is not enough, all of them."""
        if not ActorPool.enabled or self.where != "existing":
            return
        if self.collective:
            ours = {pool_key("CollectiveWorker", self._rank_options())}
        else:
            ours = {pool_key("Worker", self._worker_options()), pool_key("GroupServer", self._server_options())}
        ours.add(pool_key("Evaluator", EVALUATOR_OPTIONS))
        needed = self._cpus_needed()
        if ray.available_resources().get("CPU", 0.0) + ActorPool.cpus_held(ours.__contains__) < needed - 1e-9:
            ActorPool.clear(lambda key: key not in ours)
            if ray.available_resources().get("CPU", 0.0) < needed - 1e-9:  # more kept than this run takes
                ActorPool.clear()

    def _limit_group_servers(self) -> None:
        """GSSP splits into at most as many group servers as the Ray cluster has CPUs for.

        The servers a split needs beyond the predicted spares start then, outside
        the reservation; with no CPUs left for them the split would wait forever
        for a process Ray cannot place (a uniform cluster with a slow spell, or
        real hardware, where nothing predicts the groups). So the policy is told
        how many fit now (a cluster that grows later is not counted).
        """
        b = self.cfg.backend
        if self.gssp is None or self.collective or b.cpus_per_server <= 0:
            return
        free = max(0.0, ray.cluster_resources().get("CPU", 0.0) - self._cpus_needed())
        servers = 1 + self._predicted_spares() + int(free / b.cpus_per_server + 1e-9)
        if servers < self.gssp.max_groups:
            self.gssp.limit_groups(servers)
            self.recorder.event("group_servers_limited", t=0.0, servers=servers, cpus_free=round(free, 3),
                                cpus_per_server=b.cpus_per_server)
            self._status(f"GSSP: CPUs for at most {servers} group server(s) ({free:g} free, "
                         f"backend.cpus_per_server = {b.cpus_per_server:g}); groups are capped to that")

    def _predicted_spares(self) -> int:
        """Extra GSSP group servers to start early, so the split does not wait for processes to start."""
        if self.gssp is None:
            return 0
        s = self.gssp.options
        if isinstance(s.groups, int):
            return min(s.groups, self.n) - 1
        if not self.cfg.cluster.emulate:
            return 0
        times = [self.profile.compute_s * speed for speed in self.speeds]
        return len(choose_groups(times, s.groups, s.group_threshold, s.max_groups, s.split_ratio)) - 1

    def _server_args(self, index: int) -> tuple[Any, ...]:
        """What a group server for group ``index`` is built from (GroupServer.__init__)."""
        c, b = self.cfg.cluster, self.cfg.backend
        peer_link = Link(c.latency_ms / 1e3, c.server_gbps * 1e9, c.emulate)
        return (index, self.strategy.server_optimizer, self._weight(), self.cfg.sync.gssp.exchange_every, peer_link,
                actor_threads(b.cpus_per_server), self.strategy.outer_step,
                self.strategy.balancer(c.total_workers), self.cfg.sync.balance, self.cfg.balance.deadline)

    def _server_options(self) -> dict[str, Any]:
        return {"num_cpus": self.cfg.backend.cpus_per_server, "max_concurrency": 10_000}

    def _worker_options(self) -> dict[str, Any]:
        b = self.cfg.backend
        return {"num_cpus": b.cpus_per_worker, "num_gpus": b.gpus_per_worker, "max_concurrency": 1000}

    def _rank_options(self) -> dict[str, Any]:
        """An all-reduce rank's (CollectiveWorker)."""
        b = self.cfg.backend
        return {"num_cpus": b.cpus_per_worker, "num_gpus": b.gpus_per_worker, "max_concurrency": 32}

    def _server_actor(self, index: int) -> Any:
        return self._actor(GroupServer, self._server_options(), self._server_args(index), "server")

    def _worker_actor(self, w: int) -> Any:
        data = self._shards[w % self.n]  # a joiner trains on a copy of the shard of worker (id mod workers)
        args = (w, self.cfg, data, self.setup.dataset.num_classes, self.speeds[w], self.profile.compute_s,
                self.setup.download_bytes, self._density(w))
        return self._actor(Worker, self._worker_options(), args, "worker")

    def _placed(self, cls: type, options: dict[str, Any], args: tuple[Any, ...], kind: str) -> Any:
        """A new actor, in a free reserved bundle of ``kind`` if there is one (ray_placement)."""
        extra, index = self.reservation.take(kind) if self.reservation is not None else ({}, None)
        handle = ray.remote(cls).options(**options, **extra).remote(*args)
        if index is not None:
            self.reservation.bind(handle._actor_id, kind, index)
        return handle

    def _free_bundle(self, handle: Any) -> None:
        """``handle``'s actor is gone or being ended: its bundle is free for its replacement."""
        if self.reservation is not None:
            self.reservation.free(handle._actor_id)

    def _reserve(self) -> None:
        """Reserve every worker and server the run starts with, as one placement group (ray_placement).

        Skipped when actors are kept between runs (ActorPool): a kept actor
        would outlive its run's placement group.
        """
        if ActorPool.enabled and self.where == "existing":
            return
        b = self.cfg.backend
        servers = 0 if self.collective else 1 + self._predicted_spares() + b.standby_servers
        actors = {"worker": (self.n, bundle(b.cpus_per_worker, b.gpus_per_worker)),
                  "server": (servers, bundle(b.cpus_per_server))}
        self._status(f"reserving {self.n + servers} actors")
        where = f"the Ray cluster at {b.address!r}" if b.address else "the local Ray instance"
        self.reservation = reserve(actors, CLUSTER_GROW_S if b.address else LOCAL_PLACE_S, where)

    def _actor(self, cls: type, options: dict[str, Any], args: tuple[Any, ...], kind: str) -> Any:
        """A new actor (in a reserved bundle of ``kind`` if free), or a kept one re-initialised (ActorPool)."""
        key = pool_key(cls.__name__, options)
        handle = ActorPool.take(key) if self.where == "existing" else None
        if handle is not None:  # waited for: an async actor may run later calls before an earlier one
            try:
                ray.get(handle.reinit.remote(*args))
            except BaseException:  # refused (say, other data than the driver's): ended, or it would hold its CPUs
                ray.kill(handle, no_restart=True)
                raise
        else:
            handle = self._placed(cls, options, args, kind)
        self._keys[handle._actor_id] = key
        return handle

    def _put_shards(self) -> None:
        """What each worker gets its shard from: a reference it loads itself, or the shard (ray_data)."""
        ds = self.setup.dataset
        self._shards = []
        for stream in self.setup.streams:
            if self.cfg.backend.data_loading == "workers":
                self._shards.append(shard_ref(ds, stream.shard))
                continue
            idx = torch.as_tensor(stream.shard)  # one object, passed as a whole argument: Ray resolves it
            self._shards.append(ray.put((ds.x_train[idx].numpy(), ds.y_train[idx].numpy())))

    def _check_resources(self) -> None:
        total = ray.cluster_resources()
        gpus = self.cfg.backend.gpus_per_worker * self.n
        if gpus > 0 and total.get("GPU", 0.0) < gpus:
            raise ConfigError(f"backend.gpus_per_worker: {self.n} workers need {gpus:g} GPUs, "
                              f"the Ray cluster has {total.get('GPU', 0.0):g}")
        cpus = self._cpus_needed()
        if not self.cfg.backend.address:
            if total.get("CPU", 0.0) < cpus - 1e-9:
                raise ConfigError(f"backend.cpus_per_worker / cpus_per_server: the actors request {cpus:g} CPUs, "
                                  f"this Ray instance has {total.get('CPU', 0.0):g}; request fractions of a CPU")
            return
        self._status(f"waiting for {cpus:g} CPUs on the Ray cluster")
        have = wait_for_cpus(cpus, lambda: ray.cluster_resources().get("CPU", 0.0), CLUSTER_GROW_S)
        if have < cpus - 1e-9:  # a joined cluster may autoscale: it had CLUSTER_GROW_S to grow
            raise ConfigError(f"backend.address {self.cfg.backend.address!r}: the actors request {cpus:g} CPUs, the "
                              f"Ray cluster has {have:g} after {CLUSTER_GROW_S:.0f} s; add nodes or request fractions "
                              f"of a CPU (backend.cpus_per_worker, cpus_per_server)")

    def _start(self) -> None:
        """Create the actors (from the initial state or a checkpoint) and wait until all are ready."""
        self._check_resources()
        self._make_room()
        self._limit_group_servers()
        self._reserve()
        self._put_shards()
        self._start_evaluator()
        if self.collective:
            self._start_collective()
            return
        resumed = self._load_resume() if self.resume is not None else None
        policies = self._initial_policies(resumed)
        self.servers = [self._server_actor(i) for i in range(len(policies))]
        if self.gssp is not None and not self.gssp.grouped:
            self.spares = [self._server_actor(i + 1) for i in range(self._predicted_spares())]
        self.standby = [self._server_actor(-1) for _ in range(self.cfg.backend.standby_servers)]
        for w in range(self.n):
            self.workers[w] = self._worker_actor(w)
        self._install_servers(policies, resumed)
        if resumed is not None:
            self._seek_streams(resumed.get("positions") or {}, resumed.get("folder"))
        if self.plan is not None:
            self._start_switches()
        self._wait_ready(self.servers + self.spares + self.standby + list(self.switches.values()) + [self.evaluator])
        self.t0 = time.time() - self.offset
        ray.get([s.set_peers.remote(self.servers, self.t0) for s in self.servers])
        for w in range(self.n):
            self._launch(w)
        self.started = True

    def _start_evaluator(self) -> None:
        """The actor that runs the periodic evaluations (no CPU reserved: it works only now and then)."""
        ds = self.setup.dataset
        args = (self.cfg, ray.put(ds.x_test.numpy()), ray.put(ds.y_test.numpy()), ds.num_classes, ds.input_shape)
        self.evaluator = self._actor(Evaluator, EVALUATOR_OPTIONS, args, "evaluator")

    def _wait_ready(self, others: list[Any]) -> None:
        """Every worker and ``others`` answered a ping (workers report their pid and device)."""
        pings = {self.workers[w].ping.remote(): w for w in range(self.n)}
        pings |= {s.ping.remote(): -1 for s in others}
        pending, deadline = list(pings), time.monotonic() + STARTUP_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            self._status(f"starting actors: {len(pings) - len(pending)}/{len(pings)} ready")
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for ref in ready:
                info = started(ref)
                if pings[ref] >= 0:
                    self.pids[pings[ref]], self.devices[pings[ref]] = info["pid"], info["device"]
        if pending:
            raise RuntimeError(f"{len(pending)} Ray actors were not placed within {STARTUP_TIMEOUT_S:.0f} s "
                               f"(resources: {ray.available_resources()})")

    def _status(self, text: str) -> None:
        """What start-up is doing, for the progress display."""
        if self.progress is not None:  # a full tick, so callbacks that read t and iterations keep working
            self.progress({"t": self.offset, "iterations": self.recorder.iterations, "accuracy": None,
                           "status": text})

    def _start_switches(self) -> None:
        """One switch actor per aggregation switch of the plan; every worker learns its node, the server the workers."""
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
        return [self.strategy.policy(range(self.n))]

    def _live_policy(self, members: list[int]) -> SyncPolicy:
        """The policy a (group) server runs over its members still alive: the strategy's (a GSSP group's own)."""
        members = members or [0]
        policy = self.gssp.group_policy(members) if self.gssp is not None else self.strategy.policy(members)
        starting = set(self._starting.values())  # admitted once they answer (at the slowest clock then)
        for w in list(policy.clocks):
            if w not in members or w in self.dead or w in self.departed or w in starting:
                policy.remove(w)
        return policy

    def _install_servers(self, policies: list[SyncPolicy], resumed: dict[str, Any] | None) -> None:
        track_own = self.gssp is not None
        if resumed is None:
            params, buffers = self.setup.engine.initial_state()
            ray.get(self.servers[0].install.remote(policies[0], params.numpy(), buffers.numpy(), track_own, self.epoch))
        else:
            folder = str(resumed["folder"])
            ray.get([s.restore.remote(policies[g], folder, f"group-{g}", self.epoch) for g, s in enumerate(self.servers)])
        schedule = self.strategy.aggregation_schedule()  # built exactly as the sim builds it
        if schedule is not None:  # SIM periods are not checkpointed: a resume starts them again
            ray.get([s.set_similarity.remote(schedule.restarted(keep_bytes=g == 0), self._slices(),
                                             self.strategy.broadcast_codec(g)) for g, s in enumerate(self.servers)])

    def _slices(self) -> list[tuple[int, int]]:
        return [(s.start, s.stop) for s in self.strategy.slices]

    def _launch(self, w: int) -> None:
        """Start ``w``'s loop on its current route."""
        self.alive.add(w)
        server = self.server_of(w)
        if self.strategy.local_models and self.lr != self.cfg.optimizer.lr_at(0.0):
            self.workers[w].set_lr.remote(self.lr)  # a restarted worker's local optimizer follows the decay
        self._run_refs[self.workers[w].run.remote(self.t0, self.epoch, server, self.servers[server])] = w
