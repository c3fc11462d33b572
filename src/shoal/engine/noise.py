"""The gradient noise scale of a run, measured from the gradients each synchronous round averages.

McCandlish et al. (2018, "An empirical model of large-batch training")
show that the steps to a given loss fall with the batch B as
``S = S_min (1 + B_noise / B)``, where the simple noise scale
``B_noise = tr(Sigma) / |G|^2`` compares the per-sample gradient variance
with the true gradient's squared norm. A round of n workers, each with a
batch of b samples, gives both for free: with ``g_i`` their gradients and
``g`` the mean, ``E|g_i|^2 = |G|^2 + tr(Sigma)/b`` and
``E|g|^2 = |G|^2 + tr(Sigma)/(n b)``; solving per round and summing over
rounds before dividing (the paper's advice: the ratio of two noisy means,
not the mean of noisy ratios) estimates B_noise in samples.

shoal.whatif uses it to say how many iterations one worker fewer needs for
the same progress; the summary reports it (``gradient_noise_scale``), a
batch size near it being the efficient one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class NoiseScale:
    """Sums of the per-round estimates of |G|^2 and tr(Sigma); their ratio is B_noise (samples)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.true_norm = 0.0  # sum over rounds of the |G|^2 estimates
        self.trace = 0.0  # sum over rounds of the tr(Sigma) estimates
        self.rounds = 0

    def add(self, grads: list[torch.Tensor]) -> None:
        """One synchronous round's gradients, each the mean over ``batch_size`` samples (fewer than 2: nothing)."""
        n = len(grads)
        if n < 2:
            return
        small = sum(float(g.double().pow(2).sum()) for g in grads) / n
        mean = grads[0].double().clone()
        for g in grads[1:]:
            mean += g.double()
        big = float((mean / n).pow(2).sum())
        self.true_norm += (n * big - small) / (n - 1)
        self.trace += self.batch_size * n * (small - big) / (n - 1)
        self.rounds += 1

    def state(self) -> dict[str, float]:
        """The sums, for a checkpoint (JSON floats round-trip exactly)."""
        return {"true_norm": self.true_norm, "trace": self.trace, "rounds": self.rounds}

    def restore(self, state: dict[str, float]) -> None:
        self.true_norm, self.trace, self.rounds = state["true_norm"], state["trace"], int(state["rounds"])

    @property
    def value(self) -> float | None:
        """B_noise in samples, or None before a round whose gradients' mean had a positive estimated norm."""
        if self.rounds == 0 or self.true_norm <= 0:
            return None
        return max(0.0, self.trace / self.true_norm)


def iterations_with_fewer(iterations: int, workers: int, fewer: int, batch_size: int, noise_scale: float) -> int:
    """Iterations ``fewer`` workers (batch ``batch_size`` each, under BSP) need for the progress ``workers`` made
    in ``iterations``: rounds scale as ``1 + B_noise / B`` with the global batch B (McCandlish et al.), between
    the same rounds (no noise) and the same samples (all noise)."""
    rounds = iterations / workers
    ratio = (1 + noise_scale / (fewer * batch_size)) / (1 + noise_scale / (workers * batch_size))
    return max(1, round(fewer * rounds * ratio))
