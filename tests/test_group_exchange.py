"""All-reduce groups' pure bookkeeping: the inbox every member agrees on, and the group's step scale."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.backends.group_exchange import DeltaInbox, StepScale
from shoal.config import OptimizerConfig
from shoal.engine.replica import Replica


def test_the_inbox_offers_only_deltas_in_a_row_and_takes_what_was_agreed():
    inbox = DeltaInbox(3)
    inbox.put(1, 1, "b1")
    assert inbox.available() == [0, 0, 0]  # sender 1's first delta has not arrived
    inbox.put(1, 0, "b0")
    inbox.put(2, 0, "c0")
    assert inbox.available() == [0, 2, 1]
    assert inbox.take([0, 1, 0]) == ["b0"]  # the group agreed on less than this member holds
    assert inbox.available() == [0, 1, 1] and inbox.taken == [0, 1, 0]
    inbox.put(1, 0, "late copy")  # a sequence number already applied is dropped
    assert inbox.take_all() == ["b1", "c0"] and inbox.available() == [0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_members_that_agree_on_the_least_count_apply_the_same_deltas_in_the_same_order(data):
    """Deliveries reach each member in its own order; at every agreement each takes the group's least count.
    Every member applies exactly the same sequence, and after the last delivery (take_all) all of them."""
    senders = data.draw(st.integers(1, 3))
    sent = [data.draw(st.integers(0, 5)) for _ in range(senders)]
    deliveries = [(s, q) for s in range(senders) for q in range(sent[s])]
    members = [DeltaInbox(senders) for _ in range(data.draw(st.integers(2, 4)))]
    orders = [data.draw(st.permutations(deliveries)) for _ in members]
    applied: list[list[tuple[int, int]]] = [[] for _ in members]
    progress = [0] * len(members)
    for _ in range(data.draw(st.integers(0, 8))):  # interleave deliveries and agreements
        for m, inbox in enumerate(members):
            step = data.draw(st.integers(0, len(deliveries)))
            for s, q in orders[m][progress[m]:progress[m] + step]:
                inbox.put(s, q, (s, q))
            progress[m] = min(len(deliveries), progress[m] + step)
        agreed = [min(counts) for counts in zip(*(inbox.available() for inbox in members))]
        for m, inbox in enumerate(members):
            applied[m] += inbox.take(agreed)
        assert all(a == applied[0] for a in applied)
    for m, inbox in enumerate(members):
        for s, q in orders[m][progress[m]:]:
            inbox.put(s, q, (s, q))
        applied[m] += inbox.take_all()
    assert all(sorted(a) == sorted(deliveries) and a == applied[0] for a in applied)


def test_a_group_scales_its_step_by_its_members_and_by_global_momentum_as_a_group_server_does():
    plain = StepScale(members=2, workers=8, momentum=0.9)
    assert plain.lr_factor == pytest.approx(0.25) and plain.group_momentum == 0.9
    assert StepScale(members=3, workers=8, momentum=0.0, share=0.2).lr_factor == pytest.approx(3 / 8)
    opt = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9)
    replica = Replica(torch.zeros(3), torch.zeros(0), opt)
    for share in (0.05, 0.3, 1.0):
        replica.set_update_share(share)
        scale = StepScale(members=2, workers=8, momentum=0.9, share=share)
        assert scale.group_momentum == pytest.approx(replica.optimizer.param_groups[0]["momentum"])
        assert scale.lr_factor == pytest.approx(0.25 * replica.lr_scale)


@given(st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.integers(1, 8), st.integers(1, 8))
def test_rescaling_the_velocity_keeps_the_distance_it_still_moves_the_model(old_share, new_share, old_n, new_n):
    before = StepScale(old_n, 8, 0.9, old_share)
    after = StepScale(new_n, 8, 0.9, new_share)

    def distance(scale: StepScale, buffer: float) -> float:  # lr x factor x (m_k + m_k^2 + ...) x buffer
        return scale.lr_factor * scale.group_momentum / (1 - scale.group_momentum) * buffer

    assert distance(after, after.velocity_ratio(before)) == pytest.approx(distance(before, 1.0))
    assert StepScale(2, 8, 0.0, new_share).velocity_ratio(StepScale(3, 8, 0.0, old_share)) == 1.0
