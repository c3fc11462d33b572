"""GSSP membership on ray: the split, regroups, update shares, and each worker's route and density.

A mixin of ``RayBackend`` (backends/ray/driver.py): the pure ``GSSP`` policy decides,
this carries its decisions out on the actors, in step with the sim
backend's ``_split`` / ``_regroup``.
"""

from __future__ import annotations

import numpy as np
import ray

from shoal.engine.metrics import WorkerStats
from shoal.sync.gssp import Move


class Membership:
    """Carries out the GSSP policy's groupings, and workers joining and leaving, on the actors."""

    def _members(self) -> list[int]:
        """Every worker taking part (failed ones included, as their group's record), in id order."""
        return [w for w in range(len(self.stats)) if w not in self.departed]

    def _weight(self) -> float:
        """A gradient's weight: 1/N, N = the configured workers plus those that joined, less those that left
        (a failure does not change it), so the update per sample stays the same when membership changes."""
        joined = len(self.stats) - self.n - len(self._starting_joiners())
        return 1.0 / max(1, self.n + joined - len(self.departed))

    def _starting_joiners(self) -> list[int]:
        return [w for w in self._starting.values() if w >= self.n and not self.restarts[w]]

    def _reweigh(self) -> None:
        for server in self.servers:
            server.set_weight.remote(self._weight())

    def _apply_membership(self, now: float) -> None:
        """``cluster.membership`` changes that are due: joiners start (and join once ready), leavers stop."""
        while self._membership_changes and self._membership_changes[0].at_s <= now:
            change = self._membership_changes.pop(0)
            for _ in range(change.add):
                self._join(next(self._joiner_speeds))
            for w in change.remove:
                self._leave(w)

    def _join(self, speed: float) -> None:
        """Start a new worker actor (the next id); ``_collect_started`` admits it to its group once it answers."""
        w = len(self.stats)
        group = self.gssp.join(w) if self.gssp is not None else 0  # GSSP: the fastest group until profiled
        self.speeds.append(speed)
        self.stats.append(WorkerStats(id=w, group=group, speed=speed))
        self.restarts.append(0)
        self.workers[w] = self._worker_actor(w)
        self._starting[self.workers[w].ping.remote()] = w
        self.recorder.event("worker_joining", t=self.now(), worker=w, group=group, speed=speed)

    def _leave(self, w: int) -> None:
        """``w`` leaves for good (not a failure): its server forgets it, its last records are kept."""
        self.departed.add(w)
        self._starting = {ref: v for ref, v in self._starting.items() if v != w}
        self._run_refs = {ref: v for ref, v in self._run_refs.items() if v != w}
        group = self.server_of(w)
        if self.gssp is not None:
            self.gssp.leave(w)
        if w in self.alive:
            self.alive.discard(w)
            self.epoch += 1
            try:
                ray.get(self.servers[group].remove_worker.remote(w, self.epoch), timeout=30)
            except ray.exceptions.ActorDiedError:
                self._check_servers()
            pending = self._drains.pop(w, None)
            try:
                for record in ray.get(pending, timeout=5) if pending is not None else []:
                    self._record(record)
            except (ray.exceptions.RayError, TimeoutError):
                pass
        self._evicted.pop(w, None)
        if w in self.workers:
            ray.kill(self.workers[w], no_restart=True)
            self._free_bundle(self.workers[w])
        self._reweigh()
        self.recorder.event("worker_left", t=self.now(), worker=w, group=group)

    def server_of(self, worker: int) -> int:
        return self.gssp.server_of[worker] if self.gssp is not None else 0

    def _density(self, worker: int) -> float:
        """Upload density of ``worker`` now: the strategy's rule, as in sim."""
        return self.strategy.density(self.setup.epochs(self.recorder.iterations), worker, self.gssp)

    def _group_density(self, server: int) -> float:
        """GDTopK: a group's scheduled density (endpoints: the fastest and slowest group, as in sim)."""
        return self.strategy.group_density(self.setup.epochs(self.recorder.iterations), server, self.gssp)

    def _split(self, groups: list[list[int]]) -> None:
        """One server per group: group 0 keeps server 0 (fresh optimizer), the others start from its copy."""
        if self.collective:
            return self._collective_split(groups)
        self.epoch += 1
        policies = [self._live_policy(members) for members in groups]
        params, buffers, schedule = ray.get(self.servers[0].split.remote(policies[0], self.epoch))
        p_ref, b_ref = ray.put(params), ray.put(buffers)
        while len(self.spares) < len(groups) - 1:
            self.spares.append(self._server_actor(len(self.spares) + 1))
        new, surplus = self.spares[: len(groups) - 1], self.spares[len(groups) - 1 :]
        ray.get([s.install.remote(policies[g + 1], p_ref, b_ref, True, self.epoch) for g, s in enumerate(new)])
        ray.get([s.set_lr.remote(self.lr, False) for s in (self.servers[0], *new)])  # fresh optimizers: the rate now
        if schedule is not None:  # SIM: every group server runs a restarted copy (group 0 keeps the bytes saved)
            ray.get([s.set_similarity.remote(schedule, self._slices()) for s in new])
        for spare in surplus:
            ray.kill(spare)
            self._free_bundle(spare)
        self.spares = []
        self.servers = [self.servers[0], *new]
        ray.get([s.set_peers.remote(self.servers, self.t0) for s in self.servers])
        ray.get([s.set_exchange_codec.remote(self.strategy.exchange_codec(g)) for g, s in enumerate(self.servers)])
        for g, members in enumerate(groups):
            for w in members:
                self.stats[w].group = g
                if w in self.alive:
                    self.workers[w].set_route.remote(self.epoch, g, self.servers[g])
        self._record_servers("split")
        self.recorder.event("groups", t=self.now(), groups=groups, reason="profiled",
                            times=[round(t, 6) for t in self.gssp.profiler.times()])

    def _regroup(self, moves: list[Move]) -> None:
        """Carry out the policy's moves: the new server admits, the old one releases, then the route."""
        if self.collective:
            return self._collective_regroup(moves)
        self.epoch += 1
        live = [m for m in moves if m.worker in self.alive]
        try:
            ray.get([self.servers[m.new].add_worker.remote(m.worker, self.epoch) for m in live])
            ray.get([self.servers[m.old].remove_worker.remote(m.worker, self.epoch) for m in live])
        except ray.exceptions.ActorDiedError:  # a server died: its replacement starts with the new membership
            self._check_servers()
        for move in moves:
            self.stats[move.worker].group = move.new
        for move in live:
            self.workers[move.worker].set_route.remote(self.epoch, move.new, self.servers[move.new])
        for idle in {m.old for m in moves} & set(self.gssp.idle_servers):
            self.servers[idle].flush_exchange.remote()  # its merged-away group's last updates reach the peers
        self.recorder.event("groups", t=self.now(), groups=self.gssp.groups, reason="regroup",
                            moves=[[m.worker, m.old, m.new] for m in moves])

    def _share_updates(self) -> None:
        """Each group server's momentum share (``GSSP.momentum_shares``), its exchange density and period, its
        members' paces (``GSSP.paces``)."""
        if self.collective:
            return self._configure_groups()
        shares = self.gssp.momentum_shares()
        periods, paces = self.gssp.exchange_periods(), self.gssp.paces()
        for g, (server, share) in enumerate(zip(self.servers, shares)):
            server.set_update_share.remote(share, self._group_density(g), periods[g], paces[g])

    def _pad_profile_of_dead(self) -> None:
        """A worker lost while profiling would keep the split from ever happening: count it as profiled."""
        gssp = self.gssp
        if gssp is None or gssp.grouped or not self.dead:
            return
        times = [t for w, t in enumerate(gssp.profiler.times()) if gssp.profiler.count[w] and w not in self.dead]
        for w in self.dead:
            while gssp.profiler.count[w] < gssp.profiler.warmup:
                own = gssp.profiler.time(w) if gssp.profiler.count[w] else 0.0
                gssp.observe(w, own or (float(np.median(times)) if times else self.profile.compute_s))
