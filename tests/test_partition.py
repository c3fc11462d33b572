"""Non-IID shards: data.partition = iid | dirichlet:ALPHA | classes:K."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.config import ConfigError, load_config
from shoal.data import class_histograms, parse_partition, partition_indices

from conftest import FAST


def labels_of(n: int, classes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(200, 2000), workers=st.integers(1, 12), seed=st.integers(0, 2**32),
       spec=st.sampled_from(["iid", "dirichlet:0.1", "dirichlet:1", "dirichlet:100", "classes:2", "classes:5"]))
def test_every_partition_is_disjoint_and_covers_the_training_set(n, workers, seed, spec):
    labels = labels_of(n, 10, seed)
    try:
        shards = partition_indices(labels, workers, seed, spec)
    except ValueError as err:  # classes:K with too few workers to cover the classes is refused, never silent
        assert "covers only" in str(err) or "fewer than" in str(err)
        return
    everything = np.concatenate(shards)
    assert len(shards) == workers
    assert sorted(everything.tolist()) == list(range(n))
    again = partition_indices(labels, workers, seed, spec)  # seeded: the same split every time
    assert all(np.array_equal(a, b) for a, b in zip(shards, again))


def test_classes_k_gives_each_worker_exactly_k_classes():
    labels = labels_of(3000, 10)
    shards = partition_indices(labels, 5, 0, "classes:2")
    held = [sorted(set(labels[s].tolist())) for s in shards]
    assert held == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    with pytest.raises(ValueError, match="covers only 8 of 10"):
        partition_indices(labels, 8, 0, "classes:1")


def test_small_alpha_is_more_skewed_than_large_alpha():
    labels = labels_of(4000, 10)

    def skew(spec: str) -> float:  # mean over workers of the largest class share
        counts = np.array(class_histograms(labels, partition_indices(labels, 8, 3, spec), 10))
        return float((counts.max(1) / counts.sum(1)).mean())

    assert skew("dirichlet:0.1") > 0.5 > skew("dirichlet:1000") > 0.1
    assert skew("dirichlet:1000") == pytest.approx(skew("iid"), abs=0.03)


@pytest.mark.parametrize("spec,message", [("dirichlet:0", "finite number > 0"), ("dirichlet:inf", "finite"),
                                          ("classes:1.5", "whole number"), ("shards", "unknown partition"),
                                          ("iid:3", "unknown partition")])
def test_bad_partitions_are_one_line_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_partition(spec)
    with pytest.raises(ConfigError, match=f"data.partition: .*{message}"):
        load_config(None, [f"data.partition={json.dumps(spec)}"])


def test_a_non_iid_run_reports_each_workers_class_histogram(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "shoal", "train", "--out", str(out), "--quiet",
           *[a for o in FAST + ["data.partition=\"classes:3\"", "run.max_time_s=1"] for a in ("--set", o)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    part = summary["data_partition"]
    assert part["partition"] == "classes:3"
    assert len(part["class_counts"]) == 4
    assert all(sum(1 for c in row if c) == 3 for row in part["class_counts"])


def test_a_partition_that_cannot_cover_the_classes_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "shoal", "train", "--out", str(out),
           *[a for o in FAST + ["data.partition=\"classes:1\""] for a in ("--set", o)]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "covers only 4 of 10" in done.stderr
    assert not out.exists()
