"""Launch geometry: one description of every kernel launch, for every way of running it.

``plan()`` turns a technique and a shape into a ``Launch``: the kernel's name, grid, block and
argument list (buffers named "A", "B", "C", then the sizes). The GPU loaders (PyCUDA, CuPy)
and the CPU emulation all launch exactly that, so the emulator runs the kernels the GPU runs,
with the geometry the GPU gets, and geometry is written once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple            # "A", "B", "C" name a buffer; ints are passed as C ints
    signature: str         # one letter per argument: P pointer, i int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_SUFFIX = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def plan(technique: str, dtype: str, m: int, n: int, k: int) -> Launch:
    """The launch of ``technique`` for C [m, n] = A [m, k] @ B [k, n] (a GEMV: y [n] = W [n, k] x [k]).

    Block shapes and tile sizes here must match the constants in the ``.cu`` file; the header
    comment of each file states its launch.
    """
    suffix = _SUFFIX[dtype]
    gemm = ("A", "B", "C", m, n, k)
    if technique in ("naive", "tiled"):  # 16 x 16 threads, one output each
        return Launch(f"{technique}_{suffix}", (cdiv(n, 16), cdiv(m, 16), 1), (16, 16, 1), gemm, "PPPiii")
    if technique == "register_tiled_2x2":  # 16 x 16 threads, 2 x 2 outputs each: 32 x 32 per block
        return Launch(f"register_tiled_2x2_{suffix}", (cdiv(n, 32), cdiv(m, 32), 1), (16, 16, 1), gemm, "PPPiii")
    if technique == "register_tiled":  # 256 threads, 8 x 8 outputs each: 128 x 128 per block, 1-D grid
        return Launch(f"register_tiled_{suffix}", (cdiv(m, 128) * cdiv(n, 128), 1, 1), (256, 1, 1), gemm, "PPPiii")
    if technique == "wmma":  # 4 warps, 64 x 64 each: 128 x 128 per block, 1-D grid
        return Launch(f"wmma_{suffix}", (cdiv(m, 128) * cdiv(n, 128), 1, 1), (128, 1, 1), gemm, "PPPiii")
    if technique == "mma":  # 4 warps, 64 x 64 each: 128 x 128 per block, 1-D grid (as wmma)
        return Launch(f"mma_{suffix}", (cdiv(m, 128) * cdiv(n, 128), 1, 1), (128, 1, 1), gemm, "PPPiii")
    if technique == "gemv":  # 8 warps, one row each
        return Launch(f"gemv_{suffix}", (cdiv(n, 8), 1, 1), (256, 1, 1), ("A", "B", "C", n, k), "PPPii")
    raise ValueError(f"unknown CUDA technique {technique!r}")


def kernel_buffers(operation: str, a: np.ndarray, b: np.ndarray):
    """The kernel's input buffers and the shape of its output, from the harness's A and B.

    A GEMV kernel wants W [N, K] row-major and x [K]; the harness gives x as A [1, K] and W as
    B = W^T [K, N], so W is made contiguous here, in prepare (not timed).
    """
    if operation == "gemv":
        return {"A": np.ascontiguousarray(b.T), "B": np.ascontiguousarray(a.reshape(-1))}, (b.shape[1],)
    return {"A": a, "B": b}, (a.shape[0], b.shape[1])
