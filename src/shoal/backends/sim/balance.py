"""The `sim` backend's side of work sized to speed (``sync.balance``, docs/balance.md).

The pure ``WorkBalancer`` (sync/balance.py) decides each worker's batch size,
local steps or the round's deadline; this mixin asks it at the start of an
iteration, turns the answer into compute seconds and a push (a period of
local steps, or the micro-batches done by the deadline), and feeds it what
each delivery measured.
"""

from __future__ import annotations

import torch

from shoal.backends.sim.server import Pulled, Push, SimServer
from shoal.backends.work import deadline_cut


class SimBalance:
    """Per-worker work for ``SimBackend``: planned before compute, profiled after delivery."""

    def _plan_work(self, w: int, batch_s: float) -> tuple[int, float]:
        """``w``'s work this iteration and its compute seconds, when one plain batch takes it ``batch_s``.

        The work is its batch size (sync.balance = "batch"), its local steps
        ("steps"), the samples it completes before the round's deadline
        ("deadline": whole micro-batches, the rest of its batch dropped), or
        data.batch_size.
        """
        if self.balancer is None:
            return self.cfg.data.batch_size, batch_s
        if self.strategy.balance != "deadline":
            work = self.balancer.size(w)
            return work, batch_s * self.strategy.compute_factor(work)
        deadline = self.balancer.deadline(self._members(self.server_of(w)), self.cfg.balance.deadline)
        return deadline_cut(batch_s, deadline, self.cfg.data.batch_size, self.cfg.balance.micro_batch)

    def _members(self, server: SimServer) -> list[int]:
        """The workers whose rounds ``server`` gates (a GSSP group, or everyone still present)."""
        return self.gssp.groups[self.servers.index(server)] if self.gssp else server.policy.workers

    def _scale(self, w: int) -> float:
        """What ``w``'s mean gradient is multiplied by so a round's 1/N sum is the mean over its global batch."""
        return 1.0 if self.balancer is None else self.balancer.scale(w, self._members(self.server_of(w)))

    def _balance(self, w: int, server: SimServer, applied: int, compute: float, work: int) -> None:
        """Profile ``w``'s seconds per unit of work; at the end of a round, resize its group if that pays."""
        assert self.balancer is not None
        if self.strategy.balance == "deadline":  # nothing to resize: the deadline follows the profiles by itself
            if work == self.cfg.data.batch_size:  # a cut-off batch tells only how slow it was at least
                self.balancer.observe(w, compute, work)
            return
        self.balancer.observe(w, compute, work)
        members = self._members(server)
        if applied and self.balancer.rebalance(members):
            self.recorder.event("balance", t=self.env.now, group=self.servers.index(server),
                                sizes={str(m): self.balancer.size(m) for m in members})

    def _deadline_push(self, w: int, pulled: Pulled, samples: int) -> tuple[Push, float | None]:
        """sync.balance = "deadline": the mean gradient of the samples done in time; the server weighs it by them.
        A worker that finished no micro-batch sends nothing and counts for nothing in the round."""
        if samples == 0:
            return Push(torch.zeros_like(pulled.params), None, 0, samples=0), None
        x, y = self.setup.streams[w].next(samples)
        grad, buffer_delta, loss = self.setup.engine.gradient(pulled.params, pulled.buffers, x, y, self._seed(w))
        grad_bytes = 4 * grad.numel()
        if self.codecs:
            grad, grad_bytes = self.codecs[w].encode(grad, self.density(w))
        nbytes = grad_bytes + 4 * self.setup.num_buffer_values
        return Push(grad, buffer_delta, nbytes, samples=samples), round(loss, 6)

    def _period_push(self, w: int, pulled: Pulled, steps: int) -> tuple[Push, float]:
        """sync.balance = "steps": ``steps`` local steps from the pulled model, then the change, weighted by steps."""
        local = self.locals[w]
        losses = []
        for step in range(steps):
            x, y = self.setup.streams[w].next()
            grad, buffer_delta, loss = self.setup.engine.gradient(local.params, pulled.buffers, x, y,
                                                                  self._seed(w, step))
            local.step(grad)
            losses.append(loss)
        everything = (True,) * len(self.slices)
        change = local.change() * self._scale(w)
        sent, nbytes = self._encode(self.delta_codecs, w, change, everything, self.density(w))
        push = Push(None, buffer_delta, nbytes + 4 * self.setup.num_buffer_values, sent, (False,) * len(self.slices),
                    everything, pulled.clock)
        return push, round(sum(losses) / len(losses), 6)
