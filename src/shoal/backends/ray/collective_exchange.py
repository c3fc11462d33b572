"""The exchange between GSSP all-reduce groups, on a rank: its group's own delta out, peer deltas in.

A mixin of ``CollectiveWorker`` (ray_collective): every ``exchange_every``
rounds a group's first rank puts the group's own delta (the state now, less
the state at the last send, less the peer deltas added since) into the
object store once, from a thread, and sends the reference to each peer
group's first rank after the emulated egress; that rank waits out the
ingress and hands the reference to its members. Each member files it in
its inbox; the loop adds what the whole group holds (ray_collective,
``_act_on_agreement``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import torch
import ray


class GroupExchange:
    """Sending the group's own delta and receiving the peers' (the attributes are CollectiveWorker's)."""

    def deliver(self, sender: int, seq: int, epoch: int, delta: list[Any]) -> None:
        """First rank: a peer group's delta (a reference in a list, so Ray does not fetch it here). Waits out
        the emulated peer link, then hands it to every member; returns once all hold it."""
        assert self.plan is not None
        time.sleep(self.peer_link.seconds(self._delta_bytes()))
        others = [h for h in self.plan.member_handles if h is not None]
        ray.get([h.receive.remote(sender, seq, epoch, delta) for h in others])
        self.receive(sender, seq, epoch, delta)

    def receive(self, sender: int, seq: int, epoch: int, delta: list[Any]) -> None:
        if self.plan is not None and epoch == self.plan.epoch:
            with self.inbox_lock:
                self.inbox.put(sender, seq, delta[0])

    def flush(self) -> None:
        """First rank, the group stopped: send the own delta not sent yet; return once every delivery arrived."""
        if self.plan is not None and self.plan.leaders:
            self._send_own()
            self._outbox.join()
            ray.get(self._deliveries)
            self._deliveries = []

    def settle(self) -> None:
        """The group stopped and every delivery arrived: add every peer delta held (the same on every member)."""
        with self.inbox_lock:
            deltas = self.inbox.take_all()
        self._add_peer_deltas(deltas)

    def _send_own(self) -> None:
        """Queue the group's own delta since the last send for the sender thread (the round goes on)."""
        assert self._own is not None and self._received is not None and self.plan is not None
        now = self.engine.initial_state()
        own = [n - b - r for n, b, r in zip(now, self._own, self._received)]
        self._own, self._received = now, tuple(torch.zeros_like(t) for t in now)  # type: ignore[assignment]
        self._rounds = 0
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, daemon=True)
            self._sender.start()
        self._outbox.put((self.plan, self._sent, own[0].cpu().numpy(), own[1].cpu().numpy()))
        self._sent += 1

    def _send_loop(self) -> None:
        """Put each own delta into the object store once and send it to every peer group's first rank, each
        copy after the last has left the emulated egress."""
        while True:
            plan, seq, params, buffers = self._outbox.get()
            try:
                ref = ray.put((params, buffers))
                peers = [h for g, h in enumerate(plan.leaders) if g != plan.index and h is not None]
                for peer in peers:
                    time.sleep(self.peer_link.seconds(self._delta_bytes()))
                    self._deliveries.append(peer.deliver.remote(plan.index, seq, plan.epoch, [ref]))
                if self._deliveries:  # keep only the ones still in flight
                    self._deliveries = ray.wait(self._deliveries, num_returns=len(self._deliveries), timeout=0)[1]
                with self.lock:
                    self._records.append({"event": "exchange", "t": round(time.time() - self._t0, 6),
                                          "group": plan.index, "bytes": self._delta_bytes() * len(peers)})
            except Exception as err:  # noqa: BLE001 - the thread must go on serving the queue (flush joins it)
                with self.lock:
                    self._records.append({"event": "exchange_error", "t": round(time.time() - self._t0, 6),
                                          "group": plan.index, "error": f"{type(err).__name__}: {err}"})
            finally:
                self._outbox.task_done()

    def _delta_bytes(self) -> int:
        return 4 * (self.engine.num_params + self.engine.num_buffer_values)

    def _add_peer_deltas(self, deltas: list[Any]) -> None:
        """Add peer groups' deltas (object references) to the replica; they never count as this group's own."""
        for ref in deltas:
            params, buffers = ray.get(ref)
            delta = (torch.from_numpy(np.array(params)).to(self.device),
                     torch.from_numpy(np.array(buffers)).to(self.device))
            with self.lock:
                self.engine.add_to_state(*delta)
            if self._received is not None:
                for total, part in zip(self._received, delta):
                    total.add_(part)
