"""All-reduce groups on ray, the driver's side: forming the groups, regrouping them, their optimizer settings.

A mixin of ``RayBackend`` (backends/ray/driver.py), used with ``sync.intra_group =
"allreduce"``: BSP is one group of everyone; GSSP starts as one group while
the workers are profiled and then runs the policy's groups, each its own
process group (ray_collective). A grouping change (the split, a regroup)
stops every group after an agreed iteration, lets each group's first rank
send its last own delta, has every rank add every delta delivered to it (the
replicas are then equal) and forms the new groups from there: a barrier of
the whole cluster, taken only when the policy regroups.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from shoal.backends.group_exchange import StepScale
from shoal.backends.ray.collective import CollectiveWorker, GroupPlan
from shoal.sync.gssp import Move

FORM_TIMEOUT_S = 300.0


class CollectiveGroups:
    """Starts the all-reduce ranks and carries out GSSP's groupings on them."""

    def _ranks_stop_themselves(self) -> bool:
        """BSP on all-reduce: every rank runs its share of run.max_iterations (the driver stops GSSP groups)."""
        return self.collective and self.gssp is None

    def _start_collective(self) -> None:
        """One CollectiveWorker per worker, one group of everyone, no server."""
        params, buffers = self.setup.engine.initial_state()
        p_ref, b_ref = ray.put(params.numpy()), ray.put(buffers.numpy())
        options = self._rank_options()
        for w in range(self.n):
            args = (w, self.cfg, self._shards[w], self.setup.dataset.num_classes, self.speeds[w],
                    self.profile.compute_s, self.setup.n_train, p_ref, b_ref)
            self.workers[w] = self._actor(CollectiveWorker, options, args, "worker")
        self._wait_ready([self.evaluator])
        self._status(f"joining {self.n} workers into one all-reduce group")
        self._settings_version = 0
        self._kept: dict[int, Any] = {}  # per group index: its optimizer state and scale, through regroups
        self._form([list(range(self.n))])
        self.t0 = time.time() - self.offset
        self._launch_ranks()
        self.started = True

    def _form(self, groups: list[list[int]]) -> None:
        """Every non-empty group meets at its first rank's rendezvous and forms (ranks in id order)."""
        local = not self.cfg.backend.address
        groups = [sorted(g) for g in groups]
        inits = ray.get([self.workers[g[0]].rendezvous.remote(local) for g in groups if g])
        plans = self._plans(groups)
        calls = [self.workers[w].form.remote(init, plans[w], local, self._kept.get(plans[w].index))
                 for init, members in zip(inits, [g for g in groups if g]) for w in members]
        ray.get(calls, timeout=FORM_TIMEOUT_S)
        self._formed = groups

    def _plans(self, groups: list[list[int]]) -> dict[int, GroupPlan]:
        """Each rank's plan: its group, rank, step scale; a first rank also gets the peers it exchanges with."""
        opt = self.cfg.optimizer
        exchanging = self.gssp is not None and len(groups) > 1
        shares = self._shares(groups)
        periods = self.gssp.exchange_periods() if exchanging else [0] * len(groups)
        leaders = tuple(self.workers[g[0]] if g else None for g in groups) if exchanging else ()
        total = self.cfg.run.max_iterations
        budget = max(1, total // self.n) if total and self._ranks_stop_themselves() else 0
        momentum = opt.momentum if opt.name == "sgd" else 0.0
        plans = {}
        for index, members in enumerate(groups):
            scale = StepScale(len(members), self.n, momentum, shares[index])
            for rank, w in enumerate(members):
                first = rank == 0
                plans[w] = GroupPlan(
                    index=index, rank=rank, members=tuple(members), groups=len(groups), scale=scale, lr=self.lr,
                    epoch=self.epoch, budget=budget, leaders=leaders if first else (),
                    member_handles=tuple(self.workers[m] for m in members[1:]) if first and exchanging else (),
                    exchange_every=periods[index])
        return plans

    def _launch_ranks(self) -> None:
        for w in range(self.n):
            self.alive.add(w)
            self._run_refs[self.workers[w].run.remote(self.t0)] = w

    def _reform(self, groups: list[list[int]], keep_optimizers: bool) -> bool:
        """Stop every group, deliver and add every delta, form ``groups``, go on. False: a rank failed (the run
        then stops, as any all-reduce failure does).

        ``keep_optimizers`` (a regroup): group g goes on with the optimizer
        state group g had (a group left without members keeps it for later),
        as a group server keeps its own when workers move; otherwise (the
        split) every group starts a fresh one, as the new group servers do.
        """
        start = time.perf_counter()
        for w in self.alive:
            self.workers[w].stop.remote()
        refs = list(self._run_refs)
        ready, running = ray.wait(refs, num_returns=len(refs), timeout=FORM_TIMEOUT_S)
        if running:
            raise RuntimeError(f"{len(running)} all-reduce ranks did not stop within {FORM_TIMEOUT_S:.0f} s "
                               "for a regroup")
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                self._worker_ended(ref)
                return False
        self._run_refs.clear()
        if keep_optimizers:
            self._kept |= {g: self.workers[members[0]].optimizer_state.remote()
                           for g, members in enumerate(self._formed) if members}
        else:
            self._kept = {}
        stopped = time.perf_counter()
        ray.get([self.workers[g[0]].flush.remote() for g in self._formed if g], timeout=FORM_TIMEOUT_S)
        ray.get([self.workers[w].settle.remote() for w in sorted(self.alive)], timeout=FORM_TIMEOUT_S)
        settled = time.perf_counter()
        self.epoch += 1
        self._form(groups)
        self._launch_ranks()
        formed = time.perf_counter()
        self.recorder.event("regroup_pause", t=self.now(), stop_s=round(stopped - start, 4),
                            settle_s=round(settled - stopped, 4), form_s=round(formed - settled, 4))
        return True

    def _collective_split(self, groups: list[list[int]]) -> None:
        if not self._reform(groups, keep_optimizers=False):
            return
        for g, members in enumerate(groups):
            for w in members:
                self.stats[w].group = g
        self.recorder.event("groups", t=self.now(), groups=groups, reason="profiled",
                            times=[round(t, 6) for t in self.gssp.profiler.times()])

    def _collective_regroup(self, moves: list[Move]) -> None:
        if not self._reform([list(g) for g in self.gssp.groups], keep_optimizers=True):
            return
        for move in moves:
            self.stats[move.worker].group = move.new
        self.recorder.event("groups", t=self.now(), groups=self.gssp.groups, reason="regroup",
                            moves=[[m.worker, m.old, m.new] for m in moves])

    def _configure_groups(self) -> None:
        """The decayed learning rate and each group's momentum share (``GSSP.momentum_shares``), to every rank;
        a group's ranks switch to them after the same iteration."""
        self._settings_version += 1
        for members, share in zip(self._formed, self._shares(self._formed)):
            for w in members:
                self.workers[w].configure.remote(self.epoch, self._settings_version, self.lr, share)

    def _shares(self, groups: list[list[int]]) -> list[float | None]:
        """Each group's momentum share (``GSSP.momentum_shares``; None: its optimizer's own momentum)."""
        if self.gssp is not None and len(groups) > 1:
            return self.gssp.momentum_shares()
        return [None] * len(groups)

    def _collective_states(self) -> list[Any]:
        """What is evaluated: each group's first rank's replica (its members hold the same)."""
        return [self.workers[g[0]].state.remote() for g in self._formed if g]

    def _rank_event(self, event: dict[str, Any]) -> None:
        """An event a first rank recorded: ``exchange`` (its group's delta sent: the summary's counters too) or
        ``exchange_error`` (a send that failed)."""
        kind = event.pop("event")
        if kind == "exchange":
            self._exchange_totals["exchanges"] += 1
            self._exchange_totals["bytes_exchange"] += event["bytes"]
        self.recorder.event(kind, **event)
