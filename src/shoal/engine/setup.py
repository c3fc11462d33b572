"""Everything a backend needs for one run, built once from a config."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from shoal.cluster import ClusterProfile, build_profile
from shoal.config import Config
from shoal.errors import ConfigError
from shoal.data import BatchStream, Dataset, class_histograms, load_dataset, partition_indices
from shoal.engine.gradients import GradientEngine
from shoal.engine.task import Task
from shoal.models import build_module
from shoal.plugins import user_frame

if TYPE_CHECKING:  # the planners (networkx, scipy, HiGHS) load only for a run that aggregates in the network
    from shoal.network.training import AggregationPlan


@dataclass
class RunSetup:
    """A config resolved into data, model, cluster profile and per-worker batch streams."""

    cfg: Config
    dataset: Dataset
    engine: GradientEngine
    profile: ClusterProfile
    streams: list[BatchStream]
    compute_s_measured: float | None = None
    aggregation: AggregationPlan | None = None  # in-network aggregation plan ([network] aggregation = "ina")

    @property
    def train_mode(self) -> bool:
        return self.cfg.backend.mode == "train"

    @property
    def download_bytes(self) -> int:
        """A parameter pull: float32 parameters plus batch-norm buffers."""
        return 4 * (self.engine.num_params + self.num_buffer_values)

    @property
    def n_train(self) -> int:
        return len(self.dataset.y_train)

    def epochs(self, iterations: int) -> float:
        """Global epochs after ``iterations`` worker iterations (all workers' samples over the training set)."""
        return iterations * self.cfg.data.batch_size / max(1, self.n_train)

    @property
    def num_buffer_values(self) -> int:
        return self.engine.num_buffer_values

    def partition_summary(self) -> dict[str, object]:
        """summary.json's ``partition``: how the data was split and each worker's class histogram."""
        labels = self.dataset.y_train
        shards = [s.shard for s in self.streams]
        counts = None
        if labels.dim() == 1 and not labels.is_floating_point():  # one class label per sample
            counts = class_histograms(labels.numpy(), shards, self.dataset.num_classes)
        summary: dict[str, object] = {"partition": self.cfg.data.partition, "class_counts": counts}
        if self.dataset.sources is not None:  # which sources (packages) each worker holds
            names = self.dataset.source_names
            summary["sources"] = [[names[i] for i in np.unique(self.dataset.sources[s])] for s in shards]
        return summary


def build_setup(cfg: Config) -> RunSetup:
    """Load data, seed and build the model, measure compute time if asked, shard the data."""
    torch.set_num_threads(cfg.backend.torch_threads)
    torch.manual_seed(cfg.run.seed)
    dataset = load_dataset(
        cfg.data.name,
        seed=cfg.run.seed,
        test_fraction=cfg.data.test_fraction,
        synthetic_samples=cfg.data.synthetic_samples,
        options=cfg.data.options,
    )
    engine = build_engine(cfg, dataset.input_shape, dataset.num_classes)
    if cfg.backend.name == "sim" and cfg.backend.mode == "train":
        engine.to(sim_device(cfg.backend.device))
    check_fit(engine, dataset, cfg)
    measured = None
    if cfg.cluster.compute_s == 0:
        batch = min(cfg.data.batch_size, len(dataset.y_train))
        measured = engine.measure_compute_s(dataset.x_train[:batch], dataset.y_train[:batch])
    profile = build_profile(cfg.cluster, cfg.run.seed, compute_s=measured)
    aggregation = None
    if cfg.network.aggregation == "ina":
        from shoal.network.training import plan_aggregation

        aggregation = plan_aggregation(cfg)
    return RunSetup(cfg, dataset, engine, profile, _streams(cfg, dataset), measured, aggregation)


def sim_device(choice: str) -> torch.device:
    """backend.device for the simulator: auto = CUDA where torch sees it. On CUDA, TF32 off and deterministic
    algorithms on: a rerun on the same device (and the same batching) is bitwise identical."""
    available = torch.cuda.is_available()
    if choice == "cuda" and not available:
        raise ConfigError(f"backend.device = \"cuda\": torch {torch.__version__} sees no CUDA device here; use "
                          "\"auto\" or \"cpu\"")
    if choice == "cpu" or not available:
        return torch.device("cpu")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS needs it before first use
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.device("cuda")


def build_engine(cfg: Config, input_shape: tuple[int, ...], num_classes: int) -> GradientEngine:
    """The model (built-in or the user's factory) and the task (loss, metric): the same in every process."""
    model = build_module(cfg.model.name, input_shape, num_classes, hidden=cfg.model.hidden, options=cfg.model.options)
    if cfg.model.init_from is not None:
        warm_start(model, Path(cfg.model.init_from))
    return GradientEngine(model, Task.from_config(cfg.task))


def warm_start(model: torch.nn.Module, run_dir: Path) -> None:
    """model.init_from: the weights (and batch-norm statistics) an earlier run ended with."""
    from safetensors.torch import load_file

    try:
        model.load_state_dict(load_file(str(run_dir / "model.safetensors")))
    except (RuntimeError, OSError) as err:
        raise ConfigError(f"model.init_from {run_dir}: its weights do not fit this model: "
                          f"{str(err).strip().splitlines()[0][:200]}") from None


def check_fit(engine: GradientEngine, dataset: Dataset, cfg: Config) -> None:
    """One forward pass and loss on two samples, so a model that does not fit the data fails before the run."""
    x, y = dataset.x_train[:2], dataset.y_train[:2]
    try:
        with torch.no_grad():
            out = engine.model(x.to(engine.device))
            loss = engine.task.loss(out, y.to(engine.device))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - shapes the user's model, data or loss disagree on
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        where = user_frame(err)
        raise ConfigError(f"model {cfg.model.name!r} on data {cfg.data.name!r} with task.loss {cfg.task.loss!r}: "
                          f"a forward pass on input {tuple(x.shape)} failed: {text}"
                          f"{f' ({where})' if where else ''}") from None
    if not torch.isfinite(loss).all():
        raise ConfigError(f"task.loss {cfg.task.loss!r}: not finite on the first samples")


def _streams(cfg: Config, dataset: Dataset) -> list[BatchStream]:
    """One batch stream per worker over disjoint shards (none in cost mode)."""
    if cfg.backend.mode == "cost":
        return []
    n_train = len(dataset.y_train)
    if cfg.cluster.workers > n_train:
        raise ConfigError(
            f"cluster.workers: {cfg.cluster.workers} workers but only {n_train} training samples to shard"
        )
    labels = dataset.y_train.numpy()
    by_class = cfg.data.partition not in ("iid", "by_source")
    if by_class and (labels.ndim != 1 or dataset.y_train.is_floating_point()):
        raise ConfigError(f"data.partition: {cfg.data.partition} needs one class label per sample; use iid")
    try:
        shards = partition_indices(labels, cfg.cluster.workers, cfg.run.seed, cfg.data.partition, dataset.sources)
    except ValueError as err:
        raise ConfigError(f"data.partition: {err}") from None
    smallest = min(len(shard) for shard in shards)
    if cfg.data.batch_size > smallest:
        raise ConfigError(f"data.batch_size: {cfg.data.batch_size} is larger than the smallest worker's shard "
                          f"({smallest} samples of {n_train} over {cfg.cluster.workers} workers)")
    return [BatchStream(dataset, shard, cfg.data.batch_size, cfg.run.seed, w) for w, shard in enumerate(shards)]

