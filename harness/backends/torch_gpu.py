"""PyTorch on a CUDA GPU: ``torch.matmul`` on CUDA tensors is cuBLAS, the GPU baseline.

cuBLAS is asked for the same arithmetic as the hand kernels: TF32 off for FP32 (a TF32 "FP32"
GEMM would be a different, less accurate product) and no reduced-precision reductions for
BF16/FP16 (the hand kernels accumulate in FP32 all the way). Timing, conversions and peaks are
``harness.backends.gpu``'s, shared with the CUDA and Triton adapters.
"""

from __future__ import annotations

import numpy as np

from harness.backends import gpu
from harness.model.core import Backend, Implementation, Prepared
from harness.model.registry import register
from harness.model.timing import Timing


def exact_cublas_settings() -> None:
    """FP32 means FP32 (no TF32) and half-precision GEMMs reduce in FP32, like the hand kernels."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False


class _TorchPrepared(Prepared):
    def __init__(self, a, b):
        import torch

        exact_cublas_settings()
        self.a, self.b = gpu.to_device(a), gpu.to_device(b)
        # NaN-filled, so an element the product never wrote cannot pass the check
        self.c = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=self.a.dtype, device="cuda")
        torch.cuda.synchronize()

    def launch(self) -> None:
        import torch

        torch.matmul(self.a, self.b, out=self.c)

    def run(self) -> None:
        import torch

        self.launch()
        torch.cuda.synchronize()

    def time(self, min_time: float) -> Timing:
        return gpu.time_cuda(self.launch, min_time)

    def result(self) -> np.ndarray:
        return gpu.to_numpy(self.c)


class TorchCudaBackend(Backend):
    def unavailable_reason(self, impl):
        return gpu.cuda_unavailable_reason()

    def prepare(self, impl, a, b, options):
        return _TorchPrepared(a, b)

    def peak_gflops(self, impl, dtype):
        return gpu.peak_for(impl.operation, dtype)


register(
    Implementation(
        name="torch.cublas",
        language="torch",
        device="gpu",
        dtypes=("float32", "bfloat16", "float16"),
        summary="torch.matmul on CUDA tensors, i.e. cuBLAS (the GPU baseline; TF32 off)",
        backend=TorchCudaBackend(),
        requires=("gpu", "torch"),
        baseline=True,
    )
)
