"""Faults and recovery on ray: failed workers (removed, restarted, rejoined), checkpoints and resume.

A mixin of ``RayBackend`` (backends/ray/driver.py): it reads and sets the driver's
attributes, which ``RayBackend.__init__`` declares.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from shoal.backends import checkpoint
from shoal.backends.ray.wire import answered, first_line
from shoal.engine.metrics import WorkerStats


class Recovery:
    """Worker failures and restarts; periodic checkpoints of every group server and resuming from them."""

    def _worker_ended(self, ref: Any) -> None:
        """A worker's loop returned: a failure unless the run is stopping."""
        w = self._run_refs.pop(ref)
        try:
            if ray.get(ref) == "budget":  # an all-reduce rank ran its share of run.max_iterations, as all do
                self.stop_reason = self.stop_reason or "iteration_budget"
                return
            error = "worker loop ended"
        except ray.exceptions.RayError as err:
            error = first_line(err)
        if self.stop_reason is None:
            self._fail(w, error)

    def _evict_unresponsive(self) -> None:
        """Workers that have not answered a drain within ``backend.worker_timeout_s`` fail (hung, stopped, cut off).

        A drain is an actor call each worker answers between iterations, so a
        live worker, however slow its tier, answers within one iteration; one
        that does not is evicted: its server stops waiting for it. Without a
        restart left its process is kept: if it answers again (SIGCONT, the
        partition healed) it rejoins its group (``_collect_rejoined``).
        """
        timeout = self.cfg.backend.worker_timeout_s
        if not timeout:
            return
        now = self.now()
        for w in sorted(self.alive):
            if w in self._drains and now - self._drain_sent.get(w, now) > timeout:
                drain = self._drains[w]
                runs = [ref for ref, v in self._run_refs.items() if v == w]
                self._run_refs = {ref: v for ref, v in self._run_refs.items() if v != w}
                if self._fail(w, f"no answer for {timeout:g} s (hung, stopped or partitioned): evicted", keep=True):
                    self._evicted[w] = (drain, runs)

    def _collect_rejoined(self) -> None:
        """Evicted workers that answered their drain at last: back into their group, from its replica."""
        if self.stop_reason is not None:
            return
        drains = {drain: w for w, (drain, _) in self._evicted.items()}
        for ref in answered(drains):
            w = drains[ref]
            _, runs = self._evicted.pop(w)
            try:
                records = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # it died after all
            for record in records:
                self._record(record)
            self.dead.discard(w)
            self.epoch += 1
            server = self.server_of(w)
            self._admit(server, w)
            self.alive.add(w)
            self._run_refs.update({run: w for run in runs})
            self.workers[w].set_route.remote(self.epoch, server, self.servers[server])  # its pending call: MOVED
            failure = next(f for f in reversed(self.failures) if f.get("worker") == w)
            failure["rejoined_t"] = t = round(self.now(), 6)
            self.recorder.event("worker_rejoined", t=t, worker=w, group=server)

    def _admit(self, server: int, w: int) -> None:
        """``server`` counts ``w`` again (at its slowest clock); if it died, its replacement's policy will."""
        try:
            ray.get(self.servers[server].add_worker.remote(w, self.epoch))
        except ray.exceptions.ActorDiedError:
            self._check_servers()

    def _fail(self, w: int, error: str, keep: bool = False) -> bool:
        """Remove a failed worker from its server's gating (nobody waits for it), then restart or drop it.

        ``keep``: an unresponsive worker with no restart left keeps its process, which may answer again;
        returns True when it was kept.
        """
        self.alive.discard(w)
        self._drains.pop(w, None)
        if self.plan is not None or self.collective:  # the round (a switch's, or the all-reduce) cannot finish
            self.failures.append({"t": round(self.now(), 6), "worker": w, "error": error, "restarted": False})
            self.recorder.event("worker_failed", t=self.now(), worker=w, error=error, restarted=False)
            self.dead.add(w)
            self.stop_reason = "worker_failed"
            return False
        restart = self.restarts[w] < self.cfg.backend.max_restarts
        self.failures.append({"t": round(self.now(), 6), "worker": w, "error": error, "restarted": restart})
        self.recorder.event("worker_failed", t=self.now(), worker=w, error=error, restarted=restart)
        self.epoch += 1
        try:
            ray.get(self.servers[self.server_of(w)].remove_worker.remote(w, self.epoch))
        except ray.exceptions.ActorDiedError:  # its server died too: the replacement serves the others
            self._check_servers()
        if keep and not restart:
            self.dead.add(w)
            return True
        ray.kill(self.workers[w], no_restart=True)
        self._free_bundle(self.workers[w])
        if not restart:
            self.dead.add(w)
            return False
        self.restarts[w] += 1
        self.workers[w] = self._worker_actor(w)
        self._starting[self.workers[w].ping.remote()] = w
        return False

    def _collect_started(self) -> None:
        """Restarted workers and joiners that are ready join their group's server (at its slowest clock)."""
        for ref in answered(self._starting):
            w = self._starting.pop(ref)
            self.pids[w] = ray.get(ref)["pid"]
            self.epoch += 1
            server = self.server_of(w)
            self._admit(server, w)
            self._launch(w)
            if self.restarts[w]:
                self.recorder.event("worker_restarted", t=self.now(), worker=w, restarts=self.restarts[w])
            else:  # a joiner (cluster.membership): the gradients' weight follows the new N
                self._reweigh()
                self.recorder.event("worker_joined", t=self.now(), worker=w, group=server, speed=self.speeds[w])

    def _ckpt_period(self) -> float:
        """Seconds between checkpoints (inf: none; all-reduce groups have no server to save yet)."""
        every = self.cfg.backend.checkpoint_every_s
        return every if every > 0 and self.out is not None and not self.collective else math.inf

    def _checkpoint(self) -> None:
        """Every group server saves its replica and optimizer; then the run state commits the set."""
        if self.out is None:
            return
        root = self.out / "checkpoint"
        self.ckpt_seq += 1
        folder = checkpoint.new_folder(root, self.ckpt_seq)
        alive = sorted(self.alive)
        asked = {self.workers[w].position.remote(str(folder)): w for w in alive}
        try:
            ray.get([s.save.remote(str(folder)) for s in self.servers])
        except ray.exceptions.ActorDiedError:  # a server died: no partial set is committed; it is replaced
            shutil.rmtree(folder, ignore_errors=True)
            self._check_servers()
            return
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=5.0)  # a hung worker keeps its last one
        for ref in ready:
            try:
                self.positions[asked[ref]] = ray.get(ref)
            except ray.exceptions.RayError:
                pass
        checkpoint.commit(root, folder, {**self._run_state(), "positions": {str(w): p for w, p in self.positions.items()}})
        self.last_checkpoint = str(folder)
        self.recorder.event("checkpoint", t=round(self.now(), 6), path=str(folder))

    def _run_state(self) -> dict[str, Any]:
        r = self.recorder
        return {
            "scheme": self.cfg.sync.scheme, "workers": self.n, "elapsed_s": getattr(self, "elapsed", None) or self.now(),
            "iterations": r.iterations,
            "bytes_up": r.bytes_up, "bytes_down": r.bytes_down, "best_accuracy": r.best_accuracy,
            "time_to_target_s": r.time_to_target_s, "last_eval": r.evals[-1] if r.evals else None,
            "stats": [asdict(s) for s in self.stats], "groups": self._groups(),
            "grouped": bool(self.gssp and self.gssp.grouped),
            "profile_times": self.gssp.profiler.times() if self.gssp else None,
            "confirming": self.gssp.confirming() if self.gssp and self.gssp.grouped else None,
            "failures": self.failures, "restarts": self.restarts, "servers": len(self.servers),
        }

    def _load_resume(self) -> dict[str, Any]:
        """Restore the run state of the last checkpoint; the replicas load in the servers."""
        assert self.resume is not None
        folder, state = checkpoint.latest(self.resume / "checkpoint")
        r = self.recorder
        r.iterations, r.bytes_up, r.bytes_down = state["iterations"], state["bytes_up"], state["bytes_down"]
        r.best_accuracy, r.time_to_target_s = state["best_accuracy"], state["time_to_target_s"]
        if state["last_eval"] is not None:
            r.evals.append(state["last_eval"])
        self.stats = [WorkerStats(**s) for s in state["stats"]]
        self.failures = list(state["failures"])
        self.offset = float(state["elapsed_s"])
        self.ckpt_seq = int(folder.name.rpartition("-")[2])  # numbering goes on, so newer sorts later
        if self.gssp is not None and state["grouped"]:
            self.gssp.restore(state["groups"], state["profile_times"], state.get("confirming"))
        self.recorder.event("resume", t=round(self.offset, 6), checkpoint=str(folder))
        return {"folder": folder, **state}

    def _seek_streams(self, positions: dict[str, Any], folder: Path | None = None) -> None:
        """Each worker continues its data stream, random generators and codec state where the checkpoint left them."""
        if not positions:
            return
        workers = [w for w in range(self.n) if str(w) in positions]
        where = None if folder is None else str(folder)
        now = ray.get([self.workers[w].seek.remote(positions[str(w)], where) for w in workers], timeout=300)
        self.positions = dict(zip(workers, now))
        self.recorder.event("data_positions", t=round(self.offset, 6),
                            positions={str(w): position_digest(p) for w, p in self.positions.items()})

    def _final_checkpoint(self) -> None:
        if self._ckpt_period() < math.inf:
            self._checkpoint()


def position_digest(position: dict[str, Any]) -> dict[str, Any]:
    """A worker's stream position with its generator states as one short hash (what metrics.jsonl records)."""
    rngs = {k: v for k, v in position.items() if k not in ("epoch", "offset")}
    digest = hashlib.sha256(json.dumps(rngs, sort_keys=True).encode()).hexdigest()[:16]
    return {"epoch": position["epoch"], "offset": position["offset"], "rng": digest}
