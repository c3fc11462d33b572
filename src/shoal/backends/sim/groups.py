"""GSSP on the virtual clock: the first split, regroups, update shares and the exchange between group servers.

A mixin of ``SimBackend`` (backends/sim/backend.py). The pure ``GSSP`` policy
decides (who is grouped with whom, when a group server sends its own
delta); these methods only carry the decisions out: new group servers
from copies of the profiling replica, moved workers pulling their new
group's replica, and each delta through the sender's egress and the
peer's ingress, so the exchange pays for its bytes as uploads do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import simpy

from shoal.backends.sim.server import SimServer
from shoal.sync.gssp import Move


class SimGroups:
    """Carries out the GSSP policy's groupings and exchange schedule on the virtual clock."""

    def _gssp_step(self, w: int, server: SimServer, applied: int, iteration_s: float) -> None:
        gssp = self.gssp
        assert gssp is not None
        if gssp.observe(w, iteration_s) is not None:  # a transient straggler excused or readmitted
            self.server_of(w).wake()
        index = self.servers.index(server)
        if applied and gssp.local_update(index):
            self.env.process(self._exchange(index))
        if (groups := gssp.initial_split()) is not None:
            self._split(groups)
        elif self.recorder.iterations % self.profile.workers == 0:
            self._share_updates()
            if moves := gssp.check_regroup(self.env.now):
                self._regroup(moves)

    def _regroup(self, moves: list[Move]) -> None:
        """Carry out the policy's moves; a server left without members sends what it still holds."""
        assert self.gssp is not None
        for move in moves:
            self.stats[move.worker].group = move.new
            self.force_pull.add(move.worker)  # a moved worker takes its new group's replica
        for s in self.servers:
            s.wake_all()
        for idle in {m.old for m in moves} & set(self.gssp.idle_servers):
            self.env.process(self._exchange(idle))
        self.recorder.event("groups", t=self.env.now, groups=self.gssp.groups, reason="regroup",
                            moves=[[m.worker, m.old, m.new] for m in moves])

    def _split(self, groups: list[list[int]]) -> None:
        """Replace the single profiling server by one server per group, each a copy of its replica."""
        assert self.gssp is not None
        source = self.servers[0]
        self.servers = [
            self._make_server(self.gssp.policy(g), source.replica.clone(self.server_opt) if source.replica else None,
                              source.schedule.restarted(keep_bytes=g == 0) if source.schedule else None)
            for g in range(len(groups))
        ]
        for server in self.servers:
            if server.replica is not None:
                server.replica.set_lr(self.lr)
        self._share_updates()
        self.exchange_codecs = [codec for g in range(len(groups)) if (codec := self.strategy.exchange_codec(g)) is not None]
        self.force_pull.update(range(len(self.stats)))
        for g, members in enumerate(groups):
            for w in members:
                self.stats[w].group = g
        source.wake_all()
        self.recorder.event("groups", t=self.env.now, groups=groups, reason="profiled",
                            times=[round(t, 6) for t in self.gssp.profiler.times()])

    def _share_updates(self) -> bool:
        """Tell each group server the share of all updates it decays its momentum on (``GSSP.momentum_shares``);
        paces follow the speeds (always True)."""
        assert self.gssp is not None
        self.gssp.exchange_periods()
        self.gssp.paces()  # the servers' policies are the GSSP's own objects: set in place
        for server, share in zip(self.servers, self.gssp.momentum_shares()):
            if server.replica is not None and share is not None:
                server.replica.set_update_share(share)
        return True

    def _exchange(self, sender: int) -> Iterator[simpy.Event]:
        """Send the sender's own delta to every peer, without waiting for anyone.

        With a compressor the delta is compressed like an upload (error
        feedback at the sender, the group's density). Each copy leaves through
        the sender's egress and enters through the peer's ingress, shared
        with the workers' pulls and pushes there.
        """
        replica = self.servers[sender].replica
        params, buffers = replica.take_own_delta() if replica is not None else (None, None)
        updates, self.servers[sender].unsent_updates = self.servers[sender].unsent_updates, 0
        codec = self.exchange_codecs[sender] if self.exchange_codecs else None
        density = self.group_density(sender)
        if params is None:
            nbytes = (codec.nominal_bytes(density) if codec else 4 * self.setup.engine.num_params)
            nbytes += self.setup.download_bytes - 4 * self.setup.engine.num_params
        else:
            params, nbytes = codec.encode(params, density) if codec else (params, 4 * params.numel())
            nbytes += 4 * buffers.numel()
        peers = [p for p in range(len(self.servers)) if p != sender]
        self.exchanges += 1
        self.recorder.event("exchange", t=self.env.now, group=sender, bytes=nbytes * len(peers))
        for peer in peers:
            self.env.process(self._deliver_delta(sender, peer, (params, buffers, updates), nbytes))
        yield self.env.timeout(0)

    def _deliver_delta(self, sender: int, peer: int, delta: tuple[Any, Any], nbytes: int) -> Iterator[simpy.Event]:
        server = self.servers[peer]
        yield self.env.timeout(self.profile.latency_s)
        yield self.servers[sender].egress.transfer(nbytes, self.profile.server_bps)
        yield server.ingress.transfer(nbytes, self.profile.server_bps)
        self.bytes_exchange += nbytes
        server.receive_delta(*delta)
