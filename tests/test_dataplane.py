"""The GRID data plane: software switches and the PS lose no gradient and count none twice.

The property test runs whole rounds for random plans, gradient sizes,
fragment sizes, memory-array sizes (down to one unit, to force collisions
and a full array), delivery orders and dropped messages, and checks the PS's
sum against the exact sum within the documented bound, and every counter.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.network.dataplane import (
    INT32_MAX,
    Ack,
    Aggregate,
    Envelope,
    Fragment,
    RoundResult,
    Server,
    Switch,
    Worker,
    error_bound,
    exponents,
    fragment_count,
    headroom,
    quantise,
    run_round,
    switch_groups,
)
from shoal.network.dataplane.wire import agree


def exact_sum(gradients: dict[str, np.ndarray]) -> np.ndarray:
    """The correctly rounded float64 sum, value by value."""
    stacked = np.stack([np.asarray(g, dtype=np.float64) for g in gradients.values()])
    return np.array([math.fsum(col) for col in stacked.T])


def grads(n_workers: int, n_values: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.standard_normal(n_values).astype(np.float32) for i in range(n_workers)}


def assert_correct(res: RoundResult, g: dict[str, np.ndarray], assignment: dict[str, str], ps: str, f: int,
                   exponents: str = "aligned") -> None:
    err = np.abs(res.total - exact_sum(g))
    bound = error_bound(g, assignment, ps, f, exponents)
    assert (err <= bound).all(), f"worst excess {np.max(err - bound)} at {np.argmax(err - bound)}"


def assert_consistent(res: RoundResult, g: dict[str, np.ndarray], assignment: dict[str, str], ps: str, f: int) -> None:
    """Every contribution reached the PS exactly once, and the counters add up."""
    n_frag = fragment_count(next(iter(g.values())).size, f)
    groups = switch_groups(assignment, ps)
    for name, c in res.switches.items():
        k = len(groups[name])
        assert c.received == c.aggregated_fragments + c.fallbacks + c.duplicates
        assert c.aggregated_fragments == c.completed * k + c.partial_contributions + c.stale_contributions
    s = res.server
    assert s.contributions == len(g) * n_frag
    assert s.aggregates + s.partial_aggregates <= sum(c.completed + c.partial_flushes for c in res.switches.values())
    assert s.fallback_fragments <= sum(c.fallbacks for c in res.switches.values())
    assert res.transmissions == res.delivered + res.dropped + res.undelivered
    assert res.transmissions >= sum(w.sent + w.resent for w in res.workers.values())
    for w in res.workers.values():
        assert w.sent == n_frag and w.acked <= w.sent


def by_priority(*keys: tuple[str, int]):
    """An order: deliver these (worker, fragment) first, in this order, then the rest in send order."""
    rank = {k: i for i, k in enumerate(keys)}

    def choose(inflight: list[Envelope]) -> int:
        def key(i: int) -> tuple[int, int]:
            m = inflight[i].msg
            return (rank.get((m.worker, m.fragment), len(rank)) if isinstance(m, Fragment) else len(rank), i)
        return min(range(len(inflight)), key=key)
    return choose


# -- quantisation --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 17]))
def test_quantise_keeps_headroom_and_half_unit_error(fan_in, seed, f):
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-40, 38, size=(5, 1))
    v = (rng.standard_normal((5, f)) * scale).astype(np.float32).astype(np.float64)
    v[0] = 0.0
    q, e = quantise(v, fan_in)
    limit = headroom(fan_in)
    assert q.dtype == np.int32 and np.abs(q.astype(np.int64)).max() <= limit
    m = np.abs(v).max(axis=1)
    for i in range(1, 5):
        assert np.abs(v[i] - np.ldexp(q[i].astype(np.float64), e[i])).max() <= math.ldexp(1, int(e[i]) - 1)
        assert m[i] * 2.0 ** -int(e[i]) <= limit < m[i] * 2.0 ** -(int(e[i]) - 1)  # the smallest exponent
    assert (q[0] == 0).all() and e[0] < -1000


def test_exponents_at_exact_powers_and_extremes():
    limit = headroom(1)
    m = np.array([float(limit), 2.0 * limit, 1e-45, 3.4e38, 0.0])
    e = exponents(m, limit)
    assert list(e[:2]) == [0, 1]
    for mi, ei in zip(m[:4], e[:4]):
        assert mi * 2.0 ** -int(ei) <= limit < mi * 2.0 ** -(int(ei) - 1)


def test_sums_at_the_headroom_fill_int32_exactly_without_overflow():
    k = 7
    limit = headroom(k)
    g = {f"w{i}": np.full(4, float(limit)) for i in range(k)}  # every contributor sends q = L
    res = run_round(g, {w: "s" for w in g}, "ps", fragment_size=4)
    assert res.switches["s"].completed == 1 and k * limit <= INT32_MAX
    assert (res.total == k * limit).all()


def test_extreme_magnitudes_in_one_fragment_stay_within_bound():
    g = {"a": np.array([3.4e38, 1.0], np.float32), "b": np.array([1e-45, -1e-30], np.float32),
         "c": np.array([-1e38, 0.0], np.float32)}
    assignment = {"a": "s", "b": "s", "c": "ps"}
    for order in (None, 1, 2):
        res = run_round(g, assignment, "ps", fragment_size=2, order=order)
        assert_correct(res, g, assignment, "ps", 2)


def test_non_finite_gradient_is_refused():
    with pytest.raises(ValueError, match="inf or nan"):
        Worker("w", "ps", 1, 4).fragments(0, np.array([1.0, np.nan]))


# -- the switch really aggregates ------------------------------------------------------


def test_switch_with_three_workers_aggregates_everything():
    g = grads(3, 1000, seed=1)
    assignment = {w: "tor" for w in g}
    res = run_round(g, assignment, "ps", slots=64, fragment_size=64, order=7)
    n_frag = fragment_count(1000, 64)
    c = res.switches["tor"]
    assert c.aggregated_fragments == 3 * n_frag and c.completed == n_frag
    assert c.fallbacks == 0 and c.duplicates == 0
    assert res.server.aggregates == n_frag and res.server.fallback_fragments == 0
    assert res.server.direct_fragments == 0 and res.stale_units == 0
    assert_correct(res, g, assignment, "ps", 64)
    assert_consistent(res, g, assignment, "ps", 64)


def test_mixed_plan_sums_switches_and_direct_workers():
    g = grads(6, 300, seed=2)
    assignment = {"w0": "s0", "w1": "s0", "w2": "s0", "w3": "s1", "w4": "s1", "w5": "ps"}
    res = run_round(g, assignment, "ps", slots=64, fragment_size=16)
    n_frag = fragment_count(300, 16)
    assert res.switches["s0"].completed == res.switches["s1"].completed == n_frag
    assert res.server.direct_fragments == n_frag and res.server.aggregates == 2 * n_frag
    assert_correct(res, g, assignment, "ps", 16)


# -- collisions, a full array, drops, duplicates ------------------------------------------


def test_collision_falls_back_to_the_ps_and_loses_nothing():
    sw = Switch("s", ["a", "b"], slots=4)
    frags = Worker("a", "s", 2, 1).fragments(0, np.arange(5.0))
    assert sw.receive(frags[0]) == []
    out = sw.receive(frags[4])  # fragment 4 hashes to fragment 0's unit; three units are free
    assert out == [frags[4]] and sw.counters.fallbacks_collision == 1 and sw.counters.fallbacks_full == 0

    g = grads(2, 5, seed=3)
    assignment = {"w0": "s", "w1": "s"}
    res = run_round(g, assignment, "ps", slots=4, fragment_size=1, order=by_priority(("w0", 0), ("w0", 4)))
    c = res.switches["s"]
    assert c.fallbacks_collision >= 1 and c.completed >= 1
    assert res.server.fallback_fragments >= 1
    assert_correct(res, g, assignment, "ps", 1)
    assert_consistent(res, g, assignment, "ps", 1)


def test_full_array_falls_back_to_the_ps_and_loses_nothing():
    g = grads(2, 3, seed=4)
    assignment = {"w0": "s", "w1": "s"}
    # two fully associative units; w0's three fragments arrive first: the third finds the array full
    res = run_round(g, assignment, "ps", slots=2, probes=2, fragment_size=1)
    c = res.switches["s"]
    assert c.fallbacks_full >= 1 and c.fallbacks_collision == 0 and c.completed >= 1
    assert_correct(res, g, assignment, "ps", 1)
    assert_consistent(res, g, assignment, "ps", 1)


def test_a_stuck_unit_is_flushed_by_a_resend():
    """b's fragment waits for a, whose contribution fell back: b's resend flushes the partial sum."""
    sw = Switch("s", ["a", "b"], slots=1)
    fa = Worker("a", "s", 2, 1).fragments(0, np.arange(2.0))
    fb = Worker("b", "s", 2, 1).fragments(0, np.arange(2.0))
    assert sw.receive(fa[0]) == [] and sw.receive(fa[1]) == [fa[1]]
    assert len(sw.receive(fb[0])) == 1  # completes fragment 0
    assert sw.receive(fb[1]) == [] and sw.occupied == 1  # waits for a, which went to the PS
    (partial,) = sw.receive(fb[1])  # b resends
    assert isinstance(partial, Aggregate) and not partial.complete and partial.workers == {"b"}
    assert sw.occupied == 0 and sw.counters.partial_flushes == 1


@pytest.mark.parametrize("kind", [Fragment, Aggregate, Ack])
def test_a_dropped_message_is_resent_and_the_sum_is_complete(kind):
    g = grads(4, 40, seed=5)
    assignment = {"w0": "s", "w1": "s", "w2": "s", "w3": "ps"}
    dropped = []

    def drop(env: Envelope) -> bool:
        if not dropped and isinstance(env.msg, kind):
            dropped.append(env)
            return True
        return False

    # a lost ack matters only if its worker resends before the round completes: a short timeout
    res = run_round(g, assignment, "ps", slots=8, fragment_size=8, order=11, drop=drop, timeout=12 if kind is Ack else None)
    assert res.dropped == 1 and sum(w.resent for w in res.workers.values()) >= 1
    assert_correct(res, g, assignment, "ps", 8)
    assert_consistent(res, g, assignment, "ps", 8)


def test_resends_before_acks_are_never_counted_twice():
    g = grads(5, 64, seed=6)
    assignment = {"w0": "s", "w1": "s", "w2": "s", "w3": "ps", "w4": "ps"}
    res = run_round(g, assignment, "ps", slots=4, fragment_size=4, order=3, timeout=20)  # resends before acks
    assert sum(w.resent for w in res.workers.values()) > 20
    assert res.server.duplicates + res.switches["s"].duplicates > 0
    assert_correct(res, g, assignment, "ps", 4)
    assert_consistent(res, g, assignment, "ps", 4)


def test_server_counts_each_worker_once_per_fragment():
    srv = Server("ps", ["a", "b", "c"], n_values=2, fragment_size=2)
    q = np.array([4, 8], np.int32)
    fa = Fragment(0, "s", 0, "a", 3, q, 0)
    assert [x.worker for x in srv.receive(fa)] == ["a"]
    assert [x.worker for x in srv.receive(fa)] == ["a"]  # duplicate: acked again, ignored
    assert srv.counters.duplicates == 1 and srv.counters.contributions == 1
    # a later sum covering a: replaces the fallback part
    srv.receive(Aggregate(0, "s", 0, frozenset({"a", "b"}), q * 2, 0, complete=False))
    assert srv.counters.superseded == 1 and srv.counters.contributions == 2
    # overlapping {a, b} only partly: rejected, only already covered workers acked
    acks = srv.receive(Aggregate(0, "s", 0, frozenset({"b", "c"}), q, 0, complete=False))
    assert [x.worker for x in acks] == ["b"] and srv.counters.overlaps_rejected == 1
    assert not srv.complete(0) and srv.missing(0) == {0: frozenset({"c"})}
    srv.receive(Fragment(0, "s", 0, "c", 3, q, 1))
    assert srv.complete(0) and list(srv.result(0)) == [16.0, 32.0]
    srv.finish_round(0)
    srv.receive(fa)
    assert srv.counters.late == 1


def test_worker_resends_only_what_is_unacknowledged_after_the_timeout():
    w = Worker("a", "s", 2, fragment_size=2, timeout=5.0)
    sent = w.send(0, np.arange(6.0), now=10.0)
    assert len(sent) == 3 and w.next_due() == 15.0
    assert w.due_resends(14.9) == []
    w.on_ack(Ack(0, 1, "a"))
    again = w.due_resends(15.0)
    assert [f.fragment for f in again] == [0, 2] and all(f.attempt == 1 for f in again)
    assert np.array_equal(again[0].values, sent[0].values) and again[0].exp == sent[0].exp
    assert w.next_due() == 25.0  # the second transmission waits twice as long (backoff)
    assert w.due_resends(24.9) == []
    assert [f.attempt for f in w.due_resends(25.0)] == [2, 2] and w.next_due() == 45.0  # then 4x
    w.on_ack(Ack(0, 1, "a"))
    assert w.counters.stale_acks == 1
    w.finish_round(0)
    assert w.unacked == 0 and w.next_due() is None


def test_stale_units_of_an_old_round_are_reclaimed():
    sw = Switch("s", ["a", "b"], slots=1)
    a = Worker("a", "s", 2, 2)
    sw.receive(a.fragments(0, np.ones(2))[0])
    assert sw.occupied == 1
    assert sw.receive(a.fragments(1, np.ones(2))[0]) == [] and sw.counters.stale_released == 1


def test_messages_pickle_for_actors_and_bad_input_is_refused():
    frag = Worker("a", "s", 2, 4).fragments(0, np.ones(6))[1]
    back = pickle.loads(pickle.dumps(frag))
    assert back.values.tolist() == frag.values.tolist() and back.exp == frag.exp
    sw = Switch("s", ["a", "b"], slots=2)
    with pytest.raises(ValueError, match="not one of its workers"):
        sw.receive(Worker("z", "s", 2, 4).fragments(0, np.ones(4))[0])
    with pytest.raises(ValueError, match="quantised for"):
        sw.receive(Worker("a", "s", 3, 4).fragments(0, np.ones(4))[0])
    with pytest.raises(ValueError, match="same workers"):
        run_round({"a": np.ones(2)}, {"b": "ps"}, "ps")


# -- any plan, any order, any losses -----------------------------------------------------


@st.composite
def rounds(draw):
    n_workers = draw(st.integers(1, 6))
    n_switches = draw(st.integers(0, 3))
    nodes = ["ps"] + [f"s{i}" for i in range(n_switches)]
    assignment = {f"w{i}": draw(st.sampled_from(nodes)) for i in range(n_workers)}
    n_values = draw(st.integers(1, 120))
    f = draw(st.sampled_from([1, 3, 8, 64]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    g = {}
    for w in assignment:  # magnitudes far apart between workers and fragments; some zeros
        scale = 10.0 ** rng.integers(-30, 30, size=n_values)
        v = rng.standard_normal(n_values) * scale * (rng.random(n_values) > 0.1)
        g[w] = v.astype(np.float32)
    used = sorted(set(assignment.values()) - {"ps"})
    slots = {s: draw(st.integers(1, 8)) if draw(st.booleans()) else 256 for s in used}
    first_wave = n_workers * fragment_count(n_values, f)
    return dict(
        gradients=g, assignment=assignment, ps="ps", slots=slots, fragment_size=f,
        probes=draw(st.integers(1, 2)),
        order=draw(st.none() | st.integers(0, 2**16)),
        drop=draw(st.frozensets(st.integers(0, 3 * first_wave), max_size=6)),
        timeout=draw(st.none() | st.floats(0.25, 4.0).map(lambda x: x * first_wave + 2)),
        exponents=draw(st.sampled_from(["agreed", "aligned"])),
    )


@settings(max_examples=120, deadline=None)
@given(rounds())
def test_any_plan_order_and_losses_give_the_exact_sum_within_the_bound(case):
    res = run_round(**case)
    g, assignment, f = case["gradients"], case["assignment"], case["fragment_size"]
    assert_correct(res, g, assignment, "ps", f, case["exponents"])
    assert_consistent(res, g, assignment, "ps", f)
    if case["exponents"] == "agreed":
        assert all(c.fallbacks_exponent == 0 for c in res.switches.values())  # every contribution carries the agreed exponent
    if not case["drop"] and case["order"] is None and case["timeout"] is None:
        n_frag = fragment_count(next(iter(g.values())).size, f)
        for name, c in res.switches.items():  # in send order a big array aggregates everything
            if case["slots"][name] >= n_frag:
                assert c.completed == n_frag and c.fallbacks == 0


def test_agreed_exponents_make_the_switch_sum_plain_integers():
    """SwitchML's way: the workers settle each fragment's exponent first, the switch never shifts."""
    rng = np.random.default_rng(5)
    g = {"a": rng.standard_normal(16) * 1e-3, "b": rng.standard_normal(16) * 1e3}  # exponents far apart
    workers = {w: Worker(w, "s", 2, fragment_size=8) for w in g}
    settled = agree([workers[w].proposal(g[w]) for w in g])
    assert (settled == workers["b"].proposal(g["b"])).all()  # the larger magnitude wins every fragment
    frags = {w: workers[w].fragments(0, g[w], settled) for w in g}
    sw = Switch("s", g, slots=4)
    out = [m for i in range(2) for w in g for m in sw.receive(frags[w][i])]
    assert [m.complete for m in out] == [True, True] and sw.counters.fallbacks_exponent == 0
    for i, m in enumerate(out):
        assert m.values.tolist() == (frags["a"][i].values.astype(np.int64) + frags["b"][i].values).tolist()
    with pytest.raises(ValueError, match="below a fragment's own"):
        workers["b"].fragments(0, g["b"], workers["a"].proposal(g["a"]))


def test_a_strict_switch_forwards_a_fragment_at_another_exponent_and_the_round_still_completes():
    g = {"a": np.full(4, 1e-3), "b": np.full(4, 1e3)}
    sw = Switch("s", g, slots=2)
    own = {w: Worker(w, "s", 2, fragment_size=4).fragments(0, g[w])[0] for w in g}  # no agreement
    assert sw.receive(own["a"]) == []
    assert sw.receive(own["b"]) == [own["b"]] and sw.counters.fallbacks_exponent == 1
    aligned = Switch("s", g, slots=2, align=True)  # the software mode shifts instead
    aligned.receive(own["a"])
    assert aligned.receive(own["b"])[0].complete


def test_backoff_bounds_resends_when_the_timeout_is_too_short():
    """A timeout at a quarter of the round time: a constant interval resends every fragment again and
    again while the round drains; doubling the wait caps it at a few resends each."""
    g = grads(8, 4096, seed=3)
    assignment = {w: "s0" if i < 4 else "s1" for i, w in enumerate(sorted(g))}
    clean = run_round(g, assignment, "ps", fragment_size=64, order=1)
    quarter = clean.time / 4
    const = run_round(g, assignment, "ps", fragment_size=64, order=1, timeout=quarter, backoff=1.0)
    backed = run_round(g, assignment, "ps", fragment_size=64, order=1, timeout=quarter)
    for res in (const, backed):
        assert_correct(res, g, assignment, "ps", 64, "agreed")
    assert const.transmissions > 6 * clean.transmissions  # the collapse the backoff is for
    assert backed.transmissions < const.transmissions / 2
    assert backed.transmissions < 4 * clean.transmissions
