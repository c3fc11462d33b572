"""Shared fixtures: small, fast configs for end-to-end runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shoal.config import Config, load_config

ROOT = Path(__file__).resolve().parents[1]

#: test files whose every test runs on a real Ray instance (marked ``ray``: run one at a time, after the rest);
#: the ray backend's parts that need no Ray instance are tested in test_ray_parts.py, with the rest of the suite
RAY_FILES = {"test_ray_training.py", "test_ray_allreduce.py", "test_ray_faults.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in RAY_FILES:
            item.add_marker(pytest.mark.ray)
    # the tests that end the actors kept between runs (ActorPool) go last: every test before them reuses them;
    # slow tests go first, so that the suite's workers (pytest -n) do not end on one long test while the other idles
    items.sort(key=lambda item: (item.get_closest_marker("ends_kept_actors") is not None,
                                 item.get_closest_marker("slow") is None))

FAST = [
    "data.name=digits",
    "model.name=mlp",
    "model.hidden=[32]",
    "optimizer.lr=0.1",
    "cluster.workers=4",
    "cluster.compute_s=0.01",
    "run.max_time_s=2.0",
    "run.eval_every_s=0.25",
    "run.target_accuracy=0.9",
]


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for every ray test (as shoal starts it), with idle actors kept between runs (ActorPool):
    most runs then cost a second or two instead of starting processes and importing torch again."""
    ray = pytest.importorskip("ray")
    from shoal.backends.ray.session import ActorPool, start_local_ray

    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(2)
    ActorPool.enabled = True
    yield
    ActorPool.clear()
    ActorPool.enabled = False
    ray.shutdown()


@pytest.fixture
def fast_config():
    """A config that trains an MLP on digits with 4 workers in a second or two."""

    def make(*overrides: str) -> Config:
        return load_config(None, FAST + list(overrides))

    return make


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def app():
    """`shoal route` on its own typer app, so route tests do not depend on the other commands importing."""
    import typer

    from shoal.commands.route import route

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("route")(route)

    @app.callback()
    def _root() -> None:
        """Keep `route` a subcommand."""

    return app


def run_route(app, *args: str):
    """Invoke `route ARGS...` on the app fixture."""
    from typer.testing import CliRunner

    return CliRunner().invoke(app, ["route", *args])


def default_sigint() -> None:
    """preexec_fn for a child that must see Ctrl-C: a shell's background job inherits SIGINT ignored, and
    Python then never raises KeyboardInterrupt; give the child the default disposition back."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
