"""The processes of the `ray` backend: group servers and workers (plain classes, made Ray actors by ray.py).

Both are asyncio actors. A group server gates its workers with the pure
sync policy it holds: a worker that may not start yet awaits a future keyed
by the slowest clock it needs (a heap, as in the simulator), so an SSP gate
or a BSP barrier costs no polling. A worker runs one loop: pull (gated),
compute a real gradient on exactly what it pulled, pad to the emulated
compute and link times, push. Parameters and gradients travel as numpy
arrays through Ray's object store.

With in-network aggregation (``[network] aggregation = "ina"``, BSP only)
a worker's push carries no gradient: before it, the worker sends the
gradient as fragments to its aggregation node (a switch actor or the
server, ``ray_switch``) and waits until the server has acknowledged every
fragment; when the barrier releases the round, the server applies the sum
the data plane assembled.

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
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shoal.backends import checkpoint
from shoal.backends.local_model import LocalModel, uses_local_models
from shoal.backends.ray_switch import ServerSide, WorkerSide
from shoal.cluster import StragglerModel
from shoal.compress import GradientCodec
from shoal.compress.codec import DELTA_SALT, worker_codec
from shoal.compress.similarity import SimilarityMeter, SimilaritySchedule
from shoal.config import Config, OptimizerConfig
from shoal.data import BatchStream, Dataset
from shoal.engine.setup import build_engine
from shoal.engine.replica import Replica
from shoal.sync import PeriodicSchedule, SyncPolicy

STOP, MOVED, OK = "stop", "moved", "ok"


def _quiet_readonly_numpy() -> None:
    # Arrays from the object store are read-only views; they are only ever read here.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array))


def pack(vector: torch.Tensor, mask: tuple[bool, ...], slices: list[slice]) -> np.ndarray:
    """SIM: only the tensors marked in ``mask``, concatenated (what travels instead of the full vector)."""
    parts = [vector[sl] for sl, take in zip(slices, mask) if take]
    return (torch.cat(parts) if parts else vector[:0]).detach().cpu().numpy()


def unpack(values: np.ndarray, mask: tuple[bool, ...], slices: list[slice], size: int) -> torch.Tensor:
    """The inverse of ``pack``: a full-length vector, zero in the tensors not marked."""
    flat = _tensor(values)
    out = torch.zeros(size, dtype=flat.dtype)
    at = 0
    for sl, take in zip(slices, mask):
        if take:
            n = sl.stop - sl.start
            out[sl] = flat[at : at + n]
            at += n
    return out


@dataclass(frozen=True)
class Link:
    """What a transfer should take when emulated: latency + bytes / bandwidth."""

    latency_s: float
    bps: float
    emulate: bool

    def seconds(self, nbytes: float) -> float:
        """Nothing to send (a local step of local SGD) costs nothing, as in the sim's cost model."""
        return self.latency_s + 8.0 * nbytes / self.bps if self.emulate and nbytes else 0.0


class GroupServer:
    """One (group) server: replica, sync policy, buffered pushes, gate futures, delta exchange."""

    def __init__(self, index: int, opt: OptimizerConfig, weight: float, exchange_every: int, peer_link: Link,
                 torch_threads: int = 1, outer: tuple[float, float] | None = None) -> None:
        _quiet_readonly_numpy()
        torch.set_num_threads(torch_threads)
        self.index, self.opt, self.weight, self.exchange_every = index, opt, weight, exchange_every
        self.outer = outer  # DiLoCo's outer step (lr, momentum) on the averaged local changes
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
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._events: list[dict[str, Any]] = []
        self.ina: ServerSide | None = None
        # SIM (compression.similarity): the schedule, the tensor slices, per-clock meters, workers to re-send in full
        self.schedule: SimilaritySchedule | None = None
        self.slices: list[slice] = []
        self._meters: dict[int, SimilarityMeter] = {}
        self.force_pull: set[int] = set()
        self.exchange_codec: GradientCodec | None = None  # GSSP: compresses the own-delta exchange
        self.exchange_density = 1.0
        self.unsent_updates = 0  # own updates not yet sent: a delta counts them into the receivers' versions
        self._sending: set[asyncio.Task[None]] = set()
        self._warm_up()

    def _warm_up(self) -> None:
        """Build a throwaway replica: torch's first optimizer costs seconds of lazy imports, paid here, not mid-run."""
        replica = Replica(torch.zeros(4), torch.zeros(0), self.opt, track_own=True)
        replica.apply([torch.ones(4)], 1.0)

    # -- set-up and membership (called by the driver) -----------------------------

    def install(self, policy: SyncPolicy, params: np.ndarray, buffers: np.ndarray, track_own: bool, epoch: int) -> None:
        """Start serving ``policy``'s workers from the given state (fresh optimizer)."""
        self.replica = Replica(_tensor(params), _tensor(buffers), self.opt, track_own=track_own, outer=self.outer)
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
                       slices: list[tuple[int, int]]) -> None:
        """SIM, local SGD, DiLoCo: the schedule this server runs and the tensors' (start, stop) in the flat vector."""
        self.schedule = schedule
        self.slices = [slice(a, b) for a, b in slices]
        self._meters.clear()
        self.force_pull = set(self.policy.clocks) if self.policy is not None else set()

    def _reset(self, policy: SyncPolicy, epoch: int) -> None:
        self.policy, self.epoch = policy, epoch
        self._pending.clear()
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

    def set_lr(self, lr: float) -> None:
        """A learning-rate decay; SIM restarts its periods."""
        assert self.replica is not None
        self.replica.set_lr(lr)
        if self.schedule is not None:
            self.schedule.reset()

    def set_update_share(self, share: float | None, density: float) -> None:
        """GSSP: this server's fraction of all updates (global momentum, Replica.set_update_share; None: the
        paper's own momentum) and the density its exchange is compressed at."""
        if self.replica is not None and share is not None:
            self.replica.set_update_share(share)
        self.exchange_density = density

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
        if self.schedule is not None:
            return {"status": OK, **self._sim_pull(worker, params), "buffers": buffers, "version": self.version,
                    "wait_s": waited}
        return {"status": OK, "params": params, "buffers": buffers, "version": self.version, "wait_s": waited}

    def _sim_pull(self, worker: int, params: np.ndarray) -> dict[str, Any]:
        """SIM: the plan of the worker's clock, and only the tensors aggregated at its previous clock (all of
        them for a worker new to this replica), as in the sim backend's pull."""
        assert self.schedule is not None and self.policy is not None and self.replica is not None
        clock = self.policy.clocks[worker]
        plan = self.schedule.plan(clock)
        fresh = (True,) * len(plan) if worker in self.force_pull else self.schedule.plan(clock - 1)
        self.force_pull.discard(worker)
        self.schedule.record_saved(fresh)  # download
        self.schedule.record_saved(plan)  # upload
        values = pack(self.replica.params.detach(), fresh, self.slices)
        periodic = self.schedule.periodic  # local SGD: batch-norm buffers travel only with a sync
        buffer_values = 0 if periodic and not any(fresh) else self.replica.buffers.numel()
        return {"params": values, "fresh": fresh, "plan": plan, "clock": clock, "periodic": periodic,
                "nbytes": 4 * (values.size + buffer_values)}

    async def push(self, worker: int, pulled_version: int | None, grad: np.ndarray | None,
                   buffer_delta: np.ndarray, sim: dict[str, Any] | None = None) -> dict[str, Any]:
        """Take a gradient (None: it came through the data plane); apply what the policy releases; send the own
        delta when due (GSSP). With SIM, ``grad`` holds the packed gradient tensors and ``sim`` the packed local
        changes, both masks and the SIM clock."""
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
            grad_t, sim = None if grad is None else _tensor(grad), None
        self._pending[worker] = (grad_t, _tensor(buffer_delta), sim)
        batch = self.policy.on_push(worker)
        if batch:
            self._apply(batch)
        self._finish_measurements()
        clock = self.policy.clocks[worker]
        self._wake()
        if batch and self._exchange_due():
            self._exchange()
        return {"status": OK, "clock": clock, "staleness": staleness}

    async def _gate(self, worker: int) -> str:
        loop = asyncio.get_running_loop()
        while True:
            if self.stopping:
                return STOP
            if self.policy is None or worker not in self.policy.clocks:
                return MOVED
            threshold = self.policy.start_threshold(worker)
            if threshold is None or self.policy.min_clock >= threshold:
                return OK
            future: asyncio.Future[None] = loop.create_future()
            heapq.heappush(self._waiters, (threshold, next(self._seq), future))
            await future

    def _wake(self) -> None:
        assert self.policy is not None
        while self._waiters and self._waiters[0][0] <= self.policy.min_clock:
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
        pushes = [self._pending.pop(w) for w in batch if w in self._pending]
        if not pushes:
            return
        if self.ina is not None:
            if not self._apply_aggregated(len(pushes)):
                return
        elif self.schedule is not None and all(s is not None for _, _, s in pushes):
            self._apply_sim(pushes)
        else:
            self.replica.apply([g for g, _, _ in pushes], self.weight)
        self.version += 1
        self.updates += 1
        self.unsent_updates += 1
        self.replica.add_buffer_deltas([b for _, b, _ in pushes], self.weight)

    def _apply_sim(self, pushes: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]) -> None:
        """SIM (as SimServer._apply_sim): one step on the gradient tensors, average in the local changes,
        measure similarity."""
        assert self.replica is not None
        by_masks: dict[tuple, list[tuple[torch.Tensor, dict[str, Any]]]] = {}
        for grad, _, sim in pushes:  # a round shares its masks; they differ only right after a GSSP move
            by_masks.setdefault((sim["grad_mask"], sim["delta_mask"]), []).append((grad, sim["delta"]))
        for (grad_mask, delta_mask), same in by_masks.items():
            if any(grad_mask):
                frozen = [sl for sl, g in zip(self.slices, grad_mask) if not g]
                self.replica.apply([g for g, _ in same], self.weight, frozen=frozen)
            if any(delta_mask):
                self.replica.add_delta([d for _, d in same], self.weight)
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

    # -- GSSP exchange ---------------------------------------------------------------

    def _exchange_due(self) -> bool:
        if len(self.peers) < 2:
            return False
        self._since_exchange += 1
        if self._since_exchange < self.exchange_every:
            return False
        self._since_exchange = 0
        return True

    def _exchange(self) -> None:
        """Send the own delta to every peer without waiting (fire and forget through the object store).

        Compressed like an upload when a compressor is configured (the residual
        stays here, error feedback); the copies leave through this server's
        emulated egress one after another, then each waits out the peer's ingress.
        """
        assert self.replica is not None
        params, buffers = self.replica.take_own_delta()
        updates, self.unsent_updates = self.unsent_updates, 0
        if self.exchange_codec is not None:
            params, nbytes = self.exchange_codec.encode(params, self.exchange_density)
        else:
            nbytes = 4 * params.numel()
        nbytes += 4 * buffers.numel()
        peers = [p for i, p in enumerate(self.peers) if i != self.index]
        self.exchanges += 1
        self._events.append({"event": "exchange", "t": round(time.time() - self.t0, 6), "group": self.index,
                             "bytes": nbytes * len(peers)})
        task = asyncio.get_running_loop().create_task(
            self._send_delta(peers, params.numpy(), buffers.numpy(), nbytes, updates))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_delta(self, peers: list[Any], params: np.ndarray, buffers: np.ndarray, nbytes: int,
                          updates: int) -> None:
        import ray

        p_ref, b_ref = ray.put(params), ray.put(buffers)
        for peer in peers:
            delay = self.peer_link.seconds(nbytes)  # this copy's turn on the egress
            if delay > 0:
                await asyncio.sleep(delay)
            peer.receive_delta.remote(p_ref, b_ref, nbytes, updates)

    async def receive_delta(self, params: np.ndarray, buffers: np.ndarray, nbytes: int, updates: int = 1) -> None:
        """A peer's own delta of ``updates`` updates: wait out the emulated transfer, then add it (to the replica it
        was sent to). The version counts every update the delta holds, so staleness is in real updates."""
        replica = self.replica
        delay = self.peer_link.seconds(nbytes)
        if delay > 0:
            await asyncio.sleep(delay)
        if self.replica is None or self.replica is not replica or self.stopping:
            return
        self.replica.receive_delta(_tensor(params), _tensor(buffers))
        self.version += updates
        self.bytes_exchange += nbytes

    # -- what the driver reads -------------------------------------------------------

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.replica is not None
        params, buffers = self.replica.snapshot()
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


@dataclass
class Route:
    """Which server a worker uses, and under which membership epoch."""

    epoch: int
    server: int
    handle: Any


class Worker:
    """One data-parallel worker: its shard, model copy, codec and emulated speed."""

    def __init__(self, worker: int, cfg: Config, x: np.ndarray, y: np.ndarray, num_classes: int, speed: float,
                 compute_s: float, download_bytes: int, density: float) -> None:
        _quiet_readonly_numpy()
        torch.set_num_threads(cfg.backend.torch_threads)
        torch.manual_seed(cfg.run.seed)
        self.w, self.cfg, self.speed, self.compute_s = worker, cfg, speed, compute_s
        self.download_bytes, self.density = download_bytes, density
        self.device = self._device(cfg.backend.gpus_per_worker)
        shard = Dataset("shard", torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y)),
                        torch.empty(0), torch.empty(0, dtype=torch.long), num_classes)
        self.engine = build_engine(cfg, shard.input_shape, num_classes)
        self.engine.model.to(self.device)
        # positions within the shard permute exactly like the sim backend's shard indices
        self.stream = BatchStream(shard, np.arange(len(y)), cfg.data.batch_size, cfg.run.seed, worker)
        self.codec = self._codec()
        self.slices = [slice(t.offset, t.offset + t.numel) for t in self.engine.layout]
        self.local: LocalModel | None = None  # SIM: this worker's own model copy and a codec for its changes
        self.delta_codec: GradientCodec | None = None
        if uses_local_models(cfg):
            params, buffers = self.engine.initial_state()
            self.local = LocalModel(params.cpu(), buffers.cpu(), cfg.optimizer, self.engine.layout)
            self.delta_codec = self._codec(salt=DELTA_SALT)
        self.stragglers = StragglerModel(cfg.cluster.stragglers, cfg.cluster.workers, cfg.run.seed)
        c = cfg.cluster
        self.link = Link(c.latency_ms / 1e3, c.link_gbps * 1e9, c.emulate)
        self.route: Route | None = None
        self._route_changed = asyncio.Event()
        self._stopping = False
        self._fail_next = False
        self._records: list[dict[str, Any]] = []
        self._push_estimate = 0.0
        self.push_link = self.link
        self.ina: WorkerSide | None = None
        self.t0 = 0.0
        self._warm_up(shard)

    def _warm_up(self, shard: Dataset) -> None:
        """One throwaway gradient: the first backward pass costs lazy initialisation, paid before the clock starts."""
        params, buffers = self.engine.initial_state()
        batch = min(len(shard.y_train), self.cfg.data.batch_size)
        self.engine.gradient(params, buffers, shard.x_train[:batch].to(self.device), shard.y_train[:batch].to(self.device))

    @staticmethod
    def _device(gpus: float) -> torch.device:
        return torch.device("cuda") if gpus > 0 and torch.cuda.is_available() else torch.device("cpu")

    def _codec(self, salt: int = 0) -> GradientCodec | None:
        opt = self.cfg.optimizer if salt == 0 else None  # gradients (not SIM's local changes) get DGC's momentum
        return worker_codec(self.cfg.compression, self.cfg.run.seed, self.w, self.engine.layout, salt, opt)

    # -- control (called by the driver) -------------------------------------------------

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": str(self.device)}

    def reinit(self, *args: Any) -> None:
        """Serve a new run from this process (its previous loop has ended)."""
        self.__init__(*args)  # type: ignore[misc]

    def set_route(self, epoch: int, server: int, handle: Any) -> None:
        if self.route is None or epoch >= self.route.epoch:
            self.route = Route(epoch, server, handle)
            self._route_changed.set()

    def set_speed(self, speed: float) -> None:
        self.speed = speed

    def set_lr(self, lr: float) -> None:
        """A learning-rate decay: SIM's local optimizer follows the server's."""
        if self.local is not None:
            self.local.set_lr(lr)

    def set_ina(self, name: str, node: str, fan_in: int, fragment_size: int, timeout: float, handle: Any,
                rate_bps: float, run_id: str) -> None:
        """In-network aggregation: push gradients as fragments to ``handle`` (a switch or the server), padded
        to the plan's rate instead of the link's."""
        self.ina = WorkerSide(name, node, fan_in, fragment_size, timeout, handle, run_id)
        c = self.cfg.cluster
        self.push_link = Link(c.latency_ms / 1e3, rate_bps, c.emulate)

    def on_acks(self, acks: list[Any], run_id: str) -> None:
        if self.ina is not None:
            self.ina.on_acks(acks, run_id)

    def ina_counters(self) -> dict[str, int] | None:
        return None if self.ina is None else self.ina.counters()

    def drain(self, density: float) -> list[dict[str, Any]]:
        """Iteration records since the last call; takes the upload density to use from now on."""
        self.density = density
        records, self._records = self._records, []
        return records

    def stop(self) -> None:
        self._stopping = True
        self._route_changed.set()
        if self.ina is not None:
            self.ina.wake()

    def fail_next(self) -> None:
        """Fault injection: the next iteration raises (tests and chaos drills)."""
        self._fail_next = True

    # -- the loop ------------------------------------------------------------------------

    async def run(self, t0: float, epoch: int, server: int, handle: Any) -> str:
        """Iterate until stopped; an exception here is the worker failing.

        The first route comes with the call: an async actor does not run calls in the order they were sent.
        """
        self.t0 = t0
        self.set_route(epoch, server, handle)
        while not self._stopping:
            if not await self._iteration():
                break
        return STOP

    async def _await_route(self, epoch: int) -> None:
        """Wait for a route newer than ``epoch`` (the driver sends it after updating the servers)."""
        while not self._stopping and self.route is not None and self.route.epoch <= epoch:
            self._route_changed.clear()
            try:
                await asyncio.wait_for(self._route_changed.wait(), timeout=5.0)
            except asyncio.TimeoutError:
                return  # retry on the current route; a server answers MOVED again if still moved

    async def _pull(self) -> tuple[Route, dict[str, Any], float, float] | None:
        """Gate + pull on the current route; (route, reply, wait_s, comm_s), None when stopping."""
        answered = await self._routed(lambda route: route.handle.pull.remote(self.w))
        if answered is None:
            return None
        route, reply, moved_s, elapsed = answered
        real = elapsed - reply["wait_s"]
        pad = self.link.seconds(reply.get("nbytes", self.download_bytes)) - real
        if pad > 0:
            await asyncio.sleep(pad)
        return route, reply, moved_s + reply["wait_s"], max(real, 0.0) + max(pad, 0.0)

    async def _routed(self, call: Callable[[Route], Any]) -> tuple[Route, dict[str, Any], float, float] | None:
        """``call`` the current route's server, following MOVED answers (wait for the new route, retry).

        Returns (route, reply, seconds lost on moved attempts, seconds of the answered call); None on
        STOP or when stopping.
        """
        moved_s = 0.0
        while not self._stopping:
            assert self.route is not None
            route = self.route
            start = time.perf_counter()
            reply = await call(route)
            elapsed = time.perf_counter() - start
            if reply["status"] == STOP:
                return None
            if reply["status"] == MOVED:
                await self._await_route(route.epoch)
                moved_s += time.perf_counter() - start
                continue
            return route, reply, moved_s, elapsed
        return None

    def _compute(self, reply: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int, float, dict[str, Any] | None]:
        """The real gradient on the pulled parameters, compressed: (grad, buffer delta, bytes, loss, SIM part)."""
        if self._fail_next:
            raise RuntimeError(f"worker {self.w}: injected failure")
        if "plan" in reply:
            return self._sim_compute(reply)
        params = _tensor(reply["params"]).to(self.device)
        buffers = _tensor(reply["buffers"]).to(self.device)
        x, y = self.stream.next()
        grad, buffer_delta, loss = self.engine.gradient(params, buffers, x.to(self.device), y.to(self.device))
        grad, buffer_delta = grad.cpu(), buffer_delta.cpu()
        nbytes = 4 * grad.numel()
        if self.codec is not None:
            grad, nbytes = self.codec.encode(grad, self.density)
        nbytes += 4 * buffer_delta.numel()
        return grad.numpy(), buffer_delta.numpy(), nbytes, loss, None

    def _sim_compute(self, reply: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int, float, dict[str, Any]]:
        """SIM (as the sim backend's _pull + _sim_push): take the fresh tensors, compute on the local model, step
        it; send gradients of tensors pulled fresh, local changes of tensors re-synchronised now (packed)."""
        local = self.local
        assert local is not None
        fresh, plan = tuple(reply["fresh"]), tuple(reply["plan"])
        local.pull(unpack(reply["params"], fresh, self.slices, local.params.numel()), fresh)
        buffers = _tensor(reply["buffers"]).to(self.device)
        x, y = self.stream.next()
        grad, buffer_delta, loss = self.engine.gradient(local.params.to(self.device), buffers, x.to(self.device),
                                                        y.to(self.device))
        grad, buffer_delta = grad.cpu(), buffer_delta.cpu()
        local.step(grad)
        grad_mask = tuple(p and f for p, f in zip(plan, fresh))
        delta_mask = tuple(p and not f for p, f in zip(plan, fresh))
        sent_grad, grad_bytes = self._encode(self.codec, grad, grad_mask)
        sent_delta, delta_bytes = (torch.zeros_like(grad), 0)
        if any(delta_mask):
            sent_delta, delta_bytes = self._encode(self.delta_codec, local.change(), delta_mask)
        sim = {"delta": pack(sent_delta, delta_mask, self.slices), "grad_mask": grad_mask, "delta_mask": delta_mask,
               "clock": reply["clock"]}
        buffer_bytes = 0 if reply.get("periodic") and not any(plan) else 4 * buffer_delta.numel()
        nbytes = grad_bytes + delta_bytes + buffer_bytes
        return pack(sent_grad, grad_mask, self.slices), buffer_delta.numpy(), nbytes, loss, sim

    def _encode(self, codec: GradientCodec | None, vector: torch.Tensor,
                send: tuple[bool, ...]) -> tuple[torch.Tensor, int]:
        """The tensors marked in ``send``, compressed if a compressor is configured, and their bytes."""
        if codec is not None:
            return codec.encode(vector, self.density, send)
        return vector, 4 * sum(sl.stop - sl.start for sl, take in zip(self.slices, send) if take)

    async def _push(self, route: Route, version: int, grad: np.ndarray | None, delta: np.ndarray,
                    nbytes: int, sim: dict[str, Any] | None = None) -> tuple[dict[str, Any], float, float] | None:
        """Upload (link-padded), re-sending to the new server if this worker moved; (reply, wait_s, comm_s)."""
        pad = self.push_link.seconds(nbytes) - self._push_estimate
        comm = max(pad, 0.0)
        if pad > 0:
            await asyncio.sleep(pad)
        if self.ina is not None:  # the gradient goes through the data plane; the push below only counts it
            start = time.perf_counter()
            if not await self.ina.push(version, grad, lambda: self._stopping):
                return None
            comm += time.perf_counter() - start
            grad = None
        moved_away = False  # staleness is only defined on the server it pulled from

        def push(target: Route) -> Any:
            nonlocal moved_away
            moved_away = moved_away or target.server != route.server
            return target.handle.push.remote(self.w, None if moved_away else version, grad, delta, sim)

        answered = await self._routed(push)
        if answered is None:
            return None
        _, reply, moved_s, elapsed = answered
        self._push_estimate = 0.8 * self._push_estimate + 0.2 * elapsed
        return reply, moved_s, comm + elapsed

    async def _iteration(self) -> bool:
        pulled = await self._pull()
        if pulled is None:
            return False
        route, reply, waited, pull_s = pulled
        start = time.perf_counter()
        grad, delta, nbytes, loss, sim = self._compute(reply)
        real = time.perf_counter() - start
        compute = real
        if self.cfg.cluster.emulate:
            target = self.compute_s * self.speed * self.stragglers.factor(self.w)
            if target > real:
                await asyncio.sleep(target - real)
            compute = max(target, real)
        pushed = await self._push(route, reply["version"], grad, delta, nbytes, sim)
        if pushed is None:
            return False
        answer, push_wait, push_s = pushed
        self._records.append({
            "t": round(time.time() - self.t0, 6), "worker": self.w, "server": self.route.server if self.route else 0,
            "clock": answer["clock"], "staleness": answer["staleness"], "compute_s": round(compute, 6),
            "compute_real_s": round(real, 6), "wait_s": round(waited + push_wait, 6),
            "comm_s": round(pull_s + push_s, 6), "loss": round(loss, 6), "bytes_up": nbytes,
            "bytes_down": reply.get("nbytes", self.download_bytes),
        })
        return True
