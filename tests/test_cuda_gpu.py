"""The CUDA kernels on a real GPU through PyCUDA, against the reference and against cuBLAS.

Skipped, with the reason, where there is no CUDA GPU or no pycuda. scripts/gpu_check.sh runs
this file on a GPU machine. The speed targets are ratios measured on the same machine, so they
hold on any Hopper GPU; they were set for an H200:
- cuda.register_tiled (FP32 SIMT) at least 50% of cuBLAS FP32 at 4096^3;
- cuda.wmma (BF16) at least 25% of cuBLAS BF16 at 4096^3 and 8192^3;
- cuda.gemv (BF16) at least 80% of the HBM bandwidth at 1x16384x16384.
"""
from __future__ import annotations

import pytest

import harness
from harness.backends import cuda, torch_gpu
from harness.inputs import Shape

_reason = cuda.native_unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_reason is not None, reason=str(_reason))]

EDGE = [1, 2, 7, 16, 17, 33, 64, 65, 127, 128, 129, 255, 256, 257]
GEMM_SHAPES = [Shape(s, s, s) for s in EDGE] + [Shape(1, 64, 33), Shape(33, 65, 1), Shape(17, 1, 63),
                                                 Shape(100, 130, 70), Shape(130, 136, 72), Shape(1000, 520, 264),
                                                 Shape(513, 1031, 777)]
GEMV_SHAPES = [Shape(1, n, k) for n, k in [(1, 1), (7, 15), (130, 70), (33, 257), (4096, 4096), (1000, 4104), (5, 16392)]]


@pytest.fixture(autouse=True)
def native(monkeypatch):
    monkeypatch.delenv(cuda.EMULATE_ENV, raising=False)


def _cases():
    for impl in harness.implementations("cuda.*", "torch.cublas"):
        shapes = GEMV_SHAPES if impl.operation == "gemv" else GEMM_SHAPES
        for dtype in impl.dtypes:
            for shape in shapes:
                yield pytest.param(impl.name, shape, dtype, id=f"{impl.name}-{shape}-{dtype}")


@pytest.mark.parametrize("name, shape, dtype", list(_cases()))
def test_native_matches_reference(name, shape, dtype):
    a, b = harness.make_inputs(shape, dtype, seed=7)
    prepared = harness.get(name).prepare(a, b)
    assert prepared.mode == "native"
    prepared.run()
    result = prepared.result()
    assert result.shape == (shape.m, shape.n) and result.dtype == a.dtype
    outcome = harness.check(result, a, b)
    assert outcome.passed, f"{name} at {shape} {dtype}: {outcome.message}"


def test_shares_torch_context():
    """PyCUDA runs in PyTorch's primary context: a kernel writes straight into a torch tensor."""
    import pycuda.driver as driver
    import torch

    x = torch.ones(4, 4, device="cuda")
    y = torch.eye(4, device="cuda")
    out = torch.zeros(4, 4, device="cuda")
    function = cuda.native_function("cuda/naive.cu", "naive_f32", "PPPiii")
    function.prepared_call((1, 1, 1), (16, 16, 1), x.data_ptr(), y.data_ptr(), out.data_ptr(), 4, 4, 4)
    torch.cuda.synchronize()
    assert torch.equal(out, x)
    assert driver.Context.get_current() is not None


def _median_seconds(name: str, shape: Shape, dtype: str) -> float:
    a, b = harness.make_inputs(shape, dtype, seed=0)
    prepared = harness.get(name).prepare(a, b)
    prepared.run()
    return prepared.time(0.3).median_s


def _ratio(name: str, shape: Shape, dtype: str) -> tuple[float, float, float]:
    mine = _median_seconds(name, shape, dtype)
    base = _median_seconds("torch.cublas", shape, dtype)
    return base / mine, shape.flops / mine / 1e12, shape.flops / base / 1e12


@pytest.mark.parametrize("size", [4096])
def test_register_tiled_reaches_half_of_cublas_fp32(size):
    ratio, mine, base = _ratio("cuda.register_tiled", Shape(size, size, size), "float32")
    print(f"\nregister_tiled FP32 {size}: {mine:.1f} TFLOP/s, cuBLAS {base:.1f}: {ratio:.0%}")
    assert ratio >= 0.5, f"{mine:.1f} TFLOP/s is {ratio:.0%} of cuBLAS's {base:.1f} (target 50%, aim 70%)"


@pytest.mark.parametrize("size", [4096, 8192])
def test_wmma_reaches_a_quarter_of_cublas_bf16(size):
    ratio, mine, base = _ratio("cuda.wmma", Shape(size, size, size), "bfloat16")
    print(f"\nwmma BF16 {size}: {mine:.0f} TFLOP/s, cuBLAS {base:.0f}: {ratio:.0%}")
    assert ratio >= 0.25, f"{mine:.0f} TFLOP/s is {ratio:.0%} of cuBLAS's {base:.0f} (target 25%)"


def test_gemv_streams_at_80_percent_of_hbm():
    peaks = torch_gpu.device_peaks()
    if not peaks:
        pytest.skip(f"no datasheet bandwidth known for {torch_gpu.device_name()}")
    shape = Shape(1, 16384, 16384)
    seconds = _median_seconds("cuda.gemv", shape, "bfloat16")
    gbytes = (shape.n * shape.k + shape.k + shape.n) * 2 / seconds / 1e9
    share = gbytes / peaks["bandwidth"]
    print(f"\ngemv BF16 16384^2: {gbytes:.0f} GB/s = {share:.0%} of {peaks['bandwidth']:.0f} GB/s")
    assert share >= 0.8, f"{gbytes:.0f} GB/s is {share:.0%} of the {peaks['bandwidth']:.0f} GB/s peak (target 80%)"
