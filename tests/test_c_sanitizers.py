"""The C tests again, against a build of the C library with AddressSanitizer and
UndefinedBehaviorSanitizer: an out-of-bounds read or write in an edge tile, a pack buffer
overrun, a use-after-free or signed overflow aborts the run instead of passing unnoticed.

The library is built into build/sanitize with -DMATMUL_SANITIZE=ON; the C tests run in a
subprocess whose harness loads it (MATMUL_C_LIBRARY), with the sanitizer runtimes preloaded
(Python itself is not built with them, and ASan must be first in the process).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from harness.backends.c import clib
from harness.env import sources

# Set in the subprocess, so this file does not run itself again there.
INNER_RUN = "MATMUL_SANITIZER_RUN"
C_TESTS = ["test_c_packed.py", "test_c_kernels.py", "test_decode.py", "test_decode_int8_q4k.py", "test_c_bf16.py"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(os.environ.get(INNER_RUN)), reason="already inside the sanitizer run"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the runtime preloading here is Linux-only"),
    pytest.mark.skipif(not sources.in_checkout(), reason="builds the C library from a checkout"),
]


def _runtime(name: str) -> str | None:
    """The sanitizer runtime the compiler links, or None if it has none."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if not compiler:
        return None
    found = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return found if found and os.path.isabs(found) and os.path.exists(found) else None


def test_c_tests_under_address_and_undefined_behaviour_sanitizers():
    asan, ubsan = _runtime("libasan.so"), _runtime("libubsan.so")
    if not (asan and ubsan):
        pytest.skip("the compiler has no AddressSanitizer/UBSan runtime (libasan.so, libubsan.so)")
    root = sources.sources_root()
    library = clib.build_in_checkout(root / "build" / "sanitize", "-DMATMUL_SANITIZE=ON")
    tests = [str(root / "tests" / name) for name in C_TESTS if (root / "tests" / name).is_file()]
    env = {
        **os.environ,
        INNER_RUN: "1",
        "MATMUL_C_LIBRARY": str(library),
        "LD_PRELOAD": f"{asan}:{ubsan}",
        # CPython keeps objects alive until exit on purpose; leak reports would be its, not ours.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-s",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-n",
            "0",
            *tests,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    # -s: a sanitizer report is written to stderr as the process dies; pytest must not
    # be capturing it then.
    output = done.stdout[-6000:] + done.stderr[-6000:]
    assert done.returncode == 0, f"C tests failed under the sanitizers:\n{output}"
    assert "passed" in done.stdout, output
