"""cuda/ptx.h on the CPU emulation: the PTX ISA's fragment layouts, element by element.

The expected layouts are written here from the PTX ISA's tables (ldmatrix; the m16n8k16
.f16/.bf16 fragments of mma.sync), independently of cuda/emu/include/ptx_emu.h: small probe
kernels, compiled against the emulation exactly as cuda/mma.cu is, give each lane chosen
registers or row addresses and return what the instruction produced. Then cuda/mma.cu with a
wrong layout (B without .trans; two A registers swapped) or without its cp.async.wait_group
must compute wrong results.
"""

from __future__ import annotations

import numpy as np
import pytest
from code_edits import replace_code

import harness
from harness.backends.cuda import emulation, plans
from harness.env.sources import source_path
from harness.model.inputs import Shape

pytestmark = pytest.mark.skipif(
    emulation.emulation_unavailable_reason() is not None, reason=str(emulation.emulation_unavailable_reason())
)

LANES = np.arange(32)
GROUP, THREAD_IN_GROUP = LANES // 4, LANES % 4  # groupID, threadID_in_group


# ---- the ISA's tables: (row, column) of element i of lane l ------------------------------------------
def a_position(lane, i):  # A 16 x 16, a0..a7 (a[j] holds a_{2j} low, a_{2j+1} high)
    row = lane // 4 + (8 if i in (2, 3, 6, 7) else 0)
    col = (lane % 4) * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_position(lane, i):  # B 16 x 8 (k, n), b0..b3
    return (lane % 4) * 2 + (i & 1) + (8 if i >= 2 else 0), lane // 4


def c_position(lane, i):  # C, D 16 x 8, c0..c3
    return lane // 4 + (8 if i >= 2 else 0), (lane % 4) * 2 + (i & 1)


def bits16(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return values.astype(np.float16).view(np.uint16).astype(np.uint32)
    bits = values.astype(np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), "test values must be exact in BF16"
    return bits >> 16


def pack(matrix: np.ndarray, position, elements: int, dtype: str) -> np.ndarray:
    """Registers [32, elements / 2] of a fragment, built from the table."""
    regs = np.zeros((32, elements // 2), dtype=np.uint32)
    for lane in range(32):
        for i in range(elements):
            value = bits16(np.array([matrix[position(lane, i)]]), dtype)[0]
            regs[lane, i // 2] |= value << (16 * (i & 1))
    return regs


def unpack(d: np.ndarray) -> np.ndarray:
    out = np.full((16, 8), np.nan, dtype=np.float32)
    for lane in range(32):
        for i in range(4):
            out[c_position(lane, i)] = d[lane, i]
    assert not np.isnan(out).any()
    return out


PROBES = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "ptx.h"

// One warp. Lane l points ldmatrix at row rows[l] of a 40 x 8 tile of 16-bit values; variant:
// 0..2 = .x1/.x2/.x4, 3..5 = the same with .trans. out[l][i] = register i of lane l.
extern "C" __global__ void probe_ldmatrix(const unsigned short* tile_in, const int* rows, unsigned* out, int variant)
{
    __shared__ __align__(16) unsigned short tile[40 * 8];
    const int lane = threadIdx.x;
    for (int i = lane; i < 40 * 8; i += 32) tile[i] = tile_in[i];
    __syncwarp();
    const ptx::smem_t address = ptx::smem_address(&tile[rows[lane] * 8]);
    unsigned r[4] = {0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu};
    switch (variant) {
        case 0: ptx::ldmatrix_x1(r[0], address); break;
        case 1: ptx::ldmatrix_x2(r[0], r[1], address); break;
        case 2: ptx::ldmatrix_x4(r[0], r[1], r[2], r[3], address); break;
        case 3: ptx::ldmatrix_x1_trans(r[0], address); break;
        case 4: ptx::ldmatrix_x2_trans(r[0], r[1], address); break;
        case 5: ptx::ldmatrix_x4_trans(r[0], r[1], r[2], r[3], address); break;
    }
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

// One warp: d = A B + C with the registers given per lane (a [32][4], b [32][2], c and d [32][4]).
extern "C" __global__ void probe_mma(const unsigned* a, const unsigned* b, const float* c, float* d, int f16)
{
    const int lane = threadIdx.x;
    unsigned ra[4], rb[2];
    float rc[4], rd[4];
    for (int i = 0; i < 4; ++i) ra[i] = a[lane * 4 + i], rc[i] = c[lane * 4 + i];
    for (int i = 0; i < 2; ++i) rb[i] = b[lane * 2 + i];
    if (f16) ptx::mma_m16n8k16_f16(rd, ra, rb, rc);
    else ptx::mma_m16n8k16_bf16(rd, ra, rb, rc);
    for (int i = 0; i < 4; ++i) d[lane * 4 + i] = rd[i];
}

// One thread, three groups of one 16-byte copy each from src (bytes 16, 6, 0: the rest
// zero-filled) into a shared area of 0xff bytes; out gets the area after issuing everything,
// then after wait_group 2, 1 and 0: 4 snapshots of 48 bytes.
extern "C" __global__ void probe_cp_async(const unsigned char* src, unsigned char* out, int unused)
{
    __shared__ __align__(16) unsigned char area[48];
    for (int i = 0; i < 48; ++i) area[i] = 0xff;
    const ptx::smem_t base = ptx::smem_address(area);
    const unsigned sizes[3] = {16, 6, 0};
    for (int g = 0; g < 3; ++g) {
        ptx::cp_async_16(base + 16 * g, src + 16 * g, sizes[g]);
        ptx::cp_async_commit_group();
    }
    for (int i = 0; i < 48; ++i) out[i] = area[i];
    ptx::cp_async_wait_group<2>();
    for (int i = 0; i < 48; ++i) out[48 + i] = area[i];
    ptx::cp_async_wait_group<1>();
    for (int i = 0; i < 48; ++i) out[96 + i] = area[i];
    ptx::cp_async_wait_group<0>();
    for (int i = 0; i < 48; ++i) out[144 + i] = area[i];
}
"""


@pytest.fixture(scope="module")
def probes():
    return emulation.EmulatedLibrary(emulation.build_emulation("cuda/mma.cu", source_text=PROBES, tag="ptx-probes"))


# ---- ldmatrix ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True], ids=["plain", "trans"])
def test_ldmatrix_layout(probes, count, trans):
    # 40 rows of 8 distinct values; the lanes point at rows in shuffled order; lanes beyond the
    # 8 * count whose addresses the ISA says are used point at rows 32..39, whose values must
    # not appear.
    tile = np.arange(1, 40 * 8 + 1, dtype=np.uint16).reshape(40, 8)
    rng = np.random.default_rng(count + 10 * trans)
    rows = np.concatenate([rng.permutation(32)[: 8 * count], 32 + rng.integers(0, 8, 32 - 8 * count)]).astype(np.int32)
    out = np.zeros((32, 4), dtype=np.uint32)
    variant = {1: 0, 2: 1, 4: 2}[count] + (3 if trans else 0)
    launch = plans.Launch("probe_ldmatrix", (1, 1, 1), (32, 1, 1), ("T", "R", "O", variant), "PPPi")
    probes.launch(launch, {"T": tile.ctypes.data, "R": rows.ctypes.data, "O": out.ctypes.data})
    mismatches = []
    for lane in range(32):
        for i in range(count):  # register i: matrix i, rows from lanes 8i .. 8i + 7
            for half in range(2):
                if trans:  # element (2 (l % 4) + half, l / 4) of matrix i
                    expected = tile[rows[8 * i + 2 * (lane % 4) + half], lane // 4]
                else:  # element (l / 4, 2 (l % 4) + half)
                    expected = tile[rows[8 * i + lane // 4], 2 * (lane % 4) + half]
                got = (int(out[lane, i]) >> (16 * half)) & 0xFFFF
                if got != expected:
                    mismatches.append((lane, i, half, int(expected), got))
        for i in range(count, 4):
            assert out[lane, i] == 0xDEADBEEF, "ldmatrix wrote a register it does not have"
    assert not mismatches, f"(lane, register, half, expected, got): {mismatches[:10]}"


# ---- mma.sync m16n8k16 -----------------------------------------------------------------------------------
def run_mma(probes, dtype, a, b, c) -> np.ndarray:
    ra, rb = pack(a, a_position, 8, dtype), pack(b, b_position, 4, dtype)
    rc = np.zeros((32, 4), dtype=np.float32)
    for lane in range(32):
        for i in range(4):
            rc[lane, i] = c[c_position(lane, i)]
    d = np.full((32, 4), np.nan, dtype=np.float32)
    launch = plans.Launch("probe_mma", (1, 1, 1), (32, 1, 1), ("a", "b", "c", "d", int(dtype == "float16")), "PPPPi")
    probes.launch(launch, {"a": ra.ctypes.data, "b": rb.ctypes.data, "c": rc.ctypes.data, "d": d.ctypes.data})
    return unpack(d)


def test_fragment_tables_cover_each_element_once():
    for position, elements, shape in ((a_position, 8, (16, 16)), (b_position, 4, (16, 8)), (c_position, 4, (16, 8))):
        seen = {position(lane, i) for lane in range(32) for i in range(elements)}
        assert len(seen) == 32 * elements == shape[0] * shape[1]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mma_fragment_layouts_element_by_element(probes, dtype):
    codes_a = np.arange(1, 257, dtype=np.float32).reshape(16, 16)  # distinct, exact in BF16 and FP16
    codes_b = np.arange(1, 129, dtype=np.float32).reshape(16, 8)
    codes_c = np.arange(1, 129, dtype=np.float32).reshape(16, 8) + 0.5
    zeros_b, zeros_c = np.zeros((16, 8), np.float32), np.zeros((16, 8), np.float32)
    # D = C: the C and D tables agree.
    np.testing.assert_array_equal(run_mma(probes, dtype, np.zeros((16, 16), np.float32), zeros_b, codes_c), codes_c)
    # A = I: D = B, every element of B where the B table put it.
    np.testing.assert_array_equal(run_mma(probes, dtype, np.eye(16, dtype=np.float32), codes_b, zeros_c), codes_b)
    # B = rows 0-7 or 8-15 of I: D = columns 0-7 or 8-15 of A, every element where the A table put it.
    for half in range(2):
        select = np.zeros((16, 8), np.float32)
        select[8 * half : 8 * half + 8] = np.eye(8, dtype=np.float32)
        np.testing.assert_array_equal(
            run_mma(probes, dtype, codes_a, select, zeros_c), codes_a[:, 8 * half : 8 * half + 8]
        )
    # A general product, exact in FP32 (small integers).
    rng = np.random.default_rng(7)
    a = rng.integers(-8, 9, (16, 16)).astype(np.float32)
    b = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    c = rng.integers(-64, 65, (16, 8)).astype(np.float32)
    np.testing.assert_array_equal(run_mma(probes, dtype, a, b, c), a @ b + c)


# ---- cp.async groups ----------------------------------------------------------------------------------------
def test_cp_async_lands_at_wait_group_with_zero_fill(probes):
    src = np.arange(1, 49, dtype=np.uint8)
    out = np.zeros(4 * 48, dtype=np.uint8)
    launch = plans.Launch("probe_cp_async", (1, 1, 1), (1, 1, 1), ("S", "O", 0), "PPi")
    probes.launch(launch, {"S": src.ctypes.data, "O": out.ctypes.data})
    untouched = np.full(16, 0xFF, np.uint8)
    group0 = src[:16]
    group1 = np.concatenate([src[16:22], np.zeros(10, np.uint8)])  # 6 bytes read, 10 zero-filled
    group2 = np.zeros(16, np.uint8)  # nothing read, all zero-filled
    snapshots = out.reshape(4, 48)
    np.testing.assert_array_equal(snapshots[0], np.concatenate([untouched] * 3))  # issued: nothing landed
    np.testing.assert_array_equal(snapshots[1], np.concatenate([group0, untouched, untouched]))  # wait_group 2
    np.testing.assert_array_equal(snapshots[2], np.concatenate([group0, group1, untouched]))  # wait_group 1
    np.testing.assert_array_equal(snapshots[3], np.concatenate([group0, group1, group2]))  # wait_group 0


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_cp_async_lands_any_time_between_issue_and_wait_group(probes, monkeypatch, seed):
    """MATMUL_EMU_ASYNC=random:SEED: a copy may land at any scheduling point of its thread after
    it is issued, and has landed once a wait_group covers it."""
    monkeypatch.setenv("MATMUL_EMU_ASYNC", f"random:{seed}")
    src = np.arange(1, 49, dtype=np.uint8)
    out = np.zeros(4 * 48, dtype=np.uint8)
    probes.launch(
        plans.Launch("probe_cp_async", (1, 1, 1), (1, 1, 1), ("S", "O", 0), "PPi"),
        {"S": src.ctypes.data, "O": out.ctypes.data},
    )
    final = np.concatenate([src[:16], src[16:22], np.zeros(10, np.uint8), np.zeros(16, np.uint8)]).reshape(3, 16)
    snapshots = out.reshape(4, 3, 16)
    for i, snapshot in enumerate(snapshots):
        for group in range(3):
            landed = np.array_equal(snapshot[group], final[group])
            assert landed or np.all(snapshot[group] == 0xFF), f"snapshot {i}, group {group}: a torn copy"
            if group < i:  # wait_group 3 - i covers groups 0 .. i - 1
                assert landed, f"group {group} not landed after the wait_group that covers it"


def test_cp_async_random_landing_varies_with_the_seed(probes, monkeypatch):
    early = set()
    for seed in range(1, 9):
        monkeypatch.setenv("MATMUL_EMU_ASYNC", f"random:{seed}")
        out = np.zeros(4 * 48, dtype=np.uint8)
        probes.launch(
            plans.Launch("probe_cp_async", (1, 1, 1), (1, 1, 1), ("S", "O", 0), "PPi"),
            {"S": np.arange(1, 49, dtype=np.uint8).ctypes.data, "O": out.ctypes.data},
        )
        early.add(tuple(out.reshape(4, 3, 16)[0, :, 0] != 0xFF))  # which groups landed before any wait
    assert len(early) > 1, "every seed landed the copies at the same points"


def test_cp_async_lands_at_issue_when_asked(probes, monkeypatch):
    monkeypatch.setenv("MATMUL_EMU_ASYNC", "issue")
    src = np.arange(1, 49, dtype=np.uint8)
    out = np.zeros(4 * 48, dtype=np.uint8)
    probes.launch(
        plans.Launch("probe_cp_async", (1, 1, 1), (1, 1, 1), ("S", "O", 0), "PPi"),
        {"S": src.ctypes.data, "O": out.ctypes.data},
    )
    final = np.concatenate([src[:16], src[16:22], np.zeros(26, np.uint8)])
    np.testing.assert_array_equal(out.reshape(4, 48), np.stack([final] * 4))


# ---- cuda/mma.cu with a wrong layout, or not waiting, computes wrong results --------------------------------
A_LOAD = "ptx::ldmatrix_x4(a[i][0], a[i][1], a[i][2], a[i][3],"
B_LOAD = "ptx::ldmatrix_x4_trans(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],"
WAIT = "ptx::cp_async_wait_group<STAGES - 2>();"
BROKEN = {
    "B without .trans": (B_LOAD, B_LOAD.replace("_trans", "")),
    "A registers 1 and 2 swapped": (A_LOAD, "ptx::ldmatrix_x4(a[i][0], a[i][2], a[i][1], a[i][3],"),
    "no cp.async.wait_group": (WAIT, ""),
    "wait_group count off by one": (WAIT, WAIT.replace("STAGES - 2", "STAGES - 1")),
    "ldmatrix rows from lane % 8": ("const int ld_row = lane % 16,", "const int ld_row = lane % 8,"),
}


def _aligned(array: np.ndarray) -> np.ndarray:
    raw = np.empty(array.nbytes + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    out = raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _run_variant(text: str, tag: str, dtype: str, shape: Shape) -> bool:
    library = emulation.EmulatedLibrary(emulation.build_emulation("cuda/mma.cu", source_text=text, tag=tag))
    a, b = harness.make_inputs(shape, dtype, seed=11)
    aa, bb = _aligned(a), _aligned(b)
    c = _aligned(np.full((shape.m, shape.n), np.nan, dtype=a.dtype))
    library.launch(plans.plan("mma", dtype, *shape), {"A": aa.ctypes.data, "B": bb.ctypes.data, "C": c.ctypes.data})
    return harness.check(c, a, b).passed


@pytest.mark.parametrize("broken", list(BROKEN))
def test_mma_kernel_with_a_wrong_layout_or_no_wait_fails(broken):
    text = source_path("cuda/mma.cu").read_text()
    old, new = BROKEN[broken]
    shape = Shape(64, 72, 96)  # K and N multiples of 8: A and B through cp.async, 3 K tiles
    assert _run_variant(text, "intact", "bfloat16", shape), "the intact kernel should pass"
    tag = "broken-" + "".join(ch for ch in broken if ch.isalnum())
    assert not _run_variant(replace_code(text, old, new), tag, "bfloat16", shape), f"mma.cu with {broken} passed"


@pytest.mark.parametrize("landing", ["wait", "issue", "random:1", "random:2"])
def test_mma_ring_is_right_whenever_the_copies_land(monkeypatch, landing):
    """8 K tiles through the 3-stage ring (every stage refilled twice), copies landing at their
    wait_group, at issue or at random points in between."""
    monkeypatch.setenv("MATMUL_EMU_ASYNC", landing)
    assert _run_variant(source_path("cuda/mma.cu").read_text(), "intact", "bfloat16", Shape(150, 136, 256))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mma_unaligned_inputs_do_not_use_cp_async(dtype):
    """Matrices that do not start on 16 bytes (K and N multiples of 8) take the element-by-element
    path: a cp.async from them would abort the emulation (the GPU faults on it)."""
    shape = Shape(40, 64, 32)
    a, b = harness.make_inputs(shape, dtype, seed=4)
    library = emulation.emulated_library("cuda/mma.cu")
    raw = [_aligned(np.zeros(x.size + 1, dtype=a.dtype)) for x in (a, b, np.empty((40, 64)))]
    views = [r[1:] for r in raw]  # 2 bytes past a 64-byte boundary
    views[0][:] = a.ravel()
    views[1][:] = b.ravel()
    views[2][:] = np.nan
    library.launch(
        plans.plan("mma", dtype, *shape),
        {"A": views[0].ctypes.data, "B": views[1].ctypes.data, "C": views[2].ctypes.data},
    )
    assert harness.check(views[2].reshape(40, 64), a, b).passed
