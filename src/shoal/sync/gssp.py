"""GSSP: grouped stale-synchronous parallel, as a pure policy.

Workers of similar speed form a group with its own group server (replica and
optimizer). Inside a group, SSP with bound ``staleness``; so a slow worker
holds back only its own group. Group servers exchange their *own*
accumulated deltas every ``exchange_every`` local updates, without waiting.

Lifecycle: the run starts as one group (SSP over everyone) while the
profiler measures iteration times; after ``profile_iterations`` per worker
(and, for a worker that looks slow while fewer than ``confirm_fraction`` of
them do, slow iterations in a row for ``confirm_span`` of the fastest
worker's iteration times: a slow spell is not a slow worker, and spread
speeds make many look slow) the workers are split into
natural-breaks groups and every group server starts from a copy of that
single replica (so no delta is in flight at the split). Later regroups move
workers between the existing group servers; the number of servers stays
what the first grouping chose.

Membership may change (``join``, ``leave``): a joiner trains in the fastest
group until it is profiled, then the next regroup places it by its speed.

``intra_group = "allreduce"``: each group is synchronous instead (BSP, its
members all-reduce their gradients and keep equal replicas), the exchange
between groups stays asynchronous. An all-reduce cannot finish without a
member, so nobody is excused as a transient straggler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shoal.cluster.grouping import Groups, IterationProfiler, Regrouper, canonical, choose_groups
from shoal.config import GSSPOptions
from shoal.sync.base import SchemeSpec, SyncPolicy, register_scheme
from shoal.sync.policies import BSP, SSP, PacedSSP


@dataclass(frozen=True)
class Move:
    """A worker moved from one group server to another."""

    worker: int
    old: int
    new: int


class GSSP:
    """Group membership, per-group SSP gating and the exchange schedule."""

    name = "gssp"

    def __init__(self, workers: int, options: GSSPOptions | None = None, intra_group: str = "server") -> None:
        """GSSP over ``workers`` workers with the ``[sync.gssp]`` section's options (its defaults when None)."""
        o = GSSPOptions() if options is None else options
        self.options = o
        self.workers, self.staleness, self.exchange_every = workers, o.staleness, o.exchange_every
        self.allreduce = intra_group == "allreduce"
        self.paced = o.paced and not self.allreduce
        self.exchange_clock = o.exchange_clock
        self.group_momentum = o.group_momentum
        self.groups_setting, self.threshold, self.max_groups = o.groups, o.group_threshold, o.max_groups
        self.split_ratio = o.split_ratio
        self.transient_factor = o.transient_factor
        self.confirm_span, self.confirm_fraction = o.confirm_span, o.confirm_fraction
        self._confirm: bool | None = None  # whether slow-looking workers confirm (decided once all are profiled)
        self.profiler = IterationProfiler(workers, warmup=o.profile_iterations, window=o.profile_window)
        self.regrouper = Regrouper(o.groups, o.group_threshold, o.max_groups, o.regroup_margin, o.regroup_patience,
                                   o.split_ratio, o.regroup_cooldown_s) if o.regroup else None
        self.grouped = False
        self.groups: Groups = [list(range(workers))]
        self.policies: list[SyncPolicy] = [self.group_policy(range(workers))]
        self.server_of: dict[int, int] = {w: 0 for w in range(workers)}
        self.present: set[int] = set(range(workers))  # workers taking part now (joins and leaves change it)
        self.joined: set[int] = set()  # workers that joined after the start
        self._since_exchange = [0]
        self._periods = [o.exchange_every]

    @property
    def servers(self) -> int:
        return len(self.policies)

    def policy(self, server: int) -> SyncPolicy:
        return self.policies[server]

    def group_policy(self, members: Sequence[int]) -> SyncPolicy:
        """A group's own sync: SSP on a group server (paced SSP once grouped, if ``paced``), or BSP for an all-reduce group."""
        if self.allreduce:
            return BSP(members)
        return PacedSSP(members, self.staleness) if self.paced and self.grouped else SSP(members, self.staleness)

    def paces(self) -> list[dict[int, float]]:
        """Each group's paces (``PacedSSP``): a member's profiled iteration time over its group's slowest.

        Empty dicts unless ``paced`` and grouped. Backends call it with
        ``update_shares`` (every round) and hand each dict to its server's
        policy, so paces follow drifting speeds; on sim the policies are
        these objects and are set here too.
        """
        if not (self.paced and self.grouped):
            return [{} for _ in self.policies]
        times = self.profiler.times()
        out: list[dict[int, float]] = []
        for policy, members in zip(self.policies, self.groups):
            timed = [w for w in members if self.profiler.count[w]]
            slowest = max((times[w] for w in timed), default=0.0)
            paces = {w: min(1.0, times[w] / slowest) for w in timed} if slowest > 0 else {}
            if isinstance(policy, PacedSSP):
                policy.set_paces(paces)
            out.append(paces)
        return out

    def observe(self, worker: int, iteration_s: float) -> bool | None:
        """Record one iteration time (compute + communication) of ``worker``.

        An iteration over ``transient_factor`` times the worker's reference
        speed marks a transient straggler: its group stops waiting for it
        (``SyncPolicy.excuse``) until an iteration at that speed readmits it.
        The reference is the worker's own profiled speed after the split. While
        the split waits for slow-looking workers to confirm their speed
        (``confirming``) it is the fastest profiled worker's (a worker's own
        profile is not known yet then), so nobody waits for them.
        Returns True (excused), False (readmitted) or None (no change), so the
        backend can release waiters or tell the server.
        """
        self.profiler.observe(worker, iteration_s)
        if not self.transient_factor or self.allreduce or worker not in self.present \
                or not (self.grouped or self.confirming()):
            return None
        policy = self.policies[self.server_of[worker]]
        factor = self.transient_factor if self.grouped else min(self.transient_factor, self.split_ratio)
        if iteration_s > factor * self._reference(worker):
            return True if policy.excuse(worker) else None
        return False if policy.readmit(worker) else None

    def _reference(self, worker: int) -> float:
        """The speed ``worker`` is compared with to tell a transient straggler (see ``observe``)."""
        return self.profiler.time(worker) if self.grouped else self._fastest()

    def _fastest(self) -> float:
        times = self.profiler.times()
        return min((times[w] for w in self.present if self.profiler.count[w]), default=float("inf"))

    def limit_groups(self, most: int) -> None:
        """Form at most ``most`` groups, at the first split and at every regroup (the servers a backend can place)."""
        self.max_groups = min(self.max_groups, most)
        if self.regrouper is not None:
            self.regrouper.max_groups = self.max_groups

    def confirming(self) -> bool:
        """Whether slow-looking workers must confirm their speed before the split (and before a regroup moves them).

        Decided once, when every present worker is first profiled: only with
        ``confirm_span`` and ``transient_factor``, and only when fewer than
        ``confirm_fraction`` of the present workers look over ``split_ratio``
        times the fastest. Slow spells hit a few workers at a time; when many
        look slow, speeds are truly spread, and the split is taken on the
        profiles at once (exactly as with ``confirm_span = 0``): confirming
        them all would run the cluster as ASP for the span and split late.
        """
        if self._confirm is None:
            if not (self.transient_factor and self.confirm_span):
                self._confirm = False
            elif all(self.profiler.profiled(w) for w in self.present):
                limit = self.split_ratio * self._fastest()
                times = self.profiler.times()
                slow = sum(times[w] > limit for w in self.present)
                self._confirm = slow < self.confirm_fraction * len(self.present)
        return bool(self._confirm)

    def _ready(self, worker: int, fastest: float) -> bool:
        """Profiled enough to be grouped: for the first grouping, and a joiner for regrouping.

        Telling a slow spell from a slow worker takes as long as the spell.
        A worker whose profile is over ``split_ratio`` times the fastest (slow
        enough to be split off) is split off only once its iterations were all
        that slow for the last ``confirm_span`` times the fastest worker's
        iteration time; while any of them was fast it is measured on (its
        running low quantile forgets a spell that ended), at most for
        ``profile_window`` iterations. Measured in time, not in its own
        iterations, so a worker far slower than any spell confirms in few
        of them. Its slow
        iterations are excused meanwhile (``observe``), so the wait costs the
        others little. ``fastest``: ``_fastest()``, read once by the caller for all workers.
        """
        profiler = self.profiler
        if not profiler.profiled(worker):
            return False
        if not self.confirming() or profiler.count[worker] >= profiler.window:
            return True
        limit = self.split_ratio * fastest
        if profiler.time(worker) <= limit:
            return True
        span = self.confirm_span * fastest
        least, lasted = profiler.recent_span(worker, span)
        return lasted >= span and least > limit

    def local_update(self, server: int) -> bool:
        """Count one update applied at ``server``; True when it should send its delta to peers."""
        if self.servers == 1:
            return False
        self._since_exchange[server] += 1
        if self._since_exchange[server] >= self._periods[server]:
            self._since_exchange[server] = 0
            return True
        return False

    def join(self, worker: int) -> int:
        """Admit a new worker (the next id); returns its server.

        Before the split it joins the one group (and the split waits for its
        profile). After it, it trains in the fastest active group until
        profiled, then the next regroup moves it to the group of its speed.
        Not the slowest: a slow group applies a small share of all updates, so
        under ``group_momentum = "global"`` each of its updates is a large step
        (``Replica.set_update_share``); a fast joiner there turned those into
        many large steps, and training collapsed (benchmarks/churn.py on ray).
        In the fastest group a slow joiner holds its group back for at most its
        profiling iterations (the SSP bound).
        """
        if worker != len(self.profiler.count):
            raise ValueError(f"joiners take the next id ({len(self.profiler.count)}), not {worker}")
        self.profiler.add()
        self.present.add(worker)
        self.joined.add(worker)
        server = 0
        if self.grouped:
            times = self.profiler.times()
            active = [s for s, g in enumerate(self.groups) if g]
            server = min(active, key=lambda s: float(np.median([times[w] for w in self.groups[s]])))
        self.policies[server].add(worker)
        self.server_of[worker] = server
        self.groups[server] = sorted(self.policies[server].clocks)
        return server

    def leave(self, worker: int) -> int:
        """A worker leaves for good; returns the server it left (whose policy no longer counts it)."""
        server = self.server_of.pop(worker)
        self.present.discard(worker)
        self.policies[server].remove(worker)
        self.groups[server] = sorted(self.policies[server].clocks)
        return server

    def _present_times(self) -> tuple[list[int], list[float]]:
        """The present workers' ids and the times grouping sees (nobody who left).

        While ``confirming`` a worker also counts as fast as the fastest
        of its iterations in the last ``confirm_span`` times the fastest
        worker's iteration time: it moves to a slower group only once it was
        slow that long in a row, not on a burst of spells that fills most of
        the window (speed-ups show after one fast iteration).
        """
        ids = sorted(self.present)
        times = self.profiler.times()
        if self.confirming():
            span = self.confirm_span * self._fastest()
            return ids, [min(times[w], self.profiler.recent_span(w, span)[0]) for w in ids]
        return ids, [times[w] for w in ids]

    def initial_split(self) -> Groups | None:
        """The first grouping, once every present worker has been profiled (None: not yet, or already)."""
        if self.grouped:
            return None
        if not all(self.profiler.profiled(w) for w in self.present):
            return None  # checked first: ``_ready`` per worker costs O(workers) while ``confirming`` is undecided
        fastest = self._fastest()
        if not all(self._ready(w, fastest) for w in self.present):
            return None
        self.grouped = True
        ids, times = self._present_times()
        groups = [[ids[i] for i in g] for g in choose_groups(times, self.groups_setting, self.threshold,
                                                               self.max_groups, self.split_ratio)]
        self._install(groups)  # a first correction may follow at once: the cooldown runs between regroups
        return groups

    def restore(self, groups: Groups, profile_times: Sequence[float], confirming: bool | None = None) -> None:
        """Back into the grouped state of a checkpoint: its groups, each worker profiled at its checkpointed speed.

        ``confirming``: the checkpoint's choice (``confirming``); None (a
        checkpoint written before it was recorded) decides it again from the
        checkpointed speeds.
        """
        for w, seconds in enumerate(profile_times):
            for _ in range(self.profiler.warmup):
                self.profiler.observe(w, seconds)
        self._confirm = confirming
        self.confirming()
        self.grouped = True
        self._install(groups)

    def check_regroup(self, now: float = float("inf")) -> list[Move]:
        """Move workers if their observed speeds drifted enough (hysteresis in the Regrouper).

        Speeds that converge merge groups: a server may end with no members
        (``idle_servers``); it keeps receiving its peers' deltas, so it can
        take members again later. The number of servers never exceeds what
        the first grouping chose.
        """
        if not self.grouped or self.regrouper is None or self.servers == 1:
            return []
        fastest = self._fastest()
        if not all(self._ready(w, fastest) if w in self.joined else self.profiler.profiled(w) for w in self.present):
            return []  # a joiner is still being profiled
        ids, present_times = self._present_times()
        index = {w: i for i, w in enumerate(ids)}
        current = [[index[w] for w in g] for g in self.groups if g]
        proposal = self.regrouper.propose(present_times, current, now)
        if proposal is None:
            return []
        times = self.profiler.times()
        proposal = self._fit_to_servers([[ids[i] for i in g] for g in proposal], times)
        moves = [
            Move(w, self.server_of[w], new)
            for new, members in enumerate(proposal)
            for w in members
            if self.server_of[w] != new
        ]
        for move in moves:
            self.policies[move.old].remove(move.worker)
            self.policies[move.new].add(move.worker)
            self.server_of[move.worker] = move.new
        self.groups = [sorted(self.policies[s].clocks) for s in range(self.servers)]
        self.paces()
        return moves

    def update_shares(self) -> list[float]:
        """Each server's expected fraction of all updates, from the profiled iteration times.

        An SSP group advances at about the pace of its slowest member, so a
        group of n workers whose slowest takes t seconds applies n / t updates
        per second; a paced group (``paced``) at the sum of its members' rates.
        """
        times = self.profiler.times()
        if self.paced:
            rates = [sum(1.0 / times[w] for w in g if times[w] > 0) for g in self.groups]
        else:
            rates = [len(g) / max(times[w] for w in g) if g else 0.0 for g in self.groups]
        total = sum(rates)
        return [r / total if total else 0.0 for r in rates]

    def momentum_shares(self) -> list[float | None]:
        """The share of all updates each group server decays its SGD momentum on (``Replica.set_update_share``).

        ``server`` (the paper): None, every server its own momentum. ``global``:
        each server's own share, so momentum decays on the clock of all
        updates, but a server with a small share then takes few large steps
        (a step of (1 - m^(1/q)) / (1 - m) times lr: 8x for a group with 1/15
        of the updates), and the heavy-ball step is stable only while lr x
        curvature stays under 2 (1 + momentum): training drives the curvature
        to what the busiest group tolerates, and the groups that kick harder
        overshoot there. ``busiest``: every server at the busiest server's
        share, so no group steps harder per update than the busiest; a group
        with share q then keeps pushing q_max / q times as long in time as on
        one server (the paper's rule: 1 / q). Every mode moves each gradient
        by lr / (1 - m) in total.
        """
        if self.group_momentum == "server":
            return [None] * self.servers
        shares = self.update_shares()
        if self.group_momentum == "busiest":
            return [max(shares)] * len(shares)
        return shares

    def exchange_periods(self) -> list[int]:
        """Each group server's own updates between two sends of its delta (what ``local_update`` counts from now on).

        ``exchange_clock = "own"``: ``exchange_every`` for every server, as
        the paper. ``"global"``: in proportion to the server's share of all
        updates, ``exchange_every`` for a group of average share; so every
        group sends about equally often *in time*, and a slow group's delta
        is not many of its (large, under global momentum) steps old when it
        arrives. Backends call this whenever they tell servers their shares.
        """
        if self.exchange_clock == "global" and self.servers > 1:
            shares = self.update_shares()
            active = sum(1 for share in shares if share > 0) or 1
            self._periods = [max(1, round(self.exchange_every * share * active)) for share in shares]
        else:
            self._periods = [self.exchange_every] * self.servers
        return list(self._periods)

    def _install(self, groups: Groups) -> None:
        self.groups = [sorted(g) for g in groups]
        self.policies = [self.group_policy(g) for g in self.groups]
        self.server_of = {w: s for s, g in enumerate(self.groups) for w in g}
        self._since_exchange = [0] * len(groups)
        self._periods = [self.exchange_every] * len(groups)
        self.paces()

    @property
    def idle_servers(self) -> list[int]:
        """Servers that have no members (their groups merged into others)."""
        return [s for s, g in enumerate(self.groups) if not g]

    def _fit_to_servers(self, proposal: Groups, times: Sequence[float]) -> Groups:
        """Map a proposal onto the fixed servers, each group to the free server holding most of its members."""
        proposal = sorted(canonical(proposal), key=lambda g: min(times[w] for w in g))
        while len(proposal) > self.servers:  # merge the two slowest groups
            last = proposal.pop()
            proposal[-1] = sorted(proposal[-1] + last)
        slots: Groups = [[] for _ in range(self.servers)]
        free = set(range(self.servers))
        for group in sorted(proposal, key=len, reverse=True):
            best = max(sorted(free), key=lambda s: sum(self.server_of[w] == s for w in group))
            slots[best] = group
            free.remove(best)
        return slots


register_scheme(SchemeSpec("gssp", coordinator=lambda workers, sync: GSSP(workers, sync.gssp, sync.intra_group),
                           allreduce=True, color="#d62728", baseline=False, balance=("batch",),
                           grid=(("sync.gssp.group_threshold", (0.85, 0.95, 0.99)),)),
                "grouped SSP: workers of similar speed form groups (SSP inside, asynchronous deltas between)")
