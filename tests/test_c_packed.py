"""c.packed (c/packed.c): every size 1..64 in each dimension through each path, ragged shapes
past every cache block, every micro-kernel variant this CPU has, the same bits for every
thread count, and calls from several Python threads at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import harness
from harness.backends import c as c_backend
from harness.backends.c import clib
from harness.experiments import tile_sweep
from harness.model.core import UnavailableError
from harness.model.inputs import Shape

IMPL = harness.lookup("c.packed")
_reason = IMPL.unavailable_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"c.packed unavailable: {_reason}")

DTYPES = ["float32", "float64"]
# The paths any shape can take (the vector path needs M = 1 or N <= 8; it has its own tests).
MATRIX_PATHS = ["direct", "nest"]


def _variants() -> list[str]:
    return c_backend.packed_variants() if _reason is None else ["portable"]


def _check(shape, dtype, seed=0, **options):
    a, b = harness.make_inputs(shape, dtype, seed)
    a_before, b_before = a.copy(), b.copy()
    result = harness.get("c.packed", **options)(a, b)
    outcome = harness.check(result, a, b)
    assert outcome.passed, f"c.packed {options} at {shape} {dtype}: {outcome.message}"
    np.testing.assert_array_equal(a, a_before)  # inputs are never modified
    np.testing.assert_array_equal(b, b_before)
    return result


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("path", ["auto", *MATRIX_PATHS])
def test_every_size_up_to_64_in_each_dimension(path, variant, dtype):
    # One dimension sweeps 1..64 while the other two sit at sizes that are not multiples of
    # any register tile (MR is 4, 6 or 14; NR is 4, 8, 16 or 32), so every edge-tile case of
    # every kernel comes up: full tiles plus a ragged last row and column of tiles. "auto"
    # sends size 1 to the vector paths, N = 2..8 of 23 x N x 31 (K >= 32 N does not hold) and
    # the rest to the direct path.
    mm = harness.get("c.packed", variant=variant, threads=2, path=path)
    for size in range(1, 65):
        for shape in (Shape(size, 37, 29), Shape(23, size, 31), Shape(19, 41, size)):
            a, b = harness.make_inputs(shape, dtype, seed=size)
            outcome = harness.check(mm(a, b), a, b)
            assert outcome.passed, f"{variant} {path} at {shape} {dtype}: {outcome.message}"


# Past each cache block: K > KC (256-1024, so the K sum is cut and later pieces accumulate),
# M > MC, N > NC (at most 4096) with M small to keep it cheap, and GEMV-like M = 1 / N = 1.
RAGGED = [
    Shape(517, 263, 1031),
    Shape(130, 301, 2053),
    Shape(7, 4100, 300),
    Shape(1, 1000, 1100),
    Shape(1100, 1, 700),
    Shape(255, 257, 65),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("path", ["auto", *MATRIX_PATHS])
@pytest.mark.parametrize("shape", RAGGED, ids=str)
def test_ragged_large_shapes(shape, path, variant, dtype):
    _check(shape, dtype, variant=variant, threads=2, path=path)


def test_forcing_a_variant_this_cpu_lacks_is_a_clear_error():
    lacking = [v for v in ("avx2", "avx512") if v not in c_backend.packed_variants()]
    a, b = harness.make_inputs(Shape(8, 8, 8), "float32")
    for variant in lacking:
        with pytest.raises(UnavailableError, match=rf"variant '{variant}' cannot run on this CPU"):
            harness.get("c.packed", variant=variant)(a, b)
    with pytest.raises(ValueError, match="unknown variant 'sse9'"):
        harness.get("c.packed", variant="sse9")(a, b)


def test_variants_listing_and_auto():
    variants = c_backend.packed_variants()
    assert "portable" in variants
    assert c_backend.packed_variant("auto") == variants[-1]  # the best this CPU has
    for variant in variants:
        blocking = c_backend.packed_blocking(variant, "float32")
        assert blocking["KC"] >= 64 and blocking["MC"] % blocking["MR"] == 0 and blocking["NC"] % blocking["NR"] == 0
        assert blocking["deep_KC"] >= blocking["KC"] and blocking["deep_KC"] % 8 == 0
        one_block_nc = blocking["one_block_NC"]
        assert blocking["NR"] <= one_block_nc <= blocking["NC"] and one_block_nc % blocking["NR"] == 0


def test_blocks_come_from_the_caches_linux_lists():
    # The blocks are derived from the core's caches as sysfs lists them (what the tile sweep
    # reads too), not from sysconf, whose L3 a virtual machine may take from its host.
    listed = tile_sweep.cache_sizes()
    if not listed:
        pytest.skip("this system lists no caches in sysfs")
    blocking = c_backend.packed_blocking("auto", "float64")
    believable = {"l1": (2**14, 2**18), "l2": (2**17, 2**24), "l3": (listed.get("l2", 0), 2**32)}
    for level, (low, high) in believable.items():  # outside these the C side takes a fallback
        if low <= listed.get(level, 0) <= high:
            assert blocking[level.upper()] == listed[level], level


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("path", MATRIX_PATHS)
def test_same_bits_for_every_thread_count(path, variant, dtype):
    # Threads split M and N, never the K sum, so each element is the same FMA chain.
    for shape in (Shape(301, 299, 530), Shape(13, 997, 301), Shape(997, 13, 301)):
        a, b = harness.make_inputs(shape, dtype)
        results = {t: harness.get("c.packed", variant=variant, threads=t, path=path)(a, b) for t in (1, 2, 3, 7)}
        assert harness.check(results[1], a, b).passed
        for threads, result in results.items():
            np.testing.assert_array_equal(result, results[1], err_msg=f"{threads} threads, {shape}")


def test_safe_from_several_python_threads_at_once():
    # cffi releases the GIL, so these calls (each starting its own threads) really overlap.
    shapes = [Shape(40 + 37 * i, 50 + 23 * i, 60 + 41 * i) for i in range(10)]
    inputs = [harness.make_inputs(s, "float32", seed=i) for i, s in enumerate(shapes)]
    matmul = harness.get("c.packed", threads=2)
    serial = [matmul(*ab) for ab in inputs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda ab: matmul(*ab), inputs))
    for (a, b), one, other in zip(inputs, serial, parallel):
        assert harness.check(other, a, b).passed
        np.testing.assert_array_equal(one, other)


def test_bad_thread_counts_are_refused():
    a, b = harness.make_inputs(Shape(4, 4, 4), "float32")
    for threads in (0, -2, 1.5, "2"):
        with pytest.raises(ValueError, match="threads must be an integer >= 1"):
            harness.get("c.packed", threads=threads)(a, b)
    _check(Shape(4, 4, 4), "float32", threads=None)  # None: every core


def test_c_interface_error_codes_and_empty_sum():
    from harness.backends.c import clib

    ffi, lib = clib.load()
    a = np.ones((3, 0), np.float32)
    b = np.ones((0, 5), np.float32)
    c = np.full((3, 5), np.nan, np.float32)
    args = (ffi.from_buffer("float[]", a), ffi.from_buffer("float[]", b), ffi.from_buffer("float[]", c))
    assert lib.matmul_packed_f32(*args, 3, 5, 0, 1, 0) == 0  # K = 0: C = 0
    assert not c.any()
    assert lib.matmul_packed_f32(*args, 3, 5, 0, 1, 99) == 1  # no such variant
    assert lib.matmul_packed_f32(*args, -1, 5, 0, 1, 0) == 3  # negative dimension
    assert lib.matmul_packed_variant_supported(99) == 0
    assert lib.matmul_packed_resolve_variant(99) == -1


def test_registered_after_blocked_and_goto():
    # reading order: the cache-blocked loop, the plain Goto algorithm, then its tuned version
    names = [impl.name for impl in harness.implementations("c.*")]
    assert names.index("c.packed") == names.index("c.goto") + 1 == names.index("c.blocked") + 2
    assert IMPL.threaded


def _path_crossovers(dtype) -> list[Shape]:
    """Shapes on each side of every place c/packed.c changes path or cut: M = 1 (GEMV) and
    N = 1 (one dot product per row) against 2; the rows of four of the N = 1 path; B's size
    against half of L2, K against 32 and M N K against 256^3 (direct path or loop nest); the
    register tile MR (the kernels'
    row-count instances); MC, below which the B panel is sized for L2 (or takes long rows,
    one_block_NC: N across it cuts B into panels there); a GEMV chunk of y
    (8 KiB); KC / 2, below which the loop nest runs rows first; M = 16, up to which it packs
    B in whole rows (and the N past which those panels are cut); the K block KC, and the deep
    KC some CPUs take past one A block."""
    blocking = c_backend.packed_blocking("auto", dtype)
    mr, mc, kc = blocking["MR"], blocking["MC"], blocking["KC"]
    itemsize = np.dtype(dtype).itemsize
    chunk = 8192 // itemsize
    direct_n = blocking["L2"] // 2 // (64 * itemsize)  # the widest B of 64 rows the direct path takes
    shapes = [Shape(m, 37, 29) for m in (1, 2, 3)] + [Shape(29, n, 37) for n in (1, 2, 3)]
    shapes += [Shape(m, 1, 33) for m in (3, 4, 5, 7, 8, 9)]
    shapes += [Shape(5, n, 64) for n in (direct_n - 1, direct_n, direct_n + 1)]
    # ... and, with B that small, K against 32 and M N K against 256^3 (direct path below).
    shapes += [Shape(1024, 600, k) for k in (32, 33)] + [Shape(256, 256, k) for k in (255, 256, 257)]
    shapes += [Shape(m, 45, 31) for m in (mr - 1, mr, mr + 1, 2 * mr + 1)]
    shapes += [Shape(m, 67, 19) for m in (mc - 1, mc, mc + 1)]
    one_block_nc = blocking["one_block_NC"]
    shapes += [Shape(2 * mr + 1, n, kc + 5) for n in (one_block_nc - 1, one_block_nc, one_block_nc + 1)]
    # Up to 16 rows the nest packs B in whole rows, with KC shortened once a row of B passes
    # half of L2 / KC: this N shortens it, so the K sum is cut there too.
    wide_n = blocking["L2"] // 2 // (kc * itemsize) + 7
    shapes += [Shape(m, wide_n, kc + 5) for m in (15, 16, 17)]
    # ... but not below 128 (c/packed.c's STREAM_B_MIN_KC): a wider B is packed in panels of
    # fewer columns than N, the last one narrower.
    floor_n = blocking["L2"] // 2 // (128 * itemsize)
    shapes += [Shape(m, n, 2 * 128 + 5) for m in (3, 16) for n in (floor_n + 9, 3 * floor_n + 5)]
    shapes += [Shape(1, n, 23) for n in (chunk - 1, chunk, chunk + 1)]
    shapes += [Shape(9, 33, k) for k in (kc // 2 - 1, kc // 2, kc // 2 + 1, kc - 1, kc, kc + 1)]
    shapes += [Shape(1, 33, kc + 1), Shape(33, 1, kc + 1)]
    # Past one A block (M > MC) and KC, some CPUs take the deep KC: K around it and past twice it.
    deep = blocking["deep_KC"]
    shapes += [Shape(mc + 1, 35, k) for k in (deep - 1, deep, deep + 1, 2 * deep + 3)]
    return shapes


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_path_at_its_crossovers(dtype):
    # Through the path the shape chooses and through each matrix path forced, so the loop
    # nest's own cuts (MR, MC, KC / 2 where its loops swap, KC) are crossed as well.
    for shape in _path_crossovers(dtype):
        for path in ("auto", *MATRIX_PATHS):
            for threads in (1, 2, 3):
                _check(shape, dtype, seed=shape.m + shape.n, threads=threads, path=path)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_paths_give_the_same_bits_for_every_thread_count(dtype):
    # The GEMV paths cut N (M = 1) at whole cache lines of y and M (N = 1) at rows of four,
    # so a given element is summed by the same code whichever thread takes it.
    for shape in (Shape(1, 4133, 517), Shape(1101, 1, 517), Shape(1, 1, 999), Shape(2, 1, 300), Shape(1, 2, 300)):
        a, b = harness.make_inputs(shape, dtype)
        results = {t: harness.get("c.packed", threads=t)(a, b) for t in (1, 2, 3, 7)}
        assert harness.check(results[1], a, b).passed
        for threads, result in results.items():
            np.testing.assert_array_equal(result, results[1], err_msg=f"{threads} threads, {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_gemv_that_reads_b_ahead_gives_the_same_bits(dtype):
    # One thread may read B's rows ahead by hand (on a Zen 5, past half of L3; path
    # "vector_read_ahead" forces it on any CPU) and two threads do not: the sums are the same,
    # to the bit, and right, with N ragged against the cache lines and the 32 KiB chunks of y,
    # and K against the eight rows per pass.
    shape = Shape(1, 2 * 32768 // np.dtype(dtype).itemsize + 4099, 67)
    read_ahead = _check(shape, dtype, threads=1, path="vector_read_ahead")
    np.testing.assert_array_equal(read_ahead, _check(shape, dtype, threads=2))
    np.testing.assert_array_equal(read_ahead, _check(shape, dtype, threads=1))
    np.testing.assert_array_equal(read_ahead, _check(shape, dtype, threads=2, path="vector_read_ahead"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dot_products_that_read_a_ahead_give_the_same_bits(dtype):
    # N = 1: A's rows may be read ahead by hand (on a Zen 4, past half of L3; path
    # "vector_read_ahead" forces it on any CPU): the sums are the same, to the bit, and right,
    # on one thread and two, with rows past the last group of eight and K ragged against the
    # 64-byte lines each step reads.
    shape = Shape(16387, 1, 71)  # enough multiply-adds for two threads to split the rows
    read_ahead = _check(shape, dtype, threads=1, path="vector_read_ahead")
    for threads in (1, 2):
        for path in ("vector", "vector_read_ahead", "auto"):
            np.testing.assert_array_equal(read_ahead, _check(shape, dtype, threads=threads, path=path))


def _dots_as_wide_as_the_tiles() -> bool:
    """Whether this build's dot products run in vectors as wide as the tiles it picks (a build
    for plain x86-64 runs them 16 bytes wide beside the AVX-512 tiles, and leaves few columns to
    the tiles)."""
    needs = {"avx512": "avx512f", "avx2": "avx2"}.get(c_backend.resolved_variant("c.packed"))
    return needs is None or needs in clib.build_isa()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_few_columns_of_b_take_dot_products_with_the_same_bits_on_any_thread_count(dtype):
    # 2 <= N <= 8: dot products against B's columns (several rows of A at a time, as many as
    # the registers hold for that N, then the rest one by one), K ragged against every vector
    # width and M against every group of rows; two threads cut M elsewhere.
    for n in range(2, 9):
        shape = Shape(1013, n, 32 * n + 7)
        dots = _check(shape, dtype, threads=1, path="vector")
        np.testing.assert_array_equal(dots, _check(shape, dtype, threads=2, path="vector"))
        a, b = harness.make_inputs(shape, dtype)  # each row's sums its own: any 5 rows alone
        np.testing.assert_array_equal(dots[500:505], harness.get("c.packed", path="vector")(a[500:505], b))
        # auto takes the dot products or the tiles, whichever pays on this shape (dots_pay)
        auto = _check(shape, dtype, threads=1)
        np.testing.assert_array_equal(auto, _check(shape, dtype, threads=2))
        direct = _check(shape, dtype, threads=1, path="direct")
        assert np.array_equal(auto, dots) or np.array_equal(auto, direct), n
    # a short K (under 8 per column) stays with the tiles: each dot product's final sum of
    # lanes would not be repaid
    a, b = harness.make_inputs(Shape(64, 8, 63), dtype)
    auto = harness.get("c.packed", threads=1)(a, b)
    np.testing.assert_array_equal(auto, harness.get("c.packed", threads=1, path="direct")(a, b))
    assert not np.array_equal(auto, harness.get("c.packed", path="vector")(a, b))
    # a long one takes them, where they are as wide as the tiles (two columns: any vector width)
    if _dots_as_wide_as_the_tiles():
        a, b = harness.make_inputs(Shape(300, 2, 1031), dtype)
        if dtype == "float32" or "avx2" in clib.build_isa():  # float64 in 16 bytes: 2 lanes, no gain
            auto = harness.get("c.packed", threads=1)(a, b)
            np.testing.assert_array_equal(auto, harness.get("c.packed", threads=1, path="vector")(a, b))


def test_paths_are_chosen_by_shape_and_can_be_forced():
    # With K past KC the loop nest sums K in KC-long pieces and the direct path in one chain,
    # so the two round differently and the bits show which path ran.
    blocking = c_backend.packed_blocking("auto", "float32")
    k = 2 * blocking["KC"] + 3
    widest_direct = blocking["L2"] // 2 // (k * 4)
    for n, expected in ((widest_direct, "direct"), (widest_direct + 1, "nest")):
        a, b = harness.make_inputs(Shape(5, n, k), "float32")
        by_path = {path: harness.get("c.packed", threads=1, path=path)(a, b) for path in MATRIX_PATHS}
        assert not np.array_equal(by_path["direct"], by_path["nest"])
        np.testing.assert_array_equal(harness.get("c.packed", threads=1)(a, b), by_path[expected])
    for vector_path in ("vector", "vector_read_ahead"):
        with pytest.raises(harness.MatmulInputError, match="path='vector' needs M = 1 or N <= 8"):
            harness.get("c.packed", path=vector_path)(a, b)
    with pytest.raises(ValueError, match="unknown path 'packed'"):
        harness.get("c.packed", path="packed")(a, b)
    a, b = harness.make_inputs(Shape(1, 77, 300), "float32")
    for path in ("vector", "vector_read_ahead", "direct", "nest"):
        assert harness.check(harness.get("c.packed", path=path)(a, b), a, b).passed, path


def test_the_thread_pool_survives_fork():
    # The pool's workers exist only in the parent; a child must make its own, not wait on
    # threads that fork did not copy.
    import multiprocessing

    a, b = harness.make_inputs(Shape(300, 300, 300), "float32")
    parent = harness.get("c.packed", threads=2)(a, b)  # the pool now has a worker
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        child = pool.apply_async(_packed_in_child, (a, b)).get(timeout=60)
    np.testing.assert_array_equal(child, parent)


def _packed_in_child(a, b):
    return harness.get("c.packed", threads=2)(a, b)


def test_the_public_call_returns_a_fresh_array_and_takes_read_only_inputs():
    a, b = harness.make_inputs(Shape(33, 17, 9), "float64")
    a.flags.writeable = False
    b.flags.writeable = False
    matmul = harness.get("c.packed")
    first, second = matmul(a, b), matmul(a, b)
    assert first is not second and not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, second)
    assert first.flags.c_contiguous and first.flags.writeable


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_outputs_start_on_a_cache_line(dtype):
    # NumPy's own large arrays start 16 bytes past a cache line; the C backends' outputs from
    # ALIGNED_OUTPUT_BYTES on start on one (c.py says why), and are otherwise ordinary arrays.
    itemsize = np.dtype(dtype).itemsize
    n = 1 + int((c_backend.ALIGNED_OUTPUT_BYTES // itemsize) ** 0.5)  # just past the threshold
    shape = Shape(n, n, 3)
    a, b = harness.make_inputs(shape, dtype)
    matmul = harness.get("c.packed")
    first, second = matmul(a, b), matmul(a, b)
    for c in (first, second):
        assert c.ctypes.data % c_backend.CACHE_LINE == 0
        assert c.shape == (n, n) and c.dtype == a.dtype
        assert c.flags.c_contiguous and c.flags.writeable and c.flags.aligned
    assert not np.shares_memory(first, second)
    assert harness.check(first, a, b).passed
    prepared = matmul.prepare(a, b)  # the timer's path allocates the same way
    prepared.run()
    assert prepared.output.ctypes.data % c_backend.CACHE_LINE == 0
    np.testing.assert_array_equal(prepared.result(), first)
    small = c_backend.empty_output(8, 8, np.dtype(dtype))
    assert small.shape == (8, 8) and small.flags.owndata  # small outputs: plain np.empty
