"""An oracle the kernels' authors did not write: CUTLASS's CuTe against cuda/wgmma.cu's descriptors,
the emulation's shared-memory address mapping and the mma.sync fragment tables.

cuda/wgmma.cu builds its wgmma descriptors by hand (start address, leading and stride byte
offsets, the 128-byte swizzle), and the CPU emulation reads shared memory through them with a
mapping written by the same authors from the same reading of the PTX ISA: the two could agree
and both be wrong. CuTe (header-only, compiled here on the host; the nvidia-cutlass package
ships it) describes the same shared-memory tiles with its own swizzle atoms
(GMMA::Layout_K_SW128_Atom for A, Layout_MN_SW128_Atom for B, each tiled the way the TMA boxes
land) and derives the descriptor's fields from the layout itself (make_gmma_desc). This test
compares, for every k-step of a stage:
- the descriptor fields CuTe derives with the ones the kernel's own expressions produce, and
- the byte offset of every element (row or column, k) in CuTe's swizzled layout with the
  address the emulation's wgmma reads it from.
The kernel's descriptor expressions are read from cuda/wgmma.cu, so an edit of them (a wrong
LBO or SBO) is judged here too.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from code_edits import replace_code

from harness.backends.cuda import emulation, plans, toolkit
from harness.env.sources import source_path


def _cute_include() -> Path | None:
    try:
        import cutlass_library
    except ImportError:
        return None
    include = Path(cutlass_library.__file__).parent / "source" / "include"
    return include if (include / "cute" / "tensor.hpp").is_file() else None


def _unavailable() -> str | None:
    if _cute_include() is None:
        return "CuTe's headers are missing (pip install nvidia-cutlass)"
    root = toolkit.cuda_root()
    if (
        not root
        or not (Path(root) / "include" / "cccl").is_dir()
        and not (Path(root) / "include" / "cuda" / "std").is_dir()
    ):
        return "CuTe needs the CUDA toolkit's headers (cuda_runtime_api.h, libcu++) and none were found"
    if not shutil.which("g++"):
        return "g++ is not on PATH"
    return emulation.emulation_unavailable_reason()


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))

KSTEPS = 4  # BLOCK_K 64 / the 16 k of one wgmma
CONSUMERS = 2  # warp groups, 64 rows of A each
A_ROWS, B_COLS = 64, 256

ORACLE = r"""
#include <cstdio>
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
using namespace cute;
namespace gmma = cute::SM90::GMMA;

template <class Tensor>
static long offset_of(Tensor const& t, void const* base) {
    return (long)((char const*)raw_pointer_cast(t.data()) - (char const*)base);
}
template <class Desc>
static void print_descriptor(char const* what, int consumer, int kk, Desc d, long start) {
    std::printf("desc %s %d %d %u %u %u %ld\n", what, consumer, kk, unsigned(d.bitfield.leading_byte_offset_) << 4,
                unsigned(d.bitfield.stride_byte_offset_) << 4, unsigned(d.bitfield.layout_type_), start);
}

int main() {
    using T = cute::bfloat16_t;
    alignas(1024) static T a_stage[128 * 64];
    alignas(1024) static T b_stage[64 * 256];
    // A: the stage's 128 x 64 tile, K-major, 8-row x 128-byte swizzle atoms stacked along M
    // (the TMA box: 128 rows of 64 k, row after row).
    Tensor sA = make_tensor(make_smem_ptr(a_stage), tile_to_shape(gmma::Layout_K_SW128_Atom<T>{}, Shape<_128, _64>{}));
    // B: 64 k x 256 n, MN-major (n contiguous), in 4 TMA boxes of 64 n side by side: the
    // 64 x 8 atoms are tiled along K first (within a box), then along N (box after box).
    Tensor sB = make_tensor(make_smem_ptr(b_stage),
                            tile_to_shape(gmma::Layout_MN_SW128_Atom<T>{}, Shape<_256, _64>{}, Step<_2, _1>{}));
    for (int consumer = 0; consumer < 2; ++consumer) {
        Tensor rows = local_tile(sA, Shape<_64, _64>{}, make_coord(consumer, 0));
        for (int kk = 0; kk < 4; ++kk) {
            Tensor a = local_tile(rows, Shape<_64, _16>{}, make_coord(0, kk));
            print_descriptor("A", consumer, kk, gmma::make_gmma_desc<gmma::Major::K>(a), offset_of(a, a_stage));
            std::printf("elem A %d %d", consumer, kk);
            for (int m = 0; m < 64; ++m)
                for (int k = 0; k < 16; ++k) std::printf(" %ld", (long)((char*)&a(m, k) - (char*)a_stage));
            std::printf("\n");
        }
    }
    for (int kk = 0; kk < 4; ++kk) {
        Tensor b = local_tile(sB, Shape<_256, _16>{}, make_coord(0, kk));
        print_descriptor("B", 0, kk, gmma::make_gmma_desc<gmma::Major::MN>(b), offset_of(b, b_stage));
        std::printf("elem B 0 %d", kk);
        for (int n = 0; n < 256; ++n)
            for (int k = 0; k < 16; ++k) std::printf(" %ld", (long)((char*)&b(n, k) - (char*)b_stage));
        std::printf("\n");
    }
    // mma.sync m16n8k16 fragments: CuTe's (thread, value) -> (row, column) layouts, as
    // "frag A <lane> <value> <row> <column>" (A: (m, k); B: (k, n); C: (m, n)).
    using Traits = MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN>;
    for (int lane = 0; lane < 32; ++lane) {
        for (int v = 0; v < 8; ++v) {
            int i = Traits::ALayout{}(lane, v);
            std::printf("frag A %d %d %d %d\n", lane, v, i % 16, i / 16);
        }
        for (int v = 0; v < 4; ++v) {
            int i = Traits::BLayout{}(lane, v);  // (n, k) of 8 x 16
            std::printf("frag B %d %d %d %d\n", lane, v, i / 8, i % 8);
            int j = Traits::CLayout{}(lane, v);  // (m, n) of 16 x 8
            std::printf("frag C %d %d %d %d\n", lane, v, j % 16, j / 16);
        }
    }
}
"""

# The emulated probe, appended to cuda/wgmma.cu itself: the kernel's own stage addresses and
# descriptors (a_stage_of, b_stage_of, a_descriptor, b_descriptor), for stage 0 and each consumer
# and k-step, and the address the emulation's wgmma reads each element from.
PROBE = r"""
extern "C" __global__ void descriptor_probe(long long* out)
{
    const ptx::smem_t raw_smem = ptx::smem_address(ptx::dynamic_shared_memory());
    const ptx::smem_t smem = (raw_smem + 1023) & ~ptx::smem_t(1023);
    long long* o = out;
    for (int consumer = 0; consumer < CONSUMERS; ++consumer) {
        const ptx::smem_t a_stage = a_stage_of(smem, 0, consumer), b_stage = b_stage_of(smem, 0);
        for (int kk = 0; kk < BLOCK_K / 16; ++kk) {
            const ptx::hopper::Descriptor a = ptx::hopper::decode(a_descriptor(a_stage, kk));
            const ptx::hopper::Descriptor b = ptx::hopper::decode(b_descriptor(b_stage, kk));
            *o++ = a.lbo; *o++ = a.sbo; *o++ = a.mode; *o++ = (long long)(a.start - smem);
            for (int m = 0; m < 64; ++m)
                for (int k = 0; k < 16; ++k) *o++ = (long long)(ptx::hopper::element_address(a, false, m, k) - smem);
            *o++ = b.lbo; *o++ = b.sbo; *o++ = b.mode; *o++ = (long long)(b.start - (smem + A_STAGE_BYTES));
            for (int n = 0; n < 256; ++n)
                for (int k = 0; k < 16; ++k)
                    *o++ = (long long)(ptx::hopper::element_address(b, true, n, k) - (smem + A_STAGE_BYTES));
        }
    }
}
"""


# CuTe's layout_type for the 128-byte swizzle (cute::SM90::GMMA::LayoutType::B128) and the
# descriptor's swizzle mode for it (PTX ISA: 1 = 128B).
CUTE_B128, DESCRIPTOR_128B = 1, 1


@lru_cache(maxsize=None)
def cute_tables() -> dict:
    folder = Path(__file__).resolve().parents[1] / "build" / "cute-oracle"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "oracle.cpp").write_text(ORACLE)
    root = Path(toolkit.cuda_root()) / "include"
    includes = ["-I", str(_cute_include()), "-I", str(root)] + (
        ["-I", str(root / "cccl")] if (root / "cccl").is_dir() else []
    )
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", *includes, str(folder / "oracle.cpp"), "-o", str(folder / "oracle")],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(folder / "oracle")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    tables = {}
    # CuTe prints a warning on the host, where a shared-memory pointer has no window address:
    # the start address is taken from the tensor's offset instead (offset_of).
    for line in run.stdout.splitlines():
        if line.startswith("frag "):
            _, operand, lane, value, row, column = line.split()
            tables[("frag", operand, int(lane), int(value))] = (int(row), int(column))
            continue
        if not line.startswith(("desc ", "elem ")):
            continue
        kind, operand, consumer, kk, *values = line.split()
        tables[(kind, operand, int(consumer), int(kk))] = [int(v) for v in values]
    return tables


def _probe_source(kernel: str | None = None) -> str:
    """cuda/wgmma.cu (or ``kernel``, a variant of it) with the probe kernel after it."""
    return (kernel if kernel is not None else source_path("cuda/wgmma.cu").read_text()) + PROBE


@lru_cache(maxsize=None)
def emulated_tables() -> dict:
    library = emulation.EmulatedLibrary(
        emulation.build_emulation("cuda/wgmma.cu", source_text=_probe_source(), tag="cute-oracle")
    )
    per_step = 4 + A_ROWS * 16 + 4 + B_COLS * 16
    out = np.zeros(CONSUMERS * KSTEPS * per_step, dtype=np.int64)
    shared = 1024 + 64 * 1024  # a stage and its alignment; the probe reads no memory
    library.launch(plans.Launch("descriptor_probe", (1, 1, 1), (1, 1, 1), ("A",), "P", shared), {"A": out.ctypes.data})
    tables = {}
    for index, chunk in enumerate(out.reshape(CONSUMERS * KSTEPS, per_step)):
        consumer, kk = divmod(index, KSTEPS)
        a, b = chunk[: 4 + A_ROWS * 16], chunk[4 + A_ROWS * 16 :]
        tables[("A", consumer, kk)] = (list(a[:4]), list(a[4:]))
        tables[("B", consumer, kk)] = (list(b[:4]), list(b[4:]))
    return tables


@pytest.mark.parametrize("kk", range(KSTEPS))
@pytest.mark.parametrize("consumer", range(CONSUMERS))
def test_a_descriptor_and_addresses_match_cute(consumer, kk):
    lbo, sbo, layout, start = cute_tables()[("desc", "A", consumer, kk)]
    (ours_lbo, ours_sbo, mode, ours_start), addresses = emulated_tables()[("A", consumer, kk)]
    assert layout == CUTE_B128 and mode == DESCRIPTOR_128B, (layout, mode)
    # K-major with a swizzle: CuTe sets LBO to 1 (16 bytes, unused); SBO is the 8-row pattern's stride.
    assert (ours_lbo, ours_sbo, ours_start) == (lbo, sbo, start), (
        f"ours {(ours_lbo, ours_sbo, ours_start)}, CuTe {(lbo, sbo, start)}"
    )
    expected = cute_tables()[("elem", "A", consumer, kk)]
    wrong = [(i // 16, i % 16, e, o) for i, (e, o) in enumerate(zip(expected, addresses)) if e != o]
    assert not wrong, f"A element (row, k): CuTe offset vs the emulation's, first of {len(wrong)}: {wrong[:5]}"


@pytest.mark.parametrize("kk", range(KSTEPS))
def test_b_descriptor_and_addresses_match_cute(kk):
    lbo, sbo, layout, start = cute_tables()[("desc", "B", 0, kk)]
    for consumer in range(CONSUMERS):  # both consumers read the same B
        (ours_lbo, ours_sbo, mode, ours_start), addresses = emulated_tables()[("B", consumer, kk)]
        assert layout == CUTE_B128 and mode == DESCRIPTOR_128B, (layout, mode)
        # MN-major: LBO is the stride between 64-column boxes, SBO between groups of 8 k rows.
        assert (ours_lbo, ours_sbo, ours_start) == (lbo, sbo, start), (
            f"ours {(ours_lbo, ours_sbo, ours_start)}, CuTe {(lbo, sbo, start)}"
        )
        expected = cute_tables()[("elem", "B", 0, kk)]
        wrong = [(i // 16, i % 16, e, o) for i, (e, o) in enumerate(zip(expected, addresses)) if e != o]
        assert not wrong, f"B element (n, k): CuTe offset vs the emulation's, first of {len(wrong)}: {wrong[:5]}"


def test_cute_sees_a_wrong_stride_byte_offset():
    # The oracle can fail: the B descriptor with SBO 2048 (what a 16-row pattern would need)
    # disagrees with CuTe's, and so do the addresses the emulation derives from it.
    right = "ptx::wgmma_descriptor(b_stage + kk * 16 * 128, B_BOX_BYTES, 1024, ptx::kSwizzle128B)"
    wrong = replace_code(source_path("cuda/wgmma.cu").read_text(), right, right.replace("1024", "2048"))
    library = emulation.EmulatedLibrary(
        emulation.build_emulation("cuda/wgmma.cu", source_text=_probe_source(wrong), tag="cute-oracle-wrong")
    )
    per_step = 4 + A_ROWS * 16 + 4 + B_COLS * 16
    out = np.zeros(CONSUMERS * KSTEPS * per_step, dtype=np.int64)
    library.launch(
        plans.Launch("descriptor_probe", (1, 1, 1), (1, 1, 1), ("A",), "P", 1024 + 64 * 1024), {"A": out.ctypes.data}
    )
    b = out[:per_step][4 + A_ROWS * 16 :]
    assert b[1] == 2048 and b[1] != cute_tables()[("desc", "B", 0, 0)][1]
    assert list(b[4:]) != cute_tables()[("elem", "B", 0, 0)]


def test_mma_sync_fragment_tables_match_cute():
    # The tables tests/test_ptx_emulation.py checks the emulation against were written from the
    # PTX ISA by this project's authors; CuTe's MMA traits for SM80_16x8x16 are NVIDIA's.
    import test_ptx_emulation as isa

    tables = cute_tables()
    for lane in range(32):
        for value in range(8):
            assert isa.a_position(lane, value) == tables[("frag", "A", lane, value)], ("A", lane, value)
        for value in range(4):
            assert isa.b_position(lane, value) == tables[("frag", "B", lane, value)], ("B", lane, value)
            assert isa.c_position(lane, value) == tables[("frag", "C", lane, value)], ("C", lane, value)
