"""The architecture as tests: layered imports, no import circles, backends that only drive the Strategy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "shoal"


def _lint(config: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())"]
    if config is not None:
        args += ["--config", str(config)]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_of_pyproject_are_kept():
    pytest.importorskip("importlinter")
    result = _lint()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    """The contract can fail: with config placed above the engine, engine -> config is an upward import."""
    pytest.importorskip("importlinter")
    text = (ROOT / "pyproject.toml").read_text()
    swapped = text.replace('    "engine",\n', '    "config_above",\n').replace('    "config",\n', '    "engine",\n')
    swapped = swapped.replace('    "config_above",\n', '    "config",\n')
    assert swapped != text
    config = tmp_path / "pyproject.toml"
    config.write_text(swapped)
    result = _lint(config)
    assert result.returncode == 1 and "BROKEN" in result.stdout


def test_the_import_graph_has_no_circles():
    grimp = pytest.importorskip("grimp")
    import networkx as nx

    graph = grimp.build_graph("shoal")
    edges = nx.DiGraph((m, d) for m in graph.modules for d in graph.find_modules_directly_imported_by(m))
    circles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert circles == []


def test_backends_never_choose_the_scheme():
    """Policy choice, the density rule and the schedules are the Strategy's: no backend builds them by name."""
    pattern = re.compile(r"make_policy|gssp_from_config|GDTopKSchedule|sync\.scheme ==|compression\.method [!=]=")
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for path in sorted((SRC / "backends").rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
