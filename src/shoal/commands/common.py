"""What every command shares: bad input as exit code 2, and how tables print numbers."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer

if TYPE_CHECKING:
    from rich.console import Console

from shoal.errors import ConfigDeprecation, ConfigError

F = TypeVar("F", bound=Callable[..., Any])

#: ``shoal --debug``: print the full traceback behind an error line (a plug-in's own, or an internal error's)
DEBUG = {"on": False}


def print_traceback(err: BaseException | None) -> None:
    """With ``--debug``, the traceback of ``err`` on stderr (nothing without the flag or an exception)."""
    if DEBUG["on"] and err is not None:
        import traceback

        typer.echo("".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip(), err=True)


def user_errors_exit_2(func: F) -> F:
    """Turn a ConfigError (bad user input) into one line on stderr and exit code 2; deprecations into one line each."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("always", ConfigDeprecation)
            warnings.showwarning = _deprecation_lines(warnings.showwarning)
            try:
                return func(*args, **kwargs)
            except ConfigError as err:
                print_traceback(err.__context__)  # a plug-in's own exception behind the line
                typer.echo(f"error: {err}", err=True)
                raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def backend_override(backend: str | None) -> list[str]:
    """``--backend NAME`` as the override it stands for; a name that is no backend is one line here, not a
    schema error blamed on ``--set``."""
    if backend is None:
        return []
    if backend not in ("sim", "ray"):
        from shoal.config.base import did_you_mean

        raise ConfigError(f"--backend {backend!r}: use sim or ray{did_you_mean(backend, ('sim', 'ray'))}")
    return [f"backend.name={backend}"]


def _deprecation_lines(show: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints each config deprecation once, as ``warning: ...``, and leaves the rest to ``show``."""
    said: set[str] = set()

    def show_once(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if not issubclass(category, ConfigDeprecation):
            show(message, category, *args, **kwargs)
        elif str(message) not in said:
            said.add(str(message))
            typer.echo(f"warning: {message}", err=True)

    return show_once


def fmt_number(x: float | None, digits: int = 2) -> str:
    """A table cell: ``-`` for a missing value or NaN, ``inf`` for infinity."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if math.isinf(x) else f"{x:.{digits}f}"


def table_console() -> "Console":
    """The terminal, or a 200-column console when output is piped or logged (one line per row, whatever the width)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 200))
