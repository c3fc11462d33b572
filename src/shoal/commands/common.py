"""What every command shares: turning bad input into exit code 2."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from shoal.config import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors_exit_2(func: F) -> F:
    """Turn a ConfigError (bad user input) into one line on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
