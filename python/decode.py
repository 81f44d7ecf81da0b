"""Decode, modelled in NumPy: Y = X @ W^T with W stored as ggml stores it (q8_0, q4_0, q4_K, bf16).

A language model generating text multiplies each new token's activations x [K] by every
weight matrix W [N, K]; a batch of M tokens (several requests, or speculative drafts) gives
X [M, K] and Y [M, N] = X @ W^T. Each weight is used once per token, so the time goes in
reading W, and W is stored compressed: in blocks of 32 weights along K, each block a float16
scale d and 32 small integers q, weight = d * q.

This file is the readable model of what the C kernels (c/decode.c) do: read one block of
raw bytes, turn it into 32 float32 weights, and multiply it into every activation row before
reading the next block. It imports nothing from the harness; the byte layouts are written
out here as ggml defines them (harness/model/quant.py makes the bytes):

    q8_0  34 bytes: float16 d, then 32 int8 q            weight i = d * q[i]
    q4_0  18 bytes: float16 d, then 16 bytes b            weight i = d * ((b[i] & 15) - 8),
                                                          weight i + 16 = d * ((b[i] >> 4) - 8)
    q4_K 144 bytes for 256 weights, 8 sub-blocks of 32: float16 d, float16 dmin, 12 bytes of
         6-bit scales sc[j] and mins m[j], then 128 bytes qs in 4 chunks of 32: chunk c's
         low nibbles are sub-block 2c, its high nibbles sub-block 2c + 1
                                                          weight = d * sc[j] * q - dmin * m[j]
    bf16   2 bytes per weight: the top 16 bits of a float32

The sums are float32, like the kernels': each block's products (32, or 256 for q4_K) added
to each row's total.
"""

import numpy as np

BLOCK = 32
BLOCK_SIZE = {"q8_0": 32, "q4_0": 32, "q4_K": 256}  # weights per block
BYTES_PER_BLOCK = {"q8_0": 34, "q4_0": 18, "q4_K": 144}


def dequantize_block_q8_0(block):
    """34 bytes -> 32 float32 weights."""
    d = block[0:2].view("<f2")[0].astype(np.float32)
    q = block[2:34].view(np.int8).astype(np.float32)
    return d * q


def dequantize_block_q4_0(block):
    """18 bytes -> 32 float32 weights: low nibbles are weights 0..15, high nibbles 16..31."""
    d = block[0:2].view("<f2")[0].astype(np.float32)
    packed = block[2:18]
    q = np.concatenate([packed & 0x0F, packed >> 4]).astype(np.float32) - np.float32(8)
    return d * q


def dequantize_block_q4_K(block):
    """144 bytes -> 256 float32 weights: 8 sub-blocks of 32, each with a 6-bit scale and min."""
    d = block[0:2].view("<f2")[0].astype(np.float32)
    dmin = block[2:4].view("<f2")[0].astype(np.float32)
    # b[0..3]: sc[0..3] in the low 6 bits, the top 2 bits of sc[4..7] above them; b[4..7]: the
    # same for m; b[8..11]: the low 4 bits of sc[4..7], then of m[4..7] in the high nibble
    b = block[4:16]
    sc = np.concatenate([b[0:4] & 63, (b[8:12] & 15) | (b[0:4] >> 6) << 4])
    m = np.concatenate([b[4:8] & 63, (b[8:12] >> 4) | (b[4:8] >> 6) << 4])
    qs = block[16:144].reshape(4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=1).reshape(8, 32)  # sub-block 2c: chunk c's low nibbles
    step = d * sc.astype(np.float32)  # exact, as are step * q; the subtraction rounds, once
    low = dmin * m.astype(np.float32)
    return (step[:, None] * q.astype(np.float32) - low[:, None]).reshape(256)


def dequantize_chunk_bf16(chunk):
    """2 bytes per weight -> float32: the bfloat16 bits are the top half of the float32's."""
    return (chunk.view("<u2").astype(np.uint32) << 16).view(np.float32)


DEQUANTIZE = {"q8_0": dequantize_block_q8_0, "q4_0": dequantize_block_q4_0, "q4_K": dequantize_block_q4_K}


def decode(x, format, n, k, data):
    """Y [M, N] = X [M, K] @ W^T for W [N, K] given as ggml's bytes ``data`` in ``format``."""
    x = np.asarray(x, dtype=np.float32)
    m = x.shape[0]
    y = np.zeros((m, n), dtype=np.float32)
    if format == "bf16":
        rows = data.reshape(n, 2 * k)
        for j in range(n):
            for p in range(0, k, BLOCK):  # 32 weights at a time, as the kernels read them
                w = dequantize_chunk_bf16(rows[j, 2 * p : 2 * min(p + BLOCK, k)])
                y[:, j] += x[:, p : p + w.size] @ w
        return y
    size, dequantize = BLOCK_SIZE[format], DEQUANTIZE[format]
    blocks = data.reshape(n, k // size, BYTES_PER_BLOCK[format])
    for j in range(n):  # one row of W: one output feature
        for b in range(k // size):
            w = dequantize(blocks[j, b])  # once per block ...
            y[:, j] += x[:, b * size : (b + 1) * size] @ w  # ... applied to every activation row
    return y
