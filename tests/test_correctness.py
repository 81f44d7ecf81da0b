"""Every implementation in the registry against the float64 reference, on the shapes that find bugs."""

from __future__ import annotations

import numpy as np
import pytest

import harness
import harness.env.sources
from harness.model import checking, quant
from harness.model.core import MatmulInputError, check_problem
from harness.model.inputs import Shape

EDGE_SIZES = [1, 2, 7, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129]
NON_SQUARE = [
    Shape(1, 64, 33),  # M = 1: the GEMV shape
    Shape(1, 130, 70),
    Shape(33, 65, 1),  # K = 1: one outer product
    Shape(17, 1, 63),  # N = 1
    Shape(7, 129, 16),
    Shape(65, 15, 127),
    Shape(100, 130, 70),
    Shape(16, 48, 32),  # multiples of 16, non-square (tensor-core kernels)
]
EDGE_SHAPES = [Shape(s, s, s) for s in EDGE_SIZES] + NON_SQUARE
# CPU stand-ins for GPU code (the CUDA emulator, the Triton interpreter) are slow: they get
# the small edge shapes; their own test files cover more.
STAND_IN_MAX_FLOPS = 2 * 65**3


def _runs_natively(impl) -> bool:
    return impl.device == "cpu"


def _cases():
    for impl in harness.implementations():
        if impl.weights:  # decode kernels take quantized W [N, K], not a float B: tests/test_decode.py
            continue
        for dtype in impl.dtypes:
            for shape in EDGE_SHAPES:
                if not _runs_natively(impl) and shape.flops > STAND_IN_MAX_FLOPS:
                    continue
                yield pytest.param(impl.name, shape, dtype, id=f"{impl.name}-{shape}-{dtype}")


def _runnable(name, shape, dtype):
    """The implementation, or the test skipped: not available here, or not for this problem."""
    impl = harness.lookup(name)
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(f"{name} unavailable: {reason}")
    try:
        check_problem(impl, shape, dtype)
    except MatmulInputError as error:
        pytest.skip(str(error))
    return impl


@pytest.mark.parametrize("name, shape, dtype", list(_cases()))
def test_matches_reference(name, shape, dtype):
    _runnable(name, shape, dtype)
    a, b = harness.make_inputs(shape, dtype, seed=1)
    a_before, b_before = a.copy(), b.copy()
    result = harness.get(name)(a, b)
    assert result.shape == (shape.m, shape.n)
    assert result.dtype == a.dtype
    outcome = harness.check(result, a, b)
    assert outcome.passed, f"{name} at {shape} {dtype}: {outcome.message}"
    np.testing.assert_array_equal(a, a_before)  # inputs are never modified
    np.testing.assert_array_equal(b, b_before)


# The timed call: the harness prepares once, then runs the same prepared call over and over
# (pytest-benchmark, compare, blas-grid) and may check the product after the last run.
REPEATED_RUN_SHAPES = [Shape(33, 65, 17), Shape(1, 130, 70)]
REPEATED_DECODE_SHAPE = Shape(3, 64, 256)  # X [3, 256] times W [64, 256]: whole q4_K blocks


def _repeated_run_cases():
    for impl in harness.implementations():
        if not _runs_natively(impl):  # a stand-in is checked, never timed
            continue
        if impl.weights:  # decode: X times quantized W [N, K]
            for fmt in impl.weights:
                shape = REPEATED_DECODE_SHAPE
                yield pytest.param(impl.name, shape, fmt, id=f"{impl.name}-{shape}-{fmt}")
            continue
        for dtype in impl.dtypes:
            for shape in REPEATED_RUN_SHAPES:
                yield pytest.param(impl.name, shape, dtype, id=f"{impl.name}-{shape}-{dtype}")


@pytest.mark.parametrize("name, shape, kind", list(_repeated_run_cases()))
def test_a_prepared_call_run_again_and_again_gives_the_same_product(name, shape, kind):
    # A kernel that accumulates into its output (BLAS's C = A B + beta C with beta = 1) is right
    # after its first run and wrong after the second. `kind` is a dtype, or a decode row's format.
    dtype = "float32" if harness.lookup(name).weights else kind
    impl = _runnable(name, shape, dtype)
    a, b = harness.make_inputs(shape, dtype, seed=2)
    given, rounding = b, None
    if impl.weights:
        given = quant.quantize(np.ascontiguousarray(b.T), kind)
        b, rounding = given.dequantize().T, impl.rounding_for(kind)
    options = {"threads": 1} if impl.threaded else {}
    prepared = harness.get(name, **options).prepare(a, given)
    if prepared.mode != "native":
        pytest.skip(f"{name} runs {prepared.mode} here: checked once, never timed")
    for run in range(1, 4):
        prepared.run()
        outcome = harness.check(prepared.result(), a, b, activation_rounding=rounding)
        assert outcome.passed, f"{name} at {shape} {kind}, run {run} of the prepared call: {outcome.message}"


def test_registry_metadata_is_complete():
    names = [impl.name for impl in harness.implementations()]
    assert len(names) == len(set(names))
    for impl in harness.implementations():
        assert impl.name.startswith(impl.language + ".") or impl.baseline, impl.name
        assert impl.device in ("cpu", "gpu")
        assert impl.operation in ("gemm", "gemv")
        assert impl.dtypes and impl.summary
        if impl.source:
            assert harness.env.sources.source_path(impl.source).is_file(), impl.source


def test_check_rejects_a_wrong_result():
    a, b = harness.make_inputs(Shape(8, 9, 10))
    wrong = harness.reference(a, b).astype(np.float32)
    wrong[3, 4] += 1e-2
    assert not harness.check(wrong, a, b).passed


def test_check_rejects_nan_where_reference_has_none():
    a, b = harness.make_inputs(Shape(4, 4, 4))
    bad = harness.reference(a, b).astype(np.float32)
    bad[0, 0] = np.nan
    outcome = harness.check(bad, a, b)
    assert not outcome.passed and "NaN" in outcome.message


def test_tolerance_grows_with_k_and_precision():
    one, norm = np.ones(1), np.ones(1)
    assert checking.tolerance("float32", 4096, one, norm) > checking.tolerance("float32", 16, one, norm)
    assert checking.tolerance("float64", 64, one, norm) < checking.tolerance("float32", 64, one, norm)
    assert checking.tolerance("bfloat16", 64, one, norm) > checking.tolerance("float16", 64, one, norm)
