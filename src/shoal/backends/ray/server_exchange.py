"""The group server's side of GSSP's delta exchange (a mixin of ``GroupServer``, backends/ray/server.py).

Every ``exchange_every`` updates a group server sends its own delta (the
updates its group made since the last exchange) to every peer, fire and
forget through the object store, compressed like an upload when a
compressor is configured; a peer waits out the emulated transfer before it
adds the delta, and counts every update in it, so staleness is in real
updates.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import ray

from shoal.backends.ray.wire import as_tensor


class GroupExchange:
    """Sending the own delta to the peer group servers and taking theirs (state lives in ``GroupServer``)."""

    def _exchange_due(self) -> bool:
        if len(self.peers) < 2:
            return False
        self._since_exchange += 1
        if self._since_exchange < self.exchange_every:
            return False
        self._since_exchange = 0
        return True

    def _exchange(self) -> None:
        """Send the own delta to every peer without waiting (fire and forget through the object store).

        Compressed like an upload when a compressor is configured (the residual
        stays here, error feedback); the copies leave through this server's
        emulated egress one after another, then each waits out the peer's ingress.
        """
        assert self.replica is not None
        params, buffers = self.replica.take_own_delta()
        updates, self.unsent_updates = self.unsent_updates, 0
        if self.exchange_codec is not None:
            params, nbytes = self.exchange_codec.encode(params, self.exchange_density)
        else:
            nbytes = 4 * params.numel()
        nbytes += 4 * buffers.numel()
        peers = [p for i, p in enumerate(self.peers) if i != self.index]
        self.exchanges += 1
        self._events.append({"event": "exchange", "t": round(time.time() - self.t0, 6), "group": self.index,
                             "bytes": nbytes * len(peers)})
        task = asyncio.get_running_loop().create_task(
            self._send_delta(peers, params.numpy(), buffers.numpy(), nbytes, updates))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_delta(self, peers: list[Any], params: np.ndarray, buffers: np.ndarray, nbytes: int,
                          updates: int) -> None:
        p_ref, b_ref = ray.put(params), ray.put(buffers)
        for peer in peers:
            delay = self.peer_link.seconds(nbytes)  # this copy's turn on the egress
            if delay > 0:
                await asyncio.sleep(delay)
            peer.receive_delta.remote(p_ref, b_ref, nbytes, updates)

    async def receive_delta(self, params: np.ndarray, buffers: np.ndarray, nbytes: int, updates: int = 1) -> None:
        """A peer's own delta of ``updates`` updates: wait out the emulated transfer, then add it (to the replica it
        was sent to). The version counts every update the delta holds, so staleness is in real updates."""
        replica = self.replica
        delay = self.peer_link.seconds(nbytes)
        if delay > 0:
            await asyncio.sleep(delay)
        if self.replica is None or self.replica is not replica or self.stopping:
            return
        self.replica.receive_delta(as_tensor(params), as_tensor(buffers))
        self.version += updates
        self.bytes_exchange += nbytes
