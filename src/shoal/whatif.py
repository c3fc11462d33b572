"""What a run would have done without its straggler: the same cluster less one worker, replayed in cost mode.

The straggler analysis (engine/stragglers.py) names the worker whose
deliveries ended most of the waiting. This module estimates what it cost:
the simulator replays the run's configuration without that worker
(``backend.mode = "cost"``: the same schedule, no model math, seconds for a
long run) until it has made the same training progress the real run made
by its time to target (or by its end), and compares the two times.

How much progress N - 1 workers make per iteration is not known in
advance, so the estimate is a range between two rules. Every gradient is
applied with weight 1/N, so if progress is per update (large batches
already average the noise away), N - 1 workers make the progress of ``k``
iterations in ``k (N - 1) / N`` of theirs (the same number of BSP rounds);
if progress is per sample (small batches, noise-dominated), they need all
``k``. Between the two, the point estimate uses the run's own gradient
noise scale B_noise (engine/noise.py, measured from each round's gradients):
rounds to a given progress scale as ``1 + B_noise / B`` with the global
batch B (McCandlish et al. 2018), so N - 1 workers need
``k (N - 1) / N * (1 + B_noise / ((N - 1) b)) / (1 + B_noise / (N b))``
iterations of batch b (measured against real runs without the worker:
benchmarks/results/straggler_estimate.md). A scheme that steps real local
models (local SGD, DiLoCo, SIM) has no cost mode to replay with; for those,
and for runs whose worker ids the config names (membership, speed changes,
a host per worker), no estimate is made.
"""

from __future__ import annotations

from typing import Any

from shoal.config import Config, build_config
from shoal.config.files import apply_overrides
from shoal.registry import SCHEMES


def cannot_replay(cfg: Config) -> str | None:
    """Why a run of ``cfg`` cannot be replayed without a worker in cost mode, or None."""
    if cfg.backend.name != "sim":
        return "only simulated runs are replayed"
    if SCHEMES[cfg.sync.scheme].local_models or cfg.compression.similarity.enabled:
        return f"{cfg.sync.scheme}{' with SIM' if cfg.compression.similarity.enabled else ''} steps real local " \
               "models, which cost mode does not simulate"
    if cfg.cluster.membership or cfg.cluster.speed_changes or cfg.network.worker_hosts:
        return "the config names workers by id (membership, speed changes or worker hosts)"
    if cfg.sync.balance != "none":
        return "balanced work is sized from measured speeds"
    if cfg.cluster.workers < 2:
        return "a single worker has nobody to leave out"
    return None


def without_worker(cfg: Config, per_worker: list[dict[str, Any]], worker: int, iterations: int,
                   real_s: float, noise_scale: float | None = None) -> dict[str, Any]:
    """Replay ``cfg`` without ``worker`` to the progress of ``iterations`` real iterations (which the real run
    made in ``real_s``), under both rules: the record gives each rule's iterations, times and speed-ups, and,
    with the run's gradient noise scale, the point estimate between them (``estimate``)."""
    reason = cannot_replay(cfg)
    if reason is not None:
        return {"worker": worker, "skipped": reason}
    from shoal.backends.sim import SimBackend
    from shoal.engine.metrics import RunRecorder
    from shoal.engine.noise import iterations_with_fewer
    from shoal.engine.setup import build_setup

    n = len(per_worker)
    speeds = [float(w["speed"]) for w in sorted(per_worker, key=lambda w: w["id"]) if w["id"] != worker]
    per_update, per_sample = max(1, round(iterations * (n - 1) / n)), iterations
    point = None if noise_scale is None else min(per_sample, max(per_update, iterations_with_fewer(
        iterations, n, n - 1, cfg.data.batch_size, noise_scale)))
    overrides = [f"cluster.workers={n - 1}", f"cluster.speeds={speeds}", "backend.mode=cost",
                 f"run.max_iterations={per_sample}", "run.stop_at_target=false",
                 f"run.max_time_s={max(cfg.run.max_time_s, real_s) * 100}", "backend.log_iterations=false",
                 "backend.sim_checkpoint_every_s=0"]
    reduced = build_config(apply_overrides(cfg.model_dump(mode="json"), overrides), "the replay without a worker")
    marks = sorted({per_update} | ({point} if point is not None else set()))
    reached: dict[int, float] = {}  # the virtual time the replay made each marked number of iterations

    def watch(kind: str, fields: dict[str, Any]) -> None:
        if kind == "iteration":
            for mark in marks:
                if mark not in reached and recorder.iterations >= mark:
                    reached[mark] = float(fields["t"])

    recorder = RunRecorder(log_iterations=False, listener=watch)
    backend = SimBackend(build_setup(reduced), recorder)
    backend.run()
    end = float(backend.env.now)
    reached[per_sample] = end

    def at(mark: int) -> float:
        return round(reached.get(mark, end), 6)

    times = [at(per_update), at(per_sample)]
    record = {"worker": worker, "iterations": [per_update, per_sample], "time_s": times,
              "real_time_s": round(real_s, 6), "speedup": [speedup(real_s, t) for t in reversed(times)]}
    if point is not None:
        record["estimate"] = {"noise_scale": noise_scale, "iterations": point, "time_s": at(point),
                              "speedup": speedup(real_s, at(point))}
    return record


def speedup(real_s: float, replay_s: float) -> float | None:
    return round(real_s / replay_s, 4) if replay_s > 0 else None


def sentence(estimate: dict[str, Any], unit: str = "virtual s") -> str:
    """The verdict's second half: what leaving the worker out would have saved (a range, see the module)."""
    if "skipped" in estimate:
        return f"no estimate without it ({estimate['skipped']})"
    (fast, slow), (low, high) = estimate["time_s"], estimate["speedup"]
    how = "" if low is None or high is None else f", {low:.2g}-{high:.2g}x sooner"
    said = (f"without it the same progress would take ~{fast:.3g}-{slow:.3g} {unit} instead of "
            f"{estimate['real_time_s']:.3g}{how} (a cost-only replay: per update - per sample)")
    point = estimate.get("estimate")
    if point is None or point["speedup"] is None:
        return said
    return (f"{said}; by the run's gradient noise scale ({point['noise_scale']:.3g} samples), ~{point['time_s']:.3g} "
            f"{unit}, {point['speedup']:.2g}x sooner")
