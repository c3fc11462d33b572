"""A user's own model, data, loss and metric by import path (python:FILE.py:FUNCTION), end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import shoal
from conftest import FAST, ROOT

MODEL = """
from torch import nn

def build(input_shape, num_classes, width=24):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(__import__("math").prod(input_shape)), width), nn.ReLU(),
                         nn.Linear(width, num_classes))

def not_a_module(input_shape, num_classes):
    return 42

def wrong_output(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(7, num_classes))
"""

DATA = """
import torch
from torch.utils.data import TensorDataset

def blobs(n=600, dim=6, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g) * 3
    y = torch.randint(0, classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, dim, generator=g)
    cut = n * 4 // 5
    return TensorDataset(x[:cut], y[:cut]), (x[cut:], y[cut:])

def margin_loss(output, target):
    return torch.nn.functional.multi_margin_loss(output, target)

def error_rate(output, target):
    return float((output.argmax(1) != target).float().mean())
"""


@pytest.fixture
def plugins(tmp_path_factory) -> Path:
    """Plug-in files in a temporary folder outside the project (as a user's own code would be)."""
    folder = tmp_path_factory.mktemp("user_code")
    (folder / "my_model.py").write_text(textwrap.dedent(MODEL))
    (folder / "my_data.py").write_text(textwrap.dedent(DATA))
    (folder / "broken.py").write_text("def build(:\n")
    return folder


def shoal_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_a_users_model_file_trains_to_target_and_comes_back(plugins, tmp_path):
    overrides = [f"model.name=\"python:{plugins}/my_model.py:build\"", "model.options={width = 32}"]
    result = shoal.train(shoal.load_config(None, FAST), out=tmp_path / "run", overrides=overrides, progress=False)
    assert result.summary["stop_reason"] == "target_reached"
    assert result.model[1].out_features == 32  # model.options reached the factory
    from shoal.engine.setup import build_setup

    ds = build_setup(shoal.load_config(tmp_path / "run" / "config.toml")).dataset
    with torch.no_grad():
        accuracy = int((result.model(ds.x_test).argmax(1) == ds.y_test).sum()) / len(ds.y_test)
    assert accuracy == result.summary["final_accuracy"]


def test_relative_plugin_paths_are_stored_absolute(plugins, tmp_path):
    done = shoal_cli("train", "--out", str(tmp_path / "r"), "-q", *[a for o in FAST + [
        "model.name=\"python:my_model.py:build\"", "run.max_time_s=0.5"] for a in ("--set", o)], cwd=plugins)
    assert done.returncode == 0, done.stderr
    config = (tmp_path / "r" / "config.toml").read_text()
    assert f'name = "python:{plugins / "my_model.py"}:build"' in config


def test_data_loss_and_metric_plugins_with_a_lower_is_better_target(plugins, tmp_path):
    overrides = [f"data.name=\"python:{plugins}/my_data.py:blobs\"", "data.options={n = 800}",
                 f"task.loss=\"python:{plugins}/my_data.py:margin_loss\"",
                 f"task.metric=\"python:{plugins}/my_data.py:error_rate\"", "task.higher_is_better=false",
                 "run.target=0.05", "model.name=mlp", "model.hidden=[16]"]
    result = shoal.train(shoal.load_config(None, FAST + ["run.max_time_s=5"]), out=tmp_path / "run",
                         overrides=overrides, progress=False)
    s = result.summary
    assert s["metric"].endswith("my_data.py:error_rate") and s["higher_is_better"] is False and s["target"] == 0.05
    assert s["stop_reason"] == "target_reached" and s["best_metric"] <= 0.05
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert evals[-1]["value"] <= 0.05 and evals[-1]["accuracy"] == pytest.approx(1 - evals[-1]["value"])
    assert len(s["data_partition"]["class_counts"][0]) == 3  # the blobs' three classes


@pytest.mark.parametrize("setting, message", [
    ("model.name=\"python:{d}/missing.py:build\"", "file {d}/missing.py not found"),
    ("model.name=\"python:{d}/broken.py:build\"", "importing {d}/broken.py failed: SyntaxError"),
    ("model.name=\"python:{d}/my_model.py:nope\"", "has no function 'nope'"),
    ("model.name=\"python:{d}/my_model.py:not_a_module\"", "returned int, not a torch.nn.Module"),
    ("model.name=\"python:{d}/my_model.py:wrong_output\"", "a forward pass on input (2, 1, 8, 8) failed"),
    ("model.name=\"python:no_such_module_xyz:build\"", "importing no_such_module_xyz failed: ModuleNotFoundError"),
    ("model.name=\"python:{d}/my_model.py\"", "expected python:FILE.py:FUNCTION"),
    ("task.metric=\"python:{d}/my_data.py:error_rate\"", "task.higher_is_better: say whether"),
    ("task.loss=\"python:{d}/my_data.py:error_rate\"", "must return a scalar tensor"),
])
def test_a_bad_plugin_is_one_line_exit_2_and_writes_nothing(plugins, tmp_path, setting, message):
    out = tmp_path / "run"
    done = shoal_cli("train", "--out", str(out), *[a for o in FAST + [setting.format(d=plugins)]
                                                   for a in ("--set", o)])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert message.format(d=plugins) in lines[0]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["bsp", "gssp"])
def test_the_character_language_model_reaches_a_perplexity_target(tmp_path, scheme):
    """A small version of examples/charlm.toml (shorter context, smaller GRU) under BSP and GSSP."""
    overrides = [f"sync.scheme={scheme}", "cluster.speeds=[1, 1, 3, 3]", "run.target=9.0", "run.max_time_s=40",
                 "data.options={context = 16, train_chars = 40000, test_chars = 4000}",
                 "model.options={embed = 16, hidden = 48}", "cluster.compute_s=0.02"]
    result = shoal.train(ROOT / "examples" / "charlm.toml", out=tmp_path / "lm", overrides=overrides, progress=False)
    s = result.summary
    assert s["metric"] == "perplexity" and s["target"] == 9.0 and s["higher_is_better"] is False
    assert s["stop_reason"] == "target_reached" and s["final_metric"] <= 9.0
    assert s["final_accuracy"] is not None  # next-character accuracy is reported beside the metric


def test_the_example_plugin_model_trains_from_the_cli(tmp_path):
    out = tmp_path / "cnn"
    done = shoal_cli("train", "--out", str(out), "-q", *[a for o in FAST + [
        'model.name="python:examples/plugins/small_cnn.py:build"', "model.options={width = 8}",
        "run.max_time_s=10"] for a in ("--set", o)], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "target_reached"
    model = shoal.load_model(out)
    assert model[0].out_channels == 8


# -- a user's own compressor and scheme (python:FILE.py:CLASS) -------------------------------------------------

INT8 = f"python:{ROOT}/examples/plugins/int8_quantizer.py:Int8Quantizer"
QSSP = f"python:{ROOT}/examples/plugins/quantile_ssp.py:QuantileSSP"
TIERED = FAST + ["cluster.speeds=[1, 1, 2, 6]", "run.stop_at_target=false", "run.max_time_s=3"]


@pytest.mark.slow
def test_a_plugin_compressor_trains_from_the_cli_and_sends_a_quarter_of_the_bytes(tmp_path):
    runs = {}
    for name, extra in (("dense", []), ("int8", [f'compression.method="{INT8}"', "compression.options={levels = 127}"])):
        out = tmp_path / name
        done = shoal_cli("train", "--out", str(out), "-q", *[a for o in TIERED + extra for a in ("--set", o)])
        assert done.returncode == 0, done.stderr
        runs[name] = json.loads((out / "summary.json").read_text())
    dense, int8 = runs["dense"], runs["int8"]
    per_iteration = [r["bytes_up"] / r["iterations"] for r in (dense, int8)]
    assert per_iteration[1] / per_iteration[0] == pytest.approx(0.25, abs=0.01)  # int8 values + one scale per tensor
    assert int8["best_accuracy"] > 0.5  # it trains


def test_a_plugin_scheme_at_quantile_0_is_ssp_bit_for_bit_and_at_the_median_waits_less(tmp_path):
    runs = {}
    for name, overrides in (("ssp", ["sync.scheme=ssp", "sync.ssp.staleness=1"]),
                            ("q0", [f'sync.scheme="{QSSP}"', "sync.options={staleness = 1, quantile = 0.0}"]),
                            ("median", [f'sync.scheme="{QSSP}"', "sync.options={staleness = 1, quantile = 0.5}"])):
        runs[name] = shoal.train(None, out=tmp_path / name, overrides=TIERED + overrides, progress=False).summary
    assert runs["q0"]["scheme"] == QSSP
    for key in ("iterations", "final_accuracy", "bytes_up", "elapsed_s"):
        assert runs["q0"][key] == runs["ssp"][key], key
    waited = {name: sum(w["wait_s"] for w in s["per_worker"]) for name, s in runs.items()}
    assert waited["median"] < waited["ssp"] and runs["median"]["iterations"] > runs["ssp"]["iterations"]


@pytest.mark.parametrize("setting, message", [
    (f'sync.scheme="{INT8}"', "Int8Quantizer is not a shoal.sync.SyncPolicy subclass"),
    (f'compression.method="{QSSP}"', "QuantileSSP is not a shoal.compress.Compressor subclass"),
    ("compression.method=\"python:{d}/my_model.py:build\"", "build is not a shoal.compress.Compressor subclass"),
    (f'compression.method="{INT8}"|compression.options={{levels = 500}}', "raised ValueError: levels must be in 1..127"),
    (f'sync.scheme="{QSSP}"|sync.options={{colour = 1}}', "raised TypeError"),
    ("sync.options={k = 2}", "sync.options: only a python: plug-in takes options, not 'bsp'"),
    ("compression.method=\"python:{d}/missing.py:Codec\"", "file {d}/missing.py not found"),
])
def test_a_bad_plugin_compressor_or_scheme_is_one_line_exit_2(plugins, tmp_path, setting, message):
    out = tmp_path / "run"
    settings = setting.replace("{d}", str(plugins)).split("|")
    done = shoal_cli("train", "--out", str(out), *[a for o in FAST + settings for a in ("--set", o)])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert message.replace("{d}", str(plugins)) in lines[0]
    assert not out.exists()


@pytest.mark.slow
def test_a_plugin_scheme_is_a_compare_base(tmp_path):
    out = tmp_path / "cmp"
    done = shoal_cli("compare", "--schemes", f"ssp,{QSSP}@sync.options.quantile=0.5,bsp+{INT8}", "--out", str(out),
                     *[a for o in TIERED for a in ("--set", o)])
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert [r["scheme"] for r in rows] == ["ssp", "QuantileSSP@sync.options.quantile=0.5", "bsp+Int8Quantizer"]
    assert [r["sync_scheme"] for r in rows] == ["ssp", QSSP, "bsp"]
    assert (out / "bsp+Int8Quantizer" / "summary.json").is_file()
    assert rows[1]["iterations"] > rows[0]["iterations"]  # nobody waits for the slowest


def test_a_plugin_path_in_a_config_file_is_relative_to_that_file_not_to_the_working_directory(tmp_path, monkeypatch):
    """plug/my.toml names plug/my_model.py as "python:my_model.py:build"; read from another folder it still loads,
    while a --set override stays relative to the working directory."""
    from shoal.config import ConfigError, load_config

    plug = tmp_path / "plug"
    plug.mkdir()
    (plug / "my_model.py").write_text("from torch import nn\ndef build(input_shape, num_classes):\n"
                                      "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n")
    (plug / "my.toml").write_text('[model]\nname = "python:my_model.py:build"\n[data]\nname = "digits"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(Path("../plug/my.toml"))
    assert cfg.model.name == f"python:{plug / 'my_model.py'}:build"
    with pytest.raises(ConfigError, match="my_model.py not found"):
        load_config(Path("../plug/my.toml"), ['model.name="python:my_model.py:build"'])


FLAKY_MODEL = """\
from torch import nn


class Flaky(nn.Module):
    calls = 0

    def __init__(self, classes):
        super().__init__()
        self.lin = nn.Sequential(nn.Flatten(), nn.Linear(64, classes))

    def forward(self, x):
        Flaky.calls += 1
        if Flaky.calls > 20:
            raise RuntimeError("my forward broke")
        return self.lin(x)


def build(input_shape, num_classes):
    return Flaky(num_classes)


def broken(input_shape, num_classes):
    return {}["missing"]
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("factory, code, where", [("broken", 2, "user_model.py:23 in broken"),
                                                  ("build", 1, "in your code: {path}:14 in forward")])
def test_a_plugins_own_error_names_its_file_and_line_and_debug_prints_the_traceback(tmp_path, factory, code, where):
    plugin = tmp_path / "user_model.py"
    plugin.write_text(FLAKY_MODEL)
    args = ["train", "--set", "data.name=digits", "--set", f'model.name="python:{plugin}:{factory}"', "-q"]
    for debug in ([], ["--debug"]):
        proc = subprocess.run([sys.executable, "-m", "shoal", *debug, *args, "--out", str(tmp_path / f"run{debug}")],
                              cwd=ROOT, capture_output=True, text=True, timeout=100)
        assert proc.returncode == code, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("error:") and where.format(path=plugin) in last, last
        assert ("Traceback" in proc.stderr) == bool(debug)


def test_a_run_folder_moved_away_from_its_plugin_still_loads(tmp_path):
    """The factory's file is copied into the run; model.json has no unrelated keys; the weights are as readable
    as the rest of the run; load_model also takes a factory of the caller's."""
    import shutil

    from torch import nn

    plugin = tmp_path / "src" / "tiny.py"
    plugin.parent.mkdir()
    plugin.write_text("from torch import nn\ndef build(input_shape, num_classes, width=16):\n"
                      "    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))\n")
    result = shoal.train(overrides=FAST + [f'model.name="python:{plugin}:build"', "model.options={width = 8}",
                                           "run.max_time_s=0.5"], out=tmp_path / "run", progress=False)
    run = tmp_path / "run"
    record = json.loads((run / "model.json").read_text())
    assert "hidden" not in record and record["source"] == "model_source.py"
    assert (run / "model.safetensors").stat().st_mode & 0o777 == (run / "config.toml").stat().st_mode & 0o777
    moved = tmp_path / "elsewhere" / "run"
    shutil.move(str(run), moved)
    shutil.rmtree(plugin.parent)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(shoal.load_model(moved)(x), result.model(x))

    def mine(input_shape, num_classes, width):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))

    with torch.no_grad():
        assert torch.equal(shoal.load_model(moved, factory=mine)(x), result.model(x))
