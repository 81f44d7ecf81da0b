"""CONTRIBUTING.md's examples, run as a newcomer would: its mine.py and mine.c, written to a folder
outside the repository, compared from the command line and benchmarked by the suite, checked
and timed beside ours."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "CONTRIBUTING.md"


def example_files() -> dict[str, str]:
    """The code blocks whose first line names their file (``# mine.py``, ``/* mine.c */``)."""
    files = {}
    for _language, body in re.findall(r"```(python|c)\n(.*?)```", GUIDE.read_text(), flags=re.S):
        first = body.splitlines()[0]
        named = re.fullmatch(r"(?:#|/\*)\s*(\S+\.(?:py|c))\s*(?:\*/)?", first.strip())
        if named:
            files[named[1]] = body
    return files


def commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


@pytest.fixture
def examples(tmp_path):
    files = example_files()
    assert set(files) == {"mine.py", "mine.c"}, files
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100", "XDG_CACHE_HOME": str(cwd / "cache")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_guides_compare_command_checks_and_times_your_kernels_beside_ours(examples):
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler for mine.c")
    (compare,) = [c for c in commands() if c.startswith("python -m harness compare --impls mine")]
    # The guide's command at a smaller size, with a JSON to read the rows from.
    argv = compare.split()[1:]
    argv[argv.index("--shapes") + 1 :] = ["96", "--min-time", "0.01", "--json", "out.json"]
    done = _run([sys.executable, *argv], examples)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["implementation"]: r for r in json.loads((examples / "out.json").read_text())["results"]}
    for name in ("mine.matmul", "mine.my_matmul", "c.packed", "numpy.matmul"):
        assert rows[name]["status"] == "ok" and rows[name]["gflops"] and rows[name]["max_abs_error"] is not None, (
            rows.get(name)
        )
    assert "mine.my_matmul" in done.stdout and "mine.matmul" in done.stdout


def test_a_wrong_kernel_of_yours_is_reported_failed_and_not_timed(examples):
    (examples / "mine.py").write_text("import numpy as np\n\ndef matmul(a, b):\n    return (a @ b) * 1.01\n")
    done = _run(
        [
            sys.executable,
            "-m",
            "harness",
            "compare",
            "--impls",
            "mine.py:matmul",
            "--shapes",
            "64",
            "--min-time",
            "0.01",
            "--json",
            "out.json",
        ],
        examples,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # a requested implementation failed
    (row,) = [
        r for r in json.loads((examples / "out.json").read_text())["results"] if r["implementation"] == "mine.matmul"
    ]
    assert row["status"].startswith("FAILED") and row["gflops"] is None


def test_a_missing_file_or_function_is_a_usage_error(examples):
    for spec, said in (("nothere.py:matmul", "no such file"), ("mine.py:nothere", "no function nothere")):
        done = _run([sys.executable, "-m", "harness", "compare", "--impls", spec, "--shapes", "8"], examples)
        assert done.returncode == 2 and said in done.stderr, done.stdout + done.stderr
        assert "Traceback" not in done.stderr


def test_the_guides_benchmark_command_times_your_kernel_in_the_suite(examples):
    (bench,) = [c for c in commands() if c.startswith("pytest --benchmark-only --matmul-impls")]
    specs = re.search(r'--matmul-impls "([^"]+)"', bench)[1].split()
    python_only = " ".join(s for s in specs if s.endswith(".py:matmul"))
    tests = str(ROOT / "tests" / "test_benchmarks.py")
    done = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            tests,
            "-q",
            "-p",
            "no:cacheprovider",
            "--benchmark-only",
            "--matmul-impls",
            str(examples / python_only.split(":")[0]) + ":matmul",
            "--matmul-shapes",
            "48",
            "-k",
            "mine or numpy",
            "--rootdir",
            str(ROOT),
        ],
        examples,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"mine\.matmul\s+\S+ [mu]?s", done.stdout), done.stdout[-3000:]
