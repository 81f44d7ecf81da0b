"""``python -m harness ab``: a C implementation from two builds, timed in turn in one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness.backends.c import clib
from harness.env.cores import usable_cores

ROOT = Path(__file__).resolve().parent.parent
QUICK = ("--rounds", "3", "--sample-time", "0.001")


def run_ab(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "harness", "ab", *args], capture_output=True, text=True, cwd=ROOT, env=env
    )


def test_a_library_against_itself_gives_the_same_bits_and_a_row_per_case(tmp_path):
    library = clib.library_path()  # built here if stale, before the command opens it twice
    out = tmp_path / "ab.json"
    done = run_ab(
        "--before", str(library), "--impls", "c.packed", "c.blocked", "--shapes", "33x65x17", "1x130x70",
        "--dtypes", "float32", "float64", *QUICK, "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["implementation"], r["shape"], r["dtype"]) for r in rows] == [
        (name, shape, dtype)
        for name in ("c.packed", "c.blocked")
        for shape in ("33x65x17", "1x130x70")
        for dtype in ("float32", "float64")
    ]
    for row in rows:
        assert row["same_bits"] and row["max_abs_difference"] == 0.0, row
        assert row["before_s"] > 0 and row["after_s"] > 0
        low, high = row["speedup_range"]
        assert 0 < low <= row["speedup"] <= high
    assert str(library) in data["before"] and data["rounds"] == 3
    for line in done.stdout.splitlines():
        if line.startswith("c."):
            assert line.endswith(" same"), line
    assert "above 1, after is faster" in done.stdout


WRONG_BUILD = """
#include <stdint.h>
#include <string.h>
/* what the loader asks every build first: the extensions it needs that this CPU lacks (none) */
int64_t matmul_build_missing_isa(char *out, int64_t size) { if (size > 0) out[0] = 0; return 0; }
int64_t matmul_build_isa(char *out, int64_t size) { if (size > 0) out[0] = 0; return 0; }
/* a naive matmul that forgets to multiply: C = 0 */
void matmul_naive_ijk_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K) {
    (void)A, (void)B, (void)K;
    memset(C, 0, (size_t)(M * N) * sizeof *C);
}
void matmul_naive_ijk_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K) {
    (void)A, (void)B, (void)K;
    memset(C, 0, (size_t)(M * N) * sizeof *C);
}
"""


def test_a_build_whose_product_is_wrong_is_refused_before_anything_is_timed(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    (tmp_path / "wrong.c").write_text(WRONG_BUILD)
    wrong = tmp_path / "libwrong.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(wrong), str(tmp_path / "wrong.c")], check=True)
    done = run_ab("--before", str(wrong), "--impls", "c.naive_ijk", "c.blocked", "--shapes", "8",
                  "--dtypes", "float32", "float64", *QUICK)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    naive = [line for line in done.stdout.splitlines() if line.startswith("c.naive_ijk")]
    assert len(naive) == 2 and all("the before build FAILED its check" in line for line in naive), naive
    # a function the before build lacks: that row says so, the others run
    blocked = [line for line in done.stdout.splitlines() if line.startswith("c.blocked")]
    assert len(blocked) == 2 and all("the before build:" in line and "matmul_blocked" in line for line in blocked)


def test_decode_and_bf16_rows_are_prepared_from_each_build_by_their_own_backends(tmp_path):
    """c.decode_int8 packs W with each build's own pack function, c.bf16 packs B: both through
    their backends' prepare, with the library they ask for being the build under test."""
    bf16 = harness.lookup("c.bf16").available  # AVX512_BF16 or AMX: not on every CPU CI runs on
    library = clib.library_path()
    out = tmp_path / "ab.json"
    done = run_ab("--before", str(library), "--impls", "c.decode_int8", *(["c.bf16"] if bf16 else []),
                  "--shapes", "3x64x256", "--weights", "q4_K", "q8_0", "--dtypes", "bfloat16",
                  *QUICK, "--json", str(out))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    expected = [("c.decode_int8", "q4_K"), ("c.decode_int8", "q8_0")] + ([("c.bf16", "bfloat16")] if bf16 else [])
    assert [(r["implementation"], r["dtype"]) for r in rows] == expected
    assert all(row["same_bits"] for row in rows), rows


def test_an_implementation_outside_the_c_library_is_refused_before_anything_is_built():
    done = run_ab("--before", "no-such-revision", "--impls", "numpy.matmul", *QUICK)
    assert done.returncode == 1
    assert "numpy.matmul is not one of the C library's implementations" in done.stderr
    assert "git" not in done.stderr  # refused before the revision was looked at


def test_an_unknown_implementation_or_revision_is_named():
    done = run_ab("--before", "HEAD", "--impls", "c.nonesuch", *QUICK)
    assert done.returncode == 2 and "unknown implementation c.nonesuch" in done.stderr
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = run_ab("--before", "no-such-revision-anywhere", *QUICK)
    assert done.returncode == 1
    assert "no-such-revision-anywhere" in done.stderr and "Traceback" not in done.stderr


def test_two_threads_are_refused_with_what_to_run_instead():
    if usable_cores() < 2:
        pytest.skip("one core: --threads 2 is refused earlier, as more threads than cores")
    done = run_ab("--before", "HEAD", "--threads", "2")
    assert done.returncode == 2
    assert "one thread only" in done.stderr and "MATMUL_C_LIBRARY=" in done.stderr


@pytest.mark.slow
def test_a_git_revision_is_built_once_into_the_cache_and_timed_beside_this_checkout(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    environment = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = tmp_path / "ab.json"
    done = run_ab("--before", "HEAD", "--shapes", "64", "1x300x200", *QUICK, "--json", str(out), env=environment)
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert data["before"].startswith("git HEAD (") and str(tmp_path / "cache") in data["before"]
    assert all("speedup" in row for row in data["rows"])
    built = list((tmp_path / "cache").rglob(clib.library_filename()))
    assert len(built) == 1
    again = run_ab("--before", "HEAD", "--shapes", "8", *QUICK, env=environment)
    assert again.returncode == 0, again.stderr
    assert list((tmp_path / "cache").rglob(clib.library_filename())) == built


def test_without_git_a_revision_is_refused_with_what_to_give_instead(tmp_path):
    environment = {**os.environ, "PATH": str(tmp_path)}  # no git (nor anything else) on PATH
    done = run_ab("--shapes", "8", *QUICK, env=environment)
    assert done.returncode == 1
    assert "needs git" in done.stderr and "library file" in done.stderr and "Traceback" not in done.stderr
