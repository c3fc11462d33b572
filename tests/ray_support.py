"""What the ray backend's tests share: the configs they run, a backend they can reach into, and a look at the
sockets of this process tree (is everything on loopback?). The embedded Ray itself is conftest's ray_session."""

from __future__ import annotations

import io
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import ray

from shoal.backends.ray import RayBackend
from shoal.config import load_config
from shoal.engine.metrics import RunRecorder
from shoal.engine.setup import build_setup

from conftest import FAST

RAY = ["backend.name=ray", "backend.cpus_per_worker=0.2", "backend.cpus_per_server=0.2",
       "backend.checkpoint_every_s=0", "run.max_time_s=20"]
SERVER_PATH = "sync.intra_group=server"  # the server path, whose fault tolerance and checkpoints a test checks
CONTRACT = ("scheme", "backend", "final_accuracy", "best_accuracy", "target_accuracy", "time_to_target_s",
            "elapsed_s", "iterations", "bytes_up", "bytes_down", "groups", "per_worker")


def free_cpus_settle(wait_s: float = 10.0) -> float:
    """Ray's free CPUs once they stop changing (an ended actor's CPUs come back a moment later)."""
    deadline, last = time.monotonic() + wait_s, -1.0
    while time.monotonic() < deadline:
        now = ray.available_resources().get("CPU", 0.0)
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    return last


def ray_config(*overrides: str):
    return load_config(None, FAST + RAY + list(overrides))


def run_backend(cfg, progress=None, stream=None):
    """A RayBackend (for tests that reach into it) and its summary."""
    holder: dict = {}

    def tick(info):
        if progress is not None:
            progress(holder["backend"], info)

    backend = RayBackend(build_setup(cfg), RunRecorder(stream=stream), tick)
    holder["backend"] = backend
    return backend, backend.run()


def events_of(stream: io.StringIO) -> list[dict]:
    """The events a run has written to its metrics stream so far."""
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def stop_once(done: Callable[[RayBackend, dict, list[dict]], bool], stream: io.StringIO,
              act: Callable[[RayBackend, dict], None] | None = None) -> Callable[[RayBackend, dict], None]:
    """A progress callback for run_backend: ``act`` (a fault to inject, if any), then end the run as Ctrl-C would
    once ``done(backend, info, events)`` holds. A test then waits for what it checks, and its time budget is only
    the bound on a failure."""

    def tick(backend: RayBackend, info: dict) -> None:
        if act is not None:
            act(backend, info)
        if backend.stop_reason is None and done(backend, info, events_of(stream)):
            backend.stop_reason = "interrupted"

    return tick


# -- sockets of this process tree (Linux /proc) ------------------------------------------


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        for child in children[todo.pop()]:
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw[::-1])
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    flat = b"".join(words)
    if flat[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in flat[12:])
    return ":".join(flat[i : i + 2].hex() for i in range(0, 16, 2))


def bound_sockets(pids: set[int]) -> list[tuple[int, str, str]]:
    """(pid, protocol, local address) of every listening TCP and bound UDP socket the processes hold."""
    table: dict[str, tuple[str, str]] = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/net/{proto}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if proto.startswith("tcp") and state != "0A":  # 0A = LISTEN
                continue
            table[inode] = (proto, _address(local.split(":")[0]))
    found = []
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in table:
                found.append((pid, *table[link[8:-1]]))
    return found


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address.startswith("::ffff:127.") or address == "0000:0000:0000:0000:0000:0000:0000:0001"
