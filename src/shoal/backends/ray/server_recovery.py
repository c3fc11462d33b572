"""A dead group server on ray, replaced without restarting the job.

A mixin of ``RayBackend`` (backends/ray/driver.py). A server that dies (``kill -9``,
its node lost) is noticed by the driver when a call to it fails (its drain,
every ``DRAIN_S``); its workers see the same error on their pull or push and
wait for a new route (ray_worker). The replacement starts from the freshest
state that survives, in this order:

1. a peer group's replica (GSSP after the split) without the peer's own
   delta not yet sent (that still arrives with the peer's next exchange):
   every replica holds the initial parameters plus every delivered delta, so
   this differs from the dead replica only by the dead group's updates since
   its last exchange (and deltas in flight);
2. the newest of the last checkpoint (replica and optimizer) and the last
   state the evaluator evaluated (parameters and buffers, a fresh optimizer;
   kept only once evaluated: a state asked of a server that died before
   handing it out never existed, and must not hide the checkpoint);
3. the initial state, when neither exists yet.

What was lost is counted in worker gradients the dead server had applied
after the state it was rebuilt from (the iteration records of its group with
a later time), and written into the failure record and the summary.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import ray

from shoal.backends import checkpoint
from shoal.backends.ray.wire import answered, first_line


class ServerRecovery:
    """Replaces dead group servers from a peer, the last checkpoint or the last evaluated state."""

    def _init_server_recovery(self) -> None:
        self._applied: dict[int, list[float]] = {}  # per server index: times of the records its group pushed
        self._safe_t: dict[int, float] = {}  # per server: when its updates last left for the peers (exchange)
        self._eval_states: tuple[float, list[Any]] | None = None  # the last states the evaluator evaluated
        self._retired_totals: list[dict[str, Any]] = []  # counters of servers that died
        self._replacing: dict[Any, int] = {}  # ping of a replacement server still starting -> its group
        self._replacements: dict[int, tuple[Any, dict[str, Any], dict[str, Any], float]] = {}

    # -- bookkeeping the driver feeds ------------------------------------------------------------

    def _note_applied(self, server: int, t: float) -> None:
        """A record of ``server``'s group: a gradient applied there at ``t`` (late records of a dead one too)."""
        self._applied.setdefault(server, []).append(t)

    def _note_exchange(self, server: int, t: float) -> None:
        self._safe_t[server] = max(self._safe_t.get(server, 0.0), t)

    def _gradients_lost(self, failure: dict[str, Any]) -> int:
        """Gradients the dead server applied after the state its replacement started from."""
        return sum(1 for t in self._applied.get(failure["server"], ()) if failure["cutoff"] < t <= failure["t"])

    # -- detection ------------------------------------------------------------------------------

    def _check_servers(self) -> None:
        """Ping every server (after a call to one failed); replace those that died."""
        pings = {s.ping.remote(): g for g, s in enumerate(self.servers)}
        ray.wait(list(pings), num_returns=len(pings), timeout=5.0)
        for ref, g in pings.items():
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.ActorDiedError as err:
                self._server_failed(g, first_line(err))
            except (ray.exceptions.RayError, TimeoutError):
                pass  # busy (a checkpoint write) or slow: not dead

    def _server_failed(self, g: int, error: str) -> None:
        """Record the failure and start a new server process in its place (the driver loop goes on meanwhile)."""
        if g in self._replacing.values():
            return
        self._free_bundle(self.servers[g])  # its replacement takes the dead server's reserved bundle
        t = round(self.now(), 6)
        self._retired_totals.append(self._server_totals.pop(g, {}))
        self._server_drains.pop(g, None)
        if self.plan is not None:  # the switches send their sums to this server: the data plane cannot go on
            self.failures.append({"t": t, "server": g, "error": error, "recovered": False})
            self.recorder.event("server_failed", t=t, server=g, error=error, recovered=False)
            self.stop_reason = "server_failed"
            return
        source, cutoff = self._replacement(g)
        failure = {"t": t, "server": g, "error": error, "recovered": True, "recovered_from": source["label"],
                   "cutoff": round(cutoff, 6)}
        self.failures.append(failure)
        self.recorder.event("server_failed", t=t, server=g, error=error, recovered_from=source["label"],
                            cutoff=failure["cutoff"])
        if self.standby:  # a warm spare: re-initialised for this group, no process to start
            server = self.standby.pop()
            ready = server.reinit.remote(*self._server_args(g))
            self.standby.append(self._server_actor(-1))  # refill in the background
        else:
            server = self._server_actor(g)
            ready = server.ping.remote()
        self._replacing[ready] = g
        self._replacements[g] = (server, source, failure, time.monotonic())

    def _collect_replacements(self) -> None:
        """Replacement servers that answered: install their state, then route their group to them."""
        for ref in answered(self._replacing):
            g = self._replacing.pop(ref)
            server, source, failure, started = self._replacements.pop(g)
            try:
                self._install_replacement(g, server, source)
            except ray.exceptions.RayActorError:  # the replacement (a standby) died too: start a fresh process
                server = self._server_actor(g)
                self._replacing[server.ping.remote()] = g
                self._replacements[g] = (server, source, failure, started)
                continue
            failure["recovered_from"] = source["label"]
            self.servers[g] = server
            ray.get([s.set_peers.remote(self.servers, self.t0) for s in self.servers])
            self._route_group(g)
            self._safe_t[g] = self.now()
            self.recorder.event("server_replaced", t=round(self.now(), 6), server=g, recovered_from=source["label"],
                                seconds=round(time.monotonic() - started, 3))
            self._record_servers("replaced")

    def _record_servers(self, reason: str) -> None:
        """A ``servers`` event: each group server's process id (for operators and fault drills)."""
        try:
            pids = ray.get([s.ping.remote() for s in self.servers], timeout=10)
        except (ray.exceptions.RayError, TimeoutError):
            return
        self.recorder.event("servers", t=round(self.now(), 6), pids=pids, reason=reason)

    def _servers_down(self) -> set[int]:
        """Servers that died and whose replacement is still starting."""
        return set(self._replacing.values())

    def _replacement(self, g: int) -> tuple[dict[str, Any], float]:
        """Where the new server's state comes from, and the time up to which the dead one's updates survive."""
        peers = [p for p in range(len(self.servers)) if p != g] if self.gssp is not None and self.gssp.grouped else []
        if peers:
            members = [len(self.gssp.groups[p]) for p in peers]
            peer = peers[members.index(max(members))]
            return {"label": f"group {peer}'s replica", "peer": peer}, self._safe_t.get(g, 0.0)
        options: list[tuple[float, dict[str, Any]]] = [(-math.inf, {"label": "the initial state"})]
        if self.last_checkpoint is not None and (Path(self.last_checkpoint) / f"group-{g}.json").is_file():
            at = checkpoint.saved_at(Path(self.last_checkpoint))
            options.append((at, {"label": f"checkpoint {Path(self.last_checkpoint).name}",
                                 "folder": self.last_checkpoint}))
        if self._eval_states is not None and g < len(self._eval_states[1]):
            at, refs = self._eval_states
            options.append((at, {"label": f"the state evaluated at {at:.1f} s", "state": refs[g]}))
        at, source = max(options, key=lambda o: o[0])
        return source, max(at, 0.0)

    def _install_replacement(self, g: int, server: Any, source: dict[str, Any]) -> None:
        """Serve group ``g``'s live members from ``source`` on the new ``server``."""
        self.epoch += 1
        members = self.gssp.groups[g] if self.gssp is not None else self._members()
        policy = self._live_policy(members)
        if "folder" in source:
            ray.get(server.restore.remote(policy, source["folder"], f"group-{g}", self.epoch))
        else:
            ray.get(server.install.remote(policy, *self._source_state(source), self.gssp is not None, self.epoch))
        server.set_lr.remote(self.lr, False)  # the similarity schedule is set anew below
        schedule = self.strategy.aggregation_schedule()
        if schedule is not None:
            server.set_similarity.remote(schedule, self._slices(), self.strategy.broadcast_codec(g))
        if self.gssp is not None and self.gssp.grouped:
            server.set_exchange_codec.remote(self.strategy.exchange_codec(g))

    def _source_state(self, source: dict[str, Any]) -> tuple[Any, Any]:
        """(params, buffers) of a peer's replica or of the last evaluated state; the initial state if gone."""
        try:
            if "peer" in source:
                return ray.get(self.servers[source["peer"]].shared_state.remote(), timeout=30)
            if "state" in source:
                return ray.get(source["state"], timeout=30)
        except ray.exceptions.RayError:
            source["label"] = "the initial state"  # the state it was to come from is gone too
        params, buffers = self.setup.engine.initial_state()
        return params.numpy(), buffers.numpy()

    def _route_group(self, g: int) -> None:
        """Every live member of group ``g`` follows the new server (the epoch is the new server's)."""
        members = self.gssp.groups[g] if self.gssp is not None else self._members()
        for w in members:
            if w in self.alive:
                self.workers[w].set_route.remote(self.epoch, g, self.servers[g])
        if self.gssp is not None:
            self._share_updates()

    def _count_losses(self) -> None:
        """Fill in each server failure's ``gradients_lost`` (records drained after the failure count too)."""
        for failure in self.failures:
            if failure.get("recovered"):
                failure["gradients_lost"] = self._gradients_lost(failure)
