"""A CPU model of the chapter-12 tiled kernel that counts its global-memory loads.

``tiled_matmul(a, b, tile)`` computes C = A @ B one TILE x TILE output tile at a time, the way
one CUDA thread block does: for each output tile it marches along K in phases, "loads" a
tile of A and a tile of B into shared memory, and accumulates their product. Every element
copied into a tile is counted as one load from global memory, so the count can be compared
with the naive kernel's 2*M*N*K (each output reads a row of A and a column of B).

When ``tile`` divides M, N and K the count is exactly 2*M*N*K / tile: each element is loaded
once per tile that needs it instead of once per output. On ragged edges the tiles are cut
short (the CUDA kernel zero-pads them instead; zeros loaded from outside the matrix are not
memory traffic, so they are not counted here), and the count is the exact number of real
elements read.

Shapes: a [M, K], b [K, N], result [M, N] in float32 (the kernel accumulates in FP32).
"""

import numpy as np


def tiled_matmul(a, b, tile=16):
    """Return (C, elements_loaded) for C = a @ b computed tile by tile."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"tiled_matmul expects [M, K] @ [K, N], got {a.shape} @ {b.shape}")
    if int(tile) != tile or tile < 1:
        raise ValueError(f"tile must be a positive integer, got {tile!r}")
    m, k = a.shape
    n = b.shape[1]
    c = np.zeros((m, n), dtype=np.float32)
    loads = 0
    for row in range(0, m, tile):  # one "block" per output tile
        for col in range(0, n, tile):
            acc = np.zeros((min(tile, m - row), min(tile, n - col)), dtype=np.float32)
            for phase in range(0, k, tile):  # march along K one tile at a time
                a_tile = a[row : row + tile, phase : phase + tile].astype(np.float32)  # to "shared memory"
                b_tile = b[phase : phase + tile, col : col + tile].astype(np.float32)
                loads += a_tile.size + b_tile.size
                acc += a_tile @ b_tile  # each loaded value reused up to `tile` times
            c[row : row + tile, col : col + tile] = acc
    return c, loads


def naive_loads(m, n, k):
    """Elements the naive kernel loads: each of the M*N outputs reads K of A and K of B."""
    return 2 * m * n * k
