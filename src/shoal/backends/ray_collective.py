"""BSP on collectives: a worker actor that keeps its own replica and all-reduces gradients with DDP.

``sync.intra_group = "allreduce"``: the workers form one torch.distributed
process group inside their Ray actors (gloo on CPU, NCCL on GPU; rank 0
opens the rendezvous port, as Ray Train does) and wrap their module in
DistributedDataParallel, so gradients are averaged in buckets while the
backward pass still runs. No parameter travels through a server. Every
worker steps the same optimizer on the same averaged gradient (SGD or Adam
with weight decay in the gradient, as the server's ``Replica`` does), so
the replicas stay equal; batch-norm buffers are rank 0's (DDP broadcasts
them). The learning rate follows ``optimizer.lr_decay_epochs`` from the
iteration count, which is the same on every rank, so it changes at the same
step everywhere.

Stopping is agreed: every few iterations (about 50 ms of compute, the
same period on every rank) the ranks all-reduce a one-value stop flag (MAX)
on a second gloo group, started before the forward pass and awaited after
the step, so all ranks leave after the same iteration.

Emulation (``cluster.emulate``) pads as the server path does: before the
forward pass up to the profile's compute time, after the step up to a ring
all-reduce's time on the emulated links (the sim charges the same). The
record splits the time beyond compute into ``comm_s`` (at most the larger
of the ring's emulated time and the least this rank has seen) and ``wait_s``
(the rest: waiting inside the all-reduce for slower ranks).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from shoal.backends.ray_data import ShardRef
from shoal.backends.ray_wire import actor_device, actor_threads, quiet_readonly_numpy
from shoal.backends.ray_worker import worker_shard
from shoal.cluster import StragglerModel
from shoal.config import Config
from shoal.engine.cost import ring_allreduce_bytes, ring_allreduce_time
from shoal.engine.setup import build_engine

JOIN_TIMEOUT = timedelta(seconds=60)
STOP_CHECK_S = 0.05  # compute seconds between two agreements on stopping


class CollectiveWorker:
    """One rank of a BSP all-reduce group: its shard, its module under DDP, its optimizer."""

    def __init__(self, worker: int, cfg: Config, data: ShardRef | tuple[np.ndarray, np.ndarray], num_classes: int,
                 speed: float, compute_s: float, n_train: int, params: np.ndarray, buffers: np.ndarray) -> None:
        quiet_readonly_numpy()
        torch.set_num_threads(actor_threads(cfg.backend.cpus_per_worker))
        self.w, self.cfg, self.speed, self.compute_s, self.n_train = worker, cfg, speed, compute_s, n_train
        self.device = actor_device(cfg.backend.gpus_per_worker)
        shard, self.stream = worker_shard(cfg, worker, data, num_classes)
        self.engine = build_engine(cfg, shard.input_shape, num_classes)
        self.engine._load(torch.from_numpy(np.array(params)), torch.from_numpy(np.array(buffers)))
        self.engine.model.to(self.device)
        batch = min(len(shard.y_train), cfg.data.batch_size)  # what measures compute, without using the stream
        self._probe = (shard.x_train[:batch].to(self.device), shard.y_train[:batch].to(self.device))
        self.stragglers = StragglerModel(cfg.cluster.stragglers, cfg.cluster.workers, cfg.run.seed)
        self.lock = threading.Lock()  # the driver reads the state between two optimizer steps
        self.ddp: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.iterations = 0
        self.real_compute_s = 0.0
        self._least_sync = float("inf")
        self._records: list[dict[str, Any]] = []
        self._stopping = False
        self._fail_next = False

    # -- set-up (called by the driver) ------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": str(self.device)}

    def rendezvous(self, local: bool) -> str:
        """Rank 0: where the ranks meet. Local runs use a file store (no listening socket at all: PyTorch's
        TCP store binds every interface); a cluster uses a TCP store on rank 0's node."""
        import ray

        if local:
            folder = tempfile.mkdtemp(prefix="shoal-pg-")
            return f"file://{os.path.join(folder, 'store')}"
        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return f"tcp://{host}:{s.getsockname()[1]}"

    def join(self, init_method: str, world: int, local: bool) -> float:
        """Join the process group, wrap the module in DDP, build the optimizer; returns the real compute time."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if local:  # gloo's own sockets stay on loopback like everything else of a local run
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=self.w, world_size=world,
                                timeout=JOIN_TIMEOUT)
        self.control = dist.new_group(backend="gloo")
        self.ddp = DistributedDataParallel(self.engine.model, device_ids=[self.device.index] if backend == "nccl"
                                           else None)
        opt = self.cfg.optimizer
        params = self.engine.model.parameters()
        self.optimizer = torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay) \
            if opt.name == "sgd" else torch.optim.Adam(params, lr=opt.lr, weight_decay=opt.weight_decay)
        self.real_compute_s = self._measure_compute()
        # how often the stop flag is agreed: about every STOP_CHECK_S of compute, the same period on every rank
        period = torch.tensor([max(1, min(64, int(STOP_CHECK_S / max(self.real_compute_s, 1e-6))))])
        dist.all_reduce(period, op=dist.ReduceOp.MIN, group=self.control)
        self.stop_every = int(period.item())
        return self.real_compute_s

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

    def drain(self, density: float = 1.0) -> list[dict[str, Any]]:
        records, self._records = self._records, []
        return records

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Flat parameters and float buffers now (between two steps)."""
        with self.lock:
            params, buffers = self.engine.initial_state()
        return params.cpu().numpy(), buffers.cpu().numpy()

    # -- the loop ----------------------------------------------------------------------------

    def run(self, t0: float) -> str:
        """Iterate until every rank has been asked to stop (agreed through the stop flag), or until this rank's
        share of ``run.max_iterations`` (the same iteration on every rank: "budget")."""
        total = self.cfg.run.max_iterations
        budget = max(1, total // self.cfg.cluster.workers) if total else 0
        while self._iteration(t0):
            if budget and self.iterations >= budget:
                return "budget"
        return "stop"

    def _iteration(self, t0: float) -> bool:
        import torch.distributed as dist

        if self._fail_next:
            raise RuntimeError(f"worker {self.w}: injected failure")
        c, n = self.cfg.cluster, self.cfg.cluster.workers
        flag, agreed = None, None
        if self.iterations % self.stop_every == 0:
            flag = torch.tensor([1.0 if self._stopping else 0.0])
            agreed = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control, async_op=True)
        x, y = self.stream.next()
        x, y = x.to(self.device), y.to(self.device)
        target = self.compute_s * self.speed * self.stragglers.factor(self.w)
        if c.emulate and target > self.real_compute_s:
            time.sleep(target - self.real_compute_s)
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.engine.task.loss(self.ddp(x), y)
        loss.backward()  # DDP all-reduces the gradient buckets while backward runs
        self.iterations += 1
        with self.lock:
            self._set_lr()
            self.optimizer.step()
        sync = max(time.perf_counter() - start - self.real_compute_s, 0.0)
        nbytes = 4 * self.engine.num_params
        ring = ring_allreduce_time(nbytes, n, c.link_gbps * 1e9, c.latency_ms / 1e3) if c.emulate else 0.0
        if ring > sync:
            time.sleep(ring - sync)
            sync = ring
        self._least_sync = min(self._least_sync, sync)
        comm = min(sync, max(ring, self._least_sync))
        if agreed is not None:
            agreed.wait()
        self._record(t0, max(target, self.real_compute_s) if c.emulate else self.real_compute_s, sync, comm,
                     float(loss.detach()), int(ring_allreduce_bytes(nbytes, n)))
        return flag is None or flag.item() == 0.0

    def _record(self, t0: float, compute: float, sync: float, comm: float, loss: float, sent: int) -> None:
        """One iteration record, in the fields the server path's workers send."""
        self._records.append({
            "t": round(time.time() - t0, 6), "worker": self.w, "server": 0, "clock": self.iterations, "staleness": 0,
            "compute_s": round(compute, 6), "compute_real_s": round(self.real_compute_s, 6),
            "wait_s": round(sync - comm, 6), "comm_s": round(comm, 6), "pull_s": 0.0, "loss": round(loss, 6),
            "bytes_up": sent, "bytes_down": sent,
        })

    def _set_lr(self) -> None:
        """The decayed learning rate at this step: from the iteration count, the same on every rank."""
        if not self.cfg.optimizer.lr_decay_epochs:
            return
        n = self.cfg.cluster.workers
        epoch = self.iterations * n * self.cfg.data.batch_size / max(1, self.n_train)
        lr = self.cfg.optimizer.lr_at(epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
