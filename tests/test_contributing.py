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
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "CONTRIBUTING.md"


def example_files() -> dict[str, str]:
    """The code blocks whose first line names their file (``# mine.py``, ``/* mine.c */``,
    ``// cuda/row_per_block.cu``, ``# harness/backends/cuda/__init__.py (at the end)``)."""
    files = {}
    for _language, body in re.findall(r"```(python|c|cuda)\n(.*?)```", GUIDE.read_text(), flags=re.S):
        body = textwrap.dedent(body)
        first = body.splitlines()[0]
        named = re.fullmatch(r"(?:#|/\*|//)\s*(\S+\.(?:py|c|cu))(?: \(at the end\))?\s*(?:\*/)?", first.strip())
        if named:
            files[named[1]] = body
    return files


def commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


@pytest.fixture
def examples(tmp_path):
    files = {name: text for name, text in example_files().items() if name.startswith("mine.")}
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


# The guide's rungs inside the repository, added to a scratch copy of it as a contributor adds
# them (the source file, its registration appended), then run by the copy's own harness: the
# CUDA rung on the emulation, the Triton one in Triton's interpreter, on the edge shapes.
IN_COPY = (
    "import os, runpy, sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith('_editable_')]\n"
    "sys.path.insert(0, os.getcwd())\n"
    "import harness\n"
    "assert os.path.realpath(harness.__file__).startswith(os.path.realpath(os.getcwd()) + os.sep)\n"
    "runpy.run_module('harness', run_name='__main__', alter_sys=True)\n"
)
RUNG_SHAPES = ["1", "17", "33x65x129", "64x1x48"]


def _copy_with_rung(tmp_path: Path, source: str, registration: str) -> Path:
    from harness.backends.c import clib

    copy = tmp_path / "repository"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_lib", "_sources")
    for folder in ("harness", "c", "cuda", "python", "triton"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=ignore)
    shutil.copy(ROOT / "CMakeLists.txt", copy / "CMakeLists.txt")
    files = example_files()
    (copy / source).write_text(files[source])
    with open(copy / registration, "a") as handle:
        handle.write("\n\n" + "\n".join(files[registration].splitlines()[1:]) + "\n")
    clib.load()  # this checkout's C library, which the copy loads rather than building its own
    return copy


def _run_rung_in_copy(copy: Path, name: str, **env) -> dict[str, dict]:
    from harness.backends.c import clib

    library = clib.checkout_build_dir() / clib.library_filename()
    environment = {**os.environ, "COLUMNS": "100", "XDG_CACHE_HOME": str(copy / "cache")}
    environment.update(MATMUL_C_LIBRARY=str(library), PYTHONDONTWRITEBYTECODE="1", **env)
    args = ["compare", "--impls", name, "--shapes", *RUNG_SHAPES, "--no-baseline", "--json", "out.json"]
    done = subprocess.run(
        [sys.executable, "-c", IN_COPY, *args], cwd=copy, env=environment, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {
        r["shape"]: r for r in json.loads((copy / "out.json").read_text())["results"] if r["implementation"] == name
    }


@pytest.mark.slow
def test_the_guides_cuda_rung_runs_on_the_emulation(tmp_path):
    from harness.backends.cuda import emulation

    if emulation.emulation_unavailable_reason():
        pytest.skip(emulation.emulation_unavailable_reason())
    copy = _copy_with_rung(tmp_path, "cuda/row_per_block.cu", "harness/backends/cuda/__init__.py")
    rows = _run_rung_in_copy(copy, "cuda.row_per_block", MATMUL_CUDA_EMULATE="1")
    assert len(rows) == len(RUNG_SHAPES)
    assert all(row["status"] == "ok" and row["mode"] == "emulated" for row in rows.values()), rows


@pytest.mark.slow
def test_the_guides_triton_rung_runs_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    copy = _copy_with_rung(tmp_path, "triton/tiles.py", "harness/backends/triton_kernels.py")
    rows = _run_rung_in_copy(copy, "triton.tiles", TRITON_INTERPRET="1")
    assert len(rows) == len(RUNG_SHAPES)
    assert all(row["status"] == "ok" and row["mode"] == "interpreted" for row in rows.values()), rows


@pytest.mark.slow
def test_a_triton_rung_without_the_names_the_harness_reads_is_an_error_naming_them(tmp_path):
    pytest.importorskip("triton")
    copy = _copy_with_rung(tmp_path, "triton/tiles.py", "harness/backends/triton_kernels.py")
    source = copy / "triton" / "tiles.py"
    source.write_text(source.read_text().replace("INTERPRETED = ", "WAS_INTERPRETED = "))
    from harness.backends.c import clib

    environment = {**os.environ, "COLUMNS": "200", "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    environment["MATMUL_C_LIBRARY"] = str(clib.checkout_build_dir() / clib.library_filename())
    done = subprocess.run(
        [sys.executable, "-c", IN_COPY, "compare", "--impls", "triton.tiles", "--shapes", "16", "--no-baseline"],
        cwd=copy,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "triton/tiles.py defines no INTERPRETED (True when its kernels were built for" in said, said
    assert "Traceback" not in done.stderr
