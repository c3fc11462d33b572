"""The `ray` backend's group server actor (a plain class, made a Ray actor by ray/driver.py).

An asyncio actor. It gates its workers with the pure sync policy it holds: a
worker that may not start yet awaits a future keyed by the slowest clock it
needs (a heap, as in the simulator), so an SSP gate or a BSP barrier costs
no polling. It applies pushes to its replica, runs SIM's schedule, and under
GSSP exchanges its own delta with its peers (compressed, emulated at both
ends). With in-network aggregation (``[network] aggregation = "ina"``, BSP
only) it receives fragments and switch sums (``ray_switch``) and applies the
sum the data plane assembled when the barrier releases a round.

Membership changes (GSSP split or regroup, a failed worker) are decided by
the driver. A server answers a worker it no longer serves with MOVED and its
membership epoch; the worker then waits for a route of a newer epoch, which
the driver sends only after every server has the new membership, so a
worker never gates on a server that does not know it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.backends import checkpoint
from shoal.backends.local_model import pull_bytes
from shoal.backends.ray.server_exchange import GroupExchange
from shoal.backends.ray.switch import ServerSide
from shoal.backends.ray.wire import MOVED, OK, STOP, Link, as_tensor, pack, quiet_readonly_numpy, unpack
from shoal.backends.work import sample_weights
from shoal.compress import GradientCodec
from shoal.compress.similarity import SimilarityMeter, SimilaritySchedule
from shoal.config import OptimizerConfig
from shoal.engine.replica import Replica, masked_slices
from shoal.sync import PeriodicSchedule, SyncPolicy
from shoal.sync.balance import WorkBalancer
from shoal.sync.policies import PacedSSP


#: asynchronous outer steps on ray: pushes arriving within this many seconds of each other make one outer step
FLUSH_WINDOW_S = 0.005


class GroupServer(GroupExchange):
    """One (group) server: replica, sync policy, buffered pushes, gate futures, delta exchange."""

    def __init__(self, index: int, opt: OptimizerConfig, weight: float, exchange_every: int, peer_link: Link,
                 torch_threads: int = 1, outer: tuple[float, float] | None = None,
                 balancer: WorkBalancer | None = None, balance: str = "none", deadline: float = 1.0) -> None:
        """``balancer``: this server's own copy (it profiles and sizes its members) for ``balance`` (sync.balance:
        "batch", "steps" or "deadline", whose factor is ``deadline``)."""
        quiet_readonly_numpy()
        torch.set_num_threads(torch_threads)
        self.index, self.opt, self.weight, self.exchange_every = index, opt, weight, exchange_every
        self.outer = outer  # DiLoCo's outer step (lr, momentum) on the averaged local changes
        self.balancer, self.balance, self.deadline = balancer, balance, deadline
        self._samples: dict[int, int] = {}  # sync.balance = "deadline": how many samples each pending gradient holds
        self.peer_link, self.t0 = peer_link, 0.0
        self.policy: SyncPolicy | None = None
        self.replica: Replica | None = None
        self.epoch = 0
        self.version = 0
        self.updates = 0
        self.exchanges = 0
        self.bytes_exchange = 0
        self.stopping = False
        self.peers: list[Any] = []
        self._since_exchange = 0
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._events: list[dict[str, Any]] = []
        self.ina: ServerSide | None = None
        # SIM (compression.similarity): the schedule, the tensor slices, per-clock meters, workers to re-send in full
        self.schedule: SimilaritySchedule | None = None
        self.broadcast: GradientCodec | None = None  # quantised model changes sent back (Streaming DiLoCo)
        self.slices: list[slice] = []
        self._meters: dict[int, SimilarityMeter] = {}
        self.force_pull: set[int] = set()
        self.exchange_codec: GradientCodec | None = None  # GSSP: compresses the own-delta exchange
        self.exchange_density = 1.0
        self.unsent_updates = 0  # own updates not yet sent: a delta counts them into the receivers' versions
        self._sending: set[asyncio.Task[None]] = set()
        self._flushing: asyncio.Task[None] | None = None  # a flushing policy's pending end of the moment
        self._base_version: dict[int, int] = {}  # the version each worker's local model last synchronised at
        self._warm_up()

    def _warm_up(self) -> None:
        """Build a throwaway replica: torch's first optimizer costs seconds of lazy imports, paid here, not mid-run."""
        replica = Replica(torch.zeros(4), torch.zeros(0), self.opt, track_own=True)
        replica.apply([torch.ones(4)], 1.0)

    # -- set-up and membership (called by the driver) -----------------------------

    def install(self, policy: SyncPolicy, params: np.ndarray, buffers: np.ndarray, track_own: bool, epoch: int) -> None:
        """Start serving ``policy``'s workers from the given state (fresh optimizer)."""
        self.replica = Replica(as_tensor(params), as_tensor(buffers), self.opt, track_own=track_own, outer=self.outer)
        self._reset(policy, epoch)

    def restore(self, policy: SyncPolicy, folder: str, name: str, epoch: int) -> dict[str, Any]:
        """Start serving from a checkpoint (replica and optimizer state)."""
        self.replica, manifest = checkpoint.load_replica(Path(folder), name, self.opt, self.outer)
        self.updates, self.exchanges = int(manifest.get("updates", 0)), int(manifest.get("exchanges", 0))
        self.bytes_exchange = int(manifest.get("bytes_exchange", 0))
        self._reset(policy, epoch)
        return {"version": self.replica.version}

    def split(self, policy: SyncPolicy, epoch: int) -> tuple[np.ndarray, np.ndarray, SimilaritySchedule | None]:
        """GSSP: become group 0's server from a copy of this replica; return the state for the other groups.

        With SIM, every group server restarts the schedule's clocks; only group 0 keeps the bytes saved so far.
        """
        assert self.replica is not None
        self.replica = self.replica.clone(self.opt)
        others = None
        if self.schedule is not None:
            others = self.schedule.restarted(keep_bytes=False)
            self.schedule = self.schedule.restarted(keep_bytes=True)
        self._reset(policy, epoch)
        return (*self.state(), others)

    def set_similarity(self, schedule: SimilaritySchedule | PeriodicSchedule | None,
                       slices: list[tuple[int, int]], broadcast: GradientCodec | None = None) -> None:
        """SIM, local SGD, DiLoCo: the schedule this server runs and the tensors' (start, stop) in the flat vector;
        ``broadcast``: the codec of the model changes sent back (quantised Streaming DiLoCo), else dense values."""
        self.schedule = schedule
        self.broadcast = broadcast
        if isinstance(schedule, PeriodicSchedule) and self.policy is not None:
            schedule.follow(self.policy)
        self.slices = [slice(a, b) for a, b in slices]
        self._meters.clear()
        self.force_pull = set(self.policy.clocks) if self.policy is not None else set()

    def _reset(self, policy: SyncPolicy, epoch: int) -> None:
        self.policy, self.epoch = policy, epoch
        self._pending.clear()
        self._samples.clear()
        self._meters.clear()
        self.force_pull = set(policy.clocks)  # SIM: a worker new to this replica takes all of it
        self._since_exchange = 0
        self.unsent_updates = 0
        self._wake_all()

    def set_peers(self, peers: list[Any], t0: float) -> None:
        """The group servers (the own entry is skipped when sending) and the run's time origin."""
        self.peers, self.t0 = peers, t0

    def add_worker(self, worker: int, epoch: int) -> None:
        assert self.policy is not None
        if worker not in self.policy.clocks:
            self.policy.add(worker)
        self.force_pull.add(worker)  # SIM: a moved or restarted worker takes this group's full replica
        self.epoch = epoch

    def remove_worker(self, worker: int, epoch: int) -> None:
        """Forget ``worker`` (moved or failed); apply any update it was holding back."""
        assert self.policy is not None
        self.epoch = epoch
        if worker in self.policy.clocks:
            batch = self.policy.remove(worker)
            self._pending.pop(worker, None)
            self._samples.pop(worker, None)
            if batch:
                self._apply(batch)
            self._finish_measurements()
        self._wake_all()

    def ina_setup(self, workers: dict[str, Any], n_values: int, fragment_size: int, run_id: str) -> None:
        """In-network aggregation: receive gradients as fragments and sums (worker name -> handle, for acks)."""
        self.ina = ServerSide(workers, n_values, fragment_size, run_id)

    async def receive(self, messages: list[Any]) -> None:
        """Fragments (from the own workers, or switch fallbacks) and switch sums; acks go to the workers."""
        if self.ina is None:
            raise RuntimeError("this group server does not run in-network aggregation")
        self.ina.receive(messages)

    def set_weight(self, weight: float) -> None:
        """Each gradient's weight, 1/N of the workers taking part (it changes when workers join or leave)."""
        self.weight = weight

    def set_lr(self, lr: float, restart: bool = True) -> None:
        """A new learning rate; at a decay (``restart``) SIM restarts its periods, at a warm-up stair it goes on."""
        assert self.replica is not None
        self.replica.set_lr(lr)
        if self.schedule is not None and restart:
            self.schedule.reset()

    def set_update_share(self, share: float | None, density: float, exchange_every: int,
                         paces: dict[int, float] | None = None) -> None:
        """GSSP: the share of all updates this server decays its momentum on (GSSP.momentum_shares, then
        Replica.set_update_share; None: the paper's own momentum), the density its exchange is compressed at,
        its own updates between sends (GSSP.exchange_periods) and its members' paces (GSSP.paces, for a paced
        SSP)."""
        if self.replica is not None and share is not None:
            self.replica.set_update_share(share)
        self.exchange_density = density
        self.exchange_every = exchange_every
        if paces and isinstance(self.policy, PacedSSP):
            self.policy.set_paces(paces)  # future pushes only: no threshold moves, nobody to wake

    def set_transient(self, worker: int, straggling: bool) -> None:
        """GSSP: stop waiting for a transient straggler (True), or count it again (False)."""
        if self.policy is not None and worker in self.policy.clocks:
            self.policy.excuse(worker) if straggling else self.policy.readmit(worker)
            self._wake()

    def set_exchange_codec(self, codec: GradientCodec | None) -> None:
        """GSSP: the compressor (with its sender-side error feedback) of this server's own-delta exchange."""
        self.exchange_codec = codec

    async def flush_exchange(self) -> None:
        """Send what the own delta still holds (this group merged into others and has no members left)."""
        if self.replica is not None and self.replica.own_params is not None and len(self.peers) > 1:
            self._exchange()

    def stop(self) -> None:
        """Refuse further work and release every gated worker."""
        self.stopping = True
        self._wake_all()

    # -- the worker protocol ---------------------------------------------------------

    async def pull(self, worker: int) -> dict[str, Any]:
        """Wait at the gate, then hand out the current parameters (or STOP / MOVED)."""
        start = time.perf_counter()
        status = await self._gate(worker)
        waited = time.perf_counter() - start
        if status != OK:
            return {"status": status, "epoch": self.epoch, "wait_s": waited}
        params, buffers = self.state()
        work = self._work(worker)
        if self.schedule is not None:
            return {"status": OK, **self._sim_pull(worker, params), "buffers": buffers, "version": self.version,
                    "wait_s": waited, **work}
        return {"status": OK, "params": params, "buffers": buffers, "version": self.version, "wait_s": waited, **work}

    def _work(self, worker: int) -> dict[str, Any]:
        """sync.balance: the worker's batch size ("batch") or local steps ("steps") this iteration and its
        change's weight in the round, or the round's compute deadline in seconds ("deadline")."""
        if self.balancer is None or self.policy is None:
            return {}
        if self.balance == "deadline":
            return {"deadline": self.balancer.deadline(self.policy.workers, self.deadline)}
        return {self.balance: self.balancer.size(worker), "scale": self.balancer.scale(worker, self.policy.workers)}

    def _sim_pull(self, worker: int, params: np.ndarray) -> dict[str, Any]:
        """SIM: the plan of the worker's clock, and only the tensors aggregated at its previous clock (all of
        them for a worker new to this replica), as in the sim backend's pull."""
        assert self.schedule is not None and self.policy is not None and self.replica is not None
        clock = self.policy.clocks[worker]
        plan = self.schedule.plan(clock)
        changed = clock > 0 and worker not in self.force_pull  # the fresh tensors moved by a sync since the last pull
        fresh = (True,) * len(plan) if worker in self.force_pull else self.schedule.fresh(clock)
        self.force_pull.discard(worker)
        if any(fresh):  # what a change sent later is measured from (its staleness counts the updates since)
            self._base_version[worker] = self.version
        self.schedule.record_saved(fresh)  # download
        self.schedule.record_saved(plan)  # upload
        values = pack(self.replica.params.detach(), fresh, self.slices)
        periodic = self.schedule.periodic  # local SGD: batch-norm buffers travel only with a sync
        buffer_values = 0 if periodic and not any(fresh) else self.replica.buffers.numel()
        nbytes = pull_bytes(values.size, buffer_values, fresh, self.broadcast, changed)
        return {"params": values, "fresh": fresh, "plan": plan, "clock": clock, "periodic": periodic,
                "nbytes": nbytes, "changed": changed}

    async def push(self, worker: int, pulled_version: int | None, grad: np.ndarray | None,
                   buffer_delta: np.ndarray, sim: dict[str, Any] | None = None, then_pull: bool = False,
                   work: tuple[float, int] | None = None, loss: float | None = None) -> dict[str, Any]:
        """Take a gradient (None: it came through the data plane); apply what the policy releases; send the own
        delta when due (GSSP). With SIM, ``grad`` holds the packed gradient tensors and ``sim`` the packed local
        changes, both masks and the SIM clock. ``then_pull``: also wait at the gate for the worker's next
        iteration and hand out the parameters under ``"next"`` (as ``pull`` does), in the same call. ``work``:
        (compute seconds, units: samples or local steps) of the iteration, which sync.balance profiles."""
        if self.stopping:
            return {"status": STOP}
        assert self.policy is not None
        if worker not in self.policy.clocks:
            return {"status": MOVED, "epoch": self.epoch}
        staleness = None if pulled_version is None else self.version - pulled_version
        if sim is not None and self.schedule is not None:
            size = self.replica.params.numel()
            grad_t = unpack(grad, sim["grad_mask"], self.slices, size)
            delta = unpack(sim["delta"], sim["delta_mask"], self.slices, size)
            sim = {**sim, "delta": delta}
        else:
            grad_t, sim = None if grad is None else as_tensor(grad), None
        if self.policy.flushes:  # a late change counts for less (asynchronous outer steps)
            discount = self.policy.discount(self.version - self._base_version.get(worker, 0))
            if discount != 1.0 and sim is not None:
                grad_t = None if grad_t is None else grad_t * discount
                sim = {**sim, "delta": sim["delta"] * discount}
        self._pending[worker] = (grad_t, as_tensor(buffer_delta), sim)
        if self.balance == "deadline" and work is not None:
            self._samples[worker] = work[1]
        self.policy.observe(worker, loss)  # the training loss adaptive periods follow
        batch = self.policy.on_push(worker)
        if batch:
            self._apply(batch)
        if self.policy.flushes and self._flushing is None:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())
        if self.balancer is not None and work is not None:
            self._balance(worker, bool(batch), *work)
        self._finish_measurements()
        clock = self.policy.clocks[worker]
        self._wake()
        if batch and self._exchange_due():
            self._exchange()
        reply = {"status": OK, "clock": clock, "staleness": staleness}
        if then_pull:
            reply["next"] = await self.pull(worker)
        return reply

    async def _flush(self) -> None:
        """The end of the moment for a flushing policy: the pushes that arrived within FLUSH_WINDOW_S of the
        first form one update (processes never arrive at the same instant, as simulated workers do)."""
        await asyncio.sleep(FLUSH_WINDOW_S)
        self._flushing = None
        if self.policy is None or self.stopping:
            return
        batch = self.policy.flush()
        if batch:
            self._apply(batch)
            self._wake()

    def _balance(self, worker: int, applied: bool, compute_s: float, units: int) -> None:
        """Profile the worker's seconds per unit of work; at the end of a round, resize the members if that pays
        (a deadline round resizes nothing: its deadline follows the profiles, which only whole batches feed)."""
        assert self.balancer is not None and self.policy is not None
        if self.balance == "deadline":
            if units == self.balancer.per_worker:  # a cut-off batch tells only how slow it was at least
                self.balancer.observe(worker, compute_s, units)
            return
        self.balancer.observe(worker, compute_s, units)
        members = self.policy.workers
        if applied and self.balancer.rebalance(members):
            self._events.append({"event": "balance", "t": round(time.time() - self.t0, 6), "group": self.index,
                                 "sizes": {str(m): self.balancer.size(m) for m in members}})

    async def _gate(self, worker: int) -> str:
        loop = asyncio.get_running_loop()
        while True:
            if self.stopping:
                return STOP
            if self.policy is None or worker not in self.policy.clocks:
                return MOVED
            threshold = self.policy.start_threshold(worker)
            if threshold is None or self.policy.progress >= threshold:
                return OK
            future: asyncio.Future[None] = loop.create_future()
            heapq.heappush(self._waiters, (threshold, next(self._seq), future))
            await future

    def _wake(self) -> None:
        assert self.policy is not None
        while self._waiters and self._waiters[0][0] <= self.policy.progress:
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_result(None)

    def _wake_all(self) -> None:
        """Every gated worker re-checks its gate (membership changed, or stopping)."""
        while self._waiters:
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_result(None)

    def _apply(self, batch: tuple[int, ...]) -> None:
        assert self.replica is not None
        samples = [self._samples.pop(w, None) for w in batch if w in self._pending]
        pushes = [self._pending.pop(w) for w in batch if w in self._pending]
        if not pushes:
            return
        weights = sample_weights(samples)
        if weights is not None:  # a deadline round: the mean over the samples done in time (none at all: no step)
            pushes = [(g * weight, b, s) for (g, b, s), weight in zip(pushes, weights)]
        if pushes and not self._step(pushes):
            return
        self.version += 1
        self.updates += 1
        self.unsent_updates += 1
        self.replica.add_buffer_deltas([b for _, b, _ in pushes], self.weight)

    def _step(self, pushes: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any] | None]]) -> bool:
        """One step on the round's pushes; False: the data plane's sum of the round came incomplete (no step)."""
        assert self.replica is not None
        if self.ina is not None:
            return self._apply_aggregated(len(pushes))
        if self.schedule is not None and all(s is not None for _, _, s in pushes):
            self._apply_sim(pushes)  # type: ignore[arg-type]
        else:
            self.replica.apply([g for g, _, _ in pushes], self.weight)
        return True

    def _apply_sim(self, pushes: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]) -> None:
        """SIM (as SimServer._apply_sim): one step on the gradient tensors, average in the local changes,
        measure similarity."""
        assert self.replica is not None
        by_masks: dict[tuple, list[tuple[torch.Tensor, dict[str, Any]]]] = {}
        for grad, _, sim in pushes:  # a round shares its masks; they differ only right after a GSSP move
            by_masks.setdefault((sim["grad_mask"], sim["delta_mask"]), []).append((grad, sim["delta"]))
        clock = pushes[0][2]["clock"]
        for (grad_mask, delta_mask), same in by_masks.items():
            if any(grad_mask):
                frozen = [sl for sl, g in zip(self.slices, grad_mask) if not g]
                self.replica.apply([g for g, _ in same], self.weight, frozen=frozen)
            if any(delta_mask):
                made = self.replica.add_delta([d for _, d in same], self.weight, masked_slices(self.slices, delta_mask))
                if self.broadcast is not None:  # the workers receive the change quantised: hold what they hold
                    self.replica.correct(made, self.broadcast.encode(made, 1.0, delta_mask)[0])
                if self.schedule.periodic:
                    self.schedule.on_round(clock, [d for _, d in same], self.slices)
        if self.schedule.periodic:
            return
        for grad, _, sim in pushes:
            if not self.schedule.wants(sim["clock"]):
                continue
            meter = self._meters.setdefault(sim["clock"], SimilarityMeter())
            for i, sl in enumerate(self.slices):
                if sim["grad_mask"][i]:
                    meter.add(i, grad[sl])
                elif sim["delta_mask"][i]:
                    meter.add(i, sim["delta"][sl])

    def _finish_measurements(self) -> None:
        """SIM: feed the schedule every clock all members have pushed; a `sim` event per such clock."""
        if self.schedule is None or self.policy is None:
            return
        for clock in self.schedule.finish_clocks(self._meters, self.policy.min_clock):
            self._events.append({"event": "sim", "t": round(time.time() - self.t0, 6), "group": self.index,
                                 "clock": clock, **self.schedule.state()})

    def _apply_aggregated(self, count: int) -> bool:
        """The data plane's sum of this round (every worker pulled ``version``), as BSP applies ``count`` gradients.

        ``Replica.apply(grads, weight)`` steps on ``weight * sum(grads)`` and decays by ``weight * len(grads)``:
        one gradient ``sum / count`` at weight ``self.weight * count`` gives the same step and the same decay.
        """
        assert self.ina is not None and self.replica is not None
        total = self.ina.take(self.version)
        if total is None:  # a worker left mid-round (failure): its contribution never came
            self._events.append({"event": "ina_incomplete", "t": round(time.time() - self.t0, 6),
                                 "round": self.version, "missing": len(self.ina.server.missing(self.version))})
            return False
        grad = torch.from_numpy(total).to(self.replica.params.dtype).div_(count)
        self.replica.apply([grad], self.weight * count)
        return True

    # -- what the driver reads -------------------------------------------------------

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.replica is not None
        params, buffers = self.replica.snapshot()
        return params.numpy(), buffers.numpy()

    def shared_state(self) -> tuple[np.ndarray, np.ndarray]:
        """The replica without its unsent own delta (``Replica.shared_snapshot``): a dead peer's new start."""
        assert self.replica is not None
        params, buffers = self.replica.shared_snapshot()
        return params.numpy(), buffers.numpy()

    def drain(self) -> dict[str, Any]:
        """Events since the last call, and the counters."""
        events, self._events = self._events, []
        return {"events": events, "updates": self.updates, "exchanges": self.exchanges,
                "bytes_exchange": self.bytes_exchange, "version": self.version,
                **({"similarity": self.schedule.state()} if self.schedule is not None else {}),
                **({"dataplane": self.ina.counters()} if self.ina is not None else {})}

    def save(self, folder: str) -> dict[str, Any]:
        """Checkpoint the replica and optimizer into ``folder`` (safetensors + JSON manifest)."""
        assert self.replica is not None
        meta = {"group": self.index, "updates": self.updates, "exchanges": self.exchanges,
                "bytes_exchange": self.bytes_exchange}
        return checkpoint.save_replica(Path(folder), f"group-{self.index}", self.replica, meta)

    def ping(self) -> int:
        return os.getpid()

    def reinit(self, *args: Any) -> None:
        """Serve a new run from this process (actor reuse: skips process start and torch import)."""
        self.__init__(*args)  # type: ignore[misc]
