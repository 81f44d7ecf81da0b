"""The C implementations on a CPU this machine is not: an AMD EPYC Zen 3 (AVX2 and FMA, no
AVX-512), emulated by qemu's user mode (`apt install qemu-user`; skipped without it). The suite
runs on whichever CPU it is given, and most of its runs are on AVX-512 machines, where only
forcing a variant reaches the AVX2 kernels; here the library's own CPU check chooses them, as
on a user's Zen 3, and a build for an AVX-512 CPU has to refuse to load rather than crash."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.c import clib
from harness.env import sources

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates an x86-64 CPU"),
    pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="needs qemu's user mode (apt install qemu-user)"),
]

ZEN3 = "EPYC-Milan"  # qemu's model of an AMD EPYC Zen 3: AVX2, FMA, F16C; no AVX-512
PROBE = Path(__file__).with_name("other_cpu_probe.py")
SIMD = ("c.packed", "c.decode", "c.decode_int8")  # those that choose their kernels at run time


def _emulated(library: Path, *args: str) -> subprocess.CompletedProcess:
    """`python args` on the emulated Zen 3, loading `library`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}  # not this run's worker
    env["MATMUL_C_LIBRARY"] = str(library)
    return subprocess.run(
        ["qemu-x86_64", "-cpu", ZEN3, sys.executable, *args], capture_output=True, text=True, env=env, timeout=1800
    )


def _build(folder: str, *cmake_args: str) -> Path:
    return clib.build_in_checkout(sources.sources_root() / "build" / folder, *cmake_args)


@pytest.mark.parametrize(
    "folder, cmake_args",
    [
        ("level-x86-64-v3", ["-DMATMUL_MARCH=x86-64-v3"]),  # what a Zen 3 builds for itself
        ("level-portable", ["-DMATMUL_NATIVE=OFF"]),  # what the wheel ships: plain x86-64
    ],
)
def test_on_a_zen3_the_avx2_kernels_run_and_pass_the_check(folder, cmake_args):
    done = _emulated(_build(folder, *cmake_args), str(PROBE))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert "avx512f" not in report["library_isa"]
    found = report["implementations"]
    bf16 = found.pop("c.bf16")
    assert bf16["unavailable"] and "not on this CPU" in bf16["unavailable"]  # said, not a crash
    for name, entry in found.items():
        assert entry["unavailable"] is None, (name, entry["unavailable"])
        assert entry["checked"] > 0 and not entry["failures"], (name, entry["failures"])
        if name in SIMD:  # chosen by the CPU check, not forced
            assert entry["detail"].startswith("avx2 kernels"), (name, entry["detail"])
            assert "avx512" not in entry["detail"]


# the C kernels' own test files: none may assume the instructions of the CPU it ran on before
C_TEST_FILES = ["test_c_packed.py", "test_c_kernels.py", "test_decode.py", "test_decode_int8_q4k.py"]


def test_the_c_kernels_test_files_pass_on_a_zen3():
    library = _build("level-x86-64-v3", "-DMATMUL_MARCH=x86-64-v3")
    files = [str(Path(__file__).with_name(name)) for name in C_TEST_FILES]
    # one process (-n 0): qemu's user mode runs only the process it started, not the workers
    done = _emulated(library, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *files)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and " passed" in summary, done.stdout[-3000:] + done.stderr[-2000:]


def test_a_library_built_for_avx512_is_refused_on_a_zen3_with_what_to_do():
    # the checkout's own build where this CPU has AVX-512 (a native build copied to a Zen 3)
    library = clib.library_path()
    if "avx512f" not in clib.build_isa():
        library = _build("level-x86-64-v4", "-DMATMUL_MARCH=x86-64-v4")
    probe = "import harness; print(harness.lookup('c.packed').unavailable_reason())"
    done = _emulated(library, "-c", probe)
    assert done.returncode == 0, done.stderr[-3000:]  # no SIGILL: the check runs before any kernel
    assert "compiled for instructions this CPU lacks (avx512f" in done.stdout, done.stdout
    assert "Rebuild it on this one" in done.stdout
