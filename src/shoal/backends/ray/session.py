"""The `ray` backend's session: validation before anything is written, the Ray instance, kept actors.

Local by default: with no ``backend.address`` an embedded Ray instance is
started on 127.0.0.1 only, without a dashboard, and shut down at the end;
with an address the run joins that cluster and ships its plug-in folders.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from ray import cloudpickle
from ray._private import ray_constants

from shoal.backends import checkpoint
from shoal.config import BackendConfig, Config
from shoal.errors import ConfigError

#: keeps an embedded Ray on loopback, without usage reporting or token files
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
#: no idle worker processes started ahead (each costs a Python start on a small machine); messages up to
#: 1 MiB (LeNet-5's parameters) travel inside the actor call instead of through shared memory, which cut
#: transfer + RPC time per BSP round from ~40 to ~25 ms here (benchmarks/results/runtime_overhead.md)
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "enable_worker_prestart": False,
                       "max_direct_call_object_size": 1 << 20}


def pool_key(kind: str, options: dict[str, Any]) -> tuple[Any, ...]:
    """What a kept actor is kept under: its class name and Ray options (an actor serves a run asking the same)."""
    return (kind, *sorted(options.items()))


class ActorPool:
    """Idle actors kept for the next run in the same Ray session (opt-in: tests, benchmarks, sweeps).

    Starting an actor costs a process and a torch import (seconds on a small
    machine); a kept actor is re-initialised instead. Actors hold their CPU
    reservation while kept, so this is off unless ``enabled``; ``clear()``
    kills them. Only used with a Ray session the backend did not start.
    """

    enabled = False
    _idle: dict[tuple[Any, ...], list[Any]] = {}
    _job: str | None = None

    @classmethod
    def take(cls, key: tuple[Any, ...]) -> Any | None:
        if not cls.enabled or not cls._same_session():
            return None
        idle = cls._idle.get(key, [])
        return idle.pop() if idle else None

    @classmethod
    def give(cls, key: tuple[Any, ...], handle: Any) -> None:
        cls._same_session()
        cls._idle.setdefault(key, []).append(handle)

    @classmethod
    def cpus_held(cls, which: Callable[[tuple[Any, ...]], bool]) -> float:
        """The CPUs that the kept actors whose key ``which`` selects hold."""
        return sum(len(handles) * dict(key[1:]).get("num_cpus", 0.0) for key, handles in cls._idle.items()
                   if which(key))

    @classmethod
    def clear(cls, which: Callable[[tuple[Any, ...]], bool] = lambda key: True, wait_s: float = 10.0) -> None:
        """Kill the kept actors whose key (class name, options) ``which`` selects (all by default), and wait
        (at most ``wait_s``) until Ray has their CPUs back: the next run's actors are placed on them."""
        freed = cls.cpus_held(which)
        goal = ray.available_resources().get("CPU", 0.0) + freed if freed and ray.is_initialized() else None
        for key in [key for key in cls._idle if which(key)]:
            for handle in cls._idle.pop(key):
                try:
                    ray.kill(handle, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        deadline = time.monotonic() + wait_s
        while goal is not None and time.monotonic() < deadline \
                and ray.available_resources().get("CPU", 0.0) < goal - 1e-9:
            time.sleep(0.05)

    @classmethod
    def _same_session(cls) -> bool:
        job = ray.get_runtime_context().get_job_id()
        if job != cls._job:
            cls._idle.clear()
            cls._job = job
            return False
        return True


# -- validation and the Ray session ---------------------------------------------------------


def validate(cfg: Config) -> None:
    """Reject what the ray backend does not run, before anything is written."""
    # that Ray is installed was checked at the package's door (shoal/backends/ray/__init__.py)
    if cfg.backend.mode != "train":
        raise ConfigError("backend.mode: cost mode is simulator-only; use backend.name = \"sim\"")
    if cfg.run.eval_refine > 1:
        raise ConfigError("run.eval_refine: refining the time to target is simulator-only (on ray the model between "
                          "two evaluations is not kept); use 1, or evaluate more often (run.eval_every_s)")
    if cfg.network.aggregation == "ina" and cfg.backend.max_restarts > 0:
        raise ConfigError("backend.max_restarts: a restarted worker cannot rejoin an in-network aggregation round; "
                          "use 0 (a failed worker then ends the run)")
    if cfg.backend.gpus_per_worker > 0 and not cfg.backend.address:
        import torch

        if not torch.cuda.is_available():  # local workers run this torch: they would silently compute on the CPU
            raise ConfigError(f"backend.gpus_per_worker = {cfg.backend.gpus_per_worker:g}: this machine's torch "
                              f"({torch.__version__}) sees no CUDA device; use 0, or a CUDA build on a GPU machine")
    if cfg.sync.intra_group == "allreduce" and cfg.sync.balance == "deadline":
        raise ConfigError("sync.balance: a deadline round on ray cuts batches on the server path; "
                          "use sync.intra_group = \"server\" (or \"auto\")")
    if cfg.sync.intra_group == "allreduce" and cfg.backend.max_restarts > 0:
        raise ConfigError("backend.max_restarts: a restarted worker cannot rejoin an all-reduce group yet; "
                          "use 0 (a failed worker then ends the run)")
    address = cfg.backend.address
    if address and address.startswith("ray://"):
        try:
            import grpc  # noqa: F401  (Ray client needs it)
        except ImportError:
            raise ConfigError(f"backend.address {address!r}: Ray client needs grpcio; pip install 'ray[client]'") from None


def check_resume(cfg: Config, run_dir: Path) -> None:
    """Fail early (exit 2) if ``run_dir`` holds no usable checkpoint for this config."""
    if cfg.backend.name != "ray":
        raise ConfigError("--resume: checkpoints are written by the ray backend only; add --backend ray")
    if cfg.sync.intra_group == "allreduce":
        raise ConfigError("--resume: all-reduce groups write no checkpoints yet; use sync.intra_group = \"server\"")
    if cfg.cluster.membership:
        raise ConfigError("--resume: a run with cluster.membership changes cannot be resumed yet (joiners are not "
                          "checkpointed); remove cluster.membership")
    _, state = checkpoint.latest(run_dir / "checkpoint")
    if state.get("backend") == "sim":
        raise ConfigError(f"--resume {run_dir}: its checkpoint was written by the sim backend; resume it with --backend sim")
    if state.get("scheme") != cfg.sync.scheme or state.get("workers") != cfg.cluster.workers:
        raise ConfigError(
            f"--resume {run_dir}: checkpoint is {state.get('scheme')} with {state.get('workers')} workers, "
            f"config asks {cfg.sync.scheme} with {cfg.cluster.workers}"
        )


def start_local_ray(num_cpus: int) -> None:
    """An embedded Ray instance bound to 127.0.0.1, without dashboard, usage stats or idle workers."""
    os.environ.update(LOCAL_ENV)  # Ray's own processes read these when they start
    os.environ.pop("RAY_ADDRESS", None)
    # Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is first imported; if that happened
    # before this call, every Ray server would bind to all interfaces (the loopback test catches it).
    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(
        address="local", _node_ip_address="127.0.0.1", include_dashboard=False, dashboard_host="127.0.0.1",
        num_cpus=num_cpus, log_to_driver=False, configure_logging=False,
        _system_config=LOCAL_SYSTEM_CONFIG,
    )


def plugin_folders(cfg: Config) -> list[str]:
    """The folders of the run's python:FILE.py plug-ins (model, data, loss, metric, scheme, compressor)."""
    from shoal.plugins import is_plugin, split_spec

    specs = [cfg.model.name, cfg.data.name, cfg.task.loss, cfg.task.metric, cfg.sync.scheme, cfg.compression.method]
    files = [split_spec(s)[0] for s in specs if is_plugin(s)]
    return sorted({str(Path(f).parent) for f in files if f.endswith(".py")})


def probe_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, with one line, when nothing listens at a ``host:port`` cluster address.

    Ray itself retries an unreachable address for a minute or more before it gives up. "auto" and
    addresses without a port are left to Ray.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"backend.address {address!r}: nothing answers at {host}:{port} ({reason}); "
                          f"start the cluster (ray start --head) or fix the address") from None


def _join_cluster(address: str, plugin_dirs: list[str]) -> None:
    """Join a cluster; the folders of the run's plug-in files travel to every node (Ray ``py_modules``)."""
    probe_address(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    runtime_env = {"py_modules": plugin_dirs} if plugin_dirs else None
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False, runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"backend.address {address!r}: cannot join the Ray cluster: {first}") from None


@contextmanager
def ray_session(backend: BackendConfig, cpus_needed: float, plugin_dirs: list[str] = ()) -> Iterator[str]:
    """Use a Ray already initialised in this process, else start (local) or join one; undo at exit.

    Local mode shares this machine's files, so plug-in files load from their absolute paths; on a cluster
    their folders are shipped with the job.
    """
    _pickle_plugins_by_value()
    if ray.is_initialized():
        yield "existing"
        return
    if backend.address:
        _join_cluster(backend.address, list(plugin_dirs))
        where = backend.address
    else:
        cpus = backend.local_cpus or os.cpu_count() or 1
        start_local_ray(max(cpus, math.ceil(cpus_needed)))
        where = "local"
    try:
        yield where
    finally:
        ray.shutdown()


def _pickle_plugins_by_value() -> None:
    """Send the classes of loaded plug-in files by value, so an actor can unpickle a user's policy or compressor."""
    from shoal.plugins import file_modules

    for module in file_modules():
        cloudpickle.register_pickle_by_value(module)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends a run like Ctrl-C (summary written, Ray shut down); main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
