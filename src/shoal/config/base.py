"""What every config section shares: the strict base model and the validators of names and lists."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from shoal.registry import Registry


def _positive_list(values: list[Any]) -> list[Any]:
    """non-empty, every value > 0"""
    if not values or any(v <= 0 for v in values):
        raise ValueError("must be a non-empty list of positive numbers")
    return values


PositiveInts = Annotated[list[int], AfterValidator(_positive_list)]
PositiveFloats = Annotated[list[float], AfterValidator(_positive_list)]


class Section(BaseModel):
    """Base for every section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _registered(registry: Registry[Any], value: str, *also: str) -> str:
    """``value`` if ``registry`` (or ``also``) knows it or it is a plug-in that meets the protocol (its file path
    made absolute), else a one-line error listing what it knows."""
    from shoal.plugins import is_plugin, resolve_spec

    if value in also or value in registry:
        return value
    if is_plugin(value):
        spec = resolve_spec(value)
        registry.plugin(spec)  # imports the user's class and checks it: a ConfigError (a ValueError) when it does not fit
        return spec
    own = " or python:FILE.py:CLASS" if registry.takes_plugins else ""
    known = (*also, *registry.names())
    raise ValueError(f"unknown {registry.kind} {value!r}{did_you_mean(value, known)}; use one of {', '.join(known)}{own}")


def did_you_mean(value: Any, known: Iterable[str]) -> str:
    """`` (did you mean 'gssp'?)`` for a value one typo away from a known one, else nothing."""
    import difflib

    close = difflib.get_close_matches(str(value), list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choices(registry: Registry[Any], *also: str, plugins: bool = False) -> Callable[[dict[str, Any]], None]:
    """JSON-schema hook: the registered names as the key's ``enum`` (read when the schema is generated); with
    ``plugins``, a ``python:`` spec is allowed beside them, so an editor does not flag a user's own class."""

    def add(schema: dict[str, Any]) -> None:
        names = [*also, *registry.names()]
        if plugins:
            schema["anyOf"] = [{"enum": names}, {"pattern": "^python:"}]
        else:
            schema["enum"] = names

    return add


def _plugin_or(builtins: tuple[str, ...], value: str, what: str) -> str:
    """A built-in name, or a python: plug-in spec with its file path made absolute."""
    from shoal.plugins import is_plugin, resolve_spec

    if value in builtins:
        return value
    if is_plugin(value):
        return resolve_spec(value)
    raise ValueError(f"unknown {what} {value!r}{did_you_mean(value, builtins)}; use one of {', '.join(builtins)} or "
                     "python:FILE.py:FUNCTION")
