"""triton.decode (triton/decode.py) on Triton's interpreter: Y = X W^T with W in q8_0, q4_0 or
bf16, checked against the float64 product of X and the weights the format holds; the layout it
reads; and its SASS for sm_90: 16-byte loads of W for M = 1, no spills in any config it keeps."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import harness
from harness import quant, sass
from harness.checking import check

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

FORMATS = ["q8_0", "q4_0", "bf16"]
EDGE_K = [32, 64, 96, 4128]
EDGE_N = [1, 7, 33]
EDGE_M = [1, 2, 3, 5, 16, 17]  # 17: a second pass of 16 rows (the interpreter's budget: not every M)
BF16_K = [1, 31, 33]


def _weights(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-3, 4, size=(n, 1)).astype(np.float32)
    if k >= 64:
        w[0, 32:64] = 0
    w[-1, :32] = -np.abs(w[-1, :32])
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


@pytest.mark.parametrize("fmt", FORMATS)
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


@pytest.mark.slow  # ahead-of-time compiles
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_gemv_configs_read_w_in_16_byte_loads(fmt):
    """M = 1, the bandwidth-bound case: the first config (the one a small K starts from)."""
    (compiled,) = _compiled(("decode", fmt, 90, 0))
    instructions = _sass(compiled)
    assert sass.find(instructions, "LDG", "128"), f"Triton {compiled.name}: no LDG.128"
    assert not sass.spills(instructions), f"Triton {compiled.name}: spills"


@pytest.mark.slow
def test_every_config_kept_for_its_rows_of_x_does_not_spill():
    module = harness.backends.triton_kernels.load_source("triton/decode.py")
    requests = [
        ("decode", fmt + ("" if m == 1 else f"/m{m}"), 90, i)
        for fmt in FORMATS
        for m in (1, 4, 16)
        for i, config in enumerate(module.CONFIGS)
        if module.fits(config, m)
    ]
    for compiled in _compiled(*requests):
        assert not sass.spills(_sass(compiled)), f"Triton {compiled.name} on sm_90 spills"
