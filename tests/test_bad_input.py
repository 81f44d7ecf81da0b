"""Bad input gets a clear error naming what was wrong; nothing is silently wrong or modified."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import harness
from harness import MatmulInputError
from harness.model.inputs import parse_shape

CPU_GEMMS = [
    "python.ijk",
    "python.ikj",
    "python.outer",
    "c.naive_ijk",
    "c.naive_ikj",
    "c.blocked",
    "c.goto",
    "numpy.matmul",
]


@pytest.mark.parametrize("name", CPU_GEMMS)
def test_inner_dimension_mismatch_names_both_shapes(name):
    a = np.ones((3, 4), np.float32)
    b = np.ones((5, 6), np.float32)
    with pytest.raises(MatmulInputError) as error:
        harness.get(name)(a, b)
    assert "(3, 4)" in str(error.value) and "(5, 6)" in str(error.value)


@pytest.mark.parametrize("a_shape, b_shape", [((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((2, 3), (3,))])
def test_wrong_ndim(a_shape, b_shape):
    with pytest.raises(MatmulInputError, match="2-D"):
        harness.get("c.blocked")(np.ones(a_shape, np.float32), np.ones(b_shape, np.float32))


@pytest.mark.parametrize("dtype", [np.int64, np.float16, np.complex64])
def test_unsupported_dtype_is_named(dtype):
    a = np.ones((3, 3), dtype)
    with pytest.raises(MatmulInputError) as error:
        harness.get("c.naive_ikj")(a, a)
    assert np.dtype(dtype).name in str(error.value) and "float32" in str(error.value)


def test_mixed_dtypes_refused():
    with pytest.raises(MatmulInputError, match="same dtype"):
        harness.get("c.blocked")(np.ones((2, 2), np.float32), np.ones((2, 2), np.float64))


def test_not_arrays_refused():
    with pytest.raises(MatmulInputError, match="NumPy arrays"):
        harness.get("c.blocked")([[1.0]], [[1.0]])


@pytest.mark.parametrize("name", CPU_GEMMS)
def test_non_contiguous_and_fortran_inputs_are_computed_correctly(name):
    rng = np.random.default_rng(3)
    big_a = rng.standard_normal((20, 34)).astype(np.float32)
    big_b = rng.standard_normal((17, 30)).astype(np.float32)
    a = big_a[::2, ::2]  # strided view, 10 x 17
    b = np.asfortranarray(big_b[:, :13])  # Fortran order, 17 x 13
    assert not a.flags.c_contiguous and not b.flags.c_contiguous
    a_before, b_before = a.copy(), b.copy()
    result = harness.get(name)(a, b)
    assert harness.check(result, a, b).passed
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)
    assert b.flags.f_contiguous  # the caller's array is untouched, layout included


@pytest.mark.parametrize("name", CPU_GEMMS)
@pytest.mark.parametrize("m, n, k", [(0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)])
def test_zero_size_dimensions_give_what_numpy_gives(name, m, n, k):
    a = np.ones((m, k), np.float32)
    b = np.ones((k, n), np.float32)
    result = harness.get(name)(a, b)
    expected = a @ b
    assert result.shape == expected.shape and result.dtype == expected.dtype
    np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize("name", CPU_GEMMS)
def test_nan_and_inf_propagate_like_the_reference(name):
    a, b = harness.make_inputs("9x11x13", "float32", seed=5)
    a[2, 3] = np.nan
    a[5, 7] = np.inf
    b[4, 6] = -np.inf
    result = harness.get(name)(a, b)
    ref = harness.reference(a, b)
    assert np.isnan(ref).any() and np.isinf(ref).any()
    np.testing.assert_array_equal(np.isnan(result), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(result), np.isinf(ref))
    assert harness.check(result, a, b).passed


@pytest.mark.parametrize("name", ["python.ijk", "python.ikj", "python.outer"])
def test_pure_python_refuses_sizes_that_take_hours(name):
    a = np.zeros((4096, 4096), np.float32)
    with pytest.raises(MatmulInputError) as error:
        harness.get(name)(a, a)
    message = str(error.value)
    assert "hours" in message and "allow_slow=True" in message and "MATMUL_ALLOW_SLOW" in message


def test_unknown_implementation_and_option():
    with pytest.raises(KeyError, match="no-such"):
        harness.get("no-such.thing")
    with pytest.raises(TypeError, match="tile"):
        harness.get("c.naive_ikj", tile=3)


def test_blocked_tile_must_be_positive():
    a = np.ones((4, 4), np.float32)
    with pytest.raises(ValueError, match="tile"):
        harness.get("c.blocked", tile=0)(a, a)


@pytest.mark.parametrize("text", ["12x", "axb", "3x4", "1x2x3x4", "", "-5", "2.5"])
def test_malformed_shape_strings(text):
    with pytest.raises(ValueError, match="MxNxK"):
        parse_shape(text)


def test_shape_order_is_m_n_k():
    shape = parse_shape("2x3x4")
    a, b = harness.make_inputs(shape)
    assert a.shape == (2, 4) and b.shape == (4, 3)
    assert parse_shape(7) == (7, 7, 7)


def test_malformed_shapes_on_the_command_line_exit_2_with_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "harness", "compare", "--shapes", "12x", "--impls", "numpy"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "12x" in done.stderr and "MxNxK" in done.stderr
