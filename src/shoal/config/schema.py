"""The root of a run's config: every section, and the rules that involve several of them."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from shoal.config.base import Section
from shoal.config.sections import (BackendConfig, BalanceConfig, ClusterConfig, CompressionConfig, DataConfig, ModelConfig,
                                   NetworkConfig, OptimizerConfig, RunConfig, TaskConfig)
from shoal.config.sync import SyncConfig
from shoal.registry import COMPRESSORS, SCHEMES


class Config(Section):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    task: TaskConfig = TaskConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    cluster: ClusterConfig = ClusterConfig()
    sync: SyncConfig = SyncConfig()
    balance: BalanceConfig = BalanceConfig()
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
    def _resolve_data_path(self) -> "Config":
        """`sync.intra_group = "auto"` becomes the path that runs: all-reduce groups for bsp on ray when nothing
        needs a server, else the server path; the reason is kept for summary.json's data_path"""
        if self.sync.intra_group == "auto":
            self.sync.intra_group = resolve_intra_group(self)[0]
        return self

    def data_path(self) -> dict[str, str]:
        """summary.json's data_path: how groups combined their gradients, and why (the automatic rule's reason,
        or that the config chose otherwise)."""
        path, reason = resolve_intra_group(self)
        why = reason if path == self.sync.intra_group else f"set in the config (auto would take {path}: {reason})"
        return {"intra_group": self.sync.intra_group, "why": why}

    @model_validator(mode="after")
    def _similarity_needs_gradients(self) -> "Config":
        """Rules across sections:

        - a python: `task.metric` says whether higher is better (`task.higher_is_better`)
        - SIM (`compression.similarity.enabled`) measures real gradients: not with `backend.mode = "cost"`
        - SIM does not go with a scheme that already averages periodically (localsgd, diloco), and such a scheme steps real local models: not with `backend.mode = "cost"`
        - `sync.intra_group = "allreduce"` needs a synchronous scheme (bsp, gssp), dense gradients (`compression.method = "none"`, no SIM) and `network.aggregation = "server"`
        - `network.aggregation = "ina"` needs one synchronous round (`sync.scheme = "bsp"`) and dense gradients; `network.worker_hosts`, when given, names one host per worker
        - `cluster.membership` needs the server path: no all-reduce groups, no in-network aggregation
        - `sync.balance` needs a scheme that supports the mode, `data.batch_size` within [`balance.min_batch`, `balance.max_batch`], and the server path or all-reduce groups of a fixed membership (no in-network aggregation, no `cluster.membership`, no `backend.sim_checkpoint_every_s`)
        - an overlapped exchange (`sync.streaming_diloco.overlap_steps` > 0) waits for a fixed set of workers: no `cluster.membership`
        - `backend.sim_checkpoint_every_s` needs rounds that every worker ends by waiting: sync.scheme = "bsp" on the server path, without SIM, in-network aggregation, membership or speed changes
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
        if self.sync.balance != "none":
            self._check_balance(scheme)
        if scheme.overlap is not None and scheme.overlap(self.sync)[0] > 0 and self.cluster.membership:
            raise ValueError(f"cluster.membership: an overlapped exchange (sync.{self.sync.scheme}.overlap_steps) "
                             "waits for a fixed set of workers; use overlap_steps = 0 with membership changes")
        if self.backend.sim_checkpoint_every_s > 0:
            plain_rounds = (scheme.ina and self.sync.intra_group == "server" and not self.compression.similarity.enabled
                            and self.network.aggregation == "server" and not self.cluster.membership
                            and not self.cluster.speed_changes and self.backend.mode == "train")
            if not plain_rounds:
                raise ValueError("backend.sim_checkpoint_every_s: the simulator checkpoints at the end of a round, "
                                 "when every worker waits and nothing is in flight: it needs sync.scheme = \"bsp\" on "
                                 "the server path in train mode, without SIM, in-network aggregation, membership or "
                                 "speed changes")
        return self

    def _check_balance(self, scheme: Any) -> None:
        """`sync.balance`: a scheme that supports the mode, a batch size within the bounds, a fixed membership."""
        mode = self.sync.balance
        if scheme.policy is not None and scheme.policy(range(self.cluster.workers), self.sync).flushes:
            raise ValueError(f"sync.balance: sizes work for rounds that wait for everyone; {self.sync.scheme}'s "
                             "asynchronous outer steps wait for nobody")
        if mode not in scheme.balance:
            able = ", ".join(name for name, e in SCHEMES.entries().items() if mode in e.item.balance)
            raise ValueError(f"sync.balance: {mode!r} sizes the work of synchronous rounds ({able}), not of {self.sync.scheme}")
        if mode == "deadline" and self.compression.similarity.enabled:
            raise ValueError("sync.balance: a deadline round sends whole gradients; SIM's partial ones do not fit it")
        if mode == "deadline" and self.balance.micro_batch > self.data.batch_size:
            raise ValueError(f"balance.micro_batch = {self.balance.micro_batch} is larger than data.batch_size = "
                             f"{self.data.batch_size}")
        options = getattr(self.sync, self.sync.scheme, None)
        if mode == "steps" and (getattr(options, "warmup_steps", 0) or getattr(options, "adaptive", False)):
            raise ValueError(f"sync.balance: balanced local steps make every iteration a whole period; "
                             f"sync.{self.sync.scheme}.warmup_steps and adaptive periods do not fit it")
        if mode in ("batch", "deadline"):
            low, high, name, value = self.balance.min_batch, self.balance.max_batch, "data.batch_size", self.data.batch_size
        else:
            low, high, value = self.balance.min_steps, self.balance.max_steps, scheme.local_steps(self.sync)
            name = f"sync.{self.sync.scheme}.local_steps"
        bounds = "min_steps and max_steps" if mode == "steps" else "min_batch and max_batch"
        if not low <= value <= (high or value):
            raise ValueError(f"balance: {name} = {value} must lie within {bounds} ({low} and {high})")
        if self.cluster.membership or self.network.aggregation == "ina" or self.backend.sim_checkpoint_every_s:
            raise ValueError("sync.balance: sizes are planned over a fixed set of workers on the server path or "
                             "all-reduce groups; not with cluster.membership, network.aggregation = \"ina\" or "
                             "backend.sim_checkpoint_every_s")


def resolve_intra_group(cfg: Config) -> tuple[str, str]:
    """The path ``sync.intra_group = "auto"`` takes, and why: the fastest correct one.

    On ray, BSP's round runs as DDP all-reduce groups (measured at DDP's own
    speed, benchmarks/results/runtime_overhead.md) unless a feature needs a
    server. GSSP keeps its group servers: its groups run SSP, which an
    all-reduce cannot. The simulator models the server path unless told
    otherwise, so its results stay comparable with every earlier run.
    """
    scheme = SCHEMES[cfg.sync.scheme]
    if cfg.backend.name != "ray":
        return "server", "the simulator models the server path unless sync.intra_group = \"allreduce\""
    if not scheme.allreduce or scheme.coordinator is not None:
        return "server", f"{cfg.sync.scheme} is not one synchronous round (all-reduce groups are for bsp)"
    needs = [(cfg.compression.method != "none", f"compression.method = {cfg.compression.method!r} compresses at "
                                                "the server"),
             (cfg.compression.similarity.enabled, "SIM decides at the server"),
             (cfg.network.aggregation == "ina", "in-network aggregation sums on the way to the server"),
             (bool(cfg.cluster.membership), "workers join and leave through the server"),
             (cfg.sync.balance != "none", "the server sizes balanced batches"),
             (cfg.backend.max_restarts > 0, "a restarted worker rejoins from its server")]
    reason = next((why for needed, why in needs if needed), None)
    if reason is not None:
        return "server", reason
    return "allreduce", ("bsp on ray with dense gradients: DDP all-reduce groups (on this path a failed worker ends "
                         "the run and no server checkpoints are written; backend.max_restarts > 0 or "
                         "intra_group = \"server\" keep training through failures)")
