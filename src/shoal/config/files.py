"""Reading and writing configs: TOML files, ``--set`` overrides, one-line errors, the resolved config.toml."""

from __future__ import annotations

import difflib
import json
import tomllib
from pathlib import Path
from typing import Any

import tomlkit
from pydantic import BaseModel, ValidationError

from shoal.config.base import did_you_mean
from shoal.config.schema import Config
from shoal.errors import ConfigError
from shoal.registry import PLUGIN_PREFIX


def _format_error(err: ValidationError, source: str, overridden: dict[str, str] | None = None) -> str:
    """One line: the first problem, with its dotted key (union members merged, a "did you mean" for typos), blamed
    on where an override of that key came from (``overridden``: dotted key -> "--set", or "" where the caller's
    own prefix says it), else on ``source``."""
    errors = err.errors()
    first = errors[0]
    loc = [str(p) for p in first["loc"]]
    field_loc, tags = _split_union_tags(loc)
    same_field = [e for e in errors if _split_union_tags([str(p) for p in e["loc"]])[0] == field_loc]
    key = ".".join(field_loc)
    if tags:  # a value that fits none of a union's members: say what each expects, once
        accepted = " or ".join(dict.fromkeys(
            _plain(e["msg"]).removeprefix("Input should be ").split(",")[0] for e in same_field))
        msg = f"{first['input']!r} is not valid: expected {accepted}"
        rest = len(errors) - len(same_field)
    else:
        msg, rest = _plain(first["msg"]), len(errors) - 1
    if first["type"] == "extra_forbidden":
        msg = "unknown key" + _did_you_mean(field_loc)
    elif first["type"] == "model_type":
        msg = f"expected a [{key}] table, got {first['input']!r}"
    elif first["type"] == "finite_number":
        msg = f"must be a finite number, got {first['input']!r}"
    elif first["type"] == "literal_error":
        msg += did_you_mean(first["input"], [e.strip(" '\"") for e in str(first["ctx"]["expected"]).replace(
            " or ", ",").split(",")])
    more = f" (and {rest} more)" if rest > 0 else ""
    # a check across sections names its key at the start of its message ("sync.balance: ...")
    head = msg.split(":", 1)[0]
    named = key or (head if ":" in msg and " " not in head else "")
    origins = overridden or {}
    writers = [where for k, where in origins.items()
               if named and (named == k or named.startswith(f"{k}.") or k.startswith(f"{named}."))]
    if writers:
        source = writers[-1]  # the last override of a key is the one that holds
    elif not key and (labels := list(dict.fromkeys(w for w in origins.values() if w))):
        source = f"{source} with {' and '.join(labels)}"  # the file's values together with the overrides
    prefix = f"{source}: " if source else ""
    return f"{prefix}{key}: {msg}{more}" if key else f"{prefix}{msg}{more}"


def _plain(msg: str) -> str:
    return msg.removeprefix("Value error, ")


def _split_union_tags(loc: list[str]) -> tuple[list[str], list[str]]:
    """pydantic appends the union member it tried (``int``, ``literal['auto']``) to an error's location."""
    for i in range(1, len(loc)):
        if _is_tag(loc[i]):
            return loc[:i], loc[i:]
    return loc, []


def _section_model(path: list[str]) -> Any:
    """The pydantic model of the section at ``path`` (None: a value, or a free table such as model.options)."""
    model: Any = Config
    for part in path:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        annotation = fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


Bound = tuple[float, bool]  # a limit of a numeric key, and whether the limit itself is allowed


def key_bounds(key: str) -> tuple[Bound | None, Bound | None]:
    """The range a numeric config key allows, from its field's constraints: ``sync.gssp.group_threshold`` ->
    ``((0, False), (1, True))`` (above 0, at most 1); None for a side without a limit (or an unknown key)."""
    path = key.split(".")
    model = _section_model(path[:-1])
    field = model.model_fields.get(path[-1]) if model is not None else None
    low = high = None
    for rule in field.metadata if field is not None else []:
        if getattr(rule, "gt", None) is not None:
            low = (rule.gt, False)
        elif getattr(rule, "ge", None) is not None:
            low = (rule.ge, True)
        elif getattr(rule, "lt", None) is not None:
            high = (rule.lt, False)
        elif getattr(rule, "le", None) is not None:
            high = (rule.le, True)
    return low, high


def _is_tag(part: str) -> bool:
    return part in {"int", "float", "str", "bool"} or part.startswith(("literal[", "list[", "function-"))


def _did_you_mean(loc: list[str]) -> str:
    """`` (did you mean 'workers'?)`` for a key one typo away from a known one, else nothing."""
    model = _section_model(loc[:-1])
    fields = dict(getattr(model, "model_fields", {})) if model is not None else {}
    known = {name: name for name in fields}
    for section, field in fields.items():  # a key of a subsection too: sync.stalenes -> ssp.staleness
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            for name in sub.model_fields:
                known.setdefault(name, f"{section}.{name}")
    close = difflib.get_close_matches(loc[-1], list(known), n=1, cutoff=0.7) if loc else []
    return f" (did you mean {known[close[0]]!r}?)" if close else ""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``section.key=value``; the value is read as TOML, else taken as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError as err:
        if raw.strip()[:1] in ("[", "{", '"', "'"):  # meant as an array, a table or a quoted string
            raise ConfigError(f"--set {text!r}: the value is not valid TOML ({err})") from None
        value = raw.strip()
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``--set`` override written in."""
    data = json.loads(json.dumps(data))
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for depth, part in enumerate(path[:-1]):
            prefix = path[: depth + 1]
            child = node.setdefault(part, {})
            if not isinstance(child, dict) or (_is_value(prefix) and depth + 1 < len(path)):
                raise ConfigError(f"--set {text!r}: {'.'.join(prefix)} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def _is_value(path: list[str]) -> bool:
    """Whether ``path`` names a typed field that is not a section (``run.seed``; not ``model.options``)."""
    parent = _section_model(path[:-1])
    if parent is None or path[-1] not in parent.model_fields:
        return False
    annotation = parent.model_fields[path[-1]].annotation
    is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return not is_section and getattr(annotation, "__origin__", None) is not dict


def build_config(data: dict[str, Any], source: str = "config", overridden: dict[str, str] | None = None) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_error(err, source, overridden)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None,
                origins: dict[str, str] | None = None) -> Config:
    """Read a TOML file (or the defaults when ``path`` is None) and apply overrides. An error blames an
    override's key on ``--set``, or on ``origins[key]`` where the caller knows better ("" for no label)."""
    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        path = Path(path)
        source = str(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: not valid TOML: {err}") from None
        data = anchor_plugin_files(data, path.parent)
    overridden = {key: "--set" for key in override_keys(overrides or [])} | (origins or {})
    return build_config(apply_overrides(data, overrides or []), source, overridden)


def override_keys(overrides: list[str]) -> list[str]:
    """The dotted key each ``key=value`` override writes."""
    return [".".join(parse_override(o)[0]) for o in overrides]


def anchor_plugin_files(value: Any, folder: Path) -> Any:
    """Every ``python:FILE.py:NAME`` spec of a config file with a relative FILE, made relative to the file's
    ``folder``: a config and its plug-ins move together, whatever the working directory (``--set`` values stay
    relative to the working directory)."""
    if isinstance(value, dict):
        return {k: anchor_plugin_files(v, folder) for k, v in value.items()}
    if isinstance(value, list):
        return [anchor_plugin_files(v, folder) for v in value]
    if isinstance(value, str) and value.startswith(PLUGIN_PREFIX):
        target, sep, name = value[len(PLUGIN_PREFIX):].rpartition(":")
        if sep and target.endswith(".py") and not Path(target).expanduser().is_absolute():
            return f"{PLUGIN_PREFIX}{(folder / target).resolve()}:{name}"
    return value


def to_toml(cfg: Config) -> str:
    """Write a resolved config as TOML (tomlkit: inline arrays, one table per section and subsection)."""
    return tomlkit.dumps(_without_none(cfg.model_dump()))


def toml_value(value: Any) -> str:
    """One value in TOML syntax, tables inline (``--set`` overrides, the docs' default column)."""
    return tomlkit.item(_inline(_without_none(value))).as_string()


def _without_none(value: Any) -> Any:
    """TOML has no null: a key whose value is None is left out (reading it back gives the default, None)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def _inline(value: Any) -> Any:
    if isinstance(value, dict):
        table = tomlkit.inline_table()
        table.update({k: _inline(v) for k, v in value.items()})
        return table
    if isinstance(value, list):
        array = tomlkit.array()
        array.extend(_inline(v) for v in value)
        return array
    return value


def json_schema() -> str:
    """The config's JSON schema (pydantic's), for TOML editors: `#:schema` (Taplo / Even Better TOML)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **Config.model_json_schema()}
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"
