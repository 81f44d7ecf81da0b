"""Tiled matmul in Triton with grouped ordering (the chapter-12 kernel, autotuned).

C = A @ B with A [M, K], B [K, N], C [M, N]; FP32, FP16 or BF16 inputs of any strides, FP32
accumulation, C in the input dtype (rounded once, at the end).

What it is
----------
The same algorithm as the shared-memory tiled kernel (``cuda/tiled.cu``, ``c/blocked.c``),
written one level up: each *program* owns one BLOCK_M x BLOCK_N tile of C and marches along K,
loading a [BLOCK_M, BLOCK_K] block of A and a [BLOCK_K, BLOCK_N] block of B per step and
multiplying them with ``tl.dot``. Triton stages the blocks through shared memory, pipelines the
loads ``num_stages`` deep and maps ``tl.dot`` onto tensor cores (wgmma on Hopper, mma on
Ampere), which the hand-written tiled CUDA kernel does not use.

What it changes from the tiled kernel: the order in which tiles of C are computed
("grouped ordering", Triton tutorial 03), and block shapes chosen by the autotuner instead of
fixed by hand.

Why GROUP_M helps the L2
------------------------
Programs run roughly in program-id order, a wave of about (SMs x programs per SM) at a time.
In plain row-major order a wave covers one or two whole rows of C tiles: it reads a few
row-blocks of A but *every* column-block of B, so B streams through L2 and is evicted before
the next wave wants it again. Grouped ordering walks GROUP_M tile-rows column by column
instead, so a wave covers a roughly square patch of C: GROUP_M row-blocks of A and a few
column-blocks of B, each reused by many programs of the same wave while it is still in L2.

    row-major (pid ->)       grouped, GROUP_M = 2
     0  1  2  3               0  2  4  6
     4  5  6  7               1  3  5  7
     8  9 10 11               8 10 12 14
    12 13 14 15               9 11 13 15

For the same nine C tiles the square patch loads 3 + 3 blocks where a row of nine loads
1 + 9: fewer distinct blocks per wave, more hits in L2, less HBM traffic.

Pseudo-code of one program
--------------------------
    (pid_m, pid_n) = grouped(program_id)
    acc = zeros[BLOCK_M, BLOCK_N] in FP32
    for k in range(0, K, BLOCK_K):
        acc += A[pid_m rows, k:k+BLOCK_K] @ B[k:k+BLOCK_K, pid_n columns]
    C[pid_m rows, pid_n columns] = acc rounded to C's dtype

Constraints and caveats
-----------------------
- Any strides: the kernel is given every stride, so ``matmul(a.T, b)`` reads the transposed
  view in place (no copy). The configs were chosen for row-major A and B; other layouts are
  correct but may load less efficiently. The autotuner keys on the strides, so each layout
  gets its own choice of config.
- FP32 inputs are multiplied in full FP32 (``input_precision="ieee"``, CUDA cores), because
  Triton's default for FP32 ``tl.dot`` is TF32, whose 10-bit mantissa fails the project's FP32
  tolerance. ``allow_tf32=True`` opts in to the tensor cores.
- Offsets are 32-bit: a tensor spanning 2**31 elements or more is refused.
- Under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, for machines without a GPU) the
  kernel runs one small config instead of autotuning (timing the interpreter tells nothing),
  and BF16 blocks are widened to FP32 before ``tl.dot``: the interpreter multiplies BF16 bit
  patterns as integers. The interpreter also ignores ``input_precision``.
"""

import torch
import triton
import triton.language as tl


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST: tl.constexpr,  # widen blocks to FP32 before tl.dot (interpreter + BF16)
    INPUT_PRECISION: tl.constexpr,  # "ieee" for exact FP32, "tf32" (Triton's default) otherwise
):
    """C [M, N] = A [M, K] @ B [K, N]; one program per BLOCK_M x BLOCK_N tile of C."""
    # Grouped ordering: see the module docstring for why.
    pid = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    programs_per_group = GROUP_M * tiles_n
    group = pid // programs_per_group
    first_m = group * GROUP_M
    group_size = min(tiles_m - first_m, GROUP_M)  # the last group is short when GROUP_M does not divide tiles_m
    pid_m = first_m + ((pid % programs_per_group) % group_size)
    pid_n = (pid % programs_per_group) // group_size

    # Rows past M (columns past N) wrap round to valid ones instead of being masked: the loads
    # then need no M/N mask, so they stay full-width vector loads, and the wrapped rows only
    # feed accumulator rows that the masked store below throws away.
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn

    # FP32 accumulator whatever the inputs: K additions in half precision would lose the
    # low bits of every partial sum.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        # The K tail must be masked (with zeros, which add nothing): unlike rows of C, a
        # wrapped K index would add a wrong product into a kept element.
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c = acc.to(c_ptr.dtype.element_ty)  # the one rounding to the output dtype
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


# True when Triton handed back its CPU interpreter's stand-in: decided by Triton itself when
# this file was loaded (TRITON_INTERPRET=1 in the environment), so it cannot disagree with it.
INTERPRETED = type(matmul_kernel).__name__ == "InterpretedFunction"


# ---------------------------------------------------------------------------------------------
# Autotuning: a handful of configs per architecture
# ---------------------------------------------------------------------------------------------
def _config(block_m, block_n, block_k, stages, warps, group_m=8):
    return triton.Config(
        {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m},
        num_stages=stages,
        num_warps=warps,
    )


# Hopper (sm_90): wgmma is issued per warpgroup (4 warps), so 8 warps run two warpgroups on a
# 128- or 256-row tile; BLOCK_K = 64 halves is one 128-byte swizzled row per stage; 228 KB of
# shared memory per SM allows 3-4 stages of a 128 x 256 tile pair in half precision
# (48 KB per stage). The last five are small enough for FP32 inputs (BLOCK_K = 32: 16-32 KB
# per stage), which the pruning below would otherwise leave with a single config; their warp
# counts are those for which ptxas (Triton 3.9) keeps FP32 tiles spill-free: 64 x 128 spills
# with 4 warps and not with 8, 64 x 64 spills with 4 stages and not with 3.
HOPPER_CONFIGS = [
    _config(128, 256, 64, stages=3, warps=8),
    _config(256, 128, 64, stages=3, warps=8),
    _config(128, 256, 64, stages=4, warps=8),
    _config(128, 128, 64, stages=4, warps=4),
    _config(128, 128, 64, stages=5, warps=8),
    _config(128, 128, 32, stages=3, warps=8),
    _config(128, 128, 32, stages=4, warps=8),
    _config(128, 64, 32, stages=4, warps=4),
    _config(64, 128, 32, stages=4, warps=8),
    _config(64, 64, 32, stages=3, warps=4),
]

# Ampere (sm_80) and other pre-Hopper GPUs: mma.sync per warp, 164 KB of shared memory on
# A100 (less on consumer parts, which the shared-memory pruning below accounts for), so
# BLOCK_K = 32 and 3-4 stages. FP32 inputs keep the 128 x 64, 64 x 128 and the last two
# (see FP32_ACCUMULATORS).
AMPERE_CONFIGS = [
    _config(128, 256, 32, stages=3, warps=8),
    _config(256, 128, 32, stages=3, warps=8),
    _config(128, 128, 32, stages=4, warps=4),
    _config(128, 64, 32, stages=4, warps=4),
    _config(64, 128, 32, stages=4, warps=4),
    _config(128, 128, 64, stages=3, warps=8),
    _config(128, 128, 32, stages=4, warps=8),
    _config(64, 64, 32, stages=4, warps=4),
]

# FP32 inputs multiply in "ieee" precision: tl.dot becomes FMAs on the CUDA cores, with the
# accumulator and the A and B values it multiplies all in registers. Above 64 accumulators per
# thread ptxas spills to local memory (Triton 3.9, sm_80: 128 x 256 and 256 x 128 with 8 warps,
# 128 x 128 with 4 warps, each with hundreds of spill instructions), so FP32 keeps to this.
FP32_ACCUMULATORS = 64

# The interpreter runs programs one after another in NumPy: small blocks keep the edge tiles
# cheap, and one config is enough (there is nothing to tune).
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}


def _shared_memory_limit(device_index):
    try:
        properties = triton.runtime.driver.active.utils.get_device_properties(device_index)
        return int(properties["max_shared_mem"])
    except Exception:  # an older or newer driver API: let the compiler be the judge
        return None


def _accumulators_per_thread(config):
    return config.kwargs["BLOCK_M"] * config.kwargs["BLOCK_N"] // (32 * config.num_warps)


def _prune_configs(configs, named_args, **kwargs):
    """Drop configs whose pipelined tiles cannot fit in shared memory for this dtype, and for
    FP32 multiplied in "ieee" precision those that would spill registers (FP32_ACCUMULATORS).

    Compiling them would only fail (Triton reports OutOfResources) or run slowly; skipping
    them saves the autotuner a compile each, which matters most for FP32, whose tiles are
    twice as large.
    """
    a = named_args["a_ptr"]
    size = a.element_size()
    if size == 4 and kwargs.get("INPUT_PRECISION", "ieee") == "ieee":
        configs = [c for c in configs if _accumulators_per_thread(c) <= FP32_ACCUMULATORS] or configs
    limit = _shared_memory_limit(a.device.index or 0)
    if limit is None:
        return configs[:1] if CHECK_MODE else configs

    def need(config):
        kw = config.kwargs
        return config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"] * size

    fitting = [c for c in configs if need(c) <= limit] or [min(configs, key=need)]
    return fitting[:1] if CHECK_MODE else fitting


_AUTOTUNE_KEY = ["M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn"]
_autotuned = {}  # compute-capability major -> the autotuned kernel

# Check mode: the autotuner keeps only the first config that survives pruning, so a correctness
# run over many shapes compiles one kernel per specialization instead of one per config (the
# GPU tests set it; set it before the first launch).
CHECK_MODE = False


def _autotuned_kernel(device):
    major, _ = torch.cuda.get_device_capability(device)
    if major not in _autotuned:
        configs = HOPPER_CONFIGS if major >= 9 else AMPERE_CONFIGS
        # The tuning key holds the problem size and layout; Triton adds the argument dtypes.
        _autotuned[major] = triton.autotune(
            configs=configs,
            key=_AUTOTUNE_KEY,
            prune_configs_by={"early_config_prune": _prune_configs},
        )(matmul_kernel)
    return _autotuned[major]


# ---------------------------------------------------------------------------------------------
# The wrapper: check, allocate, launch
# ---------------------------------------------------------------------------------------------
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _span(t):
    """1 + the largest element offset of ``t`` (what a 32-bit offset must be able to reach)."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def check_inputs(name, tensors, ndims):
    """The checks both wrappers share: torch tensors, ndim, dtype, one device that suits the mode."""
    for label, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {label} must be a torch.Tensor, got {type(t).__name__}")
    for (label, t), ndim in zip(tensors.items(), ndims):
        if t.ndim != ndim:
            raise ValueError(f"{name}: {label} must be {ndim}-D, got {t.ndim}-D {label} of shape {tuple(t.shape)}")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) != 1:
        raise TypeError(
            f"{name}: inputs must share one dtype, got "
            + ", ".join(f"{label} {t.dtype}" for label, t in tensors.items())
        )
    dtype = dtypes.pop()
    if dtype not in DTYPES:
        raise TypeError(f"{name}: unsupported dtype {dtype}; use float32, float16 or bfloat16")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(
            f"{name}: inputs must be on one device, got "
            + ", ".join(f"{label} on {t.device}" for label, t in tensors.items())
        )
    device = devices.pop()
    if INTERPRETED and device.type != "cpu":
        raise ValueError(f"{name}: running under TRITON_INTERPRET=1, which takes CPU tensors; got tensors on {device}")
    if not INTERPRETED and device.type != "cuda":
        raise ValueError(
            f"{name}: Triton kernels need CUDA tensors, got tensors on {device} "
            "(set TRITON_INTERPRET=1 before loading this file to run on the CPU interpreter)"
        )
    for label, t in tensors.items():
        if _span(t) >= 2**31:
            raise ValueError(f"{name}: {label} {tuple(t.shape)} spans 2**31 elements or more, beyond 32-bit offsets")
    return dtype


def matmul(a, b, *, config=None, allow_tf32=False):
    """C = a @ b for torch tensors a [M, K] and b [K, N] of any strides (never copied).

    Returns a new contiguous C [M, N] in the inputs' dtype. ``config`` (a dict of BLOCK_M,
    BLOCK_N, BLOCK_K, GROUP_M and optionally num_warps, num_stages) skips the autotuner.
    """
    dtype = check_inputs("matmul", {"a": a, "b": b}, (2, 2))
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul: inner dimensions do not match: a is {tuple(a.shape)} [M, K] and "
            f"b is {tuple(b.shape)} [K, N]; a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]})"
        )
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=dtype)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    flags = {
        # The interpreter's tl.dot multiplies BF16 bit patterns as integers; FP16 and FP32 are fine.
        "UPCAST": INTERPRETED and dtype == torch.bfloat16,
        "INPUT_PRECISION": "tf32" if (dtype != torch.float32 or allow_tf32) else "ieee",
    }
    if config is None and INTERPRETED:
        config = INTERPRETER_CONFIG
    if config is None:
        kernel = _autotuned_kernel(a.device)

        def grid(meta):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

        kernel[grid](*args, **flags)
    else:
        config = dict(config)
        for block in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            if config.get(block, 0) < 16 or config[block] & (config[block] - 1):
                raise ValueError(
                    f"matmul: {block} must be a power of two >= 16 (tl.dot's minimum), got {config.get(block)}"
                )
        config.setdefault("GROUP_M", 8)
        grid = (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)
        matmul_kernel[grid](*args, **flags, **config)
    return c
