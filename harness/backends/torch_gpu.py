"""PyTorch on a CUDA GPU: ``torch.matmul`` on CUDA tensors is cuBLAS, the GPU baseline.

Also the GPU plumbing the CUDA adapter shares: NumPy <-> CUDA tensor conversion (BF16 too),
timing with CUDA events with the L2 cache flushed between repeats, and the device's peak rates.

cuBLAS is asked for the same arithmetic as the hand kernels: TF32 off for FP32 (a TF32 "FP32"
GEMM would be a different, less accurate product) and no reduced-precision reductions for
BF16/FP16 (the hand kernels accumulate in FP32 all the way).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..core import Implementation
from ..inputs import BFLOAT16
from ..timing import Timing

# Vendor datasheet figures (dense, no sparsity): FP32 SIMT and BF16/FP16 tensor-core GFLOP/s,
# and HBM bandwidth in GB/s. Matched against the device name, first match wins.
GPU_PEAKS = (
    ("H200", {"float32": 67_000.0, "bfloat16": 989_000.0, "float16": 989_000.0, "bandwidth": 4_800.0}),
    ("H100 PCIe", {"float32": 51_000.0, "bfloat16": 756_000.0, "float16": 756_000.0, "bandwidth": 2_000.0}),
    ("H100", {"float32": 67_000.0, "bfloat16": 989_000.0, "float16": 989_000.0, "bandwidth": 3_350.0}),
    ("A100-SXM4-80GB", {"float32": 19_500.0, "bfloat16": 312_000.0, "float16": 312_000.0, "bandwidth": 2_039.0}),
    ("A100", {"float32": 19_500.0, "bfloat16": 312_000.0, "float16": 312_000.0, "bandwidth": 1_555.0}),
)


@lru_cache(maxsize=None)
def cuda_unavailable_reason() -> str | None:
    """None when PyTorch sees a CUDA GPU, else why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (it allocates GPU memory, runs cuBLAS and times GPU work)"
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return (f"no CUDA GPU is visible to PyTorch {torch.__version__} "
                + (f"(built for CUDA {built})" if built else "(a CPU-only build)"))
    return None


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())


def device_peaks() -> dict | None:
    name = device_name()
    for key, peaks in GPU_PEAKS:
        if key in name:
            return peaks
    return None


def peak_for(operation: str, dtype: str) -> float | None:
    """Peak GFLOP/s of the current GPU for ``dtype``. For a GEMV the roof is bandwidth, not
    arithmetic: 2 FLOPs per element of W read, so the peak is bandwidth * 2 / itemsize, and
    "% peak" reads as a percentage of the HBM bandwidth."""
    peaks = device_peaks()
    if not peaks:
        return None
    if operation == "gemv":
        itemsize = 4 if dtype == "float32" else 2
        return peaks["bandwidth"] * 2 / itemsize
    return peaks.get(dtype)


def to_device(array: np.ndarray):
    """A CUDA tensor holding ``array`` (BF16 through an int16 view: torch.from_numpy cannot take it)."""
    import torch

    array = np.ascontiguousarray(array)
    if BFLOAT16 is not None and array.dtype == BFLOAT16:
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    return tensor.to("cuda", non_blocking=False)


def to_numpy(tensor) -> np.ndarray:
    import torch

    tensor = tensor.detach().to("cpu")
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BFLOAT16).copy()
    return tensor.numpy().copy()


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


@lru_cache(maxsize=None)
def _flush_buffer():
    """A buffer over twice the L2 size (at least 256 MiB): zeroing it evicts everything else."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
    return torch.empty(max(2 * l2, 256 * 2**20), dtype=torch.uint8, device="cuda")


def time_cuda(launch, min_time: float = 0.2, min_repeats: int = 5, max_repeats: int = 200, warmup: int = 2) -> Timing:
    """Time ``launch`` (which enqueues GPU work and returns without synchronising) with CUDA
    events, flushing the L2 cache before each repeat so every repeat reads from HBM.

    The flush (a memset of a few hundred MiB, tens of microseconds of GPU time) is enqueued just
    before the start event, so the GPU is still busy with it while Python enqueues the launch:
    the start event fires when the kernel can start, and Python's launch overhead stays outside
    the measurement.
    """
    import torch

    flush = _flush_buffer()
    for _ in range(warmup):
        launch()
    torch.cuda.synchronize()
    samples: list[float] = []
    total = 0.0
    while len(samples) < min_repeats or (total < min_time and len(samples) < max_repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        flush.zero_()
        start.record()
        launch()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        samples.append(seconds)
        total += seconds
    return Timing.from_samples(samples)


def exact_cublas_settings() -> None:
    """FP32 means FP32 (no TF32) and half-precision GEMMs reduce in FP32, like the hand kernels."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


class _TorchPrepared:
    mode = "native"

    def __init__(self, a, b):
        import torch

        exact_cublas_settings()
        self.a, self.b = to_device(a), to_device(b)
        self.c = torch.empty((a.shape[0], b.shape[1]), dtype=self.a.dtype, device="cuda")
        torch.cuda.synchronize()

    def launch(self) -> None:
        import torch

        torch.matmul(self.a, self.b, out=self.c)

    def run(self) -> None:
        import torch

        self.launch()
        torch.cuda.synchronize()

    def time(self, min_time: float) -> Timing:
        return time_cuda(self.launch, min_time)

    def result(self) -> np.ndarray:
        return to_numpy(self.c)


class TorchCudaBackend:
    def unavailable_reason(self, impl):
        return cuda_unavailable_reason()

    def prepare(self, impl, a, b, options):
        return _TorchPrepared(a, b)

    def peak_gflops(self, impl, dtype):
        return peak_for(impl.operation, dtype)


IMPLEMENTATIONS = [
    Implementation(
        "torch.cublas", "torch", "gpu", ("float32", "bfloat16", "float16"),
        "torch.matmul on CUDA tensors, i.e. cuBLAS (the GPU baseline; TF32 off)",
        TorchCudaBackend(), requires=("gpu", "torch"), baseline=True,
    ),
]
