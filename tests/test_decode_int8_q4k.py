"""c.decode_int8 on GGUF's q4_K weights (c/decode_int8_q4k.c): X quantized to q8_0 blocks of 32,
one integer dot product per 32-weight sub-block, scaled in float32.

Each product is checked three ways (as tests/test_decode.py checks the q4_0 and q8_0 rows):
against the float64 product of the quantized X and the weights q4_K holds with the ordinary
float32 error model, against the exact product within X's rounding bound, and with the
activation rounding the implementation declares ("q8_0"). Then: the same bits for every
thread count and every M in each variant, the same bits from the portable C and the AVX2
kernel (which do the same operations), the packed layout as the file's header draws
it, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness.backends import decode as decode_backend
from harness.model import quant
from harness.model.checking import check, reference_data, tolerance
from harness.model.core import MatmulInputError

INT8 = decode_backend.INT8_IMPLEMENTATION
_reason = INT8.unavailable_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"c.decode_int8 unavailable: {_reason}")

Q4_K = quant.FORMATS["q4_K"].ggml_type  # 12

EDGE_K = [256, 512, 768, 4096 + 256]
EDGE_N = [1, 3, 4, 5, 7, 17, 33]
EDGE_M = list(range(1, 18))


def _variants() -> list[str]:
    return decode_backend.decode_variants("matmul_decode_int8") if _reason is None else []


def _weights(n: int, k: int, seed: int = 0) -> np.ndarray:
    """W [N, K] with rows of very different magnitude, an all-zero sub-block, an all-negative
    one, an all-positive one (its min is 0) and a constant one."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w *= np.float32(10.0) ** rng.integers(-3, 4, size=(n, 1)).astype(np.float32)
    w[0, 32:64] = 0
    w[-1, :32] = -np.abs(w[-1, :32])
    w[n // 2, 64:96] = np.abs(w[n // 2, 64:96])
    w[n // 2, 96:128] = 0.75
    return w


def _random_bytes(n: int, k: int, seed: int) -> quant.QuantizedWeights:
    """q4_K super-blocks of random bytes (every 6-bit scale and min, every nibble), with d and
    dmin random finite float16 of moderate size."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
    halves = (rng.standard_normal((n, k // 256, 2)) * 0.01).astype("<f2")
    blocks[..., 0:4] = halves.view(np.uint8).reshape(n, k // 256, 4)
    return quant.QuantizedWeights("q4_K", n, k, blocks.reshape(-1))


def _activations(m: int, k: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


def _run(x, w, **options) -> np.ndarray:
    """prepare / run / result, as the harness times it, with the inputs checked unchanged."""
    x_before, w_before = x.copy(), w.data.copy()
    prepared = INT8.backend.prepare(INT8, x, w, {**INT8.options, **options})
    prepared.run()
    y = prepared.result()
    assert y.shape == (x.shape[0], w.n) and y.dtype == np.float32
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(w.data, w_before)
    return y


def _check(y, x, w, label):
    weights = w.dequantize()
    # 1. the float32 error model against what it multiplied: X in q8_0 and q4_K's weights
    xq = decode_backend.quantized_activations(x)
    outcome = check(y, xq, weights.T)
    assert outcome.passed, f"{label}: {outcome.message}"
    # 2. against the exact product: each activation moved by at most half its block's scale d_x
    exact = x.astype(np.float64) @ weights.T.astype(np.float64)
    m, k = x.shape
    d_x = quant.quantize(np.ascontiguousarray(x), "q8_0").scales().astype(np.float64)  # [M, K / 32]
    abs_w = np.abs(weights.astype(np.float64)).reshape(w.n, k // 32, 32).sum(axis=-1)  # [N, K / 32]
    ref = reference_data(xq, weights.T)
    allowed = (d_x / 2) @ abs_w.T + tolerance("float32", k, ref.product, ref.terms_norm)
    error = np.abs(y - exact)
    assert (error <= allowed).all(), f"{label}: {int((error > allowed).sum())} outputs past X's rounding bound"
    # 3. the model the harness checks it with (the rounding it declares)
    declared = check(y, x, weights.T, activation_rounding=INT8.activation_rounding)
    assert declared.passed, f"{label} (declared activation rounding): {declared.message}"


def test_c_decode_int8_takes_q4_k_with_its_declared_rounding():
    assert "q4_K" in INT8.weights and INT8.activation_rounding == "q8_0"


@pytest.mark.parametrize("variant", ["auto", *_variants()])
@pytest.mark.parametrize("k", EDGE_K)
def test_on_the_edge_shapes_within_the_activation_rounding(variant, k):
    x_all = _activations(max(EDGE_M), k, seed=k + 1)
    for n in EDGE_N:
        w = quant.quantize(_weights(n, k, seed=n + k), "q4_K")
        for m in EDGE_M:
            x = x_all[:m]
            _check(_run(x, w, variant=variant, threads=1), x, w, f"{variant} {m}x{n}x{k}")


@pytest.mark.parametrize("variant", _variants())
def test_on_random_super_blocks(variant):
    # every 6-bit scale and min (their top bits too) and every nibble, in every lane
    for n, k in ((5, 256), (17, 1280), (33, 4096 + 256)):
        w = _random_bytes(n, k, seed=n)
        x = _activations(17, k, seed=k)
        for m in (1, 4, 16, 17):
            _check(_run(x[:m], w, variant=variant, threads=2), x[:m], w, f"{variant} random {m}x{n}x{k}")


# M = 1, several rows of X, 16 and a second pass (17); blocks of rows cut between threads; K in
# one slice, in slices with a short last one, and long (4608 = 18 super-blocks: 4 + 4 + ... + 2)
THREAD_SHAPES = [(1, 300, 4096 + 256), (3, 129, 4608), (16, 67, 2048), (17, 40, 1024), (9, 24, 768), (16, 35, 256)]


@pytest.mark.parametrize("variant", _variants())
def test_the_same_bits_for_every_thread_count(variant):
    for m, n, k in THREAD_SHAPES:
        w = quant.quantize(_weights(n, k, seed=m), "q4_K")
        x = _activations(m, k, seed=n)
        one = _run(x, w, variant=variant, threads=1)
        _check(one, x, w, f"{variant} {m}x{n}x{k}")
        for threads in (2, 3):
            np.testing.assert_array_equal(
                _run(x, w, variant=variant, threads=threads),
                one,
                err_msg=f"{variant} {m}x{n}x{k}: threads=1 and {threads} differ",
            )


@pytest.mark.parametrize("variant", _variants())
def test_each_row_of_x_gets_the_same_bits_whatever_m(variant):
    # 100 rows of W are 7 blocks of 16, and 40 rows of X three passes: past one pass two blocks
    # at a time run every pass (prefill), which must not change a bit either
    w = quant.quantize(_weights(100, 4096 + 256, seed=3), "q4_K")
    x = _activations(40, 4096 + 256, seed=4)
    batch = _run(x, w, variant=variant, threads=2)
    np.testing.assert_array_equal(_run(x[17:40], w, variant=variant, threads=1), batch[17:40])
    for m in range(1, 17):
        np.testing.assert_array_equal(_run(x[:m], w, variant=variant, threads=1), batch[:m], err_msg=f"M = {m}")
    np.testing.assert_array_equal(_run(x[9:10], w, variant=variant, threads=2), batch[9:10])
    np.testing.assert_array_equal(_run(x[16:17], w, variant=variant, threads=1), batch[16:17])


def test_the_portable_c_and_the_avx2_kernel_give_the_same_bits():
    # the portable C does the AVX2 kernel's operations (fmaf), in its order; the AVX-512 VNNI
    # kernel sums each lane over every other super-block (two a register), so its bits are its
    # own: the error models above check it, and the tests after this its bits across threads and M
    variants = [v for v in _variants() if v in ("portable", "avx2")]
    if len(variants) < 2:
        pytest.skip("this CPU runs only the portable variant")
    for m, n, k in ((1, 33, 256), (5, 17, 4608), (16, 40, 1024), (17, 7, 768)):
        w = quant.quantize(_weights(n, k, seed=k), "q4_K")
        x = _activations(m, k, seed=m)
        results = {variant: _run(x, w, variant=variant, threads=2) for variant in variants}
        np.testing.assert_array_equal(results["avx2"], results["portable"], err_msg=f"{m}x{n}x{k}")


def test_avx512_is_refused_where_the_cpu_lacks_it_and_is_what_auto_runs_where_it_has_it():
    w = quant.quantize(_weights(9, 512), "q4_K")
    x = _activations(3, 512)
    if "avx512" not in _variants():
        with pytest.raises(harness.UnavailableError, match="cannot run on this CPU"):
            INT8.backend.prepare(INT8, x, w, {"threads": 1, "variant": "avx512"})
        return
    np.testing.assert_array_equal(_run(x, w, variant="auto"), _run(x, w, variant="avx512"))


def _layout(w: quant.QuantizedWeights) -> np.ndarray:
    """decode_int8_q4k_pack's layout as c/decode_int8_q4k.c's header describes it, in NumPy:
    rows in blocks of 16, K in slices of 4 super-blocks; in each block its slices, in each slice
    its rows, in each row's slice its super-blocks' quants (128 bytes each: vector v's bytes
    4j .. 4j + 3 hold weights 4v .. 4v + 3 of sub-block j low, 16 + 4v .. 16 + 4v + 3 high), then
    their 16-byte headers as ggml stores them."""
    block_rows, slice_supers = 16, 4
    n, k = w.n, w.k
    supers = k // 256
    raw = w.data.reshape(n, supers, 144)
    chunks = raw[..., 16:].reshape(n, supers, 4, 32)
    q = np.stack([chunks & 15, chunks >> 4], axis=3).reshape(n, supers, 8, 32)  # [row, super, sub-block, weight]
    slots = q.reshape(n, supers, 8, 8, 4).transpose(0, 1, 3, 2, 4).reshape(n, supers, 8, 32)  # [.., slot, 4j + t]
    quants = (slots[:, :, :4] | slots[:, :, 4:] << 4).reshape(n, supers, 128)
    out = []
    for b0 in range(0, n, block_rows):
        for g0 in range(0, supers, slice_supers):
            for j in range(b0, min(b0 + block_rows, n)):
                g1 = min(g0 + slice_supers, supers)
                out += [quants[j, g0:g1].ravel(), raw[j, g0:g1, :16].ravel()]
    return np.concatenate(out) if out else np.zeros(0, np.uint8)


def test_w_is_packed_as_the_header_says():
    # 37 rows: two blocks of 16 and one of 5; 18 super-blocks: slices of 4, the last of 2
    for n, k in ((37, 18 * 256), (1, 256), (16, 4 * 256), (3, 5 * 256)):
        w = quant.quantize(_weights(n, k, seed=n), "q4_K")
        packed = decode_backend.pack_int8_weights(w)
        assert packed.size == w.nbytes  # the same bytes, moved
        np.testing.assert_array_equal(packed, _layout(w), err_msg=f"{n}x{k}")


def test_through_the_harness_call_and_compare():
    w = quant.quantize(_weights(33, 512), "q4_K")
    x = _activations(5, 1024)[:, ::2]  # not contiguous
    y = harness.get("c.decode_int8", threads=2)(x, w)
    _check(y, np.ascontiguousarray(x), w, "through harness.get")
    results = harness.compare(["3x40x512"], ["c.decode_int8"], weights=["q4_K"], min_time=0.01, baselines=False)
    row = results.row("c.decode_int8", "3x40x512", weights="q4_K")
    assert row.passed, row.status


def test_empty_shapes():
    w = quant.quantize(np.zeros((3, 0), np.float32), "q4_K")
    np.testing.assert_array_equal(_run(_activations(2, 0), w), np.zeros((2, 3), np.float32))
    w = quant.quantize(_weights(3, 256), "q4_K")
    assert _run(_activations(0, 256), w).shape == (0, 3)
    w = quant.quantize(np.zeros((0, 256), np.float32), "q4_K")
    assert _run(_activations(2, 256), w).shape == (2, 0)


def test_bad_inputs_are_refused_by_name():
    # K not a multiple of 256: refused where the weights are made, and by the C itself
    with pytest.raises(MatmulInputError, match="K = 288 is not a multiple of the block size 256"):
        quant.quantize(np.ones((2, 288), np.float32), "q4_K")
    with pytest.raises(MatmulInputError, match="K = 32 is not a multiple of the block size 256"):
        quant.QuantizedWeights("q4_K", 1, 32, np.zeros(18, np.uint8))
    ffi, lib = decode_backend._library()
    assert lib.matmul_decode_int8_packed_bytes(4, 288, Q4_K) == -4
    assert lib.matmul_decode_int8_packed_bytes(-1, 256, Q4_K) == -2
    assert lib.matmul_decode_int8_packed_bytes(4, 512, Q4_K) == 4 * 2 * 144
    out = np.zeros(4 * 2 * 144, np.uint8)
    buffer = ffi.from_buffer("uint8_t[]", out)
    assert lib.matmul_decode_int8_pack(buffer, 4, 288, Q4_K, buffer) == 4
    with pytest.raises(MatmulInputError, match="multiple of the format's block size"):
        decode_backend.check_decode_status("c.decode_int8", lib.matmul_decode_int8_pack(buffer, 4, 288, Q4_K, buffer))
    x, y = np.zeros((2, 512), np.float32), np.zeros((2, 4), np.float32)
    args = (ffi.from_buffer("float[]", x), buffer, ffi.from_buffer("float[]", y))
    assert lib.matmul_decode_int8_f32(*args, 2, 4, 512, Q4_K, 1, 0) == 0
    assert lib.matmul_decode_int8_f32(*args, 2, 4, 288, Q4_K, 1, 0) == 4  # K not a multiple of 256
    assert lib.matmul_decode_int8_f32(*args, -1, 4, 512, Q4_K, 1, 0) == 2  # negative dimension
    assert lib.matmul_decode_int8_f32(*args, 2, 4, 512, Q4_K, 1, 99) == 1  # no such variant
    # X that does not fit W, X the q8_0 rounding cannot hold, an unknown variant
    w = quant.quantize(_weights(4, 512), "q4_K")
    with pytest.raises(MatmulInputError, match="must equal W's K"):
        INT8.backend.prepare(INT8, _activations(2, 256), w, INT8.options)
    bad = _activations(3, 512)
    bad[1, 300] = np.inf
    with pytest.raises(
        MatmulInputError, match=r"holds no infinity or NaN: X has 1 such values, the first at \[1, 300\]"
    ):
        INT8.backend.prepare(INT8, bad, w, INT8.options)
    with pytest.raises(ValueError, match="unknown variant 'avx1024'"):
        INT8.backend.prepare(INT8, _activations(2, 512), w, {"threads": 1, "variant": "avx1024"})
    # c.decode (weight-only) still takes only q8_0, q4_0 and bf16
    with pytest.raises(MatmulInputError, match="does not take q4_K"):
        impl = harness.lookup("c.decode")
        impl.backend.prepare(impl, _activations(2, 512), w, impl.options)
