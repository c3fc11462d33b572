"""K-batch sync: exact small cases, the distinct-workers property, and k = N / k = 1 equal BSP / ASP bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shoal
from conftest import FAST
from shoal.sync.kbatch import KBatch


def test_two_of_three_form_an_update_and_only_they_wait_for_it():
    p = KBatch([0, 1, 2], k=2)
    assert p.start_threshold(0) is None  # nothing buffered: start at once
    assert p.on_push(0) == ()
    assert not p.may_start(0) and p.may_start(1) and p.may_start(2)  # 0 waits for its update
    assert p.on_push(1) == (0, 1)
    assert p.may_start(0) and p.may_start(1)  # the update is out
    assert p.on_push(2) == () and p.on_push(0) == (2, 0) and p.updates == 2  # the slow one joins the next


def test_the_default_k_is_half_the_workers_and_a_removed_worker_releases_what_it_held_back():
    assert KBatch(range(5)).k == 3 and KBatch(range(4)).k == 2
    p = KBatch([0, 1, 2], k=3)
    assert p.on_push(0) == () and p.on_push(1) == ()
    assert p.remove(2) == (0, 1)  # two workers are left: two gradients make the update


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), k=st.integers(1, 7), order=st.lists(st.integers(0, 5), min_size=1, max_size=80))
def test_every_update_is_min_k_n_distinct_workers_and_nobody_is_buffered_twice(n, k, order):
    p = KBatch(range(n), k=k)
    pending: list[int] = []
    for pick in order:
        ready = [w for w in range(n) if p.may_start(w)]
        assert ready  # never a deadlock
        worker = ready[pick % len(ready)]
        assert worker not in pending
        released = p.on_push(worker)
        pending.append(worker)
        if released:
            assert sorted(released) == sorted(pending) and len(set(released)) == min(k, n)
            pending = []


TIERED = FAST + ["cluster.speeds=[1, 1, 2, 6]", "run.stop_at_target=false", "run.max_time_s=3"]


@pytest.mark.parametrize("k, same_as", [(4, "bsp"), (1, "asp")])
def test_k_equal_to_the_workers_is_bsp_and_k_1_is_asp_bit_for_bit(tmp_path, k, same_as):
    kbatch = shoal.train(None, out=tmp_path / "k", overrides=TIERED + ["sync.scheme=kbatch", f"sync.kbatch.k={k}"],
                         progress=False).summary
    other = shoal.train(None, out=tmp_path / "o", overrides=TIERED + [f"sync.scheme={same_as}"], progress=False).summary
    assert kbatch["scheme"] == "kbatch"
    for key in ("iterations", "final_accuracy", "best_accuracy", "bytes_up", "elapsed_s"):
        assert kbatch[key] == other[key], key
    assert [w["wait_s"] for w in kbatch["per_worker"]] == [w["wait_s"] for w in other["per_worker"]]


@pytest.mark.slow
def test_half_the_workers_from_the_cli_waits_less_than_bsp(tmp_path):
    out = tmp_path / "k2"
    done = subprocess.run([sys.executable, "-m", "shoal", "train", "-q", "--out", str(out),
                           *[a for o in TIERED + ["sync.scheme=kbatch", "sync.kbatch.k=2"] for a in ("--set", o)]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    k2 = json.loads((out / "summary.json").read_text())
    bsp = shoal.train(None, out=tmp_path / "bsp", overrides=TIERED, progress=False).summary
    assert k2["iterations"] > bsp["iterations"]
    assert sum(w["wait_s"] for w in k2["per_worker"]) < sum(w["wait_s"] for w in bsp["per_worker"])
