"""CUtensorMap encoding for the TMA kernels (cuda/wgmma.cu), on the GPU and in the emulation.

A tensor map is 128 opaque bytes that the driver's ``cuTensorMapEncodeTiled`` writes on the host
and the kernel receives by value (a ``const __grid_constant__`` parameter). PyCUDA has no binding
for that call and CuPy none in its public API, but the driver library itself is there wherever a
GPU is, so it is called through ctypes on ``libcuda.so.1`` (no extra package to install). The CPU
emulation exports ``emu_tensor_map_encode_tiled`` with the same arguments (cuda/emu/include/
hopper_emu.h), so one function encodes for both, with the same checks.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from harness.backends.cuda.plans import TensorMapArg

# CUtensorMapDataType, CUtensorMapSwizzle and CUtensorMapL2promotion values (cuda.h)
DATA_TYPES = {"float16": 6, "bfloat16": 9}
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2}
SWIZZLE_128B = 3
L2_PROMOTION_256B = 3
TENSOR_MAP_BYTES = 128
# cuda.h declares CUtensorMap alignas(128); cuda/ptx.h's TensorMap matches (tests/test_sass.py).
TENSOR_MAP_ALIGNMENT = 128


def declare(function):
    """Give ``function`` (cuTensorMapEncodeTiled or the emulation's) its C signature."""
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    function.restype = ctypes.c_int
    function.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_uint32,
        ctypes.c_void_p,
        u64p,
        u64p,
        u32p,
        u32p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return function


@lru_cache(maxsize=None)
def driver_encoder():
    """cuTensorMapEncodeTiled from the NVIDIA driver (CUDA 12.0+ drivers have it)."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
        return declare(library.cuTensorMapEncodeTiled)
    except (OSError, AttributeError) as error:
        raise RuntimeError(
            f"the TMA kernels need cuTensorMapEncodeTiled from the NVIDIA driver (libcuda.so.1, "
            f"CUDA 12 or newer): {error}"
        ) from error


def encode(encoder, arg: TensorMapArg, address: int, pitch_bytes: int, dtype: str) -> bytes:
    """The 128 bytes of the tensor map of ``arg`` over the matrix at ``address`` (rows
    ``pitch_bytes`` apart), 16-bit elements in boxes of box_rows x box_cols, 128-byte swizzle,
    zeros outside the matrix. Raises RuntimeError with the arguments when the encoder refuses."""
    if dtype not in DATA_TYPES:
        raise ValueError(f"no tensor map data type for {dtype}")
    raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGNMENT)
    offset = (-ctypes.addressof(raw)) % TENSOR_MAP_ALIGNMENT
    target = ctypes.addressof(raw) + offset
    dims = (ctypes.c_uint64 * 2)(arg.cols, arg.rows)
    strides = (ctypes.c_uint64 * 1)(pitch_bytes)
    box = (ctypes.c_uint32 * 2)(arg.box_cols, arg.box_rows)
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    status = encoder(
        target,
        DATA_TYPES[dtype],
        2,
        address,
        dims,
        strides,
        box,
        element_strides,
        0,
        SWIZZLE_128B,
        L2_PROMOTION_256B,
        0,
    )
    if status != 0:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled refused the tensor map of {arg.buffer} (CUresult {status}): "
            f"{arg.rows} x {arg.cols} {dtype}, row pitch {pitch_bytes} B, address {address:#x}, "
            f"box {arg.box_rows} x {arg.box_cols}"
        )
    return raw.raw[offset : offset + TENSOR_MAP_BYTES]
