"""The CUDA kernels on the CPU emulation (cuda/emu/): the same .cu files and launch geometry as
on the GPU, compiled with g++, checked against the float64 reference on the shapes that find bugs.
"""

from __future__ import annotations

import numpy as np
import pytest
from code_edits import replace_code

import harness
from harness.backends.cuda import emulation, loaders, plans
from harness.env.sources import source_path
from harness.model.inputs import Shape

pytestmark = pytest.mark.skipif(
    emulation.emulation_unavailable_reason() is not None, reason=str(emulation.emulation_unavailable_reason())
)

EDGE = [1, 2, 7, 15, 16, 17, 33, 63, 64, 65, 127, 128, 129]
GEMM_SHAPES = [Shape(s, s, s) for s in EDGE] + [
    Shape(1, 64, 33),  # M = 1
    Shape(33, 65, 1),  # K = 1
    Shape(17, 1, 63),  # N = 1
    Shape(7, 129, 16),
    Shape(65, 15, 127),
    Shape(100, 130, 70),
    Shape(16, 48, 32),  # multiples of 16, non-square
    Shape(130, 136, 72),  # K and N multiples of 8: the 16-byte load paths, with partial tiles
    Shape(257, 24, 40),  # more than two tile rows: the grouped block ordering
]
GEMV_SHAPES = [
    Shape(1, n, k)
    for n, k in [(1, 1), (7, 15), (64, 64), (130, 70), (33, 257), (17, 1), (129, 128), (300, 264), (65, 8), (9, 1040)]
]


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv(emulation.EMULATE_ENV, "1")


def _cases():
    for impl in harness.implementations("cuda.*"):
        if impl.weights:  # decode kernels take quantized W [N, K], not a float B: tests/test_cuda_decode.py
            continue
        shapes = GEMV_SHAPES if impl.operation == "gemv" else GEMM_SHAPES
        for dtype in impl.dtypes:
            for shape in shapes:
                yield pytest.param(impl.name, shape, dtype, id=f"{impl.name}-{shape}-{dtype}")


@pytest.mark.parametrize("name, shape, dtype", list(_cases()))
def test_emulated_matches_reference(emulate, name, shape, dtype):
    a, b = harness.make_inputs(shape, dtype, seed=3)
    a_before, b_before = a.copy(), b.copy()
    prepared = harness.get(name).prepare(a, b)
    assert prepared.mode == "emulated"
    prepared.run()
    result = prepared.result()
    assert result.shape == (shape.m, shape.n) and result.dtype == a.dtype
    outcome = harness.check(result, a, b)
    assert outcome.passed, f"{name} at {shape} {dtype}: {outcome.message}"
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


def test_unaligned_inputs_take_the_scalar_path(emulate):
    """Arrays that do not start on 16 bytes must not be read with vector loads."""
    shape = Shape(40, 64, 32)
    a, b = harness.make_inputs(shape, "float32", seed=4)
    impl = harness.lookup("cuda.register_tiled")
    library = emulation.emulated_library(impl.source)
    launch = plans.plan("register_tiled", "float32", *shape)
    raw = [np.zeros(x.size + 1, dtype=np.float32) for x in (a, b, np.empty((40, 64)))]
    views = [r[1:] if r.ctypes.data % 16 == 0 else r[:-1] for r in raw]  # 4 bytes off a 16-byte boundary
    views[0][:] = a.ravel()
    views[1][:] = b.ravel()
    library.launch(launch, {"A": views[0].ctypes.data, "B": views[1].ctypes.data, "C": views[2].ctypes.data})
    assert harness.check(views[2].reshape(40, 64), a, b).passed


def test_emulated_rows_are_marked_and_not_timed(emulate):
    results = harness.compare([33, "1x40x24"], ["cuda.tiled", "cuda.gemv"], ["float32"], baselines=False, min_time=0.01)
    ran = [row for row in results if row.status == "ok"]
    assert {row.implementation for row in ran} == {"cuda.tiled", "cuda.gemv"}
    assert all(row.mode == "emulated" and row.median_s is None and row.gflops is None for row in ran)
    assert "emulated, not timed" in str(results)


def test_too_big_for_the_emulator_is_refused(emulate, monkeypatch):
    monkeypatch.delenv("MATMUL_ALLOW_SLOW", raising=False)
    a, b = harness.make_inputs(Shape(1024, 1024, 1024), "float32")
    with pytest.raises(harness.MatmulInputError, match="MATMUL_ALLOW_SLOW"):
        harness.get("cuda.naive").prepare(a, b)


def test_unavailable_without_gpu_or_emulation(monkeypatch):
    monkeypatch.delenv(emulation.EMULATE_ENV, raising=False)
    if loaders.native_unavailable_reason() is None:
        pytest.skip("a GPU and pycuda are present: the native path is available")
    for impl in harness.implementations("cuda.*"):
        reason = impl.unavailable_reason()
        assert reason and emulation.EMULATE_ENV in reason
        a, b = harness.make_inputs(Shape(1, 16, 32), impl.dtypes[0])
        if impl.weights:
            from harness.model.quant import quantize

            b = quantize(np.ascontiguousarray(b.T), impl.weights[0])
        with pytest.raises(harness.UnavailableError):
            harness.get(impl.name)(a, b)


def test_missing_barrier_gives_wrong_results():
    """Fibers run each thread until it parks, so without the second __syncthreads the first thread
    of a block overwrites the shared tile before the others have read it: deterministically wrong."""
    dot = "for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];"
    source = replace_code(source_path("cuda/tiled.cu").read_text(), dot + " __syncthreads();", dot)
    library = emulation.EmulatedLibrary(emulation.build_emulation("cuda/tiled.cu", source_text=source, tag="nosync2"))
    shape = Shape(32, 32, 48)
    a, b = harness.make_inputs(shape, "float32", seed=5)
    c = np.zeros((32, 32), dtype=np.float32)
    library.launch(plans.plan("tiled", "float32", *shape), {"A": a.ctypes.data, "B": b.ctypes.data, "C": c.ctypes.data})
    assert not harness.check(c, a, b).passed


def test_divergent_barriers_are_an_error_not_a_hang():
    source = r"""
extern "C" __global__ void divergent(float* x, int n)
{
    if (threadIdx.x < 16) __syncwarp();   // half of warp 0 waits for its whole warp ...
    else __syncthreads();                 // ... the rest for the whole block: neither can complete
    if (threadIdx.x < n) x[threadIdx.x] = 1.f;
}
"""
    library = emulation.EmulatedLibrary(emulation.build_emulation("cuda/tiled.cu", source_text=source, tag="divergent"))
    x = np.zeros(64, dtype=np.float32)
    launch = plans.Launch("divergent", (1, 1, 1), (64, 1, 1), ("A", 64), "Pi")
    with pytest.raises(RuntimeError, match="deadlock"):
        library.launch(launch, {"A": x.ctypes.data})


def _emulated_variant(relative: str, technique: str, dtype: str, shape: Shape, text: str, tag: str):
    """Whether ``text`` (a variant of ``relative``) computes the right product at ``shape``."""
    library = emulation.EmulatedLibrary(emulation.build_emulation(relative, source_text=text, tag=tag))
    a, b = harness.make_inputs(shape, dtype, seed=5)
    operation = "gemv" if technique == "gemv" else "gemm"
    buffers, out_shape = plans.kernel_buffers(operation, a, b, technique)
    buffers = {name: emulation._aligned_copy(array) for name, array in buffers.items()}
    buffers["C"] = emulation._aligned_copy(np.full(out_shape, np.nan, dtype=a.dtype))
    library.launch(plans.plan(technique, dtype, *shape), {name: x.ctypes.data for name, x in buffers.items()})
    return harness.check(buffers["C"].reshape(shape.m, shape.n), a, b).passed


STORE_TILE = "wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);"


@pytest.mark.parametrize(
    "barrier, without",
    [
        (STORE_TILE + " __syncwarp();", STORE_TILE),  # the tile is in place before the lanes read it
        ("__syncwarp(); } }", "} }"),  # every lane has read it before the next store overwrites it
    ],
    ids=["before-reading", "before-overwriting"],
)
def test_wmma_epilogue_without_its_syncwarp_is_wrong(request, barrier, without):
    """store_matrix_sync writes each lane's share and synchronizes nothing, as on the GPU."""
    text = source_path("cuda/wmma.cu").read_text()
    assert _emulated_variant("cuda/wmma.cu", "wmma", "bfloat16", Shape(40, 48, 32), text, "")
    assert not _emulated_variant(
        "cuda/wmma.cu",
        "wmma",
        "bfloat16",
        Shape(40, 48, 32),
        replace_code(text, barrier, without),
        "no-syncwarp-" + request.node.callspec.id.split("-", 1)[-1],
    )


def test_shuffle_mask_that_leaves_lanes_out_is_an_error():
    full = "__shfl_xor_sync(0xffffffffu, acc, offset)"
    text = source_path("cuda/gemv.cu").read_text()
    with pytest.raises(RuntimeError, match="lane 16 calls it with mask 0x0000ffff"):
        _emulated_variant(
            "cuda/gemv.cu",
            "gemv",
            "bfloat16",
            Shape(1, 9, 64),
            replace_code(text, full, full.replace("0xffffffffu", "0x0000ffffu")),
            "half-mask",
        )
