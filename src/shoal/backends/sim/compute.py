"""The `sim` backend's computation: what a worker computes at the start of its compute time and sends at the end.

A worker asks for its gradient when its compute time starts
(backends/sim/lazy.py: computed at once, or batched with every other
request pending when the first result is needed) and builds its push when
that time has passed: the sample weight, the encoder's error feedback, SIM's
and local SGD's local step and what they send. Whatever the push reads that
may change meanwhile (density, sample weight, learning rate, the schedule of
the worker's server) is recorded at the start, so the push is what the
loop always computed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shoal.backends.sim.lazy import LazyGradients
from shoal.backends.sim.server import Pulled, Push
from shoal.compress import GradientCodec
from shoal.engine.gradients import worker_seed
from shoal.strategy import AggregationSchedule


class SimCompute:
    """Gradients and pushes for ``SimBackend``."""

    def _init_compute(self) -> LazyGradients:
        """The gradients on demand; backend.batched: on, off, or (auto) on where the model lives on a CUDA
        device."""
        choice = self.cfg.backend.batched
        batched = any(p.is_cuda for p in self.setup.engine.model.parameters()) if choice == "auto" else bool(choice)
        return LazyGradients(self.setup.engine, batched, self.cfg.backend.batch_limit, self._batching_fell_back)

    def _batching_fell_back(self, reason: str) -> None:
        """The batched path refused the model: one line in the log and the metrics, the reason in the summary."""
        self.recorder.event("batching_fallback", t=self.env.now, reason=reason)
        if self.progress is not None:
            self.progress({"note": f"batched gradients fall back to the per-worker loop: {reason}"})

    def _seed(self, w: int, step: int = 0) -> int:
        """Worker ``w``'s random numbers (dropout) at its current iteration (``step``: a later local step)."""
        return worker_seed(self.cfg.run.seed, w, self.stats[w].iterations + step)

    def _compute(self, w: int, pulled: Pulled, work: int) -> Callable[[], tuple[Push, float | None]]:
        """Start ``w``'s computation; the call returned gives its push and loss at the end of its compute time:
        the real (compressed) gradient in train mode, sizes only in cost mode. The gradient comes from
        ``self.gradients`` (computed now, or batched with the others pending); what it feeds reads the
        density, scale, learning rate and schedule recorded now, as if it all happened at the start."""
        buffer_bytes = 4 * self.setup.num_buffer_values
        if pulled.params is None:
            grad_bytes = self.codecs[w].nominal_bytes(self.density(w)) if self.codecs else 4 * self.setup.engine.num_params
            return lambda: (Push(None, None, grad_bytes + buffer_bytes), None)
        if self.strategy.balance in ("steps", "deadline"):  # several dependent gradients: the loop computes them
            done = self._period_push(w, pulled, work) if self.strategy.balance == "steps" else \
                self._deadline_push(w, pulled, work)
            return lambda: done
        x, y = self.setup.streams[w].next(work if self.strategy.balance == "batch" else None)
        local = pulled.plan is not None  # a local model's parameters change with its step
        gradient = self.gradients.request(w, pulled.params, pulled.buffers, x, y, mutable=local,
                                          seed=self._seed(w))
        density, scale, lr = self.density(w), self._scale(w), self.lr
        if local:
            schedule = self.server_of(w).schedule

            def finish_local() -> tuple[Push, float | None]:
                grad, buffer_delta, loss = gradient()
                return self._sim_push(w, pulled, grad, buffer_delta, density, scale, lr, schedule), round(loss, 6)
            return finish_local

        def finish() -> tuple[Push, float | None]:
            grad, buffer_delta, loss = gradient()
            if scale != 1.0:
                grad = grad * scale
            grad_bytes = 4 * grad.numel()
            if self.codecs:
                grad, grad_bytes = self.codecs[w].encode(grad, density)
            return Push(grad, buffer_delta, grad_bytes + buffer_bytes), round(loss, 6)
        return finish

    def _sim_push(self, w: int, pulled: Pulled, grad: torch.Tensor, buffer_delta: torch.Tensor, density: float,
                  scale: float, lr: float, schedule: AggregationSchedule) -> Push:
        """SIM: step locally (at ``lr``); send gradients of tensors pulled fresh, local changes of tensors
        re-synchronised now; ``scale`` weighs by samples (sync.balance: the round's mean is the global batch's)."""
        assert pulled.plan is not None and pulled.fresh is not None
        local = self.locals[w]
        local.step(grad, lr)
        grad_mask = tuple(p and f for p, f in zip(pulled.plan, pulled.fresh))
        delta_mask = tuple(p and not f for p, f in zip(pulled.plan, pulled.fresh))
        sent_grad, grad_bytes = self._encode(self.codecs, w, grad if scale == 1.0 else grad * scale, grad_mask,
                                             density)
        sent_delta, delta_bytes = (None, 0)
        if any(delta_mask):
            change = local.change()
            sent_delta, delta_bytes = self._encode(self.delta_codecs, w, change if scale == 1.0 else change * scale,
                                                   delta_mask, density)
        nbytes = grad_bytes + delta_bytes + 4 * self._buffer_values(schedule, pulled.plan)
        return Push(sent_grad, buffer_delta, nbytes, sent_delta, grad_mask, delta_mask, pulled.clock)

    def _encode(self, codecs: list[GradientCodec], w: int, vector: torch.Tensor, send: tuple[bool, ...],
                density: float) -> tuple[torch.Tensor, int]:
        """The tensors marked in ``send``, compressed if a compressor is configured, and their bytes."""
        if codecs:
            return codecs[w].encode(vector, density, send)
        out = torch.zeros_like(vector)
        values = 0
        for sl, take in zip(self.slices, send):
            if take:
                out[sl] = vector[sl]
                values += sl.stop - sl.start
        return out, 4 * values
