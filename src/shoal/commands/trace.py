"""`shoal trace`: a run's timeline as a Chrome / Perfetto trace file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from shoal.commands.common import user_errors_exit_2
from shoal.config import ConfigError

RUN_HELP = "A run folder (`shoal train --out`, or a scheme's folder of a comparison)."


@user_errors_exit_2
def trace(
    run: Annotated[Path, typer.Argument(help=RUN_HELP)],
    out: Annotated[Optional[Path], typer.Option(help="Where to write the trace; default: RUN/trace.json.")] = None,
) -> None:
    """Write a Perfetto / chrome://tracing file: one track per worker (wait, pull, compute, push) and group server."""
    from shoal.report.trace import build_trace

    records = read_metrics(run)
    if not any(r.get("event") == "iteration" for r in records):
        raise ConfigError(f"{run / 'metrics.jsonl'}: no iteration records (the run had "
                          "backend.log_iterations = false); run it again with --set backend.log_iterations=true")
    target = out if out is not None else run / "trace.json"
    doc = build_trace(records, title=run.resolve().name)
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as err:
        raise ConfigError(f"--out {target}: cannot write here ({err.strerror or type(err).__name__})") from None
    info = doc["otherData"]
    typer.echo(f"trace: {target} ({info['iterations']} iterations of {info['workers']} workers); "
               "open it at https://ui.perfetto.dev or chrome://tracing")


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl; one clear line if it is missing or not shoal's JSON lines."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        hint = " (a comparison: pass one scheme's folder)" if (run / "compare.json").is_file() else ""
        raise ConfigError(f"{run}: no metrics.jsonl here{hint}")
    records = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({type(err).__name__})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):  # a run killed mid-write leaves a partial last line: the rest is good
                break
            raise ConfigError(f"{path}:{number}: not a JSON line ({err.msg})") from None
        if not isinstance(record, dict) or "event" not in record:
            raise ConfigError(f"{path}:{number}: not a shoal metrics record (a JSON object with \"event\")")
        records.append(record)
    return records
