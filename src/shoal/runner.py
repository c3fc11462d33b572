"""One training run end to end: resolve, build, run a backend, write the outputs.

Everything that can reject the input (config, data files, cluster) runs
before the output folder is touched, so a rejected run writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shoal.config import Config, ConfigError, to_toml
from shoal.engine.metrics import RunRecorder, write_json_atomic
from shoal.engine.setup import RunSetup, build_setup

RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse to write over an earlier run unless asked to."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder")
    if not overwrite and any((out / name).exists() for name in RUN_FILES):
        raise ConfigError(f"--out {out}: already holds a run; choose another folder or pass --overwrite")


def run_backend(setup: RunSetup, recorder: RunRecorder, progress: Any = None) -> dict[str, Any]:
    """Drive the configured backend to the end of the run."""
    from shoal.backends.sim import SimBackend

    return SimBackend(setup, recorder, progress).run()


def train(cfg: Config, out: Path, *, overwrite: bool = False, progress: Any = None) -> dict[str, Any]:
    """Run one training and write config.toml, metrics.jsonl and summary.json into ``out``."""
    check_out_dir(out, overwrite)
    if cfg.backend.name == "ray":
        raise ConfigError("backend.name: the ray backend is not available in this version; use sim")
    setup = build_setup(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(to_toml(cfg))
    with open(out / "metrics.jsonl", "w") as stream:
        recorder = RunRecorder(stream=stream, log_iterations=cfg.backend.log_iterations)
        summary = run_backend(setup, recorder, progress)
    if setup.compute_s_measured is not None:
        summary["compute_s_measured"] = setup.compute_s_measured
    write_json_atomic(out / "summary.json", summary)
    return summary
