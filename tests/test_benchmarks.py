"""The pytest-benchmark suite: every implementation x shapes x dtypes, grouped by shape.

    pytest --benchmark-only                                   # default shapes, float32
    pytest --benchmark-only --matmul-shapes "256 1024x1024x512" --matmul-dtypes "float32 float64"
    MATMUL_BENCH_SHAPES="2048" pytest --benchmark-only -k c.
    pytest --benchmark-only -k decode --matmul-decode-shapes "1x4096x14336 8x4096x14336" --matmul-weights "q4_0 q8_0"

Plain `pytest` runs each case once, untimed, as a check. Pure Python only runs the small
shapes unless you choose the shapes yourself (and even then not beyond its size limit).
CPU stand-ins for GPU code (emulated CUDA, interpreted Triton) are never timed here.
"""

from __future__ import annotations

import itertools
import os
from functools import lru_cache

import numpy as np
import pytest
from conftest import bench_decode, bench_dtypes, bench_shapes
from threadpoolctl import threadpool_limits

import harness
from harness.model import quant
from harness.model.core import MatmulInputError, check_problem
from harness.model.inputs import parse_shape
from harness.run.compare import weight_rotation

PURE_PYTHON_DEFAULT_MAX_FLOPS = 2 * 128**3
# Plain `pytest` runs each case once to see that it works: the default shapes up to 256^3 FLOPs
# (128^3 and the 1x4096x4096 GEMV) show that as well as 1024^3 does, in a fraction of the time.
UNTIMED_DEFAULT_MAX_FLOPS = 2 * 256**3
UNTIMED_DECODE_SHAPE = "1x1024x4096"  # and one decode shape, a quarter of Llama's 4096 x 14336


def _decode_shapes_chosen(config) -> bool:
    return bool(config.getoption("--matmul-decode-shapes") or os.environ.get("MATMUL_BENCH_DECODE_SHAPES"))


def pytest_generate_tests(metafunc):
    if "decode_case" in metafunc.fixturenames:
        shapes, formats = bench_decode(metafunc.config)
        if not _decode_shapes_chosen(metafunc.config) and getattr(metafunc.config.option, "benchmark_disable", False):
            shapes = [UNTIMED_DECODE_SHAPE]
        cases = [
            pytest.param((impl.name, parse_shape(shape), fmt), id=f"{impl.name}-{shape}-{fmt}")
            for shape in shapes
            for fmt in formats
            for impl in harness.implementations()
            if impl.device == "cpu"
            and "float32" in impl.dtypes
            and (fmt in impl.weights if fmt != "float32" else (not impl.weights and impl.language != "python"))
        ]
        metafunc.parametrize("decode_case", cases)
    if "bench_case" not in metafunc.fixturenames:
        return
    shapes, chosen = bench_shapes(metafunc.config)
    if not chosen and getattr(metafunc.config.option, "benchmark_disable", False):
        shapes = [s for s in shapes if parse_shape(s).flops <= UNTIMED_DEFAULT_MAX_FLOPS]
    dtypes = bench_dtypes(metafunc.config)
    cases = []
    for shape_text in shapes:
        shape = parse_shape(shape_text)
        for dtype in dtypes:
            for impl in harness.implementations():
                if dtype not in impl.dtypes or impl.weights:  # decode kernels: compare(weights=[...])
                    continue
                if impl.language == "python" and not chosen and shape.flops > PURE_PYTHON_DEFAULT_MAX_FLOPS:
                    continue
                cases.append(pytest.param((impl.name, shape, dtype), id=f"{impl.name}-{shape}-{dtype}"))
    if not cases:
        raise pytest.UsageError(f"no benchmark case matches shapes {shapes} and dtypes {dtypes}")
    metafunc.parametrize("bench_case", cases)


def test_matmul(benchmark, bench_case):
    name, shape, dtype = bench_case
    impl = harness.lookup(name)
    try:
        check_problem(impl, shape, dtype)
    except MatmulInputError as error:
        pytest.skip(str(error))
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(f"{name} unavailable: {reason}")
    a, b = harness.make_inputs(shape, dtype)
    options = {"threads": 1} if impl.threaded else {}
    prepared = harness.get(name, **options).prepare(a, b)
    if prepared.mode != "native":
        pytest.skip(f"{name} runs {prepared.mode} here: checked by the tests, never timed")

    benchmark.group = f"{shape} {dtype}"
    benchmark.extra_info.update(implementation=name, shape=str(shape), dtype=dtype, flops=shape.flops)
    with threadpool_limits(limits=1):  # one BLAS thread, like the C kernels
        benchmark(prepared.run)

    outcome = harness.check(prepared.result(), a, b)
    assert outcome.passed, f"{name} at {shape} {dtype}: {outcome.message}"
    if benchmark.stats is not None and benchmark.stats.stats.median > 0:
        benchmark.extra_info["gflops"] = shape.flops / benchmark.stats.stats.median / 1e9


@lru_cache(maxsize=2)
def _decode_problem(shape, fmt: str):
    """X, what the kernel is given (quantized W, or B = W^T for float32) and the float B the
    reference multiplies: made once per shape and format, outside the timed region."""
    x, b = harness.make_inputs(shape, "float32")
    if fmt == "float32":
        return x, b, b
    weights = quant.quantize(np.ascontiguousarray(b.T), fmt)
    return x, weights, weights.dequantize().T


def _copy(given):
    """The same weights in memory of their own."""
    if isinstance(given, quant.QuantizedWeights):
        return quant.QuantizedWeights(given.format, given.n, given.k, given.data.copy())
    return given.copy()


def test_decode(benchmark, decode_case):
    """Decode rows (M activation rows times W [N, K] in a weight format), grouped by shape so
    that every format's time is read against NumPy's float32 product."""
    name, shape, fmt = decode_case
    impl = harness.lookup(name)
    try:
        check_problem(impl, shape, "float32")
    except MatmulInputError as error:
        pytest.skip(str(error))
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(f"{name} unavailable: {reason}")
    x, given, float_b = _decode_problem(shape, fmt)
    options = {"threads": 1} if impl.threaded else {}
    try:
        prepared = harness.get(name, **options).prepare(x, given)
    except MatmulInputError as error:  # a shape the kernel refuses (torch.int4: N % 16)
        pytest.skip(str(error))
    benchmark.group = f"{shape} decode"
    weight_bytes = given.nbytes if fmt != "float32" else float_b.nbytes
    benchmark.extra_info.update(
        implementation=name,
        shape=str(shape),
        dtype="float32",
        weights=fmt,
        flops=shape.flops,
        bytes=weight_bytes + (x.nbytes + shape.m * shape.n * 4),
    )
    # Weights from DRAM, as compare times every CPU decode row: each call the next of enough
    # copies of W to exceed the last-level cache four times over (none where W is too small).
    copies, benchmark.extra_info["weights_from"] = weight_rotation(weight_bytes)
    if benchmark.disabled:  # the default tier calls it once, untimed: one W serves
        copies = 1
    rotation = [prepared] + [harness.get(name, **options).prepare(x, _copy(given)) for _ in range(copies - 1)]
    calls = itertools.cycle([each.run for each in rotation])
    with threadpool_limits(limits=1):
        benchmark(lambda: next(calls)())
    outcome = harness.check(prepared.result(), x, float_b, activation_rounding=impl.rounding_for(fmt))
    assert outcome.passed, f"{name} at {shape} {fmt}: {outcome.message}"


CALL_OVERHEAD_CASES = [
    pytest.param(call, size, id=f"{call}-{size}x{size}x{size}")
    for size in (8, 32)
    for call in ("numpy a @ b", "harness.get('c.packed')(a, b)")
]


@pytest.mark.parametrize("call, size", CALL_OVERHEAD_CASES)
def test_call_overhead(benchmark, call, size):
    """The whole public call (validation, output allocation, the C call) against NumPy's
    ``a @ b`` at sizes where the arithmetic is nearly free: what is left is call overhead."""
    a, b = harness.make_inputs(parse_shape(size), "float32")
    if call.startswith("numpy"):
        function = lambda: a @ b  # noqa: E731
    else:
        impl = harness.lookup("c.packed")
        if impl.unavailable_reason():
            pytest.skip(f"c.packed unavailable: {impl.unavailable_reason()}")
        matmul = harness.get("c.packed", threads=1)
        function = lambda: matmul(a, b)  # noqa: E731
    benchmark.group = f"call overhead {size}x{size}x{size} float32"
    with threadpool_limits(limits=1):
        result = benchmark(function)
    assert harness.check(result, a, b).passed
