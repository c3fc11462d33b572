"""All-reduce groups: a worker actor that keeps its own replica and all-reduces gradients with DDP.

``sync.intra_group = "allreduce"``: the workers of a synchronous group (BSP:
everyone; GSSP: each group) form a torch.distributed process group inside
their Ray actors (gloo on CPU, NCCL on GPU; the group's first rank opens the
rendezvous, as Ray Train does) and wrap their module in
DistributedDataParallel, so gradients are averaged in buckets while the
backward pass still runs. No parameter travels through a server. Every
member steps the same optimizer on the same averaged gradient (SGD or Adam
with weight decay in the gradient, as the server's ``Replica`` does), so
the replicas stay equal; batch-norm buffers are the first rank's (DDP
broadcasts them). BSP: the learning rate follows ``optimizer.lr_decay_epochs``
from the iteration count, the same on every rank.

Agreement: every few iterations (about 50 ms, the same period on every
rank) the ranks all-reduce (MIN) one small vector on a second gloo group:
the stop flag, the newest optimizer settings each holds, and how many of
each peer group's deltas each holds (group_exchange). So every member
leaves, changes its settings and adds peer deltas after the same
iteration. BSP starts it before the forward pass and awaits it after the
step (hidden behind compute; a stop ends the next iteration); GSSP takes
it after the step, blocking, so a regroup's stop ends the iteration it was
asked in (the whole cluster waits for it).

GSSP between groups: every ``exchange_every`` rounds the group's first rank
sends the group's own delta (what its optimizer steps changed since the last
send, not what peers sent) through the object store to each peer group's
first rank, from a thread, so the group's rounds never wait for it; that
rank hands the reference to its members (ray_collective_exchange). A
regroup stops every group, sends what is left, applies everything
delivered (the replicas are then equal) and forms the new groups
(``form``).

Balanced batches (``sync.balance = "batch"``): every rank holds the same
pure ``WorkBalancer``. The agreement vector also carries each rank's last
(compute seconds, samples) in its own slots and infinity in the others', so
its MIN gives every rank every member's observation; all feed them in rank
order and resize alike, from the next iteration on. Each rank's loss is
scaled by its share of the group's samples (DDP averages).

Emulation (``cluster.emulate``) pads as the server path does: before the
forward pass up to the profile's compute time, after the step up to a ring
all-reduce's time over the group on the emulated links (the sim charges the
same); the exchange waits out the peer link. The record splits the time
beyond compute into ``comm_s`` (at most the larger of the ring's emulated
time and a bare all-reduce of the gradient's size, timed when the group
forms with every member entering together) and ``wait_s`` (the rest:
waiting inside the all-reduce for slower ranks). GSSP profiles compute +
comm: what the worker's iteration takes without waiting.
"""

from __future__ import annotations

import math
import os
import queue
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import ray

from shoal.backends.group_exchange import DeltaInbox, StepScale
from shoal.backends.ray.collective_exchange import GroupExchange
from shoal.backends.ray.data import ShardRef
from shoal.backends.ray.wire import Link, actor_device, actor_threads, quiet_readonly_numpy
from shoal.backends.ray.worker import worker_shard
from shoal.cluster import StragglerModel
from shoal.config import Config
from shoal.engine.cost import ring_allreduce_bytes, ring_allreduce_time
from shoal.engine.replica import torch_optimizer
from shoal.engine.setup import build_engine
from shoal.strategy import Strategy

JOIN_TIMEOUT = timedelta(seconds=60)
AGREE_EVERY_S = 0.05  # iteration seconds between two agreements (stop, settings, peer deltas)


@dataclass(frozen=True)
class GroupPlan:
    """What a rank is told when its group forms (``CollectiveWorker.form``)."""

    index: int  # the group's number (GSSP's server index; 0 for BSP)
    rank: int
    members: tuple[int, ...]  # worker ids in rank order
    groups: int  # how many groups there are (the senders of peer deltas)
    scale: StepScale
    lr: float
    epoch: int  # the driver's membership epoch: deliveries from an earlier grouping are dropped
    budget: int = 0  # BSP: this rank's share of run.max_iterations (it stops itself); 0: the driver stops it
    leaders: tuple[Any, ...] = ()  # GSSP, first rank only: every group's first rank (None: an empty group)
    member_handles: tuple[Any, ...] = ()  # GSSP, first rank only: its members, which it hands peer deltas to
    exchange_every: int = 0


class CollectiveWorker(GroupExchange):
    """One rank of an all-reduce group: its shard, its module under DDP, its optimizer, its group's exchange."""

    def __init__(self, worker: int, cfg: Config, data: ShardRef | tuple[np.ndarray, np.ndarray], num_classes: int,
                 speed: float, compute_s: float, n_train: int, params: np.ndarray, buffers: np.ndarray) -> None:
        quiet_readonly_numpy()
        torch.set_num_threads(actor_threads(cfg.backend.cpus_per_worker))
        self.w, self.cfg, self.speed, self.compute_s, self.n_train = worker, cfg, speed, compute_s, n_train
        self.device = actor_device(cfg.backend.gpus_per_worker)
        shard, self.stream = worker_shard(cfg, worker, data, num_classes)
        self.engine = build_engine(cfg, shard.input_shape, num_classes)
        self.engine._load(torch.from_numpy(np.array(params)), torch.from_numpy(np.array(buffers)))
        self.engine.to(self.device)
        strategy = Strategy.from_config(cfg, self.engine.layout)
        self.grouped = strategy.grouped  # GSSP groups; else one group of all
        # sync.balance = "batch": every rank holds the same pure balancer, fed the same agreed observations
        self.balancer = strategy.balancer(cfg.cluster.total_workers)
        self._observed: tuple[float, int] | None = None  # this rank's last iteration: (compute seconds, samples)
        batch = min(len(shard.y_train), cfg.data.batch_size)  # what measures compute, without using the stream
        self._probe = (shard.x_train[:batch].to(self.device), shard.y_train[:batch].to(self.device))
        self.stragglers = StragglerModel(cfg.cluster.stragglers, cfg.cluster.workers, cfg.run.seed)
        c = cfg.cluster
        self.peer_link = Link(c.latency_ms / 1e3, c.server_gbps * 1e9, c.emulate)
        self.lock = threading.Lock()  # the driver reads the state between two optimizer steps
        self.ddp: Any = None
        self.control: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.plan: GroupPlan | None = None
        self.iterations = 0
        self.real_compute_s = 0.0
        self.bare_allreduce_s = 0.0  # the group's all-reduce of the gradient alone, measured when it forms
        self._records: list[dict[str, Any]] = []
        self._stopping = False
        self._fail_next = False
        self._settings: dict[int, tuple[float, float | None]] = {}  # version -> (lr, share), newest agreed applied
        self._applied_settings = 0
        self.inbox = DeltaInbox(1)
        self.inbox_lock = threading.Lock()  # deliveries arrive on Ray's threads, the loop takes them
        self._own: tuple[torch.Tensor, torch.Tensor] | None = None  # first rank: the state at the last send
        self._received: tuple[torch.Tensor, torch.Tensor] | None = None  # ... and the peer deltas added since
        self._rounds, self._sent = 0, 0
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._deliveries: list[Any] = []
        self._sender: threading.Thread | None = None
        self._t0 = 0.0

    # -- set-up (called by the driver) ------------------------------------------------------

    def reinit(self, *args: Any) -> None:
        """Serve a new run from this process (ActorPool): leave the last run's process group and start afresh.
        The sender thread (GSSP) and its queue belong to the process: they serve the new run once the last run's
        deltas have been delivered (a peer re-initialised first drops them; none may reach the new run's groups,
        which form only after every rank here is re-initialised)."""
        self._leave_group()
        self._outbox.join()
        try:
            ray.get(self._deliveries)
        except ray.exceptions.RayError:  # a peer that is gone missed a delta of a run that has ended
            pass
        sender, outbox = self._sender, self._outbox
        self.__init__(*args)  # type: ignore[misc]
        self._sender, self._outbox = sender, outbox

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": str(self.device)}

    def rendezvous(self, local: bool) -> str:
        """A group's first rank: where its ranks meet. Local runs use a file store (no listening socket at all:
        PyTorch's TCP store binds every interface); a cluster uses a TCP store on that rank's node."""
        if local:
            folder = tempfile.mkdtemp(prefix="shoal-pg-")
            return f"file://{os.path.join(folder, 'store')}"
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return f"tcp://{host}:{s.getsockname()[1]}"

    def form(self, init_method: str, plan: GroupPlan, local: bool,
             kept: tuple[dict[str, Any], StepScale] | None = None) -> float:
        """Join (or re-join) a group: a new process group and DDP over it, stepping at the plan's scale.

        Every member then holds the first rank's parameters and buffers (DDP
        broadcasts them; after ``settle`` they are equal anyway) and the same
        optimizer state: ``kept``, the state its group index had (and the
        scale it had then: the velocity is rescaled), or a fresh one. Returns
        the real compute time.
        """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        self._leave_group()
        if local:  # gloo's own sockets stay on loopback like everything else of a local run
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=plan.rank, world_size=len(plan.members),
                                timeout=JOIN_TIMEOUT)
        self.control = dist.new_group(backend="gloo")
        self.ddp = DistributedDataParallel(self.engine.model, device_ids=[self.device.index] if backend == "nccl"
                                           else None)
        fresh = self.optimizer is None
        self.optimizer = self._new_optimizer()
        if fresh:
            self.real_compute_s = self._measure_compute()
        if kept is not None:
            self.optimizer.load_state_dict(kept[0])
        self.plan = plan
        self._settings, self._applied_settings = {0: (plan.lr, plan.scale.share)}, 0
        self._set_scale(plan.lr, plan.scale, kept[1] if kept is not None else None)
        self.inbox = DeltaInbox(plan.groups)
        self._rounds, self._sent, self._stopping = 0, 0, False
        self._observed = None  # an observation belongs to the rank of the group it was made in
        self.bare_allreduce_s = self._measure_allreduce()
        self._own, self._received = None, None
        if plan.leaders:
            self._own = self.engine.initial_state()
            self._received = tuple(torch.zeros_like(t) for t in self._own)  # type: ignore[assignment]
        # how often the group agrees: about every AGREE_EVERY_S of its slowest member's iteration
        target = self.compute_s * self.speed if self.cfg.cluster.emulate else 0.0
        slowest = torch.tensor([max(self.real_compute_s, target, 1e-6)])
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.control)
        self.stop_every = int(max(1, min(64, AGREE_EVERY_S / float(slowest.item()))))
        return self.real_compute_s

    def _new_optimizer(self) -> torch.optim.Optimizer:
        opt = self.cfg.optimizer
        return torch_optimizer(opt, self.engine.model.parameters(), opt.weight_decay)

    def optimizer_state(self) -> tuple[dict[str, Any], StepScale]:
        """The optimizer's state and the scale it stepped at (a group keeps them through a regroup)."""
        assert self.optimizer is not None and self.plan is not None
        with self.lock:
            return self.optimizer.state_dict(), self.plan.scale

    def _measure_allreduce(self, repeats: int = 3) -> float:
        """The least time of an all-reduce of the gradient's size that every member enters together (after a
        barrier): the group's communication without waiting for anyone."""
        import torch.distributed as dist

        if len(self.plan.members) == 1:
            return 0.0
        values = torch.zeros(self.engine.num_params, device=self.device)
        best = float("inf")
        for _ in range(repeats):
            dist.barrier(group=self.control)
            start = time.perf_counter()
            dist.all_reduce(values)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            best = min(best, time.perf_counter() - start)
        return best

    def _leave_group(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():  # no gc.collect (0.8 s in an actor): a dropped DDP's hooks no longer reduce
            self.ddp, self.control = None, None
            dist.destroy_process_group()

    def _measure_compute(self, repeats: int = 3) -> float:
        """Forward + backward without synchronising (the least of a few), to tell compute from all-reduce."""
        x, y = self._probe
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            with self.ddp.no_sync():
                self.engine.task.loss(self.ddp(x), y).backward()
            best = min(best, time.perf_counter() - start)
        self.optimizer.zero_grad(set_to_none=True)
        return best

    def set_speed(self, speed: float) -> None:
        self.speed = speed

    def stop(self) -> None:
        self._stopping = True

    def fail_next(self) -> None:
        """Fault injection: the next iteration raises (the run then stops: a rank cannot be replaced yet)."""
        self._fail_next = True

    def configure(self, epoch: int, version: int, lr: float, share: float | None) -> None:
        """New optimizer settings (GSSP: the decayed lr, the group's share of updates), used once agreed; settings
        meant for an earlier grouping are dropped."""
        if self.plan is not None and epoch == self.plan.epoch:
            self._settings[version] = (lr, share)

    def drain(self, density: float = 1.0) -> list[dict[str, Any]]:
        with self.lock:
            records, self._records = self._records, []
        return records

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Flat parameters and float buffers now (between two steps)."""
        with self.lock:
            params, buffers = self.engine.initial_state()
        return params.cpu().numpy(), buffers.cpu().numpy()

    # -- the loop ----------------------------------------------------------------------------

    def run(self, t0: float) -> str:
        """Iterate until every rank has been asked to stop (agreed), or until the plan's budget ("budget")."""
        self._t0 = t0
        assert self.plan is not None
        while self._iteration(t0):
            if self.plan.budget and self.iterations >= self.plan.budget:
                return "budget"
        return "stop"

    def _iteration(self, t0: float) -> bool:
        if self._fail_next:
            raise RuntimeError(f"worker {self.w}: injected failure")
        plan, c = self.plan, self.cfg.cluster
        assert plan is not None and self.optimizer is not None
        agree = self.iterations % self.stop_every == 0
        # BSP: overlapped with this iteration's compute (taken after the step it cost the MLP on 2 ranks about a
        # quarter), awaited after the step. GSSP: after the step, blocking: a regroup's stop ends this iteration
        overlapped = agree and not self.grouped
        control, agreed = self._agreement(overlapped) if overlapped else (None, None)
        batch = self.balancer.size(self.w) if self.balancer else self.cfg.data.batch_size
        x, y = self.stream.next(batch if self.balancer else None)
        x, y = x.to(self.device), y.to(self.device)
        target = self.compute_s * self.speed * self.stragglers.factor(self.w) * batch / self.cfg.data.batch_size
        real = self.real_compute_s * batch / self.cfg.data.batch_size
        if c.emulate and target > real:
            time.sleep(target - real)
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.engine.task.loss(self.ddp(x), y)
        # balanced: DDP averages the ranks' gradients, so each is weighted by its share of the group's samples
        scale = self.balancer.scale(self.w, plan.members) if self.balancer else 1.0
        (loss * scale if scale != 1.0 else loss).backward()  # DDP all-reduces the buckets while backward runs
        self.iterations += 1
        if self.cfg.optimizer.clip_norm is not None:  # DDP's averaged gradient, as the replica clips its mean
            torch.nn.utils.clip_grad_norm_(self.engine.model.parameters(), self.cfg.optimizer.clip_norm)
        with self.lock:
            if not self.grouped:
                self._set_lr()
            self.optimizer.step()
        sync = max(time.perf_counter() - start - self.real_compute_s, 0.0)
        n, nbytes = len(plan.members), 4 * self.engine.num_params
        ring = ring_allreduce_time(nbytes, n, c.link_gbps * 1e9, c.latency_ms / 1e3) if c.emulate else 0.0
        if ring > sync:
            time.sleep(ring - sync)
            sync = ring
        comm = min(sync, max(ring, self.bare_allreduce_s))
        self._rounds += 1
        if plan.leaders and plan.exchange_every and self._rounds >= plan.exchange_every:
            self._send_own()
        compute = max(target, real) if c.emulate else real
        self._observed = (compute, batch)
        self._record(t0, compute, sync, comm, float(loss.detach()), int(ring_allreduce_bytes(nbytes, n)),
                     batch if self.balancer else None)
        if not agree:
            return True
        if overlapped:
            agreed.wait()
        else:
            control, _ = self._agreement(False)
        held = len(plan.members) * 2 if self.balancer else 0  # the observations close the vector
        values = control[2:].tolist()
        self._act_on_agreement(int(control[1].item()), [int(v) for v in values[:len(values) - held]])
        if self.balancer:
            self._rebalance(values[len(values) - held:])
        return control[0].item() == 0.0

    def _agreement(self, overlapped: bool) -> tuple[torch.Tensor, Any]:
        """Start (overlapped) or take the group's MIN all-reduce of the stop flag, settings and deltas held."""
        import torch.distributed as dist

        with self.inbox_lock:
            held = self.inbox.available()
        control = torch.tensor([-1.0 if self._stopping else 0.0, float(max(self._settings)), *held,
                                *self._observation()], dtype=torch.float64)
        return control, dist.all_reduce(control, op=dist.ReduceOp.MIN, group=self.control, async_op=overlapped)

    def _observation(self) -> list[float]:
        """sync.balance: this rank's last (compute seconds, samples) in its own two slots and infinity in every
        other rank's, so that the group's MIN hands every rank every member's observation (empty unbalanced)."""
        if not self.balancer:
            return []
        assert self.plan is not None
        slots = [math.inf] * (2 * len(self.plan.members))
        if self._observed is not None:
            slots[2 * self.plan.rank: 2 * self.plan.rank + 2] = [float(v) for v in self._observed]
        return slots

    def _rebalance(self, observed: list[float]) -> None:
        """Feed every member's agreed observation to this rank's balancer, in rank order, then let it resize the
        group: each rank holds the same balancer fed the same numbers, so all take the same sizes from the next
        iteration on, with no server to plan them. The first rank records the sizes when they change."""
        assert self.balancer is not None and self.plan is not None
        members = self.plan.members
        for member, (compute_s, samples) in zip(members, zip(observed[0::2], observed[1::2])):
            if math.isfinite(compute_s):
                self.balancer.observe(member, compute_s, int(samples))
        if self.balancer.rebalance(members) and self.plan.rank == 0:
            with self.lock:
                self._records.append({"event": "balance", "t": round(time.time() - self._t0, 6),
                                      "group": self.plan.index,
                                      "sizes": {str(m): self.balancer.size(m) for m in members}})

    def _act_on_agreement(self, settings: int, deltas: list[int]) -> None:
        """What every member of the group holds by now: the settings of that version, and those peer deltas."""
        assert self.plan is not None
        if settings > self._applied_settings:
            lr, share = self._agreed_settings(settings)
            scale = replace(self.plan.scale, share=share)
            with self.lock:
                self._set_scale(lr, scale, self.plan.scale)
            self.plan = replace(self.plan, scale=scale)
            for old in [v for v in list(self._settings) if v < settings]:  # in place: configure() may add one now
                self._settings.pop(old, None)
            self._applied_settings = settings
        if any(deltas):
            with self.inbox_lock:
                taken = self.inbox.take(deltas)
            self._add_peer_deltas(taken)

    def _agreed_settings(self, version: int) -> tuple[float, float | None]:
        """The settings of ``version``: a member that already holds a newer one may still wait for this one (the
        driver sent it first, but a threaded actor may run calls out of order); it is on its way."""
        deadline = time.monotonic() + JOIN_TIMEOUT.total_seconds()
        while version not in self._settings:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.w}: optimizer settings {version} never arrived")
            time.sleep(0.001)
        return self._settings[version]

    def _set_scale(self, lr: float, scale: StepScale, previous: StepScale | None) -> None:
        """Step at ``lr`` times the scale's factor with its momentum; rescale the velocity from ``previous``."""
        assert self.optimizer is not None
        ratio = scale.velocity_ratio(previous) if previous is not None else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = lr * scale.lr_factor
            if "momentum" in group and scale.momentum:
                group["momentum"] = scale.group_momentum
            if ratio != 1.0:
                for p in group["params"]:
                    buffer = self.optimizer.state.get(p, {}).get("momentum_buffer")
                    if buffer is not None:
                        buffer.mul_(ratio)

    def _record(self, t0: float, compute: float, sync: float, comm: float, loss: float, sent: int,
                batch: int | None = None) -> None:
        """One iteration record, in the fields the server path's workers send (``batch``: balanced)."""
        assert self.plan is not None
        record = {
            "t": round(time.time() - t0, 6), "worker": self.w, "server": self.plan.index, "clock": self.iterations,
            "staleness": 0, "compute_s": round(compute, 6), "compute_real_s": round(self.real_compute_s, 6),
            "wait_s": round(sync - comm, 6), "comm_s": round(comm, 6), "pull_s": 0.0, "loss": round(loss, 6),
            "bytes_up": sent, "bytes_down": sent, **({"batch": batch} if batch is not None else {}),
        }
        with self.lock:
            self._records.append(record)

    def _set_lr(self) -> None:
        """BSP: the scheduled learning rate of this round, from the iteration count (the same on every rank). As on
        the simulated server, which follows the schedule after each worker's push and applies a round at its last
        push: the epoch of every worker iteration but that last one (round r: r x n - 1 iterations)."""
        if not self.cfg.optimizer.scheduled:
            return
        n = self.cfg.cluster.workers
        epoch = (self.iterations * n - 1) * self.cfg.data.batch_size / max(1, self.n_train)
        lr = self.cfg.optimizer.lr_at(epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
