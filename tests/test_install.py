"""What runs without the optional extras (sim, route and trace without Ray; route without torch either), and what a
ray actor's process does not import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST

SHOAL = [sys.executable, "-m", "shoal"]

BLOCKER = '''
import sys

class _Missing:
    """Pretend these packages are not installed (as after `pip install shoal` without the extra)."""
    blocked = {names!r}

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Missing())
'''


def without(tmp_path: Path, *names: str, args: list[str]) -> subprocess.CompletedProcess:
    """Run `shoal ARGS` in a Python where ``names`` cannot be imported."""
    site = tmp_path / f"no-{'-'.join(names)}"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(names=set(names)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(SHOAL + args, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


@pytest.mark.slow
def test_without_ray_sim_training_and_trace_run_and_ray_says_how_to_install_it(tmp_path):
    sets = [a for o in FAST for a in ("--set", o)]
    trained = without(tmp_path, "ray", args=["train", *sets, "--out", "run", "-q"])
    assert trained.returncode == 0, trained.stderr
    assert without(tmp_path, "ray", args=["trace", "run"]).returncode == 0
    refused = without(tmp_path, "ray", args=["train", *sets, "--backend", "ray", "--out", "ray-run"])
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "pip install 'shoal[ray]'" in refused.stderr and not (tmp_path / "ray-run").exists()


def test_route_needs_neither_torch_nor_ray(tmp_path):
    routed = without(tmp_path, "ray", "torch", args=["route", "--topology", "fattree:k=4", "--algo", "grid,atp"])
    assert routed.returncode == 0, routed.stderr
    assert "grid" in routed.stdout and "atp" in routed.stdout


def test_a_ray_actor_imports_neither_the_driver_nor_the_network_planners():
    """Each actor process imports its own module; the driver and the planners (networkx, scipy, HiGHS) cost every
    actor about half a second of CPU at its start (shoal.backends.ray and shoal.network load them on first use)."""
    pytest.importorskip("ray")
    actors = ", ".join(f"shoal.backends.ray.{m}" for m in ("worker", "server", "collective", "evaluator", "switch"))
    heavy = ("shoal.backends.ray.driver", "networkx", "scipy", "highspy")
    code = f"import sys\nimport {actors}\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
