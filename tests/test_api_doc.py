"""docs/api.md runs as written: its python blocks are executed in order, in a scratch copy of the examples."""

from __future__ import annotations

import re
import shutil

import pytest

from conftest import ROOT


@pytest.mark.slow  # a walkthrough of docs/api.md end to end (make test runs it; make test-fast leaves it out)
def test_the_api_page_runs(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    page = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), {})  # noqa: S102 - our own documentation
    assert (tmp_path / "runs" / "api-gssp" / "model.safetensors").exists()
    assert (tmp_path / "runs" / "api-compare" / "report.html").exists()
