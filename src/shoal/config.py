"""Run configuration: a pydantic schema, TOML loading and `--set` overrides.

Every user-facing mistake (unknown key, wrong type, impossible value, missing
file) becomes one ``ConfigError`` whose message names the key and the
problem; the CLI prints that line and exits with code 2.
"""

from __future__ import annotations

import difflib
import json
import tomllib
import warnings
from pathlib import Path
from collections.abc import Callable
from typing import Annotated, Any, Literal

import tomlkit
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError, field_validator,
                      model_validator)

from shoal.errors import ConfigDeprecation, ConfigError
from shoal.registry import COMPRESSORS, DATA_FORMATS, DATASETS, MODELS, PLANNERS, SCHEMES, Registry

__all__ = ["Config", "ConfigError", "build_config", "load_config", "to_toml"]


def _positive_list(values: list[Any]) -> list[Any]:
    """non-empty, every value > 0"""
    if not values or any(v <= 0 for v in values):
        raise ValueError("must be a non-empty list of positive numbers")
    return values


PositiveInts = Annotated[list[int], AfterValidator(_positive_list)]
PositiveFloats = Annotated[list[float], AfterValidator(_positive_list)]


class Section(BaseModel):
    """Base for every section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunConfig(Section):
    seed: int = Field(0, description="Seeds data split, sharding, initial weights and stragglers.")
    target_accuracy: float = Field(0.95, gt=0, le=1, description="Test accuracy that ends the run (fraction), when task.metric = \"accuracy\" and run.target is not set.")
    target: float | None = Field(None, description="Value of task.metric that ends the run (reached when at least it, or at most it for a metric where lower is better); none = target_accuracy for accuracy, no target otherwise.")
    max_time_s: float = Field(600.0, gt=0, description="Time budget: virtual seconds on sim, wall seconds on ray.")
    max_iterations: int = Field(0, ge=0, description="Budget of total worker iterations; 0 = no limit.")
    eval_every_s: float = Field(1.0, gt=0, description="Evaluate the model every this many (virtual) seconds.")
    stop_at_target: bool = Field(True, description="Stop as soon as target_accuracy is reached.")
    target_patience: int = Field(3, ge=1, description="Evaluations in a row at or above target_accuracy that count as reaching it; the time reported is the first of them (3: one lucky evaluation on a 1,000-image test set, +-0.75 points of noise, cannot decide a row).")
    tensorboard: bool = Field(False, description="Also write TensorBoard scalars to OUT/tensorboard (accuracy, loss, bytes moved, per-group iterations per second; needs pip install 'shoal[tensorboard]').")


def _registered(registry: Registry[Any], value: str, *also: str) -> str:
    """``value`` if ``registry`` (or ``also``) knows it or it is a plug-in that meets the protocol (its file path
    made absolute), else a one-line error listing what it knows."""
    from shoal.plugins import is_plugin, resolve_spec

    if value in also or value in registry:
        return value
    if is_plugin(value):
        spec = resolve_spec(value)
        registry.plugin(spec)  # imports the user's class and checks it: a ConfigError (a ValueError) when it does not fit
        return spec
    raise ValueError(f"unknown {registry.kind} {value!r}; use one of {', '.join((*also, *registry.names()))} "
                     f"or python:FILE.py:CLASS")


def _choices(registry: Registry[Any], *also: str, plugins: bool = False) -> Callable[[dict[str, Any]], None]:
    """JSON-schema hook: the registered names as the key's ``enum`` (read when the schema is generated); with
    ``plugins``, a ``python:`` spec is allowed beside them, so an editor does not flag a user's own class."""

    def add(schema: dict[str, Any]) -> None:
        names = [*also, *registry.names()]
        if plugins:
            schema["anyOf"] = [{"enum": names}, {"pattern": "^python:"}]
        else:
            schema["enum"] = names

    return add


def _plugin_or(builtins: tuple[str, ...], value: str, what: str) -> str:
    """A built-in name, or a python: plug-in spec with its file path made absolute."""
    from shoal.plugins import is_plugin, resolve_spec

    if value in builtins:
        return value
    if is_plugin(value):
        return resolve_spec(value)
    raise ValueError(f"unknown {what} {value!r}; use one of {', '.join(builtins)} or python:FILE.py:FUNCTION")


class ModelConfig(Section):
    name: str = Field("lenet5", description="Model: a registered one or python:FILE.py:FUNCTION | python:package.module:FUNCTION (called as FUNCTION(input_shape=..., num_classes=..., **model.options), returns a torch.nn.Module).", json_schema_extra=_choices(MODELS, plugins=True))
    hidden: PositiveInts = Field([256, 128], description="Hidden layer widths of the mlp model.")
    options: dict[str, Any] = Field({}, description="Keyword arguments passed through to a python: model factory.")

    @field_validator("name")
    @classmethod
    def _known_model(cls, v: str) -> str:
        """a registered model or a python: plug-in whose file exists"""
        return _plugin_or(MODELS.names(), v, "model")


class DataConfig(Section):
    name: str = Field("mnist5k", description="A registered data set, KIND:PATH for a file in a registered format (idx:PATH, cifar10:PATH, npz:PATH), or python:FILE.py:FUNCTION (FUNCTION(**data.options) returns (train, test), each a Dataset of (x, y) or a pair of tensors).")
    options: dict[str, Any] = Field({}, description="Keyword arguments passed through to a python: data function.")
    batch_size: int = Field(32, gt=0, description="Mini-batch size per worker iteration.")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="Fraction of the data held out for evaluation.")
    synthetic_samples: int = Field(4000, gt=0, description="Number of samples of the synthetic data set.")
    partition: str = Field("iid", description="How training samples are split over workers: iid | dirichlet:ALPHA (class shares per worker drawn from Dirichlet(ALPHA); small = skewed) | classes:K (each worker holds K classes).")

    @field_validator("partition")
    @classmethod
    def _known_partition(cls, v: str) -> str:
        """iid, dirichlet:ALPHA with ALPHA > 0, or classes:K with K >= 1"""
        from shoal.data.sharding import parse_partition

        parse_partition(v)
        return v

    @field_validator("name")
    @classmethod
    def _known_source(cls, v: str) -> str:
        """a registered data set, a python: plug-in, or KIND:PATH with KIND a registered file format and PATH an existing file or folder"""
        if v in DATASETS:
            return v
        if v.startswith("python:"):
            return _plugin_or(DATASETS.names(), v, "data set")
        kind, sep, path = v.partition(":")
        if not sep or kind not in DATA_FORMATS:
            raise ValueError(f"unknown data set {v!r}; use one of {', '.join(DATASETS.names())} or KIND:PATH with KIND "
                             f"in {', '.join(DATA_FORMATS.names())}")
        if not Path(path).expanduser().exists():
            raise ValueError(f"path {path!r} does not exist")
        return v


TASK_LOSSES = ("cross_entropy", "mse")
TASK_METRICS = ("accuracy", "loss", "perplexity")


class TaskConfig(Section):
    loss: str = Field("cross_entropy", description="Training loss: cross_entropy (class logits, or (N, T, C) sequence logits) | mse | python:FILE.py:FUNCTION (FUNCTION(output, target) returns a scalar tensor).")
    metric: str = Field("accuracy", description="What evaluations report and run.target is compared with: accuracy | loss | perplexity (exp of the mean cross-entropy) | python:FILE.py:FUNCTION (FUNCTION(output, target) on the whole test set returns a number).")
    higher_is_better: bool | None = Field(None, description="Direction of task.metric; none = by the metric (accuracy: higher; loss, perplexity: lower). Required for a python: metric.")

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, v: str) -> str:
        """cross_entropy, mse, or a python: plug-in whose file exists"""
        return _plugin_or(TASK_LOSSES, v, "loss")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        """accuracy, loss, perplexity, or a python: plug-in whose file exists"""
        return _plugin_or(TASK_METRICS, v, "metric")

    @property
    def higher(self) -> bool:
        """Whether a higher value of the metric is better."""
        return self.higher_is_better if self.higher_is_better is not None else self.metric == "accuracy"


class OptimizerConfig(Section):
    name: Literal["sgd", "adam"] = Field("sgd", description="Server-side optimizer.")
    lr: float = Field(0.05, gt=0, description="Learning rate.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum.")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty, applied with the same 1/N weight as gradients.")
    lr_decay_epochs: list[Annotated[float, Field(gt=0)]] = Field([], description="Global epochs (> 0) at which the learning rate is multiplied by lr_decay_factor (a step schedule).")
    lr_decay_factor: float = Field(0.1, gt=0, le=1, description="Factor applied to the learning rate at each of lr_decay_epochs.")

    def lr_at(self, epoch: float) -> float:
        """The learning rate after ``epoch`` global epochs under the step schedule."""
        return self.lr * self.lr_decay_factor ** sum(1 for e in self.lr_decay_epochs if epoch >= e)


class StragglerConfig(Section):
    probability: float = Field(0.0, ge=0, le=1, description="Chance per iteration that a worker starts a transient slowdown.")
    slowdown: float = Field(4.0, ge=1, description="Compute-time factor while slowed down.")
    duration: int = Field(5, ge=1, description="Length of a slowdown in iterations.")


class SpeedChange(Section):
    worker: int = Field(..., ge=0, description="Worker whose speed changes.")
    at_s: float = Field(..., ge=0, description="When (virtual seconds on sim, wall seconds on ray).")
    speed: float = Field(..., gt=0, description="The new slowdown factor.")


class MembershipChange(Section):
    at_s: float = Field(..., ge=0, description="When (virtual seconds on sim, wall seconds on ray).")
    add: int = Field(0, ge=0, le=10_000, description="Workers that join now; they take the next ids (workers, workers + 1, ...).")
    speeds: PositiveFloats | None = Field(None, description="Slowdown factor of each joining worker (default 1.0 each).")
    remove: list[NonNegativeInt] = Field([], description="Ids of workers that leave now (gracefully: not a failure).")

    @model_validator(mode="after")
    def _one_change(self) -> "MembershipChange":
        """A change adds workers (add > 0) or removes some (a remove list); `speeds`, when given, has `add` entries"""
        if not self.add and not self.remove:
            raise ValueError("a membership change needs add > 0 or a remove list")
        if self.speeds is not None and len(self.speeds) != self.add:
            raise ValueError(f"speeds has {len(self.speeds)} entries but add = {self.add}")
        return self


class ClusterConfig(Section):
    workers: int = Field(8, ge=1, description="Number of workers.")
    speeds: PositiveFloats | None = Field(None, description="Slowdown factor per worker (1.0 = fastest); overrides profile.")
    profile: Literal["uniform", "tiers", "lognormal"] = Field("uniform", description="How speeds are drawn when `speeds` is not given.")
    tiers: PositiveFloats = Field([1.0, 2.0, 4.0, 8.0], description="Slowdown of each tier for profile = tiers (workers split evenly).")
    lognormal_sigma: float = Field(0.5, gt=0, le=3, description="Spread of profile = lognormal (at most 3: one sigma is then a 20x speed ratio).")
    compute_s: float = Field(0.05, ge=0, description="Seconds per batch on the fastest worker; 0 = measure once on this machine.")
    link_gbps: float = Field(10.0, gt=0, description="Each worker's link bandwidth (Gbit/s), both directions.")
    latency_ms: float = Field(0.05, ge=0, description="One-way latency of every transfer (ms).")
    server_gbps: float = Field(10.0, gt=0, description="Server ingress (and egress) bandwidth, shared by concurrent transfers.")
    stragglers: StragglerConfig = StragglerConfig()
    speed_changes: list[SpeedChange] = Field([], description="Sustained speed changes during the run: [{worker, at_s, speed}].")
    membership: list[MembershipChange] = Field([], description="Workers joining and leaving during the run: [{at_s, add, speeds}, {at_s, remove = [ids]}]; a joiner trains on a copy of the shard of worker (id mod workers).")
    emulate: bool = Field(True, description="ray: pad each iteration to the profile's compute time and each transfer to the link bandwidth (false: real speeds decide).")

    @model_validator(mode="after")
    def _speeds_match_workers(self) -> "ClusterConfig":
        """`speeds` has `workers` entries; `speed_changes` name workers below `workers`; a membership change removes only workers present then and leaves at least one"""
        if self.speeds is not None and len(self.speeds) != self.workers:
            raise ValueError(f"speeds has {len(self.speeds)} entries but workers = {self.workers}")
        for change in self.speed_changes:
            if change.worker >= self.workers:
                raise ValueError(f"speed_changes names worker {change.worker} but workers = {self.workers}")
        present, next_id = set(range(self.workers)), self.workers
        for change in self.schedule():
            present |= set(range(next_id, next_id + change.add))
            next_id += change.add
            for w in change.remove:
                if w not in present:
                    raise ValueError(f"membership: worker {w} cannot leave at {change.at_s:g} s: it is not there then")
                present.discard(w)
            if not present:
                raise ValueError(f"membership: no worker is left at {change.at_s:g} s")
        return self

    def schedule(self) -> list[MembershipChange]:
        """The membership changes in time order (joiners take ids in this order)."""
        return sorted(self.membership, key=lambda c: c.at_s)

    @property
    def total_workers(self) -> int:
        """Every worker that ever takes part: the initial ones plus every joiner."""
        return self.workers + sum(c.add for c in self.membership)

    def joiner_speeds(self) -> list[float]:
        """The speed of each joining worker, in id order."""
        return [speed for c in self.schedule() for speed in (c.speeds or [1.0] * c.add)]


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


class DiLoCoOptions(Section):
    """``[sync.diloco]``: an outer Nesterov step on the averaged change."""

    local_steps: int = Field(8, ge=1, description="Inner optimizer steps between two outer steps (H).")
    outer_lr: float = Field(0.7, gt=0, description="Learning rate of the outer Nesterov SGD on the averaged pseudo-gradient (DiLoCo: 0.7).")
    outer_momentum: float = Field(0.9, ge=0, lt=1, description="Nesterov momentum of the outer step (DiLoCo: 0.9).")


class KBatchOptions(Section):
    """``[sync.kbatch]``: K-batch synchronous SGD."""

    k: int | None = Field(None, ge=1, description="Gradients (from distinct workers) that make one update: cluster.workers (or more) = BSP, 1 = ASP; none = half the workers, rounded up.")


#: the sections of [sync] whose keys were flat before sections existed (``sync.paced``): old configs map into them
FLAT_KEY_SECTIONS = ("ssp", "gssp", "localsgd", "diloco")


class SyncConfig(Section):
    scheme: str = Field("bsp", description="Synchronisation scheme, one of the registered ones (localsgd: average models every local_steps; diloco: outer Nesterov step on the averaged change), or a plug-in: python:FILE.py:CLASS (docs/extending.md).", json_schema_extra=_choices(SCHEMES, plugins=True))
    intra_group: Literal["server", "allreduce"] = Field("server", description="bsp and gssp: how a group combines its gradients. server: workers pull from and push to a (group) parameter server (GSSP: SSP inside each group, as the paper); allreduce: the group is synchronous, every member keeps its own replica and optimizer and the gradients are ring all-reduced (on ray: torch.distributed DDP, gloo on CPU, NCCL on GPU; on sim: a ring all-reduce's cost); GSSP groups still exchange their own deltas asynchronously, dense, and nobody is excused as a transient straggler.")
    options: dict[str, Any] = Field({}, description="Keyword arguments passed through to a python: scheme's constructor (after the workers).")
    ssp: SSPOptions = SSPOptions()
    gssp: GSSPOptions = GSSPOptions()
    localsgd: LocalSGDOptions = LocalSGDOptions()
    diloco: DiLoCoOptions = DiLoCoOptions()
    kbatch: KBatchOptions = KBatchOptions()

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


class GDTopKConfig(Section):
    initial_density: float = Field(0.25, gt=0, le=1, description="Density at the start of the warm-up.")
    warmup_epochs: float = Field(1.0, ge=0, description="Global epochs over which density shrinks to the final density.")
    final_density_fast: float = Field(0.004, gt=0, le=1, description="Final density of the fastest group.")
    final_density_slow: float = Field(0.015, gt=0, le=1, description="Final density of the slowest group (groups between are interpolated).")

    @model_validator(mode="after")
    def _slow_keeps_more(self) -> "GDTopKConfig":
        """`final_density_fast` must not exceed `final_density_slow`: slower groups push less often and keep the higher density"""
        if self.final_density_fast > self.final_density_slow:
            raise ValueError(f"final_density_fast ({self.final_density_fast}) must not exceed final_density_slow "
                             f"({self.final_density_slow}): slower groups push less often and keep the higher density")
        return self


class SimilarityConfig(Section):
    enabled: bool = Field(False, description="SIM: aggregate a parameter tensor only every tau iterations while workers' updates for it stay similar.")
    rule: Literal["snr", "cosine"] = Field("snr", description="SIM: when a tensor counts as similar. snr: the signal-to-noise ratio its mean cosine implies over the n updates measured, (s^2 - 1/n) / (1 - s^2), is at least min_snr (calibrated: 0 at the 1/sqrt(n) noise floor); cosine: the smoothed cosine is at least threshold.")
    min_snr: float = Field(1.0, ge=0, description="SIM rule snr: the signal-to-noise ratio (|mean update|^2 / a worker's noise^2) at or above which a tensor's period grows.")
    threshold: float = Field(0.4, ge=-1, le=1, description="SIM rule cosine: smoothed cosine similarity (worker update vs. aggregate) at or above which a tensor's period grows; independent noise alone gives 1/sqrt(workers).")
    base_period: int = Field(1, ge=1, description="SIM: the shortest aggregation period; with base_period = H and nothing similar, SIM averages like local SGD with local_steps = H.")
    max_period: int = Field(8, ge=1, description="SIM: longest aggregation period tau (iterations); bounds how far replicas drift.")
    warmup_iterations: int = Field(20, ge=0, description="SIM: clocks (per-worker iterations) during which every tensor is aggregated every time.")
    min_numel: int = Field(1024, ge=0, description="SIM: tensors with fewer values are always aggregated (skipping them saves little).")
    smoothing: float = Field(0.5, gt=0, le=1, description="SIM: weight of the newest measurement in the similarity's moving average.")

    @model_validator(mode="after")
    def _periods(self) -> "SimilarityConfig":
        """`base_period` must not exceed `max_period`"""
        if self.base_period > self.max_period:
            raise ValueError(f"base_period ({self.base_period}) must not exceed max_period ({self.max_period})")
        return self


class CompressionConfig(Section):
    method: str = Field("none", description="Compressor for worker uploads: none, one of the registered ones (gdtopk: top-k with a per-group density schedule), or a plug-in: python:FILE.py:CLASS, a shoal.compress.Compressor subclass (docs/extending.md).", json_schema_extra=_choices(COMPRESSORS, "none", plugins=True))
    options: dict[str, Any] = Field({}, description="Keyword arguments passed through to a python: compressor's constructor.")
    density: float = Field(0.01, gt=0, le=1, description="Fraction of values kept by sparsifying compressors.")
    rank: int = Field(4, ge=1, description="powersgd: rank r of the low-rank approximation of each matrix-shaped tensor.")
    momentum_correction: bool = Field(True, description="dgc with SGD momentum: workers apply the momentum before sparsifying and clear it where values were sent (DGC's momentum correction and factor masking); the server steps plain SGD.")
    error_feedback: bool = Field(True, description="Keep what was not sent and add it to the next gradient (biased compressors only: unbiased ones, randk and qsgd, skip it because feeding back their variance diverges).")
    gdtopk: GDTopKConfig = GDTopKConfig()
    similarity: SimilarityConfig = SimilarityConfig()

    @field_validator("method")
    @classmethod
    def _known_compressor(cls, v: str) -> str:
        """a registered compressor, none, or a python: plug-in that meets the protocol"""
        return _registered(COMPRESSORS, v, "none")


class NetworkConfig(Section):
    aggregation: Literal["server", "ina"] = Field("server", description="Where gradients are summed: at the server, or in the network (ina) along a routing plan.")
    topology: str = Field("fattree:k=4", description="ina: fattree:k=K[,hosts=H], leafspine:spines=S,leaves=L[,hosts=H], or a JSON topology file.")
    algorithm: str = Field("grid", description="ina: the planner that assigns each worker to a switch or the server (one of the registered planners).", json_schema_extra=_choices(PLANNERS))
    programmable: str = Field("tor", description="ina: programmable switches: tor, all, none, random:F, or a JSON file listing switch names.")
    capacity_gbps: list[float] = Field([100.0, 3200.0], min_length=1, max_length=2, description="ina: switch aggregation capacity (Gbps): [C] or [LO, HI] drawn uniformly per switch; [] is not allowed.")
    link_gbps: float | None = Field(None, gt=0, description="ina: bandwidth of every topology link (Gbps); none keeps the topology's (generated ones: 100).")
    ps_host: str | None = Field(None, description="ina: the host the server runs on; none = chosen from the seed.")
    worker_hosts: list[str] = Field([], description="ina: the host of each worker, in worker order; empty = placed from the seed.")
    switch_slots: int = Field(512, ge=1, description="ina, ray backend: memory units (aggregators) of each software switch; a fragment whose unit is taken goes on to the server unaggregated.")
    fragment_size: int = Field(1024, ge=1, description="ina, ray backend: gradient values per fragment (one switch unit holds one fragment).")
    resend_timeout_s: float = Field(1.0, gt=0, description="ina, ray backend: a worker resends fragments the server has not acknowledged within this many seconds.")

    @field_validator("algorithm")
    @classmethod
    def _known_planner(cls, v: str) -> str:
        """a registered planner"""
        return _registered(PLANNERS, v)


class BackendConfig(Section):
    name: Literal["sim", "ray"] = Field("sim", description="sim: virtual-clock simulator; ray: real processes.")
    mode: Literal["train", "cost"] = Field("train", description="cost: simulate the schedule only, no model math.")
    log_iterations: bool = Field(True, description="Write one metrics.jsonl line per worker iteration.")
    torch_threads: int = Field(1, ge=1, description="Torch intra-op threads of the sim process (1 is fastest for small models and deterministic); ray actors use the whole CPUs they request (cpus_per_worker, cpus_per_server), at least one.")
    address: str | None = Field(None, description="ray: none = start an embedded local Ray on 127.0.0.1 (no dashboard); \"auto\" or \"ray://HOST:PORT\" = join an existing cluster.")
    local_cpus: int = Field(0, ge=0, description="ray, local mode: CPUs the embedded Ray instance declares; 0 = this machine's core count (raised to fit the actors' requests).")
    cpus_per_worker: float = Field(1.0, ge=0, description="ray: CPUs each worker actor requests (fractions allowed).")
    gpus_per_worker: float = Field(0.0, ge=0, description="ray: GPUs each worker actor requests; with one, its model and gradients run on that GPU.")
    cpus_per_server: float = Field(1.0, ge=0, description="ray: CPUs each group server actor requests.")
    data_loading: Literal["workers", "driver"] = Field("workers", description="ray: workers: each worker loads the data set itself and takes its shard (the driver sends only the shard's indices and a digest, checked by the worker: every node must have the same data); driver: the driver ships every shard through the object store (for data only the driver's machine has).")
    combined_pull: bool = Field(True, description="ray: a worker's push and its next pull travel in one call (the server applies the gradient, waits at the gate, returns the parameters); false: two calls, as before. Not used with SIM, local SGD, DiLoCo or in-network aggregation.")
    standby_servers: int = Field(0, ge=0, le=64, description="ray: warm spare group-server processes kept ready, so a dead server is replaced in well under a second instead of the seconds a new process takes to start (each reserves cpus_per_server).")
    checkpoint_every_s: float = Field(30.0, ge=0, description="ray: group servers checkpoint replica and optimizer (safetensors + JSON) every this many wall seconds, and at the end; 0 = never.")
    max_restarts: int = Field(0, ge=0, description="ray: times each failed worker is restarted (it rejoins from its group's replica); 0 = drop it and go on.")
    worker_timeout_s: float = Field(60.0, ge=0, description="ray: a worker that has not answered the driver for this many wall seconds (hung, stopped, partitioned) is evicted as failed: its group stops waiting for it, then max_restarts applies; 0 = never. Must exceed the longest iteration.")


class Config(Section):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    task: TaskConfig = TaskConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    cluster: ClusterConfig = ClusterConfig()
    sync: SyncConfig = SyncConfig()
    compression: CompressionConfig = CompressionConfig()
    network: NetworkConfig = NetworkConfig()
    backend: BackendConfig = BackendConfig()

    def target(self) -> float | None:
        """The metric value that ends the run: run.target, else target_accuracy for accuracy, else none."""
        if self.run.target is not None:
            return self.run.target
        return self.run.target_accuracy if self.task.metric == "accuracy" else None

    @model_validator(mode="after")
    def _plugin_options(self) -> "Config":
        """Plug-in options:

        - `sync.options` and `compression.options` only with a python: plug-in
        - a plug-in scheme or compressor is built once with its options, so a bad class or bad options fail before the run
        """
        from shoal.plugins import call, is_plugin

        for key, name, options in (("sync", self.sync.scheme, self.sync.options),
                                   ("compression", self.compression.method, self.compression.options)):
            if options and not is_plugin(name):
                raise ValueError(f"{key}.options: only a python: plug-in takes options, not {name!r}")
        if is_plugin(self.sync.scheme):
            spec = SCHEMES[self.sync.scheme]
            call(lambda: spec.policy(list(range(self.cluster.workers)), self.sync), "sync.scheme", self.sync.scheme)
        if is_plugin(self.compression.method):
            compressor = COMPRESSORS[self.compression.method]
            call(lambda: compressor.from_config(self.compression, self.run.seed), "compression.method", self.compression.method)
        return self

    @model_validator(mode="after")
    def _similarity_needs_gradients(self) -> "Config":
        """Rules across sections:

        - a python: `task.metric` says whether higher is better (`task.higher_is_better`)
        - SIM (`compression.similarity.enabled`) measures real gradients: not with `backend.mode = "cost"`
        - SIM does not go with a scheme that already averages periodically (localsgd, diloco), and such a scheme steps real local models: not with `backend.mode = "cost"`
        - `sync.intra_group = "allreduce"` needs a synchronous scheme (bsp, gssp), dense gradients (`compression.method = "none"`, no SIM) and `network.aggregation = "server"`
        - `network.aggregation = "ina"` needs one synchronous round (`sync.scheme = "bsp"`) and dense gradients; `network.worker_hosts`, when given, names one host per worker
        - `cluster.membership` needs the server path: no all-reduce groups, no in-network aggregation
        """
        if self.task.higher_is_better is None and self.task.metric.startswith("python:"):
            raise ValueError("task.higher_is_better: say whether a higher value of your metric is better (true or false)")
        if self.compression.similarity.enabled and self.backend.mode == "cost":
            raise ValueError("compression.similarity: SIM measures real gradients, so it needs backend.mode = \"train\"")
        scheme = SCHEMES[self.sync.scheme]
        if scheme.local_models:
            if self.compression.similarity.enabled:
                others = ", ".join(name for name, e in SCHEMES.entries().items() if not e.item.local_models)
                raise ValueError(f"compression.similarity: {self.sync.scheme} already averages periodically; SIM applies to {others}")
            if self.backend.mode == "cost":
                raise ValueError(f"sync.scheme: {self.sync.scheme} steps real local models, so it needs backend.mode = \"train\"")
        if self.sync.intra_group == "allreduce":
            if not scheme.allreduce:
                synchronous = " or ".join(f"\"{name}\"" for name, spec in SCHEMES.entries().items() if spec.item.allreduce)
                raise ValueError(f"sync.intra_group: all-reduce groups are synchronous: sync.scheme = {synchronous}, not {self.sync.scheme}; use intra_group = \"server\"")
            if self.compression.method != "none" or self.compression.similarity.enabled:
                raise ValueError("sync.intra_group: the all-reduce path sends dense gradients; use compression.method = \"none\" without SIM")
            if self.network.aggregation == "ina":
                raise ValueError("sync.intra_group: in-network aggregation sums at switches through the server path; use intra_group = \"server\"")
        if self.network.aggregation == "ina":
            if not scheme.ina:
                raise ValueError("network.aggregation: in-network aggregation sums one synchronous round, so it needs sync.scheme = \"bsp\"")
            if self.compression.method != "none" or self.compression.similarity.enabled:
                raise ValueError("network.aggregation: switches sum dense gradients; use compression.method = \"none\" without SIM")
            if self.network.worker_hosts and len(self.network.worker_hosts) != self.cluster.workers:
                raise ValueError(f"network.worker_hosts: {len(self.network.worker_hosts)} hosts for {self.cluster.workers} workers")
        if self.cluster.membership and (self.sync.intra_group == "allreduce" or self.network.aggregation == "ina"):
            raise ValueError("cluster.membership: workers join and leave the server path; all-reduce groups and "
                             "in-network aggregation plans are fixed at the start (use intra_group = \"server\", "
                             "network.aggregation = \"none\")")
        return self


def _format_error(err: ValidationError, source: str) -> str:
    """One line: the first problem, with its dotted key (union members merged, a "did you mean" for typos)."""
    errors = err.errors()
    first = errors[0]
    loc = [str(p) for p in first["loc"]]
    field_loc, tags = _split_union_tags(loc)
    same_field = [e for e in errors if _split_union_tags([str(p) for p in e["loc"]])[0] == field_loc]
    key = ".".join(field_loc)
    if tags:  # a value that fits none of a union's members: say what each expects, once
        accepted = " or ".join(dict.fromkeys(
            _plain(e["msg"]).removeprefix("Input should be ").split(",")[0] for e in same_field))
        msg = f"{first['input']!r} is not valid: expected {accepted}"
        rest = len(errors) - len(same_field)
    else:
        msg, rest = _plain(first["msg"]), len(errors) - 1
    if first["type"] == "extra_forbidden":
        msg = "unknown key" + _did_you_mean(field_loc)
    elif first["type"] == "model_type":
        msg = f"expected a [{key}] table, got {first['input']!r}"
    elif first["type"] == "finite_number":
        msg = f"must be a finite number, got {first['input']!r}"
    more = f" (and {rest} more)" if rest > 0 else ""
    return f"{source}: {key}: {msg}{more}" if key else f"{source}: {msg}{more}"


def _plain(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def _split_union_tags(loc: list[str]) -> tuple[list[str], list[str]]:
    """pydantic appends the union member it tried (``int``, ``literal['auto']``) to an error's location."""
    for i in range(1, len(loc)):
        if _is_tag(loc[i]):
            return loc[:i], loc[i:]
    return loc, []


def _section_model(path: list[str]) -> Any:
    """The pydantic model of the section at ``path`` (None: a value, or a free table such as model.options)."""
    model: Any = Config
    for part in path:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        annotation = fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


def _is_tag(part: str) -> bool:
    return part in {"int", "float", "str", "bool"} or part.startswith(("literal[", "list[", "function-"))


def _did_you_mean(loc: list[str]) -> str:
    """`` (did you mean 'workers'?)`` for a key one typo away from a known one, else nothing."""
    model = _section_model(loc[:-1])
    fields = dict(getattr(model, "model_fields", {})) if model is not None else {}
    known = {name: name for name in fields}
    for section, field in fields.items():  # a key of a subsection too: sync.stalenes -> ssp.staleness
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            for name in sub.model_fields:
                known.setdefault(name, f"{section}.{name}")
    close = difflib.get_close_matches(loc[-1], list(known), n=1, cutoff=0.7) if loc else []
    return f" (did you mean {known[close[0]]!r}?)" if close else ""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``section.key=value``; the value is read as TOML, else taken as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``--set`` override written in."""
    data = json.loads(json.dumps(data))
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for depth, part in enumerate(path[:-1]):
            prefix = path[: depth + 1]
            child = node.setdefault(part, {})
            if not isinstance(child, dict) or (_is_value(prefix) and depth + 1 < len(path)):
                raise ConfigError(f"--set {text!r}: {'.'.join(prefix)} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def _is_value(path: list[str]) -> bool:
    """Whether ``path`` names a typed field that is not a section (``run.seed``; not ``model.options``)."""
    parent = _section_model(path[:-1])
    if parent is None or path[-1] not in parent.model_fields:
        return False
    annotation = parent.model_fields[path[-1]].annotation
    is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return not is_section and getattr(annotation, "__origin__", None) is not dict


def build_config(data: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a TOML file (or the defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return build_config(apply_overrides(data, overrides or []), source)


def to_toml(cfg: Config) -> str:
    """Write a resolved config as TOML (tomlkit: inline arrays, one table per section and subsection)."""
    return tomlkit.dumps(_without_none(cfg.model_dump()))


def toml_value(value: Any) -> str:
    """One value in TOML syntax, tables inline (``--set`` overrides, the docs' default column)."""
    return tomlkit.item(_inline(_without_none(value))).as_string()


def _without_none(value: Any) -> Any:
    """TOML has no null: a key whose value is None is left out (reading it back gives the default, None)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def _inline(value: Any) -> Any:
    if isinstance(value, dict):
        table = tomlkit.inline_table()
        table.update({k: _inline(v) for k, v in value.items()})
        return table
    if isinstance(value, list):
        array = tomlkit.array()
        array.extend(_inline(v) for v in value)
        return array
    return value
