"""The by-hand text's worked examples and hands-on exercise A, through every implementation."""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness.model.core import MatmulInputError, check_problem
from harness.model.inputs import Shape, numpy_dtype

EXAMPLES = {
    "2x2": ([[1, 2], [3, 4]], [[5, 6], [7, 8]], [[19, 22], [43, 50]]),
    "row-times-column": ([[1, 2]], [[3], [4]], [[11]]),
    "batch-through-a-layer": ([[1, 0, 2], [0, 3, 1]], [[1, 0], [2, 1], [-1, 1]], [[-1, 2], [5, 4]]),
    "exercise-A1": ([[2, 1], [0, 3]], [[1, 0], [2, 1]], [[4, 1], [6, 3]]),
    "exercise-A2": ([[1, 2, 3]], [[1], [0], [2]], [[7]]),
    "exercise-A3": ([[1, 0], [0, 1]], [[0, 1], [1, 0]], [[0, 1], [1, 0]]),
}


def _cases():
    for impl in harness.implementations():
        if impl.weights:  # decode kernels take quantized W [N, K], not a float B: tests/test_decode.py
            continue
        for example in EXAMPLES:
            yield pytest.param(impl.name, example, id=f"{impl.name}-{example}")


@pytest.mark.parametrize("name, example", list(_cases()))
def test_worked_example(name, example):
    impl = harness.lookup(name)
    a_list, b_list, expected = EXAMPLES[example]
    dtype = impl.dtypes[0]  # small integers are exact in every dtype
    a = np.array(a_list, dtype=numpy_dtype(dtype))
    b = np.array(b_list, dtype=numpy_dtype(dtype))
    try:
        check_problem(impl, Shape(a.shape[0], b.shape[1], a.shape[1]), dtype)
    except MatmulInputError as error:
        pytest.skip(str(error))
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(f"{name} unavailable: {reason}")
    result = harness.get(name)(a, b)
    np.testing.assert_array_equal(result.astype(np.float64), np.array(expected, dtype=np.float64))
