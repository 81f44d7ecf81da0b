"""ggml.mul_mat, llama.cpp's own Q4_0 / Q8_0 product, as the decode rows' peer; and the error
model of a kernel that rounds its activations to Q8_0 (harness/model/activation_error.py).

The model's tests run everywhere. Those of ggml itself need ggml-python
(``pip install ggml-python``, or the ``ggml`` extra; not in the test extra, which CI installs)
and are skipped, saying so, where it is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness.backends import ggml_peer
from harness.model import activation_error
from harness.model.checking import check
from harness.model.quant import make_decode_inputs, quantize

IMPL = harness.lookup("ggml.mul_mat")
REASON = IMPL.unavailable_reason()
needs_ggml = pytest.mark.skipif(REASON is not None, reason=f"ggml.mul_mat unavailable: {REASON}")

FORMATS = ("q4_0", "q8_0")
# K: one block, two, three, a long odd count of blocks; N: one row of W, a few, more than a
# SIMD width; M: one activation row, two, past 16.
EDGE_SHAPES = [f"{m}x{n}x{k}" for k in (32, 64, 96, 4128) for n in (1, 7, 33) for m in (1, 2, 17)]


def problem(shape: str, fmt: str, seed: int = 0):
    """X [M, K] and the weights of the harness's decode problem, and W as float32 [N, K]."""
    x, w = make_decode_inputs(shape, fmt, seed)
    return x, w, w.dequantize()


def q8_0_activations(x: np.ndarray, levels: int = 127) -> np.ndarray:
    """X as ggml rounds it before multiplying: per block of 32, d = max|x| / 127, q = x * (127 /
    max|x|) to nearest (even), then q times the float16 d. ``levels`` other than 127 make a
    coarser (wrong) rounding."""
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = amax / np.float32(levels)
    inverse = np.where(amax > 0, np.float32(levels) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    return (np.rint(blocks * inverse) * d.astype(np.float16).astype(np.float32)).reshape(m, k)


def rounded_product(x, w_float, levels: int = 127) -> np.ndarray:
    return (q8_0_activations(x, levels).astype(np.float64) @ w_float.T.astype(np.float64)).astype(np.float32)


# ---- the error model (no ggml needed) --------------------------------------------------------


def model_inputs():
    """Seeded problems beyond the harness's uniform ones: non-negative terms (sums that grow
    steadily), activations spread over eight decades, blocks of very different size (some
    small enough that the float16 scale is subnormal)."""
    rng = np.random.default_rng(7)
    for kind in ("uniform", "non-negative", "mixed magnitudes", "block magnitudes"):
        m, n, k = 5, 37, 32 * 41
        x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        w = rng.uniform(-1, 1, (n, k)).astype(np.float32)
        if kind == "non-negative":
            x, w = np.abs(x), np.abs(w)
        elif kind == "mixed magnitudes":
            x = (x * 10.0 ** rng.uniform(-4, 4, (m, k))).astype(np.float32)
        elif kind == "block magnitudes":
            x = (x * np.repeat(10.0 ** rng.uniform(-6, 3, (m, k // 32)), 32, axis=1)).astype(np.float32)
        yield kind, x, quantize(w, "q4_0").dequantize()


@pytest.mark.parametrize("kind, x, w", list(model_inputs()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_kernel_that_rounds_x_to_q8_0_passes_the_declared_model(kind, x, w):
    outcome = check(rounded_product(x, w), x, w.T, activation_rounding="q8_0")
    assert outcome.passed, f"{kind}: {outcome.message}"
    assert outcome.worst_ratio < 0.7


def test_the_plain_float32_model_is_far_too_tight_for_it():
    x, _, w = problem("1x1024x1024", "q4_0")
    plain = check(rounded_product(x, w), x, w.T)
    assert not plain.passed and plain.worst_ratio > 100


def wrong_kernels(x, w):
    """Kernels a declared Q8_0 rounding must not excuse."""

    def dropped_block(x, w):
        rounded = q8_0_activations(x)
        rounded[:, 32:64] = 0
        return (rounded.astype(np.float64) @ w.T).astype(np.float32)

    def dropped_term(x, w):
        rounded = q8_0_activations(x)
        rounded[:, 5] = 0
        return (rounded.astype(np.float64) @ w.T).astype(np.float32)

    yield "activations rounded to 4 bits", rounded_product(x, w, levels=7)
    yield "a block of K skipped", dropped_block(x, w)
    yield "a term of the sum dropped", dropped_term(x, w)
    yield "the output shifted by one column", np.roll(rounded_product(x, w), 1, axis=1)
    yield "the weights' rows read one block too late", rounded_product(x, np.roll(w, -32, axis=1))


@pytest.mark.parametrize("shape", ["17x33x64", "3x256x1024", "1x4096x4096"])
def test_wrong_kernels_still_fail_the_declared_model(shape):
    x, _, w = problem(shape, "q4_0")
    assert check(rounded_product(x, w), x, w.T, activation_rounding="q8_0").passed
    for what, y in wrong_kernels(x, w):
        outcome = check(y, x, w.T, activation_rounding="q8_0")
        assert not outcome.passed, f"{shape}: {what} passed (worst {outcome.worst_ratio:.2f} of its allowance)"


def test_the_model_refuses_what_it_does_not_describe():
    x, _, w = problem("2x8x64", "q8_0")
    with pytest.raises(ValueError, match="unknown activation rounding 'q4_0'"):
        check(rounded_product(x, w), x, w.T, activation_rounding="q4_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        activation_error.extra_allowed(np.ones((1, 40), np.float32), np.ones((40, 3), np.float32))
    assert activation_error.extra_allowed(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)).shape == (2, 3)
    assert not activation_error.extra_allowed(np.ones((2, 0), np.float32), np.ones((0, 3), np.float32)).any()


def test_the_peer_is_registered_as_a_decode_peer_that_declares_its_rounding():
    assert IMPL.peer and IMPL.threaded and IMPL.device == "cpu"
    assert set(IMPL.weights) == set(FORMATS) and IMPL.dtypes == ("float32",)
    assert IMPL.activation_rounding == "q8_0"
    assert IMPL.activation_rounding in activation_error.ROUNDINGS


def test_without_the_package_it_says_how_to_install_it(monkeypatch):
    def missing():
        raise ImportError("No module named 'ggml'")

    monkeypatch.setattr(ggml_peer, "_ggml", missing)
    reason = IMPL.unavailable_reason()
    assert reason and "pip install ggml-python" in reason


# ---- ggml itself ------------------------------------------------------------------------------


@needs_ggml
@pytest.mark.parametrize("fmt", FORMATS)
def test_ggml_reads_the_bytes_as_quant_py_does(fmt):
    for shape in ("1x1x32", "1x7x96", "1x33x4128", "1x1100x64"):  # 1100 rows: more than one chunk
        _, w, w_float = problem(shape, fmt)
        ggml_peer.check_round_trip(w)
        assert np.array_equal(ggml_peer.ggml_dequantize(w).view(np.uint32), w_float.view(np.uint32))
        assert np.array_equal(ggml_peer.ggml_dequantize(w, slice(1, None)), w_float[1:])


@needs_ggml
@pytest.mark.parametrize("fmt", FORMATS)
def test_ggml_computes_x_rounded_to_q8_0_times_the_weights(fmt):
    """What the model assumes, observed: ggml's product is X rounded as q8_0_activations does,
    times exactly the format's weights, to float32 accuracy. It fails the plain model and
    passes the declared one."""
    mm = harness.get("ggml.mul_mat", threads=1)
    for shape in ("1x4096x4096", "17x33x4128", "2x7x96"):
        x, w, w_float = problem(shape, fmt)
        y = mm(x, w)
        assert y.dtype == np.float32 and y.shape == (x.shape[0], w.n)
        assert check(y, q8_0_activations(x), w_float.T).passed, shape
        declared = check(y, x, w_float.T, activation_rounding="q8_0")
        assert declared.passed and declared.worst_ratio < 0.7, f"{shape}: {declared.message}"
        if shape == "1x4096x4096":
            assert not check(y, x, w_float.T).passed


@needs_ggml
def test_ggml_passes_on_hard_inputs():
    mm = harness.get("ggml.mul_mat", threads=1)
    for kind, x, w_float in model_inputs():
        for fmt in FORMATS:
            w = quantize(w_float, fmt)  # q4_0 weights requantized: exact for q4_0, near for q8_0
            outcome = check(mm(x, w), x, w.dequantize().T, activation_rounding="q8_0")
            assert outcome.passed, f"{kind} {fmt}: {outcome.message}"


@needs_ggml
def test_threads_change_nothing_but_the_speed():
    x, w, _ = problem("3x70x4128", "q4_0")
    one = harness.get("ggml.mul_mat", threads=1)(x, w)
    assert np.array_equal(one, harness.get("ggml.mul_mat", threads=2)(x, w))  # each output is one thread's
    assert np.array_equal(one, harness.get("ggml.mul_mat")(x, w))  # None: every core this process may use
    with pytest.raises(ValueError, match="threads must be an integer >= 1"):
        harness.get("ggml.mul_mat", threads=0)(x, w)


@needs_ggml
def test_ggml_refuses_float_weights_and_gives_zeros_for_k_0():
    x, _, w_float = problem("1x8x64", "q8_0")
    with pytest.raises(harness.MatmulInputError, match="takes quantized weights"):
        harness.get("ggml.mul_mat")(x, np.ascontiguousarray(w_float.T))
    empty = harness.get("ggml.mul_mat")(np.ones((2, 0), np.float32), quantize(np.ones((3, 0), np.float32), "q4_0"))
    assert empty.shape == (2, 3) and not empty.any()
    assert "ggml" in harness.model.registry.describe(IMPL)


@needs_ggml
def test_compare_checks_and_times_ggml_on_the_edge_shapes():
    results = harness.compare(EDGE_SHAPES, ["ggml.mul_mat"], weights=list(FORMATS), min_time=0.002, baselines=False)
    assert len(results.rows) == len(EDGE_SHAPES) * len(FORMATS)
    for row in results.rows:
        assert row.passed and row.median_s, f"{row.shape} {row.weights}: {row.status}"
        assert row.threads == 1
