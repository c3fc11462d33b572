"""The user documentation stays true.

- docs/configuration.md is what `python -m shoal.docgen` generates from the
  schema now, and names every key;
- the generator follows the schema generically (nested sections, arrays of
  tables, unions, required keys), so sections added later are documented;
- in the user pages, every `shoal train` / `shoal compare` command validates,
  every `section.key` named exists, knob tables show the schema's defaults,
  and relative links resolve (README.md's too);
- docs/own-profile.md runs: its marked code blocks are executed in order, in
  a scratch folder with the venv's bin on PATH (the compare step is skipped,
  with a reason, only while `shoal compare` does not exist).

Code blocks in docs/own-profile.md are marked by their info string:
``toml file=NAME`` is written to NAME; ``bash`` is run with bash (``bash
exit=N`` must exit with N, default 0); ``text stderr`` / ``text stdout`` must
appear in the previous command's stderr / stdout. Other blocks are prose.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import pytest
from pydantic import BaseModel, Field, model_validator

from conftest import ROOT
from shoal import docgen
from shoal.config import Config, ConfigError, Section, load_config

DOCS = ROOT / "docs"
REFERENCE = DOCS / "configuration.md"
BIN = Path(sys.executable).parent
REGENERATE = "make docs (or: .venv/bin/python -m shoal.docgen --out docs/configuration.md)"
#: the pages whose commands and keys this test keeps honest (written for users, not design notes)
USER_PAGES = ["getting-started.md", "own-profile.md", "fair-comparison.md", "api.md", "schemes/bsp.md", "schemes/asp.md",
              "schemes/ssp.md", "schemes/gssp.md", "schemes/localsgd.md", "schemes/diloco.md", "schemes/compression.md",
              "schemes/streaming_diloco.md", "workloads.md", "balance.md", "ddp-hooks.md", "sim-batched.md"]


# -- the generated reference ---------------------------------------------------------


def test_configuration_reference_is_current():
    current = REFERENCE.read_text() if REFERENCE.is_file() else ""
    assert current == docgen.render(), f"docs/configuration.md is out of date with src/shoal/config/; regenerate it with: {REGENERATE}"


def _schema_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every leaf key of a schema, walked independently of docgen (arrays of tables as ``key[].field``)."""
    keys = []
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _schema_keys(ann, dotted + ".")
            continue
        keys.append(dotted)
        item = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if item is not None:
            keys += _schema_keys(item, dotted + "[].")
    return keys


def test_every_schema_key_is_documented():
    keys = _schema_keys(Config)
    assert set(docgen.all_keys()) == set(keys)
    text = REFERENCE.read_text()
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"not in docs/configuration.md: {missing}; regenerate it with: {REGENERATE}"
    for section in {k.split(".")[0] for k in keys}:
        assert f"## [{section}]" in text


class _Leaf(Section):
    """A nested table."""

    ratio: float = Field(0.5, gt=0, lt=1, description="A bounded float.")


class _Entry(Section):
    at: int = Field(..., ge=0, description="A required key.")


class _Part(Section):
    """A section added later."""

    mode: Literal["a", "b"] = Field("a", description="A choice | with a pipe.")
    count: int | Literal["auto"] = Field("auto", description="A count or auto.")
    sizes: Optional[list[int]] = Field(None, description="Optional list.")
    leaf: _Leaf = _Leaf()
    entries: list[_Entry] = Field([], description="An array of tables.")


class _Schema(Section):
    part: _Part = _Part()


def test_generator_documents_any_section_shape():
    text = docgen.render(_Schema)
    assert docgen.all_keys(_Schema) == ["part.mode", "part.count", "part.sizes", "part.entries", "part.leaf.ratio", "part.entries[].at"]
    assert "## [part]\n\nA section added later." in text
    assert "| `part.mode` | string | `\"a\"` | one of \"a\", \"b\" | A choice \\| with a pipe. |" in text
    assert "| `part.count` | integer or \"auto\" | `\"auto\"` |" in text
    assert "| `part.sizes` | array of integer | not set |" in text
    assert "### [part.leaf]" in text and "| `part.leaf.ratio` | float | `0.5` | > 0, < 1 | A bounded float. |" in text
    assert "### [[part.entries]]" in text and "| `part.entries[].at` | integer | required | >= 0 | A required key. |" in text


class _Checked(Section):
    low: int = Field(1, description="Low.")
    high: int = Field(2, description="High.")

    @model_validator(mode="after")
    def _ordered(self) -> "_Checked":
        """Rules:

        - `low` must not exceed `high`
        - both are counted in steps
        """
        return self


class _Unexplained(Section):
    x: int = Field(1, description="X.")

    @model_validator(mode="after")
    def _secret(self) -> "_Unexplained":
        return self


def test_checks_come_from_validator_docstrings_and_no_source_text_is_read(monkeypatch):
    import inspect

    def no_source(*args, **kwargs):
        raise AssertionError("docgen read source text")

    docgen.render()  # the registries' home packages import first (torch may read source while importing)
    monkeypatch.setattr(inspect, "getsource", no_source)
    monkeypatch.setattr(inspect, "getsourcelines", no_source)
    text = docgen.render(type("_Root", (Section,), {"__annotations__": {"c": _Checked}, "c": _Checked()}))
    assert "- `low` must not exceed `high`\n- both are counted in steps" in text
    assert docgen.render() == (ROOT / "docs" / "configuration.md").read_text()  # the real reference, without source
    with pytest.raises(ValueError, match="validator _secret has no docstring"):
        docgen.render(type("_Root2", (Section,), {"__annotations__": {"u": _Unexplained}, "u": _Unexplained()}))


def test_check_flag_reports_a_stale_file(tmp_path, capsys):
    fresh, stale = tmp_path / "fresh.md", tmp_path / "stale.md"
    assert docgen.main(["--out", str(fresh)]) == 0
    stale.write_text(fresh.read_text().replace("run.seed", "run.sead"))
    assert docgen.main(["--check", str(fresh)]) == 0
    assert docgen.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert docgen.main(["--check", str(tmp_path / "none.md")]) == 1


# -- commands and keys quoted in the docs ------------------------------------------------


@dataclass
class Block:
    lang: str
    attrs: dict[str, str]
    text: str
    line: int
    flags: set[str] = field(default_factory=set)


def code_blocks(path: Path) -> list[Block]:
    """Fenced code blocks with their info string split into language, key=value attributes and flags."""
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*(.*)$", lines[i])
        if m and m.group(1):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                body.append(lines[i])
                i += 1
            words = m.group(2).split()
            attrs = dict(w.split("=", 1) for w in words if "=" in w)
            blocks.append(Block(m.group(1), attrs, "\n".join(body) + "\n", start, {w for w in words if "=" not in w}))
        i += 1
    return blocks


def shell_commands(text: str) -> list[list[str]]:
    """The `shoal ...` commands of a shell snippet (continuation lines joined, comments and heredoc bodies dropped)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    commands, heredoc = [], None
    for line in joined.splitlines():
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        m = re.search(r"<<-?\s*'?(\w+)'?", line)
        if m:
            heredoc = m.group(1)
        if line.startswith("shoal "):
            commands.append(shlex.split(line, comments=True))
    return commands


@dataclass
class Invocation:
    command: str  # "train" or "compare"
    config: Optional[str]
    sets: list[str]
    schemes: Optional[str] = None


def invocations(page: Path) -> list[Invocation]:
    """Every `shoal train` / `shoal compare` in a page's bash blocks that should succeed."""
    found = []
    for block in code_blocks(page):
        if block.lang != "bash" or block.attrs.get("exit", "0") != "0":
            continue
        for argv in shell_commands(block.text):
            if argv[1:2] not in (["train"], ["compare"]):
                continue
            inv = Invocation(argv[1], None, [])
            for flag, value in zip(argv, argv[1:]):
                if flag in ("--config", "-c"):
                    inv.config = value
                elif flag in ("--set", "-s"):
                    inv.sets.append(value)
                elif flag == "--backend":
                    inv.sets.append(f"backend.name={value}")
                elif flag == "--schemes":
                    inv.schemes = value
            found.append(inv)
    return found


@pytest.mark.parametrize("page", USER_PAGES)
def test_documented_commands_are_valid(page):
    """Each documented run's configuration (every scheme's, for compare) validates; nothing is run."""
    path = DOCS / page
    assert path.is_file(), f"docs/{page} is missing"
    written = {b.attrs.get("file") for b in code_blocks(path)}
    for inv in invocations(path):
        if inv.config is not None and not (ROOT / inv.config).is_file():
            # files the page itself writes (own-profile.md) are checked by running the page
            assert inv.config in written, f"docs/{page}: {inv.config} does not exist"
            continue
        config = ROOT / inv.config if inv.config else None
        try:
            if inv.command == "train":
                load_config(config, inv.sets)
            elif _has_command("compare"):
                from shoal.comparison import plan_runs
                from shoal.report.schemes import parse_schemes

                plan_runs(config, parse_schemes(inv.schemes or ""), 1, inv.sets)
        except ConfigError as err:
            raise AssertionError(f"docs/{page}: shoal {inv.command} --config {inv.config} {inv.sets}: {err}") from None


SECTIONS = tuple(Config.model_fields)


@pytest.mark.parametrize("page", USER_PAGES)
def test_keys_named_in_the_docs_exist(page):
    """Every `section.key` in backticks names a real key (or section) of the schema."""
    keys = set(docgen.all_keys())
    tables = {t.name for t in docgen.tables()}
    text = (DOCS / page).read_text()
    bad = []
    for m in re.finditer(r"`\[{0,2}((?:%s)\.[a-z_][a-z0-9_.]*)\]{0,2}(?:=[^`]*)?`" % "|".join(SECTIONS), text):
        name = m.group(1)
        if name.endswith((".safetensors", ".json", ".jsonl", ".toml")):  # a file the run writes, e.g. model.json
            continue
        if name.endswith(".*"):
            name = name[:-2]
        if name not in keys and name not in tables:
            bad.append(name)
    assert not bad, f"docs/{page} names keys that do not exist: {bad}"


@pytest.mark.parametrize("page", USER_PAGES)
def test_knob_tables_show_the_real_defaults(page):
    """Rows `| `section.key` | default | ... |` in the hand-written pages match the schema's defaults."""
    defaults = {k.dotted: k.default for t in docgen.tables() for k in t.keys}
    wrong, in_table = [], False
    for line in (DOCS / page).read_text().splitlines():
        if re.match(r"^\| key \| default \|", line):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
        m = re.match(r"^\| `([a-z_.]+)` \| ([^|]+) \|", line)
        if in_table and m:
            key, shown = m.group(1), m.group(2).strip().strip("`")
            if defaults.get(key) != shown:
                wrong.append(f"{key}: page says {shown}, schema default is {defaults.get(key, 'no such key')}")
    assert not wrong, f"docs/{page}: " + "; ".join(wrong)


@pytest.mark.parametrize("page", ["../README.md", *USER_PAGES])
def test_relative_links_resolve(page):
    path = DOCS / page
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)} links to missing files: {broken}"


# -- docs/own-profile.md, run as written --------------------------------------------------


def _has_command(name: str) -> bool:
    from shoal.cli import app

    return any((c.name or c.callback.__name__) == name for c in app.registered_commands)


def _outs(argv: list[str]) -> list[str]:
    return [v for f, v in zip(argv, argv[1:]) if f in ("--out", "-o")]


@pytest.mark.slow
def test_own_profile_walkthrough_runs(tmp_path):
    page = DOCS / "own-profile.md"
    blocks = [b for b in code_blocks(page) if (b.lang == "toml" and "file" in b.attrs) or b.lang == "bash"
              or (b.lang == "text" and b.flags & {"stderr", "stdout"})]
    assert any(b.lang == "toml" for b in blocks) and any(b.lang == "bash" for b in blocks)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1", "COLUMNS": "120"}
    env.pop("VIRTUAL_ENV", None)
    compare_ready = _has_command("compare")
    skipped, last = [], None
    for block in blocks:
        where = f"docs/own-profile.md line {block.line}"
        if block.lang == "toml":
            data = tomllib.loads(block.text)
            (tmp_path / block.attrs["file"]).write_text(block.text)
            budget = data.get("run", {}).get("max_time_s", 600.0)
            assert budget <= 30, f"{where}: keep the example small (run.max_time_s = {budget}); this test runs it"
            continue
        if block.lang == "text":
            assert last is not None, f"{where}: an output block must follow a command"
            shown = block.text.strip()
            stream = last.stderr if "stderr" in block.flags else last.stdout
            assert shown in stream, f"{where}: the page shows {shown!r}, the command printed {stream!r}"
            continue
        argvs = shell_commands(block.text)
        if any(a[:2] == ["shoal", "compare"] for a in argvs) and not compare_ready:
            skipped.append(block.line)
            last = None
            continue
        last = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        expected = int(block.attrs.get("exit", 0))
        assert last.returncode == expected, f"{where}: exit {last.returncode}, expected {expected}\n{last.stdout}\n{last.stderr}"
        for argv in argvs:
            if argv[:2] == ["shoal", "train"]:
                for out in _outs(argv):
                    files = {"config.toml", "metrics.jsonl", "summary.json"}
                    present = {p.name for p in (tmp_path / out).iterdir()} if (tmp_path / out).is_dir() else set()
                    assert (files <= present) == (expected == 0), f"{where}: {out} holds {sorted(present)}"
                    if expected == 0:
                        summary = json.loads((tmp_path / out / "summary.json").read_text())
                        assert summary["per_worker"] and summary["iterations"] > 0
            elif argv[:2] == ["shoal", "compare"]:
                _check_compare(tmp_path, argv, where)
    # The page tells the reader what to find in runs/gssp/metrics.jsonl: the profiled split, the speed
    # change of worker 1 at 2 s, and a regroup that moves worker 1.
    events = [json.loads(line) for line in (tmp_path / "runs/gssp/metrics.jsonl").read_text().splitlines()]
    kinds = [(e["event"], e.get("reason")) for e in events]
    assert ("groups", "profiled") in kinds and ("speed_change", None) in kinds, "own-profile.md step 3 describes events that did not occur"
    moved = [m[0] for e in events if e.get("reason") == "regroup" for m in e.get("moves", [])]
    assert 1 in moved, "own-profile.md step 3 says worker 1 is regrouped; it was not"
    if skipped:
        pytest.skip(f"`shoal compare` is not available yet: skipped the block(s) at line(s) {skipped} of docs/own-profile.md "
                    "after every other step passed")


def _check_compare(cwd: Path, argv: list[str], where: str) -> None:
    """compare.json has one row per scheme (with the speed-up over BSP), each scheme has its run folder, and the report exists."""
    schemes = argv[argv.index("--schemes") + 1].split(",")
    (out,) = _outs(argv)
    folder = cwd / out
    assert (folder / "report.html").is_file(), f"{where}: no {out}/report.html"
    rows = json.loads((folder / "compare.json").read_text())["rows"]
    assert [r["scheme"] for r in rows] == schemes, f"{where}: compare.json rows {[r['scheme'] for r in rows]}"
    for row in rows:
        assert {"speedup_vs_bsp", "time_to_target_s", "final_accuracy", "bytes_up"} <= set(row), f"{where}: {sorted(row)}"
        assert (folder / row["scheme"] / "summary.json").is_file(), f"{where}: no {out}/{row['scheme']}/summary.json"


def test_the_json_schema_is_current_and_accepts_every_example():
    jsonschema = pytest.importorskip("jsonschema")
    schema_file = DOCS / "shoal.schema.json"
    assert schema_file.read_text() == docgen.json_schema(), f"docs/shoal.schema.json is stale; {REGENERATE}"
    schema = json.loads(schema_file.read_text())
    for example in sorted((ROOT / "examples").glob("*.toml")):
        text = example.read_text()
        assert text.startswith("#:schema ../docs/shoal.schema.json"), example  # editors find the schema
        jsonschema.validate(tomllib.loads(text), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"run": {"max_time_s": 1, "no_such_key": 2}}, schema)
    plugged = {"sync": {"scheme": "python:my_scheme.py:Mine"}, "compression": {"method": "python:pkg.mod:Codec"}}
    jsonschema.validate(plugged, schema)  # a user's own class is not flagged by an editor
    for wrong in ({"sync": {"scheme": "warp"}}, {"compression": {"method": "zip"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
