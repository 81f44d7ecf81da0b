"""Decode with quantized weights: the formats (harness/model/quant.py) byte for byte against the gguf
package (llama.cpp's Python reference), their refusals, and every decode implementation
(python.decode, c.decode in each variant this CPU has) on the edge shapes against the float64
product of X and the weights the format holds, with the same bits for every thread count."""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness.model import quant
from harness.model.checking import check
from harness.model.core import MatmulInputError

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
    if k >= 2:
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
    np.testing.assert_array_equal(
        quant.QuantizedWeights("q8_0", 1, 32, block).dequantize()[0], -0.25 * np.arange(-16, 16)
    )


def _packed(fmt, n=2, k=64):
    return quant.quantize(_weights(n, k), fmt)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: quant.QuantizedWeights("q4_0", 2, 64, np.zeros(71, np.uint8)), "71 bytes, expected 72"),
        (lambda: quant.QuantizedWeights("q8_0", 2, 64, np.zeros(136, np.int8)), "dtype uint8"),
        (lambda: quant.QuantizedWeights("q8_0", 2, 64, np.zeros((2, 68), np.uint8)), "must be 1-D"),
        (lambda: quant.QuantizedWeights("q8_0", 2, 64, bytes(136)), "NumPy uint8 array"),
        (
            lambda: quant.QuantizedWeights("q8_0", 2, 48, np.zeros(102, np.uint8)),
            "K = 48 is not a multiple of the block size 32",
        ),
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
    ],
)
def test_bad_weights_are_refused_by_name(make, match):
    with pytest.raises(MatmulInputError, match=match):
        make()


@pytest.mark.parametrize(
    "fmt, byte, value, what",
    [
        ("q8_0", 34 + 1, 0x7C, r"infinite or NaN, the first at row 0, block 1"),  # scale of block 1: +inf
        ("q4_0", 18 * 2 + 1, 0x7E, r"infinite or NaN, the first at row 1, block 0"),  # row 1's scale: NaN
        ("bf16", 2 * 70 + 1, 0x7F, r"weight\(s\) are infinite or NaN, the first at row 1, column 6"),
    ],
)
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


# ---- the implementations ---------------------------------------------------------------------

from harness.backends import decode as decode_backend  # noqa: E402

C_IMPL = harness.lookup("c.decode")
_c_reason = C_IMPL.unavailable_reason()
needs_c = pytest.mark.skipif(_c_reason is not None, reason=f"c.decode unavailable: {_c_reason}")


def _variants() -> list[str]:
    return decode_backend.decode_variants() if _c_reason is None else []


def _activations(m: int, k: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


def _run(name: str, x: np.ndarray, w: quant.QuantizedWeights, **options) -> np.ndarray:
    """prepare / run / result, as the harness times it, with the inputs checked unchanged."""
    impl = harness.lookup(name)
    x_before, w_before = x.copy(), w.data.copy()
    prepared = impl.backend.prepare(impl, x, w, {**impl.options, **options})
    prepared.run()
    y = prepared.result()
    assert y.shape == (x.shape[0], w.n) and y.dtype == np.float32
    np.testing.assert_array_equal(x, x_before)  # inputs are never modified
    np.testing.assert_array_equal(w.data, w_before)
    return y


def _check(y, x, w, label):
    outcome = check(y, x, w.dequantize().T)  # float64 of X times the weights the format holds
    assert outcome.passed, f"{label}: {outcome.message}"


EDGE_K = [32, 64, 96, 4128]
EDGE_N = [1, 7, 33]
EDGE_M = list(range(1, 18))
BF16_K = [1, 31, 33, 5000]  # bf16 has no blocks: K ends in a partial step


def _edge_weights(fmt):
    ks = EDGE_K + (BF16_K if fmt == "bf16" else [])
    return [(n, k, quant.quantize(_weights(n, k, seed=n + k), fmt)) for n in EDGE_N for k in ks]


@needs_c
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", ["auto", *_variants()])
def test_c_decode_on_the_edge_shapes(variant, fmt):
    for n, k, w in _edge_weights(fmt):
        x_all = _activations(max(EDGE_M), k, seed=k)
        for m in EDGE_M:
            x = x_all[:m]
            _check(_run("c.decode", x, w, variant=variant, threads=1), x, w, f"c.decode {variant} {fmt} {m}x{n}x{k}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_python_decode_on_the_edge_shapes(fmt):
    for n, k, w in _edge_weights(fmt):
        x_all = _activations(17, k, seed=k)
        for m in (1, 2, 17) if k < 4000 else (1, 17):
            x = x_all[:m]
            _check(_run("python.decode", x, w), x, w, f"python.decode {fmt} {m}x{n}x{k}")


# Shapes big enough to be cut between two threads, through each of the kernels' paths: M = 1,
# several rows of W at a time, 16 rows, a second pass of rows (17), and an X too large to stay
# in L2 (K in pieces; on AVX2, rows 0..7 and 8..15 taking turns), with bf16's partial step.
THREAD_SHAPES = [(1, 300, 4128), (3, 129, 4128), (16, 67, 2048), (17, 40, 1024), (9, 24, 8192), (16, 19, 16384)]


@needs_c
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", _variants())
def test_c_decode_gives_the_same_bits_for_every_thread_count(variant, fmt):
    for m, n, k in THREAD_SHAPES:
        k = k + 17 if fmt == "bf16" else k
        w = quant.quantize(_weights(n, k, seed=m), fmt)
        x = _activations(m, k, seed=n)
        one = _run("c.decode", x, w, variant=variant, threads=1)
        _check(one, x, w, f"c.decode {variant} {fmt} {m}x{n}x{k}")
        for threads in (2, 3):
            np.testing.assert_array_equal(
                _run("c.decode", x, w, variant=variant, threads=threads),
                one,
                err_msg=f"{variant} {fmt} {m}x{n}x{k}: threads=1 and {threads} differ",
            )


@needs_c
def test_c_decode_through_the_harness_call():
    # harness.get(...)(x, w): validated, prepared, run; X need not be contiguous
    w = quant.quantize(_weights(33, 256), "q4_0")
    x = _activations(5, 512)[:, ::2]
    y = harness.get("c.decode", threads=2)(x, w)
    _check(y, np.ascontiguousarray(x), w, "c.decode through harness.get")
    _check(harness.get("python.decode")(x, w), np.ascontiguousarray(x), w, "python.decode through harness.get")


@needs_c
@pytest.mark.parametrize("fmt", FORMATS)
def test_c_decode_empty_shapes(fmt):
    w = quant.quantize(np.zeros((3, 0), np.float32), fmt)
    np.testing.assert_array_equal(_run("c.decode", _activations(2, 0), w), np.zeros((2, 3), np.float32))
    w = quant.quantize(_weights(3, 64), fmt)
    assert _run("c.decode", _activations(0, 64), w).shape == (0, 3)


@needs_c
def test_c_decode_refuses_bad_arguments_by_name():
    w = quant.quantize(_weights(4, 64), "q8_0")
    x = _activations(2, 64)
    impl = C_IMPL
    with pytest.raises(MatmulInputError, match="QuantizedWeights"):
        impl.backend.prepare(impl, x, np.ones((64, 4), np.float32), impl.options)
    with pytest.raises(MatmulInputError, match="float32 activations"):
        impl.backend.prepare(impl, x.astype(np.float64), w, impl.options)
    with pytest.raises(MatmulInputError, match="must equal W's K"):
        impl.backend.prepare(impl, _activations(2, 32), w, impl.options)
    with pytest.raises(MatmulInputError, match="2-D X"):
        impl.backend.prepare(impl, x[0], w, impl.options)
    with pytest.raises(ValueError, match="unknown variant 'avx1024'"):
        impl.backend.prepare(impl, x, w, {"threads": 1, "variant": "avx1024"})
    with pytest.raises(ValueError, match="threads must be an integer"):
        impl.backend.prepare(impl, x, w, {"threads": 0, "variant": "auto"})
    # the C function's own checks, mapped to messages
    with pytest.raises(MatmulInputError, match="unknown weight format"):
        decode_backend.check_decode_status("c.decode", 3)
    with pytest.raises(MatmulInputError, match="multiple of the format's block"):
        decode_backend.check_decode_status("c.decode", 4)
    ffi, lib = decode_backend._library()
    y = np.empty((2, 4), np.float32)
    args = (ffi.from_buffer("float[]", x), ffi.from_buffer("uint8_t[]", w.data), ffi.from_buffer("float[]", y))
    assert lib.matmul_decode_f32(*args, 2, 4, 64, 8, 1, 0) == 0
    assert lib.matmul_decode_f32(*args, -1, 4, 64, 8, 1, 0) == 2  # negative dimension
    assert lib.matmul_decode_f32(*args, 2, 4, 64, 3, 1, 0) == 3  # not a ggml type it takes
    assert lib.matmul_decode_f32(*args, 2, 4, 48, 8, 1, 0) == 4  # K not a multiple of 32
    assert lib.matmul_decode_f32(*args, 2, 4, 64, 8, 1, 99) == 1  # no such variant


def test_unsupported_variants_are_refused_before_any_c_runs():
    if _c_reason is not None:
        pytest.skip(_c_reason)
    missing = [v for v in ("avx2", "avx512") if v not in _variants()]
    if not missing:
        pytest.skip("this CPU runs every variant")
    with pytest.raises(harness.UnavailableError, match="cannot run on this CPU"):
        decode_backend.decode_variant(missing[0])


# ---- c.decode_int8: X quantized to q8_0, integer dot products (not registered) ------------------

INT8 = decode_backend.INT8_IMPLEMENTATION


def _int8_variants() -> list[str]:
    return decode_backend.decode_variants("matmul_decode_int8") if _c_reason is None else []


def _run_int8(x, w, **options):
    x_before, w_before = x.copy(), w.data.copy()
    prepared = INT8.backend.prepare(INT8, x, w, {**INT8.options, **options})
    prepared.run()
    y = prepared.result()
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(w.data, w_before)
    return y


def _check_int8(y, x, w, label):
    # 1. against the float64 product of the activations it multiplied (X in q8_0) and W: the
    #    ordinary float32 error model (the integer block sums are exact)
    xq = decode_backend.quantized_activations(x)
    _check(y, xq, w, label)
    # 2. against the exact product of X and W: X's rounding moves each activation by at most
    #    d_x / 2 (half a step of its block's grid, d_x = its scale), so each output by at most
    #    sum over blocks of d_x / 2 * sum of |w| over the block, plus the float32 error
    exact = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
    m, k = x.shape
    d_x = quant.quantize(np.ascontiguousarray(x), "q8_0").scales().astype(np.float64)  # [M, K / 32]
    abs_w = np.abs(w.dequantize().astype(np.float64)).reshape(w.n, k // 32, 32).sum(axis=-1)  # [N, K / 32]
    bound = (d_x / 2) @ abs_w.T
    from harness.model.checking import reference_data, tolerance

    ref = reference_data(xq, w.dequantize().T)
    allowed = bound + tolerance("float32", k, ref.product, ref.terms_norm)
    error = np.abs(y - exact)
    assert (error <= allowed).all(), f"{label}: {int((error > allowed).sum())} outputs past X's rounding bound"
    # 3. the model the harness checks it with: the exact product, plus the error X's q8_0
    #    rounding implies (harness/model/activation_error.py), as the implementation declares
    declared = check(y, x, w.dequantize().T, activation_rounding=INT8.activation_rounding)
    assert declared.passed, f"{label} (declared activation rounding): {declared.message}"
    return float((error / np.maximum(allowed, 1e-300)).max())


@needs_c
@pytest.mark.parametrize("variant", _int8_variants())
def test_the_c_activation_quantizer_gives_ggufs_q8_0_bytes(variant):
    ffi, lib = decode_backend._library()
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(32 * 64) * 10.0 ** rng.integers(-8, 4, size=32 * 64).repeat(1)).astype(np.float32)
    x[:32] = 0
    x[32:64] = 1e-6 * rng.standard_normal(32)  # a scale in float16's subnormals
    x[64:96] = np.linspace(-1, 1, 32)  # halves to round away from zero
    x[96:128] = np.arange(-16, 16) * np.float32(0.5) + np.float32(0.25)  # more halves, both signs
    out = np.empty(64 * 34, np.uint8)
    number = decode_backend.VARIANTS[variant]
    assert (
        lib.matmul_quantize_q8_0(ffi.from_buffer("float[]", x), x.size, ffi.from_buffer("uint8_t[]", out), number) == 0
    )
    np.testing.assert_array_equal(out, quant.quantize(x[None, :], "q8_0").data, err_msg=variant)
    assert lib.matmul_quantize_q8_0(ffi.from_buffer("float[]", x), 48, ffi.from_buffer("uint8_t[]", out), number) == 4


@needs_c
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("variant", ["auto", *_int8_variants()])
def test_c_decode_int8_on_the_edge_shapes_within_the_activation_rounding(variant, fmt):
    for n, k, w in _edge_weights(fmt):
        x_all = _activations(max(EDGE_M), k, seed=k + 1)
        for m in EDGE_M:
            x = x_all[:m]
            _check_int8(_run_int8(x, w, variant=variant, threads=1), x, w, f"c.decode_int8 {variant} {fmt} {m}x{n}x{k}")


@needs_c
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("variant", _int8_variants())
def test_c_decode_int8_gives_the_same_bits_for_every_thread_count(variant, fmt):
    for m, n, k in THREAD_SHAPES[:4]:
        w = quant.quantize(_weights(n, k, seed=m), fmt)
        x = _activations(m, k, seed=n)
        one = _run_int8(x, w, variant=variant, threads=1)
        _check_int8(one, x, w, f"c.decode_int8 {variant} {fmt} {m}x{n}x{k}")
        for threads in (2, 3):
            np.testing.assert_array_equal(_run_int8(x, w, variant=variant, threads=threads), one)


@needs_c
def test_c_decode_int8_refuses_bf16_and_its_rounding_is_real():
    w16 = quant.quantize(_weights(4, 64), "bf16")
    with pytest.raises(MatmulInputError, match="does not take bf16"):
        INT8.backend.prepare(INT8, _activations(1, 64), w16, INT8.options)
    # the activation rounding is visible: the weight-only kernel is much closer to the exact product
    w = quant.quantize(_weights(64, 4096), "q8_0")
    x = _activations(4, 4096)
    exact = x.astype(np.float64) @ w.dequantize().T.astype(np.float64)
    int8_error = np.abs(_run_int8(x, w) - exact).max()
    float_error = np.abs(_run("c.decode", x, w) - exact).max()
    assert int8_error > 10 * float_error


def _int8_layout(w: quant.QuantizedWeights) -> np.ndarray:
    """matmul_decode_int8_pack's layout as c/decode_int8.c's header describes it, in NumPy: rows
    in tiles of 4 and blocks of 8 tiles; K in groups of 16 blocks, slices of 2 groups; a
    block's weights 4s..4s+3 in slot s at lane l (q4_0: slots 4..7 in the high nibbles), then
    each row's 16 float16 scales; the bytes in the order block, slice, tile, group, row."""
    tile, group, block_tiles, slice_groups = 4, 16, 8, 2
    n, k = w.n, w.k
    blocks, groups = k // 32, -(-(k // 32) // 16)
    q4 = w.format == "q4_0"
    raw = w.data.reshape(n, blocks, 18 if q4 else 34)
    scales = np.zeros((n, groups * group, 2), np.uint8)
    scales[:, :blocks] = raw[:, :, :2]
    weights = np.full((n, groups * group, 32), 8 if q4 else 0, np.uint8)  # unsigned nibble, or the byte
    weights[:, :blocks] = np.concatenate([raw[:, :, 2:] & 15, raw[:, :, 2:] >> 4], axis=-1) if q4 else raw[:, :, 2:]
    weight_bytes = 256 if q4 else 512
    row_group = weight_bytes + 32
    out = np.zeros(n * groups * row_group, np.uint8)
    for j in range(n):
        t, r = divmod(j, tile)
        rows_in = min(tile, n - t * tile)
        b = t // block_tiles
        rows_in_block = min(block_tiles * tile, n - b * block_tiles * tile)
        for g in range(groups):
            g0 = g // slice_groups * slice_groups
            in_slice = min(slice_groups, groups - g0)
            at = row_group * (
                b * block_tiles * tile * groups
                + rows_in_block * g0
                + (t - b * block_tiles) * tile * in_slice
                + (g - g0) * rows_in
            )
            slots = weights[j, g * group : (g + 1) * group].reshape(group, 8, 4).transpose(1, 0, 2).reshape(8, 64)
            row_bytes = (slots[:4] | slots[4:] << 4) if q4 else slots
            out[at + r * weight_bytes : at + (r + 1) * weight_bytes] = row_bytes.ravel()
            scale_at = at + rows_in * weight_bytes + r * 32
            out[scale_at : scale_at + 32] = scales[j, g * group : (g + 1) * group].ravel()
    return out


@needs_c
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_c_decode_int8_packs_w_as_its_header_says(fmt):
    # 37 rows: a full block of 8 tiles, then a block of one tile and a tile of one row; 35
    # blocks along K: 3 groups, slices of 2 and 1, the last group padded
    for n, k in ((37, 35 * 32), (1, 32), (4, 16 * 32)):
        w = quant.quantize(_weights(n, k, seed=n), fmt)
        np.testing.assert_array_equal(decode_backend.pack_int8_weights(w), _int8_layout(w), err_msg=f"{fmt} {n}x{k}")


@needs_c
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_K"])
def test_c_decode_int8_packed_w_starts_on_a_page(fmt):
    # the kernels load W 64 bytes at a time from multiples of 64 past its start: a start in the
    # middle of a cache line (where NumPy puts a large array) makes every load straddle two
    for n in (1, 37, 300):
        packed = decode_backend.pack_int8_weights(quant.quantize(_weights(n, 512, seed=n), fmt))
        assert packed.ctypes.data % decode_backend.PACKED_ALIGNMENT == 0, f"{fmt} {n}x512"
        assert decode_backend.PACKED_ALIGNMENT % 64 == 0


@needs_c
def test_c_decode_int8_pack_refuses_bad_shapes_by_code():
    ffi, lib = decode_backend._library()
    assert lib.matmul_decode_int8_packed_bytes(4, 48, 2) == -4  # K not a multiple of 32
    assert lib.matmul_decode_int8_packed_bytes(4, 64, 30) == -3  # bf16: not a format it takes
    assert lib.matmul_decode_int8_packed_bytes(-1, 64, 2) == -2
    out = np.empty(16, np.uint8)
    assert (
        lib.matmul_decode_int8_pack(ffi.from_buffer("uint8_t[]", out), 4, 48, 2, ffi.from_buffer("uint8_t[]", out)) == 4
    )


@needs_c
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
@pytest.mark.parametrize("variant", _int8_variants())
def test_c_decode_int8_gives_each_row_of_x_the_same_bits_whatever_m(variant, fmt):
    # 100 rows of W are 4 blocks of 32, and 40 rows of X three passes: past one pass each block
    # runs every pass before the next block (prefill), which must not change a bit either; from
    # 9 rows the VNNI kernel takes four rows of W and of X at once (10, 13: a short last gang)
    w = quant.quantize(_weights(100, 4128, seed=3), fmt)
    x = _activations(40, 4128, seed=4)
    batch = _run_int8(x, w, variant=variant, threads=2)
    for m in (1, 5, 8, 9, 10, 13, 16, 17, 33):
        np.testing.assert_array_equal(_run_int8(x[:m], w, variant=variant, threads=1), batch[:m], err_msg=f"M = {m}")
    np.testing.assert_array_equal(_run_int8(x[9:10], w, variant=variant), batch[9:10])


@needs_c
def test_c_decode_int8_refuses_activations_it_cannot_round():
    w = quant.quantize(_weights(4, 64), "q4_0")
    for bad in (np.nan, np.inf):
        x = _activations(3, 64)
        x[2, 40] = bad
        with pytest.raises(
            MatmulInputError, match=r"holds no infinity or NaN: X has 1 such values, the first at \[2, 40\]"
        ):
            INT8.backend.prepare(INT8, x, w, INT8.options)
    # the weight-only kernel carries them through, as float arithmetic does
    x[2, 40] = np.nan
    assert np.isnan(_run("c.decode", x, w)[2]).all() and np.isfinite(_run("c.decode", x, w)[:2]).all()
