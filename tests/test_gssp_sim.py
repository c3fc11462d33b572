"""GSSP end to end on the sim backend: the split frees the fast tier, confirmation, regrouping, transient
stragglers, staleness, pacing and the busiest group's momentum, in whole runs."""

from __future__ import annotations

import pytest

from shoal.engine.replica import Replica
from shoal.runner import train

from conftest import read_jsonl

TIERS = "cluster.speeds=[1, 1, 1, 1, 8, 8, 8, 8]"


def test_by_default_every_group_server_decays_its_momentum_as_the_busiest_one(fast_config, tmp_path, monkeypatch):
    """The sim backend hands every group server the busiest group's share (the 1x tier: 4 / 0.05 of 4 / 0.05 +
    4 / 0.4 updates per second), and the paper's mode hands none."""
    calls: list[tuple[int, float]] = []
    original = Replica.set_update_share

    def recording(self: Replica, share: float) -> None:
        calls.append((id(self), share))
        original(self, share)

    monkeypatch.setattr(Replica, "set_update_share", recording)
    run = ("sync.scheme=gssp", "cluster.workers=8", TIERS, "run.max_time_s=3", "run.stop_at_target=false")
    train(fast_config(*run), tmp_path / "d")
    after_split = [share for _, share in calls if share < 1.0]
    assert len({server for server, share in calls if share < 1.0}) == 2
    assert after_split and all(share == pytest.approx(8 / 9, rel=0.05) for share in after_split)
    calls.clear()
    train(fast_config(*run, "sync.gssp.group_momentum=server"), tmp_path / "s")
    assert calls == []


def _gssp(fast_config, *extra: str):
    return fast_config("sync.scheme=gssp", "backend.mode=cost", "cluster.workers=8", TIERS,
                       "sync.gssp.profile_iterations=3", "run.max_time_s=30", *extra)


def test_gssp_frees_the_fast_workers_that_bsp_holds_back(fast_config, tmp_path):
    gssp = train(_gssp(fast_config), tmp_path / "g")
    bsp = train(_gssp(fast_config, "sync.scheme=bsp"), tmp_path / "b")
    assert gssp["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    fast_g, fast_b = gssp["per_worker"][0], bsp["per_worker"][0]
    assert fast_g["iterations"] > 6 * fast_b["iterations"]
    assert fast_g["wait_s"] < 0.05 * fast_g["compute_s"] < fast_b["wait_s"]
    # every push after the split is one group update (pushes in flight at the split: at most one per worker)
    assert gssp["exchanges"] > 0
    events = read_jsonl(tmp_path / "g" / "metrics.jsonl")
    split = next(e["t"] for e in events if e["event"] == "groups" and e["reason"] == "profiled")
    before = sum(1 for e in events if e["event"] == "iteration" and e["t"] <= split)
    assert gssp["iterations"] - before - 8 <= sum(gssp["group_updates"]) <= gssp["iterations"] - before + 8


def test_with_confirm_span_the_slow_tier_confirms_its_speed_before_the_split(fast_config, tmp_path):
    gssp = train(_gssp(fast_config, "sync.gssp.confirm_span=96", "sync.gssp.confirm_fraction=1"), tmp_path / "g")
    assert gssp["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    events = read_jsonl(tmp_path / "g" / "metrics.jsonl")
    split = next(e["t"] for e in events if e["event"] == "groups" and e["reason"] == "profiled")
    slow_before = [e for e in events if e["event"] == "iteration" and e["t"] <= split and e["worker"] >= 4]
    assert 4 * 10 <= len(slow_before) <= 4 * 13  # 96 fastest iterations: about 12 of the 8x tier's each
    fast_before = [e for e in events if e["event"] == "iteration" and e["t"] <= split and e["worker"] < 4]
    # nobody waited for them once all were profiled (8x as fast); their 3 profiling iterations were waited for
    assert len(fast_before) > 4 * 8 * (12 - 3) * 0.9


def test_when_half_the_workers_look_slow_the_split_is_taken_on_the_profiles_as_without_confirmation(
        fast_config, tmp_path):
    """Tiers of 1x and 8x: 4 of 8 look slow, so speeds are spread; the default run is the confirm_span = 0 one."""
    default = train(_gssp(fast_config), tmp_path / "d")
    plain = train(_gssp(fast_config, "sync.gssp.confirm_span=0"), tmp_path / "p")
    assert default["groups"] == plain["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for key in ("iterations", "final_accuracy", "group_updates", "exchanges"):
        assert default[key] == plain[key]


def test_sustained_slowdown_is_regrouped_within_bounded_iterations(fast_config, tmp_path):
    cfg = _gssp(fast_config, "cluster.speed_changes=[{worker = 0, at_s = 10.0, speed = 8.0}]")
    train(cfg, tmp_path / "r")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    regroups = [e for e in events if e["event"] == "groups" and e["reason"] == "regroup"]
    assert len(regroups) == 1 and [0, 0, 1] in regroups[0]["moves"]
    after = [e for e in events if e["event"] == "iteration" and e["worker"] == 0 and 10.0 <= e["t"] <= regroups[0]["t"]]
    # the 20th-percentile estimate over a 20-iteration window moves after 17 slow iterations; plus patience
    assert len(after) <= 25


def test_transient_stragglers_do_not_cause_regrouping(fast_config, tmp_path):
    cfg = _gssp(fast_config, "run.max_time_s=40", "cluster.stragglers.probability=0.05",
                "cluster.stragglers.slowdown=4", "cluster.stragglers.duration=3", "sync.gssp.profile_iterations=10")
    summary = train(cfg, tmp_path / "r")
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert sum(1 for e in events if e["event"] == "iteration" and e["worker"] == 0) > 1000
    assert not [e for e in events if e["event"] == "groups" and e["reason"] == "regroup"]
    assert summary["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_by_default_a_uniform_cluster_with_slow_spells_keeps_one_group(fast_config, tmp_path, seed):
    """16 equal workers, 4x spells of 5 iterations: some worker is in a spell when profiled on most seeds;
    the few that look slow confirm their speed (confirm_span, on by default) and never do."""
    cfg = fast_config("sync.scheme=gssp", "backend.mode=cost", "cluster.workers=16", "cluster.profile=uniform",
                      "cluster.stragglers.probability=0.05", "cluster.stragglers.slowdown=4",
                      "cluster.stragglers.duration=5", "run.max_time_s=10", f"run.seed={seed}")
    summary = train(cfg, tmp_path / "r")
    assert summary["groups"] == [list(range(16))]


def test_gssp_trains_and_evaluates_the_mean_of_the_replicas(fast_config, tmp_path):
    cfg = fast_config("sync.scheme=gssp", "cluster.speeds=[1, 1, 4, 4]", "run.max_time_s=3",
                      "run.stop_at_target=false")
    summary = train(cfg, tmp_path / "r")
    assert summary["groups"] == [[0, 1], [2, 3]]
    assert summary["final_accuracy"] > 0.8
    kinds = [e["event"] for e in read_jsonl(tmp_path / "r" / "metrics.jsonl")]
    assert "exchange" in kinds


def test_staleness_counts_every_update_a_received_delta_holds(fast_config, tmp_path):
    """A group of one worker sees no staleness of its own: only its peers' deltas, exchange_every updates each."""
    cfg = _gssp(fast_config, "cluster.workers=4", "cluster.speeds=[1, 8, 8, 8]", "sync.gssp.exchange_every=4",
                "run.max_time_s=10")
    summary = train(cfg, tmp_path / "r")
    assert summary["groups"] == [[0], [1, 2, 3]]
    events = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    split = next(e["t"] for e in events if e["event"] == "groups" and e["reason"] == "profiled")
    seen = {e["staleness"] for e in events if e["event"] == "iteration" and e["worker"] == 0 and e["t"] > split + 1
            and e["staleness"] is not None}
    assert 4 in seen and all(s % 4 == 0 for s in seen)


def test_a_group_does_not_wait_for_its_transient_stragglers(fast_config, tmp_path):
    straggle = ("cluster.stragglers.probability=0.05", "cluster.stragglers.slowdown=4",
                "cluster.stragglers.duration=5", "run.max_time_s=20")
    excused = train(_gssp(fast_config, *straggle), tmp_path / "on")
    waited = train(_gssp(fast_config, *straggle, "sync.gssp.transient_factor=0"), tmp_path / "off")
    for summary in (excused, waited):  # a slow spell while profiling may split a third group, merged later
        assert [g for g in summary["groups"] if g] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    wait = lambda s: sum(p["wait_s"] for p in s["per_worker"])  # noqa: E731
    assert wait(excused) < 0.3 * wait(waited)
    assert excused["iterations"] > 1.2 * waited["iterations"]


def test_paced_groups_let_members_of_steadily_different_speeds_run_at_their_own(fast_config, tmp_path):
    """1x and 1.4x workers share a group (under split_ratio 1.5): plain SSP runs both at the 1.4x pace, paced
    SSP each at its own; the groups and the slow group's pace are the same either way."""
    mixed = ("cluster.speeds=[1, 1, 1.4, 1.4, 8, 8, 8, 8]", "run.max_time_s=20")
    paced = train(_gssp(fast_config, *mixed, "sync.gssp.paced=true"), tmp_path / "paced")
    plain = train(_gssp(fast_config, *mixed, "sync.gssp.paced=false"), tmp_path / "plain")
    for summary in (paced, plain):
        assert summary["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    its = lambda s, w: s["per_worker"][w]["iterations"]  # noqa: E731
    assert its(paced, 0) > 1.3 * its(paced, 2)  # each at its own speed
    assert its(plain, 0) < 1.05 * its(plain, 2)  # the 1x workers held to the 1.4x pace
    assert its(paced, 0) > 1.3 * its(plain, 0)
    assert its(paced, 4) == pytest.approx(its(plain, 4), rel=0.05)
    assert paced["per_worker"][0]["wait_s"] < 0.05 * plain["per_worker"][0]["wait_s"]
