"""Adapter for cuda/: the hand-written CUDA kernels, on a GPU or on the CPU emulation of CUDA.

One module per concern, each the owner of its names (import them from there):

- plans.py: the launch of each technique (kernel name, grid, block, arguments), read from the
  ``@launch`` declaration in its ``.cu`` file;
- toolkit.py: the CUDA toolkit's location, the kernel sources (every ``cuda/*.cu``) and the
  nvcc compilation into a cubin;
- loaders.py: that cubin loaded and launched on a GPU, by PyCUDA or (fallback) CuPy;
- emulation.py: the same ``.cu`` files compiled with g++ against cuda/emu/, on the CPU;
- resources.py: registers, shared memory and spills per kernel, from ptxas;
- tensormap.py: the TMA tensor maps, encoded by the driver (or the emulation's stand-in).

This package itself is the backend (``CudaBackend``) and the registration of the CUDA
implementations; ``ARCHS`` and ``resource_table`` are kept here for ``python -m harness
cuda-info``. A new technique is its ``.cu`` file (kernels plus ``@launch``) and its
``register(...)`` at the end of this file.

Which path runs:
- native: a CUDA GPU visible to PyTorch and a loader (PyCUDA, else CuPy). Rows record which.
- emulated: set ``MATMUL_CUDA_EMULATE=1``. Rows are marked "emulated" and never timed.
- otherwise the implementations are unavailable, and the reason says which of the above is
  missing.
"""

from __future__ import annotations

from harness.backends import gpu
from harness.backends.cuda.emulation import (
    EMULATE_ENV,
    EmulatedPrepared,
    emulated_library,
    emulation_requested,
    emulation_unavailable_reason,
)
from harness.backends.cuda.loaders import NativePrepared, _device_arch, native_unavailable_reason
from harness.backends.cuda.plans import cdiv, decode_buffers, decode_technique, kernel_buffers, plan
from harness.backends.cuda.resources import resource_table
from harness.backends.cuda.toolkit import ARCHS
from harness.backends.decode import decode_inputs
from harness.model.core import Backend, Implementation
from harness.model.inputs import Shape, dtype_name
from harness.model.registry import register

__all__ = ["ARCHS", "CudaBackend", "resource_table"]


class CudaBackend(Backend):
    """Runs ``technique`` from ``impl.source`` natively or emulated (see the module docstring)."""

    def __init__(self, technique: str, gpu_archs: tuple[str, ...] = ()):
        self.technique = technique
        self.gpu_archs = gpu_archs  # the GPUs it runs on, when not every one from sm_80

    def unavailable_reason(self, impl):
        if emulation_requested():
            return emulation_unavailable_reason()
        reason = native_unavailable_reason()
        if reason:
            return f"{reason}; set {EMULATE_ENV}=1 to check the kernels on the CPU emulation (correctness only)"
        if self.gpu_archs:
            arch = _device_arch()
            if arch not in self.gpu_archs:
                return (
                    f"{impl.name} needs a {' or '.join(self.gpu_archs)} GPU (Hopper: H100/H200) and this one is "
                    f"{arch}; set {EMULATE_ENV}=1 to check it on the CPU emulation"
                )
        return None

    def run_mode(self, impl) -> str:
        # The harness refuses emulated problems that would take too long (core.STAND_IN_BUDGET_S).
        return "emulated" if emulation_requested() else "native"

    def estimate_seconds(self, impl, shape: Shape, dtype: str) -> float:
        """How long the emulation would take: each CUDA thread it runs costs a fiber (created,
        switched at every barrier), each FLOP a scalar operation. The two rates fit the
        emulated cuda.gemv at 1x1000000x1 (32 million threads: 36 s) and cuda.tiled at 128^3
        (16,384 threads: 0.1 s), on a 2-core development machine."""
        try:
            if impl.weights:  # a decode kernel: its launch for q4_0 (the formats' grids differ little)
                launch = plan(decode_technique("q4_0", shape.m), "float32", shape.m, shape.n, cdiv(shape.k, 32) * 32)
            else:
                launch = plan(self.technique, dtype, shape.m, shape.n, shape.k)
            threads = (
                launch.grid[0] * launch.grid[1] * launch.grid[2] * launch.block[0] * launch.block[1] * launch.block[2]
            )
        except (ValueError, KeyError):  # a shape the plan refuses is refused later, by name
            threads = 0
        return threads * EMULATED_SECONDS_PER_THREAD + shape.flops / EMULATED_FLOPS_PER_S

    def prepare(self, impl, a, b, options):
        if impl.weights:
            return self._prepare_decode(impl, a, b)
        dtype = dtype_name(a.dtype)
        shape = Shape(a.shape[0], b.shape[1], a.shape[1])
        emulated = emulation_requested()
        # The persistent kernel's grid is one block per SM (the emulation uses plans.EMULATED_SMS).
        sms = gpu.device_info()["multiprocessors"] if self.gpu_archs and not emulated else None
        launch = plan(self.technique, dtype, shape.m, shape.n, shape.k, sms=sms)
        inputs, out_shape = kernel_buffers(impl.operation, a, b, self.technique)
        result_shape = (shape.m, shape.n)
        if emulated:
            return EmulatedPrepared(emulated_library(impl.source), launch, inputs, out_shape, a.dtype, result_shape)
        return NativePrepared(impl.source, launch, inputs, out_shape, dtype, result_shape)

    def _prepare_decode(self, impl, a, b):
        """Y [M, N] = X [M, K] @ W^T for W quantized (quant.QuantizedWeights): the weights are
        repacked into the layout cuda/decode.cu reads (plans.decode_weight_bytes: the same bytes,
        scales apart from quants, so every block's quants are aligned 16-byte loads) and copied
        to the device here, in prepare, outside the timed region."""

        x, w = decode_inputs(impl, a, b)
        inputs, out_shape, k = decode_buffers(x, w)
        m = x.shape[0]
        launch = plan(decode_technique(w.format, m), "float32", m, w.n, k)
        if emulation_requested():
            return EmulatedPrepared(emulated_library(impl.source), launch, inputs, out_shape, x.dtype, out_shape)
        return NativePrepared(impl.source, launch, inputs, out_shape, "float32", out_shape)

    def peak_gflops(self, impl, dtype):
        return gpu.peak_for(impl.operation, dtype)


EMULATED_SECONDS_PER_THREAD = 1.1e-6
EMULATED_FLOPS_PER_S = 5e7

_REQUIRES = ("gpu", "pycuda or cupy")
# The one-output-per-thread kernels take minutes where the others take milliseconds: above
# 4096^3 (137 GFLOP) they are refused unless allow_slow, so a GPU comparison stays short.
_SLOW_KERNEL_MAX_FLOPS = 2 * 4096**3

register(
    Implementation(
        name="cuda.naive",
        language="cuda",
        device="gpu",
        dtypes=("float32",),
        summary="one thread per output, A and B read from global memory",
        backend=CudaBackend("naive"),
        source="cuda/naive.cu",
        requires=_REQUIRES,
        max_flops=_SLOW_KERNEL_MAX_FLOPS,
        slow_rate=1e12,
    )
)
register(
    Implementation(
        name="cuda.tiled",
        language="cuda",
        device="gpu",
        dtypes=("float32",),
        summary="the chapter's 16x16 shared-memory tiles: each load reused 16 times",
        backend=CudaBackend("tiled"),
        source="cuda/tiled.cu",
        requires=_REQUIRES,
        max_flops=_SLOW_KERNEL_MAX_FLOPS,
        slow_rate=2e12,
    )
)
register(
    Implementation(
        name="cuda.register_tiled_2x2",
        language="cuda",
        device="gpu",
        dtypes=("float32",),
        summary="the chapter's exercise: 16x16 tiles, 2x2 outputs per thread",
        backend=CudaBackend("register_tiled_2x2"),
        source="cuda/register_tiled.cu",
        requires=_REQUIRES,
        max_flops=_SLOW_KERNEL_MAX_FLOPS,
        slow_rate=4e12,
    )
)
register(
    Implementation(
        name="cuda.register_tiled",
        language="cuda",
        device="gpu",
        dtypes=("float32",),
        summary="128x128 block tiles, 8x8 outputs per thread, float4 loads, double-buffered",
        backend=CudaBackend("register_tiled"),
        source="cuda/register_tiled.cu",
        requires=_REQUIRES,
    )
)
register(
    Implementation(
        name="cuda.wmma",
        language="cuda",
        device="gpu",
        dtypes=("bfloat16", "float16"),
        summary="tensor cores via nvcuda::wmma, 128x128 tiles staged in shared memory, FP32 accumulate",
        backend=CudaBackend("wmma"),
        source="cuda/wmma.cu",
        requires=_REQUIRES,
    )
)
register(
    Implementation(
        name="cuda.mma",
        language="cuda",
        device="gpu",
        dtypes=("bfloat16", "float16"),
        summary="tensor cores in PTX: cp.async 3-stage ring, swizzled shared tiles, ldmatrix, mma.sync m16n8k16",
        backend=CudaBackend("mma"),
        source="cuda/mma.cu",
        requires=_REQUIRES,
    )
)
register(
    Implementation(
        name="cuda.wgmma",
        language="cuda",
        device="gpu",
        dtypes=("bfloat16", "float16"),
        summary="Hopper: TMA into a 4-stage mbarrier ring, wgmma m64n256k16 from swizzled shared memory, "
        "warp-specialized (setmaxnreg), persistent",
        backend=CudaBackend("wgmma", gpu_archs=("sm_90",)),
        source="cuda/wgmma.cu",
        requires=_REQUIRES,
    )
)
register(
    Implementation(
        name="cuda.gemv",
        language="cuda",
        device="gpu",
        dtypes=("bfloat16", "float32"),
        summary="y = W x: a warp per row, 16-byte coalesced loads, shuffle reduction",
        backend=CudaBackend("gemv"),
        source="cuda/gemv.cu",
        operation="gemv",
        requires=_REQUIRES,
    )
)
register(
    Implementation(
        name="cuda.decode",
        language="cuda",
        device="gpu",
        dtypes=("float32",),
        weights=("q8_0", "q4_0", "q4_K", "bf16"),
        summary="decode, Y = X W^T with W in q8_0 / q4_0 / q4_K / bf16: 16-byte loads of (repacked) blocks, "
        "dequantized in registers, each applied to M = 1..16 rows of X, FP32 accumulate, shuffle reduction",
        backend=CudaBackend("decode"),
        source="cuda/decode.cu",
        requires=_REQUIRES,
    )
)
