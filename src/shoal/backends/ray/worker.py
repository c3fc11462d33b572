"""The `ray` backend's worker actor (a plain class, made a Ray actor by ray/driver.py).

An asyncio actor that runs one loop: pull from its group server (gated),
compute a real gradient on exactly what it pulled, pad to the emulated
compute and link times, push. Parameters and gradients travel as numpy
arrays through Ray's object store. With in-network aggregation the push
carries no gradient: the worker first sends it as fragments to its
aggregation node (``ray_switch``) and waits until the server has
acknowledged every fragment. A worker that a membership change moved gets
MOVED from its old server and waits for the driver's route of a newer epoch.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
import ray

from shoal.backends.checkpoint import rng_state, rng_text
from shoal.backends.local_model import LocalModel
from shoal.backends.ray.data import ShardRef, load_shard
from shoal.backends.ray.switch import WorkerSide
from shoal.backends.ray.wire import (
    MOVED, OK, STOP, Link, actor_device, actor_threads, as_tensor, pack, quiet_readonly_numpy, unpack,
)
from shoal.backends.work import deadline_cut
from shoal.cluster import StragglerModel
from shoal.compress import GradientCodec
from shoal.config import Config
from shoal.data import BatchStream, Dataset
from shoal.engine.setup import build_engine
from shoal.strategy import Strategy


def worker_shard(cfg: Config, worker: int, data: ShardRef | tuple[np.ndarray, np.ndarray],
                 num_classes: int) -> tuple[Dataset, BatchStream]:
    """A worker's shard as a data set, and its batch stream (permuted exactly like the sim backend's).

    ``data`` is the shard itself (shipped by the driver) or a reference the worker loads (``ray_data``).
    """
    if isinstance(data, ShardRef):
        x, y = load_shard(cfg, worker, data)
    else:
        x, y = torch.from_numpy(np.array(data[0])), torch.from_numpy(np.array(data[1]))
    shard = Dataset("shard", x, y, torch.empty(0), torch.empty(0, dtype=torch.long), num_classes)
    return shard, BatchStream(shard, np.arange(len(y)), cfg.data.batch_size, cfg.run.seed, worker)


@dataclass
class Route:
    """Which server a worker uses, and under which membership epoch."""

    epoch: int
    server: int
    handle: Any


class Worker:
    """One data-parallel worker: its shard, model copy, codec and emulated speed."""

    def __init__(self, worker: int, cfg: Config, data: ShardRef | tuple[np.ndarray, np.ndarray], num_classes: int,
                 speed: float, compute_s: float, download_bytes: int, density: float) -> None:
        quiet_readonly_numpy()
        torch.set_num_threads(actor_threads(cfg.backend.cpus_per_worker))
        torch.manual_seed(cfg.run.seed)
        self.w, self.cfg, self.speed, self.compute_s = worker, cfg, speed, compute_s
        self.download_bytes, self.density = download_bytes, density
        self.device = actor_device(cfg.backend.gpus_per_worker)
        shard, self.stream = worker_shard(cfg, worker, data, num_classes)
        self.engine = build_engine(cfg, shard.input_shape, num_classes)
        self.engine.to(self.device)
        self.strategy = Strategy.from_config(cfg, self.engine.layout)  # the driver's, rebuilt from the same config
        self.codec = self.strategy.codec(worker)
        self.slices = self.strategy.slices
        self.local: LocalModel | None = None  # SIM: this worker's own model copy and a codec for its changes
        self.delta_codec: GradientCodec | None = None
        if self.strategy.local_models:
            params, buffers = self.engine.initial_state()
            self.local = LocalModel(params.cpu(), buffers.cpu(), cfg.optimizer, self.strategy.layout)
            self.delta_codec = self.strategy.delta_codec(worker)
        # Streaming DiLoCo's overlap: a sync's transfer time runs beside the next inner steps
        self.overlap, self.mixing = self.strategy.overlap
        self._uploads: dict[int, asyncio.Task[float]] = {}  # clock sent -> its emulated upload (ends: its time)
        self.stragglers = StragglerModel(cfg.cluster.stragglers, cfg.cluster.total_workers, cfg.run.seed)
        c = cfg.cluster
        self.link = Link(c.latency_ms / 1e3, c.link_gbps * 1e9, c.emulate)
        self.route: Route | None = None
        self._route_changed = asyncio.Event()
        self._stopping = False
        self._fail_next = False
        self._records: list[dict[str, Any]] = []
        self._push_estimate = 0.0
        self._next: tuple[Route, dict[str, Any], float, float] | None = None  # a pull that came with the last push
        self.push_link = self.link
        self.ina: WorkerSide | None = None
        self.t0 = 0.0
        self._warm_up(shard)

    def _warm_up(self, shard: Dataset) -> None:
        """One throwaway gradient: the first backward pass costs lazy initialisation, paid before the clock starts."""
        params, buffers = self.engine.initial_state()
        batch = min(len(shard.y_train), self.cfg.data.batch_size)
        start = time.perf_counter()
        self.engine.gradient(params, buffers, shard.x_train[:batch].to(self.device), shard.y_train[:batch].to(self.device))
        self._batch_s = time.perf_counter() - start  # an upper bound of a batch's time until one is measured

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

    def position(self, folder: str | None = None) -> dict[str, Any]:
        """Where this worker's data stream and random generators stand (checkpointed; a resume seeks here).

        With ``folder`` (a checkpoint being written) the codecs' state goes there too, in the same call:
        error feedback, DGC's velocities, PowerSGD's Q and the compressor's generator
        (``worker-<w>.safetensors``, named under "codec").
        """
        where = {**self.stream.position(), "torch_rng": rng_text(torch.get_rng_state()),
                 "stragglers": self.stragglers.state(self.w)}
        state = self._codec_state()
        if folder is not None and state:
            name = f"worker-{self.w}.safetensors"
            save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, os.path.join(folder, name))
            where["codec"] = name
        return where

    def seek(self, position: dict[str, Any], folder: str | None = None) -> dict[str, Any]:
        """Continue from a checkpointed ``position()`` (before the loop starts); returns the position now."""
        self.stream.seek(int(position["epoch"]), int(position["offset"]))
        torch.set_rng_state(rng_state(position["torch_rng"]))
        self.stragglers.restore(self.w, position["stragglers"])
        now = self.position()
        if folder is not None and position.get("codec"):
            self._load_codec_state(load_file(os.path.join(folder, position["codec"])))
            now["codec"] = position["codec"]  # what it goes on from
        return now

    def _codec_state(self) -> dict[str, torch.Tensor]:
        """Both codecs' state (the delta codec's under "delta."), empty without a compressor."""
        state = {} if self.codec is None else self.codec.state_dict()
        if self.delta_codec is not None:
            state |= {f"delta.{k}": v for k, v in self.delta_codec.state_dict().items()}
        return state

    def _load_codec_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.codec is not None:
            self.codec.load_state_dict({k: v for k, v in state.items() if not k.startswith("delta.")})
        if self.delta_codec is not None:
            self.delta_codec.load_state_dict({k.removeprefix("delta."): v for k, v in state.items()
                                              if k.startswith("delta.")})

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
        upload = self._uploads.pop(reply.get("clock", 0) - 1 - self.overlap, None) if reply.get("changed") else None
        if upload is not None:  # overlapped: the download followed the upload beside the last steps
            pad -= time.perf_counter() - await upload
        if pad > 0:
            await asyncio.sleep(pad)
        return route, reply, moved_s + reply["wait_s"], max(real, 0.0) + max(pad, 0.0)

    async def _upload(self, seconds: float) -> float:
        """An overlapped sync's emulated upload, beside the next steps; returns when it ended."""
        await asyncio.sleep(seconds)
        return time.perf_counter()

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
            try:
                reply = await call(route)
            except ray.exceptions.RayActorError:  # the server died: the driver replaces it and sends a new route
                await self._await_route(route.epoch)
                moved_s += time.perf_counter() - start
                continue
            elapsed = time.perf_counter() - start
            if reply["status"] == STOP:
                return None
            if reply["status"] == MOVED:
                await self._await_route(route.epoch)
                moved_s += time.perf_counter() - start
                continue
            return route, reply, moved_s, elapsed
        return None

    def _plan(self, reply: dict[str, Any]) -> tuple[int | None, float | None]:
        """sync.balance: this iteration's units of work (samples, or local steps; None: unbalanced) and its
        emulated compute seconds (None: only the real time counts, cluster.emulate off).

        A deadline round cuts the batch where the simulator does (backends/work.py), from the emulated time
        of a plain batch or, unemulated, from this worker's last measured one.
        """
        batch_size = self.cfg.data.batch_size
        plain = self.compute_s * self.speed * self.stragglers.factor(self.w) if self.cfg.cluster.emulate else None
        if "deadline" in reply:
            samples, seconds = deadline_cut(self._batch_s if plain is None else plain, reply["deadline"], batch_size,
                                            self.cfg.balance.micro_batch)
            return samples, None if plain is None else seconds
        if "batch" in reply:
            return reply["batch"], None if plain is None else plain * reply["batch"] / batch_size
        if "steps" in reply:
            return reply["steps"], None if plain is None else plain * reply["steps"]
        return None, plain

    def _compute(self, reply: dict[str, Any],
                 units: int | None) -> tuple[np.ndarray, np.ndarray, int, float | None, dict[str, Any] | None]:
        """The real gradient on the pulled parameters, compressed: (grad, buffer delta, bytes, loss, SIM part).
        ``units``: the batch size, or the local steps of a period (sync.balance)."""
        if self._fail_next:
            raise RuntimeError(f"worker {self.w}: injected failure")
        if "steps" in reply:
            return self._period_compute(reply, units or 1)
        if "plan" in reply:
            return self._sim_compute(reply)
        params = as_tensor(reply["params"]).to(self.device)
        buffers = as_tensor(reply["buffers"]).to(self.device)
        if units == 0:  # a deadline round in which this worker finished no micro-batch: it counts for nothing
            return np.zeros(params.numel(), np.float32), np.zeros(buffers.numel(), np.float32), 0, None, None
        x, y = self.stream.next(units)
        grad, buffer_delta, loss = self.engine.gradient(params, buffers, x.to(self.device), y.to(self.device))
        grad, buffer_delta = grad.cpu(), buffer_delta.cpu()
        if (scale := reply.get("scale", 1.0)) != 1.0:  # sync.balance: weighted by samples in the round
            grad = grad * scale
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
        mixing = self.mixing if reply.get("changed") else 0.0  # an overlapped result keeps part of the local steps
        local.pull(unpack(reply["params"], fresh, self.slices, local.params.numel()), fresh, mixing)
        buffers = as_tensor(reply["buffers"]).to(self.device)
        x, y = self.stream.next(reply.get("batch"))
        grad, buffer_delta, loss = self.engine.gradient(local.params.to(self.device), buffers, x.to(self.device),
                                                        y.to(self.device))
        grad, buffer_delta = grad.cpu(), buffer_delta.cpu()
        local.step(grad)
        grad_mask = tuple(p and f for p, f in zip(plan, fresh))
        delta_mask = tuple(p and not f for p, f in zip(plan, fresh))
        scale = reply.get("scale", 1.0)  # sync.balance: weighted by samples in the round
        sent_grad, grad_bytes = self._encode(self.codec, grad * scale if scale != 1.0 else grad, grad_mask)
        sent_delta, delta_bytes = (torch.zeros_like(grad), 0)
        if any(delta_mask):
            change = local.change()
            sent_delta, delta_bytes = self._encode(self.delta_codec, change * scale if scale != 1.0 else change,
                                                   delta_mask)
        sim = {"delta": pack(sent_delta, delta_mask, self.slices), "grad_mask": grad_mask, "delta_mask": delta_mask,
               "clock": reply["clock"]}
        buffer_bytes = 0 if reply.get("periodic") and not any(plan) else 4 * buffer_delta.numel()
        nbytes = grad_bytes + delta_bytes + buffer_bytes
        return pack(sent_grad, grad_mask, self.slices), buffer_delta.numpy(), nbytes, loss, sim

    def _period_compute(self, reply: dict[str, Any],
                        steps: int) -> tuple[np.ndarray, np.ndarray, int, float, dict[str, Any]]:
        """sync.balance = "steps" (as the sim backend's _period_push): take the averaged model, ``steps`` local
        steps, then send the whole change, weighed by steps."""
        local = self.local
        assert local is not None
        everything, nothing = (True,) * len(self.slices), (False,) * len(self.slices)
        local.pull(unpack(reply["params"], tuple(reply["fresh"]), self.slices, local.params.numel()),
                   tuple(reply["fresh"]))
        buffers = as_tensor(reply["buffers"]).to(self.device)
        losses = []
        for _ in range(steps):
            x, y = self.stream.next()
            grad, buffer_delta, loss = self.engine.gradient(local.params.to(self.device), buffers, x.to(self.device),
                                                            y.to(self.device))
            local.step(grad.cpu())
            losses.append(loss)
        change = local.change() * reply.get("scale", 1.0)
        sent, nbytes = self._encode(self.delta_codec, change, everything)
        sim = {"delta": pack(sent, everything, self.slices), "grad_mask": nothing, "delta_mask": everything,
               "clock": reply["clock"]}
        return (pack(change, nothing, self.slices), buffer_delta.cpu().numpy(), nbytes + 4 * buffer_delta.numel(),
                sum(losses) / len(losses), sim)

    def _encode(self, codec: GradientCodec | None, vector: torch.Tensor,
                send: tuple[bool, ...]) -> tuple[torch.Tensor, int]:
        """The tensors marked in ``send``, compressed if a compressor is configured, and their bytes."""
        if codec is not None:
            return codec.encode(vector, self.density, send)
        return vector, 4 * sum(sl.stop - sl.start for sl, take in zip(self.slices, send) if take)

    def _combined(self) -> bool:
        """Push and the next pull in one call: whenever the pull is the plain parameter vector (not SIM's or
        local SGD's partial one, not through in-network aggregation)."""
        return self.cfg.backend.combined_pull and self.local is None and self.ina is None

    async def _push(self, route: Route, version: int, grad: np.ndarray | None, delta: np.ndarray,
                    nbytes: int, sim: dict[str, Any] | None = None, work: tuple[float, int] | None = None,
                    loss: float | None = None) -> tuple[dict[str, Any], float, float] | None:
        """Upload (link-padded), re-sending to the new server if this worker moved; (reply, wait_s, comm_s).

        With ``_combined`` the reply also carries the next iteration's pull, kept in ``self._next``.
        """
        pad = self.push_link.seconds(nbytes) - self._push_estimate
        comm = max(pad, 0.0)
        if self.overlap and sim is not None and any(sim["delta_mask"]):  # sent now, its time spent beside the steps
            self._uploads[sim["clock"]] = asyncio.get_running_loop().create_task(self._upload(max(pad, 0.0)))
            comm = pad = 0.0
        if pad > 0:
            await asyncio.sleep(pad)
        if self.ina is not None:  # the gradient goes through the data plane; the push below only counts it
            start = time.perf_counter()
            if not await self.ina.push(version, grad, lambda: self._stopping):
                return None
            comm += time.perf_counter() - start
            grad = None
        moved_away = False  # staleness is only defined on the server (the process) it pulled from

        combined = self._combined()

        def push(target: Route) -> Any:
            nonlocal moved_away
            moved_away = moved_away or target.handle._actor_id != route.handle._actor_id
            return target.handle.push.remote(self.w, None if moved_away else version, grad, delta, sim, combined, work,
                                             loss)

        answered = await self._routed(push)
        if answered is None:
            return None
        target, reply, moved_s, elapsed = answered
        ahead = reply.pop("next", None)
        if ahead is not None:  # the next pull came with this push: split its gate wait out of the call's time
            elapsed -= ahead["wait_s"]
            if ahead["status"] == OK:
                pad = self.link.seconds(ahead.get("nbytes", self.download_bytes))
                if pad > 0:
                    await asyncio.sleep(pad)
                self._next = (target, ahead, ahead["wait_s"], pad)
            elif ahead["status"] == STOP:
                self._stopping = True
        self._push_estimate = 0.8 * self._push_estimate + 0.2 * elapsed
        return reply, moved_s, comm + elapsed

    async def _iteration(self) -> bool:
        pulled, self._next = self._next or await self._pull(), None
        if pulled is None:
            return False
        route, reply, waited, pull_s = pulled
        units, target = self._plan(reply)
        start = time.perf_counter()
        grad, delta, nbytes, loss, sim = self._compute(reply, units)
        real = time.perf_counter() - start
        compute = real
        if target is not None:
            if target > real:
                await asyncio.sleep(target - real)
            compute = max(target, real)
        if "deadline" in reply and target is None:  # unemulated: the next cut goes by the last seconds per sample;
            # having done nothing, it guesses twice as fast, so a worker that sped up is measured again soon
            self._batch_s = real * self.cfg.data.batch_size / units if units else self._batch_s / 2
        work = None if units is None else (compute, units)
        pushed = await self._push(route, reply["version"], grad, delta, nbytes, sim, work, loss)
        if pushed is None:
            return False
        answer, push_wait, push_s = pushed
        self._records.append({
            "t": round(time.time() - self.t0, 6), "worker": self.w, "server": self.route.server if self.route else 0,
            "clock": answer["clock"], "staleness": answer["staleness"], "compute_s": round(compute, 6),
            "compute_real_s": round(real, 6), "wait_s": round(waited + push_wait, 6),
            "comm_s": round(pull_s + push_s, 6), "pull_s": round(pull_s, 6),
            "loss": None if loss is None else round(loss, 6), "bytes_up": nbytes,
            "bytes_down": reply.get("nbytes", self.download_bytes),
            **({"steps" if "steps" in reply else "batch": units} if work else {}),
        })
        return True
