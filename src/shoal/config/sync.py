"""[sync]: the scheme and one section per scheme's options, whose defaults are the only defaults.

The keys that were flat in [sync] before sections existed (``sync.paced``)
still load: a ``mode="before"`` validator moves each into every section
that has it, with one ``ConfigDeprecation`` warning per key.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from shoal.config.base import Section, _choices, _registered
from shoal.errors import ConfigDeprecation
from shoal.registry import SCHEMES


class SSPOptions(Section):
    """``[sync.ssp]``: stale-synchronous parallel."""

    staleness: int = Field(3, ge=0, description="The bound s: a worker may be at most s iterations ahead of the slowest.")


class GSSPOptions(Section):
    """``[sync.gssp]``: grouped SSP, the defaults GSSP runs with (its constructor takes this section)."""

    staleness: int = Field(3, ge=0, description="The SSP bound s inside each group: at most s iterations ahead of the slowest.")
    groups: int | Literal["auto"] = Field("auto", description="Number of groups, or auto (fewest whose fit reaches group_threshold).")
    group_threshold: float = Field(0.95, gt=0, le=1, description="Auto grouping: goodness of variance fit to reach (on log iteration times).")
    max_groups: int = Field(8, ge=1, description="Auto grouping: most groups to consider.")
    group_momentum: Literal["server", "global", "busiest"] = Field("busiest", description="With SGD momentum: server = each group server's own momentum, as the paper (collapses when groups are small and slow); global = each group server decays its momentum on the clock of all updates, so momentum acts per sample as on one server; busiest = every group server decays its momentum as the busiest one does under global, so no group takes larger steps per update than the busiest (docs/gssp.md). Every mode moves each gradient by lr / (1 - momentum) in total.")
    exchange_every: int = Field(4, ge=1, description="A group server sends its own delta to its peers every this many local updates.")
    exchange_clock: Literal["own", "global"] = Field("own", description="own = every group server sends after exchange_every of its own updates (the paper); global = after a number of its own updates in proportion to its share of all updates (exchange_every for a group of average share), so every group sends about equally often in time and a slow group's delta is not stale when it arrives.")
    paced: bool = Field(True, description="On group servers: SSP clocks inside a group run at each member's profiled pace (its iteration time over the group's slowest), so members of steadily different speeds do not wait for each other and only one slower than its profile holds the group back; false = plain SSP in each group, as the paper (a group then runs at its slowest member's pace).")
    profile_iterations: int = Field(3, ge=1, description="Iterations per worker measured before the first grouping.")
    confirm_span: float = Field(48.0, ge=0, description="With transient_factor > 0: a worker whose profile is over split_ratio times the fastest is split off by the first grouping (or moved to a slower group later) only once every one of its iterations was that slow for this many of the fastest worker's iteration times in a row, and nobody waits for it before the split; a slow spell is not a slow worker (docs/gssp.md); 0 = split on the profile alone.")
    confirm_fraction: float = Field(0.5, gt=0, le=1, description="With confirm_span: slow-looking workers confirm only when fewer than this share of the workers look slow once all are profiled (spells hit a few workers at a time); when more look slow, speeds are spread and the split is taken on the profiles at once, as with confirm_span = 0 (1 = always confirm).")
    profile_window: int = Field(20, ge=1, description="A worker's speed is the 20th percentile of its last this many iteration times.")
    regroup: bool = Field(True, description="Move workers when their observed speed drifts.")
    regroup_margin: float = Field(0.05, ge=0, le=1, description="How much better (in fit) a new grouping must be to move workers.")
    regroup_patience: int = Field(3, ge=1, description="Consecutive checks a better grouping must persist (absorbs transient stragglers).")
    regroup_cooldown_s: float = Field(5.0, ge=0, description="Seconds (virtual on sim) after a regroup before the next one may happen.")
    transient_factor: float = Field(2.0, ge=0, description="An iteration over this many times a worker's profiled speed makes it a transient straggler that its group does not wait for until it runs at its usual speed again (0 = off, as the paper).")
    split_ratio: float = Field(1.5, ge=1, description="Auto grouping: neighbouring groups' median iteration times must differ by at least this factor, else they merge (1 = no floor).")

    @field_validator("groups")
    @classmethod
    def _positive_groups(cls, v: int | str) -> int | str:
        """a count must be >= 1"""
        if isinstance(v, int) and v < 1:
            raise ValueError("must be a positive count or \"auto\"")
        return v


class LocalSGDOptions(Section):
    """``[sync.localsgd]``: periodic model averaging."""

    local_steps: int = Field(8, ge=1, description="Local optimizer steps between two averagings (H).")
    warmup_steps: int = Field(0, ge=0, description="Post-local SGD (Lin et al., 2020): average after every step for this many first steps, then every local_steps (0 = periods from the start).")
    adaptive: bool = Field(False, description="AdaComm (Wang & Joshi, 2019): after the first period of local_steps, each period is ceil(local_steps x sqrt(L / L0)) steps (1 to local_steps), L the workers' mean training loss over the period just ended and L0 the first period's, so averaging grows more frequent as the loss falls.")


class DiLoCoOptions(Section):
    """``[sync.diloco]``: an outer Nesterov step on the averaged change."""

    local_steps: int = Field(8, ge=1, description="Inner optimizer steps between two outer steps (H).")
    warmup_steps: int = Field(0, ge=0, description="Synchronise after every step (the server's optimizer on the mean gradient, as BSP) for this many first steps, then take outer steps every local_steps (0 = from the start).")
    adaptive: bool = Field(False, description="AdaComm's adaptive periods, as sync.localsgd.adaptive: each period after the first is ceil(local_steps x sqrt(L / L0)) steps.")
    asynchronous: bool = Field(False, description="No barrier (HeLoCo-style): a worker that finished its inner steps sends its change and goes on from the global model; each outer step takes the changes that arrived at that moment (on ray: within 5 ms), each discounted by 1 / (1 + its staleness in outer steps). With equal speeds it is synchronous DiLoCo exactly (on sim).")
    outer_lr: float = Field(0.7, gt=0, description="Learning rate of the outer Nesterov SGD on the averaged pseudo-gradient (DiLoCo: 0.7).")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="Nesterov momentum of the outer step (DiLoCo: 0.9).")

    @model_validator(mode="after")
    def _one_timing(self) -> "DiLoCoOptions":
        """adaptive periods close with a round everyone ends: not with asynchronous outer steps"""
        if self.adaptive and self.asynchronous:
            raise ValueError("adaptive periods are decided when a round closes; asynchronous outer steps have no "
                             "rounds: choose one")
        return self


class StreamingDiLoCoOptions(Section):
    """``[sync.streaming_diloco]``: DiLoCo one fragment at a time, overlapped, optionally quantised (docs/schemes/streaming_diloco.md)."""

    local_steps: int = Field(32, ge=1, description="Inner steps between two outer steps of the same fragment (H); the fragments' turns are staggered every H / fragments steps.")
    fragments: int = Field(4, ge=1, description="Fragments the model's tensors are cut into (P); each is synchronised once every local_steps, so a worker's peak upload is 1/P of DiLoCo's (with split_tensors; whole tensors make it the largest fragment's share).")
    fragment_pattern: str | None = Field(None, description="A regular expression with one group capturing a layer number (for example 'blocks\\.(\\d+)\\.'): a matching tensor goes to fragment number % fragments (the paper's strided layers), the others to the smallest fragment; none = contiguous runs of about equal size (see split_tensors).")
    split_tensors: bool = Field(True, description="Without a fragment_pattern: cut the flat parameters into fragments of equal size (within one value), splitting a tensor where a boundary falls inside it, so a worker's peak upload is 1/fragments of DiLoCo's; false = whole tensors only (the peak is then the largest fragment's share). A pattern always keeps tensors whole.")
    fragment_order: Literal["staggered", "least_similar"] = Field("staggered", description="Which fragment takes each turn: staggered = fragment p at turn p of every period (the paper); least_similar = every period takes each fragment once, least similar first: ordered by how much the workers' changes agreed at its last sync (the mean cosine with their mean), so where they disagree most is averaged soonest (SIM's signal put to use).")
    overlap_steps: int = Field(1, ge=0, description="Inner steps a fragment's outer all-reduce overlaps (tau): a worker sends at the end of step t and takes the result before step t + tau + 1; 0 = wait for it. Below local_steps / fragments.")
    mixing: float = Field(0.5, ge=0, le=1, description="With overlap_steps > 0: the worker's fragment becomes mixing x its local value + (1 - mixing) x the new global value, keeping part of what its overlapped steps did (0 = take the global value).")
    outer_lr: float = Field(0.7, gt=0, description="Learning rate of the outer Nesterov SGD on each fragment's averaged pseudo-gradient.")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="Nesterov momentum of the outer step (per fragment).")
    outer_quantization: Literal["none", "int8", "fp4"] = Field("none", description="How the outer gradients travel: none = float32; int8 = one byte a value; fp4 = 4-bit floats (E2M1) a value; both with a scale per 32-value block and error feedback (what a quantiser dropped is added to the fragment's next change).")

    @field_validator("fragment_pattern")
    @classmethod
    def _valid_pattern(cls, v: str | None) -> str | None:
        """a regular expression with a group"""
        if v is None:
            return v
        try:
            compiled = re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        if compiled.groups < 1:
            raise ValueError("needs a group that captures the layer number, for example 'blocks\\.(\\d+)\\.'")
        return v

    @model_validator(mode="after")
    def _turns_fit(self) -> "StreamingDiLoCoOptions":
        """fragments <= local_steps, overlap below the spacing of two turns"""
        if self.fragments > self.local_steps:
            raise ValueError(f"fragments ({self.fragments}) must not exceed local_steps ({self.local_steps}): "
                             "each fragment needs its own turn in a period")
        limit = max_overlap(self.local_steps, self.fragments)
        if self.overlap_steps > limit:
            raise ValueError(f"overlap_steps ({self.overlap_steps}) must be at most {limit} with {self.fragments} "
                             f"fragments over {self.local_steps} local steps: a fragment's result is taken before "
                             "the next fragment is sent, and a step after the fragment's own last turn")
        return self


def fragment_offsets(local_steps: int, fragments: int) -> tuple[int, ...]:
    """Fragment p is synchronised at the end of local step t (1-based) when ``t % H == offsets[p]``.

    The turns are staggered evenly over the period, ``(p + 1) * H // P``
    modulo H, so the last fragment keeps DiLoCo's turn (every H-th step) and
    one fragment (P = 1) is DiLoCo exactly.
    """
    if not 1 <= fragments <= local_steps:
        raise ValueError(f"{fragments} fragments need 1 to local_steps ({local_steps}) turns a period")
    return tuple(((p + 1) * local_steps // fragments) % local_steps for p in range(fragments))


def turn_spacing(local_steps: int, fragments: int) -> int:
    """The fewest local steps between two fragments' turns (the period itself for one fragment)."""
    turns = sorted(o or local_steps for o in fragment_offsets(local_steps, fragments))
    return min([b - a for a, b in zip(turns, turns[1:])] + [turns[0] + local_steps - turns[-1]])


def max_overlap(local_steps: int, fragments: int) -> int:
    """The most inner steps a fragment's all-reduce may overlap: its result must arrive before the next
    fragment is sent (below the spacing of two turns) and at least one local step after its own previous turn
    (below the period), so a sync always carries a change, never a fresh gradient."""
    return max(0, min(turn_spacing(local_steps, fragments), local_steps - 1) - 1)


class KBatchOptions(Section):
    """``[sync.kbatch]``: K-batch synchronous SGD."""

    k: int | None = Field(None, ge=1, description="Gradients (from distinct workers) that make one update: cluster.workers (or more) = BSP, 1 = ASP; none = half the workers, rounded up.")


#: the sections of [sync] whose keys were flat before sections existed (``sync.paced``): old configs map into them
FLAT_KEY_SECTIONS = ("ssp", "gssp", "localsgd", "diloco")


class SyncConfig(Section):
    scheme: str = Field("bsp", description="Synchronisation scheme, one of the registered ones (localsgd: average models every local_steps; diloco: outer Nesterov step on the averaged change), or a plug-in: python:FILE.py:CLASS (docs/extending.md).", json_schema_extra=_choices(SCHEMES, plugins=True))
    intra_group: Literal["auto", "server", "allreduce"] = Field("auto", description="bsp and gssp: how a group combines its gradients. auto: all-reduce groups for bsp on ray when nothing needs a server (dense gradients, no SIM, no in-network aggregation, no membership changes, no balancing, no worker restarts), the server path otherwise and on sim (the config a run writes, and summary.json's data_path, say which ran and why). server: workers pull from and push to a (group) parameter server (GSSP: SSP inside each group, as the paper); allreduce: the group is synchronous, every member keeps its own replica and optimizer and the gradients are ring all-reduced (on ray: torch.distributed DDP, gloo on CPU, NCCL on GPU; on sim: a ring all-reduce's cost); GSSP groups still exchange their own deltas asynchronously, dense, and nobody is excused as a transient straggler.")
    options: dict[str, Any] = Field({}, description="Keyword arguments passed through to a python: scheme's constructor (after the workers).")
    balance: Literal["none", "batch", "steps", "deadline"] = Field("none", description="Work sized to speed (docs/balance.md). batch: each worker's batch size is in proportion to its measured speed, so a synchronous round (bsp, a gssp group, localsgd/diloco's inner steps) ends for all at once; the group's global batch stays workers x data.batch_size and gradients are weighted by samples, so an update is the mean over the global batch. steps (localsgd, diloco): each worker takes local steps in proportion to its speed between two averagings (workers x H in all) and the average is weighted by steps, so nobody waits at the averaging. deadline (bsp; on ray the server path): a bounded-time round: a worker computes at most balance.deadline times the median worker's profiled batch time, contributes the whole micro-batches it finished by then (or nothing), and gradients are weighted by those samples. [balance] sets the bounds.")
    ssp: SSPOptions = SSPOptions()
    gssp: GSSPOptions = GSSPOptions()
    localsgd: LocalSGDOptions = LocalSGDOptions()
    diloco: DiLoCoOptions = DiLoCoOptions()
    kbatch: KBatchOptions = KBatchOptions()
    streaming_diloco: StreamingDiLoCoOptions = StreamingDiLoCoOptions()

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data: Any) -> Any:
        """Old flat keys (`sync.paced`, `sync.staleness`, ...) still work: each moves into every section that has it, with one deprecation line."""
        return _move_flat_keys(data) if isinstance(data, dict) else data

    @field_validator("scheme")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        """a registered scheme or a python: plug-in that meets the protocol"""
        return _registered(SCHEMES, v)


def _move_flat_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of a ``[sync]`` table with every flat scheme key moved into the sections that have it.

    A key set in a section as well keeps the section's value (the newer
    spelling is the more specific one).
    """
    data = dict(data)
    models = {name: SyncConfig.model_fields[name].annotation for name in FLAT_KEY_SECTIONS}
    for key in [k for k in data if k not in SyncConfig.model_fields]:
        owners = [name for name, model in models.items() if key in model.model_fields]
        if not owners:
            continue
        value = data.pop(key)
        for name in owners:
            section = data.get(name)
            section = dict(section) if isinstance(section, dict) else {}
            section.setdefault(key, value)
            data[name] = section
        new = " and ".join(f"sync.{name}.{key}" for name in owners)
        warnings.warn(ConfigDeprecation(f"sync.{key} is deprecated: use {new}"), stacklevel=2)
    return data
