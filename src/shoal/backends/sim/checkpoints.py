"""Checkpoints of a simulated run, and resuming from them bit for bit.

A mixin of ``SimBackend`` (sim/backend.py). Simulated workers are simpy
generator processes, which cannot be saved mid-flight, so a checkpoint is
taken at the one kind of moment when nothing is in flight: the end of a BSP
round, just after the last push of the round was applied, when every other
worker waits at its gate. The state is then small and explicit: the virtual
time, the server's replica and optimizer, the policy's clocks, every worker's
codec (error feedback, DGC's velocity, PowerSGD's Q), data position and
straggler stream, when each waiting worker started to wait, the order in
which the release wakes them, the next evaluation time and the recorder.

A resume rebuilds the run from its config, loads that state and starts the
worker processes in the same order, so every later event happens at the same
virtual time in the same order: the resumed run equals the uninterrupted one
bit for bit (tests/test_sim_checkpoint.py). Times are scheduled at the exact
saved floats (``at``), never as delays from now, which float rounding could
move by one unit in the last place.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict
from pathlib import Path
from typing import Any

import simpy
import torch
from safetensors.torch import load_file, save_file
from simpy.events import NORMAL

from shoal.backends import checkpoint
from shoal.config import Config
from shoal.engine.metrics import WorkerStats
from shoal.errors import ConfigError

CODECS = "codecs.safetensors"
SERVER = "server-0"
RECORDER_FIELDS = ("iterations", "bytes_up", "bytes_down", "best_accuracy", "time_to_target_s", "best_metric",
                   "last_metric", "_streak", "evals")


def check_resume(cfg: Config, run_dir: Path) -> None:
    """Fail early (exit 2) if ``run_dir`` holds no simulator checkpoint this config can continue."""
    _, state = checkpoint.latest(run_dir / "checkpoint")
    if state.get("backend") != "sim":
        raise ConfigError(f"--resume {run_dir}: its checkpoint was written by the {state.get('backend', 'ray')} "
                          f"backend; resume it with --backend {state.get('backend', 'ray')}")
    if state.get("scheme") != cfg.sync.scheme or state.get("workers") != cfg.cluster.workers:
        raise ConfigError(f"--resume {run_dir}: checkpoint is {state.get('scheme')} with {state.get('workers')} "
                          f"workers, config asks {cfg.sync.scheme} with {cfg.cluster.workers}")
    if state["t"] >= cfg.run.max_time_s:
        raise ConfigError(f"--resume {run_dir}: the checkpoint is at {state['t']:g} virtual seconds, past "
                          f"run.max_time_s = {cfg.run.max_time_s:g}; raise run.max_time_s")


def at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event at virtual time exactly ``t`` (a Timeout computes now + (t - now), which rounding can move)."""
    event = env.event()
    event._ok, event._value = True, None  # triggered, as succeed() would, but queued at t instead of now
    heapq.heappush(env._queue, (t, NORMAL, next(env._eid), event))
    return event


class SimCheckpoints:
    """Taking checkpoints at round ends and restoring one (mixed into SimBackend)."""

    def _checkpoint_due(self) -> bool:
        every = self.cfg.backend.sim_checkpoint_every_s
        return every > 0 and self.out is not None and self.env.now >= self.next_checkpoint

    def _maybe_checkpoint(self, closer: int, waiting: list[int]) -> None:
        """After ``closer``'s push ended a round: checkpoint if one is due and every other worker waited."""
        alive = set(range(len(self.stats))) - self.departed - {closer}
        if set(waiting) != alive or self.server_of(closer).policy.excused:
            return
        every = self.cfg.backend.sim_checkpoint_every_s
        while self.next_checkpoint <= self.env.now:  # advanced first: the checkpoint holds the next one's time
            self.next_checkpoint += every
        self._write_checkpoint([closer, *waiting])

    def _write_checkpoint(self, order: list[int]) -> None:
        server = self.servers[0]
        assert self.out is not None and server.replica is not None
        root = self.out / "checkpoint"
        self.checkpoint_seq += 1
        folder = checkpoint.new_folder(root, self.checkpoint_seq)
        checkpoint.save_replica(folder, SERVER, server.replica, {
            "server_version": server.version, "updates": server.updates, "unsent_updates": server.unsent_updates})
        codecs = {f"{w}.{key}": value.detach().contiguous()
                  for w, codec in enumerate(self.codecs) for key, value in codec.state_dict().items()}
        save_file(codecs, str(folder / CODECS))
        recorder = {name: getattr(self.recorder, name) for name in RECORDER_FIELDS}
        checkpoint.commit(root, folder, {
            "backend": "sim", "scheme": self.cfg.sync.scheme, "workers": len(self.stats), "t": self.env.now,
            "elapsed_s": self.env.now, "next_eval": self.next_eval, "next_checkpoint": self.next_checkpoint,
            "order": order, "wait_start": {str(w): self.wait_start[w] for w in order[1:]},
            "clocks": {str(w): c for w, c in server.policy.clocks.items()},
            "streams": [s.position() for s in self.setup.streams],
            "stragglers": [self.stragglers.state(w) for w in range(len(self.stats))],
            "stats": [asdict(s) for s in self.stats], "recorder": recorder, "lr": self.lr,
            "speeds": self.speeds, "torch_rng": checkpoint.rng_text(torch.get_rng_state()),
            **({"noise": self.noise.state()} if self.noise is not None else {}),
            **self._refine_state(folder),
        })
        self.recorder.event("checkpoint", t=self.env.now, path=folder.name)

    def _restore(self, folder: Path, state: dict[str, Any]) -> None:
        """Put the run back where the checkpoint in ``folder`` left it (the environment already starts at its time)."""
        server = self.servers[0]
        replica, manifest = checkpoint.load_replica(folder, SERVER, self.server_opt, self.strategy.outer_step)
        server.replica = replica
        server.version, server.updates = manifest["server_version"], manifest["updates"]
        server.unsent_updates = manifest["unsent_updates"]
        server.policy.restore_clocks({int(w): c for w, c in state["clocks"].items()})
        saved = load_file(str(folder / CODECS))
        for w, codec in enumerate(self.codecs):
            prefix = f"{w}."
            codec.load_state_dict({k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)})
        for stream, position in zip(self.setup.streams, state["streams"]):
            stream.seek(int(position["epoch"]), int(position["offset"]))
        for w, straggler in enumerate(state["stragglers"]):
            self.stragglers.restore(w, straggler)
        self.stats = [WorkerStats(**s) for s in state["stats"]]
        for name, value in state["recorder"].items():
            setattr(self.recorder, name, value)
        self.lr, self.speeds = state["lr"], list(state["speeds"])
        self.decays = self.cfg.optimizer.decays_at(self.epoch())
        self.next_eval, self.next_checkpoint = state["next_eval"], state["next_checkpoint"]
        self.checkpoint_seq = int(folder.name.rpartition("-")[2])
        if self.noise is not None and "noise" in state:
            self.noise.restore(state["noise"])
        torch.set_rng_state(checkpoint.rng_state(state["torch_rng"]))
        self._restore_refine(folder, state)

    def _load_checkpoint(self, run_dir: Path) -> tuple[Path, dict[str, Any]]:
        """The latest checkpoint folder of ``run_dir`` and its state (plain JSON and safetensors: nothing unpickled)."""
        return checkpoint.latest(run_dir / "checkpoint")
