"""c.bf16 (c/bf16.c): every kernel this CPU has (AMX, AVX512_BF16) against the float64 reference
with the bfloat16 error model, on edge shapes (each dimension 1, K odd or short of a tile's 32,
M and N off the 14/16/32 tiles, past each KC, MC and NC block), on 1 and 2 threads, with the
same bits for every thread count; and the clear errors where a kernel cannot run. Skipped,
with the reason, on a CPU with neither AVX512_BF16 nor AMX-BF16."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import harness
from harness.backends import c as c_backend
from harness.backends.c import clib
from harness.model.core import UnavailableError
from harness.model.inputs import Shape

IMPL = harness.lookup("c.bf16")
_reason = IMPL.unavailable_reason()
needs_bf16 = pytest.mark.skipif(_reason is not None, reason=f"c.bf16 unavailable: {_reason}")


def _variants() -> list[str]:
    return c_backend.bf16_variants() if _reason is None else []


EDGES = [
    Shape(1, 1, 1),
    Shape(1, 300, 77),  # one row of A: the rest of the 32-row tile is padding
    Shape(300, 1, 77),  # one column of B
    Shape(45, 47, 1),  # K = 1: 31 of the tile's 32 k are padding
    Shape(33, 65, 31),  # K odd, one short of a tile
    Shape(17, 15, 33),  # K one past a tile, M and N one past / short of 16
    Shape(31, 33, 63),
    Shape(129, 257, 95),
    Shape(14, 32, 2),  # exactly one tile of each micro-kernel's height
    Shape(29, 45, 257),  # K one past AMX's KC (256): a second piece, through the partial sums
    Shape(29, 45, 513),  # one past AVX512_BF16's KC (512)
    Shape(530, 300, 300),  # past MC (AMX 512, AVX512_BF16 168) and AMX's NC (256)
    Shape(171, 1100, 1025),  # past AVX512_BF16's NC (1024), three K pieces
]
LARGE = [Shape(512, 512, 512), Shape(300, 700, 1500)]


def _check(shape, variant, threads, seed=0):
    a, b = harness.make_inputs(shape, "bfloat16", seed)
    a_before, b_before = a.copy(), b.copy()
    result = harness.get("c.bf16", variant=variant, threads=threads)(a, b)
    assert result.dtype == a.dtype and result.shape == (shape.m, shape.n)
    outcome = harness.check(result, a, b)
    assert outcome.passed, f"c.bf16 {variant} {threads} threads at {shape}: {outcome.message}"
    np.testing.assert_array_equal(a.view(np.uint16), a_before.view(np.uint16))  # inputs untouched
    np.testing.assert_array_equal(b.view(np.uint16), b_before.view(np.uint16))
    return result


@needs_bf16
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("shape", EDGES + LARGE, ids=str)
def test_against_the_float64_reference(shape, variant, threads):
    _check(shape, variant, threads, seed=shape.m + shape.k)


def _crossovers(variant) -> list[Shape]:
    """The shapes at this CPU's blocks (bf16_blocking): K at KC, one past it (two equal pieces)
    and past two of it (three); M at MC and one either side; N one past NC; and one panel of
    each height below MR, past a whole one (a kernel that computes only the rows that exist
    has one tile per height; these are large enough for two threads, each part then ending
    in a panel of its own height)."""
    blocks = c_backend.bf16_blocking(variant)
    mr, kc, mc, nc = blocks["MR"], blocks["KC"], blocks["MC"], blocks["NC"]
    shapes = [Shape(29, 45, k) for k in (kc, kc + 1, 2 * kc + 1)]
    shapes += [Shape(m, 67, 45) for m in (mc - 1, mc, mc + 1)] + [Shape(31, nc + 1, 33)]
    return shapes + [Shape(mr + rows, 64, 1200) for rows in range(1, mr)]


@needs_bf16
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", _variants())
def test_at_the_blocks_of_this_cpu(variant, threads):
    for shape in _crossovers(variant):
        _check(shape, variant, threads, seed=shape.m + shape.k)


def _shared_b_shape(variant) -> Shape:
    """A shape whose parts, cut along M, share one packed B here: B larger than own_B_max."""
    own_b_max = c_backend.bf16_blocking(variant)["own_B_max"]
    return Shape(301, 299, max(530, own_b_max // (2 * 299) + 1))


@needs_bf16
@pytest.mark.parametrize("variant", _variants())
def test_same_bits_for_every_thread_count(variant):
    # C is cut along M or N, never along K: every element is the same sum on any thread count,
    # whether the parts pack B each or share it.
    for shape in (Shape(301, 299, 530), _shared_b_shape(variant), Shape(13, 997, 301), Shape(997, 13, 301)):
        a, b = harness.make_inputs(shape, "bfloat16")
        results = {t: harness.get("c.bf16", variant=variant, threads=t)(a, b) for t in (1, 2, 3, 7)}
        assert harness.check(results[1], a, b).passed
        for threads, result in results.items():
            np.testing.assert_array_equal(result.view(np.uint16), results[1].view(np.uint16), err_msg=f"{threads}")


@needs_bf16
@pytest.mark.parametrize("variant", _variants())
def test_safe_from_several_python_threads_at_once(variant):
    # cffi releases the GIL, so these calls overlap: a call that finds the pool busy runs its
    # parts one after another on its own thread, where parts that share one packed B must
    # still finish (the first packs it all) and give the same bits.
    shapes = [Shape(150 + 37 * i, 120 + 23 * i, 100 + 61 * i) for i in range(10)] + [_shared_b_shape(variant)]
    inputs = [harness.make_inputs(s, "bfloat16", seed=i) for i, s in enumerate(shapes)]
    matmul = harness.get("c.bf16", variant=variant, threads=2)
    serial = [matmul(*ab) for ab in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda ab: matmul(*ab), inputs))
    for (a, b), one, other in zip(inputs, serial, parallel):
        assert harness.check(other, a, b).passed
        np.testing.assert_array_equal(one.view(np.uint16), other.view(np.uint16))


@needs_bf16
def test_kernels_agree_closely():
    # AMX and vdpbf16ps sum in different orders (and both flush denormals), so their bits may
    # differ, by no more than the error model allows either of them.
    variants = _variants()
    if len(variants) < 2:
        pytest.skip(f"this CPU has one bfloat16 kernel only ({', '.join(variants)})")
    a, b = harness.make_inputs(Shape(200, 300, 700), "bfloat16", 3)
    results = [harness.get("c.bf16", variant=v, threads=1)(a, b).astype(np.float64) for v in variants]
    assert np.max(np.abs(results[0] - results[1])) <= 0.05 * np.max(np.abs(results[0]))


@needs_bf16
def test_float32_output_and_empty_problems_through_the_c_interface():
    ffi, lib = clib.load()
    a, b = harness.make_inputs(Shape(37, 41, 600), "bfloat16", 1)
    c32 = np.full((37, 41), np.nan, np.float32)
    for variant in _variants():
        number = c_backend.VARIANTS[variant]
        args = [ffi.from_buffer("uint16_t[]", x.view(np.uint16)) for x in (a, b)]
        assert lib.matmul_bf16(*args, ffi.from_buffer("float[]", c32), 37, 41, 600, 2, number, 0) == 0
        reference = a.astype(np.float64) @ b.astype(np.float64)
        assert np.max(np.abs(c32 - reference)) < 1e-3 * np.max(np.abs(reference))  # float32 sums, not rounded

    empty_a, empty_b = np.ones((3, 0), np.uint16), np.ones((0, 5), np.uint16)
    c = np.full((3, 5), np.nan, np.float32)
    args = (ffi.from_buffer("uint16_t[]", empty_a), ffi.from_buffer("uint16_t[]", empty_b))
    assert lib.matmul_bf16(*args, ffi.from_buffer("float[]", c), 3, 5, 0, 1, 0, 0) == 0  # K = 0: C = 0
    assert not c.any()
    assert lib.matmul_bf16(*args, ffi.from_buffer("float[]", c), 0, 5, 0, 1, 0, 0) == 0  # M = 0: nothing
    assert lib.matmul_bf16(*args, ffi.from_buffer("float[]", c), -1, 5, 0, 1, 0, 0) == 3  # negative
    assert lib.matmul_bf16(*args, ffi.from_buffer("float[]", c), 3, 5, 0, 1, 99, 0) == 1  # no such variant
    assert lib.matmul_bf16_variant_supported(99) == 0 and lib.matmul_bf16_resolve_variant(99) == -1
    for packed_only in ("portable", "avx2", "avx512"):  # c.packed's numbers are not kernels here
        assert lib.matmul_bf16_variant_supported(c_backend.VARIANTS[packed_only]) == 0


@needs_bf16
def test_k_zero_through_the_harness():
    a, b = harness.make_inputs(Shape(4, 6, 0), "bfloat16")
    result = harness.get("c.bf16", threads=1)(a, b)
    assert result.shape == (4, 6) and not result.astype(np.float32).any()


def test_variants_this_cpu_lacks_are_a_clear_error():
    if _reason is not None:
        # neither kernel runs here: the row is unavailable, saying what the CPU needs
        assert _reason == c_backend.BF16_UNAVAILABLE
        assert "AVX512_BF16" in _reason and "AMX-BF16" in _reason
        with pytest.raises(UnavailableError):
            c_backend.bf16_variant("auto")
        with pytest.raises(UnavailableError):
            c_backend.bf16_blocking("auto")
        return
    a, b = harness.make_inputs(Shape(8, 8, 8), "bfloat16")
    assert c_backend.bf16_variant("auto") == _variants()[-1]  # the best this CPU has
    for variant in ("avx512bf16", "amx"):
        if variant not in _variants():
            with pytest.raises(UnavailableError, match=rf"variant '{variant}' cannot run on this CPU"):
                harness.get("c.bf16", variant=variant)(a, b)
    for other in ("avx2", "sse9"):
        with pytest.raises(ValueError, match=f"unknown variant '{other}'"):
            harness.get("c.bf16", variant=other)(a, b)
        with pytest.raises(ValueError, match=f"unknown variant '{other}'"):
            c_backend.bf16_blocking(other)


def test_takes_bfloat16_only():
    assert IMPL.dtypes == ("bfloat16",)
    assert IMPL.threaded and set(IMPL.options) == {"threads", "variant"}


def test_torch_cpu_takes_bfloat16_beside_it():
    torch_cpu = harness.lookup("torch.cpu")
    if torch_cpu.unavailable_reason() is not None:
        pytest.skip(f"torch.cpu unavailable: {torch_cpu.unavailable_reason()}")
    assert "bfloat16" in torch_cpu.dtypes and "float32" in torch_cpu.dtypes
    a, b = harness.make_inputs(Shape(33, 65, 129), "bfloat16", 2)
    result = harness.get("torch.cpu", threads=1)(a, b)  # the direct call
    assert result.dtype == a.dtype and harness.check(result, a, b).passed
    names = ["torch.cpu", "c.bf16"] if _reason is None else ["torch.cpu"]
    for name in names:  # the path a comparison takes: prepare (not timed), run, result
        impl = harness.lookup(name)
        prepared = impl.backend.prepare(impl, a, b, {**impl.options, "threads": 1})
        prepared.run()
        result = prepared.result()
        assert result.dtype == a.dtype and harness.check(result, a, b).passed, name


def test_bfloat16_rows_are_scored_against_the_bf16_roof_where_c_bf16_runs_vdpbf16ps():
    from harness.run import machine

    roof = machine.measured_bf16_roof()
    ffi, lib = clib.load()
    if _reason is not None or c_backend.bf16_variant("auto") != "avx512bf16":
        # no AVX512_BF16, or AMX first: c.bf16 does not run vdpbf16ps, and no roof is claimed
        assert roof is None and lib.matmul_measure_bf16_gflops(3, ffi.NULL) == 0
        assert machine.cpu_peak_gflops("bfloat16") is None
        return
    assert roof is not None and 0 < roof["median"] <= roof["best"]
    assert machine.cpu_peak_gflops("bfloat16", cores=2) == pytest.approx(2 * roof["best"])
    # a pair of products per lane: up to twice the float32 FMA rate on the same pipes, measured
    # beside it (a busy machine measures both low, never one alone)
    bf16_now = fma_now = 0.0
    for _ in range(2):
        fma_now = max(fma_now, lib.matmul_measure_fma_gflops(4, 15, ffi.NULL))
        bf16_now = max(bf16_now, lib.matmul_measure_bf16_gflops(15, ffi.NULL))
    assert 0 < bf16_now <= machine.BOUND_MARGIN * 2 * fma_now
    row = harness.compare([64], ["c.bf16"], dtypes=["bfloat16"], baselines=False, min_time=0.01, threads=1).rows[0]
    assert row.peak_of == "bfloat16" and row.peak_pct == pytest.approx(100 * row.gflops / roof["best"])
