"""The Python API (shoal.train, shoal.compare, shoal.load_model) and the model every run writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import shoal
from conftest import FAST
from shoal.config import load_config
from shoal.engine.setup import build_setup


def accuracy_of(model: torch.nn.Module, cfg) -> float:
    """The model's accuracy on the run's own test set (rebuilt from the same seed)."""
    ds = build_setup(cfg).dataset
    with torch.no_grad():
        return int((model(ds.x_test).argmax(1) == ds.y_test).sum()) / len(ds.y_test)


@pytest.mark.parametrize("scheme", ["bsp", "gssp"])
def test_train_returns_the_summary_the_model_and_the_folder(tmp_path, scheme):
    overrides = [f"sync.scheme={scheme}", "cluster.speeds=[1, 1, 4, 4]"]
    result = shoal.train(load_config(None, FAST), out=tmp_path / "run", overrides=overrides, progress=False)
    assert result.run_dir == tmp_path / "run"
    assert result.summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert result.summary["model_file"] == "model.safetensors"
    assert isinstance(result.model, torch.nn.Module)
    # the saved model is the evaluated one (GSSP: the mean of the group replicas): the same accuracy, exactly
    cfg = load_config(tmp_path / "run" / "config.toml")
    assert accuracy_of(result.model, cfg) == result.summary["final_accuracy"]
    again = shoal.load_model(tmp_path / "run")
    assert again.state_dict().keys() == result.model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), result.model.state_dict().values()))


def test_train_takes_a_path_a_dict_or_a_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nname = "mlp"\nhidden = [16]\n[data]\nname = "digits"\n[run]\nmax_time_s = 0.5\n')
    from_path = shoal.train(path, out=tmp_path / "a", progress=False)
    from_dict = shoal.train({"model": {"name": "mlp", "hidden": [16]}, "data": {"name": "digits"},
                             "run": {"max_time_s": 0.5}}, out=tmp_path / "b", progress=False)
    from_cfg = shoal.train(shoal.Config.model_validate({"model": {"name": "mlp", "hidden": [16]},
                                                        "data": {"name": "digits"}, "run": {"max_time_s": 0.5}}),
                           out=tmp_path / "c", progress=False)
    assert from_path.summary["final_accuracy"] == from_dict.summary["final_accuracy"] == \
        from_cfg.summary["final_accuracy"]


def test_bad_input_raises_config_error_and_writes_nothing(tmp_path):
    with pytest.raises(shoal.ConfigError, match="optimizer.lrr: unknown key"):
        shoal.train({"optimizer": {"lrr": 0.1}}, out=tmp_path / "x", progress=False)
    with pytest.raises(shoal.ConfigError, match="expected a path, a dict"):
        shoal.train(42, out=tmp_path / "x", progress=False)  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()
    with pytest.raises(shoal.ConfigError, match="model.safetensors: not found"):
        shoal.load_model(tmp_path)


def test_compare_widens_every_grid_alike(tmp_path):
    data = shoal.compare(schemes="ssp", overrides=FAST + ["run.max_time_s=0.3"], out=tmp_path / "cmp", tune_seeds=1,
                         widen=1, progress=False)
    assert data["widen"] == 1 and data["grids"]["ssp"] == {"sync.ssp.staleness": [0, 1, 3, 8, 13]}
    assert len(data.row("ssp")["tuning"]) == 5


def test_compare_returns_compare_json(tmp_path):
    data = shoal.compare(schemes=["bsp", "localsgd"], overrides=FAST + ["run.max_time_s=0.5"], out=tmp_path / "cmp",
                         progress=False)
    assert [r["scheme"] for r in data["rows"]] == ["bsp", "localsgd"]
    assert (tmp_path / "cmp" / "report.html").exists()
    assert (tmp_path / "cmp" / "bsp" / "model.safetensors").exists()
    assert isinstance(data, shoal.Comparison) and data == json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert data.rows is data["rows"] and data.row("localsgd")["scheme"] == "localsgd"
    assert data.report == tmp_path / "cmp" / "report.html" and data.out == tmp_path / "cmp"
    with pytest.raises(KeyError, match="the rows are bsp, localsgd"):
        data.row("gssp")


def test_a_stopped_compare_raises_interrupted_with_what_finished_and_resume_goes_on(tmp_path, monkeypatch):
    """docs/api.md: a STOP file ends shoal.compare with shoal.comparison.Interrupted once compare.json lists what
    finished; resume=True runs only the rest."""
    from shoal.comparison import Interrupted

    execute = sys.modules["shoal.comparison.execute"]
    asked = iter([False, True])
    monkeypatch.setattr(execute, "stop_requested", lambda out: next(asked, False))
    args = dict(schemes="bsp,localsgd", overrides=FAST + ["run.max_time_s=0.5"], out=tmp_path / "cmp", progress=False)
    with pytest.raises(Interrupted) as stop:
        shoal.compare(**args)
    assert isinstance(stop.value, KeyboardInterrupt) and stop.value.drained and stop.value.cut == []
    assert [stop.value.plan[i].scheme for i in stop.value.finished] == ["bsp"]
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["interrupted"] is True
    first = (tmp_path / "cmp" / "bsp" / "summary.json").stat().st_mtime_ns
    data = shoal.compare(**args, resume=True)
    assert [r["scheme"] for r in data.rows] == ["bsp", "localsgd"] and "interrupted" not in data
    assert (tmp_path / "cmp" / "bsp" / "summary.json").stat().st_mtime_ns == first  # kept, not run again


def test_callbacks_see_every_evaluation_and_iteration_while_the_run_goes_on(tmp_path):
    evals, iterations = [], []
    result = shoal.train(overrides=FAST, out=tmp_path / "run", progress=False, on_eval=evals.append,
                         on_iteration=lambda e: iterations.append((e["worker"], e["t"])))
    assert evals == result.metrics("eval") and [e["accuracy"] for e in evals][-1] == result.summary["final_accuracy"]
    assert len(iterations) == result.summary["iterations"] == len(result.metrics("iteration"))
    assert {w for w, _ in iterations} == {0, 1, 2, 3}
    assert result.metrics()[0]["event"] == "start"


def test_a_callback_that_raises_is_reported_with_its_file_and_line(tmp_path):
    def broken(event):
        raise ValueError("my callback")

    from shoal.errors import InternalError

    with pytest.raises(InternalError, match="in your code: .*test_api.py"):
        shoal.train(overrides=FAST, out=tmp_path / "run", progress=False, on_eval=broken)


def test_python_dash_m_shoal_and_version():
    done = subprocess.run([sys.executable, "-m", "shoal", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"shoal {shoal.__version__}"


def test_import_shoal_stays_light():
    code = "import sys, shoal; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False"


def test_the_cli_starts_without_torch_or_scipy_stats():
    """`shoal --help`, `shoal route` and config errors answer in a fraction of a second: the heavy modules load
    where they are used."""
    code = "import sys, shoal.cli; print(sorted(m for m in ('torch', 'scipy.stats') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr[-500:]


def test_a_run_can_start_from_the_weights_an_earlier_run_ended_with(tmp_path):
    first = shoal.train(overrides=FAST, out=tmp_path / "first", progress=False)
    overrides = FAST + [f"model.init_from={json.dumps(str(tmp_path / 'first'))}"]
    second = shoal.train(overrides=overrides + ["run.max_time_s=0.01"], out=tmp_path / "second", progress=False)
    assert second.metrics("eval")[0]["accuracy"] == first.summary["final_accuracy"]  # evaluated before any step
    with pytest.raises(shoal.ConfigError, match="model.init_from: .*no model.safetensors there"):
        shoal.train(overrides=FAST + [f"model.init_from={json.dumps(str(tmp_path))}"], out=tmp_path / "x")
    with pytest.raises(shoal.ConfigError, match="its weights do not fit this model"):
        shoal.train(overrides=overrides + ["model.hidden=[8]"], out=tmp_path / "y", progress=False)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
