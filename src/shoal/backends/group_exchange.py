"""All-reduce groups' bookkeeping that needs no process group (pure): the inbox of peer deltas, the step scaling.

A GSSP all-reduce group keeps one replica per member, and the replicas must
stay equal: every member applies the same peer deltas and the same optimizer
settings at the same iteration. Deltas and settings reach the members one by
one, at different moments, so each member reports what it has (``DeltaInbox.
available``, the newest settings version) and the group agrees on the least
of every count (one all-reduce, MIN): what every member already holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class DeltaInbox:
    """Peer groups' deltas in the order each sender numbered them; taken only as far as agreed."""

    def __init__(self, groups: int) -> None:
        self.groups = groups
        self._pending: list[dict[int, Any]] = [{} for _ in range(groups)]
        self.taken = [0] * groups  # per sender: how many of its deltas were applied

    def put(self, sender: int, seq: int, item: Any) -> None:
        if seq >= self.taken[sender]:
            self._pending[sender][seq] = item

    def available(self) -> list[int]:
        """Per sender: how many deltas in a row (from the next one to apply) are here."""
        counts = []
        for sender, pending in enumerate(self._pending):
            n = 0
            while self.taken[sender] + n in pending:
                n += 1
            counts.append(n)
        return counts

    def take(self, counts: list[int]) -> list[Any]:
        """The next ``counts[s]`` deltas of every sender ``s`` (what the group agreed on), removed."""
        items = []
        for sender, count in enumerate(counts):
            for _ in range(count):
                items.append(self._pending[sender].pop(self.taken[sender]))
                self.taken[sender] += 1
        return items

    def take_all(self) -> list[Any]:
        """Everything here (the group is stopped and every delivery has arrived: the same on every member)."""
        return self.take(self.available())


@dataclass(frozen=True)
class StepScale:
    """How a group's optimizer steps: the learning rate factor and SGD's momentum.

    A group of ``members`` of ``workers`` steps on the mean of its members'
    gradients, so it scales the learning rate by members / workers: every
    gradient weighs 1 / workers, as on a group server. With GSSP's global
    momentum (``share``: the group's fraction of all updates) the momentum
    decays by m ** (1 / share) per group step and the step is scaled by
    (1 - m_k) / (1 - m), as ``Replica.set_update_share`` does.
    """

    members: int
    workers: int
    momentum: float  # the configured SGD momentum (0 for Adam)
    share: float | None = None

    @property
    def group_momentum(self) -> float:
        if not self.momentum or not self.share or self.share <= 0:
            return self.momentum
        return self.momentum ** (1.0 / min(1.0, self.share))

    @property
    def lr_factor(self) -> float:
        factor = self.members / self.workers
        m, mk = self.momentum, self.group_momentum
        return factor * ((1.0 - mk) / (1.0 - m) if m and mk != m else 1.0)

    def velocity_ratio(self, previous: "StepScale") -> float:
        """What the momentum buffer is multiplied by when ``previous`` becomes this scale, so the distance the
        velocity still moves the model (lr x factor x m_k / (1 - m_k) x buffer) stays the same."""
        if not self.momentum:
            return 1.0
        before = previous.lr_factor * previous.group_momentum / (1.0 - previous.group_momentum)
        after = self.lr_factor * self.group_momentum / (1.0 - self.group_momentum)
        return before / after
