"""The emulation's threaded variant under ThreadSanitizer and AddressSanitizer.

With EMU_THREADS every CUDA thread is an OS thread and __syncthreads a mutex/condition-variable
barrier, so the sanitizers see real happens-before edges. The chapter's tiled kernel runs clean
under both; with its second __syncthreads removed, ThreadSanitizer reports the race the chapter
describes (fast threads overwriting the tile under slow ones); with its edge check on A removed,
AddressSanitizer reports the out-of-bounds read. cuda/mma.cu (cp.async, ldmatrix, mma.sync) runs
clean under both too; without the barrier after its cp.async.wait_group ThreadSanitizer reports
a race, and without the wait_group the results are wrong (and the late copies race).
"""
from __future__ import annotations

import re
import subprocess

import pytest

from harness.backends import cuda
from harness.sources import source_path

pytestmark = pytest.mark.skipif(cuda.emulation_unavailable_reason() is not None,
                                reason=str(cuda.emulation_unavailable_reason()))

SHAPE = (32, 32, 40)  # 2 x 2 blocks of 256 threads, 3 phases along K (the last one partial)
DRIVER = '#include "selfcheck.h"\n'


def _tiled_source() -> str:
    return source_path("cuda/tiled.cu").read_text()


def _run(sanitize: str, text: str, tag: str) -> subprocess.CompletedProcess:
    try:
        program = cuda.build_emulation("cuda/tiled.cu", variant="threads", sanitize=sanitize, source_text=text,
                                       main=DRIVER, executable=True, tag=tag)
    except RuntimeError as error:
        if re.search(r"cannot find -l(t|a)san|libtsan|libasan", str(error)):
            pytest.skip(f"the compiler has no {sanitize} sanitizer runtime: {str(error).splitlines()[-1]}")
        raise
    launch = cuda.plan("tiled", "float32", *SHAPE)
    command = [str(program), launch.kernel, *map(str, SHAPE), *map(str, launch.grid), *map(str, launch.block)]
    # halt_on_error=0 / exitcode: let TSan report and still finish, so the output is complete.
    env = {"TSAN_OPTIONS": "halt_on_error=0 exitcode=66 report_signal_unsafe=0", "ASAN_OPTIONS": "detect_leaks=0"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def _without_second_barrier(text: str) -> str:
    parts = text.split("__syncthreads();")
    assert len(parts) == 3, "tiled.cu should have exactly two barriers"
    return parts[0] + "__syncthreads();" + parts[1] + parts[2]


def test_tiled_is_clean_under_thread_sanitizer():
    done = _run("thread", _tiled_source(), "")
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def test_removed_second_barrier_is_a_race():
    done = _run("thread", _without_second_barrier(_tiled_source()), "nosync2")
    assert "WARNING: ThreadSanitizer: data race" in done.stderr, done.stdout + done.stderr[-4000:]


def test_tiled_is_clean_under_address_sanitizer():
    done = _run("address", _tiled_source(), "")
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def test_removed_edge_check_is_an_out_of_bounds_read():
    text = _tiled_source()
    guard = "(row < M && ak < K)"
    assert guard in text
    done = _run("address", text.replace(guard, "(row < M)"), "nobounds")
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in done.stderr, done.stdout + done.stderr[-4000:]


# ---- cuda/mma.cu: cp.async, ldmatrix and mma.sync (cuda/ptx.h) -------------------------------------
# One block of 128 threads; K = 72 is 3 tiles of 32 (the last partial) through the 3-stage
# cp.async ring; K and N multiples of 8, so A and B go through cp.async (M and N edges zero-filled).
MMA_SHAPE = (40, 24, 72)
MMA_DRIVER = '#include "selfcheck_half.h"\n'
MMA_WAIT = "ptx::cp_async_wait_group<STAGES - 2>();"
MMA_BARRIER = "__syncthreads();"


def _mma_source() -> str:
    return source_path("cuda/mma.cu").read_text()


def _run_mma(sanitize: str | None, text: str, tag: str, variant: str = "threads") -> subprocess.CompletedProcess:
    try:
        program = cuda.build_emulation("cuda/mma.cu", variant=variant, sanitize=sanitize, source_text=text,
                                       main=MMA_DRIVER, executable=True, tag=tag)
    except RuntimeError as error:
        if re.search(r"cannot find -l(t|a)san|libtsan|libasan", str(error)):
            pytest.skip(f"the compiler has no {sanitize} sanitizer runtime: {str(error).splitlines()[-1]}")
        raise
    launch = cuda.plan("mma", "bfloat16", *MMA_SHAPE)
    command = [str(program), launch.kernel, "bf16", *map(str, MMA_SHAPE), *map(str, launch.grid), *map(str, launch.block)]
    env = {"TSAN_OPTIONS": "halt_on_error=0 exitcode=66 report_signal_unsafe=0", "ASAN_OPTIONS": "detect_leaks=0"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def _mma_without(text: str, what: str) -> str:
    assert text.count(what) == 1, f"mma.cu should have exactly one {what!r}"
    return text.replace(what, "// (removed) " + what)


def test_mma_is_clean_under_thread_sanitizer():
    done = _run_mma("thread", _mma_source(), "")
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def test_mma_is_clean_under_address_sanitizer():
    done = _run_mma("address", _mma_source(), "")
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def test_mma_without_the_barrier_after_wait_group_is_a_race():
    """Each thread's wait_group lands only its own copies: without the barrier, warps read with
    ldmatrix what other warps' copies are writing."""
    done = _run_mma("thread", _mma_without(_mma_source(), MMA_BARRIER), "nobarrier")
    assert "WARNING: ThreadSanitizer: data race" in done.stderr, done.stdout + done.stderr[-4000:]


def test_mma_without_wait_group_is_reported():
    """Copies land at the wait_group that covers them, so without one the tiles are read before
    they arrive: wrong results, and under ThreadSanitizer the copies, landing when their threads
    exit, race with the other threads' last reads."""
    text = _mma_without(_mma_source(), MMA_WAIT)
    fibers = _run_mma(None, text, "nowait", variant="fibers")
    assert fibers.returncode == 1, fibers.stdout + fibers.stderr[-4000:]
    done = _run_mma("thread", text, "nowait")
    assert done.returncode != 0, done.stdout + done.stderr[-4000:]
    assert "WARNING: ThreadSanitizer: data race" in done.stderr, done.stdout + done.stderr[-4000:]


# ---- cuda/wgmma.cu: mbarriers, TMA, wgmma (cuda/ptx.h, cuda/emu/include/hopper_emu.h) ------------
# One block of 384 threads (a producer and two consumer warp groups); K = 136 is 3 K tiles of 64
# (the last partial) through the 4-stage ring; N = 24 and M = 40 are partial boxes, zero-filled.
# In the threaded variant a TMA box lands at once, written by the producer thread, and only the
# full barrier's phase orders it before the consumers' wgmma reads.
WGMMA_SHAPE = (40, 24, 136)
WGMMA_DRIVER = '#include "selfcheck_tma.h"\n'
WGMMA_FULL_WAIT = "ptx::mbarrier_wait_parity(full + 8 * s, phase);"


def _wgmma_source() -> str:
    return source_path("cuda/wgmma.cu").read_text()


def _run_wgmma(sanitize: str | None, text: str, tag: str, variant: str = "threads",
               timeout: int = 300) -> subprocess.CompletedProcess:
    try:
        program = cuda.build_emulation("cuda/wgmma.cu", variant=variant, sanitize=sanitize, source_text=text,
                                       main=WGMMA_DRIVER, executable=True, tag=tag)
    except RuntimeError as error:
        if re.search(r"cannot find -l(t|a)san|libtsan|libasan", str(error)):
            pytest.skip(f"the compiler has no {sanitize} sanitizer runtime: {str(error).splitlines()[-1]}")
        raise
    launch = cuda.plan("wgmma", "bfloat16", *WGMMA_SHAPE)
    a_map, b_map = launch.args[:2]
    command = [str(program), launch.kernel, "bf16", *map(str, WGMMA_SHAPE), str(launch.grid[0]), str(launch.block[0]),
               *map(str, (a_map.box_rows, a_map.box_cols, b_map.box_rows, b_map.box_cols))]
    env = {"TSAN_OPTIONS": "halt_on_error=0 exitcode=66 report_signal_unsafe=0", "ASAN_OPTIONS": "detect_leaks=0"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def test_wgmma_is_clean_under_thread_sanitizer():
    done = _run_wgmma("thread", _wgmma_source(), "")
    assert "ThreadSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def test_wgmma_is_clean_under_address_sanitizer():
    done = _run_wgmma("address", _wgmma_source(), "")
    assert "AddressSanitizer" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def test_wgmma_without_the_full_barrier_wait_is_reported():
    """Consumers that read a stage without waiting on its full barrier: in the fibers the boxes
    land only when a thread tests that barrier, so they are never there (wrong results); under
    ThreadSanitizer the producer's TMA writes and the consumers' wgmma reads race."""
    text = _wgmma_source()
    assert text.count(WGMMA_FULL_WAIT) == 1
    text = text.replace(WGMMA_FULL_WAIT, "// (removed) " + WGMMA_FULL_WAIT)
    fibers = _run_wgmma(None, text, "nowait", variant="fibers")
    assert fibers.returncode == 1, fibers.stdout + fibers.stderr[-4000:]
    # ThreadSanitizer reports the races of the schedule it ran; in a rare schedule the OS orders
    # the consumers' reads after the copies through other synchronization, so up to 3 runs.
    outputs = []
    for _ in range(3):
        try:
            done = _run_wgmma("thread", text, "nowait", timeout=60)
        except subprocess.TimeoutExpired:
            outputs.append("(timed out)")
            continue
        if "WARNING: ThreadSanitizer: data race" in done.stderr:
            return
        outputs.append(done.stdout + done.stderr[-2000:])
    pytest.fail("no data race reported in 3 runs:\n" + "\n".join(outputs))
