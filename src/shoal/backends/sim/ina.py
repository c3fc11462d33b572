"""The `sim` backend's in-network aggregation (``network.aggregation = "ina"``, docs/ina.md).

Pushes follow the GRID plan the run set up: a worker assigned to a switch
sends into that switch's link, and the switch forwards one summed stream per
round to the server; the others go straight to the server, every flow at the
plan's honest rate.
"""

from __future__ import annotations

from collections.abc import Iterator

import simpy

from shoal.backends.sim.server import SimServer


class SimInNetwork:
    """In-network aggregation for ``SimBackend`` (its links are made in the backend's constructor)."""

    def _push_in_network(self, w: int, server: SimServer, nbytes: int, round_: int) -> Iterator[simpy.Event]:
        """Push along the plan: straight to the server, or to a switch whose one summed stream goes on.

        Every flow runs at the plan's honest rate. A switch forwards a round's
        sum as one stream into the server's ingress, started by the round's
        first contributor (switches stream fragments on as they complete), so
        the server carries one stream per switch instead of one per worker.
        """
        plan = self.setup.aggregation
        assert plan is not None
        node = plan.node_of[w]
        if node is None:
            yield server.ingress.transfer(nbytes, plan.rate_bps)
            return
        key = (node, round_)
        if key not in self._switch_streams:
            self._switch_streams[key] = [self.env.process(self._forward_sum(server, nbytes)), 0]
        stream = self._switch_streams[key]
        yield self._switch_links[node].transfer(nbytes, plan.rate_bps)
        stream[1] += 1
        if stream[1] == plan.members(node):
            del self._switch_streams[key]
        yield stream[0]

    def _forward_sum(self, server: SimServer, nbytes: int) -> Iterator[simpy.Event]:
        assert self.setup.aggregation is not None
        yield self.env.timeout(self.profile.latency_s)
        yield server.ingress.transfer(nbytes, self.setup.aggregation.rate_bps)
