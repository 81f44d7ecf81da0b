"""GPU only: the Triton kernels compiled and autotuned, at sizes that matter, and their targets.

Skipped (with the reason) on machines without a CUDA GPU, where test_triton.py checks the
same kernels on Triton's CPU interpreter. The speed targets are measured in the same
process with the timer the harness uses for every GPU row (torch_gpu.time_cuda: CUDA events,
the L2 flushed before every repeat):

- triton.matmul in FP16 and BF16 at 4096^3 and 8192^3: at least 0.9x cuBLAS (torch.matmul);
- triton.gemv at 1x8192x8192 and 1x16384x16384: at least 80% of the GPU's HBM bandwidth
  (datasheet figure; skipped for GPUs the harness has no figure for).

They are marked slow (autotuning at 8192 takes a while): ``-m "not slow"`` leaves them out.
"""
import harness  # first: it decides how Triton is set up before anything imports it
import numpy as np
import pytest
from harness import check, make_inputs
from harness.backends import torch_gpu, triton_kernels

MODE, REASON = triton_kernels.setup()
if REASON or MODE != "native":
    pytest.skip(
        f"needs a CUDA GPU with native Triton ({REASON or 'Triton runs on its CPU interpreter here'})",
        allow_module_level=True,
    )

import torch  # noqa: E402

pytestmark = pytest.mark.gpu
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", ["1000x1030x700", "1x4096x4096", "129x127x4097"])
def test_matmul_native(shape, dtype):
    a, b = make_inputs(shape, dtype)
    prepared = harness.get("triton.matmul").prepare(a, b)
    assert prepared.mode == "native"
    prepared.run()
    outcome = check(prepared.result(), a, b)
    assert outcome.passed, outcome.message


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", ["1x4096x4096", "1x1000x3001"])
def test_gemv_native(shape, dtype):
    a, b = make_inputs(shape, dtype)
    outcome = check(harness.get("triton.gemv")(a, b), a, b)
    assert outcome.passed, outcome.message


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_transposed_views(dtype):
    source = triton_kernels.load_source("triton/matmul.py")
    a_np, b_np = make_inputs("1024x768x512", dtype)
    a_t = triton_kernels.to_torch(np.ascontiguousarray(a_np.T), "cuda")  # A stored column-major
    b_t = triton_kernels.to_torch(np.ascontiguousarray(b_np.T), "cuda")
    c = source.matmul(a_t.T, b_t.T)
    torch.cuda.synchronize()
    outcome = check(triton_kernels.to_numpy(c), a_np, b_np)
    assert outcome.passed, outcome.message


def test_compare_times_native_rows():
    results = harness.compare(["1024"], "triton.matmul", ["float16"], baselines=False, min_time=0.05)
    row = results.row("triton.matmul", "1024", "float16")
    assert row.passed and row.mode == "native" and row.median_s and row.gflops, row


def _seconds(launch) -> float:
    return torch_gpu.time_cuda(launch, min_time=0.3).median_s


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("size", [4096, 8192])
def test_matmul_at_least_090_of_cublas(size, dtype):
    source = triton_kernels.load_source("triton/matmul.py")
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((size, size), device="cuda", dtype=TORCH_DTYPES[dtype], generator=generator)
    b = torch.randn((size, size), device="cuda", dtype=TORCH_DTYPES[dtype], generator=generator)
    source.matmul(a, b)  # autotune outside the timing
    torch_gpu.exact_cublas_settings()  # as the torch.cublas baseline runs: FP32 reductions
    ours = _seconds(lambda: source.matmul(a, b))
    cublas = _seconds(lambda: torch.matmul(a, b))
    ratio = cublas / ours
    tflops = 2 * size**3 / ours / 1e12
    print(f"triton.matmul {size}^3 {dtype}: {tflops:.0f} TFLOP/s, {ratio:.3f}x cuBLAS")
    assert ratio >= 0.9, f"{ratio:.3f}x cuBLAS ({tflops:.0f} TFLOP/s), target 0.9x"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("size", [8192, 16384])
def test_gemv_at_least_80_percent_of_hbm(size, dtype):
    peaks = torch_gpu.device_peaks()
    if peaks is None:
        pytest.skip(f"no HBM figure for {torch_gpu.device_name()}")
    bandwidth = peaks["bandwidth"]  # GB/s
    source = triton_kernels.load_source("triton/gemv.py")
    generator = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn((size, size), device="cuda", dtype=TORCH_DTYPES[dtype], generator=generator)
    x = torch.randn((size,), device="cuda", dtype=TORCH_DTYPES[dtype], generator=generator)
    source.gemv(w, x)
    seconds = _seconds(lambda: source.gemv(w, x))
    gbytes_per_s = (size * size + 2 * size) * w.element_size() / seconds / 1e9
    share = gbytes_per_s / bandwidth
    print(f"triton.gemv 1x{size}x{size} {dtype}: {gbytes_per_s:.0f} GB/s, {share:.1%} of {bandwidth:.0f} GB/s")
    assert share >= 0.8, f"{gbytes_per_s:.0f} GB/s is {share:.1%} of HBM peak, target 80%"
