"""Weight formats of a decode GEMV, exactly as GGUF / llama.cpp (ggml) define them.

Decode multiplies a batch of activation rows X [M, K] (float32) by a weight matrix W [N, K]
that is stored compressed: Y [M, N] = X @ W^T. W is row-major and each row is cut along K
into blocks, stored one after another, rows one after another; the bytes here are the bytes
ggml reads (little-endian):

    q8_0   32 weights per block, 34 bytes: a float16 scale d, then 32 int8 q.
           weight = d * q. Quantizing: d = max|w| / 127, q = round(w / d) (half away from 0).
    q4_0   32 weights per block, 18 bytes: a float16 scale d, then 16 bytes; byte j holds
           weight j in its low nibble and weight j + 16 in its high nibble.
           weight = d * (nibble - 8). Quantizing: d = -m / 8 with m the block's value of
           largest magnitude, nibble = min(15, trunc(w / d + 8.5)).
    bf16   one uint16 per weight: the top half of its float32, rounded to nearest even.

``quantize(w, format)`` gives the same bytes as ``gguf.quants.quantize`` (the gguf package,
llama.cpp's Python reference; tests/test_decode.py checks it bit for bit), computed the same
way: the scale and the quotients in float32, the scale then rounded to float16.
``QuantizedWeights.dequantize()`` is exact: a float16 scale times a small integer always
fits in a float32, so a kernel that dequantizes to float32 in registers computes with
exactly these weights, and only its float32 sum rounds.

Where ggml's own arithmetic is undefined (a block of values below 2^-128, whose 1/d
overflows to infinity, so that w / d is NaN and its integer conversion undefined), the
quotients here are those of a zero block; the scale rounds to float16 zero there anyway, so
the weights are the same zeros either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.model.errors import MatmulInputError


@dataclass(frozen=True)
class Format:
    name: str
    block_size: int  # weights per block, along K
    bytes_per_block: int
    ggml_type: int  # ggml's type number (GGMLQuantizationType), which the C kernels take

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.bytes_per_block / self.block_size


FORMATS: dict[str, Format] = {
    "q8_0": Format("q8_0", 32, 34, 8),
    "q4_0": Format("q4_0", 32, 18, 2),
    "bf16": Format("bf16", 1, 2, 30),
}

_FP16_MAX = float(np.finfo(np.float16).max)


def format_of(name) -> Format:
    """The Format called ``name``, or a MatmulInputError listing the known ones."""
    if isinstance(name, str) and name.lower() in FORMATS:
        return FORMATS[name.lower()]
    raise MatmulInputError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}")


def packed_nbytes(fmt: Format, n: int, k: int) -> int:
    return n * (k // fmt.block_size) * fmt.bytes_per_block


def _check_dims(fmt: Format, n, k) -> tuple[int, int]:
    for label, value in (("N", n), ("K", k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise MatmulInputError(f"{fmt.name} weights: {label} must be a non-negative integer, got {value!r}")
    if k % fmt.block_size:
        raise MatmulInputError(
            f"{fmt.name} weights: K = {k} is not a multiple of the block size {fmt.block_size} "
            f"(each row of W is stored as whole blocks of {fmt.block_size} weights along K)"
        )
    return int(n), int(k)


def _blocks(data: np.ndarray, fmt: Format, n: int, k: int) -> np.ndarray:
    """The packed bytes as [N, K / block, bytes per block]."""
    return data.reshape(n, k // fmt.block_size, fmt.bytes_per_block)


@dataclass(frozen=True)
class QuantizedWeights:
    """W [N, K] in one of FORMATS: ``data`` is the read-only 1-D uint8 buffer ggml would read,
    rows of W one after another, each row's blocks in order along K."""

    format: str
    n: int
    k: int
    data: np.ndarray

    def __post_init__(self):
        fmt = format_of(self.format)
        n, k = _check_dims(fmt, self.n, self.k)
        data = self.data
        if not isinstance(data, np.ndarray):
            raise MatmulInputError(f"{fmt.name} weights: data must be a NumPy uint8 array, got {type(data).__name__}")
        if data.dtype != np.uint8:
            raise MatmulInputError(
                f"{fmt.name} weights: data must have dtype uint8 (the packed bytes), got {data.dtype}"
            )
        if data.ndim != 1:
            raise MatmulInputError(
                f"{fmt.name} weights: data must be 1-D (the packed bytes, rows one after another), "
                f"got shape {data.shape}; pass data.reshape(-1)"
            )
        expected = packed_nbytes(fmt, n, k)
        if data.size != expected:
            raise MatmulInputError(
                f"{fmt.name} weights of W [{n}, {k}]: data has {data.size} bytes, expected {expected} "
                f"({n} rows x {k // fmt.block_size} blocks x {fmt.bytes_per_block} bytes)"
            )
        view = np.ascontiguousarray(data).view()  # the caller's array is never changed
        view.flags.writeable = False
        _check_finite(fmt, view, n, k)
        object.__setattr__(self, "format", fmt.name)
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "data", view)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    @property
    def fmt(self) -> Format:
        return FORMATS[self.format]

    @property
    def nbytes(self) -> int:
        return int(self.data.size)

    @property
    def bits_per_weight(self) -> float:
        return self.fmt.bits_per_weight

    def scales(self) -> np.ndarray:
        """The blocks' scales d as float32 [N, K / 32] (q8_0, q4_0 only)."""
        fmt = self.fmt
        if fmt.block_size == 1:
            raise ValueError(f"{fmt.name} has no block scales")
        return _scales(_blocks(self.data, fmt, self.n, self.k))

    def dequantize(self) -> np.ndarray:
        """W as float32 [N, K]: exactly the weights the format stores."""
        fmt, n, k = self.fmt, self.n, self.k
        if fmt.name == "bf16":
            bits = self.data.view("<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(n, k)
        blocks = _blocks(self.data, fmt, n, k)
        d = _scales(blocks)[..., None]
        if fmt.name == "q8_0":
            q = blocks[..., 2:].view(np.int8).astype(np.float32)
        else:  # q4_0: low nibbles are weights 0..15, high nibbles 16..31
            packed = blocks[..., 2:]
            q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.float32) - np.float32(8)
        return (d * q).reshape(n, k)


def _scales(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0].astype(np.float32)


def _check_finite(fmt: Format, data: np.ndarray, n: int, k: int) -> None:
    if data.size == 0:
        return
    if fmt.name == "bf16":
        bad = (data.view("<u2") & 0x7F80) == 0x7F80  # exponent all ones: an infinity or NaN
        what = "weight"
    else:
        bad = ~np.isfinite(_scales(_blocks(data, fmt, n, k)))
        what = "block scale"
    if bad.any():
        flat = int(np.argmax(bad.reshape(-1)))
        per_row = k // fmt.block_size
        row, block = divmod(flat, per_row)
        where = (
            f"row {row}, column {block}"
            if fmt.name == "bf16"
            else f"row {row}, block {block} (K {block * 32}..{block * 32 + 31})"
        )
        raise MatmulInputError(
            f"{fmt.name} weights: {int(bad.sum())} {what}(s) are infinite or NaN, the first at {where}"
        )


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """roundf: to nearest, halves away from zero, exactly (no x + 0.5, which rounds)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= 0.5), x)


def quantize(w, format: str) -> QuantizedWeights:
    """W [N, K] (any real dtype, read as float32) in ``format``: the bytes gguf.quants.quantize
    gives for the same float32 values. ``w`` is never modified."""
    fmt = format_of(format)
    if not isinstance(w, np.ndarray):
        raise MatmulInputError(f"quantize expects a NumPy array W [N, K], got {type(w).__name__}")
    if isinstance(w, np.ma.MaskedArray):
        raise MatmulInputError("quantize: W is a masked array; pass W.filled(value) or W.data")
    if w.ndim != 2:
        raise MatmulInputError(f"quantize expects a 2-D W [N, K], got a {w.ndim}-D array of shape {w.shape}")
    if not (np.issubdtype(w.dtype, np.floating) or np.issubdtype(w.dtype, np.integer)) and w.dtype.name != "bfloat16":
        raise MatmulInputError(f"quantize expects real numbers, got dtype {w.dtype}")
    n, k = _check_dims(fmt, *w.shape)
    w32 = np.asarray(w, dtype=np.float32)  # a new array unless w already is float32; never written
    if not np.isfinite(w32).all():
        bad = ~np.isfinite(w32)
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise MatmulInputError(
            f"quantize: W has {int(bad.sum())} infinite or NaN values (as float32), the first at [{row}, {col}]"
        )
    if fmt.name == "bf16":
        bits = w32.view(np.uint32).astype(np.uint64)
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16  # round to nearest, ties to even
        out = rounded.astype("<u2")
        overflow = (out & 0x7F80) == 0x7F80
        if overflow.any():
            row, col = (int(v) for v in np.argwhere(overflow)[0])
            raise MatmulInputError(
                f"quantize: W has {int(overflow.sum())} values beyond bfloat16's range (about 3.39e38: they round "
                f"to infinity), the first at [{row}, {col}]"
            )
        return QuantizedWeights("bf16", n, k, out.view(np.uint8).reshape(-1))

    blocks = w32.reshape(n, k // 32, 32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if fmt.name == "q8_0":
            d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
            inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
            q = _round_half_away(blocks * inverse)
            q = np.where(np.isfinite(q), q, np.float32(0)).astype(np.int8).view(np.uint8)
        else:
            index = np.abs(blocks).argmax(axis=-1)[..., None]
            d = np.take_along_axis(blocks, index, axis=-1) / np.float32(-8)
            inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
            q = np.trunc(blocks * inverse + np.float32(8.5))
            q = np.where(np.isfinite(q), q, np.float32(8)).astype(np.uint8).clip(0, 15)
            q = q[..., :16] | (q[..., 16:] << np.uint8(4))
    with np.errstate(over="ignore"):
        scale = d.astype("<f2")
    if np.isinf(scale).any():
        row, block = (int(v) for v in np.argwhere(np.isinf(scale[..., 0]))[0])
        raise MatmulInputError(
            f"quantize: W row {row}, block {block} needs a scale beyond float16's range ({_FP16_MAX:g}); "
            f"{fmt.name} can store weights up to about "
            f"{_FP16_MAX * (127 if fmt.name == 'q8_0' else 8):.3g} in magnitude"
        )
    return QuantizedWeights(fmt.name, n, k, np.concatenate([scale.view(np.uint8), q], axis=-1).reshape(-1))


def int4_operands(weights):
    """(q [N, K] uint8 0..15, scales [N, K/32] float32) of q4_0 weights, weight = scale * (q - 8):
    the operands of torch's int4 kernels (backends/torch_int4.py, peers.py)."""
    n, k = weights.n, weights.k
    blocks = weights.data.reshape(n, k // 32, 18)
    scales = np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0].astype(np.float32)
    packed = blocks[..., 2:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(n, k)  # weights 0..15, then 16..31
    return q, scales
