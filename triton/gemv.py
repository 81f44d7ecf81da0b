"""Matrix-vector product (GEMV) in Triton: y = W @ x, streamed at memory bandwidth.

W [N, K] row-major, x [K], y [N]; FP32, FP16 or BF16 inputs, FP32 accumulation, y in the
input dtype. In the harness's terms this is the matmul with M = 1: A [1, K] is x and
B [K, N] is W transposed.

What it is, and what it changes from the matmul
-----------------------------------------------
A GEMV reads each weight once and does one multiply-add with it: about one FLOP per byte
of FP16, far below what it takes to keep tensor cores busy, so its speed is the speed at which
W streams in from HBM. Tiling for reuse (``matmul.py``) buys nothing here: there is no reuse
of W to exploit, and a [1, K] block is below ``tl.dot``'s 16-row minimum anyway. What matters:

- long contiguous reads: each program reads BLOCK_N whole rows of W, BLOCK_K consecutive
  elements of each row per step, which Triton turns into 16-byte vector loads coalesced
  across the warp;
- enough bytes in flight: N / BLOCK_N programs, each with BLOCK_N x BLOCK_K elements per step,
  keep every SM's loads outstanding while earlier ones return;
- no reduction across threads inside the loop: products accumulate element-wise in a
  [BLOCK_N, BLOCK_K] FP32 block and are summed along K once, after the loop.

Why W [N, K] and not B [K, N] read through strides
--------------------------------------------------
Reading B [K, N] in place would also be contiguous (along N), but then one program's
contiguous run is only BLOCK_N elements long, so getting many programs (small BLOCK_N) for
parallelism means short, scattered 64-128-byte reads. With W row-major, parallelism comes
from splitting N while each row is still read as a long run along K. It is also the layout
weights are kept in (``nn.Linear`` stores [out, in]), and the layout of the CUDA GEMV. The
harness transposes B into W once, when it prepares the inputs, outside the timed region.
The kernel takes any strides, so ``gemv(b.T, x)`` is correct too, just slower.

Pseudo-code of one program
--------------------------
    rows = program_id * BLOCK_N + [0, BLOCK_N)
    acc = zeros[BLOCK_N, BLOCK_K] in FP32
    for k in range(0, K, BLOCK_K):
        acc += W[rows, k:k+BLOCK_K] * x[k:k+BLOCK_K]      # broadcast x along rows
    y[rows] = sum(acc, along K) rounded to y's dtype

Caveats
-------
- Parallelism is N / BLOCK_N programs: a short, wide W (N in the hundreds, K huge) cannot
  fill the GPU; that needs split-K (partial sums combined in a second pass), not done here.
- Under ``TRITON_INTERPRET=1`` one small config runs instead of autotuning. The kernel widens
  both operands to FP32 before multiplying, so BF16 is exact in the interpreter too.
- Offsets are 32-bit: a tensor spanning 2**31 elements or more is refused.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def gemv_kernel(
    w_ptr,
    x_ptr,
    y_ptr,
    N,
    K,
    stride_wn,
    stride_wk,
    stride_x,
    stride_y,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """y [N] = W [N, K] @ x [K]; one program per BLOCK_N rows of W."""
    pid = tl.program_id(axis=0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_n < N
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk
    x_ptrs = x_ptr + offs_k * stride_x

    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        w = tl.load(w_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptrs, mask=k_ok, other=0.0)
        # Widen before multiplying: the FMA then runs in FP32, like tl.dot's accumulation.
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K * stride_x

    y = tl.sum(acc, axis=1)  # the only cross-thread reduction, once per program
    tl.store(y_ptr + offs_n * stride_y, y.to(y_ptr.dtype.element_ty), mask=row_ok)


# True when Triton handed back its CPU interpreter's stand-in (TRITON_INTERPRET=1 was set when
# this file was loaded).
INTERPRETED = type(gemv_kernel).__name__ == "InterpretedFunction"


def _config(block_n, block_k, warps):
    return triton.Config({"BLOCK_N": block_n, "BLOCK_K": block_k}, num_warps=warps)


# Memory-bound, so one list serves Hopper and Ampere: the choices trade rows per program
# (more programs in flight for small BLOCK_N) against the length of each contiguous read
# (BLOCK_K elements; 512 halves = 1 KB per row per step) and registers for the accumulator
# (BLOCK_N * BLOCK_K / (32 * warps) FP32 values per thread, 64 in most of these).
# No num_stages axis: it would only multiply the autotuner's compiles. Triton's software
# pipeliner (what num_stages controls) does not pipeline this loop, whose loads feed no tl.dot:
# Triton 3.9 emits the same PTX and SASS for num_stages 1 to 4 with every config here, BF16
# and FP32, on sm_80 and sm_90 (tests/test_sass.py keeps checking one of them).
CONFIGS = [
    _config(8, 512, warps=4),
    _config(16, 256, warps=4),
    _config(16, 512, warps=4),
    _config(16, 512, warps=8),
    _config(32, 256, warps=4),
    _config(32, 512, warps=8),
    _config(4, 1024, warps=4),
]

INTERPRETER_CONFIG = {"BLOCK_N": 16, "BLOCK_K": 64}

_autotuned_kernel = None


def _autotuned():
    global _autotuned_kernel
    if _autotuned_kernel is None:
        # Triton adds the argument dtypes to the key.
        _autotuned_kernel = triton.autotune(configs=CONFIGS, key=["N", "K", "stride_wn", "stride_wk"])(gemv_kernel)
    return _autotuned_kernel


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _span(t):
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def gemv(w, x, *, config=None):
    """y = w @ x for torch tensors w [N, K] and x [K] of any strides (never copied).

    Returns a new y [N] in the inputs' dtype. ``config`` (a dict of BLOCK_N, BLOCK_K and
    optionally num_warps, num_stages) skips the autotuner.
    """
    for label, t in (("w", w), ("x", x)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemv: {label} must be a torch.Tensor, got {type(t).__name__}")
    if w.ndim != 2 or x.ndim != 1:
        raise ValueError(
            f"gemv expects w [N, K] (2-D) and x [K] (1-D), got w of shape {tuple(w.shape)} "
            f"and x of shape {tuple(x.shape)}"
        )
    if w.shape[1] != x.shape[0]:
        raise ValueError(
            f"gemv: w is {tuple(w.shape)} [N, K] but x has {x.shape[0]} elements; they must equal K = {w.shape[1]}"
        )
    if w.dtype != x.dtype:
        raise TypeError(f"gemv: w and x must share one dtype, got w {w.dtype} and x {x.dtype}")
    if w.dtype not in DTYPES:
        raise TypeError(f"gemv: unsupported dtype {w.dtype}; use float32, float16 or bfloat16")
    if w.device != x.device:
        raise ValueError(f"gemv: w is on {w.device} and x on {x.device}; they must be on one device")
    if INTERPRETED and w.device.type != "cpu":
        raise ValueError(f"gemv: running under TRITON_INTERPRET=1, which takes CPU tensors; got tensors on {w.device}")
    if not INTERPRETED and w.device.type != "cuda":
        raise ValueError(
            f"gemv: Triton kernels need CUDA tensors, got tensors on {w.device} "
            "(set TRITON_INTERPRET=1 before loading this file to run on the CPU interpreter)"
        )
    if _span(w) >= 2**31:
        raise ValueError(f"gemv: w {tuple(w.shape)} spans 2**31 elements or more, beyond 32-bit offsets")

    N, K = w.shape
    y = torch.empty(N, device=w.device, dtype=w.dtype)
    if N == 0:
        return y
    if K == 0:
        return y.zero_()
    args = (w, x, y, N, K, w.stride(0), w.stride(1), x.stride(0), y.stride(0))
    if config is None and INTERPRETED:
        config = INTERPRETER_CONFIG
    if config is None:
        _autotuned()[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)](*args)
    else:
        config = dict(config)
        for block in ("BLOCK_N", "BLOCK_K"):
            if config.get(block, 0) < 1 or config[block] & (config[block] - 1):
                raise ValueError(f"gemv: {block} must be a power of two, got {config.get(block)}")
        gemv_kernel[(triton.cdiv(N, config["BLOCK_N"]),)](*args, **config)
    return y
