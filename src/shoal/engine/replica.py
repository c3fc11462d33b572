"""A server's model replica: flat parameters, flat float buffers and an optimizer.

Parameters live in one flat tensor so that snapshots, deltas and transfers
are single copies; per-tensor views come from the layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from shoal.config import OptimizerConfig

#: optimizers that normalise the gradient by its running scale (the step size, not the gradient, carries a weight)
ADAM_FAMILY = ("adam", "adamw")


def torch_optimizer(opt: OptimizerConfig, params: Iterable[torch.Tensor], weight_decay: float) -> torch.optim.Optimizer:
    """The torch optimizer ``opt`` names over ``params``, with ``weight_decay`` given to torch (the replica adds
    an L2 penalty itself and passes 0 here, except for AdamW, whose decay is not a gradient term)."""
    if opt.name == "sgd":
        return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=weight_decay)
    adam = torch.optim.AdamW if opt.name == "adamw" else torch.optim.Adam
    return adam(params, lr=opt.lr, betas=opt.betas, weight_decay=weight_decay)


def clip_mean(total: torch.Tensor, count: int, max_norm: float) -> None:
    """Scale ``total``, the sum of ``count`` gradients, in place so that their mean's L2 norm is at most
    ``max_norm``, with torch's clip_grad_norm_ coefficient (max_norm / (norm + 1e-6), at most 1)."""
    coefficient = max_norm / (float(total.norm()) / count + 1e-6)
    if coefficient < 1.0:
        total.mul_(coefficient)


class Replica:
    """Parameters + optimizer of one server; ``version`` counts changes to the parameters.

    With ``track_own=True`` (GSSP group servers) the replica also accumulates
    its *own* delta: the change caused by its own optimizer steps and buffer
    updates, never the deltas received from peers. Sending only own deltas
    keeps every replica equal to the initial state plus every delivered
    delta, so replicas agree once deltas are delivered.
    """

    def __init__(self, params: torch.Tensor, buffers: torch.Tensor, opt: OptimizerConfig, track_own: bool = False,
                 outer: tuple[float, float] | None = None) -> None:
        self.params = torch.nn.Parameter(params.detach().clone(), requires_grad=False)
        self.buffers = buffers.detach().clone()
        self.weight_decay = opt.weight_decay
        self.lr = opt.lr_at(0.0)  # a warm-up starts below lr; a replica made later is set to the rate then (set_lr)
        self.momentum = opt.momentum if opt.name == "sgd" else 0.0
        self.lr_scale = 1.0
        self.scale_invariant = opt.name in ADAM_FAMILY
        self.decoupled_decay = opt.name == "adamw"
        self.clip_norm = opt.clip_norm
        self.optimizer = self._make_optimizer(opt)
        self.set_lr(self.lr)
        self.outer = outer
        # DiLoCo: Nesterov SGD on the averaged pseudo-gradient, a second optimizer on the same parameters
        self.outer_optimizer = None if outer is None else torch.optim.SGD(
            [self.params], lr=outer[0], momentum=outer[1], nesterov=outer[1] > 0)
        self.version = 0
        self._snapshot: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.own_params: torch.Tensor | None = None
        self.own_buffers: torch.Tensor | None = None
        if track_own:
            self.own_params = torch.zeros_like(self.params.detach())
            self.own_buffers = torch.zeros_like(self.buffers)

    def clone(self, opt: OptimizerConfig) -> "Replica":
        """A new replica with the same state, a fresh optimizer and an empty own delta."""
        return Replica(self.params.detach(), self.buffers, opt, track_own=self.own_params is not None, outer=self.outer)

    def take_own_delta(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The own delta accumulated since the last call (then reset)."""
        assert self.own_params is not None and self.own_buffers is not None, "replica does not track its own delta"
        delta = (self.own_params.clone(), self.own_buffers.clone())
        self.own_params.zero_()
        self.own_buffers.zero_()
        return delta

    def receive_delta(self, params_delta: torch.Tensor, buffers_delta: torch.Tensor) -> None:
        """Add a peer's own delta (it does not become part of this replica's own delta)."""
        with torch.no_grad():
            self.params.add_(params_delta)
        self.buffers.add_(buffers_delta)
        self.version += 1

    def _make_optimizer(self, opt: OptimizerConfig) -> torch.optim.Optimizer:
        # L2 weight decay is added to the weighted gradient in `apply`, not here, so every scheme decays by the
        # same amount per sample (docs/ARCHITECTURE.md, Update weighting). AdamW's decoupled decay is torch's:
        # it shrinks by lr x weight_decay per step, and `apply` scales lr by the step's share like the step.
        return torch_optimizer(opt, [self.params], opt.weight_decay if self.decoupled_decay else 0.0)

    def shared_snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The replica without its own delta not yet sent: what every peer holds of this group's updates.

        A replacement for a dead peer starts from this; the own delta still reaches it with the next
        exchange, so nothing counts twice.
        """
        params, buffers = self.snapshot()
        if self.own_params is None or self.own_buffers is None:
            return params, buffers
        return params - self.own_params, buffers - self.own_buffers

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Read-only copy of the current parameters and buffers (shared per version)."""
        if self._snapshot is None or self._snapshot[0] != self.version:
            self._snapshot = (self.version, self.params.detach().clone(), self.buffers.clone())
        return self._snapshot[1], self._snapshot[2]

    def apply(self, grads: Sequence[torch.Tensor], weight: float, frozen: Sequence[slice] = ()) -> None:
        """One optimizer step worth ``weight * len(grads)`` of a full step (+ weight decay per gradient).

        SGD (with or without momentum) steps on ``weight * sum(grads)``: the
        1/N rule. Adam is scale-invariant, so scaling its gradient would
        cancel; it steps on the mean gradient with the step size scaled by
        ``weight * len(grads)`` instead, so N asynchronous steps of 1/N move
        as far as one synchronous step on N gradients. AdamW's decoupled
        decay follows the scaled step size, so it too decays N steps of 1/N
        about as one full step. With ``clip_norm`` the mean of the gradients
        is clipped first (before weight decay), as DDP's averaged gradient is
        by ``clip_grad_norm_``. ``frozen`` ranges keep
        their parameters and optimizer state untouched (SIM: tensors the
        workers are stepping locally this iteration).
        """
        total = torch.stack(list(grads)).sum(0) if len(grads) > 1 else grads[0].clone()
        share = weight * len(grads)
        if self.clip_norm is not None:
            clip_mean(total, len(grads), self.clip_norm)
        if self.scale_invariant:
            total.div_(len(grads))
            if self.weight_decay and not self.decoupled_decay:
                total.add_(self.params.detach(), alpha=self.weight_decay)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr * share
        else:
            total.mul_(weight)
            if self.weight_decay:
                total.add_(self.params.detach(), alpha=self.weight_decay * share)
        before = self.params.detach().clone() if self.own_params is not None else None
        kept = self._save(frozen)
        self.params.grad = total
        self.optimizer.step()
        self.params.grad = None
        self._restore(kept)
        if before is not None:
            self.own_params.add_(self.params.detach() - before)
        self.version += 1

    def _state_tensors(self) -> list[torch.Tensor]:
        """The parameters and every optimizer state tensor laid out like them (momentum, Adam moments)."""
        state = self.optimizer.state.get(self.params, {})
        extra = [v for v in state.values() if isinstance(v, torch.Tensor) and v.shape == self.params.shape]
        return [self.params.detach(), *extra]

    def _save(self, frozen: Sequence[slice]) -> tuple[list[slice], list[tuple[torch.Tensor, slice, torch.Tensor]]]:
        return list(frozen), [(t, sl, t[sl].clone()) for sl in frozen for t in self._state_tensors()]

    def _restore(self, kept: tuple[list[slice], list[tuple[torch.Tensor, slice, torch.Tensor]]]) -> None:
        frozen, saved = kept
        for tensor, sl, values in saved:
            tensor[sl] = values
        existed = {t.data_ptr() for t, _, _ in saved}
        for tensor in self._state_tensors():  # state the step created: as if the frozen part never stepped
            if tensor.data_ptr() not in existed:
                for sl in frozen:
                    tensor[sl] = 0

    def add_delta(self, deltas: Sequence[torch.Tensor], weight: float,
                  only: Sequence[slice] | None = None) -> torch.Tensor:
        """Move the parameters by ``weight * sum(deltas)`` (SIM, local SGD: the workers' accumulated local changes).

        With an outer optimizer (DiLoCo) ``-weight * sum(deltas)`` is its
        pseudo-gradient instead: one Nesterov SGD step on it. ``only``: the
        outer step touches just these slices (a Streaming DiLoCo fragment),
        whose momentum alone decays, as if every fragment had its own outer
        optimizer. Returns the change it made to the parameters.
        """
        total = torch.stack(list(deltas)).sum(0) if len(deltas) > 1 else deltas[0].clone()
        total.mul_(weight)
        if self.outer_optimizer is not None and only is not None:
            total = self._outer_step_on(total.neg_(), only)
        elif self.outer_optimizer is not None:
            before = self.params.detach().clone()
            self.params.grad = total.neg_()
            self.outer_optimizer.step()
            self.params.grad = None
            total = self.params.detach() - before
        else:
            with torch.no_grad():
                self.params.add_(total)
        if self.own_params is not None:
            self.own_params.add_(total)
        self.version += 1
        return total

    def correct(self, made: torch.Tensor, sent: torch.Tensor) -> None:
        """The workers receive ``sent`` instead of the change ``made`` (a quantised broadcast): hold what they
        hold, ``params - made + sent``, so server and workers agree exactly."""
        with torch.no_grad():
            self.params.add_(sent - made)
        if self.own_params is not None:
            self.own_params.add_(sent - made)

    def _outer_step_on(self, grad: torch.Tensor, only: Sequence[slice]) -> torch.Tensor:
        """Nesterov SGD on the slices ``only`` (torch's update, restricted): the parameters' change."""
        assert self.outer_optimizer is not None
        group = self.outer_optimizer.param_groups[0]
        lr, momentum = group["lr"], group["momentum"]
        state = self.outer_optimizer.state[self.params]
        if momentum and "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(self.params.detach())
        change = torch.zeros_like(grad)
        with torch.no_grad():
            for sl in only:
                step = grad[sl]
                if momentum:
                    buffer = state["momentum_buffer"][sl]
                    buffer.mul_(momentum).add_(step)
                    step = step.add(buffer, alpha=momentum)
                change[sl] = step.mul(-lr)
                self.params[sl] += change[sl]
        return change

    def set_lr(self, lr: float) -> None:
        """Change the learning rate (a step of the decay schedule)."""
        self.lr = lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr * self.lr_scale

    def set_update_share(self, share: float) -> None:
        """Decay SGD momentum on the clock of *all* updates, of which this server applies ``share``.

        One server taking every update decays its momentum by m per update. A
        GSSP group server that takes a fraction ``share`` of them decays by
        m ** (1 / share) per own update and scales its step by
        (1 - m_k) / (1 - m), so every gradient still moves the model by
        lr / (1 - m) in total, over the same wall time as on one server.
        """
        if not self.momentum or share <= 0:
            return
        momentum = self.momentum ** (1.0 / min(1.0, share))
        group = self.optimizer.param_groups[0]
        buffer = self.optimizer.state.get(self.params, {}).get("momentum_buffer")
        if buffer is not None and momentum != group["momentum"]:
            # what the velocity still moves the model by, lr m_k / (1 - m) x buffer, stays the same
            buffer.mul_(group["momentum"] / momentum)
        self.lr_scale = (1.0 - momentum) / (1.0 - self.momentum)
        group["momentum"] = momentum
        group["lr"] = self.lr * self.lr_scale

    def add_buffer_deltas(self, deltas: Sequence[torch.Tensor], weight: float) -> None:
        """Move batch-norm statistics by the weighted sum of the workers' changes."""
        if self.buffers.numel():
            for delta in deltas:
                self.buffers.add_(delta, alpha=weight)
                if self.own_buffers is not None:
                    self.own_buffers.add_(delta, alpha=weight)


def masked_slices(slices: Sequence[slice], mask: Sequence[bool]) -> list[slice] | None:
    """The slices ``mask`` marks, or None when it marks every one (``Replica.add_delta``'s ``only``)."""
    return None if all(mask) else [sl for sl, take in zip(slices, mask) if take]
