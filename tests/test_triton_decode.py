"""triton.decode (triton/decode.py) on Triton's interpreter: Y = X W^T with W in q8_0, q4_0,
bf16 or q4_K, checked against the float64 product of X and the weights the format holds (K =
544: a partial last step; q4_K: K = 256, 512, 768, 1, 2 or 3 super-blocks, and 8448, whole steps
and a partial one); q4_K's weights, read back through one-hot rows of X, bit for bit ggml's
float32 weights; the layout it reads; and, compiled ahead of time for sm_90 (slow): at M = 1 64
bytes of W per thread per step, pipelined by the loop's own stages, each block reduced in the
loop, no layout change through shared memory; no spills in any config it keeps."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

import harness
from harness.model import quant
from harness.model.checking import check
from harness.tooling import sass

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

BLOCK_FORMATS = ["q8_0", "q4_0", "bf16"]  # blocks of 32 weights (bf16: none)
FORMATS = BLOCK_FORMATS + ["q4_K"]
EDGE_K = [32, 64, 96, 544, 4128]  # 544: 17 blocks, a partial last step
EDGE_N = [1, 7, 33]
EDGE_M = [1, 2, 3, 5, 16, 17]  # 17: a second pass of 16 rows (the interpreter's budget: not every M)
BF16_K = [1, 31, 33]
# q4_K: 1, 2, 3 super-blocks (4, 8, 12 chunks of 64: a partial step, a whole one, both, with the
# interpreter's 8 chunks a step); every M in the slow tier
Q4K_K = [256, 512, 768]
Q4K_N = [1, 5, 17, 33]


def _weights(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-3, 4, size=(n, 1)).astype(np.float32)
    if k >= 64:
        w[0, 32:64] = 0
    w[-1, :32] = -np.abs(w[-1, :32])
    return w


def _q4k_weights(n: int, k: int, seed: int) -> np.ndarray:
    """_weights, and a super-block of zeros (d = dmin = 0), a row of one value (scales 0), a row
    offset far from zero (large mins), a row all positive (mins 0)."""
    w = _weights(n, k, seed)
    if k >= 512:
        w[0, 256:512] = 0
    if n >= 5:
        w[1] = 0.75
        w[2] = w[2] * np.float32(0.01) - np.float32(3.0)
        w[3] = np.abs(w[3])
    return w


def _run(x, w):
    impl = harness.lookup("triton.decode")
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(reason)
    x_before, w_before = x.copy(), w.data.copy()
    prepared = impl.backend.prepare(impl, x, w, impl.options)
    prepared.run()
    y = prepared.result()
    assert y.shape == (x.shape[0], w.n) and y.dtype == np.float32
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(w.data, w_before)
    return prepared.mode, y


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_interpreted_decode_on_the_edge_shapes(fmt):
    for n in EDGE_N:
        for k in EDGE_K + (BF16_K if fmt == "bf16" else []):
            w = quant.quantize(_weights(n, k, seed=n + k), fmt)
            x_all = np.random.default_rng(k).standard_normal((max(EDGE_M), k)).astype(np.float32)
            for m in EDGE_M:
                x = x_all[:m]
                mode, y = _run(x, w)
                outcome = check(y, x, w.dequantize().T)
                assert outcome.passed, f"triton.decode ({mode}) {fmt} {m}x{n}x{k}: {outcome.message}"


def _check_q4k(shapes):
    for n, k, rows in shapes:
        w = quant.quantize(_q4k_weights(n, k, seed=n + k), "q4_K")
        x_all = np.random.default_rng(k).standard_normal((max(rows), k)).astype(np.float32)
        for m in rows:
            x = x_all[:m]
            mode, y = _run(x, w)
            outcome = check(y, x, w.dequantize().T)
            assert outcome.passed, f"triton.decode ({mode}) q4_K {m}x{n}x{k}: {outcome.message}"


def test_interpreted_q4_k_decode_on_the_edge_shapes():
    _check_q4k([(n, k, EDGE_M) for k in Q4K_K for n in Q4K_N] + [(5, 8448, [1, 3])])


@pytest.mark.slow  # every M the interpreter's budget leaves out of the fast tier
def test_interpreted_q4_k_decode_at_every_m():
    _check_q4k([(n, k, [m for m in range(1, 18) if m not in EDGE_M]) for k in Q4K_K for n in Q4K_N])


def test_interpreted_q4_k_weights_are_ggmls_float32_weights_exactly():
    """Each row of X one-hot: every output is one weight times 1 plus zeros, exact, so Y is the
    kernel's own dequantized W^T, which must be ggml's float32 weights bit for bit: X = the first
    17 rows of I (decode_rows_kernel, two passes) and row 300 (decode_kernel)."""
    w = quant.quantize(_q4k_weights(9, 512, seed=512), "q4_K")
    expected = w.dequantize().T
    eye = np.eye(512, dtype=np.float32)
    assert np.array_equal(_run(eye[:17], w)[1], expected[:17])
    assert np.array_equal(_run(eye[300:301], w)[1], expected[300:301])


def test_interpreted_decode_through_compare():
    results = harness.compare(["3x40x256"], ["triton.decode"], weights=FORMATS, baselines=False)
    for fmt in FORMATS:
        row = results.row("triton.decode", "3x40x256", weights=fmt)
        assert row.passed, row
        assert row.mode != "interpreted" or row.median_s is None


def test_pack_splits_ggmls_bytes_into_scales_and_quants():
    import torch

    module = harness.backends.triton_kernels.load_source("triton/decode.py")
    for fmt, quant_bytes in (("q4_0", 16), ("q8_0", 32)):
        w = quant.quantize(_weights(5, 96, seed=2), fmt)
        scales, quants = module.pack(fmt, 5, 96, torch.from_numpy(w.data.copy()))
        blocks = w.data.reshape(5, 3, 2 + quant_bytes)
        np.testing.assert_array_equal(scales.numpy(), blocks[..., :2].copy().view("<f2")[..., 0])
        np.testing.assert_array_equal(quants.numpy().view(np.uint8), blocks[..., 2:])
    w = quant.quantize(_weights(3, 33, seed=3), "bf16")
    none, rows = module.pack("bf16", 3, 33, torch.from_numpy(w.data.copy()))
    assert none is None and rows.dtype == torch.bfloat16 and rows.shape == (3, 33)
    with pytest.raises(ValueError, match="multiple of 32"):
        module.pack("q4_0", 1, 48, torch.zeros(27, dtype=torch.uint8))
    # q4_K: d and dmin apart, then the super-block's other 140 bytes (scales and mins, nibbles)
    w = quant.quantize(_q4k_weights(5, 512, seed=4), "q4_K")
    scales, quants = module.pack("q4_K", 5, 512, torch.from_numpy(w.data.copy()))
    supers = w.data.reshape(5, 2, 144)
    np.testing.assert_array_equal(scales.numpy(), supers[..., :4].copy().view("<f2"))
    np.testing.assert_array_equal(quants.numpy(), supers[..., 4:])
    with pytest.raises(ValueError, match="multiple of 256"):
        module.pack("q4_K", 1, 288, torch.zeros(162, dtype=torch.uint8))


# ---- the machine code (compiled ahead of time for sm_90, tests/triton_aot.py) ----------------------------


def _compiled(*requests):
    import triton_aot

    if sass.cuobjdump() is None:
        pytest.skip("cuobjdump not found")
    try:
        return triton_aot.compile_kernels(*requests)
    except triton_aot.Skip as error:
        pytest.skip(str(error))


def _sass(compiled):
    from test_sass import triton_sass

    return triton_sass(compiled)


def _module():
    return harness.backends.triton_kernels.load_source("triton/decode.py")


def _main_loop(instructions: list[str]) -> list[str]:
    """The longest loop (from a backward branch's target to the branch: instruction i is at
    address 16 i), decode_kernel's loop over steps of blocks."""
    from test_cuda_decode_sass import loops

    head, branch = max(loops(instructions), key=lambda loop: loop[1] - loop[0])
    return instructions[head : branch + 1]


def _loop_carried_types(ttgir: str) -> list[str]:
    """The types of the scf.for loops' loop-carried values in Triton's GPU dialect."""
    return re.findall(r"scf\.for .*?iter_args\(.*?\) -> \((.*?)\)\s", ttgir)


def test_the_m1_configs_hold_64_bytes_of_w_per_thread_in_one_layout():
    module = _module()
    for fmt in FORMATS:
        first = module.CONFIGS[fmt][0]
        assert module.w_bytes_per_thread(fmt, first) >= 64, (fmt, first)
        assert first.kwargs["STAGES"] > 1, (fmt, first)  # the first config pipelines
        assert all(module.one_layout(config) for config in module.CONFIGS[fmt]), fmt


@pytest.mark.slow  # ahead-of-time compiles
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_m1_loop_keeps_w_in_its_load_layout_and_reduces_each_block(fmt):
    """decode_kernel (M = 1) compiled for sm_90 with its first config: the dequantized tile never
    goes through shared memory to change layout (no STS in the loop: a layout change through
    shared memory stores registers there; the pipeline's copies are LDGSTS, global to shared
    without registers), each block is reduced in the loop (the loop carries BLOCK_N x BLOCK_B
    sums, not a step-wide tile), x comes in 16-byte pieces, nothing spills."""
    module = _module()
    config = module.CONFIGS[fmt][0]
    (compiled,) = _compiled(("decode", fmt, 90, 0))
    instructions = _sass(compiled)
    loop = _main_loop(instructions)
    where = f"Triton {compiled.name} on sm_90"
    assert not sass.find(loop, "STS"), f"{where}: STS in the loop\n{sass.excerpt(loop, sass.find(loop, 'STS'))}"
    assert sass.find(loop, "LDGSTS", "128"), f"{where}: x is not copied in 16-byte pieces: {sass.opcodes(loop)}"
    assert not sass.spills(instructions), f"{where}: spills"
    block_n, block_b = config.kwargs["BLOCK_N"], config.kwargs["BLOCK_B"]
    carried = _loop_carried_types(compiled.ttgir)
    assert carried and all(f"tensor<1x{block_n}x{block_b}x1xf32" in types for types in carried), carried
    assert sass.find(loop, "FFMA") and not sass.find(loop, "I2F"), f"{where}: {sass.opcodes(loop)}"


@pytest.mark.slow
def test_the_m1_loop_is_pipelined_by_its_own_stages_not_the_kernels():
    """Triton pipelines a loop without tl.dot only when the loop asks (tl.range(num_stages=...)):
    decode_kernel's STAGES = 3 copies W and x ahead with cp.async (LDGSTS, waited on with
    DEPBAR), STAGES = 1 loads into registers, and the kernel-wide num_stages changes nothing."""
    piped, plain, plain_four = _compiled(
        ("decode", "q4_0", 90, 0), ("decode", "q4_0", 90, 1, 1), ("decode", "q4_0", 90, 1, 4)
    )
    assert piped.config["STAGES"] == 3 and plain.config["STAGES"] == 1
    assert sass.find(_main_loop(_sass(piped)), "LDGSTS") and sass.find(_main_loop(_sass(piped)), "DEPBAR")
    assert not sass.find(_sass(plain), "LDGSTS")
    assert _sass(plain) == _sass(plain_four), "the kernel-wide num_stages now changes decode_kernel: revisit STAGES"


@pytest.mark.slow
def test_every_config_kept_for_its_rows_of_x_does_not_spill():
    module = _module()
    requests = [("decode", fmt, 90, "every") for fmt in FORMATS]
    requests += [
        ("decode", f"{fmt}/m{m}", 90, i)
        for fmt in FORMATS
        for m in (2, 4, 16)
        for i, config in enumerate(module.ROWS_CONFIGS)
        if module.fits(config, m)
    ]
    for compiled in _compiled(*requests):
        assert not sass.spills(_sass(compiled)), f"Triton {compiled.name} on sm_90 spills"
