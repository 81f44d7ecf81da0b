"""Mutation testing of the CUDA and Triton kernels: does a realistic bug fail a test?

Each mutant below is one edit a kernel author could make (a removed barrier, an off-by-one edge
guard, a wait count off by one...): the file, the code it replaces, the replacement, its class,
and the tests that should catch it. The code is found by its tokens, comments and layout
ignored (tests/code_edits.py): rewording a comment or reformatting a kernel leaves every mutant
applying, and a mutant whose code is gone, or now occurs a different number of times than its
``count``, stops the run instead of testing nothing.

    python scripts/mutants.py [--fast] [--only NAME[,NAME...]] [--list] [--timeout S] [--no-baseline]

The checkout is never touched: the repository's files (tracked and untracked, not ignored) are
copied into a temporary folder once, each mutant is applied to the copy, its tests run there
with pytest (the harness reads the sources of the checkout it is imported from, so the copy's
harness reads the copy's sources), and the file is restored. Emulated CUDA builds go to a cache
shared by the runs (build/mutants/cuda-emu in the checkout; every build is keyed on its full
text, so a mutant never reuses another's). A test run that passes past --timeout counts as
caught (a hang is caught). First, unless --no-baseline, every selected mutant's tests run on
the unmutated copy and must pass: a mutant "caught" by a test that fails anyway proves nothing.

Classes: correctness (wrong results), race (wrong only in some schedules), hang (a deadlock),
performance (right results, slower). Every correctness, race and hang mutant must be caught
without a GPU; a performance mutant is caught where a SASS or resource assertion can see it
(`seen_by` names it) and otherwise listed as invisible. Exit status: 0 when every mutant that
must be caught was, 1 otherwise, 2 for bad arguments or a mutant that no longer applies.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from code_edits import find_code, language_of, replace_code  # noqa: E402  (the tests' own helper)

CLASSES = ("correctness", "race", "hang", "performance")


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str  # code, matched by its tokens wherever it occurs
    new: str  # inserted as written
    kind: str  # one of CLASSES
    tests: tuple  # pytest arguments: files, node ids, -k expressions; () where none can see it
    fast: bool = False  # in the subset CI runs (tests/test_mutants.py)
    why: str = ""  # for a performance mutant no test can see: what it costs
    count: int = 1  # how many places ``old`` matches

    def occurrences(self, root: Path) -> int:
        return len(find_code((root / self.file).read_text(), self.old, language_of(self.file)))

    def applied_to(self, text: str) -> str:
        return replace_code(text, self.old, self.new, language=language_of(self.file), count=self.count)


EMULATED = "tests/test_cuda_emulated.py::test_emulated_matches_reference"
SAN = "tests/test_cuda_sanitizers.py"
WG = "tests/test_wgmma_emulation.py"
PTX = "tests/test_ptx_emulation.py"
SASS = "tests/test_sass.py"
WRAPPERS = "tests/test_ptx_wrappers.py"
TRITON = "tests/test_triton.py"
SHARED = "tests/test_cuda_compile.py::test_static_shared_memory_is_what_each_header_states"
MMA_BARRIER = "__syncthreads();\n"
MMA_PREFETCH = "if (t + STAGES - 1 < k_tiles) load_tile(t + STAGES - 1, (t + STAGES - 1) % STAGES);\n"
WG_WAIT = "ptx::wgmma_wait_group<1>();\n"
WG_RELEASE = "if (previous >= 0 && lane == 0) ptx::mbarrier_arrive(empty + 8 * previous);\n"
TILED_DOT = "for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];\n"

MUTANTS = [
    # ---- cuda/naive.cu, cuda/tiled.cu ------------------------------------------------------------------
    Mutant(
        "naive-row-guard-off-by-one",
        "cuda/naive.cu",
        "if (row >= M || col >= N) return;",
        "if (row > M || col >= N) return;",
        "correctness",
        (SAN + "::test_every_kernel_is_clean_under_address_sanitizer", "-k", "naive"),
    ),
    Mutant(
        "tiled-second-barrier-removed",
        "cuda/tiled.cu",
        TILED_DOT + "__syncthreads();",  # the second of the two: after the products
        TILED_DOT,
        "race",
        (
            "tests/test_cuda_emulated.py",
            "-k",
            "cuda.tiled and float32",
            SAN + "::test_tiled_is_clean_under_thread_sanitizer",
        ),
    ),
    Mutant(
        "tiled-a-edge-guard-removed",
        "cuda/tiled.cu",
        "(row < M && ak < K)",
        "(row < M)",
        "correctness",
        (SAN + "::test_tiled_is_clean_under_address_sanitizer",),
    ),
    # ---- cuda/register_tiled.cu -----------------------------------------------------------------------
    Mutant(
        "register-tiled-16-byte-read-past-a-row",
        "cuda/register_tiled.cu",
        "const bool vec_a = (K % 4 == 0) && aligned16(A);",
        "const bool vec_a = aligned16(A);",
        "correctness",
        (SAN + "::test_every_kernel_is_clean_under_address_sanitizer", "-k", "register_tiled-float32"),
    ),
    Mutant(
        "register-tiled-barrier-removed",
        "cuda/register_tiled.cu",
        "__syncthreads(); buf ^= 1;",
        "buf ^= 1;",
        "race",
        (EMULATED, "-k", "cuda.register_tiled- and float32"),
    ),
    Mutant(
        "register-tiled-padding-lost",
        "cuda/register_tiled.cu",
        "#define A_PAD 4 ",
        "#define A_PAD 0 ",
        "performance",
        (SHARED,),
        why="the two A loaders' transposed stores conflict in the same banks",
    ),
    Mutant(
        "register-tiled-2x2-b-column-guard-removed",
        "cuda/register_tiled.cu",
        "Bs[ty][tx + j * T2] = (k < K && c < N) ?",
        "Bs[ty][tx + j * T2] = (k < K) ?",
        "correctness",
        (SAN + "::test_every_kernel_is_clean_under_address_sanitizer", "-k", "register_tiled_2x2"),
    ),
    # ---- cuda/wmma.cu -----------------------------------------------------------------------------------
    Mutant(
        "wmma-a-edge-guard-off-by-one",
        "cuda/wmma.cu",
        "const int valid = row0 + r < M ? K - k : 0;",
        "const int valid = row0 + r <= M ? K - k : 0;",
        "correctness",
        (SAN + "::test_every_kernel_is_clean_under_address_sanitizer", "-k", "wmma"),
        fast=True,
    ),
    Mutant(
        "wmma-epilogue-syncwarp-removed",
        "cuda/wmma.cu",
        "wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major); __syncwarp();",
        "wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);",
        "race",
        (EMULATED, "-k", "cuda.wmma and bfloat16"),
    ),
    Mutant(
        "wmma-second-epilogue-syncwarp-removed",
        "cuda/wmma.cu",
        "__syncwarp(); } }",  # the one that ends the epilogue's loop body
        "} }",
        "race",
        (EMULATED, "-k", "cuda.wmma and bfloat16"),
    ),
    Mutant(
        "wmma-main-loop-barrier-removed",
        "cuda/wmma.cu",
        "__syncthreads(); buf ^= 1;",
        "buf ^= 1;",
        "race",
        (EMULATED, "-k", "cuda.wmma and float16"),
    ),
    Mutant(
        "wmma-padding-lost",
        "cuda/wmma.cu",
        "#define A_LD (BLOCK_K + 8)",
        "#define A_LD (BLOCK_K)",
        "performance",
        (SHARED,),
        why="bank conflicts on the A fragment loads",
    ),
    # ---- cuda/gemv.cu -----------------------------------------------------------------------------------
    Mutant(
        "gemv-shuffle-mask-16-of-32-lanes",
        "cuda/gemv.cu",
        "__shfl_xor_sync(0xffffffffu, acc, offset)",
        "__shfl_xor_sync(0x0000ffffu, acc, offset)",
        "correctness",
        (EMULATED, "-k", "cuda.gemv and float32"),
        fast=True,
    ),
    Mutant(
        "gemv-reduction-one-step-short",
        "cuda/gemv.cu",
        "for (int offset = 16; offset > 0;",
        "for (int offset = 8; offset > 0;",
        "correctness",
        (EMULATED, "-k", "cuda.gemv and bfloat16"),
    ),
    Mutant(
        "gemv-cache-hints-swapped",
        "cuda/gemv.cu",
        "wv[u] = __ldcs(w4 + i + 32 * u);\n                xv[u] = __ldg(x4 + i + 32 * u);",
        "wv[u] = __ldg(w4 + i + 32 * u);\n                xv[u] = __ldcs(x4 + i + 32 * u);",
        "performance",
        (),
        why="W (used once) kept in cache, x (used by every warp) evicted first; the SASS has the same "
        "loads, only their address operands say which matrix each reads",
    ),
    # ---- cuda/mma.cu --------------------------------------------------------------------------------------
    Mutant(
        "mma-barrier-after-wait-group-removed",
        "cuda/mma.cu",
        MMA_BARRIER + MMA_PREFETCH,
        MMA_PREFETCH,
        "race",
        (SAN + "::test_mma_is_clean_under_thread_sanitizer",),
    ),
    Mutant(
        "mma-prefetch-above-its-barrier",
        "cuda/mma.cu",
        MMA_BARRIER + MMA_PREFETCH,
        MMA_PREFETCH + MMA_BARRIER,
        "race",
        (SAN + "::test_mma_is_clean_under_thread_sanitizer",),
    ),
    Mutant(
        "mma-wait-group-count-off-by-one",
        "cuda/mma.cu",
        "ptx::cp_async_wait_group<STAGES - 2>();",
        "ptx::cp_async_wait_group<STAGES - 1>();",
        "correctness",
        (EMULATED, "-k", "cuda.mma and bfloat16"),
        fast=True,
    ),
    Mutant(
        "mma-wait-group-drains-the-ring",
        "cuda/mma.cu",
        "ptx::cp_async_wait_group<STAGES - 2>();",
        "ptx::cp_async_wait_group<0>();",
        "performance",
        ("tests/test_cuda_compile.py::test_mma_keeps_one_tile_in_flight_while_it_computes",),
        why="no copy in flight while the tensor cores work",
    ),
    Mutant(
        "mma-ldmatrix-lane-address",
        "cuda/mma.cu",
        "const int ld_row = lane % 16, ld_chunk = lane / 16;",
        "const int ld_row = lane % 8, ld_chunk = lane / 16;",
        "correctness",
        (EMULATED, "-k", "cuda.mma and float16"),
    ),
    Mutant(
        "mma-a-row-guard-removed",
        "cuda/mma.cu",
        "row < M ? K - k : 0, vec_a);",
        "K - k, vec_a);",
        "correctness",
        (SAN + "::test_mma_is_clean_under_address_sanitizer",),
    ),
    Mutant(
        "mma-swizzle-adds-bank-conflicts",
        "cuda/mma.cu",
        "((chunk ^ ((row >> 1) & 3)) << 4)",
        "((chunk ^ (row & 3)) << 4)",
        "performance",
        (),
        why="rows r and r + 2 of an ldmatrix land in the same banks (2-way conflicts); no SASS or resource figure shows it",
    ),
    # ---- cuda/wgmma.cu -------------------------------------------------------------------------------------
    Mutant(
        "wgmma-full-barrier-wait-removed",
        "cuda/wgmma.cu",
        "ptx::mbarrier_wait_parity(full + 8 * s, phase);",
        "",
        "race",
        (WG + "::test_pipeline_is_right_whenever_the_copies_land",),
    ),
    Mutant(
        "wgmma-stage-released-before-wait-group",
        "cuda/wgmma.cu",
        WG_WAIT + WG_RELEASE,
        WG_RELEASE + WG_WAIT,
        "race",
        (WG + "::test_pipeline_is_right_whenever_the_copies_land",),
        fast=True,
    ),
    Mutant(
        "wgmma-wait-group-count-off-by-one",
        "cuda/wgmma.cu",
        "ptx::wgmma_wait_group<1>();",
        "ptx::wgmma_wait_group<2>();",
        "race",
        (WG + "::test_pipeline_is_right_whenever_the_copies_land",),
    ),
    Mutant(
        "wgmma-wait-group-drains",
        "cuda/wgmma.cu",
        "ptx::wgmma_wait_group<1>();",
        "ptx::wgmma_wait_group<0>();",
        "performance",
        ("tests/test_cuda_compile.py::test_wgmma_keeps_one_group_in_flight_while_it_issues_the_next",),
        why="the tensor cores idle while the consumer waits for its own last group",
    ),
    Mutant(
        "wgmma-fence-missing",
        "cuda/wgmma.cu",
        "ptx::wgmma_fence();",
        "",
        "correctness",
        (WG + "::test_persistent_blocks_walk_many_tiles",),
    ),
    Mutant(
        "wgmma-expect-tx-one-box-short",
        "cuda/wgmma.cu",
        "mbarrier_arrive_expect_tx(full + 8 * s, STAGE_BYTES)",
        "mbarrier_arrive_expect_tx(full + 8 * s, STAGE_BYTES - B_BOX_BYTES)",
        "hang",
        (WG + "::test_pipeline_is_right_whenever_the_copies_land",),
    ),
    Mutant(
        "wgmma-a-sbo",
        "cuda/wgmma.cu",
        "ptx::wgmma_descriptor(a_stage + kk * 32, 16, 1024,",
        "ptx::wgmma_descriptor(a_stage + kk * 32, 16, 512,",
        "correctness",
        (WG + "::test_persistent_blocks_walk_many_tiles",),
    ),
    Mutant(
        "wgmma-b-lbo",
        "cuda/wgmma.cu",
        "B_BOX_BYTES, 1024, ptx::kSwizzle128B)",
        "B_BOX_BYTES / 2, 1024, ptx::kSwizzle128B)",
        "correctness",
        (WG + "::test_persistent_blocks_walk_many_tiles",),
    ),
    Mutant(
        "wgmma-setmaxnreg-unbalanced",
        "cuda/wgmma.cu",
        "ptx::setmaxnreg_inc<232>();",
        "ptx::setmaxnreg_inc<240>();",
        "hang",
        (WG + "::test_persistent_blocks_walk_many_tiles",),
    ),
    Mutant(
        "wgmma-producer-parity-not-flipped",
        "cuda/wgmma.cu",
        "ptx::mbarrier_wait_parity(empty + 8 * s, phase ^ 1);",
        "ptx::mbarrier_wait_parity(empty + 8 * s, phase);",
        "hang",
        (WG + "::test_persistent_blocks_walk_many_tiles",),
    ),
    Mutant(
        "wgmma-consumer-parity-flipped",
        "cuda/wgmma.cu",
        "ptx::mbarrier_wait_parity(full + 8 * s, phase);",
        "ptx::mbarrier_wait_parity(full + 8 * s, phase ^ 1);",
        "race",
        (WG + "::test_persistent_blocks_walk_many_tiles",),
    ),
    Mutant(
        "wgmma-scheduler-drops-the-remainder",
        "cuda/wgmma.cu",
        "tile < tiles; tile += gridDim.x",
        "tile < tiles / int(gridDim.x) * int(gridDim.x); tile += gridDim.x",
        "correctness",
        (WG + "::test_pipeline_is_right_whenever_the_copies_land",),
        fast=True,
        count=2,
    ),
    Mutant(
        "wgmma-epilogue-column-guard-removed",
        "cuda/wgmma.cu",
        "if (row >= M || col >= N) continue;",
        "if (row >= M) continue;",
        "correctness",
        (SAN + "::test_wgmma_is_clean_under_address_sanitizer",),
    ),
    # ---- cuda/ptx.h: the inline PTX (the emulation replaces it; checked through SASS and PTX text) -------------
    Mutant(
        "ptx-mma-b-registers-swapped",
        "cuda/ptx.h",
        '"r"(b[0]), "r"(b[1]),',
        '"r"(b[1]), "r"(b[0]),',
        "correctness",
        (WRAPPERS,),
        count=2,
    ),
    Mutant(
        "ptx-wgmma-b-transpose-cleared",
        "cuda/ptx.h",
        "p, 1, 1, 0, 1;",
        "p, 1, 1, 0, 0;",
        "correctness",
        (WRAPPERS, SASS + "::test_wgmma_sass_has_the_sources_wait_counts_register_budget_and_b_transpose"),
    ),
    Mutant(
        "ptx-commit-group-emits-nothing",
        "cuda/ptx.h",
        'asm volatile("cp.async.commit_group;" ::: "memory");',
        'asm volatile("" ::: "memory");',
        "correctness",
        (WRAPPERS, SASS + "::test_mma_sass_has_the_sources_cp_async_groups_and_wait_counts"),
    ),
    Mutant(
        "ptx-try-wait-predicate-inverted",
        "cuda/ptx.h",
        "selp.u32 %0, 1, 0, p;",
        "selp.u32 %0, 0, 1, p;",
        "race",
        (WRAPPERS,),
    ),
    Mutant(
        "ptx-cp-async-ca-for-cg",
        "cuda/ptx.h",
        "cp.async.cg.shared.global [%0], [%1], 16, %2;",
        "cp.async.ca.shared.global [%0], [%1], 16, %2;",
        "performance",
        (SASS,),
        why="the copies also fill L1, which nothing rereads",
    ),
    # ---- triton/ ---------------------------------------------------------------------------------------------
    Mutant(
        "triton-k-mask-against-k",
        "triton/matmul.py",
        "< k_left, other=0.0)",
        "< K, other=0.0)",
        "correctness",
        (TRITON + "::test_matmul_shapes_and_dtypes",),
        count=2,
    ),
    Mutant(
        "triton-k-tail-without-other",
        "triton/matmul.py",
        "b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)",
        "b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left)",
        "correctness",
        (TRITON + "::test_matmul_shapes_and_dtypes",),
    ),
    Mutant(
        "triton-rows-past-m-not-wrapped",
        "triton/matmul.py",
        "offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M",
        "offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "correctness",
        (TRITON + "::test_matmul_shapes_and_dtypes",),
    ),
    Mutant(
        "triton-fp32-as-tf32",
        "triton/matmul.py",
        '"INPUT_PRECISION": "tf32" if (dtype != torch.float32 or allow_tf32) else "ieee",',
        '"INPUT_PRECISION": "tf32",',
        "correctness",
        (TRITON,),
    ),
    Mutant(
        "triton-gemv-k-mask-against-k",
        "triton/gemv.py",
        "k_ok = offs_k < K - k * BLOCK_K",
        "k_ok = offs_k < K",
        "correctness",
        (TRITON + "::test_gemv_shapes_and_dtypes",),
    ),
    Mutant(
        "triton-tma-persistent-loop-skips-the-last-tile",
        "triton/matmul_tma.py",
        "tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS",
        "tl.range(tl.program_id(0), tiles_m * tiles_n - 1, NUM_PROGRAMS",
        "correctness",
        (TRITON + "::test_matmul_tma_persistent_loop", TRITON + "::test_matmul_tma_shapes_and_dtypes"),
    ),
]


def must_be_caught(mutant: Mutant) -> bool:
    return mutant.kind != "performance"


# ---- running --------------------------------------------------------------------------------------------
# The copy's harness must be the one imported: the checkout's editable install puts a finder in
# front of sys.path, which is taken out here before pytest imports anything.
BOOTSTRAP = (
    "import os, sys; sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith('_editable_')]; "
    "sys.path.insert(0, '.'); os.environ['MATMUL_TESTED_CHECKOUT'] = os.getcwd(); "
    "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
)  # MATMUL_TESTED_CHECKOUT: tests/conftest.py does the same in pytest-xdist's workers


def repository_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def make_copy(destination: Path, cache: Path) -> None:
    for name in repository_files():
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)  # the mtimes too: the C library's staleness check compares them
    (destination / "build").mkdir(exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    (destination / "build" / "cuda-emu").symlink_to(cache, target_is_directory=True)


@dataclass
class Outcome:
    caught: bool
    by: str
    seconds: float


def run_tests(copy: Path, tests: tuple, timeout: float) -> Outcome:
    """Runs pytest on ``tests`` in the copy. Caught: a test failed, or the run passed the timeout."""
    if not tests:
        return Outcome(False, "", 0.0)
    command = [
        sys.executable,
        "-c",
        BOOTSTRAP,
        "-q",
        "-x",
        "-rfE",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",  # a few tests each: starting xdist workers would cost more than it saves
        "-m",
        "",  # the tests named run whatever their tier (the sanitizer runs are in the full one)
        *tests,
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("MATMUL_EMU_ASYNC", None)  # the tests choose
    start = time.monotonic()
    process = subprocess.Popen(
        command, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the whole session: pytest and the programs it started
        process.communicate()
        return Outcome(True, f"timeout after {timeout:.0f} s (a hang)", time.monotonic() - start)
    seconds = time.monotonic() - start
    if process.returncode == 0:
        return Outcome(False, "", seconds)
    if process.returncode == 5:
        return Outcome(False, "no test selected (the selection is stale)", seconds)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M)
    if failed:
        return Outcome(True, failed[0], seconds)
    if process.returncode < 0:
        return Outcome(True, f"pytest killed by signal {-process.returncode} (a crash)", seconds)
    return Outcome(
        True, f"pytest exit {process.returncode}: {output.strip().splitlines()[-1] if output.strip() else ''}", seconds
    )


def apply(copy: Path, mutant: Mutant) -> str:
    """Applies ``mutant`` in the copy; returns the file's original text."""
    path = copy / mutant.file
    original = path.read_text()
    path.write_text(mutant.applied_to(original))
    return original


def stale(mutant: Mutant, root: Path) -> str | None:
    """Why ``mutant`` no longer applies to the sources under ``root``, or None."""
    found = mutant.occurrences(root)
    if found == mutant.count:
        return None
    return f"{mutant.name}: {mutant.file} has {found} place(s) with the code {mutant.old!r}, the mutant says {mutant.count}"


def table(rows: list[tuple[Mutant, Outcome]]) -> str:
    lines = ["| mutant | class | result | by | seconds |", "|---|---|---|---|---|"]
    for mutant, outcome in rows:
        if outcome.caught:
            result = "caught"
        elif mutant.kind == "performance":
            result = "missed" if mutant.tests else "not visible to any test"
        else:
            result = "**MISSED**"
        by = outcome.by or (mutant.why if mutant.kind == "performance" else "")
        lines.append(f"| `{mutant.name}` | {mutant.kind} | {result} | {by} | {outcome.seconds:.0f} |")
    caught = [m for m, o in rows if o.caught and must_be_caught(m)]
    required = [m for m, _ in rows if must_be_caught(m)]
    performance = [m for m, o in rows if m.kind == "performance"]
    seen = [m for m, o in rows if m.kind == "performance" and o.caught]
    lines.append("")
    lines.append(
        f"correctness/race/hang: {len(caught)} of {len(required)} caught; "
        f"performance: {len(seen)} of {len(performance)} seen by a SASS or resource assertion"
    )
    return "\n".join(lines)


def select(args) -> list[Mutant]:
    chosen = [m for m in MUTANTS if not args.fast or m.fast]
    if args.only:
        names = {n for part in args.only for n in part.split(",") if n}
        unknown = names - {m.name for m in MUTANTS}
        if unknown:
            raise SystemExit(f"no mutant named {', '.join(sorted(unknown))} (see --list)")
        chosen = [m for m in MUTANTS if m.name in names]
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="only the subset CI runs")
    parser.add_argument("--only", action="append", default=[], metavar="NAME[,NAME...]", help="only these mutants")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per mutant's tests (past it: a hang, caught)"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated copy first")
    parser.add_argument(
        "--cache",
        type=Path,
        default=ROOT / "build" / "mutants" / "cuda-emu",
        help="emulated CUDA builds shared between runs",
    )
    args = parser.parse_args(argv)
    chosen = select(args)
    if args.list:
        for m in chosen:
            print(f"{m.name:52s} {m.kind:12s} {m.file:24s} {'fast ' if m.fast else ''}{' '.join(m.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="matmul-mutants-") as temporary:
        copy = Path(temporary) / "repository"
        make_copy(copy, args.cache.resolve())
        for m in chosen:  # every mutant still applies before anything runs
            if reason := stale(m, copy):
                print(f"{reason}: update scripts/mutants.py", file=sys.stderr)
                return 2
        if not args.no_baseline:
            selections = sorted({m.tests for m in chosen if m.tests})
            for tests in selections:
                outcome = run_tests(copy, tests, args.timeout)
                if outcome.caught:
                    print(f"the unmutated sources fail {' '.join(tests)}: {outcome.by}", file=sys.stderr)
                    return 1
            print(f"baseline: {len(selections)} test selections pass on the unmutated sources", flush=True)
        rows = []
        for m in chosen:
            original = apply(copy, m)
            try:
                outcome = run_tests(copy, m.tests, args.timeout)
            finally:
                (copy / m.file).write_text(original)
            rows.append((m, outcome))
            print(
                f"{m.name}: {'caught by ' + outcome.by if outcome.caught else 'not caught'} ({outcome.seconds:.0f} s)",
                flush=True,
            )
    print()
    print(table(rows))
    return 0 if all(o.caught for m, o in rows if must_be_caught(m)) else 1


if __name__ == "__main__":
    sys.exit(main())
