"""The READMEs say what is true: the front page's tables are generated, its quick start names
real commands, every Python block runs and every relative link leads to a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cli import implementation_table
from harness.tooling.headline import END as HEADLINE_END
from harness.tooling.headline import START as HEADLINE_START
from harness.tooling.headline import headline_lines
from harness.tooling.headline import table as headline_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
START, END = "<!-- implementations:start -->", "<!-- implementations:end -->"
READMES = [ROOT / "README.md", *sorted(ROOT.glob("*/README.md")), *sorted(ROOT.glob("results/*/README.md"))]
FRONT_PAGE_LINES = 170  # "about 150" (the implementation table grows a line per rung); detail lives next to the sources


def test_readme_table_is_current():
    table = README.split(START, 1)[1].split(END, 1)[0].strip()
    assert table == implementation_table(markdown=True).strip(), (
        "README.md's implementation table is stale: replace it with `python -m harness list --markdown`"
    )


def test_readme_headline_is_the_committed_results():
    block = README.split(HEADLINE_START, 1)[1].split(HEADLINE_END, 1)[0].strip()
    lines = headline_lines([ROOT / "results" / "cpu", ROOT / "results" / "gpu"])
    assert lines, "results/*/comparison.json has no timed rows"
    assert block == headline_table(lines).strip(), (
        "README.md's headline is stale: run `python -m harness headline` and paste results/headline.md"
    )
    assert (ROOT / "results" / "headline.png").is_file()


def test_front_page_stays_short():
    assert len(README.splitlines()) <= FRONT_PAGE_LINES


def test_quick_start_commands_exist():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "pytest" in quick_start and "python -m harness compare" in quick_start
    assert (ROOT / ".ci" / "run").is_file()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"\bpytest\b", ci)


@pytest.mark.parametrize("readme", READMES, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_lead_to_files(readme):
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme.read_text()):
        if "://" in target:
            continue
        assert (readme.parent / target).exists(), f"{readme.relative_to(ROOT)} links to {target}, which is not there"


@pytest.mark.parametrize(
    "readme",
    [path for path in READMES if "```python" in path.read_text()],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_readme_python_snippets_run(readme, tmp_path, monkeypatch):
    """Every ```python block runs as written (in a scratch folder, for its files)."""
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, str(readme.relative_to(ROOT)), "exec"), {})
