"""One training run end to end: resolve, build, run a backend, write the outputs.

Everything that can reject the input (config, data files, cluster) runs
before the output folder is touched, so a rejected run writes nothing.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

from shoal.config import Config, OptimizerConfig, to_toml
from shoal.errors import ConfigError
from shoal.engine.metrics import RunRecorder, write_json_atomic
from shoal.errors import InternalError
from shoal.engine.setup import RunSetup, build_setup
from shoal.strategy import Strategy
from shoal.sync.localsgd import PeriodicSchedule

RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "model.safetensors")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse to write over an earlier run unless asked to."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if (out / "compare.json").exists():  # --overwrite or not: a run's files would mix with a comparison's
        raise ConfigError(f"--out {out}: holds a comparison (compare.json); a run needs a folder of its own")
    if not overwrite and any((out / name).exists() for name in RUN_FILES):
        raise ConfigError(f"--out {out}: already holds a run; choose another folder or pass --overwrite")


def make_out_dir(out: Path) -> list[Path]:
    """Create ``out`` and its missing parents; return the folders created, deepest first.

    A path that cannot be written (``/proc/...``, below a file, no
    permission) is bad input: one line, and nothing is left behind.
    """
    missing, node = [], out
    while not node.exists() and node != node.parent:
        missing.append(node)
        node = node.parent
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".shoal-write-check"
        probe.touch()
        probe.unlink()
    except OSError as err:
        remove_dirs(missing)
        raise ConfigError(f"--out {out}: cannot write there ({err.strerror or err})") from None
    return missing


def remove_dirs(folders: list[Path]) -> None:
    """Remove folders this run created (deepest first), if they are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass


def run_backend(setup: RunSetup, recorder: RunRecorder, progress: Any = None, *, out: Path | None = None,
                resume: Path | None = None) -> dict[str, Any]:
    """Build the run's Strategy once and let the configured backend drive it to the end (``out``: where the ray
    backend checkpoints)."""
    strategy = Strategy.from_config(setup.cfg, setup.engine.layout)
    if setup.cfg.backend.name == "ray":
        from shoal.backends.ray import RayBackend

        return RayBackend(setup, recorder, progress, out=out, resume=resume, strategy=strategy).run()
    from shoal.backends.sim import SimBackend

    return SimBackend(setup, recorder, progress, strategy=strategy, out=out, resume=resume).run()


def _both(first: Callable[[str, dict[str, Any]], None] | None,
          second: Callable[[str, dict[str, Any]], None]) -> Callable[[str, dict[str, Any]], None]:
    """One event listener that calls ``first`` (if any), then ``second``."""
    def listen(kind: str, fields: dict[str, Any]) -> None:
        if first is not None:
            first(kind, fields)
        second(kind, fields)

    return listen


def dry_run(cfg: Config) -> list[str]:
    """What a run of ``cfg`` would do, without training or writing: the data and model built, the cluster, and the
    Strategy's answers (``shoal train --dry-run``)."""
    if cfg.backend.name == "ray":
        from shoal.backends.ray.session import validate

        validate(cfg)
    setup = build_setup(cfg)
    strategy = Strategy.from_config(cfg, setup.engine.layout)
    ds, speeds, sync = setup.dataset, setup.profile.speeds, cfg.sync
    shown = ", ".join(f"{s:g}" for s in speeds) if len(speeds) <= 16 else f"{min(speeds):g} .. {max(speeds):g}"
    target = cfg.target()
    lines = [
        f"backend: {cfg.backend.name} ({cfg.backend.mode} mode)",
        f"model: {cfg.model.name}, {setup.engine.num_params:,} parameters",
        f"data: {cfg.data.name}, {setup.n_train:,} training and {len(ds.y_test):,} test samples, partition "
        f"{cfg.data.partition}, batch {cfg.data.batch_size} per worker",
        f"cluster: {len(speeds)} workers, slowdowns {shown}; {setup.profile.compute_s:g} s per batch on the fastest",
        f"scheme: {sync.scheme} ({sync.intra_group} path)" + ("; groups formed once workers are profiled"
                                                            if strategy.grouped else ""),
        f"work: {'data.batch_size for every worker' if strategy.balance == 'none' else f'sync.balance = {strategy.balance!r}'}",
        f"optimizer: {_optimizer_line(cfg.optimizer)}",
        f"local models: {'yes' if strategy.local_models else 'no'}; outer step: {strategy.outer_step or 'none'}",
        f"compression: {cfg.compression.method}" + (f" at density {cfg.compression.density:g}"
                                                     if strategy.compressed else "")
        + ("; SIM on" if cfg.compression.similarity.enabled else ""),
        f"aggregation: {cfg.network.aggregation}",
        *([f"plan: {_periodic_plan(strategy, schedule, len(speeds))}"]
          if isinstance(schedule := strategy.aggregation_schedule(), PeriodicSchedule) else []),
        f"stops: {cfg.task.metric} {'target ' + format(target, 'g') if target is not None else 'without a target'}, "
        f"at most {cfg.run.max_time_s:g} s" + (f" or {cfg.run.max_iterations} iterations" if cfg.run.max_iterations
                                              else ""),
    ]
    return lines


def _optimizer_line(opt: OptimizerConfig) -> str:
    """The optimizer and the learning rate's schedule in words, e.g. ``adamw, lr 0.003 (betas 0.9, 0.95), weight
    decay 0.1 (decoupled); warm-up over 0.02 epochs from 9.38e-05, then a cosine over 0.5 epochs to 0.0003``."""
    parts = [f"{opt.name}, lr {opt.lr:g}"]
    parts[0] += f", momentum {opt.momentum:g}" if opt.name == "sgd" else f" (betas {opt.betas[0]:g}, {opt.betas[1]:g})"
    if opt.weight_decay:
        parts[0] += f", weight decay {opt.weight_decay:g}" + (" (decoupled)" if opt.name == "adamw" else " (L2)")
    if opt.clip_norm is not None:
        parts[0] += f", gradients clipped to norm {opt.clip_norm:g}"
    schedule = []
    if opt.warmup_epochs:
        schedule.append(f"warm-up over {opt.warmup_epochs:g} epochs from {opt.lr_at(0.0):.3g}")
    if opt.cosine_epochs:
        schedule.append(f"a cosine over {opt.cosine_epochs:g} epochs to {opt.lr * opt.lr_decay_factor:.3g}")
    if opt.lr_decay_epochs:
        epochs = ", ".join(f"{e:g}" for e in opt.lr_decay_epochs)
        schedule.append(f"x{opt.lr_decay_factor:g} at epochs {epochs}")
    return "; ".join([parts[0], ", then ".join(schedule) or "a constant rate"])


def _periodic_plan(strategy: Strategy, schedule: PeriodicSchedule, workers: int) -> str:
    """Local SGD's (DiLoCo's) plan in one line, with the periods the server's policy decides (AdaComm's shrink)."""
    if strategy.balance == "steps":
        values = sum(s.numel for s in strategy.layout)
        return (f"every tensor ({values:,} values) averaged after each worker's own local steps "
                f"({strategy.scheme.local_steps(strategy.cfg.sync)} x {workers} a period in all, split by speed)")
    schedule.follow(strategy.policy(range(workers)))
    return schedule.describe([s.numel for s in strategy.layout])


def _check_inputs(cfg: Config, out: Path, overwrite: bool, resume: Path | None) -> bool:
    """Everything that can reject the run; True when a resume continues in its own folder."""
    in_place = resume is not None and out.resolve() == resume.resolve()
    if not in_place:
        check_out_dir(out, overwrite)
    if cfg.backend.name == "ray":
        from shoal.backends.ray.session import validate

        validate(cfg)
    if cfg.run.tensorboard:
        from shoal.engine.tensorboard import check_available

        check_available()
    if resume is not None and cfg.backend.name == "ray":
        from shoal.backends.ray.session import check_resume

        check_resume(cfg, resume)
    elif resume is not None:
        from shoal.backends.sim.checkpoints import check_resume as check_sim_resume

        check_sim_resume(cfg, resume)
    return in_place


def _tensorboard(cfg: Config, out: Path, recorder: RunRecorder) -> Any:
    """With ``run.tensorboard``, scalars in OUT/tensorboard fed by every event the recorder sees."""
    if not cfg.run.tensorboard:
        return None
    from shoal.engine.tensorboard import TensorBoardScalars

    recorder.listener = TensorBoardScalars(out / "tensorboard")
    return recorder.listener


def straggler_summary(metrics: Path, workers: int, resumed: bool = False) -> dict[str, Any]:
    """Who held back whom in the run's iteration events (shoal.engine.stragglers), read back from metrics.jsonl.

    A resumed run's file also holds the iterations simulated after its
    checkpoint before the cut; the resume simulated them again, so an
    iteration later than a following resume's time is left out.
    """
    import bisect
    import itertools
    import json

    from shoal.engine.stragglers import analyse

    resumes = []
    if resumed:  # only a resumed run's file holds resume marks: any other is read once
        with open(metrics) as lines:
            resumes = [(i, json.loads(line)["t"]) for i, line in enumerate(lines)
                       if line.startswith('{"event": "resume"')]
    positions = [i for i, _ in resumes]
    later = list(itertools.accumulate(reversed([t for _, t in resumes]), min))[::-1]  # earliest of resumes k..

    def kept() -> Iterator[dict[str, Any]]:
        with open(metrics) as lines:
            for i, line in enumerate(lines):
                if line.startswith('{"event": "iteration"'):
                    event = json.loads(line)
                    k = bisect.bisect_right(positions, i)  # the first resume after this line
                    if k == len(positions) or event["t"] <= later[k]:
                        yield event

    return analyse(kept(), workers).to_dict("virtual s")


def _estimate_without_culprit(cfg: Config, summary: dict[str, Any], recorder: RunRecorder) -> None:
    """Add what leaving the straggler out would have saved (shoal.whatif) to the summary and its verdict."""
    from shoal.whatif import sentence, without_worker

    stragglers = summary["stragglers"]
    reached = recorder.time_to_target_s is not None
    iterations = recorder.iterations_to_target if reached else recorder.iterations
    real_s = recorder.time_to_target_s if reached else summary["elapsed_s"]
    if not iterations or not real_s:
        return
    estimate = without_worker(cfg, summary["per_worker"], stragglers["culprit"], iterations, real_s,
                              summary.get("gradient_noise_scale"))
    estimate["to"] = "target" if reached else "end"
    stragglers["without_culprit"] = estimate
    stragglers["verdict"] += "; " + sentence(estimate)


def git(*args: str) -> str | None:
    """``git ARGS`` in the checkout shoal runs from ("" if git fails); None outside one (an installed wheel)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # no git on this machine, or it hung: nothing to say
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def code_version() -> dict[str, Any]:
    """The code that made a run: shoal's version and, in a git checkout, its commit and whether src/ had
    uncommitted changes (a run kept for later, such as a study's, then says which code it came from)."""
    from shoal import __version__

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"version": __version__}
    return {"version": __version__, "commit": commit or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "src"))}


@functools.cache
def cpu_model() -> str:
    """The processor's model name.

    Training on real gradients is chaotic: last-bit differences between CPU
    kernels grow into different trajectories, so a sim run repeats exactly
    only on the same kind of CPU (docs/fair-comparison.md).
    """
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, str]:
    """What computed a run: the CPU's model and torch's version, the two things a rerun must share to repeat it
    bit for bit (a study that spans sessions may run on several machines)."""
    import torch

    return {"cpu": cpu_model(), "torch": torch.__version__}


def train(cfg: Config, out: Path, *, overwrite: bool = False, progress: Any = None,
          resume: Path | None = None, on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run one training and write config.toml, metrics.jsonl and summary.json into ``out``.

    With ``resume`` (a run folder with checkpoints, ray or sim) training
    continues from its last checkpoint; resuming into the same folder appends
    to its metrics.jsonl. ``on_event(kind, fields)`` sees every event as it is
    recorded (the Python API's callbacks).
    """
    in_place = _check_inputs(cfg, out, overwrite, resume)
    created = make_out_dir(out)
    try:
        setup = build_setup(cfg)
    except ConfigError:
        remove_dirs(created)  # a run rejected before it starts writes nothing
        raise
    (out / "config.toml").write_text(to_toml(cfg))
    with open(out / "metrics.jsonl", "a" if in_place else "w") as stream:
        recorder = RunRecorder(stream=stream, log_iterations=cfg.backend.log_iterations, metric=cfg.task.metric,
                               higher_is_better=cfg.task.higher)
        scalars = _tensorboard(cfg, out, recorder)
        if on_event is not None:
            recorder.listener = _both(recorder.listener, on_event)
        try:
            summary = run_backend(setup, recorder, progress, out=out, resume=resume)
        except ConfigError:  # rejected while starting (e.g. the Ray cluster is too small): leave nothing behind
            if not in_place:
                stream.close()
                for name in ("config.toml", "metrics.jsonl"):
                    (out / name).unlink(missing_ok=True)
                if scalars is not None:
                    shutil.rmtree(out / "tensorboard", ignore_errors=True)  # the writer is closed below
                remove_dirs(created)
            raise
        finally:
            if scalars is not None:
                scalars.close()
    summary.update(recorder.metric_fields(cfg.target()))
    summary["data_path"] = cfg.data_path()
    summary["code"] = code_version()
    summary["machine"] = machine()
    if setup.streams:
        summary["data_partition"] = setup.partition_summary()
    if setup.compute_s_measured is not None:
        summary["compute_s_measured"] = setup.compute_s_measured
    exact_times = cfg.backend.name == "sim" and cfg.backend.log_iterations  # ray's wall times match no delivery
    summary["stragglers"] = (straggler_summary(out / "metrics.jsonl", cfg.cluster.workers, resume is not None)
                             if exact_times else None)
    if summary["stragglers"] and summary["stragglers"]["culprit"] is not None and summary["stop_reason"] != "diverged":
        _estimate_without_culprit(cfg, summary, recorder)
    from shoal.engine.export import save_model

    summary["model_file"] = "model.safetensors" if save_model(setup, out) else None
    write_json_atomic(out / "summary.json", summary)
    if summary["stop_reason"] == "internal_error":  # written first: what was trained is kept
        raise InternalError(f"the run stopped on an internal error ({summary['error']}); summary.json and "
                            f"metrics.jsonl (with the traceback) are in {out}", recorder.traceback)
    return summary
