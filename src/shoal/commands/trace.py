"""`shoal trace`: a run's timeline as a Chrome / Perfetto trace file."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Iterator
from typing import Annotated, Any, Optional

import typer

from shoal.commands.common import user_errors_exit_2
from shoal.errors import ConfigError

RUN_HELP = "A run folder (`shoal train --out`, or a scheme's folder of a comparison)."


@user_errors_exit_2
def trace(
    run: Annotated[Path, typer.Argument(help=RUN_HELP)],
    out: Annotated[Optional[Path], typer.Option(help="Where to write the trace; default: RUN/trace.json.")] = None,
) -> None:
    """Write a Perfetto / chrome://tracing file: one track per worker (wait, pull, compute, push) and group server."""
    from shoal.report.trace import build_trace

    doc = build_trace(read_metrics(metrics_file(run)), title=run.resolve().name,  # one streaming pass
                      stragglers=_stragglers(run))
    if not doc["otherData"]["iterations"]:
        raise ConfigError(f"{run / 'metrics.jsonl'}: no iteration records (the run had "
                          "backend.log_iterations = false); run it again with --set backend.log_iterations=true")
    target = out if out is not None else run / "trace.json"
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as err:
        raise ConfigError(f"--out {target}: cannot write here ({err.strerror or type(err).__name__})") from None
    info = doc["otherData"]
    typer.echo(f"trace: {target} ({info['iterations']} iterations of {info['workers']} workers); "
               "open it at https://ui.perfetto.dev or chrome://tracing")


def _stragglers(run: Path) -> dict[str, Any] | None:
    """summary.json's straggler analysis, when the run finished and had one (a missing or bad file: none)."""
    try:
        return json.loads((run / "summary.json").read_text()).get("stragglers")
    except (OSError, ValueError, AttributeError):
        return None


def metrics_file(run: Path) -> Path:
    """RUN/metrics.jsonl, or one clear line when there is none."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        hint = " (a comparison: pass one scheme's folder)" if (run / "compare.json").is_file() else ""
        raise ConfigError(f"{run}: no metrics.jsonl here{hint}")
    return path


def read_metrics(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a metrics.jsonl, streamed (it can hold millions of lines); one clear line for a bad one.

    A last line cut short (a run killed mid-write) is dropped: what came before it is good.
    """
    try:
        with open(path) as stream:
            pending: tuple[int, str] | None = None
            for number, line in enumerate(stream, 1):
                if pending is not None:
                    yield _record(path, *pending, last=False)
                pending = (number, line) if line.strip() else None
            if pending is not None:
                record = _record(path, *pending, last=True)
                if record is not None:
                    yield record
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({type(err).__name__})") from None


def _record(path: Path, number: int, line: str, last: bool) -> Any:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        if last:
            return None
        raise ConfigError(f"{path}:{number}: not a JSON line ({err.msg})") from None
    if not isinstance(record, dict) or "event" not in record:
        raise ConfigError(f"{path}:{number}: not a shoal metrics record (a JSON object with \"event\")")
    return record
