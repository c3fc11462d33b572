"""Workers joining and leaving a simulated run (``cluster.membership``).

A mixin of ``SimBackend`` (backends/sim/backend.py), the model of what the ray
backend does with the same schedule: a joiner takes the next id, a copy of
the shard of worker ``id mod workers`` (its own shuffle order), its own
codec and straggler stream, and starts at its group's slowest clock; under
GSSP the pure policy places it (``GSSP.join``) and regroups it once
profiled. A leaver is forgotten by its server (a BSP round it held is
applied) and its process ends at its next step. A gradient's weight is 1/N
of the workers taking part, so the update per sample stays the same.
"""

from __future__ import annotations

from collections.abc import Iterator

import simpy

from shoal.backends.local_model import LocalModel
from shoal.data import BatchStream
from shoal.engine.metrics import WorkerStats


class SimMembership:
    """Carries out ``cluster.membership`` on the virtual clock."""

    def weight(self) -> float:
        """A gradient's weight: 1/N of the workers taking part (configured + joined - left)."""
        return 1.0 / max(1, len(self.stats) - len(self.departed))

    def _reweigh(self) -> None:
        for server in self.servers:
            server.weight = self.weight()

    def _membership(self) -> Iterator[simpy.Event]:
        speeds = iter(self.cfg.cluster.joiner_speeds())
        for change in self.cfg.cluster.schedule():
            yield self.env.timeout(max(0.0, change.at_s - self.env.now))
            for _ in range(change.add):
                self._join(next(speeds))
            for w in change.remove:
                self._leave(w)

    def _join(self, speed: float) -> int:
        w = len(self.stats)
        self.speeds.append(speed)
        self.stragglers.add_worker(self.cfg.run.seed)
        if self.setup.train_mode:
            source = self.setup.streams[w % self.profile.workers]
            self.setup.streams.append(BatchStream(self.setup.dataset, source.shard, self.cfg.data.batch_size,
                                                  self.cfg.run.seed, w))
        if self.codecs:
            self.codecs.append(self.strategy.codec(w))
        if self.delta_codecs:
            self.delta_codecs.append(self.strategy.delta_codec(w))
        if self.locals:
            params, buffers = self.setup.engine.initial_state()
            self.locals.append(LocalModel(params, buffers, self.cfg.optimizer, self.strategy.layout))
            self.locals[-1].set_lr(self.lr)  # the schedule's rate now, not its start
        group = self.gssp.join(w) if self.gssp is not None else 0
        if self.gssp is None:
            self.servers[0].policy.add(w)
        self.stats.append(WorkerStats(id=w, group=group, speed=speed))
        self.force_pull.add(w)  # SIM, local SGD: the joiner takes its group's whole replica first
        self.env.process(self._worker(w))
        self._reweigh()
        self.recorder.event("worker_joined", t=self.env.now, worker=w, group=group, speed=speed)
        return w

    def _leave(self, w: int) -> None:
        self.departed.add(w)
        if self.gssp is not None:
            self.servers[self.gssp.leave(w)].wake_all()
        else:
            self.servers[0].remove(w)
        self._reweigh()
        self.recorder.event("worker_left", t=self.env.now, worker=w)
