"""The emulation's threaded variant under ThreadSanitizer and AddressSanitizer.

With EMU_THREADS every CUDA thread is an OS thread and __syncthreads a mutex/condition-variable
barrier, so the sanitizers see real happens-before edges. The chapter's tiled kernel runs clean
under both; with its second __syncthreads removed, ThreadSanitizer reports the race the chapter
describes (fast threads overwriting the tile under slow ones); with its edge check on A removed,
AddressSanitizer reports the out-of-bounds read. cuda/mma.cu (cp.async, ldmatrix, mma.sync) runs
clean under both too; without the barrier after its cp.async.wait_group ThreadSanitizer reports
a race, and without the wait_group the results are wrong (and the late copies race).

The pipelined kernels run at shapes that refill every stage of their rings several times, and
wgmma.cu with more tiles than blocks (tiles % grid != 0), under ThreadSanitizer once with the
copies landing as late as allowed (MATMUL_EMU_ASYNC=wait) and once at issue (=issue), where a
refill that comes before the readers released the stage is a race. Every kernel of cuda/ has
an AddressSanitizer run at ragged shapes. A deadlock in the threaded build is reported by its
watchdog, with what every thread waits on, instead of hanging.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from code_edits import replace_code

from harness.backends.cuda import emulation, plans
from harness.env.sources import source_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        emulation.emulation_unavailable_reason() is not None, reason=str(emulation.emulation_unavailable_reason())
    ),
]

SHAPE = (32, 32, 40)  # 2 x 2 blocks of 256 threads, 3 phases along K (the last one partial)
DRIVER = '#include "selfcheck.h"\n'


def _tiled_source() -> str:
    return source_path("cuda/tiled.cu").read_text()


def _program(relative: str, sanitize: str | None, text: str, driver: str, tag: str, variant: str = "threads"):
    try:
        return emulation.build_emulation(
            relative, variant=variant, sanitize=sanitize, source_text=text, main=driver, executable=True, tag=tag
        )
    except RuntimeError as error:
        if re.search(r"cannot find -l(t|a)san|libtsan|libasan", str(error)):
            pytest.skip(f"the compiler has no {sanitize} sanitizer runtime: {str(error).splitlines()[-1]}")
        raise


def _execute(command: list[str], landing: str = "wait", timeout: int = 300, watchdog: float | None = None):
    # halt_on_error=0 / exitcode: let TSan report and still finish, so the output is complete.
    env = {
        "TSAN_OPTIONS": "halt_on_error=0 exitcode=66 report_signal_unsafe=0",
        "ASAN_OPTIONS": "detect_leaks=0",
        "MATMUL_EMU_ASYNC": landing,
    }
    if watchdog is not None:
        env["MATMUL_EMU_WATCHDOG_S"] = str(watchdog)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def _run(sanitize: str, text: str, tag: str) -> subprocess.CompletedProcess:
    program = _program("cuda/tiled.cu", sanitize, text, DRIVER, tag)
    launch = plans.plan("tiled", "float32", *SHAPE)
    return _execute([str(program), launch.kernel, *map(str, SHAPE), *map(str, launch.grid), *map(str, launch.block)])


def _mutated(text: str, old: str, new: str) -> str:
    return replace_code(text, old, new)  # found by its code: comments and layout do not matter


def _clean(done: subprocess.CompletedProcess, sanitizer: str) -> None:
    assert sanitizer not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]


def _races(done: subprocess.CompletedProcess) -> bool:
    return "WARNING: ThreadSanitizer: data race" in done.stderr


TILED_DOT = "for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];"


def _without_second_barrier(text: str) -> str:
    """tiled.cu without the barrier after the products (the one before the next phase's loads)."""
    return _mutated(text, TILED_DOT + " __syncthreads();", TILED_DOT)


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
    done = _run("address", _mutated(_tiled_source(), "(row < M && ak < K)", "(row < M)"), "nobounds")
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in done.stderr, done.stdout + done.stderr[-4000:]


# ---- every kernel under AddressSanitizer, at ragged shapes ---------------------------------------------
# (technique, dtype, shape): edges in M, N and K that are not multiples of the tiles, with K and N
# multiples of the vector widths (the 16-byte paths) and not (the element-by-element paths).
ASAN_CASES = [
    ("naive", "float32", (33, 17, 20)),
    ("register_tiled_2x2", "float32", (33, 37, 41)),
    ("register_tiled", "float32", (130, 36, 37)),  # K % 4 != 0: A element by element, B and C as float4
    ("register_tiled", "float32", (33, 37, 44)),  # N % 4 != 0: B and C element by element, A as float4
    ("wmma", "bfloat16", (40, 24, 40)),  # 16-byte paths, partial tiles in M and N
    ("wmma", "float16", (33, 30, 21)),  # element by element
    ("gemv", "bfloat16", (1, 33, 264)),  # 16-byte loads
    ("gemv", "float32", (1, 9, 37)),  # element by element
]
_SUFFIX = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _asan_command(technique: str, dtype: str, shape, text: str | None = None, tag: str = "") -> list[str]:
    relative = "cuda/" + ("register_tiled" if technique.startswith("register_tiled") else technique) + ".cu"
    source = source_path(relative).read_text() if text is None else text
    m, n, k = shape
    launch = plans.plan(technique, dtype, m, n, k)
    if technique == "gemv":
        program = _program(relative, "address", source, '#include "selfcheck_gemv.h"\n', tag)
        return [str(program), launch.kernel, _SUFFIX[dtype], str(n), str(k), str(launch.grid[0]), str(launch.block[0])]
    if dtype == "float32":
        program = _program(relative, "address", source, DRIVER, tag)
        return [str(program), launch.kernel, *map(str, shape), *map(str, launch.grid), *map(str, launch.block)]
    program = _program(relative, "address", source, '#include "selfcheck_half.h"\n', tag)
    return [
        str(program),
        launch.kernel,
        _SUFFIX[dtype],
        *map(str, shape),
        *map(str, launch.grid),
        *map(str, launch.block),
    ]


@pytest.mark.parametrize(
    "technique, dtype, shape", ASAN_CASES, ids=[f"{t}-{d}-{'x'.join(map(str, s))}" for t, d, s in ASAN_CASES]
)
def test_every_kernel_is_clean_under_address_sanitizer(technique, dtype, shape):
    _clean(_execute(_asan_command(technique, dtype, shape)), "AddressSanitizer")


def test_wmma_a_edge_guard_off_by_one_is_an_out_of_bounds_read():
    """Row M of A is staged too: the results are right (that row feeds no output), the read is not."""
    text = _mutated(
        source_path("cuda/wmma.cu").read_text(),
        "const int valid = row0 + r < M ? K - k : 0;",
        "const int valid = row0 + r <= M ? K - k : 0;",
    )
    done = _execute(_asan_command("wmma", "bfloat16", (40, 24, 40), text, "a-guard"))
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in done.stderr, done.stdout + done.stderr[-4000:]


# ---- cuda/mma.cu: cp.async, ldmatrix and mma.sync (cuda/ptx.h) -------------------------------------
# One block of 128 threads; K = 256 is 8 tiles of 32 through the 3-stage cp.async ring (every
# stage refilled twice); K and N multiples of 8, so A and B go through cp.async (M and N edges
# zero-filled).
MMA_SHAPE = (40, 24, 256)
MMA_DRIVER = '#include "selfcheck_half.h"\n'
MMA_WAIT = "ptx::cp_async_wait_group<STAGES - 2>();"
MMA_BARRIER = "__syncthreads();"


def _mma_source() -> str:
    return source_path("cuda/mma.cu").read_text()


def _run_mma(
    sanitize: str | None, text: str, tag: str, variant: str = "threads", landing: str = "wait"
) -> subprocess.CompletedProcess:
    program = _program("cuda/mma.cu", sanitize, text, MMA_DRIVER, tag, variant)
    launch = plans.plan("mma", "bfloat16", *MMA_SHAPE)
    return _execute(
        [str(program), launch.kernel, "bf16", *map(str, MMA_SHAPE), *map(str, launch.grid), *map(str, launch.block)],
        landing,
    )


def _mma_without(text: str, what: str) -> str:
    return _mutated(text, what, "")


@pytest.mark.parametrize("landing", ["wait", "issue"])
def test_mma_is_clean_under_thread_sanitizer(landing):
    _clean(_run_mma("thread", _mma_source(), "", landing=landing), "ThreadSanitizer")


def test_mma_prefetch_above_its_barrier_is_a_race():
    """The next tile's copies issued before the barrier that says every warp is done with the
    stage they refill: landing at issue, they overwrite it under the warps still reading it."""
    load = "if (t + STAGES - 1 < k_tiles) load_tile(t + STAGES - 1, (t + STAGES - 1) % STAGES);"
    text = _mutated(_mma_source(), MMA_BARRIER + load, load + MMA_BARRIER)
    assert _races(_run_mma("thread", text, "hoisted", landing="issue"))


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
# Blocks of 384 threads (a producer and two consumer warp groups); 2 x 2 = 4 tiles of 128 x 256
# on 3 persistent blocks (block 0 walks two), K = 320 is 5 K tiles of 64 through the 4-stage ring
# (block 0's ring wraps twice); M = 200 and N = 300 end in partial boxes, zero-filled. In the
# threaded variant a TMA box is written by the producer thread, and only the full barrier's
# phase orders it before the consumers' wgmma reads.
WGMMA_SHAPE = (200, 300, 320)
WGMMA_DRIVER = '#include "selfcheck_tma.h"\n'
WGMMA_FULL_WAIT = "ptx::mbarrier_wait_parity(full + 8 * s, phase);"


def _wgmma_source() -> str:
    return source_path("cuda/wgmma.cu").read_text()


def _run_wgmma(
    sanitize: str | None,
    text: str,
    tag: str,
    variant: str = "threads",
    timeout: int = 300,
    landing: str = "wait",
    watchdog: float | None = None,
) -> subprocess.CompletedProcess:
    program = _program("cuda/wgmma.cu", sanitize, text, WGMMA_DRIVER, tag, variant)
    launch = plans.plan("wgmma", "bfloat16", *WGMMA_SHAPE)
    assert launch.grid[0] == 3 and (plans.cdiv(WGMMA_SHAPE[0], 128) * plans.cdiv(WGMMA_SHAPE[1], 256)) % 3 != 0
    a_map, b_map = launch.args[:2]
    command = [
        str(program),
        launch.kernel,
        "bf16",
        *map(str, WGMMA_SHAPE),
        str(launch.grid[0]),
        str(launch.block[0]),
        *map(str, (a_map.box_rows, a_map.box_cols, b_map.box_rows, b_map.box_cols)),
    ]
    return _execute(command, landing, timeout, watchdog)


@pytest.mark.parametrize("landing", ["wait", "issue"])
def test_wgmma_is_clean_under_thread_sanitizer(landing):
    _clean(_run_wgmma("thread", _wgmma_source(), "", landing=landing), "ThreadSanitizer")


def test_wgmma_is_clean_under_address_sanitizer():
    _clean(_run_wgmma("address", _wgmma_source(), ""), "AddressSanitizer")


def test_wgmma_stage_released_before_its_wgmmas_completed_is_a_race():
    """A consumer that releases the previous stage before wgmma.wait_group says its wgmmas are
    done: the producer's refill (landing at issue) writes what those wgmmas still read."""
    wait = "ptx::wgmma_wait_group<1>();"
    release = "if (previous >= 0 && lane == 0) ptx::mbarrier_arrive(empty + 8 * previous);"
    text = _mutated(_wgmma_source(), wait + release, release + wait)
    assert _races(_run_wgmma("thread", text, "early-release", landing="issue"))


def test_a_register_budget_that_cannot_be_met_is_a_reported_deadlock():
    """setmaxnreg.inc 240 for 256 consumer threads needs 18,432 registers from a pool that the
    producer's .dec 40 filled with 16,384: on the GPU the second consumer group spins forever.
    The threaded build's watchdog says so, with every thread's wait, instead of hanging."""
    text = _mutated(_wgmma_source(), "ptx::setmaxnreg_inc<232>();", "ptx::setmaxnreg_inc<240>();")
    done = _run_wgmma(None, text, "inc240", timeout=120, watchdog=2)
    assert done.returncode == 3, done.stdout + done.stderr[-4000:]
    assert "deadlock" in done.stderr and "setmaxnreg.inc 240" in done.stderr, done.stderr[-4000:]


def test_wgmma_without_the_full_barrier_wait_is_reported():
    """Consumers that read a stage without waiting on its full barrier: in the fibers the boxes
    land only when a thread tests that barrier, so they are never there (wrong results, or, once
    the ring wraps, the producer's next arrival on a phase still waiting for its bytes, an
    error); under ThreadSanitizer the producer's TMA writes and the consumers' wgmma reads race."""
    text = _mutated(_wgmma_source(), WGMMA_FULL_WAIT, "")
    fibers = _run_wgmma(None, text, "nowait", variant="fibers")
    assert fibers.returncode in (1, 3), fibers.stdout + fibers.stderr[-4000:]  # wrong, or the launch failed
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
        # or the schedule ran the producer a lap ahead, which the emulation's mbarrier refuses
        # loudly before the race happens: the missing wait is reported all the same
        if done.returncode != 0 and "an arrival beyond the init count" in done.stdout + done.stderr:
            return
        outputs.append(done.stdout + done.stderr[-2000:])
    pytest.fail("no data race (nor the emulation's refusal) reported in 3 runs:\n" + "\n".join(outputs))
