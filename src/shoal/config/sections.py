"""The sections of a run's config other than [sync]: run, model, data, task, optimizer, cluster, balance,
compression, network, backend."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, field_validator, model_validator

from shoal.config.base import PositiveFloats, PositiveInts, Section, _choices, _plugin_or, _registered
from shoal.registry import COMPRESSORS, DATA_FORMATS, DATASETS, MODELS, PLANNERS


class RunConfig(Section):
    seed: int = Field(0, description="Seeds data split, sharding, initial weights and stragglers.")
    target_accuracy: float = Field(0.95, gt=0, le=1, description="Test accuracy that ends the run (fraction), when task.metric = \"accuracy\" and run.target is not set.")
    target: float | None = Field(None, description="Value of task.metric that ends the run (reached when at least it, or at most it for a metric where lower is better); none = target_accuracy for accuracy, no target otherwise.")
    max_time_s: float = Field(600.0, gt=0, description="Time budget: virtual seconds on sim, wall seconds on ray.")
    max_iterations: int = Field(0, ge=0, description="Budget of total worker iterations; 0 = no limit.")
    eval_every_s: float = Field(1.0, gt=0, description="Evaluate the model every this many (virtual) seconds.")
    eval_every_iterations: int = Field(0, ge=0, description="Evaluate every this many worker iterations (all workers together) instead of every eval_every_s; 0 = by time. Schemes whose times to target differ several-fold still get the same resolution in iterations, and evaluation costs the same for each.")
    eval_refine: int = Field(1, ge=1, le=64, description="sim: a time to target finer than the evaluation period. The evaluated model is copied this many times per period (1 = never: off) and, when the run reaches its target, the copies kept just before are evaluated, latest first, until one misses; the time to target is the earliest copy from which every evaluation reached the target. At most eval_refine - 1 extra evaluations per run, and the training is unchanged (docs/fair-comparison.md).")
    stop_at_target: bool = Field(True, description="Stop as soon as target_accuracy is reached.")
    target_patience: int = Field(3, ge=1, description="Evaluations in a row at or above target_accuracy that count as reaching it; the time reported is the first of them (3: one lucky evaluation on a 1,000-image test set, +-1.35 points of noise at 95% accuracy, cannot decide a row).")
    tensorboard: bool = Field(False, description="Also write TensorBoard scalars to OUT/tensorboard (accuracy, loss, bytes moved, per-group iterations per second; needs pip install 'shoal[tensorboard]').")

    @model_validator(mode="after")
    def _refine_within_a_period(self) -> "RunConfig":
        """Each copy of run.eval_refine lies at least one iteration after the last when evaluating by iterations."""
        if self.eval_every_iterations and self.eval_refine > self.eval_every_iterations:
            raise ValueError(f"eval_refine: {self.eval_refine} copies per period of {self.eval_every_iterations} "
                             "iterations leave less than one iteration between two; at most eval_every_iterations")
        return self


class ModelConfig(Section):
    name: str = Field("lenet5", description="Model: a registered one or python:FILE.py:FUNCTION | python:package.module:FUNCTION (called as FUNCTION(input_shape=..., num_classes=..., **model.options), returns a torch.nn.Module).", json_schema_extra=_choices(MODELS, plugins=True))
    hidden: PositiveInts = Field([256, 128], description="Hidden layer widths of the mlp model.")
    options: dict[str, Any] = Field({}, description="Keyword arguments of the model factory: a python: one's, or a built-in's (transformer: layers, width, heads).")
    init_from: str | None = Field(None, description="Warm start: begin from the trained weights of an earlier run (its folder, holding model.safetensors), with the same model; none = the seed's fresh weights. The folder is resolved when the config is read.")

    @field_validator("init_from")
    @classmethod
    def _run_with_weights(cls, v: str | None) -> str | None:
        """a folder holding model.safetensors, made absolute"""
        if v is None:
            return v
        folder = Path(v).expanduser()
        if not (folder / "model.safetensors").is_file():
            raise ValueError(f"{v}: no model.safetensors there; name the folder of an earlier run")
        return str(folder.resolve())

    @field_validator("name")
    @classmethod
    def _known_model(cls, v: str) -> str:
        """a registered model or a python: plug-in whose file exists"""
        return _plugin_or(MODELS.names(), v, "model")


class DataConfig(Section):
    name: str = Field("mnist5k", description="A registered data set, KIND:PATH for a file in a registered format (idx:PATH, cifar10:PATH, npz:PATH), or python:FILE.py:FUNCTION (FUNCTION(**data.options) returns (train, test), each a Dataset of (x, y) or a pair of tensors).")
    options: dict[str, Any] = Field({}, description="Keyword arguments of the data set: a python: function's, or a built-in's (stdlib: context, max_bytes, holdout, test_windows).")
    batch_size: int = Field(32, gt=0, description="Mini-batch size per worker iteration.")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="Fraction of the data held out for evaluation.")
    synthetic_samples: int = Field(4000, gt=0, description="Number of samples of the synthetic data set.")
    partition: str = Field("iid", description="How training samples are split over workers: iid | dirichlet:ALPHA (class shares per worker drawn from Dirichlet(ALPHA); small = skewed) | classes:K (each worker holds K classes) | by_source (each worker holds a disjoint set of the data's sources, e.g. the stdlib text's top-level packages).")

    @field_validator("partition")
    @classmethod
    def _known_partition(cls, v: str) -> str:
        """iid, dirichlet:ALPHA with ALPHA > 0, classes:K with K >= 1, or by_source"""
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
TASK_METRICS = ("accuracy", "loss", "perplexity", "bits_per_byte")


class TaskConfig(Section):
    loss: str = Field("cross_entropy", description="Training loss: cross_entropy (class logits, or (N, T, C) sequence logits) | mse | python:FILE.py:FUNCTION (FUNCTION(output, target) returns a scalar tensor).")
    metric: str = Field("accuracy", description="What evaluations report and run.target is compared with: accuracy | loss | perplexity (exp of the mean cross-entropy) | bits_per_byte (the mean cross-entropy in bits; byte-level language models) | python:FILE.py:FUNCTION (FUNCTION(output, target) on the whole test set returns a number).")
    higher_is_better: bool | None = Field(None, description="Direction of task.metric; none = by the metric (accuracy: higher; loss, perplexity, bits_per_byte: lower). Required for a python: metric.")

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


#: the steps of optimizer.warmup_epochs' linear warm-up, and of optimizer.cosine_epochs' cosine
WARMUP_STAIRS = 32
COSINE_STAIRS = 64

#: the metrics.jsonl events of a change of the learning rate (OptimizerConfig.change_event); each carries ``lr``
RATE_EVENTS = ("lr_decay", "lr_warmup", "lr_cosine")

#: a coefficient of Adam's running averages
Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerConfig(Section):
    name: Literal["sgd", "adam", "adamw"] = Field("sgd", description="Server-side optimizer: sgd (with momentum), adam, or adamw (Adam with decoupled weight decay, Loshchilov & Hutter, 2019: the decay shrinks the parameters directly instead of passing through Adam's normalisation, as transformer training does today).")
    lr: float = Field(0.05, gt=0, description="Learning rate.")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum.")
    weight_decay: float = Field(0.0, ge=0, description="sgd, adam: an L2 penalty added to the gradient, with the same 1/N weight as gradients; adamw: decoupled, every step shrinks the parameters by lr x weight_decay (scaled like the step).")
    betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="adam, adamw: two values in [0, 1), the coefficients of the running averages of the gradient and of its square (torch's betas); transformers are often trained with [0.9, 0.95].")
    clip_norm: float | None = Field(None, gt=0, description="Clip the gradient of every optimizer step to this L2 norm (over all parameters), as torch.nn.utils.clip_grad_norm_ does before DDP's step: the mean of the gradients the step applies (BSP: the round's mean; ASP, SSP, local steps: each gradient), before weight decay. Not set: no clipping.")
    lr_decay_epochs: list[Annotated[float, Field(gt=0)]] = Field([], description="Global epochs (> 0) at which the learning rate is multiplied by lr_decay_factor (a step schedule).")
    lr_decay_factor: float = Field(0.1, gt=0, le=1, description="Factor applied to the learning rate at each of lr_decay_epochs; with cosine_epochs, the floor (a share of lr) the cosine descends to.")
    warmup_epochs: float = Field(0.0, ge=0, description=f"A linear warm-up: over the first this many global epochs the learning rate rises in steps of lr / {WARMUP_STAIRS}, from lr / {WARMUP_STAIRS} to lr ({WARMUP_STAIRS} stairs of equal length, each applied on every server, all-reduce rank and local model, as a decay is), then follows the decay schedule; 0 = none. Transformers trained with Adam usually want one.")
    cosine_epochs: float = Field(0.0, ge=0, description=f"A cosine decay instead of lr_decay_epochs: after the warm-up, over this many global epochs the learning rate descends along a half cosine from lr to lr x lr_decay_factor, in {COSINE_STAIRS} stairs of equal length, and stays there; 0 = none. Runs stop at their target, so the horizon is yours to give (the epochs a run to target takes, or more).")

    @model_validator(mode="after")
    def _one_decay_schedule(self) -> "OptimizerConfig":
        """`optimizer.cosine_epochs` and `optimizer.lr_decay_epochs` are not both set (one decay schedule)."""
        if self.cosine_epochs and self.lr_decay_epochs:
            raise ValueError("cosine_epochs and lr_decay_epochs are two decay schedules: set one of them")
        return self

    def lr_at(self, epoch: float) -> float:
        """The learning rate after ``epoch`` global epochs: the warm-up's stair, times the decay schedule's."""
        steps = self.lr_decay_factor ** self.decays_at(epoch)
        return self.lr * self.warmup_factor(epoch) * self.cosine_factor(epoch) * steps

    def cosine_factor(self, epoch: float) -> float:
        """The cosine's share of lr at ``epoch``: 1 until the warm-up ends, then its k-th stair's
        floor + (1 - floor) (1 + cos(pi k / COSINE_STAIRS)) / 2, then the floor (lr_decay_factor)."""
        if not self.cosine_epochs or epoch < self.warmup_epochs:
            return 1.0
        k = min(math.floor((epoch - self.warmup_epochs) / self.cosine_epochs * COSINE_STAIRS), COSINE_STAIRS)
        if k == 0:  # exactly lr: floor + (1 - floor) need not round to 1
            return 1.0
        return self.lr_decay_factor + (1 - self.lr_decay_factor) * (1 + math.cos(math.pi * k / COSINE_STAIRS)) / 2

    def decays_at(self, epoch: float) -> int:
        """How many steps of the decay schedule have passed at ``epoch`` (SIM restarts its periods at each)."""
        return sum(1 for e in self.lr_decay_epochs if epoch >= e)

    def warmup_factor(self, epoch: float) -> float:
        """The warm-up's share of lr at ``epoch``: (k + 1) / WARMUP_STAIRS in its k-th stair, then 1. A few dozen
        stairs instead of a change every step: each change reaches every process (on ray, a message per server and
        worker), and a stair is too small a step for the curve to show it."""
        if epoch >= self.warmup_epochs:
            return 1.0
        return (math.floor(epoch / self.warmup_epochs * WARMUP_STAIRS) + 1) / WARMUP_STAIRS

    @property
    def scheduled(self) -> bool:
        """Whether the learning rate ever changes during a run."""
        return bool(self.lr_decay_epochs) or self.warmup_epochs > 0 or self.cosine_epochs > 0

    def change_event(self, epoch: float, decayed: bool) -> str:
        """What metrics.jsonl calls a change of the rate at ``epoch``: a step decay, a warm-up stair or a cosine's."""
        return "lr_decay" if decayed else "lr_warmup" if epoch < self.warmup_epochs else "lr_cosine"


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


class BalanceConfig(Section):
    """``[balance]``: how ``sync.balance`` sizes each worker's work to its speed."""

    min_batch: int = Field(1, ge=1, description="sync.balance = \"batch\": the smallest batch a worker is given.")
    max_batch: int | None = Field(None, ge=1, description="sync.balance = \"batch\": the largest batch a worker is given (its memory limit); none = no limit.")
    min_steps: int = Field(1, ge=1, description="sync.balance = \"steps\": the fewest local steps a worker takes between two averagings.")
    max_steps: int | None = Field(None, ge=1, description="sync.balance = \"steps\": the most local steps a worker takes between two averagings; none = no limit.")
    deadline: float = Field(1.0, gt=0, description="sync.balance = \"deadline\": a round's compute time limit, as a multiple of the median worker's profiled time for one data.batch_size batch (adapts as the profiles move; no limit until every worker is profiled).")
    micro_batch: int = Field(8, ge=1, description="sync.balance = \"deadline\": a worker cut off by the deadline contributes the whole micro-batches of this many samples it finished.")
    tolerance: float = Field(0.05, ge=0, lt=1, description="Resize only when the predicted round gets at least this share faster (hysteresis: profile noise does not resize).")
    profile_iterations: int = Field(3, ge=1, description="Iterations each worker is measured at the configured batch before the first resize.")
    profile_window: int = Field(20, ge=1, description="A worker's speed is the 20th percentile of its last this many seconds-per-sample: a slow spell shorter than four fifths of the window does not resize, a sustained change does.")


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
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="sim, train mode: where the model computes (its gradients and evaluations); the replicas and optimizers stay on the CPU. auto: cuda when torch sees a CUDA device, else cpu. On cuda, TF32 is off and deterministic algorithms on, so a rerun is bitwise identical on the same device. The ray backend places models with gpus_per_worker instead.")
    batched: bool | Literal["auto"] = Field("auto", description="sim, train mode: compute every pending worker's gradient in one vmapped call (torch.func) instead of one after another; results equal the loop's to float rounding (docs/sim-batched.md). auto: batched on a CUDA device, the loop on the CPU (where batching was measured not to pay). A model vmap cannot take falls back to the loop, with the reason in summary.json's batching.")
    batch_limit: int = Field(64, ge=1, description="sim, batched: the most workers' gradients in one vmapped call (more pending requests take several calls; a call that runs out of device memory is retried in halves, and the limit stays halved).")
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
    sim_checkpoint_every_s: float = Field(0.0, ge=0, description="sim: checkpoint at the first end of a round after every this many virtual seconds (the moment every worker waits and nothing is in flight; bsp on the server path); --resume then continues bit for bit as the run would have; 0 = never.")
    max_restarts: int = Field(0, ge=0, description="ray: times each failed worker is restarted (it rejoins from its group's replica); 0 = drop it and go on.")
    worker_timeout_s: float = Field(60.0, ge=0, description="ray: a worker that has not answered the driver for this many wall seconds (hung, stopped, partitioned) is evicted as failed: its group stops waiting for it, then max_restarts applies; 0 = never. Must exceed the longest iteration.")
