"""Adapter for the decode GEMV: Y [M, N] = X [M, K] @ W^T with W [N, K] quantized (quant.py).

The problem's B is a ``quant.QuantizedWeights`` of W, not a float matrix: ``prepare(impl, a,
b, options)`` takes ``a`` = X [M, K] float32 and ``b`` = the weights, made once outside the
timed region; ``run()`` is the product alone; ``result()`` is Y [M, N] float32. Check it
against the float64 product of X and ``b.dequantize()`` (exact: see quant.py), with the
ordinary float32 error model: the implementations here dequantize the weights exactly and
only their float32 sums round.

    python.decode   python/decode.py: the readable NumPy model, block by block (also q4_K)
    c.decode        c/decode.c: SIMD dequantize-in-registers, M = 1..16 per pass over W, threads
"""

from __future__ import annotations

import numpy as np

from harness.backends.c import (
    VARIANTS,
    CCall,
    aligned_empty,
    clib,
    resolved_variant,
    supported_variants,
    thread_option,
    variants_text,
)
from harness.env.sources import load_python_source
from harness.model.core import Backend, BrokenError, Implementation, MatmulInputError, Prepared
from harness.model.quant import FORMATS, QuantizedWeights, quantize
from harness.model.registry import register

WEIGHTS = ("q8_0", "q4_0", "bf16")
PYTHON_WEIGHTS = ("q8_0", "q4_0", "q4_K", "bf16")  # python.decode's: q4_K's super-blocks too

# c/decode.h's numbers.
_DECODE_ERRORS = {
    1: "the variant cannot run on this CPU or build",
    2: "a dimension is negative",
    3: "unknown weight format",
    4: "K is not a multiple of the format's block size",
    5: "the packed copy of X could not be allocated (out of memory)",
}


def decode_inputs(impl: Implementation, a, b) -> tuple[np.ndarray, QuantizedWeights]:
    """X as a C-contiguous float32 [M, K] array (a copy only where needed; the caller's array is
    never changed) and the weights, or a MatmulInputError that says what is wrong."""
    if not isinstance(b, QuantizedWeights):
        raise MatmulInputError(
            f"{impl.name} takes W as harness.quant.QuantizedWeights (quant.quantize(w, format)), got {type(b).__name__}"
        )
    if b.format not in impl.weights:
        raise MatmulInputError(f"{impl.name} does not take {b.format} weights (it takes {', '.join(impl.weights)})")
    if not isinstance(a, np.ndarray) or isinstance(a, np.ma.MaskedArray):
        raise MatmulInputError(f"{impl.name} expects X as a plain NumPy array, got {type(a).__name__}")
    if a.ndim != 2:
        raise MatmulInputError(f"{impl.name} expects a 2-D X [M, K], got a {a.ndim}-D array of shape {a.shape}")
    if a.dtype != np.float32:
        raise MatmulInputError(f"{impl.name} takes float32 activations X, got {a.dtype}")
    if impl.activation_rounding and not np.isfinite(a).all():
        row, col = np.argwhere(~np.isfinite(a))[0]
        raise MatmulInputError(
            f"{impl.name} rounds X to {impl.activation_rounding}, which holds no infinity or NaN: "
            f"X has {int((~np.isfinite(a)).sum())} such values, the first at [{row}, {col}]"
        )
    if a.shape[1] != b.k:
        raise MatmulInputError(
            f"X is {a.shape} and W is {b.shape} (N, K): X's columns ({a.shape[1]}) must equal W's K ({b.k})"
        )
    return np.require(a, np.float32, ["C_CONTIGUOUS", "ALIGNED"]), b


# ---- python.decode ---------------------------------------------------------------------------


class _PythonPrepared(Prepared):
    def __init__(self, function, x, w):
        self.function, self.x, self.w = function, x, w
        self.y = None

    def run(self) -> None:
        self.y = self.function(self.x, self.w.format, self.w.n, self.w.k, self.w.data)

    def result(self) -> np.ndarray:
        return self.y


class PythonDecodeBackend(Backend):
    """Calls python/decode.py's ``decode(x, format, n, k, data)``."""

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        x, w = decode_inputs(impl, a, b)
        return _PythonPrepared(load_python_source(impl.source).decode, x, w)


# ---- c.decode --------------------------------------------------------------------------------


def _library():
    try:
        ffi, lib = clib.load()
    except clib.CLibraryError as error:
        raise BrokenError(str(error).splitlines()[0]) from None
    if not hasattr(lib, "matmul_decode_f32"):
        raise BrokenError("the C library lacks matmul_decode_f32 (c/decode.c): it is not a build of these sources")
    return ffi, lib


def decode_variants(prefix: str = "matmul_decode") -> list[str]:
    """The variants of c.decode (or, with prefix="matmul_decode_int8", of c.decode_int8) this
    CPU can run, best last ("portable" always)."""
    _library()
    return supported_variants(prefix)


def decode_variant(variant: str = "auto", prefix: str = "matmul_decode") -> str:
    """The variant ``variant`` runs as here ("auto" resolved), or UnavailableError."""
    _library()
    return resolved_variant(_NAMES[prefix], variant, prefix)


_NAMES = {"matmul_decode": "c.decode", "matmul_decode_int8": "c.decode_int8"}


def check_decode_status(name: str, code: int) -> None:
    if code:
        raise (MatmulInputError if code in (2, 3, 4) else RuntimeError)(
            f"{name} failed (code {code}): {_DECODE_ERRORS.get(code, 'unknown error')}"
        )


# Where the packed W starts. The kernels read it in 64-byte loads at multiples of 64 from its start;
# NumPy's allocator starts a large array 16 or 32 bytes past a line, so every load would straddle
# two lines (and every prefetch miss half of one). A page, as ggml's buffers are aligned.
PACKED_ALIGNMENT = 4096


def pack_int8_weights(w: QuantizedWeights) -> np.ndarray:
    """W's bytes in the layout c/decode_int8.c's kernels read (matmul_decode_int8_pack: tiles of
    4 rows, chunks of 4 blocks; the same bytes, moved), a new array."""
    ffi, lib = _library()
    ggml_type = FORMATS[w.format].ggml_type
    size = lib.matmul_decode_int8_packed_bytes(w.n, w.k, ggml_type)
    if size < 0:
        check_decode_status("c.decode_int8", -size)
    packed = aligned_empty(size, PACKED_ALIGNMENT)
    check_decode_status(
        "c.decode_int8",
        lib.matmul_decode_int8_pack(
            ffi.from_buffer("uint8_t[]", w.data), w.n, w.k, ggml_type, ffi.from_buffer("uint8_t[]", packed)
        ),
    )
    return packed


class CDecodeBackend(Backend):
    """``<prefix>_f32(X, W, Y, M, N, K, format, threads, variant)``: c/decode.c's matmul_decode_f32,
    or c/decode_int8.c's matmul_decode_int8_f32 (prefix="matmul_decode_int8"), which takes W
    repacked by matmul_decode_int8_pack: done here in prepare(), outside the timed product, as
    ggml repacks its weights on load."""

    def __init__(self, prefix: str = "matmul_decode"):
        self.prefix = prefix
        self.repacks = prefix == "matmul_decode_int8"
        # the library functions it calls, all defined in its source
        self.functions = (f"{prefix}_f32", f"{prefix}_variant_supported", f"{prefix}_resolve_variant")
        if self.repacks:
            self.functions += (f"{prefix}_packed_bytes", f"{prefix}_pack")

    def unavailable_reason(self, impl):
        _library()
        return None

    def prepare(self, impl, a, b, options):
        x, w = decode_inputs(impl, a, b)
        threads = thread_option(impl, options)
        variant = options.get("variant", "auto")
        decode_variant(variant, self.prefix)  # an unknown or unsupported variant fails here, before any C runs
        ffi, lib = _library()
        function = getattr(lib, f"{self.prefix}_f32")
        weight_bytes = pack_int8_weights(w) if self.repacks else w.data
        y = np.empty((x.shape[0], w.n), np.float32)
        args = (
            ffi.from_buffer("float[]", x),
            ffi.from_buffer("uint8_t[]", weight_bytes),
            ffi.from_buffer("float[]", y),
            x.shape[0],
            w.n,
            w.k,
            FORMATS[w.format].ggml_type,
            threads,
            VARIANTS[variant],
        )
        return CCall(function, args, y, (x, weight_bytes), lambda code: check_decode_status(impl.name, code))

    def describe(self, impl) -> str | None:
        return variants_text(impl.name, self.prefix)


# One NumPy block at a time, at about the same cost per block of 32 weights whatever M, so M = 1
# is the slowest case. Measured at 1x2048x4096 on an AMD EPYC (Zen 2), CPython 3.11, median of 3:
# q8_0 6.8e6 FLOP/s, bf16 7.7e6, q4_0 4.2e6 (15 us per block); the estimate takes the slowest,
# so 1 x 4096 x 4096, the largest problem it takes unless allow_slow, is "about 8 seconds".
# q4_K is not measured: its 256-weight blocks take a few more NumPy calls each than q4_0's 32,
# far fewer per weight.
PYTHON_DECODE_RATE = 4e6
PYTHON_DECODE_MAX_FLOPS = 2 * 4096 * 4096

register(
    Implementation(
        name="python.decode",
        language="python",
        device="cpu",
        dtypes=("float32",),
        weights=PYTHON_WEIGHTS,
        summary="decode, Y = X W^T with W in ggml's q8_0 / q4_0 / q4_K / bf16: block by block in NumPy (the model)",
        backend=PythonDecodeBackend(),
        source="python/decode.py",
        max_flops=PYTHON_DECODE_MAX_FLOPS,
        slow_rate=PYTHON_DECODE_RATE,
    )
)
register(
    Implementation(
        name="c.decode",
        language="c",
        device="cpu",
        dtypes=("float32",),
        weights=WEIGHTS,
        summary="decode: each block of W dequantized in SIMD registers, FMA'd into M = 1..16 rows of X, threads",
        backend=CDecodeBackend(),
        source="c/decode.c",
        options={"threads": None, "variant": "auto"},
        threaded=True,
    )
)

# llama.cpp's rung: X quantized to q8_0 per block, integer dot products (c/decode_int8.c). Its
# result carries X's rounding (up to half of d_x = max|x| / 127 per element of each 32-wide
# block), which it declares (activation_rounding="q8_0": checking.py then allows that
# rounding's error, harness/model/activation_error.py). tests/test_decode.py checks it
# against the float64 product of the quantized X (``quantized_activations``), bounds its
# distance from the exact product, and runs the declared model.
INT8_IMPLEMENTATION = register(
    Implementation(
        name="c.decode_int8",
        language="c",
        device="cpu",
        dtypes=("float32",),
        weights=("q8_0", "q4_0", "q4_K"),
        summary="decode as llama.cpp does it: X quantized to q8_0 per block, int8 dot products (AVX2, AVX-512 VNNI);"
        " past 16 rows (prefill) each panel of W runs every pass of X",
        backend=CDecodeBackend("matmul_decode_int8"),
        source="c/decode_int8.c",
        activation_rounding="q8_0",
        options={"threads": None, "variant": "auto"},
        threaded=True,
    )
)


def quantized_activations(x: np.ndarray) -> np.ndarray:
    """X [M, K] as c.decode_int8 multiplies it: each 32-wide block of each row quantized to
    q8_0 (quant.quantize: ggml's bytes) and dequantized, float32."""

    return quantize(np.ascontiguousarray(x, dtype=np.float32), "q8_0").dequantize()
