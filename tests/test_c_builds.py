"""The C tests again, against the builds other CPUs get.

The checkout's library is compiled with -march=native, so the suite on its own tests only the
instruction set of the machine it runs on, and CI lands on an AVX2-only CPU one day and an
AVX-512 one the next. Here the library is also built for the portable baseline
(MATMUL_NATIVE=OFF: plain x86-64, what the wheel ships) and for the AVX2 level (x86-64-v3,
which any AVX-512 CPU runs too), each into its own folder, and the C tests run against each in
a subprocess whose harness loads it (MATMUL_C_LIBRARY). Every micro-kernel variant this CPU
can execute is tested in each build (test_c_packed.py parametrizes over them).

And a build for instructions this CPU lacks must be refused with a clear error at load, never
run into an illegal instruction.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import pytest

from harness.backends.c import clib
from harness.env import sources

# Set in the subprocess, so this file does not run itself again there.
INNER_RUN = "MATMUL_BUILD_LEVEL_RUN"
C_TESTS = ["test_c_kernels.py", "test_c_packed.py", "test_decode.py", "test_decode_int8_q4k.py", "test_c_bf16.py"]

# Extension names as c/build_isa.c reports them; each has a predefined macro (__AVX2__, ...).
KNOWN_EXTENSIONS = [
    "sse3",
    "ssse3",
    "sse4.1",
    "sse4.2",
    "popcnt",
    "avx",
    "avx2",
    "fma",
    "bmi",
    "bmi2",
    "avx512f",
    "avx512cd",
    "avx512vl",
    "avx512bw",
    "avx512dq",
    "avx512ifma",
    "avx512vbmi",
    "avx512vbmi2",
    "avx512vnni",
    "avx512bf16",
    "avx512fp16",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(os.environ.get(INNER_RUN)), reason="already inside a build-level run"),
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the x86-64 levels need an x86-64 CPU"),
    pytest.mark.skipif(not sources.in_checkout(), reason="builds the C library from a checkout"),
]


def _build(folder: str, *cmake_args: str):
    return clib.build_in_checkout(sources.sources_root() / "build" / folder, *cmake_args)


def _python(library, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, INNER_RUN: "1", "MATMUL_C_LIBRARY": str(library)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _loaded_facts(library) -> dict:
    done = _python(
        library,
        "import json; from harness.backends.c import clib; from harness.backends import c\n"
        "print(json.dumps({'isa': clib.build_isa(), 'variants': c.packed_variants()}))",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    return json.loads(done.stdout)


LEVELS = {
    # folder: (CMake arguments, extensions the build must use, extensions it must not)
    "portable": (["-DMATMUL_NATIVE=OFF"], [], ["sse3", "avx", "avx2", "fma", "avx512f"]),
    "x86-64-v3": (["-DMATMUL_MARCH=x86-64-v3"], ["avx", "avx2", "fma"], ["avx512f"]),
}


@pytest.mark.parametrize("level", LEVELS)
def test_c_tests_pass_in_the_build_for(level):
    cmake_args, required, absent = LEVELS[level]
    library = _build(f"level-{level}", *cmake_args)
    facts = _loaded_facts(library)
    assert set(required) <= set(facts["isa"]) and not set(absent) & set(facts["isa"]), facts
    # The micro-kernels are chosen at run time, whatever the build's level.
    assert facts["variants"] == _loaded_facts(clib.library_path())["variants"]

    root = sources.sources_root()
    env = {**os.environ, INNER_RUN: "1", "MATMUL_C_LIBRARY": str(library)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-n",
            "0",  # one process: this test's own worker already shares the cores
            *[str(root / "tests" / name) for name in C_TESTS],
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"C tests failed in the {level} build:\n{done.stdout[-6000:]}{done.stderr[-3000:]}"
    assert " passed" in done.stdout


def _macros(march: str) -> set[str]:
    compiler = shutil.which("gcc") or shutil.which("cc")
    done = subprocess.run([compiler, f"-march={march}", "-dM", "-E", "-"], input="", capture_output=True, text=True)
    return (
        {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define")}
        if done.returncode == 0
        else set()
    )


def _extensions(macros: set[str]) -> set[str]:
    return {name for name in KNOWN_EXTENSIONS if f"__{name.upper().replace('.', '_')}__" in macros}


def test_a_build_for_instructions_this_cpu_lacks_is_refused_with_a_clear_error():
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("no C compiler to ask what each -march level uses")
    here = _extensions(_macros("native"))
    # The first level with an extension this CPU lacks: AVX-512 on an AVX2-only CPU, AVX512-FP16
    # on most AVX-512 ones.
    for march in ("x86-64-v4", "sapphirerapids"):
        lacking = _extensions(_macros(march)) - here
        if lacking:
            break
    else:
        pytest.skip("this CPU has every extension of x86-64-v4 and sapphirerapids")
    library = _build(f"level-{march}", f"-DMATMUL_MARCH={march}")
    done = _python(
        library,
        "import numpy as np, harness\n"
        "a = np.ones((8, 8), np.float32)\n"
        "try:\n    harness.get('c.blocked')(a, a)\n"
        "except Exception as error:\n    print(type(error).__name__, error)\n",
    )
    # A crash would be a negative return code (SIGILL); the call must fail in Python instead.
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    assert "compiled for instructions this CPU lacks" in done.stdout, done.stdout
    for name in lacking:
        assert name in done.stdout, (name, done.stdout)
