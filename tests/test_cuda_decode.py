"""cuda.decode (cuda/decode.cu) on the CPU emulation: Y = X W^T with W in q8_0, q4_0, bf16 or
q4_K, the same .cu file and launch geometry as on the GPU, checked against the float64 product
of X and the weights the format holds (quant.QuantizedWeights.dequantize(), exact), with the
float32 error model, at every K path (one lane, 8 lanes or the warp on a row; q4_K: a lane a
super-block); q4_K's weights, read back through one-hot rows of X, bit for bit ggml's float32
weights; the repacked layout it reads; a wrong scale or a missing barrier caught; and its SASS:
16-byte global loads, no spills, W kept in flight (the instruction budget:
tests/test_cuda_decode_sass.py)."""

from __future__ import annotations

import numpy as np
import pytest
from code_edits import replace_code

import harness
from harness.backends.cuda import emulation, plans, resources, toolkit
from harness.model import quant
from harness.model.checking import check
from harness.model.inputs import Shape
from harness.tooling import sass

needs_emulation = pytest.mark.skipif(
    emulation.emulation_unavailable_reason() is not None, reason=str(emulation.emulation_unavailable_reason())
)
FORMATS = ["q8_0", "q4_0", "bf16"]
EDGE_K = [32, 64, 96, 544, 4128]  # 544: 8 lanes a row (128 <= K < 1024)
EDGE_N = [1, 7, 33]
EDGE_M = list(range(1, 18))  # 17: a second pass of 16 rows (blockIdx.y)
BF16_K = [1, 31, 33]  # bf16 has no blocks: padded with zero weights to a multiple of 32
# q4_K: 1, 2, 3 super-blocks (one lane a row), then 5 (8 lanes a row at M = 1, 4 at M = 4, 2 at
# M = 16: a stage of X and a part of one) and 33 (the warp, one lane with a second step)
Q4K_K = [256, 512, 768]
Q4K_LANES_K = [1280, 8448]
Q4K_N = [1, 5, 17, 33]


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv(emulation.EMULATE_ENV, "1")


def _weights(n: int, k: int, seed: int) -> np.ndarray:
    """Rows of very different magnitude, an all-zero block, a block whose largest value is negative."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-3, 4, size=(n, 1)).astype(np.float32)
    if k >= 64:
        w[0, 32:64] = 0
    w[-1, :32] = -np.abs(w[-1, :32])
    return w


def _q4k_weights(n: int, k: int, seed: int) -> np.ndarray:
    """_weights, and for q4_K: a super-block of zeros (d = dmin = 0), a row of one value (each
    sub-block flat: its scale 0), a row offset far from zero (large mins), a row all positive
    (mins 0)."""
    w = _weights(n, k, seed)
    if k >= 512:
        w[0, 256:512] = 0
    if n >= 5:
        w[1] = 0.75
        w[2] = w[2] * np.float32(0.01) - np.float32(3.0)
        w[3] = np.abs(w[3])
    return w


def _run(x: np.ndarray, w: quant.QuantizedWeights) -> np.ndarray:
    impl = harness.lookup("cuda.decode")
    x_before, w_before = x.copy(), w.data.copy()
    prepared = impl.backend.prepare(impl, x, w, impl.options)
    assert prepared.mode == "emulated"
    prepared.run()
    y = prepared.result()
    assert y.shape == (x.shape[0], w.n) and y.dtype == np.float32
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(w.data, w_before)
    return y


@needs_emulation
@pytest.mark.parametrize("fmt", FORMATS)
def test_emulated_decode_on_the_edge_shapes(emulate, fmt):
    for n in EDGE_N:
        for k in EDGE_K + (BF16_K if fmt == "bf16" else []):
            w = quant.quantize(_weights(n, k, seed=n + k), fmt)
            x_all = np.random.default_rng(k).standard_normal((max(EDGE_M), k)).astype(np.float32)
            for m in EDGE_M:
                x = x_all[:m]
                outcome = check(_run(x, w), x, w.dequantize().T)
                assert outcome.passed, f"cuda.decode {fmt} {m}x{n}x{k}: {outcome.message}"


@needs_emulation
def test_emulated_q4_k_decode_on_the_edge_shapes(emulate):
    for k in Q4K_K + Q4K_LANES_K:
        for n in Q4K_N if k in Q4K_K else [5]:
            w = quant.quantize(_q4k_weights(n, k, seed=n + k), "q4_K")
            x_all = np.random.default_rng(k).standard_normal((max(EDGE_M), k)).astype(np.float32)
            for m in EDGE_M:
                x = x_all[:m]
                outcome = check(_run(x, w), x, w.dequantize().T)
                assert outcome.passed, f"cuda.decode q4_K {m}x{n}x{k}: {outcome.message}"


@needs_emulation
@pytest.mark.parametrize("k", [512, 1280])
def test_emulated_q4_k_weights_are_ggmls_float32_weights_exactly(emulate, k):
    """Each row of X one-hot: every output is one weight times 1 plus zeros, exact, so Y is the
    kernel's own dequantized W^T, which must be ggml's float32 weights bit for bit (every weight
    rounded once, as dequantize_row_q4_K rounds it). X = I (M = K: the 16-row kernel, K / 16
    passes), its first 4 rows (the 4-row kernel) and rows 37 and 200 alone (the one-row kernel:
    low and high nibbles of two chunks)."""
    w = quant.quantize(_q4k_weights(9, k, seed=k), "q4_K")
    expected = w.dequantize().T
    eye = np.eye(k, dtype=np.float32)
    np.testing.assert_array_equal(_run(eye, w), expected)
    np.testing.assert_array_equal(_run(eye[:4], w), expected[:4])
    for j in (37, 200):
        np.testing.assert_array_equal(_run(eye[j : j + 1], w), expected[j : j + 1])


@needs_emulation
def test_emulated_decode_through_compare(emulate):
    """The harness's decode problems: quantized once, checked, marked emulated and not timed."""
    results = harness.compare(["3x40x256"], ["cuda.decode"], weights=["q4_0", "q8_0", "bf16", "q4_K"], baselines=False)
    for fmt in FORMATS + ["q4_K"]:
        row = results.row("cuda.decode", "3x40x256", weights=fmt)
        assert row.passed and row.mode == "emulated" and row.median_s is None, row


def _run_variant(source_text: str, tag: str, shape: Shape, fmt: str = "q4_0") -> bool:
    """Whether cuda/decode.cu edited into ``source_text`` computes ``shape`` right (emulated)."""
    library = emulation.EmulatedLibrary(emulation.build_emulation("cuda/decode.cu", source_text=source_text, tag=tag))
    w = quant.quantize((_q4k_weights if fmt == "q4_K" else _weights)(shape.n, shape.k, seed=1), fmt)
    x = np.random.default_rng(2).standard_normal((shape.m, shape.k)).astype(np.float32)
    inputs, out_shape, k = plans.decode_buffers(x, w)
    buffers = {name: emulation._aligned_copy(a) for name, a in inputs.items()}
    buffers["C"] = emulation._aligned_copy(np.full(out_shape, np.nan, np.float32))
    library.launch(
        plans.plan(plans.decode_technique(fmt, shape.m), "float32", shape.m, shape.n, k),
        {name: b.ctypes.data for name, b in buffers.items()},
    )
    return check(buffers["C"], x, w.dequantize().T).passed


def _source() -> str:
    from harness.env.sources import source_path

    return source_path("cuda/decode.cu").read_text()


@needs_emulation
def test_a_scale_read_from_the_wrong_block_is_caught(emulate):
    """A kernel that reads the scale of the wrong block (block 0 of every row) fails the check:
    the test sees what the kernel computes, not only that it runs."""
    right = "scale_of(__ldcs(scales + (first[r] + b)))"
    wrong = replace_code(_source(), right, "scale_of(__ldcs(scales + (first[r] - sub)))")
    assert not _run_variant(wrong, "first-scale", Shape(2, 9, 256))


@needs_emulation
@pytest.mark.parametrize(
    "right, wrong",
    [
        ("sc[1] = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);", "sc[1] = h.w & 0x0f0f0f0fu;"),
        ("m[1] = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);",
         "m[1] = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);"),
    ],
    ids=["scale-top-bits-dropped", "min-top-bits-from-the-scales"],
)  # fmt: skip
def test_a_q4_k_scale_or_min_decoded_wrong_is_caught(emulate, right, wrong):
    """Sub-blocks 4..7 take the top 2 bits of their 6-bit scale from bytes 0..3 of the 12 and of
    their min from bytes 4..7 (ggml's get_scale_min_k4): a kernel that drops the first or takes
    the second from the scales' bytes fails the check (M = 1 and M = 3: both kinds of kernel)."""
    text = _source()
    tag = "q4k-" + ("scale" if right.startswith("sc") else "min")
    variant = replace_code(text, right, wrong)
    for shape in (Shape(1, 9, 512), Shape(3, 9, 512)):
        assert _run_variant(text, "", shape, "q4_K")
        assert not _run_variant(variant, tag, shape, "q4_K"), shape


@needs_emulation
@pytest.mark.parametrize(
    "barrier, without",
    [
        ("for (unsigned s0 = 0; s0 < blocks; s0 += SB, from += SB * 8) { __syncthreads();",
         "for (unsigned s0 = 0; s0 < blocks; s0 += SB, from += SB * 8) {"),
        ("__syncthreads(); for (unsigned b = rows.sub;", "for (unsigned b = rows.sub;"),
    ],
    ids=["before-staging", "after-staging"],
)  # fmt: skip
def test_a_missing_barrier_around_the_stage_of_x_is_caught(emulate, barrier, without):
    """M > 1 stages X in shared memory for all the block's warps: without the barrier before a
    stage is written, a warp overwrites what others still read; without the one after, it reads
    what others have not written yet. K = 2080 is 3 stages of 32 blocks."""
    text = _source()
    assert _run_variant(text, "", Shape(3, 9, 2080))
    tag = "no-barrier-" + ("before" if "s0" in barrier else "after")
    assert not _run_variant(replace_code(text, barrier, without), tag, Shape(3, 9, 2080))


def test_the_repacked_weights_are_ggmls_bytes_in_another_order():
    for fmt, quant_bytes in (("q4_0", 16), ("q8_0", 32)):
        n, k = 7, 96
        w = quant.quantize(_weights(n, k, seed=3), fmt)
        packed = plans.decode_weight_bytes(w)
        blocks = w.data.reshape(n, k // 32, 2 + quant_bytes)
        scales_end = n * (k // 32) * 2
        quants_at = -(-scales_end // 16) * 16
        assert quants_at % 16 == 0 and packed.size == quants_at + w.nbytes - scales_end
        np.testing.assert_array_equal(packed[:scales_end], blocks[..., :2].reshape(-1))
        np.testing.assert_array_equal(packed[quants_at:], blocks[..., 2:].reshape(-1))
        assert not packed[scales_end:quants_at].any()
    w = quant.quantize(_weights(3, 33, seed=4), "bf16")
    rows = plans.decode_weight_bytes(w).view("<u2").reshape(3, 64)
    np.testing.assert_array_equal(rows[:, :33], w.data.view("<u2").reshape(3, 33))
    assert not rows[:, 33:].any()
    # q4_K: ggml's own bytes, 144 per super-block, 9 aligned 16-byte loads each
    w = quant.quantize(_q4k_weights(5, 512, seed=5), "q4_K")
    packed = plans.decode_weight_bytes(w)
    np.testing.assert_array_equal(packed, w.data)
    assert w.fmt.bytes_per_block % 16 == 0


def test_the_launch_tiles_rows_of_x_and_shares_warps_between_short_rows():
    # M = 1 gets the one-row kernel, 2..4 the four-row one, more the sixteen-row one
    assert [plans.decode_technique("q4_0", m) for m in (1, 2, 4, 5, 16, 17)] == [
        "decode_q4_0_m1",
        "decode_q4_0_m4",
        "decode_q4_0_m4",
        "decode_q4_0_m16",
        "decode_q4_0_m16",
        "decode_q4_0_m16",
    ]
    long = plans.plan("decode_q4_0_m1", "float32", 1, 1000, 4096)
    assert long.grid == (-(-1000 // 16), 1, 1) and long.block == (128, 1, 1)  # 4 warps x 4 rows
    # 16 rows of X: half a warp a row (its stages of X are 16 blocks), 2 passes over M
    assert plans.plan("decode_q4_0_m16", "float32", 17, 1000, 4096).grid == (-(-1000 // 32), 2, 1)
    short = plans.plan("decode_q4_0_m1", "float32", 1, 1000, 32)  # K = 32: one lane per row, 128 rows per warp
    assert short.grid == (-(-1000 // 512), 1, 1)
    assert plans.plan("decode_q4_0_m1", "float32", 1, 1000, 256).grid == (-(-1000 // 64), 1, 1)  # 8 lanes a row
    # q4_K: a lane a super-block of 2 rows; 1 lane a row below 4 super-blocks, 8 below 32, else the warp
    for k, rows_per_block in ((256, 256), (768, 256), (1024, 32), (7936, 32), (8192, 8)):
        assert plans.plan("decode_q4_K_m1", "float32", 1, 1000, k).grid == (-(-1000 // rows_per_block), 1, 1), k
    # M > 1: as many lanes a row as a stage of X has super-blocks (4, or 2 for 16 rows), from 4 of them
    assert plans.plan("decode_q4_K_m4", "float32", 3, 1000, 512).grid == (-(-1000 // 256), 1, 1)
    assert plans.plan("decode_q4_K_m4", "float32", 3, 1000, 4096).grid == (-(-1000 // 64), 1, 1)
    assert plans.plan("decode_q4_K_m16", "float32", 17, 1000, 4096).grid == (-(-1000 // 128), 2, 1)


def test_m_past_one_pass_and_bad_inputs_are_refused_or_handled_by_name():
    impl = harness.lookup("cuda.decode")
    w = quant.quantize(_weights(4, 64, seed=5), "q8_0")
    with pytest.raises(harness.MatmulInputError, match="QuantizedWeights"):
        impl.backend.prepare(impl, np.ones((1, 64), np.float32), np.ones((64, 4), np.float32), {})
    with pytest.raises(harness.MatmulInputError, match="float32 activations"):
        impl.backend.prepare(impl, np.ones((1, 64)), w, {})
    with pytest.raises(harness.MatmulInputError, match="must equal W's K"):
        impl.backend.prepare(impl, np.ones((1, 32), np.float32), w, {})


# ---- the machine code ----------------------------------------------------------------------------------

needs_nvcc = pytest.mark.skipif(toolkit.nvcc() is None, reason="nvcc not found")
needs_sass = pytest.mark.skipif(sass.unavailable_reason() is not None, reason=str(sass.unavailable_reason()))
KERNELS = [f"decode_{fmt}_m{tile}_f32" for fmt in FORMATS + ["q4_K"] for tile in plans.DECODE_M_TILES]


@needs_sass
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_decode_streams_w_in_16_byte_loads_without_spills(arch):
    kernels = sass.cuda_sass("cuda/decode.cu", arch)
    assert sorted(kernels) == sorted(KERNELS)
    for name, instructions in kernels.items():
        where = f"{name} on {arch}"
        loads = sass.find(instructions, "LDG", "128")
        # per block of W and row of it: 1 (q4_0), 2 (q8_0) or 4 (bf16) 16-byte loads (q4_K: 9 per super-block), and
        # 8 of X per row of X
        every_load = sass.excerpt(instructions, sass.find(instructions, "LDG"))
        assert len(loads) >= 8, f"{where}: {len(loads)} LDG.128\n{every_load}"
        streaming = sass.find(instructions, "LDG", "128", "EF")
        assert streaming, f"{where}: W is used once and should be read evict-first (__ldcs): no LDG.E.EF.128"
        spills = sass.spills(instructions)
        assert not spills, f"{where}: spills\n{sass.excerpt(instructions, spills)}"


@needs_nvcc
def test_decode_registers_fit_its_block_and_the_m1_kernels_keep_w_in_flight():
    """M = 1 is bound by the memory, so an SM must hold enough loads of W in flight to cover
    their latency. A lane of an M = 1 kernel has two steps of ROWS blocks in flight (the next
    step's loads are issued before this step's arithmetic), so an SM has
    (blocks of 128 threads its registers hold) x 128 x 2 x ROWS x (16, 32 or 64 bytes). At
    least 64 KiB: what the first version's 32 warps of one 2 KiB step held, and more than
    Little's law asks at 4.8 TB/s over 132 SMs with about 1 us of latency (36 KB). q4_K's step
    is a super-block of each of its ROWS rows (144 bytes), loaded at the top of the step, with no
    second step in flight: (blocks per SM) x 128 x ROWS x 144. (In the SASS, nvcc 13.0 issues
    each of those loads about one 16-byte vector's arithmetic ahead of its use, not all at the
    step's top, which is what its 82 registers, 5 blocks per SM, buy.)"""
    kernels, log = resources.compile_with_ptxas("cuda/decode.cu", "sm_90")
    registers = {k.kernel: k.registers for k in kernels}
    assert not any(k.spills for k in kernels), log
    defines = plans.launch_specs()["decode_q4_0_m1"].defines
    for fmt, steps, step_bytes in (("q4_0", 2, 16), ("q8_0", 2, 32), ("bf16", 2, 64), ("q4_K", 1, 144)):
        allocated = -(-registers[f"decode_{fmt}_m1_f32"] // 8) * 8  # per thread, in units of 8
        blocks_per_sm = min(65536 // (allocated * 128), 16)  # 64 warps at most
        in_flight = blocks_per_sm * 128 * steps * int(defines[f"ROWS_{fmt}"]) * step_bytes
        assert in_flight >= 64 * 1024, (fmt, registers, in_flight)
    assert max(registers.values()) <= 255, log
