"""Property-based tests of the one input path every implementation goes through.

Hypothesis draws inputs the way users make them by accident: either byte order, C or Fortran
order, strided views, buffers at odd offsets (misaligned), np.matrix, zero-sized dimensions,
mismatched dtypes. Each case either equals the reference within the check or raises a
MatmulInputError naming the problem, and the caller's arrays are never modified.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness
from harness.model.core import MatmulInputError

IMPLEMENTATIONS = ["c.naive_ijk", "c.naive_ikj", "c.blocked", "c.goto", "c.packed", "numpy.matmul", "python.ikj"]
EXAMPLES = 150  # per test, in CI


@st.composite
def matrices(draw, rows: int, cols: int, dtype: str):
    """A (rows, cols) array of ``dtype`` in one of the layouts users produce."""
    values = np.random.default_rng(draw(st.integers(0, 2**16))).uniform(-1, 1, (rows, cols))
    order = draw(st.sampled_from(["=", "<", ">"]))
    kind = np.dtype(dtype).newbyteorder(order)
    layout = draw(st.sampled_from(["C", "F", "strided", "offset", "matrix"]))
    if layout == "C":
        return np.ascontiguousarray(values, dtype=kind)
    if layout == "F":
        return np.asfortranarray(values, dtype=kind)
    if layout == "strided":  # every other row and column of a bigger array
        big = np.zeros((2 * rows, 2 * cols), dtype=kind)
        big[::2, ::2] = values
        return big[::2, ::2]
    if layout == "offset":  # a buffer that starts off the element's alignment
        offset = draw(st.integers(1, kind.itemsize - 1))
        raw = bytearray(offset + values.size * kind.itemsize)
        array = np.frombuffer(raw, dtype=kind, offset=offset, count=values.size).reshape(rows, cols)
        array[...] = values  # frombuffer on a bytearray is writable
        return array
    return np.asmatrix(values.astype(kind))


@st.composite
def problems(draw):
    m, n, k = (draw(st.integers(0, 9)) for _ in range(3))
    dtype_a = draw(st.sampled_from(["float32", "float64"]))
    dtype_b = dtype_a if draw(st.integers(0, 9)) else draw(st.sampled_from(["float32", "float64", "int32"]))
    return draw(matrices(m, k, dtype_a)), draw(matrices(k, n, dtype_b))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix, drawn on purpose
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_every_input_is_computed_right_or_refused_by_name(name, problem):
    a, b = problem
    a_before, b_before = np.array(a, copy=True), np.array(b, copy=True)
    try:
        result = harness.get(name)(a, b)
    except MatmulInputError as error:
        assert a.dtype.name != b.dtype.name or a.dtype.name not in harness.model.registry.lookup(name).dtypes, error
        assert str(error)
    else:
        assert isinstance(result, np.ndarray) and type(result) is np.ndarray
        assert result.shape == (a.shape[0], b.shape[1]) and result.dtype == np.dtype(a.dtype.name)
        outcome = harness.check(result, np.asarray(a).astype(a.dtype.name), np.asarray(b).astype(b.dtype.name))
        assert outcome.passed, outcome.message
    np.testing.assert_array_equal(np.asarray(a), np.asarray(a_before))
    np.testing.assert_array_equal(np.asarray(b), np.asarray(b_before))
    assert a.dtype == a_before.dtype and b.dtype == b_before.dtype
