"""Generate docs/configuration.md from the pydantic schema in shoal.config.

The reference is rendered from the models themselves (field types,
defaults, numeric bounds, allowed values, ``Field(description=...)`` and
each validator's docstring, which says in words what it checks; no source
text is read), so it cannot drift from the code: a new key or
section appears on the next regeneration, and ``tests/test_docs.py`` fails
until the file is regenerated.

    python -m shoal.docgen > docs/configuration.md     # print the reference
    python -m shoal.docgen --out docs/configuration.md # write it
    python -m shoal.docgen --check                     # exit 1 if the file is stale
    python -m shoal.docgen --schema docs/shoal.schema.json  # the JSON schema, for editor completion
"""

from __future__ import annotations

import argparse
import inspect
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from shoal.config import Config, toml_value
from shoal.config.files import json_schema as config_json_schema
from shoal.registry import COMPRESSORS, DATA_FORMATS, DATASETS, MODELS, PLANNERS, SCHEMES

DEFAULT_PATH = Path("docs/configuration.md")
REGENERATE = "make docs  (or: .venv/bin/python -m shoal.docgen --out docs/configuration.md)"

# Validators of a registered name (the allowed column lists the registry's names, from the key's JSON-schema enum).
LISTED_BY_ENUM = {"_known_scheme", "_known_compressor", "_known_planner", "_known_model"}


@dataclass
class Key:
    """One documented key."""

    dotted: str
    type: str
    default: str
    allowed: str
    description: str


@dataclass
class Table:
    """One TOML table (a section, a nested section, or the entries of an array of tables)."""

    name: str  # dotted path, e.g. "cluster.stragglers" or, with array=True, "cluster.speed_changes"
    model: type[BaseModel]
    keys: list[Key]
    checks: list[str]
    array: bool = False


# -- walking the schema ------------------------------------------------------------


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """Remove Annotated wrappers, returning the bare type and the collected metadata."""
    meta: list[Any] = []
    while typing.get_origin(tp) is Annotated:
        args = typing.get_args(tp)
        tp, meta = args[0], meta + list(args[1:])
    return tp, meta


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _array_item_section(tp: Any) -> type[BaseModel] | None:
    """The model of an array of tables (``list[SomeSection]``), else None."""
    tp, _ = _strip(tp)
    args = _union_args(tp)
    if args is not None:
        found = [a for a in (_array_item_section(x) for x in args) if a is not None]
        return found[0] if found else None
    if typing.get_origin(tp) in (list, tuple, set, frozenset):
        inner = [_strip(a)[0] for a in typing.get_args(tp) if a is not Ellipsis]
        if len(inner) == 1 and _is_section(inner[0]):
            return inner[0]
    return None


def _nested_section(field: FieldInfo) -> type[BaseModel] | None:
    tp, _ = _strip(field.annotation)
    args = _union_args(tp)
    if args is not None:
        sections = [a for a in args if _is_section(_strip(a)[0])]
        return _strip(sections[0])[0] if len(sections) == 1 and len(args) <= 2 else None
    return tp if _is_section(tp) else None


def _tables(prefix: str, model: type[BaseModel], array: bool = False) -> Iterator[Table]:
    keys: list[Key] = []
    children: list[Iterator[Table]] = []
    key_prefix = prefix + ("[]" if array else "")
    for name, field in model.model_fields.items():
        dotted = f"{key_prefix}.{name}"
        section = _nested_section(field)
        if section is not None:
            children.append(_tables(f"{prefix}.{name}", section))
            continue
        keys.append(_key(dotted, field, _validators_of(model, name)))
        item = _array_item_section(field.annotation)
        if item is not None:
            children.append(_tables(f"{prefix}.{name}", item, array=True))
    yield Table(prefix, model, keys, _model_checks(model), array)
    for child in children:
        yield from child


def _key(dotted: str, field: FieldInfo, validators: list[Any]) -> Key:
    tp, meta = _strip(field.annotation)
    allowed = _registered(field) + _allowed(tp, meta + list(field.metadata))
    allowed += [t for t in (_validator_text(fn) for fn in validators) if t not in allowed]
    return Key(
        dotted=dotted,
        type=_type_name(tp),
        default=_default(field),
        allowed="; ".join(a for a in allowed if a),
        description=" ".join((field.description or "").split()),
    )


def _registered(field: FieldInfo) -> list[str]:
    """``one of ...`` for a key whose names come from a registry (its JSON-schema hook sets ``enum``)."""
    extra: dict[str, Any] = {}
    if callable(field.json_schema_extra):
        field.json_schema_extra(extra)
    if "anyOf" in extra:  # registered names or a python: plug-in
        return ["one of " + ", ".join(_toml(v) for v in extra["anyOf"][0]["enum"]) + ", or a python: plug-in"]
    return ["one of " + ", ".join(_toml(v) for v in extra["enum"])] if "enum" in extra else []


def _model_checks(model: type[BaseModel]) -> list[str]:
    decorators = model.__pydantic_decorators__
    return [text for d in decorators.model_validators.values() for text in _validator_texts(d.func)]


def _validator_text(func: Any) -> str:
    return "; ".join(_validator_texts(func))


def _validator_texts(func: Any) -> list[str]:
    """What a validator checks, in the words of its docstring: its "- " lines, else its first line.

    Every validator of the schema says in words what it checks; one without a
    docstring is a bug this generator reports (the docs test runs it).
    """
    func = getattr(func, "__func__", func)
    name = getattr(func, "__name__", repr(func))
    if name in LISTED_BY_ENUM:
        return []
    doc = inspect.getdoc(func) or ""
    bullets = [line[2:].rstrip(".") for line in doc.splitlines() if line.startswith("- ")]
    if bullets:
        return bullets
    if not doc:
        raise ValueError(f"validator {name} has no docstring: say in words what it checks (docs/configuration.md shows it)")
    return [doc.splitlines()[0].rstrip(".")]


# -- rendering types, defaults and constraints ----------------------------------------


def _type_name(tp: Any) -> str:
    tp, _ = _strip(tp)
    args = _union_args(tp)
    if args is not None:
        # A literal beside other types names its values: int | Literal["auto"] -> integer or "auto".
        names = [
            " or ".join(_toml(v) for v in typing.get_args(_strip(a)[0]))
            if typing.get_origin(_strip(a)[0]) is Literal else _type_name(a)
            for a in args if a is not type(None)
        ]
        return " or ".join(dict.fromkeys(names))
    origin = typing.get_origin(tp)
    if origin is Literal:
        kinds = list(dict.fromkeys(_type_name(type(v)) for v in typing.get_args(tp)))
        return " or ".join(kinds)
    if origin in (list, tuple, set, frozenset):
        inner = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(inner) == 1:
            item = _strip(inner[0])[0]
            return "array of tables" if _is_section(item) else f"array of {_type_name(item)}"
        return "array"
    if origin is dict:
        args = typing.get_args(tp)
        return f"table of {_type_name(args[1])}" if len(args) == 2 else "table"
    if tp is bool:
        return "boolean"
    if tp is int:
        return "integer"
    if tp is float:
        return "float"
    if tp is str:
        return "string"
    if isinstance(tp, type) and issubclass(tp, Path):
        return "string (path)"
    if _is_section(tp):
        return "table"
    return getattr(tp, "__name__", str(tp))


def _toml(value: Any) -> str:
    """A default or allowed value as it would be written in TOML ("not set" for None)."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if value is None:
        return "not set"
    try:
        return toml_value(_plain(value))
    except TypeError:
        return str(value)


def _plain(value: Any) -> Any:
    """Paths as strings and tuples as lists, so the config's TOML writer takes them."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            return _toml(field.default_factory())  # type: ignore[call-arg]
        except TypeError:
            return "computed"
    if field.default is PydanticUndefined:
        return "required"
    return _toml(field.default)


def _allowed(tp: Any, meta: list[Any]) -> list[str]:
    out: list[str] = []
    bare = _strip(tp)[0]
    literals = list(typing.get_args(bare)) if typing.get_origin(bare) is Literal else []
    if literals:
        out.append("one of " + ", ".join(_toml(v) for v in literals))
    bounds = []
    lengths = [m for m in meta if isinstance(m, (annotated_types.MinLen, annotated_types.MaxLen))]
    for m in meta:
        if isinstance(m, annotated_types.Gt):
            bounds.append(f"> {m.gt}")
        elif isinstance(m, annotated_types.Ge):
            bounds.append(f">= {m.ge}")
        elif isinstance(m, annotated_types.Lt):
            bounds.append(f"< {m.lt}")
        elif isinstance(m, annotated_types.Le):
            bounds.append(f"<= {m.le}")
        elif isinstance(m, annotated_types.MultipleOf):
            bounds.append(f"multiple of {m.multiple_of}")
        elif hasattr(m, "func") and type(m).__name__.endswith("Validator"):
            out.append(_validator_text(m.func))
    bounds += _length_bounds(lengths)
    if bounds:
        out.insert(1 if literals else 0, ", ".join(bounds))
    # constraints nested inside a union (e.g. ``PositiveFloats | None``)
    args = _union_args(_strip(tp)[0])
    if args is not None:
        for a in args:
            if a is type(None):
                continue
            inner, inner_meta = _strip(a)
            if inner_meta:
                out.extend(x for x in _allowed(inner, inner_meta) if x not in out)
    return out


def _length_bounds(lengths: list[Any]) -> list[str]:
    lo = max((m.min_length for m in lengths if isinstance(m, annotated_types.MinLen)), default=None)
    hi = min((m.max_length for m in lengths if isinstance(m, annotated_types.MaxLen)), default=None)

    def entries(n: int) -> str:
        return f"{n} entry" if n == 1 else f"{n} entries"

    if lo is not None and hi is not None:
        return [entries(lo) if lo == hi else f"{lo} to {entries(hi)}"]
    if lo is not None:
        return [f"at least {entries(lo)}"]
    if hi is not None:
        return [f"at most {entries(hi)}"]
    return []


def _validators_of(model: type[BaseModel], field_name: str) -> list[Any]:
    """The functions of ``@field_validator``s that ``model`` declares for ``field_name``."""
    found = []
    for dec in model.__pydantic_decorators__.field_validators.values():
        if field_name in dec.info.fields or "*" in dec.info.fields:
            found.append(dec.func)
    return found


# -- markdown ----------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else ""


def _default_cell(text: str) -> str:
    return text if text in ("required", "not set", "computed") else f"`{text}`"


def _section_doc(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__")
    return " ".join(doc.split()) if doc else ""


def all_keys(model: type[BaseModel] = Config) -> list[str]:
    """Every documented dotted key (array-of-table entries as ``section.key[].field``)."""
    return [k.dotted for t in tables(model) for k in t.keys]


def tables(model: type[BaseModel] = Config) -> list[Table]:
    result: list[Table] = []
    for name, field in model.model_fields.items():
        section = _nested_section(field)
        if section is not None:
            result.extend(_tables(name, section))
    return result


def render(model: type[BaseModel] = Config) -> str:
    """The whole configuration reference as markdown."""
    all_tables = tables(model)
    top = [t.name for t in all_tables if "." not in t.name]
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from src/shoal/config/ by `python -m shoal.docgen`; do not edit by hand.",
        f"     Regenerate with: {REGENERATE} -->",
        "",
        "A run is configured by a TOML file (`shoal train --config FILE`) plus any",
        "number of `--set section.key=value` overrides; every key not given takes",
        "the default below. Values of `--set` are read as TOML (`--set",
        "cluster.speeds=[1,2,4]`, `--set sync.gssp.groups=2`), and a value that is not",
        "valid TOML is taken as a string (`--set sync.scheme=ssp`). Unknown keys,",
        "wrong types and out-of-range values are rejected before anything runs: one",
        "line naming the key, exit code 2. The resolved configuration of a run is",
        "written to `OUT/config.toml`, which reproduces it.",
        "",
        *_checks("Checks that involve keys of several sections:", _model_checks(model)),
        "Sections: " + ", ".join(f"[`[{n}]`](#{_anchor(n)})" for n in top) + ".",
        "",
        "Column *allowed* lists the accepted values or bounds; *default* `not set`",
        "means the key is optional and absent by default.",
        "",
        *_registries(),
    ]
    for table in all_tables:
        depth = table.name.count(".")
        heading = f"[[{table.name}]]" if table.array else f"[{table.name}]"
        out.append("#" * min(2 + depth, 4) + f" {heading}")
        out.append("")
        doc = _section_doc(table.model)
        if table.array:
            parent, _, leaf = table.name.rpartition(".")
            out.append(
                f"`{table.name}` is an array of tables: each entry has the keys below. In a file, "
                f"write one `[[{table.name}]]` block per entry, or `{leaf} = [{{...}}, ...]` under `[{parent}]`."
            )
            out.append("")
        if doc:
            out.append(doc)
            out.append("")
        out.extend(_checks("Checks that involve several keys:", table.checks))
        if table.keys:
            out.append("| key | type | default | allowed | description |")
            out.append("|---|---|---|---|---|")
            for k in table.keys:
                out.append(
                    f"| `{k.dotted}` | {_cell(k.type)} | {_cell(_default_cell(k.default))} | {_cell(k.allowed)} | {_cell(k.description)} |"
                )
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _registries() -> list[str]:
    """Every registry (models, data sets and formats, schemes, compressors, planners), each name with its help."""
    out = ["## Registered components", "",
           "Each of these registers itself where it is defined (docs/extending.md says how to add one):", ""]
    for registry, key in ((MODELS, "model.name"), (DATASETS, "data.name"), (DATA_FORMATS, "data.name = \"KIND:PATH\", KIND"),
                          (SCHEMES, "sync.scheme"), (COMPRESSORS, "compression.method"), (PLANNERS, "network.algorithm")):
        out += [f"`{key}`:", ""]
        out += [f"- `{name}`: {entry.help}" for name, entry in registry.entries().items()]
        out.append("")
    return out


def _checks(title: str, checks: list[str]) -> list[str]:
    return [title, "", *(f"- {c}" for c in checks), ""] if checks else []


def _anchor(section: str) -> str:
    # GitHub's heading anchors: lower case, punctuation dropped ("[run]" -> "run").
    return "".join(c for c in section.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


# -- JSON schema for editors ------------------------------------------------------------

SCHEMA_PATH = Path("docs/shoal.schema.json")
json_schema = config_json_schema  # one definition, in shoal.config (shoal schema prints it too)




# -- command line ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shoal.docgen", description="Render the configuration reference (markdown).")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--out", type=Path, help="write the reference to this file instead of stdout")
    group.add_argument("--schema", type=Path, metavar="FILE", help="write the config's JSON schema to FILE")
    group.add_argument(
        "--check", nargs="?", const=DEFAULT_PATH, type=Path, metavar="FILE",
        help=f"exit 1 if FILE (default {DEFAULT_PATH}) differs from what would be generated",
    )
    args = parser.parse_args(argv)
    if args.schema is not None:
        args.schema.parent.mkdir(parents=True, exist_ok=True)
        args.schema.write_text(json_schema())
        return 0
    text = render()
    if args.check is not None:
        current = args.check.read_text() if args.check.is_file() else None
        if current != text:
            state = "is missing" if current is None else "is out of date"
            print(f"{args.check} {state}; regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
