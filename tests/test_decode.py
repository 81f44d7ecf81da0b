"""Decode with quantized weights: the formats (harness/quant.py) byte for byte against the gguf
package (llama.cpp's Python reference), their refusals, and every decode implementation
(python.decode, c.decode in each variant this CPU has) on the edge shapes against the float64
product of X and the weights the format holds, with the same bits for every thread count."""
from __future__ import annotations

import numpy as np
import pytest

import harness
from harness import quant
from harness.checking import check
from harness.core import MatmulInputError

FORMATS = ["q8_0", "q4_0", "bf16"]


def _weights(n: int, k: int, seed: int = 0) -> np.ndarray:
    """W [N, K] with what makes quantizing interesting: rows of very different magnitude, an
    all-zero block, a block whose largest value is negative, ties for the largest magnitude."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-3, 4, size=(n, 1)).astype(np.float32)
    if k >= 64:
        w[0, 32:64] = 0
    w[-1, :32] = -np.abs(w[-1, :32])
    w[n // 2, :2] = [3.0, -3.0]
    return w


# ---- the formats ---------------------------------------------------------------------------------

def _gguf():  # imported where used: the other tests need no gguf
    module = pytest.importorskip("gguf")
    return module, module.GGMLQuantizationType


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(1, 32), (7, 64), (33, 96), (5, 4128), (64, 256)])
def test_quantize_gives_ggufs_bytes_and_dequantize_its_values(fmt, shape):
    gguf_module, types = _gguf()
    qtype = {"q8_0": types.Q8_0, "q4_0": types.Q4_0, "bf16": types.BF16}[fmt]
    for seed in range(3):
        w = _weights(*shape, seed=seed)
        before = w.copy()
        ours = quant.quantize(w, fmt)
        theirs = gguf_module.quants.quantize(w, qtype)
        assert ours.data.dtype == np.uint8 and ours.data.ndim == 1 and not ours.data.flags.writeable
        np.testing.assert_array_equal(ours.data, theirs.reshape(-1))
        np.testing.assert_array_equal(ours.dequantize(), gguf_module.quants.dequantize(theirs, qtype))
        np.testing.assert_array_equal(w, before)  # W is never modified


def test_bf16_rounds_to_nearest_even():
    # 1 + 2^-8 is halfway between two bfloat16 values: it rounds to the even one, 1.0; one ulp
    # of float32 more rounds up; 1 + 3 * 2^-8 is halfway again and rounds up, to the even one.
    w = np.array([[1 + 2**-8, 1 + 2**-8 + 2**-23, 1 + 3 * 2**-8, -(1 + 2**-8)]], np.float32)
    got = quant.quantize(w, "bf16").dequantize()[0]
    np.testing.assert_array_equal(got, np.array([1.0, 1 + 2**-7, 1 + 2**-6, -1.0], np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_report_their_sizes(fmt):
    info = quant.FORMATS[fmt]
    w = quant.quantize(_weights(4, 128), fmt)
    assert w.nbytes == 4 * 128 // info.block_size * info.bytes_per_block == w.data.size
    assert w.bits_per_weight == info.bits_per_weight == {"q8_0": 8.5, "q4_0": 4.5, "bf16": 16.0}[fmt]
    assert w.shape == (4, 128) and w.dequantize().dtype == np.float32


def test_dequantize_follows_the_layouts():
    # q4_0: byte j holds weight j in its low nibble and weight j + 16 in its high nibble
    block = np.zeros(18, np.uint8)
    block[:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    block[2:] = np.arange(16, dtype=np.uint8) | (np.uint8(15) - np.arange(16, dtype=np.uint8)) << 4
    w = quant.QuantizedWeights("q4_0", 1, 32, block).dequantize()[0]
    np.testing.assert_array_equal(w[:16], 0.5 * (np.arange(16) - 8))
    np.testing.assert_array_equal(w[16:], 0.5 * (15 - np.arange(16) - 8))
    # q8_0: a float16 scale, then 32 int8
    block = np.zeros(34, np.uint8)
    block[:2] = np.frombuffer(np.float16(-0.25).tobytes(), np.uint8)
    block[2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    np.testing.assert_array_equal(quant.QuantizedWeights("q8_0", 1, 32, block).dequantize()[0],
                                  -0.25 * np.arange(-16, 16))


def _packed(fmt, n=2, k=64):
    return quant.quantize(_weights(n, k), fmt)


@pytest.mark.parametrize("make, match", [
    (lambda: quant.QuantizedWeights("q4_0", 2, 64, np.zeros(71, np.uint8)), "71 bytes, expected 72"),
    (lambda: quant.QuantizedWeights("q8_0", 2, 64, np.zeros(136, np.int8)), "dtype uint8"),
    (lambda: quant.QuantizedWeights("q8_0", 2, 64, np.zeros((2, 68), np.uint8)), "must be 1-D"),
    (lambda: quant.QuantizedWeights("q8_0", 2, 64, bytes(136)), "NumPy uint8 array"),
    (lambda: quant.QuantizedWeights("q8_0", 2, 48, np.zeros(102, np.uint8)), "K = 48 is not a multiple of the block size 32"),
    (lambda: quant.QuantizedWeights("q8_0", -1, 64, np.zeros(0, np.uint8)), "N must be a non-negative integer"),
    (lambda: quant.QuantizedWeights("q5_1", 2, 64, np.zeros(72, np.uint8)), "unknown weight format 'q5_1'"),
    (lambda: quant.quantize(np.ones((2, 64), np.float32), "q3_k"), "unknown weight format 'q3_k'"),
    (lambda: quant.quantize(np.ones((2, 48), np.float32), "q4_0"), "K = 48 is not a multiple of the block size 32"),
    (lambda: quant.quantize(np.ones(64, np.float32), "q8_0"), "2-D W"),
    (lambda: quant.quantize(np.ones((1, 2, 64), np.float32), "q8_0"), "2-D W"),
    (lambda: quant.quantize([[1.0] * 32], "q8_0"), "NumPy array"),
    (lambda: quant.quantize(np.full((1, 32), np.nan, np.float32), "q8_0"), r"infinite or NaN values .*\[0, 0\]"),
    (lambda: quant.quantize(np.array([[1.0] * 31 + [np.inf]], np.float32), "bf16"), r"infinite or NaN .*\[0, 31\]"),
    (lambda: quant.quantize(np.full((1, 32), 1e7, np.float32), "q4_0"), "beyond float16's range"),
    (lambda: quant.quantize(np.full((1, 32), 1e9, np.float32), "q8_0"), "beyond float16's range"),
    (lambda: quant.quantize(np.full((1, 2), 3.4e38, np.float32), "bf16"), "beyond bfloat16's range"),
])
def test_bad_weights_are_refused_by_name(make, match):
    with pytest.raises(MatmulInputError, match=match):
        make()


@pytest.mark.parametrize("fmt, byte, value, what", [
    ("q8_0", 34 + 1, 0x7C, r"infinite or NaN, the first at row 0, block 1"),   # scale of block 1: +inf
    ("q4_0", 18 * 2 + 1, 0x7E, r"infinite or NaN, the first at row 1, block 0"),  # row 1's scale: NaN
    ("bf16", 2 * 70 + 1, 0x7F, r"weight\(s\) are infinite or NaN, the first at row 1, column 6"),
])
def test_infinite_or_nan_scales_are_refused_where_they_are(fmt, byte, value, what):
    data = _packed(fmt).data.copy()
    data[byte] = value
    if fmt == "bf16":
        data[byte - 1] = 0x80  # 0x7F80: +inf
    else:
        data[byte - 1] = 0x00
    with pytest.raises(MatmulInputError, match=what):
        quant.QuantizedWeights(fmt, 2, 64, data)


def test_weights_keep_a_read_only_view_and_never_change_the_callers_buffer():
    data = _packed("q8_0").data.copy()
    before = data.copy()
    w = quant.QuantizedWeights("q8_0", 2, 64, data)
    assert data.flags.writeable and not w.data.flags.writeable
    with pytest.raises(ValueError):
        w.data[0] = 1
    np.testing.assert_array_equal(data, before)
    with pytest.raises(AttributeError):
        w.n = 3  # frozen
