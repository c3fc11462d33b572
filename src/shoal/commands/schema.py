"""`shoal schema`: the config's JSON schema, for editors (completion and checks in TOML files)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from shoal.commands.common import user_errors_exit_2
from shoal.errors import ConfigError

#: the schema as shipped inside the package (``make docs`` writes it; a test keeps it current)
PACKAGED = Path(__file__).resolve().parents[1] / "config" / "shoal.schema.json"


@user_errors_exit_2
def schema(
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write it to this file instead of stdout.")] = None,
    path: Annotated[bool, typer.Option("--path", help="Print where the installed package keeps its copy.")] = False,
) -> None:
    """Print the config's JSON schema; a first line `#:schema FILE` in a config gives editors completion."""
    if path:
        typer.echo(str(PACKAGED))
        return
    from shoal.config.files import json_schema

    text = json_schema()
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot write here ({err.strerror or type(err).__name__})") from None
    typer.echo(f"schema: {out}; start a config with the line #:schema {out.resolve()}", err=True)
