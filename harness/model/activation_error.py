"""The extra error a kernel makes when it rounds the activations before multiplying.

Some decode kernels do not multiply X itself: llama.cpp's CPU mat-vec for Q4_0 / Q8_0 weights
first quantizes each row of X [M, K] to Q8_0 blocks (int8 dot products are its fast path).
Such an implementation declares it, ``Implementation(..., activation_rounding="q8_0")``, and
is checked against the usual float64 reference (X times the weights the format holds) with
the usual float32 allowance (checking.py) *plus* the term computed here, for that rounding
only. Nothing else is loosened: a kernel that declares nothing gets the plain model.

Q8_0 rounding of one block of 32 activations x_k, as ggml does it:

    d   = max_k |x_k| / 127          (float32)
    q_k = round(x_k / d)             (int8, to nearest)
    x~_k = fp16(d) * q_k             (the scale is stored as float16)

so ``x~_k - x_k = r_k + q_k * delta`` with ``|r_k| <= d / 2`` (the rounding to the grid d) and
``delta = fp16(d) - d`` (the scale's rounding, the same for the whole block). In an output
``y_j = sum_k x~_k w_jk`` the error from X is therefore, block b by block,

    sum_{k in b} r_k w_jk                 (1) rounding to the grid
    (delta_b / d_b) * sum_{k in b} d_b q_k w_jk   (2) the scale's float16 rounding

Term (1): the worst case is ``sum_b (d_b / 2) sum_{k in b} |w_jk|``, but over thousands of
terms it is far larger than anything a kernel makes and would let a kernel that drops a
whole block pass. As checking.py does for float32 sums, the rounding errors are modelled as
independent and zero-mean, uniform in [-d_b/2, d_b/2] (variance d_b^2 / 12), so (1) has
standard deviation ``sigma_j = sqrt(sum_k (d_b^2 / 12) w_jk^2)``; it is allowed
``SIGMA_SAFETY * sigma_j`` (8 sigma: an honest kernel never gets near it on any number of
outputs), and never more than the worst case (which is below 10 sigma for one block).
Term (2) is bounded exactly: ``|d_b q_k| <= |x_k| + d_b / 2``, so it is at most
``|delta_b / d_b| * (|P_jb| + (d_b / 2) sum_{k in b} |w_jk|)`` with ``P_jb`` the block's
partial product ``sum_{k in b} x_k w_jk``; summed over the blocks, worst case (it is a
fraction u_fp16 = 2^-11 of the block partials, small beside (1)).

The float32 part of the check (the int32 block sums are exact; their scaled sum is float32)
is checking.py's model as for any float32 kernel.

Like checking.py's, term (1) is statistical: activations built to sit on the half-points of
their grid, with weights of matching signs, could exceed it honestly. The harness's inputs
(seeded uniform values) are not such inputs.
"""

from __future__ import annotations

import numpy as np

ROUNDINGS = ("q8_0", "q8_K", "bf16")
INTEGER_ROUNDINGS = ("q8_0", "q8_K")  # X in int8: the kernel multiplies bytes (the int8 roof is its peak)
# "q8_K": llama.cpp's activations for its k-quant weights (Q4_K): blocks of 256, d = max / -127
# kept in float32 (d = 1 / (-127 / max), two float32 roundings), q = round(x / d). The same model
# as q8_0 with 256-wide blocks and delta = the float32 scale's rounding.
# "bf16": a kernel that takes X in bfloat16, its weights' block scales in bfloat16 and gives its
# sums in bfloat16 (torch's int4 weight-only kernel, backends/torch_int4.py). Each rounding is
# at most u = 2^-8 relative (8 significant bits). X's roundings are independent per element and
# the scales' per block, so, as for q8_0, each is allowed SIGMA_SAFETY standard deviations of
# its sum (a relative error uniform in [-u, u] has variance u^2 / 3): over the K products
# x_k w_k for X, over the blocks' partial sums P_b for the scales. The output's one rounding is
# allowed in full, u |y|. A dropped or misplaced block moves an output by a whole |P_b|, far
# beyond what these allow.
BF16_UNIT = 2.0**-8
BLOCK = 32
BLOCKS = {"q8_0": BLOCK, "q8_K": 256}
SIGMA_SAFETY = 8.0
# Blocks' partial products are formed this many (M x N x blocks) elements at a time.
_CHUNK_ELEMENTS = 1 << 22


def check_rounding(name) -> str:
    """``name`` if it is an activation rounding this module models, else a ValueError."""
    if name not in ROUNDINGS:
        raise ValueError(f"unknown activation rounding {name!r}; known: {', '.join(ROUNDINGS)}")
    return name


def q8_0_scales(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d, fp16(d)) of X's Q8_0 blocks as float64 [M, K / 32]: d = max|x_block| / 127 in
    float32, as ggml computes it, and the float16 scale it stores."""
    x32 = np.asarray(x, dtype=np.float32)
    m, k = x32.shape
    with np.errstate(over="ignore"):
        d = np.abs(x32.reshape(m, k // BLOCK, BLOCK)).max(axis=-1) / np.float32(127)
        d16 = d.astype(np.float16)
    return d.astype(np.float64), d16.astype(np.float64)


def q8_k_scales(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max|x_block| / 127, the scale ggml stores) of X's Q8_K blocks as float64 [M, K / 256]:
    ggml keeps d = 1 / (-127 / max) in float32, the block's value of largest magnitude ``max``."""
    x32 = np.asarray(x, dtype=np.float32)
    m, k = x32.shape
    blocks = x32.reshape(m, k // 256, 256)
    index = np.abs(blocks).argmax(axis=-1)[..., None]
    signed_max = np.take_along_axis(blocks, index, axis=-1)[..., 0]
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inverse = np.float32(-127) / signed_max
        stored = np.where(signed_max == 0, np.float32(0), np.abs(np.float32(1) / inverse))
    exact = np.abs(signed_max.astype(np.float64)) / 127
    return exact, stored.astype(np.float64)


def extra_allowed(a, b, rounding: str = "q8_0") -> np.ndarray:
    """The error allowed on top of the float32 model, per element of C = A @ B [M, N], for a
    kernel that rounds A (the activations X [M, K]) as ``rounding`` before multiplying by B
    ([K, N], the weights the format holds, W^T). float64."""
    check_rounding(rounding)
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    (m, k), n = a64.shape, b64.shape[1]
    block = BLOCKS.get(rounding, BLOCK)
    if k % block:
        raise ValueError(f"{rounding} activation rounding needs K to be a multiple of {block}, got K = {k}")
    if 0 in (m, n, k):
        return np.zeros((m, n))
    if rounding == "bf16":
        sd = BF16_UNIT / np.sqrt(3.0)
        x_rounding = SIGMA_SAFETY * sd * np.sqrt((a64 * a64) @ (b64 * b64))
        scale_rounding = SIGMA_SAFETY * sd * np.sqrt(_block_partial_squares(a64, b64))
        return x_rounding + scale_rounding + BF16_UNIT * np.abs(a64 @ b64)
    d, d16 = q8_0_scales(a) if rounding == "q8_0" else q8_k_scales(a)
    # Where max|x_block| is beyond 127 * 65504 the scale overflows float16 and the kernel's
    # products are infinite or NaN: no allowance is made for that (such a row fails its check).
    delta = np.where(np.isfinite(d16), np.abs(d16 - d), 0.0)
    abs_b = np.abs(b64)
    per_k = lambda blocks: np.repeat(blocks, block, axis=1)  # noqa: E731 - [M, K/block] to [M, K]

    with np.errstate(over="ignore", invalid="ignore"):
        sigma = np.sqrt(per_k(d * d / 12.0) @ (b64 * b64))
        worst = per_k(d / 2.0) @ abs_b
        grid = np.minimum(SIGMA_SAFETY * sigma, worst)
        ratio = np.where(d > 0, delta / np.where(d > 0, d, 1.0), 0.0)  # |delta_b / d_b|, [M, K/32]
        scale = per_k(delta / 2.0) @ abs_b + _scaled_block_partials(a64, b64, ratio, block)
    return grid + scale


def _block_partial_squares(a64: np.ndarray, b64: np.ndarray) -> np.ndarray:
    """sum_b P[m, n, b]^2, P[m, n, b] = sum over block b of a_mk b_kn, [M, N]."""
    (m, k), n = a64.shape, b64.shape[1]
    blocks = k // BLOCK
    a_blocks = a64.reshape(m, blocks, BLOCK)
    b_blocks = b64.reshape(blocks, BLOCK, n)
    out = np.zeros((m, n))
    step = max(1, _CHUNK_ELEMENTS // max(1, m * blocks))
    for j in range(0, n, step):
        partials = np.einsum("mbk,bkn->mbn", a_blocks, b_blocks[:, :, j : j + step])
        out[:, j : j + step] = (partials * partials).sum(axis=1)
    return out


def _scaled_block_partials(a64: np.ndarray, b64: np.ndarray, ratio: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """sum_b ratio[m, b] * |P[m, n, b]|, P[m, n, b] = sum over block b of a_mk b_kn."""
    (m, k), n = a64.shape, b64.shape[1]
    blocks = k // block
    a_blocks = a64.reshape(m, blocks, block).transpose(1, 0, 2)  # [blocks, M, block]
    b_blocks = b64.reshape(blocks, block, n)  # [blocks, block, N]
    out = np.zeros((m, n))
    step = max(1, _CHUNK_ELEMENTS // max(1, m * blocks))
    for start in range(0, n, step):
        partial = np.matmul(a_blocks, b_blocks[:, :, start : start + step])  # [blocks, M, chunk]
        out[:, start : start + step] = np.einsum("bm,bmn->mn", ratio.T, np.abs(partial))
    return out
