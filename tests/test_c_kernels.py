"""The C matmuls: random shapes, tile sizes, and calls from several threads at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import harness
from harness.model.inputs import Shape

C_KERNELS = ["c.naive_ijk", "c.naive_ikj", "c.blocked", "c.goto"]
# The kernels compiled without FMA contraction, whose sum over p runs in one order (c/naive.c)
IN_SOURCE_ORDER = ["c.naive_ijk", "c.naive_ikj", "c.blocked"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(C_KERNELS),
    m=st.integers(1, 90),
    n=st.integers(1, 90),
    k=st.integers(1, 90),
    dtype=st.sampled_from(["float32", "float64"]),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(name, m, n, k, dtype, seed):
    a, b = harness.make_inputs(Shape(m, n, k), dtype, seed)
    outcome = harness.check(harness.get(name)(a, b), a, b)
    assert outcome.passed, outcome.message


@settings(max_examples=40, deadline=None)
@given(
    tile=st.integers(1, 80),
    m=st.integers(1, 70),
    n=st.integers(1, 150),
    k=st.integers(1, 70),
    dtype=st.sampled_from(["float32", "float64"]),
)
def test_blocked_any_tile(tile, m, n, k, dtype):
    a, b = harness.make_inputs(Shape(m, n, k), dtype)
    outcome = harness.check(harness.get("c.blocked", tile=tile)(a, b), a, b)
    assert outcome.passed, outcome.message


def test_sizes_up_to_40_every_dimension():
    for name in C_KERNELS:
        for size in range(1, 41):
            for shape in (Shape(size, 37, 29), Shape(23, size, 31), Shape(19, 41, size)):
                a, b = harness.make_inputs(shape, "float32")
                assert harness.check(harness.get(name)(a, b), a, b).passed, (name, shape)


@pytest.mark.parametrize("name", C_KERNELS)
def test_safe_from_several_threads_at_once(name):
    # cffi releases the GIL around each call, so these really run concurrently.
    shapes = [Shape(40 + 7 * i, 50 + 3 * i, 60 + 5 * i) for i in range(12)]
    inputs = [harness.make_inputs(s, "float64", seed=i) for i, s in enumerate(shapes)]
    matmul = harness.get(name)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda ab: matmul(*ab), inputs))
    for (a, b), result in zip(inputs, results):
        assert harness.check(result, a, b).passed


def _source_arithmetic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C = A @ B computed exactly as naive.c and blocked.c write it, in the inputs' dtype:
    for each p in increasing order, C += A[:, p] * B[p, :], the product rounded before the
    add (NumPy's multiply and add are two separate, correctly rounded operations)."""
    c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    for p in range(a.shape[1]):
        c += a[:, p, None] * b[p]
    return c


# N past every vector width and remainder loop: 1-17 and 90 columns cover 2-, 4-, 8- and
# 16-lane vectors, the blocked kernel's 64/32/16/8-column chunks and its padded rest.
SOURCE_ORDER_SHAPES = [Shape(70, 90, 110), Shape(3, 200, 37)] + [Shape(5, n, 23) for n in range(1, 18)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", IN_SOURCE_ORDER)
def test_the_teaching_kernels_do_exactly_the_arithmetic_their_source_shows(name, dtype):
    # They are compiled without FMA contraction (CMakeLists.txt), so their bits are fixed by
    # the source, not by the instruction set the compiler targeted: on every CPU they equal
    # this NumPy model bit for bit, and so each other.
    for shape in SOURCE_ORDER_SHAPES:
        a, b = harness.make_inputs(shape, dtype, seed=shape.n)
        np.testing.assert_array_equal(harness.get(name)(a, b), _source_arithmetic(a, b), err_msg=f"{name} {shape}")


def test_blocked_gives_the_same_bits_for_every_tile():
    # The p loop always runs in increasing order, so tile sizes only change which cache
    # serves the operands, never the rounding.
    a, b = harness.make_inputs(Shape(70, 90, 110), "float32")
    first = harness.get("c.blocked", tile=16)(a, b)
    for tile in (1, 8, 32, 200):
        np.testing.assert_array_equal(harness.get("c.blocked", tile=tile)(a, b), first)


# c.goto's blocks: K past KC (256) is summed in pieces, M past MC (128) and N past NC (4096) in
# panels; every edge of a 4 x NR register tile comes up in the sizes below.
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shape", [Shape(129, 4100, 257), Shape(5, 17, 513), Shape(257, 33, 1), Shape(1, 1, 600)], ids=str
)
def test_goto_past_every_block(shape, dtype):
    a, b = harness.make_inputs(shape, dtype)
    outcome = harness.check(harness.get("c.goto")(a, b), a, b)
    assert outcome.passed, outcome.message
