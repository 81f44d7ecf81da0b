"""Batched decode in Triton: Y [M, N] = X [M, K] @ W^T with W [N, K] in ggml's q8_0, q4_0 or bf16.

X is float32 (M = 1..16 rows per pass over W; more rows are further passes), W is stored as
in GGUF (see the layouts below), Y is float32. The weights are dequantized in registers,
exactly (an fp16 scale times an integer of at most 8 bits is a float32), and every product
accumulates in FP32, so only the float32 sums round.

What it is, and what it changes from gemv.py
--------------------------------------------
The same streaming GEMV, with fewer bytes per weight, and several activation rows:

- each program reads BLOCK_N rows of W, BLOCK_B blocks of 32 weights of each per step: the
  quants as [BLOCK_N, BLOCK_B, 16 or 32] bytes, contiguous along the last axis (16-byte
  vector loads), and their scales as one [BLOCK_N, BLOCK_B] fp16 load;
- the quants are widened to float32 and scaled (q4_0: ``d * (nibble - 8)``, low nibbles are
  weights 0..15 of the block, high nibbles 16..31; q8_0: ``d * q``; bf16: the top half of a
  float32) and multiplied into every one of the BLOCK_M rows of X: an FP32 accumulator
  [BLOCK_M, BLOCK_N, step] summed along K once, after the loop, as gemv.py does; a block of W
  is loaded once and used for all M rows. (Not tl.dot: in FP32 without TF32 it is FMAs over
  tiles of at least 16 rows, staged in shared memory, and it spilled at every tile tried.)

The layout the kernel reads (``pack``)
--------------------------------------
ggml's q4_0 / q8_0 blocks are 18 / 34 bytes (fp16 scale, then the quants), so their quants
are never 16-byte aligned and a row of W is only for K a multiple of 256. ``pack`` makes, once
and outside the timed region, the layout a GPU kernel wants from the same bytes: the scales
[N, K/32] (float16) and the quants [N, K/32, 16] (uint8, q4_0) or [N, K/32, 32] (int8, q8_0),
two tensors. bf16 is ggml's own layout, [N, K] bfloat16, masked along K. cuda/decode.cu reads
the same split.

Pseudo-code of one program
--------------------------
    rows = program_id * BLOCK_N + [0, BLOCK_N)
    acc = zeros[BLOCK_M, BLOCK_N, BLOCK_B * 32] in FP32
    for b in range(0, K / 32, BLOCK_B):
        w = dequantize(quants[rows, b:b+BLOCK_B], scales[rows, b:b+BLOCK_B])   # [BLOCK_N, BLOCK_B * 32]
        acc += w[None, :, :] * X[:, 32 b : 32 (b + BLOCK_B)][:, None, :]
    Y[:, rows] = sum(acc, along K)

Caveats
-------
- For M of 8 and more the FP32 multiply-adds, not the bytes, are the limit (M * 32 per
  18-byte q4_0 block); tl.dot on int8 (X quantized, as llama.cpp does) would be the next
  step, with another error model. For M of 4 and more the tiles that fit the accumulator
  load fewer than 16 bytes of W per thread.
- Under ``TRITON_INTERPRET=1`` one small config runs instead of autotuning.
- Offsets are 32-bit: W or X spanning 2**31 elements or more is refused.
"""

import torch
import triton
import triton.language as tl

FORMATS = ("q8_0", "q4_0", "bf16")
_FORMAT_CODE = {"q8_0": 0, "q4_0": 1, "bf16": 2}
MAX_M = 16  # rows of X per pass over W


@triton.jit
def decode_kernel(
    x_ptr,
    s_ptr,
    q_ptr,
    y_ptr,
    M,
    N,
    K,
    FORMAT: tl.constexpr,  # 0 q8_0, 1 q4_0, 2 bf16
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Y [M, N] = X [M, K] @ W^T; one program per BLOCK_N rows of W, all M (<= BLOCK_M) rows of X."""
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


def _config(block_n, block_b, warps):
    return triton.Config({"BLOCK_N": block_n, "BLOCK_B": block_b}, num_warps=warps)


# M = 1 is bandwidth-bound: rows per program (programs in flight) against blocks per step (the
# length of each contiguous read: 8 q4_0 blocks = 128 bytes of quants per row). A step holds 16
# bytes of quants per thread, for 16-byte loads, when BLOCK_N * BLOCK_B >= 8 * warps (q4_0; 4 for
# q8_0, 2 for bf16). The accumulator, BLOCK_M * BLOCK_N * BLOCK_B * 32 FP32 values (16 per
# block for q4_0), must stay within 64 per thread (``fits``), so more rows of X take smaller
# tiles (the small configs at the end), whose loads of W are narrower.
CONFIGS = [
    _config(16, 8, warps=4),
    _config(8, 16, warps=4),
    _config(32, 8, warps=8),
    _config(16, 16, warps=8),
    _config(32, 4, warps=4),
    _config(4, 4, warps=4),
    _config(2, 8, warps=4),
    _config(8, 2, warps=4),
    _config(4, 2, warps=2),
]

INTERPRETER_CONFIG = {"BLOCK_N": 16, "BLOCK_B": 8}

_autotuned_kernel = None


def fits(config, block_m: int) -> bool:
    """Whether ``config``'s accumulator for BLOCK_M rows of X fits (see CONFIGS)."""
    return block_m * config.kwargs["BLOCK_N"] * config.kwargs["BLOCK_B"] * 32 <= 64 * 32 * config.num_warps


def _prune(configs, named_args, **kwargs):
    block_m = kwargs.get("BLOCK_M", named_args.get("BLOCK_M", 1))
    return [c for c in configs if fits(c, block_m)] or configs[:1]


def _autotuned():
    global _autotuned_kernel
    if _autotuned_kernel is None:
        _autotuned_kernel = triton.autotune(
            configs=CONFIGS, key=["N", "K", "FORMAT", "BLOCK_M"], prune_configs_by={"early_config_prune": _prune}
        )(decode_kernel)
    return _autotuned_kernel


def pack(fmt: str, n: int, k: int, data: torch.Tensor):
    """ggml's bytes of W [N, K] in ``fmt`` (a 1-D uint8 tensor) as the two tensors the kernel
    reads: (scales [N, K/32] float16, quants [N, K/32, 16] uint8 or [N, K/32, 32] int8), or for
    bf16 (None, W [N, K] bfloat16). The same values, copied (``data`` is never changed)."""
    if fmt not in FORMATS:
        raise ValueError(f"decode: unknown weight format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.ndim != 1:
        raise TypeError("decode.pack: data must be a 1-D torch.uint8 tensor (ggml's packed bytes)")
    if fmt == "bf16":
        if data.numel() != 2 * n * k:
            raise ValueError(f"decode.pack: bf16 W [{n}, {k}] is {2 * n * k} bytes, got {data.numel()}")
        return None, data.clone().view(torch.bfloat16).reshape(n, k)
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
    ``config`` (a dict of BLOCK_N, BLOCK_B and optionally num_warps) skips the autotuner."""
    if fmt not in FORMATS:
        raise ValueError(f"decode: unknown weight format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.ndim != 2:
        raise TypeError("decode: x must be a 2-D torch.float32 tensor [M, K]")
    n = quants.shape[0]
    k = quants.shape[1] if fmt == "bf16" else quants.shape[1] * 32
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
    for m0 in range(0, m, MAX_M):  # each pass: up to MAX_M rows of X, W read once
        rows = min(MAX_M, m - m0)
        block_m = triton.next_power_of_2(rows)
        xs, ys = x[m0 : m0 + rows], y[m0 : m0 + rows]
        args = (xs, s, quants, ys, rows, n, k)
        if config is None:
            _autotuned()[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
                *args, FORMAT=_FORMAT_CODE[fmt], BLOCK_M=block_m
            )
        else:
            decode_kernel[(triton.cdiv(n, config["BLOCK_N"]),)](
                *args, FORMAT=_FORMAT_CODE[fmt], BLOCK_M=block_m, **dict(config)
            )
    return y
