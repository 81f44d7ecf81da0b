"""The Hopper instructions of cuda/ptx.h on the CPU emulation, against the PTX ISA's tables.

Expected values here are written from the ISA's rules, independently of the emulation's code:
- the wgmma matrix descriptor: start address >> 4 in bits 0-13, leading byte offset >> 4 in
  16-29, stride byte offset >> 4 in 32-45, base offset in 49-51, swizzle mode in 62-63 (1 = 128B);
- the TMA's 128-byte swizzle: in each 1024-byte pattern of 8 rows of 128 bytes, the 16-byte chunk
  c of row r lands at chunk c XOR r; out-of-bounds elements of the box are zeros;
- mbarrier phases: try_wait.parity(P) is true once the phase of parity P completed; a phase needs
  its arrivals and its transaction bytes;
- the m64nNk16 accumulator fragment: d[i] of lane l in warp w of the warp group is row
  16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + (i % 2).
Then cuda/wgmma.cu with a wrong descriptor (stride byte offset, swizzle mode) must compute wrong
results, and a persistent block that walks several tiles must not.
"""

from __future__ import annotations

import ml_dtypes
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

PRELUDE = '#include <cuda_bf16.h>\n#include "ptx.h"\n'


def _library(text: str, tag: str) -> emulation.EmulatedLibrary:
    return emulation.EmulatedLibrary(emulation.build_emulation("cuda/wgmma.cu", source_text=PRELUDE + text, tag=tag))


def _aligned(array: np.ndarray) -> np.ndarray:
    return emulation._aligned_copy(array)


# ---- descriptors ----------------------------------------------------------------------------------
DESCRIPTOR_KERNEL = r"""
extern "C" __global__ void descriptors(unsigned long long* out)
{
    out[0] = ptx::wgmma_descriptor(0x12340, 16, 1024, ptx::kSwizzle128B);
    out[1] = ptx::wgmma_descriptor(0x3fff0, 0x3fff0, 0x3fff0, ptx::kSwizzle64B);
    out[2] = ptx::wgmma_descriptor(0x40000 + 0x400, 8192, 1024, ptx::kSwizzle32B);  // bit 18 and up: not an offset
    out[3] = ptx::wgmma_descriptor(0x100, 128, 256, ptx::kSwizzleNone);
}
"""


def _isa_descriptor(address, lbo, sbo, mode):
    return ((address % 2**18) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (mode << 62)


def test_descriptor_bit_layout():
    out = np.zeros(4, dtype=np.uint64)
    _library(DESCRIPTOR_KERNEL, "descriptors").launch(
        plans.Launch("descriptors", (1, 1, 1), (1, 1, 1), ("A",), "P"), {"A": out.ctypes.data}
    )
    expected = [
        _isa_descriptor(0x12340, 16, 1024, 1),
        _isa_descriptor(0x3FFF0, 0x3FFF0, 0x3FFF0, 2),
        _isa_descriptor(0x400, 8192, 1024, 3),
        _isa_descriptor(0x100, 128, 256, 0),
    ]
    assert [hex(v) for v in out.tolist()] == [hex(v) for v in expected]
    assert int(out[0]) & 0x3FFF == 0x1234 and (int(out[0]) >> 16) & 0x3FFF == 1 and (int(out[0]) >> 32) & 0x3FFF == 64
    assert int(out[0]) >> 62 == 1 and (int(out[0]) >> 49) & 7 == 0


# ---- TMA: box, pitch, out-of-bounds zeros, 128B swizzle ------------------------------------------------
TMA_KERNEL = r"""
extern "C" __global__ void tma_box(const __grid_constant__ ptx::TensorMap map, unsigned short* out, int x, int y, int bytes)
{
    unsigned char* smem = ptx::dynamic_shared_memory();  // the window's start: 1024-byte aligned
    const ptx::smem_t base = ptx::smem_address(smem), bar = base + 65536;
    if (threadIdx.x != 0) return;
    ptx::mbarrier_init(bar, 1);
    ptx::fence_mbarrier_init();
    ptx::mbarrier_arrive_expect_tx(bar, bytes);
    ptx::tma_load_2d(base, &map, x, y, bar);
    ptx::mbarrier_wait_parity(bar, 0);
    for (int i = 0; i < bytes / 2; ++i) out[i] = reinterpret_cast<unsigned short*>(smem)[i];
}
"""
ROWS, COLS = 20, 100  # the global matrix: rows of 200 bytes, pitch padded to 208


def _tma(x, y, box_rows=16, box_cols=64):
    library = _library(TMA_KERNEL, "tma")
    matrix = (np.arange(ROWS)[:, None] * 1000 + np.arange(COLS)[None, :] + 1).astype(np.uint16)
    pitched = _aligned(plans.pitched(matrix))
    assert pitched.strides[0] == 208
    arg = plans.TensorMapArg("A", ROWS, COLS, box_rows, box_cols)
    tensor_map = library.encode_tensor_map(arg, pitched.ctypes.data, pitched.strides[0], "bfloat16")
    out = np.zeros(box_rows * box_cols, dtype=np.uint16)
    launch = plans.Launch("tma_box", (1, 1, 1), (32, 1, 1), (arg, "O", x, y, out.nbytes), "TPiii")
    library.launch(launch, {"O": out.ctypes.data}, {"A": tensor_map})
    return matrix, out


def _isa_swizzled_box(matrix, x, y, box_rows, box_cols):
    """The shared image of a box with the 128B swizzle: element (r, c) is byte 2 c of row r
    (rows of 128 B); its 16-byte chunk c // 8 moves to chunk (c // 8) ^ (r % 8)."""
    image = np.full(box_rows * box_cols, 0xFFFF, dtype=np.uint16)
    for r in range(box_rows):
        for c in range(box_cols):
            inside = 0 <= y + r < matrix.shape[0] and 0 <= x + c < matrix.shape[1]
            chunk = (c // 8) ^ (r % 8)
            image[(r * 128 + chunk * 16 + (c % 8) * 2) // 2] = matrix[y + r, x + c] if inside else 0
    return image


@pytest.mark.parametrize("x, y", [(0, 0), (40, 10), (-8, -3)])
def test_tma_box_is_swizzled_and_zero_filled(x, y):
    matrix, out = _tma(x, y)
    expected = _isa_swizzled_box(matrix, x, y, 16, 64)
    np.testing.assert_array_equal(out, expected)
    if x == 40:  # the box's last 4 columns and last 6 rows lie outside: zeros, not the pitch padding
        assert (out != 0).sum() == 10 * 60


def test_tensor_map_encoder_refuses_what_the_driver_refuses():
    library = _library(TMA_KERNEL, "tma")
    buffer = _aligned(np.zeros((64, 128), dtype=np.uint16))
    good = plans.TensorMapArg("A", 64, 128, 64, 64)
    assert len(library.encode_tensor_map(good, buffer.ctypes.data, 256, "bfloat16")) == 128
    refusals = {
        "pitch not a multiple of 16 bytes": (good, buffer.ctypes.data, 250),
        "base not 16-byte aligned": (good, buffer.ctypes.data + 2, 256),
        "box wider than the 128-byte swizzle": (plans.TensorMapArg("A", 64, 128, 64, 128), buffer.ctypes.data, 256),
        "box over 256 rows": (plans.TensorMapArg("A", 512, 128, 512, 64), buffer.ctypes.data, 256),
    }
    for why, (arg, address, pitch) in refusals.items():
        with pytest.raises(RuntimeError, match="refused"):
            library.encode_tensor_map(arg, address, pitch, "bfloat16")
            pytest.fail(why)


# ---- mbarrier phases and transaction counts ---------------------------------------------------------------
PHASE_KERNEL = r"""
extern "C" __global__ void phases(const __grid_constant__ ptx::TensorMap map, int* out)
{
    const ptx::smem_t base = ptx::smem_address(ptx::dynamic_shared_memory()), bar = base + 4096;
    if (threadIdx.x != 0) return;
    ptx::mbarrier_init(bar, 2);
    out[0] = ptx::mbarrier_try_wait_parity(bar, 1);  // fresh: the phase "before" phase 0 counts as done
    out[1] = ptx::mbarrier_try_wait_parity(bar, 0);  // phase 0 waits for 2 arrivals
    ptx::mbarrier_arrive(bar);
    out[2] = ptx::mbarrier_try_wait_parity(bar, 0);  // 1 of 2
    ptx::mbarrier_arrive_expect_tx(bar, 32);
    out[3] = ptx::mbarrier_try_wait_parity(bar, 0);  // 2 of 2, but 32 bytes still expected
    ptx::tma_load_2d(base, &map, 0, 0, bar);         // a 16 x 1 box: 32 bytes
    out[4] = ptx::mbarrier_try_wait_parity(bar, 0);  // phase 0 complete
    out[5] = ptx::mbarrier_try_wait_parity(bar, 1);  // phase 1 has just begun
    ptx::mbarrier_arrive(bar);
    ptx::mbarrier_arrive(bar);
    out[6] = ptx::mbarrier_try_wait_parity(bar, 1);  // phase 1 complete (no bytes expected)
    out[7] = ptx::mbarrier_try_wait_parity(bar, 0);  // phase 2 in progress: parity 0 is not done
}
"""


def test_mbarrier_phases_and_transaction_bytes():
    library = _library(PHASE_KERNEL, "phases")
    data = _aligned(np.arange(16, dtype=np.uint16).reshape(1, 16))
    arg = plans.TensorMapArg("A", 1, 16, 1, 16)
    tensor_map = library.encode_tensor_map(arg, data.ctypes.data, 32, "bfloat16")
    out = np.full(8, -1, dtype=np.int32)
    library.launch(
        plans.Launch("phases", (1, 1, 1), (1, 1, 1), (arg, "O"), "TP"), {"O": out.ctypes.data}, {"A": tensor_map}
    )
    assert out.tolist() == [1, 0, 0, 0, 1, 0, 1, 0]


def test_a_wait_nothing_can_complete_is_a_deadlock_not_a_hang():
    text = r"""
extern "C" __global__ void stuck(int* out)
{
    const ptx::smem_t bar = ptx::smem_address(ptx::dynamic_shared_memory());
    if (threadIdx.x == 0) ptx::mbarrier_init(bar, 2);
    __syncthreads();
    if (threadIdx.x == 0) ptx::mbarrier_arrive(bar);   // one of the two arrivals it waits for
    ptx::mbarrier_wait_parity(bar, 0);
    out[threadIdx.x] = 1;
}
"""
    out = np.zeros(64, dtype=np.int32)
    with pytest.raises(RuntimeError, match="deadlock.*mbarrier"):
        _library(text, "stuck").launch(
            plans.Launch("stuck", (1, 1, 1), (64, 1, 1), ("O",), "P"), {"O": out.ctypes.data}
        )


# ---- the wgmma accumulator fragment ------------------------------------------------------------------------
FRAGMENT_KERNEL = r"""
// A [64 x 16] K-major and B [16 x 256] MN-major in the 128B-swizzled layouts of ptx.h, written with
// plain stores: A (r, k) at byte r * 128 + 2 k, B (k, n) at 16384 + (n / 64) * 8192 + k * 128 + 2 (n % 64),
// each with chunk bits [4, 7) XOR row bits [7, 10).
// A[r][0] = r + 1, A[r][1 + r % 15] = 1; B[0][n] = 256, B[k >= 1][n] = n: D[r][n] = 256 (r + 1) + n.
__device__ unsigned swizzled(unsigned byte) { return byte ^ (((byte >> 7) & 7) << 4); }

extern "C" __global__ void fragment(float* out)
{
    unsigned char* smem = ptx::dynamic_shared_memory();
    const ptx::smem_t base = ptx::smem_address(smem);
    unsigned short* s = reinterpret_cast<unsigned short*>(smem);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 16384 + 4 * 8192; i += 2) s[i / 2] = 0;
        for (int r = 0; r < 64; ++r) {
            s[swizzled(r * 128) / 2] = __bfloat16_as_ushort(__float2bfloat16(float(r + 1)));
            s[swizzled(r * 128 + 2 * (1 + r % 15)) / 2] = __bfloat16_as_ushort(__float2bfloat16(1.f));
        }
        for (int k = 0; k < 16; ++k)
            for (int n = 0; n < 256; ++n)
                s[(16384 + (n / 64) * 8192 + swizzled(k * 128 + 2 * (n % 64))) / 2] =
                    __bfloat16_as_ushort(__float2bfloat16(k == 0 ? 256.f : float(n)));
        ptx::fence_proxy_async();  // plain stores, then wgmma's async-proxy reads (a no-op on the CPU)
    }
    __syncthreads();
    float d[128];
    for (int i = 0; i < 128; ++i) d[i] = -1.f;  // scale-d 0: ignored
    ptx::wgmma_fence();
    ptx::wgmma_m64n256k16_bf16(d, ptx::wgmma_descriptor(base, 16, 1024, ptx::kSwizzle128B),
                               ptx::wgmma_descriptor(base + 16384, 8192, 1024, ptx::kSwizzle128B), 0);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    for (int i = 0; i < 128; ++i) out[threadIdx.x * 128 + i] = d[i];
}
"""


def test_wgmma_accumulator_fragment_layout():
    out = np.zeros((128, 128), dtype=np.float32)
    _library(FRAGMENT_KERNEL, "fragment").launch(
        plans.Launch("fragment", (1, 1, 1), (128, 1, 1), ("O",), "P"), {"O": out.ctypes.data}
    )
    t = np.arange(128)[:, None]
    i = np.arange(128)[None, :]
    warp, lane = t // 32, t % 32
    row = 16 * warp + lane // 4 + 8 * ((i // 2) % 2)
    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    np.testing.assert_array_equal(out, (256 * (row + 1) + col).astype(np.float32))


# ---- cuda/wgmma.cu: wrong descriptors fail, a persistent walk over many tiles does not ------------------
A_DESCRIPTOR = "ptx::wgmma_descriptor(a_stage + kk * 32, 16, 1024, ptx::kSwizzle128B)"
B_DESCRIPTOR = "ptx::wgmma_descriptor(b_stage + kk * 16 * 128, B_BOX_BYTES, 1024, ptx::kSwizzle128B)"


def _nan_padded(array: np.ndarray) -> np.ndarray:
    """cuda.pitched(array) with NaN instead of zeros in the padding: a kernel that reads it fails."""
    padded = plans.pitched(array).copy()
    padded[:, array.shape[1] :] = np.nan
    return padded


def _run_wgmma(text: str, tag: str, shape: Shape, dtype: str = "bfloat16"):
    library = emulation.EmulatedLibrary(emulation.build_emulation("cuda/wgmma.cu", source_text=text, tag=tag))
    a, b = harness.make_inputs(shape, dtype, seed=7)
    launch = plans.plan("wgmma", dtype, *shape)
    buffers = {
        "A": _aligned(_nan_padded(a)),
        "B": _aligned(_nan_padded(b)),
        "C": _aligned(np.full((shape.m, shape.n), np.nan, dtype=a.dtype)),
    }
    pointers = {name: array.ctypes.data for name, array in buffers.items()}
    maps = {
        arg.buffer: library.encode_tensor_map(arg, pointers[arg.buffer], buffers[arg.buffer].strides[0], dtype)
        for arg in launch.args
        if isinstance(arg, plans.TensorMapArg)
    }
    library.launch(launch, pointers, maps)
    return harness.check(buffers["C"], a, b)


@pytest.mark.parametrize(
    "wrong, tag",
    [
        (A_DESCRIPTOR.replace("1024", "512"), "sbo"),  # stride byte offset of A
        (B_DESCRIPTOR.replace("kSwizzle128B", "kSwizzle64B"), "swizzle"),  # swizzle mode of B
        (B_DESCRIPTOR.replace("B_BOX_BYTES, 1024", "B_BOX_BYTES / 2, 1024"), "lbo"),  # leading byte offset of B
    ],
)
def test_wrong_descriptor_gives_wrong_results(wrong, tag):
    text = source_path("cuda/wgmma.cu").read_text()
    right = A_DESCRIPTOR if wrong.startswith("ptx::wgmma_descriptor(a_stage") else B_DESCRIPTOR
    assert not _run_wgmma(replace_code(text, right, wrong), f"wrong-{tag}", Shape(130, 300, 72)).passed


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_persistent_blocks_walk_many_tiles(dtype):
    """9 tiles on EMULATED_SMS = 3 blocks, 5 K tiles each: every block's ring wraps its 4 stages
    several times and its barriers' phases carry over from tile to tile."""
    shape = Shape(300, 600, 264)
    assert plans.plan("wgmma", dtype, *shape).grid == (plans.EMULATED_SMS, 1, 1) == (3, 1, 1)
    outcome = _run_wgmma(source_path("cuda/wgmma.cu").read_text(), "", shape, dtype)
    assert outcome.passed, outcome.message


def test_unaligned_rows_are_padded_and_the_padding_never_read():
    """K = 13 and N = 5: rows of 26 and 10 bytes, which TMA cannot address; plans.pitched pads
    them to 32 and 16 bytes, and the tensor map keeps the true sizes: the padding (NaN here) is
    never read."""
    a = np.arange(3 * 13, dtype=np.float32).reshape(3, 13).astype(ml_dtypes.bfloat16)
    padded = plans.pitched(a)
    assert padded.shape == (3, 16) and padded.strides[0] == 32
    np.testing.assert_array_equal(padded[:, :13], a)
    aligned = np.zeros((4, 8), dtype=ml_dtypes.bfloat16)
    assert plans.pitched(aligned) is aligned
    outcome = _run_wgmma(source_path("cuda/wgmma.cu").read_text(), "", Shape(33, 5, 13))
    assert outcome.passed, outcome.message


# ---- copies that land at any legal time, on rings that wrap and uneven persistent blocks ---------------
LANDINGS = ["wait", "issue", "random:1", "random:2"]
UNEVEN = Shape(200, 300, 320)  # 2 x 2 = 4 tiles on 3 blocks (block 0 walks two); 5 K tiles in 4 stages


@pytest.mark.parametrize("landing", LANDINGS)
def test_pipeline_is_right_whenever_the_copies_land(monkeypatch, landing):
    """TMA boxes land at the consumers' wait, at issue, or at random points in between: the
    intact kernel is right every time (a kernel that reads too early or refills too early is not)."""
    monkeypatch.setenv("MATMUL_EMU_ASYNC", landing)
    tiles = plans.cdiv(UNEVEN.m, 128) * plans.cdiv(UNEVEN.n, 256)
    assert tiles % plans.plan("wgmma", "bfloat16", *UNEVEN).grid[0] != 0
    outcome = _run_wgmma(source_path("cuda/wgmma.cu").read_text(), "", UNEVEN)
    assert outcome.passed, outcome.message


def test_unknown_landing_time_is_refused(monkeypatch):
    monkeypatch.setenv("MATMUL_EMU_ASYNC", "sometimes")
    with pytest.raises(RuntimeError, match="MATMUL_EMU_ASYNC must be wait, issue or random:SEED"):
        _run_wgmma(source_path("cuda/wgmma.cu").read_text(), "", Shape(16, 16, 16))


@pytest.mark.parametrize("landing", ["issue", "random:1"])
def test_stage_released_before_wgmma_wait_group_computes_wrong_results(monkeypatch, landing):
    """The consumer releases the previous stage before wgmma.wait_group says its wgmmas are done;
    the producer's refill lands while they still read it."""
    monkeypatch.setenv("MATMUL_EMU_ASYNC", landing)
    text = source_path("cuda/wgmma.cu").read_text()
    wait_two = replace_code(text, "ptx::wgmma_wait_group<1>();", "ptx::wgmma_wait_group<2>();")
    assert not _run_wgmma(wait_two, "wait2", UNEVEN).passed


def test_register_budget_beyond_the_register_file_is_reported():
    """setmaxnreg.inc 240 for the consumers: 128 x 40 + 256 x 240 > 64K registers."""
    text = source_path("cuda/wgmma.cu").read_text()
    text = replace_code(text, "ptx::setmaxnreg_inc<232>();", "ptx::setmaxnreg_inc<240>();")
    with pytest.raises(RuntimeError, match=r"deadlock.*setmaxnreg\.inc 240: needs 2304 more registers"):
        _run_wgmma(text, "inc240", UNEVEN)


# Probes of the checks on one warp group: `variant` chooses what it gets wrong.
CHECKS_KERNEL = r"""
extern "C" __global__ void checks(float* out, int variant)
{
    unsigned char* smem = ptx::dynamic_shared_memory();
    const ptx::smem_t base = ptx::smem_address(smem);
    if (threadIdx.x == 0) {
        for (int i = 0; i < 16384 + 4 * 8192; ++i) smem[i] = 0;  // zeros: 0 x 0 is no NaN
        if (variant != 1) ptx::fence_proxy_async();            // 1: no fence between the stores and wgmma
    }
    __syncthreads();
    float d[128];
    ptx::wgmma_fence();
    const ptx::smem_t a = base + (variant == 2 && threadIdx.x / 32 == 1 ? 1024 : 0);  // 2: warp 1 differs
    ptx::wgmma_m64n256k16_bf16(d, ptx::wgmma_descriptor(a, 16, 1024, ptx::kSwizzle128B),
                               ptx::wgmma_descriptor(base + 16384, 8192, 1024, ptx::kSwizzle128B), 0);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<0>();
    if (variant == 3) {  // 3: a second wgmma on accumulators read since the wait, with no fence
        d[0] += 1.f;
        ptx::wgmma_m64n256k16_bf16(d, ptx::wgmma_descriptor(base, 16, 1024, ptx::kSwizzle128B),
                                   ptx::wgmma_descriptor(base + 16384, 8192, 1024, ptx::kSwizzle128B), 1);
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<0>();
    }
    if (variant == 4) {  // 4: setmaxnreg.dec above what the warp has (128 threads: 256 each)
        ptx::setmaxnreg_inc<256>();
        ptx::setmaxnreg_dec<40>();
        ptx::setmaxnreg_inc<248>();  // the pool has what the .dec gave back: fine
        ptx::setmaxnreg_dec<256>();  // above 248: not a decrease
    }
    for (int i = 0; i < 128; ++i) out[threadIdx.x * 128 + i] = d[i];
}
"""


def _checks(variant: int) -> np.ndarray:
    out = np.full((128, 128), -1.0, dtype=np.float32)
    _library(CHECKS_KERNEL, "checks").launch(
        plans.Launch("checks", (1, 1, 1), (128, 1, 1), ("O", variant), "Pi"), {"O": out.ctypes.data}
    )
    return out


def test_wgmma_checks_pass_when_nothing_is_wrong():
    np.testing.assert_array_equal(_checks(0), 0.0)


def test_plain_stores_without_fence_proxy_async_are_not_seen_by_wgmma():
    """The async proxy still has what was there before the block (0xff bytes: NaN)."""
    assert np.isnan(_checks(1)).all()


def test_descriptors_that_differ_across_a_warp_group_are_an_error():
    with pytest.raises(RuntimeError, match="warp 1 gave descriptors .* must be the same"):
        _checks(2)


def test_wgmma_after_wait_group_without_a_fence_is_an_error():
    with pytest.raises(RuntimeError, match="without a wgmma.fence"):
        _checks(3)


def test_setmaxnreg_dec_above_the_current_count_is_an_error():
    with pytest.raises(RuntimeError, match="setmaxnreg.dec 256: warp 0 has only 248"):
        _checks(4)
