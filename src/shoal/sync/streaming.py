"""Streaming DiLoCo: DiLoCo that synchronises one fragment of the model at a time, overlapped with compute.

Douillard et al. (2025), "Streaming DiLoCo with overlapping communication":
the model's tensors are cut into ``P`` fragments; fragment ``p`` is
synchronised once every ``H`` local steps like DiLoCo, but the fragments'
turns are staggered (every ``H / P`` steps one of them), so a worker never
sends the whole model at once: its peak upload is about ``1 / P`` of
DiLoCo's. With ``overlap_steps = tau`` a worker sends fragment ``p``'s change
at the end of step ``t`` and keeps computing; it takes the fragment's new
global value only before step ``t + tau + 1``, mixing it with what its own
``tau`` steps did meanwhile (``theta <- alpha theta_local + (1 - alpha)
theta_global``, ``alpha = sync.streaming_diloco.mixing``). The outer
gradients may travel quantised (``outer_quantization``: int8 or fp4, with
error feedback, compress/quantize.py).

Pure parts only: the cut of the layout at equal fragment boundaries
(``split_at_fragments``, the scheme's ``sync_layout``: every backend slices
the flat parameters by it, so a piece of a cut tensor travels as a tensor
of its own), the fragment assignment, the per-tensor plan
(``FragmentSchedule``, the same questions SIM's schedule answers) and the
gate (``StreamingDiLoCo``). The backends drive them as they drive local
SGD: workers step their own models (backends/local_model.py), the server
takes a per-tensor outer Nesterov step (``Replica.add_delta`` with a mask).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from shoal.config import fragment_offsets, max_overlap
from shoal.errors import ConfigError
from shoal.sync.base import SchemeSpec, register_scheme
from shoal.sync.localsgd import LocalSGD, PeriodicSchedule

if TYPE_CHECKING:  # naming the schemes must not import torch (shoal route needs none)
    import torch

    from shoal.engine.gradients import TensorSlot


def fragment_bounds(total: int, fragments: int) -> tuple[int, ...]:
    """The ``fragments - 1`` inner boundaries that cut ``total`` values into equal shares (within one value)."""
    return tuple(total * k // fragments for k in range(1, fragments))


def split_at_fragments(layout: Sequence[TensorSlot], fragments: int) -> tuple[TensorSlot, ...]:
    """The layout with every tensor that a fragment boundary falls inside cut there.

    The flat parameters are cut at ``fragment_bounds``; a cut tensor becomes
    flat pieces named ``name[a:b]`` (its values a to b), each a slot of its
    own, so plans, codecs and outer steps treat it as a tensor. At most
    ``fragments - 1`` tensors are cut; a layout no boundary falls inside is
    returned as it was.
    """
    if fragments < 1:
        raise ValueError("fragments must be >= 1")
    base = layout[0].offset if layout else 0
    bounds = [base + b for b in fragment_bounds(sum(s.numel for s in layout), fragments)]
    out: list[TensorSlot] = []
    for slot in layout:
        start, end = slot.offset, slot.offset + slot.numel
        edges = [start, *(b for b in bounds if start < b < end), end]
        if len(edges) == 2:
            out.append(slot)
            continue
        out.extend(replace(slot, name=f"{slot.name}[{a - start}:{b - start}]", shape=(b - a,), offset=a, numel=b - a)
                   for a, b in zip(edges, edges[1:]))
    return tuple(out)


def equal_fragments(offsets: Sequence[int], numels: Sequence[int], fragments: int) -> tuple[int, ...]:
    """Each slot's fragment when the layout was cut by ``split_at_fragments``: the share its first value lies in
    (a slot never crosses a boundary). With at least ``fragments`` values every fragment gets a slot."""
    if sum(numels) < fragments:
        raise ValueError(f"{fragments} equal fragments need at least {fragments} parameter values")
    base = offsets[0] if offsets else 0
    bounds = fragment_bounds(sum(numels), fragments)
    out = []
    for offset, numel in zip(offsets, numels):
        fragment = bisect.bisect_right(bounds, offset - base)
        if fragment < fragments - 1 and offset - base + numel > bounds[fragment]:
            raise ValueError(f"the slot at {offset} crosses a fragment boundary: cut the layout first")
        out.append(fragment)
    return tuple(out)


def assign_fragments(names: Sequence[str], numels: Sequence[int], fragments: int,
                     pattern: str | None = None) -> tuple[int, ...]:
    """Each tensor's fragment, in ``[0, fragments)``.

    Without a pattern the tensors, in model order, are cut into ``fragments``
    contiguous runs of about equal size (a run ends once it holds its share
    of the values). With a pattern (a regular expression with one group that
    captures a number, e.g. ``blocks\\.(\\d+)\\.``), a matching tensor goes
    to fragment ``number % fragments`` (the paper's strided layers), and
    every other tensor (embeddings, the last norm) to the fragment that holds
    the fewest values at that point. Every fragment must get a tensor.
    """
    if fragments < 1:
        raise ValueError("fragments must be >= 1")
    if fragments > len(names):
        raise ValueError(f"{fragments} fragments but the model has only {len(names)} parameter tensors")
    out = [0] * len(names)
    if pattern is None:
        total, done, fragment = sum(numels), 0, 0
        for i, numel in enumerate(numels):
            remaining_tensors = len(names) - i
            if fragment < fragments - 1 and (done >= total * (fragment + 1) / fragments
                                             or remaining_tensors <= fragments - 1 - fragment):
                fragment += 1
            out[i] = fragment
            done += numel
        return tuple(out)
    regex = re.compile(pattern)
    sizes = [0] * fragments
    unmatched = []
    for i, name in enumerate(names):
        match = regex.search(name)
        if match is None or not match.groups() or not (match.group(1) or "").isdigit():
            unmatched.append(i)
            continue
        out[i] = int(match.group(1)) % fragments
        sizes[out[i]] += numels[i]
    for i in unmatched:
        out[i] = min(range(fragments), key=lambda f: (sizes[f], f))
        sizes[out[i]] += numels[i]
    empty = [f for f in range(fragments) if f not in out]
    if empty:
        raise ValueError(f"the fragment pattern {pattern!r} leaves fragment(s) {empty} without a tensor")
    return tuple(out)


class FragmentSchedule(PeriodicSchedule):
    """The aggregation plan of Streaming DiLoCo: fragment p's tensors at its staggered turn, every H steps.

    ``plan(clock)`` says which tensors the push that ends local step
    ``clock`` (0-based) carries; ``fresh(clock)`` which tensors a worker takes
    from the server before step ``clock``: those sent ``overlap`` steps
    earlier (the whole model before the first step).
    """

    def __init__(self, fragment_of: Sequence[int], local_steps: int, fragments: int, overlap: int = 0,
                 order: str = "staggered") -> None:
        self.fragment_of = tuple(fragment_of)
        super().__init__(len(self.fragment_of), local_steps)
        self.fragments = fragments
        self.overlap = overlap
        self.offsets = fragment_offsets(local_steps, fragments)
        if not 0 <= overlap <= max_overlap(local_steps, fragments):
            raise ValueError(f"overlap_steps must be in [0, {max_overlap(local_steps, fragments)}] with {fragments} "
                             f"fragments over {local_steps} local steps")
        if order not in ("staggered", "least_similar"):
            raise ValueError(f"fragment order must be staggered or least_similar, not {order!r}")
        self.order = order
        self.orders: list[tuple[int, ...]] = [tuple(range(fragments))]  # each period's fragment per turn
        self.similarity: list[float | None] = [None] * fragments  # each fragment's last measured agreement

    def fragment_at(self, clock: int) -> int | None:
        """The fragment the push ending local step ``clock`` carries, or None (a plain local step)."""
        turn = (clock + 1) % self.local_steps
        if clock < 0 or turn not in self.offsets:
            return None
        period = clock // self.local_steps
        if self.order == "staggered":
            return self.offsets.index(turn)
        assert period < len(self.orders), "a period's order is decided when the previous period's last round closes"
        return self.orders[period][self.offsets.index(turn)]

    def on_round(self, clock: int, changes: Sequence[torch.Tensor], slices: Sequence[slice]) -> None:
        """The round of ``clock`` closed with these workers' changes: measure how much they agree on the fragment
        (the mean cosine of each change with their mean); after a period's last turn, order the next period's
        fragments least similar first (``order = "least_similar"``: where workers disagree most, the model
        gains most from averaging soonest)."""
        if self.order != "least_similar" or (fragment := self.fragment_at(clock)) is None:
            return
        import torch

        owned = [sl for sl, f in zip(slices, self.fragment_of) if f == fragment]
        flat = [torch.cat([c[sl] for sl in owned]) for c in changes]
        self.similarity[fragment] = mean_cosine(flat)
        if self.offsets.index((clock + 1) % self.local_steps) == self.fragments - 1:  # the period's last turn
            ranked = sorted(range(self.fragments), key=lambda f: (math.inf if self.similarity[f] is None
                                                                   else self.similarity[f], f))
            self.orders.append(tuple(ranked))

    def plan(self, clock: int) -> tuple[bool, ...]:
        if clock < 0:
            return (True,) * self.num_tensors
        fragment = self.fragment_at(clock)
        return tuple(f == fragment for f in self.fragment_of) if fragment is not None else (False,) * self.num_tensors

    def describe(self, numels: Sequence[int]) -> str:
        """The fragments' sizes and turns in one line, and the largest upload against the whole model's."""
        sizes = [sum(n for n, f in zip(numels, self.fragment_of) if f == p) for p in range(self.fragments)]
        shown = f"{sizes[0]:,} values each" if len(set(sizes)) == 1 else ", ".join(f"{v:,}" for v in sizes) + " values"
        turns = sorted(o or self.local_steps for o in self.offsets)
        return (f"{self.fragments} fragments of {shown}, synchronised after local steps "
                f"{', '.join(map(str, turns))} of every {self.local_steps} ({self.order}), overlap {self.overlap}; "
                f"the largest upload is {max(sizes) / sum(sizes):.3f} of the model")

    def fresh(self, clock: int) -> tuple[bool, ...]:
        """The tensors to take from the server before local step ``clock``: everything before the first step,
        then the fragment sent at the end of step ``clock - 1 - overlap``."""
        if clock <= 0:
            return (True,) * self.num_tensors
        sent = clock - 1 - self.overlap
        return self.plan(sent) if sent >= 0 else (False,) * self.num_tensors

    def restarted(self, keep_bytes: bool = True) -> "FragmentSchedule":
        return FragmentSchedule(self.fragment_of, self.local_steps, self.fragments, self.overlap, self.order)


def mean_cosine(changes: Sequence[torch.Tensor]) -> float:
    """The mean cosine between each change and the mean change (1: all agree; 0 for a single zero change)."""
    import torch

    mean = torch.stack(list(changes)).mean(0)
    norm = float(mean.norm())
    cosines = [float(c @ mean) / (float(c.norm()) * norm) if norm and float(c.norm()) else 0.0 for c in changes]
    return sum(cosines) / len(cosines)


class StreamingDiLoCo(LocalSGD):
    """Gate a worker only for the fragment results it is about to take.

    Before local step ``k`` a worker needs every fragment sent at the end of
    a step ``c`` with ``c + 1 + overlap <= k``: it waits until every worker
    has pushed clock ``c``. The pushes of a fragment's turn form one round,
    as a BSP round does. ``overlap`` is below the spacing of two turns, so a
    worker never sends a fragment before the previous round is complete.
    """

    name = "streaming_diloco"

    def __init__(self, workers: Iterable[int], schedule: FragmentSchedule) -> None:
        super().__init__(workers, schedule.local_steps)
        self.schedule = schedule

    def is_sync(self, clock: int) -> bool:
        return self.schedule.fragment_at(clock) is not None

    def start_threshold(self, worker: int) -> int | None:
        due = self.clocks[worker] - self.schedule.overlap  # every turn ending at or before this must be complete
        latest = 0
        for offset in self.schedule.offsets:
            turn = due - (due - offset) % self.local_steps  # the last step number <= due at this fragment's turn
            if turn >= 1:
                latest = max(latest, turn)
        return latest


def splits(sync) -> bool:  # noqa: ANN001 (config section)
    """Whether ``[sync.streaming_diloco]`` cuts tensors at equal fragment boundaries (no pattern)."""
    opts = sync.streaming_diloco
    return opts.split_tensors and opts.fragment_pattern is None


def streaming_layout(sync, layout: Sequence[TensorSlot]) -> Sequence[TensorSlot]:  # noqa: ANN001
    """The slots Streaming DiLoCo moves: the layout cut at equal fragment boundaries, or the tensors whole."""
    return split_at_fragments(layout, sync.streaming_diloco.fragments) if splits(sync) else layout


def streaming_schedule(sync, layout) -> FragmentSchedule:  # noqa: ANN001 (config section and layout)
    """The fragment plan of ``[sync.streaming_diloco]`` over the layout ``streaming_layout`` made; a model the
    fragments cannot cover (fewer tensors than fragments, a pattern that leaves one empty) is bad input."""
    opts = sync.streaming_diloco
    try:
        if splits(sync):
            fragment_of = equal_fragments([s.offset for s in layout], [s.numel for s in layout], opts.fragments)
        else:
            fragment_of = assign_fragments([s.name for s in layout], [s.numel for s in layout], opts.fragments,
                                           opts.fragment_pattern)
    except ValueError as exc:
        raise ConfigError(f"sync.streaming_diloco: {exc}") from None
    return FragmentSchedule(fragment_of, opts.local_steps, opts.fragments, opts.overlap_steps, opts.fragment_order)


def _policy(workers: Sequence[int], sync) -> StreamingDiLoCo:  # noqa: ANN001
    opts = sync.streaming_diloco
    # the gate needs only the turns, not the layout: one tensor per fragment stands in for it
    return StreamingDiLoCo(workers, FragmentSchedule(range(opts.fragments), opts.local_steps, opts.fragments,
                                                     opts.overlap_steps))


register_scheme(SchemeSpec("streaming_diloco", policy=_policy,
                           local_steps=lambda sync: sync.streaming_diloco.local_steps,
                           outer=lambda sync: (sync.streaming_diloco.outer_lr, sync.streaming_diloco.outer_momentum),
                           schedule=streaming_schedule,
                           sync_layout=streaming_layout,
                           overlap=lambda sync: (sync.streaming_diloco.overlap_steps, sync.streaming_diloco.mixing),
                           outer_codec=lambda sync: sync.streaming_diloco.outer_quantization,
                           color="#e377c2",
                           grid=(("sync.streaming_diloco.outer_lr", (0.4, 0.7, 1.0)),)),
                "Streaming DiLoCo: DiLoCo one fragment at a time on a staggered schedule, its outer all-reduce "
                "overlapped with the next inner steps, outer gradients optionally int8/fp4")
