"""Persistent matmul with tensor descriptors (TMA on Hopper), in Triton.

C = A @ B with A [M, K], B [K, N], C [M, N]; FP16 or BF16 inputs, FP32 accumulation, C in the
input dtype (rounded once, at the end).

What it changes from ``matmul.py``, and why
-------------------------------------------
The arithmetic is the same (``tl.dot`` on BLOCK_M x BLOCK_N tiles, FP32 accumulator, grouped
tile order); three things around it change, each aimed at Hopper (sm_90):

1. **Loads and the store go through tensor descriptors.** A descriptor tells the hardware the
   whole matrix (base, shape, strides) and the block shape once; a load then names only the
   block's coordinates. On sm_90 Triton turns it into a TMA copy (``cp.async.bulk.tensor``,
   UTMALDG in the SASS): one thread issues it, the copy engine writes the block straight into
   swizzled shared memory, and rows and columns past the matrix's edge are filled with zeros
   by the hardware. No thread computes an address or a mask, so the registers and issue slots
   that ``matmul.py`` spends on pointer arithmetic go to the wgmma pipeline instead, and the
   edge handling (``% M`` wrapping, K-tail masks) disappears from the code.
2. **Persistent grid.** ``matmul.py`` launches one program per tile; here one program per SM
   (``min(SMs, tiles)``) walks the tiles ``program_id, program_id + SMs, ...`` in the same
   grouped order. No launch or tail-wave cost per tile, and the loads for the next tile can be
   issued while the current tile's epilogue runs: Triton flattens the tile loop and the K loop
   into one software-pipelined loop (``tl.range(..., flatten=True)``; the autotuner may also
   pick an unflattened config, see HOPPER_CONFIGS).
3. **Epilogue through shared memory and TMA** (``c_desc.store``), optionally in two halves
   (EPILOGUE_SUBTILE) so the staging buffer is half as large and one more pipeline stage fits
   in shared memory.

Host-side descriptors, not device-side ones
-------------------------------------------
Triton offers two kinds: ``triton.tools.tensor_descriptor.TensorDescriptor``, built on the host
and passed as a kernel argument (Triton encodes the ``CUtensorMap`` at launch and passes it as
a ``__grid_constant__`` parameter), and ``tl.make_tensor_descriptor`` inside the kernel, which
writes the tensor map into global scratch memory at run time and so needs
``triton.set_allocator`` to be set process-wide. The host-side kind is used here: no global
allocator state to install (a library call should not change the process's allocator), no
tensor-map writes and fences inside the kernel, and the interpreter accepts it as well. The
descriptors' block shapes depend on the config, so each autotuner config sets them in a
pre-hook before its launch.

B is described as the row-major [K, N] it is and loaded as [BLOCK_K, BLOCK_N] blocks: wgmma
reads 16-bit operands from shared memory in either major order, so B needs no transposed copy
(Triton's tutorial keeps B as [N, K] instead).

TMA's alignment rules, and what happens when they are not met
-------------------------------------------------------------
A tensor map needs a 16-byte-aligned base, a unit stride in the last dimension and every other
stride a multiple of 16 bytes: for 16-bit dtypes, row lengths (K for A, N for B and C) that are
multiples of 8 elements. An operand that breaks a rule (K or N not a multiple of 8, a
transposed or sliced view, an unaligned base) is copied once, on the host, into a buffer whose
rows are padded to 16 bytes; the descriptor still has the true shape, so TMA never reads the
padding and zero-fills past it. Likewise C is written into a padded buffer when N is not a
multiple of 8 and returned as a contiguous copy. These copies cost O(MK + KN + MN) against the
O(MNK) product, and none happens for aligned row-major inputs (every shape the benchmark uses).

Where it does not run
---------------------
- **Not on GPUs before Hopper.** Triton (3.9) compiles tensor descriptors for sm_80 too, by
  rewriting them into ordinary masked pointer loads, so the kernel would run on an A100 but
  without TMA: the name would then describe something that did not happen, and the sm_80 build
  (Triton 3.9) does not even stage blocks through a shared-memory pipeline, so it would be a
  slower ``matmul.py`` (tests/test_sass.py checks this). The wrapper refuses (``tma_unavailable_reason``) and the
  harness reports the implementation unavailable there, saying why; ``triton.matmul`` is the
  kernel for those GPUs.
- **Not with a Triton that lacks tensor descriptors** (``tl.make_tensor_descriptor`` and
  ``triton.tools.tensor_descriptor`` came with Triton 3.3): same, reported with the version.
- **Not FP32.** TMA would copy FP32 blocks fine, but ``tl.dot`` on FP32 is either TF32, which
  fails the project's FP32 tolerance, or IEEE FMAs on the CUDA cores, where the accumulator and
  operands live in registers and the point of this kernel (feeding wgmma from TMA-filled shared
  memory) is lost. ``matmul.py`` covers FP32.

Under ``TRITON_INTERPRET=1`` (the CPU interpreter, Triton 3.9) host-side descriptors are
supported: loads become masked loads with zero padding, and the interpreter checks the same
alignment rules (base, strides, block offsets) that TMA has. The kernel runs there with small
blocks and a few programs, so that each program walks several tiles. As in ``matmul.py``, BF16
blocks are widened to FP32 before ``tl.dot`` under the interpreter, which otherwise multiplies
BF16 bit patterns as integers.
"""

import functools

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.3
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def tile_coordinates(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row, column) of C tile number ``tile`` in grouped order: GROUP_M tile-rows are walked
    column by column, so the tiles in flight at once cover a square-ish patch of C and share
    blocks of A and B in L2 (see matmul.py's docstring)."""
    tiles_per_group = GROUP_M * tiles_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_size = min(tiles_m - first_m, GROUP_M)  # the last group is short when GROUP_M does not divide tiles_m
    pid_m = first_m + (tile % tiles_per_group) % group_size
    pid_n = (tile % tiles_per_group) // group_size
    return pid_m, pid_n


@triton.jit
def matmul_tma_kernel(
    a_desc,
    b_desc,
    c_desc,
    M,
    N,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,  # the tile stride: the number of SMs (the grid may be smaller)
    EPILOGUE_SUBTILE: tl.constexpr,  # store C in two BLOCK_M x BLOCK_N/2 halves
    FLATTEN: tl.constexpr,  # let Triton fuse the tile and K loops into one pipelined loop
    UPCAST: tl.constexpr,  # widen blocks to FP32 before tl.dot (interpreter + BF16)
):
    """C [M, N] = A [M, K] @ B [K, N]; each program computes tiles program_id, +NUM_PROGRAMS, ..."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = tile_coordinates(tile, tiles_m, tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        # FP32 accumulator whatever the inputs. No masks anywhere: the descriptors know the
        # matrix's shape, and blocks hanging over an edge come back zero-filled (the K tail
        # then adds nothing; rows past M and columns past N are not stored).
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_steps):
            a = a_desc.load([off_m, k * BLOCK_K])
            b = b_desc.load([k * BLOCK_K, off_n])
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)

        if EPILOGUE_SUBTILE:
            # [BLOCK_M, BLOCK_N] -> two [BLOCK_M, BLOCK_N / 2] halves, stored one after the other
            # through a staging buffer half the size.
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # the one rounding to C's dtype


# True when Triton handed back its CPU interpreter's stand-in (TRITON_INTERPRET=1 when this file
# was loaded): decided by Triton itself, so it cannot disagree with it.
INTERPRETED = type(matmul_tma_kernel).__name__ == "InterpretedFunction"


# ---------------------------------------------------------------------------------------------
# Where it can run
# ---------------------------------------------------------------------------------------------
def tma_unavailable_reason(capability=None, descriptors=None):
    """Why this kernel cannot run as a TMA kernel here, or None.

    ``capability``: the GPU's (major, minor), None under the interpreter (no GPU involved).
    ``descriptors``: whether this Triton has tensor descriptors (default: look).
    """
    if descriptors is None:
        descriptors = TensorDescriptor is not None and hasattr(tl, "make_tensor_descriptor")
    if not descriptors:
        return (
            f"Triton {triton.__version__} has no tensor descriptors (TMA); they came with Triton 3.3: "
            "pip install -U triton, or use triton.matmul"
        )
    if capability is not None and tuple(capability) < (9, 0):
        major, minor = capability
        return (
            f"needs a Hopper or newer GPU (sm_90+) for TMA; this one is sm_{major}{minor}, where Triton would "
            "lower the descriptors to plain pointer loads: use triton.matmul there"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Autotuning: configs for Hopper
# ---------------------------------------------------------------------------------------------
def _set_block_shapes(nargs):
    """A config's pre-hook: the descriptors' block shapes follow the config's tile."""
    block_m, block_n, block_k = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [block_m, block_k]
    nargs["b_desc"].block_shape = [block_k, block_n]
    nargs["c_desc"].block_shape = [block_m, block_n // 2 if nargs["EPILOGUE_SUBTILE"] else block_n]


def _config(block_m, block_n, block_k, stages, warps, subtile, flatten=True, group_m=8):
    return triton.Config(
        {
            "BLOCK_M": block_m,
            "BLOCK_N": block_n,
            "BLOCK_K": block_k,
            "GROUP_M": group_m,
            "EPILOGUE_SUBTILE": subtile,
            "FLATTEN": flatten,
        },
        num_stages=stages,
        num_warps=warps,
        pre_hook=_set_block_shapes,
    )


# wgmma is issued per warpgroup (4 warps): 8 warps run two warpgroups, each owning 64 rows of a
# 128-row tile. BLOCK_K = 64 halves is one 128-byte swizzled row per TMA box. A 128 x 256 x 64
# stage is 48 KiB of shared memory, so 3 stages plus a full 64 KiB C staging buffer fit in the
# 227 KiB of an H100/H200, and 4 stages fit with the C buffer halved (EPILOGUE_SUBTILE).
# 128 x 256 with 8 warps holds 128 FP32 accumulators per thread: 154 registers with ptxas
# (Triton 3.9, sm_90), no spills; tests/test_sass.py checks every config for spills.
# Flattening the tile and K loops (the tutorial's choice) nearly doubles the SASS (1072 against
# 592 instructions for the first config) in exchange for overlapping one tile's epilogue with the
# next tile's loads; which wins was not measured when these were written, so the two leading
# tiles are also offered unflattened and the autotuner decides. Triton's automatic warp
# specialization (``tl.range(..., warp_specialize=True)``) is not offered: on sm_90 Triton 3.9
# compiles this kernel to the same SASS with it as without (it targets Blackwell).
HOPPER_CONFIGS = [
    _config(128, 256, 64, stages=3, warps=8, subtile=False),
    _config(128, 256, 64, stages=4, warps=8, subtile=True),
    _config(128, 256, 64, stages=3, warps=8, subtile=True),
    _config(128, 128, 64, stages=4, warps=8, subtile=False),
    _config(128, 128, 64, stages=5, warps=4, subtile=True),
    _config(128, 128, 128, stages=3, warps=8, subtile=False),
    _config(128, 256, 64, stages=3, warps=8, subtile=False, flatten=False),
    _config(128, 128, 64, stages=4, warps=8, subtile=False, flatten=False),
]

# The interpreter runs programs one after another in NumPy: small blocks, and few programs so
# that each one walks several tiles (the persistent loop is what is being checked).
INTERPRETER_CONFIG = {
    "BLOCK_M": 16,
    "BLOCK_N": 32,
    "BLOCK_K": 16,
    "GROUP_M": 2,
    "EPILOGUE_SUBTILE": True,
    "FLATTEN": False,
}
INTERPRETER_PROGRAMS = 3


def shared_memory_bytes(config, element_size=2):
    """Shared memory a config needs: the pipelined A and B blocks plus the C staging buffer."""
    kw = config.kwargs
    stages = config.num_stages * (kw["BLOCK_M"] + kw["BLOCK_N"]) * kw["BLOCK_K"]
    epilogue = kw["BLOCK_M"] * kw["BLOCK_N"] // (2 if kw["EPILOGUE_SUBTILE"] else 1)
    return (stages + epilogue) * element_size


def _shared_memory_limit(device_index):
    try:
        properties = triton.runtime.driver.active.utils.get_device_properties(device_index)
        return int(properties["max_shared_mem"])
    except Exception:  # an older or newer driver API: let the compiler be the judge
        return None


def prune_configs(configs, limit):
    """The configs whose buffers fit in ``limit`` bytes of shared memory (at least the smallest)."""
    if limit is None:
        return list(configs)
    return [c for c in configs if shared_memory_bytes(c) <= limit] or [min(configs, key=shared_memory_bytes)]


_autotuned = {}  # (device index, dtype) -> the autotuned kernel

# Check mode: only the first config that fits, so a correctness run over many shapes compiles
# one kernel per specialization instead of one per config (the GPU tests set it; set it before
# the first launch).
CHECK_MODE = False


def _autotuned_kernel(device, dtype):
    # One autotuner per dtype: the tuning key sees M, N and K but not the descriptors' dtypes.
    key = (device.index or 0, dtype)
    if key not in _autotuned:
        configs = prune_configs(HOPPER_CONFIGS, _shared_memory_limit(key[0]))
        configs = configs[:1] if CHECK_MODE else configs
        _autotuned[key] = triton.autotune(configs=configs, key=["M", "N", "K"])(matmul_tma_kernel)
    return _autotuned[key]


# ---------------------------------------------------------------------------------------------
# The wrapper: check, align, describe, launch
# ---------------------------------------------------------------------------------------------
DTYPES = (torch.float16, torch.bfloat16)


def tma_compatible(t):
    """Whether a 2-D tensor meets TMA's rules as it is: 16-byte-aligned base, unit stride along
    rows, row stride a multiple of 16 bytes."""
    size = t.element_size()
    return t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0 and t.data_ptr() % 16 == 0


def aligned_empty(rows, cols, dtype, device):
    """An uninitialised [rows, cols] view whose rows start 16 bytes apart (padded storage)."""
    per_16_bytes = 16 // torch.empty((), dtype=dtype).element_size()
    padded = -(-cols // per_16_bytes) * per_16_bytes
    return torch.empty((rows, padded), dtype=dtype, device=device)[:, :cols]


def tma_operand(t):
    """``t`` itself when TMA can read it in place, else a copy into rows padded to 16 bytes."""
    if tma_compatible(t):
        return t
    copy = aligned_empty(*t.shape, t.dtype, t.device)
    copy.copy_(t)
    return copy


def _check_inputs(a, b):
    for label, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"matmul_tma: {label} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 2:
            raise ValueError(f"matmul_tma: {label} must be 2-D, got {t.ndim}-D {label} of shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul_tma: inputs must share one dtype, got a {a.dtype}, b {b.dtype}")
    if a.dtype not in DTYPES:
        hint = " (FP32: use triton.matmul; see this file's docstring for why)" if a.dtype == torch.float32 else ""
        raise TypeError(f"matmul_tma: unsupported dtype {a.dtype}; use float16 or bfloat16{hint}")
    if a.device != b.device:
        raise ValueError(f"matmul_tma: inputs must be on one device, got a on {a.device}, b on {b.device}")
    if INTERPRETED and a.device.type != "cpu":
        raise ValueError(
            f"matmul_tma: running under TRITON_INTERPRET=1, which takes CPU tensors; got tensors on {a.device}"
        )
    if not INTERPRETED and a.device.type != "cuda":
        raise ValueError(
            f"matmul_tma: Triton kernels need CUDA tensors, got tensors on {a.device} "
            "(set TRITON_INTERPRET=1 before loading this file to run on the CPU interpreter)"
        )
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul_tma: inner dimensions do not match: a is {tuple(a.shape)} [M, K] and "
            f"b is {tuple(b.shape)} [K, N]; a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]})"
        )
    for label, t in (("a", a), ("b", b)):
        if max(t.shape) >= 2**31:  # TMA coordinates and Triton's offsets are 32-bit
            raise ValueError(f"matmul_tma: {label} {tuple(t.shape)} has a dimension of 2**31 or more")
    reason = tma_unavailable_reason(None if INTERPRETED else _device_facts(a.device.index)[0])
    if reason:
        raise RuntimeError(f"matmul_tma: {reason}")


@functools.lru_cache(maxsize=None)
def _device_facts(index):
    """(compute capability, SM count) of a CUDA device: asked once, not on every timed call."""
    index = torch.cuda.current_device() if index is None else index
    return torch.cuda.get_device_capability(index), torch.cuda.get_device_properties(index).multi_processor_count


def matmul_tma(a, b, *, config=None, programs=None):
    """C = a @ b for FP16 or BF16 torch tensors a [M, K] and b [K, N] of any strides.

    Returns a new contiguous C [M, N] in the inputs' dtype. ``config`` (a dict of BLOCK_M,
    BLOCK_N, BLOCK_K, GROUP_M, EPILOGUE_SUBTILE, FLATTEN and optionally num_warps, num_stages) skips the
    autotuner; ``programs`` sets how many persistent programs run (default: one per SM, or
    INTERPRETER_PROGRAMS under the interpreter).
    """
    _check_inputs(a, b)
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return torch.zeros((M, N), device=a.device, dtype=a.dtype)
    a, b = tma_operand(a), tma_operand(b)
    c = aligned_empty(M, N, a.dtype, a.device)  # contiguous unless N needs padding

    if programs is None:
        programs = INTERPRETER_PROGRAMS if INTERPRETED else _device_facts(a.device.index)[1]
    if programs < 1:
        raise ValueError(f"matmul_tma: programs must be at least 1, got {programs}")
    flags = {
        "NUM_PROGRAMS": programs,
        # The interpreter's tl.dot multiplies BF16 bit patterns as integers; FP16 is fine.
        "UPCAST": INTERPRETED and a.dtype == torch.bfloat16,
    }
    if config is None and INTERPRETED:
        config = INTERPRETER_CONFIG
    if config is not None:
        config = dict(config)
        config.setdefault("GROUP_M", 8)
        config.setdefault("EPILOGUE_SUBTILE", False)
        config.setdefault("FLATTEN", True)  # no effect under the interpreter, which runs loops as written
        for block in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            if config.get(block, 0) < 16 or config[block] & (config[block] - 1):
                raise ValueError(
                    f"matmul_tma: {block} must be a power of two >= 16 (tl.dot's minimum), got {config.get(block)}"
                )
        if config["BLOCK_N"] > 256 or config["BLOCK_M"] > 256 or config["BLOCK_K"] > 256:
            raise ValueError(
                "matmul_tma: a TMA box is at most 256 elements along each dimension, got "
                f"{config['BLOCK_M']} x {config['BLOCK_N']} x {config['BLOCK_K']}"
            )
    # Placeholder block shapes when autotuning: each config's pre-hook sets its own.
    first = config or HOPPER_CONFIGS[0].kwargs
    descriptors = {
        "a_desc": TensorDescriptor(a, [M, K], [a.stride(0), 1], [first["BLOCK_M"], first["BLOCK_K"]]),
        "b_desc": TensorDescriptor(b, [K, N], [b.stride(0), 1], [first["BLOCK_K"], first["BLOCK_N"]]),
        "c_desc": TensorDescriptor(c, [M, N], [c.stride(0), 1], [first["BLOCK_M"], first["BLOCK_N"]]),
    }
    if config is None:
        kernel = _autotuned_kernel(a.device, a.dtype)
        grid = lambda meta: (min(programs, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),)  # noqa: E731
        kernel[grid](**descriptors, M=M, N=N, K=K, **flags)
    else:
        _set_block_shapes({**descriptors, **config})
        grid = (min(programs, triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"])),)
        matmul_tma_kernel[grid](**descriptors, M=M, N=N, K=K, **flags, **config)
    return c if c.is_contiguous() else c.contiguous()
