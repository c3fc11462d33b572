"""The shared-bandwidth cost model: exact times on small cases."""

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.engine.cost import SharedLink, transfer_time


def _run(flows, capacity_bps):
    env = simpy.Environment()
    link = SharedLink(env, capacity_bps)
    done = {}

    def flow(name, start, nbytes, cap):
        yield env.timeout(start)
        yield link.transfer(nbytes, cap)
        done[name] = env.now

    for name, (start, nbytes, cap) in flows.items():
        env.process(flow(name, start, nbytes, cap))
    env.run()
    return done


def test_transfer_time_is_latency_plus_size_over_bandwidth():
    assert transfer_time(1e9, 8e9, 0.01) == pytest.approx(1.01)


def test_a_lone_flow_runs_at_the_smaller_of_link_and_server():
    assert _run({"a": (0, 1e9, 80e9)}, 8e9)["a"] == pytest.approx(1.0)
    assert _run({"a": (0, 1e9, 4e9)}, 8e9)["a"] == pytest.approx(2.0)


def test_equal_flows_share_the_server_equally():
    done = _run({i: (0, 1e9, 80e9) for i in range(4)}, 8e9)
    assert all(t == pytest.approx(4.0) for t in done.values())


def test_capped_flow_keeps_its_cap_and_the_rest_split_the_remainder():
    done = _run({"a": (0, 1e9, 80e9), "b": (0, 1e9, 80e9), "c": (0, 0.25e9, 1e9)}, 8e9)
    assert done["c"] == pytest.approx(2.0)
    assert done["a"] == pytest.approx(2.25) and done["b"] == pytest.approx(2.25)


def test_late_arrival_slows_the_first_flow_down():
    done = _run({"a": (0, 1e9, 80e9), "b": (0.5, 1e9, 80e9)}, 8e9)
    # a: 0.5 GB alone, then shares: 0.5 GB at 0.5 GB/s -> done at 1.5; b: 0.5 GB shared + 0.5 alone
    assert done["a"] == pytest.approx(1.5)
    assert done["b"] == pytest.approx(2.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.floats(1e3, 1e9), st.sampled_from([1e9, 4e9, 100e9])), min_size=1, max_size=12))
def test_work_conserving_and_never_faster_than_caps(flows):
    capacity = 8e9
    done = _run({i: f for i, f in enumerate(flows)}, capacity)
    total_bytes = sum(b for _, b, _ in flows)
    first_start = min(s for s, _, _ in flows)
    # never faster than the bottleneck allows
    assert max(done.values()) - first_start >= total_bytes * 8 / capacity - 1e-6
    for i, (start, nbytes, cap) in enumerate(flows):
        assert done[i] - start >= nbytes * 8 / min(cap, capacity) - 1e-6


def test_flows_complete_when_the_clock_is_large():
    """Completion tolerates the float spacing of a large `now` (a timer can never re-arm forever)."""
    env = simpy.Environment(initial_time=12345.678901)
    link = SharedLink(env, 10e9)
    done = []
    for i in range(7):
        link.transfer(1234567.0 + i / 3, 10e9 / 3).callbacks.append(lambda e, i=i: done.append(i))
    for _ in range(10_000):
        if len(done) == 7:
            break
        env.step()
    assert sorted(done) == list(range(7))


def test_ring_allreduce_moves_two_n_minus_one_over_n_of_the_data_in_two_n_minus_one_steps():
    from shoal.engine.cost import ring_allreduce_bytes, ring_allreduce_time

    assert ring_allreduce_bytes(1000, 4) == 1500 and ring_allreduce_bytes(1000, 1) == 0
    # 4 workers, 1 MB at 8 Mbit/s: 1.5 MB over each link (1.5 s) + 6 latencies of 1 ms
    assert ring_allreduce_time(1e6, 4, 8e6, 1e-3) == pytest.approx(1.5 + 0.006)
    assert ring_allreduce_time(1e6, 1, 8e6, 1e-3) == 0.0
