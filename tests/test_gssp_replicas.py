"""The group servers' replicas under GSSP: momentum on a share of the updates, and the own-delta exchange that makes
replicas agree once every delta is delivered (also for a replica rebuilt from a peer)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.config import OptimizerConfig
from shoal.engine.replica import Replica


@pytest.mark.parametrize("share", [1.0, 0.5, 0.1])
def test_momentum_on_a_share_of_updates_moves_each_gradient_as_far(share):
    """A gradient's total displacement is lr / (1 - m) x g whatever the share; the share only shortens its tail."""
    opt = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9)
    r = Replica(torch.zeros(3), torch.zeros(0), opt)
    r.set_update_share(share)
    g = torch.tensor([1.0, -2.0, 0.5])
    r.apply([g], 1.0)
    first = -r.params.detach().clone()
    for _ in range(400):
        r.apply([torch.zeros(3)], 1.0)
    assert torch.allclose(-r.params.detach(), 0.1 / (1 - 0.9) * g, rtol=1e-4)
    assert torch.allclose(first, 0.1 * (1 - 0.9 ** (1 / share)) / (1 - 0.9) * g)
    r.set_lr(0.05)  # a decay keeps the share's scale
    assert r.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * (1 - 0.9 ** (1 / share)) / 0.1)


@pytest.mark.parametrize("before, after", [(0.5, 0.1), (0.1, 0.9), (1.0, 0.25)])
def test_a_share_change_keeps_what_the_velocity_still_moves(before, after):
    """Regrouping changes a server's share; the momentum already built must not be applied at the new step size."""
    opt = OptimizerConfig(name="sgd", lr=0.1, momentum=0.9)
    r = Replica(torch.zeros(3), torch.zeros(0), opt)
    r.set_update_share(before)
    g = torch.tensor([1.0, -2.0, 0.5])
    r.apply([g], 1.0)
    r.apply([torch.zeros(3)], 1.0)
    r.set_update_share(after)
    for _ in range(600):
        r.apply([torch.zeros(3)], 1.0)
    assert torch.allclose(-r.params.detach(), 0.1 / (1 - 0.9) * g, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(0, 10_000), st.sampled_from(["sgd", "adam", "adamw"]))
def test_replicas_agree_once_all_deltas_are_delivered(n_groups, seed, optimizer):
    """Whatever the interleaving of local steps, sends and deliveries, replicas end equal."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = OptimizerConfig(name=optimizer, lr=0.05, momentum=0.9, weight_decay=0.01)
    start = Replica(torch.randn(50, generator=gen), torch.randn(6, generator=gen), opt, track_own=True)
    replicas = [start.clone(opt) for _ in range(n_groups)]
    in_flight: list[tuple[int, tuple[torch.Tensor, torch.Tensor]]] = []

    def send(i: int) -> None:
        delta = replicas[i].take_own_delta()
        in_flight.extend((j, delta) for j in range(n_groups) if j != i)

    for _ in range(60):
        action, i = rng.random(), rng.randrange(n_groups)
        if action < 0.5:
            replicas[i].apply([torch.randn(50, generator=gen)], weight=0.25)
            replicas[i].add_buffer_deltas([torch.randn(6, generator=gen)], weight=0.25)
        elif action < 0.7:
            send(i)
        elif in_flight:
            j, delta = in_flight.pop(rng.randrange(len(in_flight)))
            replicas[j].receive_delta(*delta)
    _deliver_all_and_agree(replicas, send, in_flight)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_a_replacement_from_a_peers_shared_snapshot_agrees_with_the_others_in_the_end(seed):
    """A dead group's replica rebuilt from a peer (Replica.shared_snapshot): once every delta sent is
    delivered, it equals the others. The peer's own unsent delta reaches it once, with the next exchange."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9)
    start = Replica(torch.randn(20, generator=gen), torch.randn(3, generator=gen), opt, track_own=True)
    replicas = [start.clone(opt) for _ in range(3)]
    in_flight: list[tuple[int, tuple[torch.Tensor, torch.Tensor]]] = []

    def step(i: int) -> None:
        replicas[i].apply([torch.randn(20, generator=gen)], weight=0.25)
        replicas[i].add_buffer_deltas([torch.randn(3, generator=gen)], weight=0.25)

    def send(i: int) -> None:
        delta = replicas[i].take_own_delta()
        in_flight.extend((j, delta) for j in range(3) if j != i)

    def play(rounds: int) -> None:
        for _ in range(rounds):
            action, i = rng.random(), rng.randrange(3)
            if action < 0.5:
                step(i)
            elif action < 0.7:
                send(i)
            elif in_flight:
                j, delta = in_flight.pop(rng.randrange(len(in_flight)))
                replicas[j].receive_delta(*delta)

    play(30)
    # replica 1 dies: its unsent updates are lost, copies addressed to it are dropped, the rest arrives
    for j, delta in [(j, d) for j, d in in_flight if j != 1]:
        replicas[j].receive_delta(*delta)
    in_flight.clear()
    step(2)  # the peer holds an own delta it has not sent yet
    replicas[1] = Replica(*replicas[2].shared_snapshot(), opt, track_own=True)
    play(30)
    _deliver_all_and_agree(replicas, send, in_flight)


def _deliver_all_and_agree(replicas: list[Replica], send, in_flight: list) -> None:
    """Every replica sends what it holds, every delta in flight arrives: then all replicas are equal."""
    for i in range(len(replicas)):
        send(i)
    for j, delta in in_flight:
        replicas[j].receive_delta(*delta)
    for other in replicas[1:]:
        assert torch.allclose(other.params.detach(), replicas[0].params.detach(), atol=1e-5)
        assert torch.allclose(other.buffers, replicas[0].buffers, atol=1e-5)
