"""The `sim` backend's side of Streaming DiLoCo's overlap (``sync.streaming_diloco.overlap_steps``).

A worker that sends a fragment's change at the end of step ``t`` does not
wait for the exchange: a simpy process carries the upload, waits for the
round's other uploads, and brings the new fragment back, while the worker's
own process computes the next steps. Before step ``t + overlap + 1`` the
worker waits for that process (only the part of the exchange its steps did
not hide costs time), then takes the fragment with mixing
(``LocalModel.pull``). The policy's rounds stay in clock order because the
server receives each push when it is sent (``_deliver``), as on the wire
the bytes would still be travelling: the server's replica moves a transfer
early, but no worker reads the fragment before its exchange is done.
"""

from __future__ import annotations

from collections.abc import Iterator

import simpy

from shoal.backends.local_model import pull_bytes
from shoal.backends.sim.server import Push, SimServer


class SimOverlap:
    """Overlapped exchanges for ``SimBackend``: started at a sync push, awaited before the step that takes them."""

    def _init_overlap(self) -> tuple[int, float]:
        """``(overlap steps, mixing)`` from the strategy, and the bookkeeping of exchanges in flight."""
        self._overlap_exchanges: dict[tuple[int, int], simpy.Process] = {}  # (worker, clock sent) -> its exchange
        self._overlap_uploads: dict[int, list] = {}  # clock -> [uploads finished, event: all of that round's are in]
        return self.strategy.overlap

    def _start_exchange(self, w: int, server: SimServer, push: Push, clock: int) -> None:
        """Send ``w``'s sync of ``clock`` beside its next steps."""
        self._overlap_exchanges[(w, clock)] = self.env.process(self._overlapped_exchange(w, server, push, clock))

    def _overlapped_exchange(self, w: int, server: SimServer, push: Push, clock: int) -> Iterator[simpy.Event]:
        """One overlapped sync: upload the change, wait until every worker's is in, download the fragment.

        The server applies the round as the last push arrives (``_deliver``
        runs at send time, so the policy's rounds stay in clock order); the
        worker takes the result only after this process ends, ``overlap``
        steps later, so the transfers cost time only where they outlast them.
        """
        profile = self.profile
        yield self.env.timeout(profile.latency_s)
        yield server.ingress.transfer(push.nbytes, profile.link_bps)
        round_ = self._overlap_uploads.setdefault(clock, [0, self.env.event()])
        round_[0] += 1
        if round_[0] == len(server.policy.clocks):
            round_[1].succeed()
            del self._overlap_uploads[clock]
        yield round_[1]
        assert push.delta_mask is not None
        values = sum(sl.stop - sl.start for sl, sent in zip(self.slices, push.delta_mask) if sent)
        down = pull_bytes(values, self.setup.num_buffer_values, push.delta_mask, server.broadcast, changed=True)
        yield self.env.timeout(profile.latency_s)
        yield server.egress.transfer(down, profile.link_bps)

    def _exchanged(self, w: int, clock: int) -> Iterator[simpy.Event]:
        """Wait for ``w``'s exchange of the sync it sent at ``clock``, if it sent one."""
        exchange = self._overlap_exchanges.pop((w, clock), None)
        if exchange is not None and not exchange.triggered:
            yield exchange | self.stop
