"""The README's implementation table is the registry's, and its quick start names real commands."""
from __future__ import annotations

import re
from pathlib import Path

from harness.cli import implementation_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
START, END = "<!-- implementations:start -->", "<!-- implementations:end -->"


def test_readme_table_is_current():
    table = README.split(START, 1)[1].split(END, 1)[0].strip()
    assert table == implementation_table(markdown=True).strip(), (
        "README.md's implementation table is stale: replace it with `python -m harness list --markdown`"
    )


def test_quick_start_commands_exist():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "pytest" in quick_start and "python -m harness compare" in quick_start
    assert (ROOT / ".ci" / "run").is_file()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"\bpytest\b", ci)


def test_readme_python_snippets_run(tmp_path, monkeypatch):
    """Every ```python block of the README runs as written (in a scratch folder, for its files)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
