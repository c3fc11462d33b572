"""The language workload: stdlib byte windows with whole modules held out, the by_source partition, the byte
transformer, bits per byte, and a short end-to-end run through the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.config import load_config
from shoal.data import load_dataset, partition_indices
from shoal.data import text
from shoal.data.sharding import source_shards
from shoal.engine.task import Task, cross_entropy
from shoal.errors import ConfigError
from shoal.models import build_model, build_module

from conftest import ROOT, read_jsonl


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A small fake standard library: three packages, two top-level modules, a test suite that must be skipped."""
    files = {
        "alpha.py": b"a = 1\n" * 40,
        "beta.py": b"b = 22\n" * 40,
        "pkg/__init__.py": b"# pkg\n" * 30,
        "pkg/core.py": b"def f():\n    return 3\n" * 20,
        "other/mod.py": b"x = [1, 2, 3]\n" * 30,
        "test/test_alpha.py": b"assert True\n" * 100,
        "pkg/tests/test_core.py": b"assert False\n" * 100,
    }
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    monkeypatch.setattr(text, "library_root", lambda: tmp_path)
    return files


def test_windows_are_targets_shifted_by_one_byte_and_never_cross_a_file():
    w = text.windows(b"abcdefghij", 4)
    assert w.tolist() == [list(b"abcde"), list(b"efghi")]  # (10 - 1) // 4 = 2 windows; the tail "j" is dropped
    assert text.windows(b"abc", 4).shape == (0, 5)


def test_the_fake_library_is_split_by_whole_module_and_the_test_suites_are_left_out(library, monkeypatch):
    monkeypatch.setattr(text, "is_held_out", lambda rel, holdout: rel == "beta.py")
    ds = load_dataset("stdlib", seed=0, test_fraction=0.2, options={"context": 8})
    assert set(ds.source_names) == {"alpha", "pkg", "other"}  # beta is held out; test suites are skipped
    held = text.windows(library["beta.py"], 8)
    assert ds.x_test.tolist() == held[:, :-1].tolist() and ds.y_test.tolist() == held[:, 1:].tolist()
    assert torch.equal(ds.x_train[:, 1:].long(), ds.y_train[:, :-1])  # y is x shifted by one byte
    assert ds.num_classes == 256 and ds.input_shape == (8,)
    expected = sum(len(text.windows(library[r], 8)) for r in ("alpha.py", "pkg/__init__.py", "pkg/core.py",
                                                              "other/mod.py"))
    assert len(ds.y_train) == expected and len(ds.sources) == expected


def test_the_holdout_depends_on_no_seed_and_holds_out_about_its_share_of_the_real_library():
    files = text.library_files(text.library_root())
    held = [rel for rel, _ in files if text.is_held_out(rel, 0.05)]
    assert 0.02 < len(held) / len(files) < 0.09
    a = load_dataset("stdlib", seed=0, test_fraction=0.2, options={"max_bytes": 200_000})
    b = load_dataset("stdlib", seed=7, test_fraction=0.5, options={"max_bytes": 200_000})
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.x_train, b.x_train)
    assert len(a.y_test) == 5000 and 190_000 / 64 < len(a.y_train) < 260_000 / 64
    train_text = {bytes(row.tolist()) for row in a.x_train[:2000]}
    assert not train_text & {bytes(row.tolist()) for row in a.x_test}  # no held-out window is a training window


def test_bad_data_and_model_options_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"data.options: unknown option contxt; it takes context, max_bytes"):
        load_dataset("stdlib", seed=0, test_fraction=0.2, options={"contxt": 8})
    with pytest.raises(ConfigError, match="data.options.context"):
        load_dataset("stdlib", seed=0, test_fraction=0.2, options={"context": 1})
    with pytest.raises(ConfigError, match="data.options: unknown option context; it takes none"):
        load_dataset("digits", seed=0, test_fraction=0.2, options={"context": 8})
    with pytest.raises(ConfigError, match="model.options: unknown option depth; it takes layers, width, heads"):
        build_model("transformer", (16,), 256, options={"depth": 2})
    with pytest.raises(ConfigError, match="width 30 must be a multiple of heads 4"):
        build_model("transformer", (16,), 256, options={"width": 30})
    with pytest.raises(ConfigError, match="token windows"):
        build_model("transformer", (1, 8, 8), 10)


def test_by_source_gives_each_worker_whole_sources_and_every_sample_once():
    sources = np.array([0] * 50 + [1] * 30 + [2] * 20 + [3] * 20 + [4] * 5)
    shards = source_shards(sources, 3, seed=0)
    owned = [set(sources[s].tolist()) for s in shards]
    assert sorted(len(s) for s in shards) == [35, 40, 50]  # largest first to the emptiest: 50 | 30+5 | 20+20
    assert all(not (a & b) for i, a in enumerate(owned) for b in owned[i + 1:])
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(len(sources)))
    with pytest.raises(ValueError, match="5 sources for 6 workers"):
        source_shards(sources, 6, seed=0)
    with pytest.raises(ValueError, match="records each sample's source"):
        partition_indices(sources, 2, 0, "by_source")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=12, max_size=200), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_by_source_is_a_partition_into_disjoint_source_sets(labels, workers, seed):
    sources = np.array(labels)
    if len(np.unique(sources)) < workers:
        return
    shards = partition_indices(np.zeros(len(sources)), workers, seed, "by_source", sources)
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(len(sources)))
    owned = [set(sources[s].tolist()) for s in shards]
    assert all(owned) and sum(map(len, owned)) == len(set(labels))


def test_the_transformer_is_causal_and_sized_as_documented():
    torch.manual_seed(0)
    model = build_model("transformer", (16,), 256)
    x = torch.randint(0, 256, (2, 16), dtype=torch.uint8)
    changed = x.clone()
    changed[:, 10] += 1
    out, out2 = model(x), model(changed)
    assert out.shape == (2, 16, 256)
    assert torch.allclose(out[:, :10], out2[:, :10], atol=1e-6) and not torch.allclose(out[:, 10:], out2[:, 10:])
    small = sum(p.numel() for p in build_model("transformer", (64,), 256).parameters())
    gpu = build_module("transformer", (128,), 256, options={"layers": 4, "width": 256, "heads": 8})
    assert 120_000 < small < 200_000 and 3_000_000 < sum(p.numel() for p in gpu.parameters()) < 3_600_000


def test_bits_per_byte_is_the_cross_entropy_in_bits():
    cfg = load_config(None, ['task.metric="bits_per_byte"'])
    task = Task.from_config(cfg.task)
    logits, target = torch.randn(3, 5, 256), torch.randint(0, 256, (3, 5))
    ev = task.judge([logits], [target])
    assert ev.value == pytest.approx(float(cross_entropy(logits, target)) / math.log(2))
    assert not cfg.task.higher
    with pytest.raises(ConfigError, match="bits_per_byte is computed from the cross-entropy"):
        Task.from_config(load_config(None, ['task.metric="bits_per_byte"', 'task.loss="mse"']).task)


LM_SMALL = ["data.options={context = 32, max_bytes = 300000, test_windows = 200}", "cluster.workers=4",
            "model.options={layers = 1, width = 32, heads = 2}", "run.max_iterations=240", "run.eval_every_s=0.5",
            "run.max_time_s=30", "run.stop_at_target=false"]


def evals(run_dir) -> list[float]:
    return [e["value"] for e in read_jsonl(run_dir / "metrics.jsonl") if e["event"] == "eval"]


@pytest.mark.parametrize("partition", ["iid", "by_source"])
def test_the_example_config_trains_through_the_cli_and_its_loss_falls(tmp_path, partition):
    args = [arg for s in LM_SMALL + [f"data.partition={partition}"] for arg in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "shoal", "train", "--config", str(ROOT / "examples/stdlib_lm.toml"),
                           *args, "--out", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    values = evals(tmp_path / "run")
    assert summary["iterations"] >= 240 and values[0] > 7.5 and values[-1] < values[0] - 2.0
    held = summary["data_partition"]["sources"]
    disjoint = sum(map(len, held)) == len(set().union(*map(set, held)))
    assert len(held) == 4 and disjoint == (partition == "by_source")


@pytest.mark.slow
def test_a_comparison_on_the_language_model_reports_bits_per_byte(tmp_path):
    sets = [arg for s in LM_SMALL[:3] + ["run.max_iterations=64", "run.eval_every_iterations=16", "run.target=7.0"]
            for arg in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "shoal", "compare", "--config", str(ROOT / "examples/stdlib_lm.toml"),
                           "--schemes", "bsp,asp", *sets, "--out", str(tmp_path / "cmp"), "-q"], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert data["metric"] == "bits_per_byte" and data["target"] == 7.0
    assert all(r["final_metric"] < 8 for r in data["rows"])
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert "time to 7 bits per byte" in page and "final bits per byte" in page and "final accuracy" not in page
