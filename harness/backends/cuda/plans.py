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
class TensorMapArg:
    """A kernel argument that is a CUtensorMap (128 bytes, by value) of buffer ``buffer``: a
    [rows, cols] row-major matrix of 16-bit elements, read in boxes of box_rows x box_cols with
    the 128-byte swizzle. The row pitch is the buffer's (see ``pitched``)."""
    buffer: str
    rows: int
    cols: int
    box_rows: int
    box_cols: int


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple            # "A", "B", "C" name a buffer; ints are passed as C ints; TensorMapArg
    signature: str         # one letter per argument: P pointer, i int, T tensor map
    shared_bytes: int = 0  # dynamic shared memory (a launch over 48 KiB opts in to it)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_SUFFIX = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


# cuda/wgmma.cu: STAGES * (A 128 x 64 + B 64 x 256) * 2 bytes + 8 mbarriers + 1 KiB of alignment.
WGMMA_SHARED_BYTES = 4 * (128 * 64 + 64 * 256) * 2 + 8 * 8 + 1024
# The persistent kernel's grid in the emulation, where no GPU says how many SMs there are: small,
# so that a block walks several tiles (and its barriers' phases carry on across tiles).
EMULATED_SMS = 3


def plan(technique: str, dtype: str, m: int, n: int, k: int, sms: int | None = None) -> Launch:
    """The launch of ``technique`` for C [m, n] = A [m, k] @ B [k, n] (a GEMV: y [n] = W [n, k] x [k]).

    Block shapes and tile sizes here must match the constants in the ``.cu`` file; the header
    comment of each file states its launch. ``sms``: the GPU's multiprocessor count, which sizes
    a persistent grid (``EMULATED_SMS`` when None).
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
    if technique == "wgmma":  # a producer and 2 consumer warp groups, 128 x 256 tiles, persistent grid
        tiles = cdiv(m, 128) * cdiv(n, 256)
        args = (TensorMapArg("A", m, k, 128, 64), TensorMapArg("B", k, n, 64, 64), "C", m, n, k)
        return Launch(f"wgmma_{suffix}", (max(1, min(tiles, sms or EMULATED_SMS)), 1, 1), (384, 1, 1), args,
                      "TTPiii", WGMMA_SHARED_BYTES)
    if technique == "gemv":  # 8 warps, one row each
        return Launch(f"gemv_{suffix}", (cdiv(n, 8), 1, 1), (256, 1, 1), ("A", "B", "C", n, k), "PPPii")
    raise ValueError(f"unknown CUDA technique {technique!r}")


def pitched(array: np.ndarray) -> np.ndarray:
    """``array`` itself when its rows are a multiple of 16 bytes long (what TMA requires of a
    tensor's row pitch), else a zero-padded copy whose rows are. The tensor map keeps the true
    column count, so the padding is never read."""
    row_bytes = array.shape[1] * array.itemsize
    if row_bytes % 16 == 0:
        return array
    padded = np.zeros((array.shape[0], cdiv(row_bytes, 16) * 16 // array.itemsize), dtype=array.dtype)
    padded[:, :array.shape[1]] = array
    return padded


def kernel_buffers(operation: str, a: np.ndarray, b: np.ndarray, technique: str = ""):
    """The kernel's input buffers and the shape of its output, from the harness's A and B.

    A GEMV kernel wants W [N, K] row-major and x [K]; the harness gives x as A [1, K] and W as
    B = W^T [K, N], so W is made contiguous here, in prepare (not timed).
    """
    if operation == "gemv":
        return {"A": np.ascontiguousarray(b.T), "B": np.ascontiguousarray(a.reshape(-1))}, (b.shape[1],)
    if technique == "wgmma":  # TMA: row pitches in multiples of 16 bytes (cuda/wgmma.cu)
        return {"A": pitched(a), "B": pitched(b)}, (a.shape[0], b.shape[1])
    return {"A": a, "B": b}, (a.shape[0], b.shape[1])
