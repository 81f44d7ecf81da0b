"""The CUDA kernels on a real GPU, through every loader that is installed, against the reference.

Skipped, with the reason, where there is no CUDA GPU or no loader (with MATMUL_REQUIRE_GPU=1, as
scripts/gpu_check.sh sets, a skip here is a failure). Outputs are pre-filled with NaN, so an
element a kernel never writes fails the check. The speed targets are not tested here: they are
judged from the GPU comparison's JSON (``python -m harness verdicts``, harness/tooling/verdicts.py).
"""

from __future__ import annotations

import pytest

import harness
from harness.backends.cuda import emulation, loaders
from harness.model.inputs import Shape

_reason = loaders.native_unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_reason is not None, reason=str(_reason))]

EDGE = [1, 2, 7, 16, 17, 33, 64, 65, 127, 128, 129, 255, 256, 257]
GEMM_SHAPES = [Shape(s, s, s) for s in EDGE] + [
    Shape(1, 64, 33),
    Shape(33, 65, 1),
    Shape(17, 1, 63),
    Shape(100, 130, 70),
    Shape(130, 136, 72),
    Shape(1000, 520, 264),
    Shape(513, 1031, 777),
]
GEMV_SHAPES = [
    Shape(1, n, k) for n, k in [(1, 1), (7, 15), (130, 70), (33, 257), (4096, 4096), (1000, 4104), (5, 16392)]
]
INSTALLED_LOADERS = [name for name in loaders.LOADERS if loaders.loader_unavailable_reason(name) is None]


@pytest.fixture(autouse=True)
def native(monkeypatch):
    monkeypatch.delenv(emulation.EMULATE_ENV, raising=False)


@pytest.fixture(params=INSTALLED_LOADERS or ["none"])
def loader(request, monkeypatch):
    if request.param == "none":
        pytest.skip("no CUDA kernel loader is installed")
    monkeypatch.setenv(loaders.LOADER_ENV, request.param)
    return request.param


def _cases():
    for impl in harness.implementations("cuda.*", "torch.cublas"):
        if impl.weights:  # decode kernels take quantized W [N, K]: test_native_decode_matches_reference
            continue
        shapes = GEMV_SHAPES if impl.operation == "gemv" else GEMM_SHAPES
        for dtype in impl.dtypes:
            for shape in shapes:
                yield pytest.param(impl.name, shape, dtype, id=f"{impl.name}-{shape}-{dtype}")


@pytest.mark.parametrize("name, shape, dtype", list(_cases()))
def test_native_matches_reference(name, shape, dtype, loader):
    a, b = harness.make_inputs(shape, dtype, seed=7)
    prepared = harness.get(name).prepare(a, b)
    assert prepared.mode == "native"
    if name.startswith("cuda."):
        assert prepared.loader == loader
    prepared.run()
    result = prepared.result()
    assert result.shape == (shape.m, shape.n) and result.dtype == a.dtype
    outcome = harness.check(result, a, b)
    assert outcome.passed, f"{name} at {shape} {dtype} ({loader}): {outcome.message}"


# K = 96: one lane a row; 544: 8 lanes a row (128 <= K < 1024); 4128 and 4096: the warp (half of it for 5..16
# rows of X), 4128 with a last stage of X of one block
DECODE_SHAPES = [
    Shape(m, n, k) for m in (1, 4, 5, 16, 17) for n, k in [(1, 32), (7, 96), (65, 544), (33, 4128), (4096, 4096)]
]
# q4_K, a lane a super-block of 256: K = 256 and 768, one lane a row; 1280, 8 lanes a row (4 and 2
# for rows of X in fours and sixteens, with a stage of X and part of one); 8448, the warp, one lane
# with a second step; 4096, whole steps
Q4K_DECODE_SHAPES = [
    Shape(m, n, k) for m in (1, 4, 5, 16, 17) for n, k in [(1, 256), (7, 768), (65, 1280), (33, 8448), (512, 4096)]
]


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "bf16", "q4_K"])
def test_native_decode_matches_reference(fmt, loader):
    """cuda.decode (Y = X W^T, W quantized) at its edge shapes, checked against the float64
    product of X and the weights the format holds."""
    from harness.model.quant import make_decode_inputs

    for shape in Q4K_DECODE_SHAPES if fmt == "q4_K" else DECODE_SHAPES:
        x, w = make_decode_inputs(shape, fmt, seed=7)
        prepared = harness.get("cuda.decode").prepare(x, w)
        assert prepared.mode == "native" and prepared.loader == loader
        prepared.run()
        outcome = harness.check(prepared.result(), x, w.dequantize().T)
        assert outcome.passed, f"cuda.decode {fmt} at {shape} ({loader}): {outcome.message}"


def test_loader_shares_torch_context(loader):
    """The kernels run in PyTorch's primary context: a kernel writes straight into a torch tensor."""
    import torch

    x = torch.ones(4, 4, device="cuda")
    y = torch.eye(4, device="cuda")
    out = torch.full((4, 4), float("nan"), device="cuda")
    launch = loaders.native_function("cuda/naive.cu", "naive_f32", "PPPiii")
    launch((1, 1, 1), (16, 16, 1), [x.data_ptr(), y.data_ptr(), out.data_ptr(), 4, 4, 4])
    torch.cuda.synchronize()
    assert torch.equal(out, x)


def test_compare_records_the_loader(loader):
    results = harness.compare(["96x80x72"], "cuda.tiled", ["float32"], baselines=False, min_time=0.01)
    row = results.row("cuda.tiled", "96x80x72", "float32")
    assert row.passed and row.loader == loader and row.median_s, row
