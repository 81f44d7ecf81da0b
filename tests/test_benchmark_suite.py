"""`pytest --benchmark-only`, the suite as a reader runs it: every row timed, then checked.

The default tier calls each benchmark once, untimed; only a timed run calls a row's prepared
call over and over before the product is checked (a BLAS called with beta = 1 passed the first
and failed the second). Small shapes, a few rounds each: it checks, it does not measure.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_row_of_the_benchmark_suite_is_timed_and_then_checked():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(ROOT / "tests" / "test_benchmarks.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            "--benchmark-only",
            "--matmul-shapes",
            "64 1x256x256",
            "--matmul-dtypes",
            "float32 float64",
            "--matmul-decode-shapes",
            "2x256x256",
            "--benchmark-max-time",
            "0.01",
            "--benchmark-min-rounds",
            "3",
            "--rootdir",
            str(ROOT),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) >= 20, tail  # the CPU rows ran: this is not a run of skips
    assert re.search(r"c\.packed\s+\S+ [mu]?s", done.stdout), tail
