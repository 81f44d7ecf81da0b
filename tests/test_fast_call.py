"""The common case of ``harness.get(name)(a, b)``, checked and run in one compiled call for the
C kernels (harness/backends/c/fast_call.c), or checked in Python (core.common_case): the same
product as the full path where it applies, and None (the full path, with its checks and
errors) everywhere else."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest

import harness
from harness.backends.c import clib
from harness.model.core import common_case
from harness.model.errors import MatmulInputError

C_KERNELS = ["c.naive_ijk", "c.naive_ikj", "c.blocked", "c.goto", "c.packed"]
BIG = 10**12  # limits that do not bind


def fast_call(name: str, **limits):
    """The compiled fast call of ``name``, with ``limits`` (max_elements, max_output_bytes,
    long_call_mnk) in place of the real ones; the test skips where it was not built."""
    impl = harness.lookup(name)
    limits = {"max_elements": BIG, **limits}
    built = impl.backend.fast_call(impl, harness.get(name).options, **limits)
    if built is None:
        pytest.skip("the compiled fast call was not built here")
    return built


def test_the_fast_call_is_built_beside_the_glue():
    if clib.call_mode() != "compiled glue":
        pytest.skip("the library is called through dlopen here: no fast call either")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("this interpreter has no headers to build extensions against")
    assert clib.fast_call_type() is not None, "NumPy's headers come with NumPy: the build should find them"
    assert type(harness.get("c.packed")._fast_path()).__name__ == "FastCall"


@pytest.mark.parametrize("name", C_KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 5, 3), (33, 65, 17), (1, 300, 40), (64, 64, 64)])
def test_the_same_bits_as_the_bound_call(name, dtype, shape):
    m, n, k = shape
    rng = np.random.default_rng(m * n * k)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    before = a.copy(), b.copy()
    product = fast_call(name)(a, b)
    impl = harness.lookup(name)
    expected = impl.backend.bind(impl, harness.get(name).options)(a, b)
    assert product.dtype == np.dtype(dtype) and product.shape == (m, n) and product.flags.c_contiguous
    np.testing.assert_array_equal(product, expected)
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])


class Subclass(np.ndarray):
    pass


def misaligned(shape, dtype):
    raw = bytearray(np.prod(shape) * np.dtype(dtype).itemsize + 1)
    array = np.frombuffer(raw, dtype=dtype, offset=1, count=int(np.prod(shape))).reshape(shape)
    assert not array.flags.aligned and array.flags.writeable
    return array


def read_only(array):
    array.flags.writeable = False
    return array


A = np.ones((8, 6), np.float32)
B = np.ones((6, 4), np.float32)
OFF_THE_COMMON_CASE = {
    "a subclass": (A.view(Subclass), B),
    "a strided view": (np.ones((8, 12), np.float32)[:, ::2], B),
    "Fortran order": (np.asfortranarray(A), B),
    "read-only": (read_only(A.copy()), B),
    "misaligned": (misaligned((8, 6), np.float32), B),
    "big-endian": (A.astype(">f4"), B.astype(">f4")),
    "two dtypes": (A, B.astype(np.float64)),
    "integers": (A.astype(np.int32), B.astype(np.int32)),
    "float16": (A.astype(np.float16), B.astype(np.float16)),
    "one dimension": (np.ones(6, np.float32), B),
    "three dimensions": (A[None], B),
    "K mismatched": (A, np.ones((5, 4), np.float32)),
    "M = 0": (np.ones((0, 6), np.float32), B),
    "K = 0": (np.ones((8, 0), np.float32), np.ones((0, 4), np.float32)),
    "a list": (A.tolist(), B),
}


def outcome(call, a, b):
    try:
        return call(a, b)
    except Exception as error:  # the full path's error, compared by type and message
        return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize("case", OFF_THE_COMMON_CASE)
def test_off_the_common_case_it_answers_none_and_the_public_call_takes_the_full_path(case):
    a, b = OFF_THE_COMMON_CASE[case]
    assert fast_call("c.packed")(a, b) is None
    assert common_case(lambda a, b: pytest.fail("called"), (np.dtype("float32"),), BIG)(a, b) is None
    full_path_only = harness.get("c.packed")
    full_path_only._fast = False
    expected = outcome(full_path_only, a, b)
    found = outcome(harness.get("c.packed"), a, b)
    if isinstance(expected, str):
        assert found == expected
    else:
        np.testing.assert_array_equal(found, expected)


def test_the_limits_send_big_problems_to_the_python_path():
    a, b = np.ones((8, 6), np.float32), np.ones((6, 4), np.float32)
    assert fast_call("c.packed", max_elements=8 * 6 + 6 * 4 + 8 * 4 - 1)(a, b) is None
    assert fast_call("c.packed", max_elements=8 * 6 + 6 * 4 + 8 * 4)(a, b) is not None
    assert fast_call("c.packed", max_output_bytes=8 * 4 * 4)(a, b) is None  # allocated aligned there
    assert fast_call("c.packed", max_output_bytes=8 * 4 * 4 + 1)(a, b) is not None
    assert fast_call("c.packed", long_call_mnk=8 * 4 * 6)(a, b) is None  # run interruptibly there
    assert fast_call("c.packed", long_call_mnk=8 * 4 * 6 + 1)(a, b) is not None


def test_a_kernel_that_fails_raises_through_its_backends_check():
    # path="vector" is refused by C (status 4) on a shape that is not a GEMV (nor N <= 8)
    a, b = np.ones((8, 6), np.float32), np.ones((6, 9), np.float32)
    with pytest.raises(MatmulInputError, match="path='vector' needs M = 1 or N <= 8"):
        harness.get("c.packed", path="vector")(a, b)
    impl = harness.lookup("c.packed")
    call = impl.backend.fast_call(impl, {**impl.options, "path": "vector"}, BIG)
    if call is not None:
        with pytest.raises(MatmulInputError, match="path='vector'"):
            call(a, b)


def test_it_takes_two_arrays_and_nothing_else():
    call = fast_call("c.packed")
    with pytest.raises(TypeError, match="exactly two arrays"):
        call(A)
    with pytest.raises(TypeError, match="exactly two arrays"):
        call(A, B, b=B)


def test_without_the_compiled_fast_call_python_checks_the_common_case(monkeypatch):
    # a build without NumPy's headers, or the library loaded through dlopen
    a = np.random.default_rng(1).standard_normal((33, 17)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((17, 9)).astype(np.float32)
    compiled = harness.get("c.packed")(a, b)
    monkeypatch.setattr(clib, "fast_call_type", lambda: None)
    matmul = harness.get("c.packed")
    np.testing.assert_array_equal(matmul(a, b), compiled)
    assert matmul._fast.__qualname__ == "common_case.<locals>.fast"
    assert matmul._fast(a[:, ::2], b[::2]) is None  # a view: the full path
    np.testing.assert_allclose(matmul(a[:, ::2], b[::2]), a[:, ::2] @ b[::2], rtol=1e-5, atol=1e-5)
