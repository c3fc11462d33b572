"""What a worker's iteration computes under ``sync.balance``, the same on both backends (docs/balance.md).

The pure balancer (sync/balance.py) says how much work each worker gets;
these two rules turn its answer into what is computed and how a round
weighs it, so that the ``sim`` and ``ray`` backends cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence


def deadline_cut(batch_s: float, deadline: float, batch_size: int, micro_batch: int) -> tuple[int, float]:
    """``(samples, seconds)`` of a bounded-time round for a worker whose plain batch takes ``batch_s``.

    A worker that finishes its batch by ``deadline`` does all of it; a slower
    one stops at the deadline and contributes the whole micro-batches it
    finished by then (possibly none), so nobody computes past the deadline.
    """
    if batch_s <= deadline:
        return batch_size, batch_s
    done = int(deadline / (batch_s * micro_batch / batch_size)) * micro_batch
    return min(done, batch_size), deadline


def sample_weights(samples: Sequence[int | None]) -> list[float] | None:
    """What each gradient of a round is multiplied by so that their ``1/N`` sum is the mean over all their
    samples (``samples``: how many each is the mean of, None where it does not say); None: every gradient as
    it is; an empty list: the round holds no sample at all."""
    if all(s is None for s in samples):
        return None
    total = sum(s or 0 for s in samples)
    if total == 0:
        return []
    return [(s or 0) * len(samples) / total for s in samples]
