"""Batched decode in Triton: Y [M, N] = X [M, K] @ W^T with W [N, K] in ggml's q8_0, q4_0, bf16 or q4_K.

X is float32 (M = 1..16 rows per pass over W; more rows are further passes), W is stored as
in GGUF (see the layouts below), Y is float32. The weights become exact float32 values in
registers and every product accumulates in FP32, so only the float32 sums round.

M = 1: ``decode_kernel``, the streaming GEMV
---------------------------------------------
Each program reads BLOCK_N rows of W, BLOCK_B blocks of 32 weights of each per step, and the
same BLOCK_B blocks of x. It is bound by how much of W it keeps in flight and by the
instructions per block, and it was written against both:

- 64 bytes of W per thread per step (4 rows of q4_0, 2 of q8_0, 1 of bf16 in the first
  configs), where the first version held 16, and the loads of a step issued ahead: the loop is
  ``tl.range(..., num_stages=STAGES)``, which Triton pipelines (cp.async copies STAGES - 1
  steps ahead into shared memory) even though there is no tl.dot; a kernel-wide num_stages
  alone does not, without a dot (tests/test_triton_decode.py shows both);
- every tile in one layout: a block is WORDS x 4 elements (q4_0: 4 words of 4 bytes, 8
  weights each, the low nibble of byte 4 w + k is weight 4 w + k and the high one weight
  4 w + k + 16; q8_0: 8 words of 4 int8; bf16: 8 groups of 4), and x's 32 floats likewise, 4
  per thread along the last axis, so the quants and x load in the same layout (Triton
  vectorizes a load along its last axis: 4 bytes of quants, 16 of x). Tiles are [WORDS,
  BLOCK_N, BLOCK_B, 4] with the blocks on the 32 threads of a warp and the warps (BLOCK_B =
  32 x num_warps x r): each thread holds whole blocks, and the dequantized tile never changes
  layout (the first version's reshape moved it through shared memory every step);
- each block reduced in the loop, in the thread that loaded it, and scaled once: d * sum(q x)
  per block (the same kind of roundings as sum((d q) x), one more per block), into a
  [BLOCK_N, BLOCK_B] accumulator; one cross-thread sum after the loop;
- no int-to-float conversions: the magic-number trick, (q | 0x4B000000) as a float is 2^23 + q
  and one subtraction leaves q (q4_0's high nibble masked in place, 16 n, under 2^19: 2^19 + n);
- steps without masks: rows past N are read as row N - 1 (never stored), and only the last,
  partial step of blocks is masked.

M >= 2: ``decode_rows_kernel``
------------------------------
Each program reads BLOCK_N rows of W, BLOCK_B blocks of each per step, dequantizes them and
multiplies them into every one of the BLOCK_M rows of X: an FP32 accumulator [BLOCK_M, BLOCK_N,
step] summed along K once, after the loop; a block of W is loaded once and used for all M rows.
A thread holding whole blocks, as at M = 1, would hold 32 floats of x per row of X (512 for 16
rows: they spill), so the tiles here are small and the layout changes go through shared
memory; for M of 8 and more the FP32 multiply-adds (M * 32 per 18-byte q4_0 block), not the
bytes, are the limit. (Not tl.dot: in FP32 without TF32 it is FMAs over tiles of at least 16
rows, staged in shared memory, and it spilled at every tile tried.)

The layout the kernels read (``pack``)
--------------------------------------
ggml's q4_0 / q8_0 blocks are 18 / 34 bytes (fp16 scale, then the quants), so their quants
are never 16-byte aligned and a row of W is only for K a multiple of 256. ``pack`` makes, once
and outside the timed region, the layout a GPU kernel wants from the same bytes: the scales
[N, K/32] (float16) and the quants [N, K/32, 16] (uint8, q4_0) or [N, K/32, 32] (int8, q8_0),
two tensors. bf16 is ggml's own layout, [N, K] bfloat16, masked along K. cuda/decode.cu reads
the same split.

q4_K
----
A q4_K super-block is 256 weights in 144 bytes: float16 d and dmin, 12 bytes of eight 6-bit
scales sc_j and mins m_j (ggml's get_scale_min_k4), 128 bytes of nibbles, in four chunks of 32
bytes whose low nibbles are sub-block 2c and high nibbles sub-block 2c + 1. ``pack`` makes d and
dmin [N, K/256, 2] (float16) and the other 140 bytes [N, K/256, 140] (uint8). The kernels' block
is a chunk, 64 weights in 32 bytes (8 words of 4, as q8_0's), so its tiles are q8_0's, each byte
of word w holding weight 4 w + k (low nibble) and 4 w + k + 32 (high); the chunk's two scales
and mins are gathered from the 12 bytes and made floats without a conversion. Its weights are
not scaled once per block: each is dequantized to exactly ggml's float32 weight, (d sc_j) q -
dmin m_j (d sc_j and dmin m_j are exact, the product too, so one rounding: a fused multiply-add
gives the same), and then multiplied by x, so only the FP32 sums round. At M = 1 the loop takes
about 225 instructions per thread and 32 weights (234 at STAGES = 3; q4_0 175 / 183), an issue
roof of 2.6 to 2.7 TB/s on an H200: a weight's dequantization is an FFMA more, and the block's
sums are two trees.

Pseudo-code of one M = 1 program
--------------------------------
    rows = program_id * BLOCK_N + [0, BLOCK_N)
    acc = zeros[BLOCK_N, BLOCK_B] in FP32
    for b in range(0, K / 32, BLOCK_B):                      # pipelined, STAGES deep
        q = quants[rows, b:b+BLOCK_B]                          # [BLOCK_N, BLOCK_B, 32] weights
        acc += scales[rows, b:b+BLOCK_B] * sum(q * x[b:b+BLOCK_B], along the block)
    y[rows] = sum(acc, along the blocks)

Caveats
-------
- Under ``TRITON_INTERPRET=1`` one small config runs instead of autotuning.
- Offsets are 32-bit: W or X spanning 2**31 elements or more is refused.
"""

import torch
import triton
import triton.language as tl

FORMATS = ("q8_0", "q4_0", "bf16", "q4_K")
_FORMAT_CODE = {"q8_0": 0, "q4_0": 1, "bf16": 2, "q4_K": 3}
MAX_M = 16  # rows of X per pass over W
Q4K_BYTES = tl.constexpr(140)  # q4_K's quants tensor per super-block: 12 bytes of scales and mins, 128 of nibbles


@triton.jit
def _q4k_scale_min(q_ptr, at, j, ok, zero):
    """Sub-block j's 6-bit scale and min (ggml's get_scale_min_k4) from the 12 bytes b at q_ptr + at:
    for j < 4, sc = b[j] & 63 and m = b[j + 4] & 63; else the low 4 bits from b[j + 4], the top 2
    from b[j - 4] (sc) or b[j] (m). As float32, exactly and without a conversion (the magic number:
    2^23 + v - 2^23)."""
    low = j < 4
    b_j = tl.load(q_ptr + at + j, mask=ok, other=zero).to(tl.int32)
    b_j4 = tl.load(q_ptr + at + j + 4, mask=ok, other=zero).to(tl.int32)
    b_jm4 = tl.load(q_ptr + at + tl.where(low, j, j - 4), mask=ok, other=zero).to(tl.int32)
    sc = tl.where(low, b_j & 63, (b_j4 & 15) | ((b_jm4 >> 6) << 4))
    m = tl.where(low, b_j4 & 63, (b_j4 >> 4) | ((b_j >> 6) << 4))
    sc = (sc | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    m = (m | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return sc, m


@triton.jit
def _q4k_sub_block_scales(s_ptr, q_ptr, sup, c, ok, zero):
    """Chunk c of super-block sup: (d sc, dmin m) of its sub-blocks 2c (low nibbles) and 2c + 1
    (high nibbles), each exact in float32 (a float16 times a 6-bit integer)."""
    d = tl.load(s_ptr + sup * 2, mask=ok, other=zero, eviction_policy="evict_first").to(tl.float32)
    dmin = tl.load(s_ptr + sup * 2 + 1, mask=ok, other=zero, eviction_policy="evict_first").to(tl.float32)
    sc_lo, m_lo = _q4k_scale_min(q_ptr, sup * Q4K_BYTES, 2 * c, ok, zero)
    sc_hi, m_hi = _q4k_scale_min(q_ptr, sup * Q4K_BYTES, 2 * c + 1, ok, zero)
    return d * sc_lo, dmin * m_lo, d * sc_hi, dmin * m_hi


@triton.jit
def _q4k_chunk_sums(x_ptr, s_ptr, q_ptr, n, block, w, k, supers, ok, zero):
    """sum(W x) over chunk `block` (64 weights) of rows n, each weight dequantized exactly:
    (d sc) q - dmin m, one rounding (the product is exact), as ggml's dequantize_row_q4_K.
    [1, BLOCK_N, BLOCK_B, 1]; the quants as 8 words of 4 bytes, word w's byte k holding weight
    4 w + k of the chunk (low nibble) and 4 w + k + 32 (high nibble)."""
    sup = n * supers + block // 4
    c = block % 4
    scale_lo, min_lo, scale_hi, min_hi = _q4k_sub_block_scales(s_ptr, q_ptr, sup, c, ok, zero)
    q = tl.load(q_ptr + sup * Q4K_BYTES + 12 + c * 32 + w * 4 + k, mask=ok, other=zero, eviction_policy="evict_first")
    lo = ((q & 15).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0  # 2^23 + n - 2^23
    hi = ((q & 0xF0).to(tl.int32) | 0x49000000).to(tl.float32, bitcast=True) - 524288.0  # 2^19 + n - 2^19
    col = block * 64 + w * 4 + k
    x_lo = tl.load(x_ptr + col, mask=ok, other=zero)
    x_hi = tl.load(x_ptr + col + 32, mask=ok, other=zero)
    products = (lo * scale_lo - min_lo) * x_lo + (hi * scale_hi - min_hi) * x_hi
    return tl.sum(tl.sum(products, axis=3, keep_dims=True), axis=0, keep_dims=True)


@triton.jit
def _gemv_step(acc, x_ptr, s_ptr, q_ptr, step, w, n, b, k, K, blocks, FORMAT: tl.constexpr, BLOCK_B: tl.constexpr,
               WORDS: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """acc [1, BLOCK_N, BLOCK_B, 1] plus one step of BLOCK_B blocks (only the last step is MASKED)."""
    block = step * BLOCK_B + b
    col = block * 32 + w * 4 + k  # [WORDS, 1, BLOCK_B, 4]: the column of K of each weight
    zero = 0 if MASKED else None  # what a masked-off element loads as
    if FORMAT == 2:  # bf16: W [N, K] itself, masked along K (K need not be a multiple of 32)
        ok = col < K if MASKED else None
        wk = tl.load(q_ptr + n * K + col, mask=ok, other=zero, eviction_policy="evict_first").to(tl.float32)
        x = tl.load(x_ptr + col, mask=ok, other=zero)
        return acc + tl.sum(tl.sum(wk * x, axis=3, keep_dims=True), axis=0, keep_dims=True)
    ok = block < blocks if MASKED else None
    if FORMAT == 3:  # q4_K: a block is a chunk of 64 weights, 32 bytes, two sub-blocks (low, high nibbles)
        return acc + _q4k_chunk_sums(x_ptr, s_ptr, q_ptr, n, block, w, k, blocks // 4, ok, zero)
    d = tl.load(s_ptr + n * blocks + block, mask=ok, other=zero, eviction_policy="evict_first").to(tl.float32)
    # The block's quants as WORDS x 4 bytes (a 4-byte load each: Triton vectorizes along the last
    # axis, which has the 4 bytes of quants and the 4 floats of x that a thread multiplies)
    q = tl.load(
        q_ptr + (n * blocks + block) * (WORDS * 4) + w * 4 + k, mask=ok, other=zero, eviction_policy="evict_first"
    )
    if FORMAT == 1:  # byte 4 w + k: weight 4 w + k in its low nibble, weight 4 w + k + 16 in its high one
        lo = ((q & 15).to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0  # 2^23 + n - (2^23 + 8)
        hi = ((q & 0xF0).to(tl.int32) | 0x49000000).to(tl.float32, bitcast=True) - 524296.0  # 2^19 + n - (2^19 + 8)
        x_lo = tl.load(x_ptr + col, mask=ok, other=zero)
        x_hi = tl.load(x_ptr + col + 16, mask=ok, other=zero)
        products = lo * x_lo + hi * x_hi
    else:  # q8_0: q + 128 is 0..255, under 2^23
        wk = ((q.to(tl.int32) + 128) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
        products = wk * tl.load(x_ptr + col, mask=ok, other=zero)
    return acc + d * tl.sum(tl.sum(products, axis=3, keep_dims=True), axis=0, keep_dims=True)


@triton.jit
def decode_kernel(
    x_ptr,
    s_ptr,
    q_ptr,
    y_ptr,
    N,
    K,
    FORMAT: tl.constexpr,  # 0 q8_0, 1 q4_0, 2 bf16, 3 q4_K
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    STAGES: tl.constexpr,
):
    """y [N] = W x for one row x [K]; one program per BLOCK_N rows of W."""
    pid = tl.program_id(axis=0)
    WORDS: tl.constexpr = 4 if FORMAT == 1 else 8  # 4-element groups of a block (of 32 weights; q4_K: 64)
    UNIT: tl.constexpr = 64 if FORMAT == 3 else 32  # weights per block along K
    # [WORDS, BLOCK_N, BLOCK_B, 4]: a block's groups, rows of W, blocks, a group's elements
    w = tl.arange(0, WORDS)[:, None, None, None]
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n = tl.minimum(rows, N - 1)[None, :, None, None]  # rows past N: row N - 1 again, never stored
    b = tl.arange(0, BLOCK_B)[None, None, :, None]
    k = tl.arange(0, 4)[None, None, None, :]
    blocks = tl.cdiv(K, UNIT)
    whole = (K // UNIT) // BLOCK_B  # steps of BLOCK_B whole blocks, no mask
    acc = tl.zeros((1, BLOCK_N, BLOCK_B, 1), dtype=tl.float32)
    for step in tl.range(0, whole, num_stages=STAGES):
        acc = _gemv_step(acc, x_ptr, s_ptr, q_ptr, step, w, n, b, k, K, blocks, FORMAT, BLOCK_B, WORDS, False)
    if whole * BLOCK_B < blocks:
        acc = _gemv_step(acc, x_ptr, s_ptr, q_ptr, whole, w, n, b, k, K, blocks, FORMAT, BLOCK_B, WORDS, True)
    y = tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_B)), axis=1)  # the only cross-thread sum, once per program
    tl.store(y_ptr + rows, y, mask=rows < N)


@triton.jit
def _q4k_rows(x_ptr, s_ptr, q_ptr, M, N, K, offs_m, offs_n, offs_b, m_ok, row_ok, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):  # fmt: skip
    """decode_rows_kernel's q4_K: Y [BLOCK_M, BLOCK_N] for its rows, weights dequantized exactly."""
    chunks = K // 64
    supers = K // 256
    j = tl.arange(0, 32)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_B * 32), dtype=tl.float32)
    for step in range(0, tl.cdiv(chunks, BLOCK_B)):
        b = step * BLOCK_B + offs_b
        ok = row_ok[:, None] & (b < chunks)[None, :]  # [BLOCK_N, BLOCK_B]
        sup = offs_n[:, None] * supers + (b // 4)[None, :]
        c = (b % 4)[None, :]
        scale_lo, min_lo, scale_hi, min_hi = _q4k_sub_block_scales(s_ptr, q_ptr, sup, c, ok, 0)
        q = tl.load(
            q_ptr + (sup * Q4K_BYTES + 12 + c * 32)[:, :, None] + j[None, None, :], mask=ok[:, :, None], other=0
        )
        lo = (q & 15).to(tl.float32) * scale_lo[:, :, None] - min_lo[:, :, None]
        hi = (q >> 4).to(tl.float32) * scale_hi[:, :, None] - min_hi[:, :, None]
        lo = tl.reshape(lo, (BLOCK_N, BLOCK_B * 32))
        hi = tl.reshape(hi, (BLOCK_N, BLOCK_B * 32))
        # byte j of chunk b: weight 64 b + j (low nibble) and 64 b + 32 + j (high)
        k_lo = tl.reshape(b[:, None] * 64 + j[None, :], (BLOCK_B * 32,))
        x_ok = m_ok[:, None] & (k_lo < K)[None, :]
        x_lo = tl.load(x_ptr + offs_m[:, None] * K + k_lo[None, :], mask=x_ok, other=0.0)
        x_hi = tl.load(x_ptr + offs_m[:, None] * K + 32 + k_lo[None, :], mask=x_ok, other=0.0)
        acc += lo[None, :, :] * x_lo[:, None, :] + hi[None, :, :] * x_hi[:, None, :]
    return tl.sum(acc, axis=2)


@triton.jit
def decode_rows_kernel(
    x_ptr,
    s_ptr,
    q_ptr,
    y_ptr,
    M,
    N,
    K,
    FORMAT: tl.constexpr,  # 0 q8_0, 1 q4_0, 2 bf16, 3 q4_K
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Y [M, N] = X [M, K] @ W^T for M >= 2; one program per BLOCK_N rows of W, all M (<= BLOCK_M) rows of X."""
    pid = tl.program_id(axis=0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_b = tl.arange(0, BLOCK_B)
    row_ok = offs_n < N
    m_ok = offs_m < M
    blocks = K // 32
    STEP: tl.constexpr = BLOCK_B * 32

    # Products accumulate element-wise, [BLOCK_M, BLOCK_N, step], and are summed along K once,
    # after the loop (gemv.py's scheme, with a row of X per slice); the configs keep
    # BLOCK_M * BLOCK_N * step within the registers (``fits``).
    if FORMAT == 3:  # q4_K: BLOCK_B chunks of 64 weights a step, their low and high halves apart
        y = _q4k_rows(x_ptr, s_ptr, q_ptr, M, N, K, offs_m, offs_n, offs_b, m_ok, row_ok, BLOCK_M, BLOCK_N, BLOCK_B)
        tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], y, mask=m_ok[:, None] & row_ok[None, :])
        return
    if FORMAT == 1:
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_B * 16), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N, STEP), dtype=tl.float32)
    for step in range(0, tl.cdiv(K, STEP)):  # K / 32 blocks (bf16: K columns) in steps of BLOCK_B blocks
        b = step * BLOCK_B + offs_b
        ok = row_ok[:, None] & (b < blocks)[None, :]  # [BLOCK_N, BLOCK_B]
        if FORMAT == 1:
            j = tl.arange(0, 16)
            d = tl.load(s_ptr + offs_n[:, None] * blocks + b[None, :], mask=ok, other=0.0).to(tl.float32)
            q = tl.load(
                q_ptr + (offs_n[:, None, None] * blocks + b[None, :, None]) * 16 + j[None, None, :],
                mask=ok[:, :, None],
                other=0,
            )
            lo = tl.reshape(d[:, :, None] * ((q & 15).to(tl.float32) - 8.0), (BLOCK_N, BLOCK_B * 16))
            hi = tl.reshape(d[:, :, None] * ((q >> 4).to(tl.float32) - 8.0), (BLOCK_N, BLOCK_B * 16))
            # weight j of block b multiplies X column 32 b + j (low nibble) and 32 b + 16 + j (high)
            k_lo = tl.reshape(b[:, None] * 32 + j[None, :], (BLOCK_B * 16,))
            x_ok = m_ok[:, None] & (k_lo < K)[None, :]
            x_lo = tl.load(x_ptr + offs_m[:, None] * K + k_lo[None, :], mask=x_ok, other=0.0)
            x_hi = tl.load(x_ptr + offs_m[:, None] * K + 16 + k_lo[None, :], mask=x_ok, other=0.0)
            acc += lo[None, :, :] * x_lo[:, None, :] + hi[None, :, :] * x_hi[:, None, :]
        else:
            offs_k = step * STEP + tl.arange(0, STEP)
            k_ok = offs_k < K
            if FORMAT == 2:  # bf16: W [N, K] itself, masked along K (K need not be a multiple of 32)
                w = tl.load(
                    q_ptr + offs_n[:, None] * K + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
                ).to(tl.float32)
            else:
                j = tl.arange(0, 32)
                d = tl.load(s_ptr + offs_n[:, None] * blocks + b[None, :], mask=ok, other=0.0).to(tl.float32)
                q = tl.load(
                    q_ptr + (offs_n[:, None, None] * blocks + b[None, :, None]) * 32 + j[None, None, :],
                    mask=ok[:, :, None],
                    other=0,
                )
                w = tl.reshape(d[:, :, None] * q.to(tl.float32), (BLOCK_N, STEP))
            x = tl.load(x_ptr + offs_m[:, None] * K + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            acc += w[None, :, :] * x[:, None, :]

    y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]: the only cross-thread reduction, once per program
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], y, mask=m_ok[:, None] & row_ok[None, :])


# True when Triton handed back its CPU interpreter's stand-in (TRITON_INTERPRET=1 was set when
# this file was loaded).
INTERPRETED = type(decode_kernel).__name__ == "InterpretedFunction"


def _config(block_n, block_b, warps, stages=1):
    return triton.Config({"BLOCK_N": block_n, "BLOCK_B": block_b, "STAGES": stages}, num_warps=warps)


# M = 1, per format: rows per program against blocks per step. BLOCK_B = 32 x num_warps (x 2)
# keeps every tile in one layout (``one_layout``); the first of each format holds 64 bytes of W
# per thread per step (BLOCK_N * bytes per block of quants / (BLOCK_B / (32 * num_warps)) ...
# per thread: 16 per q4_0 row, 32 per q8_0 row, 64 per bf16 row). Short rows (K < 4096) take
# the narrower ones: a step of 128 blocks is 4096 weights.
CONFIGS = {
    "q4_0": [
        _config(4, 128, warps=4, stages=3),
        _config(4, 128, warps=4),
        _config(8, 128, warps=4, stages=2),
        _config(4, 256, warps=8, stages=3),
        _config(4, 32, warps=1, stages=3),
        _config(8, 64, warps=2, stages=3),
    ],
    "q8_0": [
        _config(2, 128, warps=4, stages=3),
        _config(2, 128, warps=4),
        _config(4, 128, warps=4, stages=2),
        _config(2, 256, warps=8, stages=3),
        _config(2, 32, warps=1, stages=3),
        _config(4, 64, warps=2, stages=3),
    ],
    # q4_K: a block is a chunk of 64 weights, 32 bytes of quants (as q8_0's blocks); 4 rows a
    # thread spill where the loop is pipelined (STAGES 2 or 3), so the 4-row config is unpipelined
    "q4_K": [
        _config(2, 128, warps=4, stages=3),
        _config(2, 128, warps=4),
        _config(4, 128, warps=4),
        _config(2, 256, warps=8, stages=3),
        _config(2, 32, warps=1, stages=3),
        _config(2, 64, warps=2, stages=3),
    ],
    "bf16": [
        _config(1, 128, warps=4, stages=3),
        _config(1, 128, warps=4),
        _config(2, 128, warps=4, stages=2),
        _config(1, 256, warps=8, stages=3),
        _config(1, 32, warps=1, stages=3),
        _config(2, 64, warps=2, stages=3),
    ],
}


def one_layout(config) -> bool:
    """Whether the blocks of a step fill the warps' threads (see decode_kernel's docstring)."""
    return config.kwargs["BLOCK_B"] % (32 * config.num_warps) == 0


def w_bytes_per_thread(fmt: str, config) -> int:
    """Bytes of W a thread loads per step of decode_kernel."""
    per_block = {"q4_0": 16, "q8_0": 32, "bf16": 64, "q4_K": 32}[fmt]
    return config.kwargs["BLOCK_N"] * config.kwargs["BLOCK_B"] * per_block // (32 * config.num_warps)


def _rows_config(block_n, block_b, warps):
    return triton.Config({"BLOCK_N": block_n, "BLOCK_B": block_b}, num_warps=warps)


# M >= 2: the accumulator, BLOCK_M * BLOCK_N * BLOCK_B * 32 FP32 values (16 per block for
# q4_0), must stay within 64 per thread (``fits``), so more rows of X take smaller tiles.
ROWS_CONFIGS = [
    _rows_config(16, 8, warps=4),
    _rows_config(8, 16, warps=4),
    _rows_config(32, 8, warps=8),
    _rows_config(16, 16, warps=8),
    _rows_config(32, 4, warps=4),
    _rows_config(4, 4, warps=4),
    _rows_config(2, 8, warps=4),
    _rows_config(8, 2, warps=4),
    _rows_config(4, 2, warps=2),
]

INTERPRETER_CONFIG = {"BLOCK_N": 16, "BLOCK_B": 8}

_autotuned_kernels = {}


def fits(config, block_m: int) -> bool:
    """Whether a ROWS_CONFIGS ``config``'s accumulator for BLOCK_M rows of X fits."""
    return block_m * config.kwargs["BLOCK_N"] * config.kwargs["BLOCK_B"] * 32 <= 64 * 32 * config.num_warps


def _prune(configs, named_args, **kwargs):
    block_m = kwargs.get("BLOCK_M", named_args.get("BLOCK_M", 1))
    return [c for c in configs if fits(c, block_m)] or configs[:1]


def _autotuned(fmt: str, rows: bool):
    """The autotuned kernel: decode_rows_kernel (M >= 2) or decode_kernel for ``fmt`` (M = 1)."""
    if (fmt, rows) not in _autotuned_kernels:
        if rows:
            prune = {"early_config_prune": _prune}
            tuned = triton.autotune(configs=ROWS_CONFIGS, key=["N", "K", "FORMAT", "BLOCK_M"], prune_configs_by=prune)(
                decode_rows_kernel
            )
        else:
            tuned = triton.autotune(configs=CONFIGS[fmt], key=["N", "K"])(decode_kernel)
        _autotuned_kernels[fmt, rows] = tuned
    return _autotuned_kernels[fmt, rows]


def pack(fmt: str, n: int, k: int, data: torch.Tensor):
    """ggml's bytes of W [N, K] in ``fmt`` (a 1-D uint8 tensor) as the two tensors the kernel
    reads: (scales [N, K/32] float16, quants [N, K/32, 16] uint8 or [N, K/32, 32] int8), for
    q4_K (d and dmin [N, K/256, 2] float16, the other 140 bytes of each super-block [N, K/256,
    140] uint8: 12 of scales and mins, then 128 of nibbles), or for bf16 (None, W [N, K]
    bfloat16). The same values, copied (``data`` is never changed)."""
    if fmt not in FORMATS:
        raise ValueError(f"decode: unknown weight format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.ndim != 1:
        raise TypeError("decode.pack: data must be a 1-D torch.uint8 tensor (ggml's packed bytes)")
    if fmt == "bf16":
        if data.numel() != 2 * n * k:
            raise ValueError(f"decode.pack: bf16 W [{n}, {k}] is {2 * n * k} bytes, got {data.numel()}")
        return None, data.clone().view(torch.bfloat16).reshape(n, k)
    if fmt == "q4_K":
        if k % 256:
            raise ValueError(f"decode.pack: q4_K needs K to be a multiple of 256, got K = {k}")
        if data.numel() != n * (k // 256) * 144:
            raise ValueError(f"decode.pack: q4_K W [{n}, {k}] is {n * (k // 256) * 144} bytes, got {data.numel()}")
        supers = data.reshape(n, k // 256, 144)
        return supers[..., :4].contiguous().view(torch.float16), supers[..., 4:].contiguous()
    if k % 32:
        raise ValueError(f"decode.pack: {fmt} needs K to be a multiple of 32, got K = {k}")
    quant_bytes = 16 if fmt == "q4_0" else 32
    if data.numel() != n * (k // 32) * (2 + quant_bytes):
        raise ValueError(
            f"decode.pack: {fmt} W [{n}, {k}] is {n * (k // 32) * (2 + quant_bytes)} bytes, got {data.numel()}"
        )
    blocks = data.reshape(n, k // 32, 2 + quant_bytes)
    scales = blocks[..., :2].contiguous().view(torch.float16).reshape(n, k // 32)
    quants = blocks[..., 2:].contiguous()
    return scales, (quants if fmt == "q4_0" else quants.view(torch.int8))


def decode(x, fmt: str, scales, quants, *, config=None):
    """Y = x @ W^T for x [M, K] float32 and W as ``pack`` gives it (``scales``, ``quants``:
    for bf16, scales is None and quants is W [N, K] bfloat16). Returns a new Y [M, N] float32.
    ``config`` (a dict of BLOCK_N, BLOCK_B and optionally num_warps, and for M = 1 STAGES)
    skips the autotuner: at M = 1 decode_kernel runs with it, else decode_rows_kernel."""
    if fmt not in FORMATS:
        raise ValueError(f"decode: unknown weight format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.ndim != 2:
        raise TypeError("decode: x must be a 2-D torch.float32 tensor [M, K]")
    n = quants.shape[0]
    k = quants.shape[1] if fmt == "bf16" else quants.shape[1] * (256 if fmt == "q4_K" else 32)
    if x.shape[1] != k:
        raise ValueError(f"decode: x is {tuple(x.shape)} but W has K = {k}; x's columns must equal K")
    if INTERPRETED and x.device.type != "cpu":
        raise ValueError(f"decode: running under TRITON_INTERPRET=1, which takes CPU tensors; got {x.device}")
    if not INTERPRETED and x.device.type != "cuda":
        raise ValueError(f"decode: Triton kernels need CUDA tensors, got {x.device}")
    if max(x.numel(), n * k) >= 2**31:
        raise ValueError("decode: W or x spans 2**31 elements or more, beyond 32-bit offsets")
    x = x.contiguous()
    m = x.shape[0]
    y = torch.empty((m, n), device=x.device, dtype=torch.float32)
    if 0 in (m, n):
        return y
    if k == 0:
        return y.zero_()
    if config is None and INTERPRETED:
        config = INTERPRETER_CONFIG
    s = scales if scales is not None else quants  # bf16: no scales (the pointer is never read)
    code = _FORMAT_CODE[fmt]
    if m == 1:  # the GEMV
        chosen = {"STAGES": 1, **dict(config)} if config is not None else None
        if chosen is None:
            grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
            _autotuned(fmt, rows=False)[grid](x, s, quants, y, n, k, FORMAT=code)
        else:
            decode_kernel[(triton.cdiv(n, chosen["BLOCK_N"]),)](x, s, quants, y, n, k, FORMAT=code, **chosen)
        return y
    for m0 in range(0, m, MAX_M):  # each pass: up to MAX_M rows of X, W read once
        rows = min(MAX_M, m - m0)
        block_m = triton.next_power_of_2(rows)
        xs, ys = x[m0 : m0 + rows], y[m0 : m0 + rows]
        args = (xs, s, quants, ys, rows, n, k)
        if config is None:
            _autotuned(fmt, rows=True)[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
                *args, FORMAT=code, BLOCK_M=block_m
            )
        else:
            options = {key: value for key, value in dict(config).items() if key != "STAGES"}
            decode_rows_kernel[(triton.cdiv(n, options["BLOCK_N"]),)](*args, FORMAT=code, BLOCK_M=block_m, **options)
    return y
