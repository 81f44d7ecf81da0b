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
    q4_K   256 weights per super-block, 144 bytes: a float16 d (the scale of the scales), a
           float16 dmin (the scale of the mins), 12 bytes of eight 6-bit scales sc_j and eight
           6-bit mins m_j, then 128 bytes qs. Sub-block j is weights 32j .. 32j + 31:
           weight = d * sc_j * q - dmin * m_j, q a 4-bit quant. The 12 bytes b: for j < 4,
           sc_j = b[j] & 63 and m_j = b[j + 4] & 63; for j >= 4, sc_j = (b[j + 4] & 15) |
           (b[j - 4] >> 6) << 4 and m_j = (b[j + 4] >> 4) | (b[j] >> 6) << 4. qs in four
           chunks of 32 bytes: chunk c's low nibbles are weights 64c .. 64c + 31 (sub-block
           2c), its high nibbles 64c + 32 .. 64c + 63 (sub-block 2c + 1). Quantizing: for each
           sub-block, llama.cpp's search for the scale s_j and min t_j of least weighted
           squared error (make_qkx2_quants), then d = max s / 63 and dmin = max t / 63 in
           float16, sc_j = min(63, nearest(63 * s_j / max s)) (m_j likewise), then each
           q = nearest((w + dmin * m_j) / (d * sc_j)) clamped to 0..15 (where d * sc_j is 0,
           the search's own q are kept).
    bf16   one uint16 per weight: the top half of its float32, rounded to nearest even.

``quantize(w, format)`` gives the same bytes as ``gguf.quants.quantize`` (the gguf package,
llama.cpp's Python reference; tests/test_decode.py checks it bit for bit), computed the same
way: the scale and the quotients in float32, the scale then rounded to float16. The gguf
package has no q4_K quantizer: q4_K's bytes are those of llama.cpp's own C,
quantize_row_q4_K_ref (ggml-quants.c; tests/test_quant_q4k.py checks them bit for bit against
a build of it), its every float32 operation done in the same order (sums one element after
another, never pairwise; a multiply then an add, no fused multiply-add: ggml-quants.c is
compiled for the baseline ISA, even in a GGML_NATIVE build) and its nearest_int (x + 1.5 *
2^23, then the low mantissa bits: halves to even; past 2^22, where the C would assert in a
debug build, the same bits) reproduced, vectorized across sub-blocks.
``QuantizedWeights.dequantize()`` is exact: a float16 scale times a small integer always
fits in a float32, so a kernel that dequantizes to float32 in registers computes with
exactly these weights, and only its float32 sum rounds. For q4_K it is ggml's
dequantize_row_q4_K in float32: d * sc_j and dmin * m_j are exact, d * sc_j * q too, and
only the subtraction of dmin * m_j rounds, once (so a fused multiply-add rounds it the
same); a kernel that computes each weight so has exactly these weights.

Where ggml's own arithmetic is undefined (a block of values below 2^-128, whose 1/d
overflows to infinity, so that w / d is NaN and its integer conversion undefined), the
quotients here are those of a zero block; the scale rounds to float16 zero there anyway, so
the weights are the same zeros either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.model.errors import MatmulInputError
from harness.model.inputs import make_inputs


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
    "q4_K": Format("q4_K", 256, 144, 12),
    "bf16": Format("bf16", 1, 2, 30),
}
_BY_LOWER_NAME = {name.lower(): fmt for name, fmt in FORMATS.items()}

_FP16_MAX = float(np.finfo(np.float16).max)


def format_of(name) -> Format:
    """The Format called ``name`` (in any case: "Q4_K", "q4_k" and "q4_K" are one format), or a
    MatmulInputError listing the known ones."""
    if isinstance(name, str) and name.lower() in _BY_LOWER_NAME:
        return _BY_LOWER_NAME[name.lower()]
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
        """The blocks' scales d as float32 [N, K / 32], weight = d * q (q8_0, q4_0 only). bf16
        has no scales and q4_K two levels of them plus mins (weight = d * sc_j * q - dmin * m_j):
        both raise a ValueError that says so."""
        fmt = self.fmt
        if fmt.block_size == 1:
            raise ValueError(f"{fmt.name} has no block scales")
        if fmt.name == "q4_K":
            raise ValueError(
                "q4_K has no single scale per block: each 32-weight sub-block j has a scale d * sc_j and "
                "a min dmin * m_j (weight = d * sc_j * q - dmin * m_j); use dequantize()"
            )
        return _scales(_blocks(self.data, fmt, self.n, self.k))

    def dequantize(self) -> np.ndarray:
        """W as float32 [N, K]: exactly the weights the format stores."""
        fmt, n, k = self.fmt, self.n, self.k
        if fmt.name == "bf16":
            bits = self.data.view("<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(n, k)
        blocks = _blocks(self.data, fmt, n, k)
        if fmt.name == "q4_K":
            return _dequantize_q4_k(blocks).reshape(n, k)
        d = _scales(blocks)[..., None]
        if fmt.name == "q8_0":
            q = blocks[..., 2:].view(np.int8).astype(np.float32)
        else:  # q4_0: low nibbles are weights 0..15, high nibbles 16..31
            packed = blocks[..., 2:]
            q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.float32) - np.float32(8)
        return (d * q).reshape(n, k)


def _scales(blocks: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0].astype(np.float32)


def _q4_k_scales_and_mins(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q4_K's eight 6-bit scales sc_j and mins m_j per super-block, uint8 [..., 8]
    (ggml's get_scale_min_k4)."""
    b = blocks[..., 4:16]
    low, high, extra = b[..., 0:4], b[..., 4:8], b[..., 8:12]
    sc = np.concatenate([low & 63, (extra & 15) | ((low >> 6) << 4)], axis=-1)
    m = np.concatenate([high & 63, (extra >> 4) | ((high >> 6) << 4)], axis=-1)
    return sc, m


def _dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """[..., 144] super-blocks -> [..., 256] float32, as dequantize_row_q4_K: d1 = d * sc_j and
    m1 = dmin * m_j in float32, then d1 * q - m1 (a multiply, then a subtraction)."""
    d = np.ascontiguousarray(blocks[..., 0:2]).view("<f2")[..., 0].astype(np.float32)
    dmin = np.ascontiguousarray(blocks[..., 2:4]).view("<f2")[..., 0].astype(np.float32)
    sc, m = _q4_k_scales_and_mins(blocks)
    d1 = (d[..., None] * sc.astype(np.float32))[..., None]  # [..., 8, 1]
    m1 = (dmin[..., None] * m.astype(np.float32))[..., None]
    qs = blocks[..., 16:144].reshape(*blocks.shape[:-1], 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*blocks.shape[:-1], 8, 32)  # sub-blocks 2c, 2c + 1
    return (d1 * q.astype(np.float32) - m1).reshape(*blocks.shape[:-1], 256)


def _check_finite(fmt: Format, data: np.ndarray, n: int, k: int) -> None:
    if data.size == 0:
        return
    what = "block scale(s) are"
    if fmt.name == "bf16":
        bad = (data.view("<u2") & 0x7F80) == 0x7F80  # exponent all ones: an infinity or NaN
        count, what = int(bad.sum()), "weight(s) are"
    elif fmt.name == "q4_K":  # two float16 scales per super-block: d and dmin
        pairs = ~np.isfinite(np.ascontiguousarray(_blocks(data, fmt, n, k)[..., 0:4]).view("<f2"))
        bad = pairs.any(axis=-1)
        count, what = int(pairs.sum()), "block scale(s) (d or dmin) are"
    else:
        bad = ~np.isfinite(_scales(_blocks(data, fmt, n, k)))
        count = int(bad.sum())
    if bad.any():
        flat = int(np.argmax(bad.reshape(-1)))
        per_row = k // fmt.block_size
        row, block = divmod(flat, per_row)
        where = (
            f"row {row}, column {block}"
            if fmt.name == "bf16"
            else f"row {row}, block {block} (K {block * fmt.block_size}..{(block + 1) * fmt.block_size - 1})"
        )
        raise MatmulInputError(f"{fmt.name} weights: {count} {what} infinite or NaN, the first at {where}")


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """roundf: to nearest, halves away from zero, exactly (no x + 0.5, which rounds)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= 0.5), x)


def quantize(w, format: str) -> QuantizedWeights:
    """W [N, K] (any real dtype, read as float32) in ``format``: the bytes gguf.quants.quantize
    gives for the same float32 values (q4_K: llama.cpp's quantize_row_q4_K_ref). ``w`` is never
    modified."""
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
    if fmt.name == "q4_K":
        return QuantizedWeights("q4_K", n, k, _quantize_q4_k(w32, n, k))

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


# ---- q4_K: llama.cpp's quantize_row_q4_K_ref (ggml-quants.c), operation for operation ------------
#
# Every array below holds one value per 32-weight sub-block ([S]) or one per weight, laid out
# [32, S] (weight l of every sub-block in one contiguous row), so that C's loop over the 32
# weights of one sub-block becomes 32 whole-row operations, in C's order, for all sub-blocks
# at once. All arithmetic is float32, as C's (float operands, no wider evaluation on x86-64).

_F32 = np.float32
_ROUNDING_MAGIC = _F32(12582912.0)  # 1.5 * 2^23
_CHUNK_WEIGHTS = 1 << 19  # rows of W are quantized a few at a time: about 2 MiB per [32, S] array


def make_decode_inputs(shape, format: str, seed: int = 0, dtype="float32") -> tuple[np.ndarray, QuantizedWeights]:
    """X [M, K] and W [N, K] in ``format``, as a comparison makes a decode problem:
    ``make_inputs``'s seeded A and B, X being A and W being B^T quantized (so that X @ W^T is
    near A @ B). Raises MatmulInputError where ``format`` cannot hold N x K."""
    x, b = make_inputs(shape, dtype, seed)
    return x, quantize(np.ascontiguousarray(b.T), format)


def _nearest_int(value: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: value + 1.5 * 2^23 in float32 (rounding to nearest, halves to even),
    then the low 23 bits of the sum less 2^22, int32. Exact for |value| < 2^22; beyond that,
    and for infinities and NaN, the same bits as the C gives (never an error)."""
    return ((value + _ROUNDING_MAGIC).view(np.int32) & 0x007FFFFF) - 0x00400000


def _sum_in_order(terms: np.ndarray, start: str = "zero") -> np.ndarray:
    """C's ``float s = 0; for (l = 0; l < 32; ++l) s += terms[l];`` along axis 0 (start="first":
    ``s = terms[0]`` and the loop from 1): one float32 addition after another, never pairwise."""
    total = terms[0] + _F32(0) if start == "zero" else terms[0].copy()
    for term in terms[1:]:
        total += term
    return total


def _make_qkx2_quants(x: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants(32, 15, x, weights, L, &the_min, Laux, -1.f, 0.1f, 20, false) for every
    sub-block: x and weights [32, S]; returns (scale [S], the_min [S], L [32, S] uint8)."""
    nmax, rmin, rdelta, nstep = _F32(15), _F32(-1), _F32(0.1), 20
    low, high = x.min(axis=0), x.max(axis=0)  # exact in any order (a zero's sign never matters here)
    low = np.where(low > 0, _F32(0), low)
    flat = high == low  # the C returns early: L = 0, scale 0, the_min = -min
    flat_min = low
    sum_w = _sum_in_order(weights, "first")
    sum_x = _sum_in_order(weights * x, "first")

    def levels(iscale, low):
        return np.clip(_nearest_int(iscale * (x - low)), 0, 15).astype(_F32)

    def error(scale, low, level):
        diff = scale * level + low - x
        return _sum_in_order(weights * (diff * diff))

    iscale = nmax / (high - low)
    scale = _F32(1) / iscale
    best_level = levels(iscale, low)
    best_error = error(scale, low, best_level)
    for step in range(nstep + 1):
        # the C divides by (max - min) with min the best found so far, not the sub-block's minimum
        iscale = (rmin + rdelta * _F32(step) + nmax) / (high - low)
        level = levels(iscale, low)
        weighted = weights * level
        sum_l = _sum_in_order(weighted)
        sum_l2 = _sum_in_order(weighted * level)
        sum_xl = _sum_in_order(weighted * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = this_min > 0
        this_min = np.where(positive, _F32(0), this_min)
        this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        current = error(this_scale, this_min, level)
        better = (det > 0) & (current < best_error)
        best_level = np.where(better, level, best_level)
        best_error = np.where(better, current, best_error)
        scale = np.where(better, this_scale, scale)
        low = np.where(better, this_min, low)
    scale = np.where(flat, _F32(0), scale)
    low = np.where(flat, flat_min, low)
    best_level = np.where(flat, _F32(0), best_level)
    return scale, -low, best_level.astype(np.uint8)


def _quantize_q4_k_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """quantize_row_q4_K_ref for rows of W (float32 [R, K], K a multiple of 256): (d, dmin as
    float16 [B], the 6-bit scales and mins uint8 [B, 8], L uint8 [B, 8, 32]) for its B
    super-blocks."""
    sub = np.ascontiguousarray(x.reshape(-1, 32).T)  # [32, S]: weight l of every sub-block in row l
    sum_x2 = _sum_in_order(sub * sub)
    av_x = np.sqrt(sum_x2 / _F32(32))
    weights = av_x + np.abs(sub)
    scales, mins, level = _make_qkx2_quants(sub, weights)
    scales, mins = scales.reshape(-1, 8), mins.reshape(-1, 8)
    max_scale = np.zeros(scales.shape[0], _F32)
    max_min = np.zeros(scales.shape[0], _F32)
    for j in range(8):  # `if (scale > max_scale) max_scale = scale`, in order
        max_scale = np.where(scales[:, j] > max_scale, scales[:, j], max_scale)
        max_min = np.where(mins[:, j] > max_min, mins[:, j], max_min)
    inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0))[:, None]
    inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0))[:, None]
    # uint8_t ls = nearest_int(...): the int, modulo 256; then MIN(63, ls)
    ls = np.minimum(_nearest_int(inv_scale * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(_nearest_int(inv_min * mins) & 0xFF, 63).astype(np.uint8)
    d = (max_scale / _F32(63)).astype(np.float16)
    dmin = (max_min / _F32(63)).astype(np.float16)
    # the quants again, with the scales as stored; where d * sc_j is 0, L stays make_qkx2_quants's
    step = (d.astype(_F32)[:, None] * ls.astype(_F32)).reshape(-1)
    offset = (dmin.astype(_F32)[:, None] * lm.astype(_F32)).reshape(-1)
    again = np.clip(_nearest_int((sub + offset) / step), 0, 15).astype(np.uint8)
    level = np.where(step != 0, again, level)
    return d, dmin, ls, lm, np.ascontiguousarray(level.T).reshape(-1, 8, 32)


def _quantize_q4_k(w32: np.ndarray, n: int, k: int) -> np.ndarray:
    """W [N, K] float32 -> q4_K's bytes, a few rows at a time, or a MatmulInputError naming the
    first super-block whose d or dmin overflows float16."""
    per_row = k // 256
    out = np.empty((n, per_row, 144), np.uint8)
    if out.size == 0:
        return out.reshape(-1)
    rows = max(1, _CHUNK_WEIGHTS // k)
    for first in range(0, n, rows):
        with np.errstate(divide="ignore", over="ignore", invalid="ignore", under="ignore"):
            d, dmin, ls, lm, level = _quantize_q4_k_rows(w32[first : first + rows])
        overflow = np.isinf(d) | np.isinf(dmin)
        if overflow.any():
            row, block = divmod(int(np.argmax(overflow)), per_row)
            raise MatmulInputError(
                f"quantize: W row {first + row}, block {block} (K {256 * block}..{256 * block + 255}) needs a "
                f"scale beyond float16's range ({_FP16_MAX:g}); q4_K can store weights from about "
                f"{-_FP16_MAX * 63:.3g} to {_FP16_MAX * 63 * 15:.3g}"
            )
        packed = out[first : first + rows].reshape(-1, 144)
        packed[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
        packed[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
        # the 12 bytes of scales and mins: the low 6 bits of sc_0..3 and m_0..3 in bytes 0..7,
        # sc_4..7 and m_4..7's low nibbles in bytes 8..11, their top 2 bits in bytes 0..7's
        packed[:, 4:8] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
        packed[:, 8:12] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
        packed[:, 12:16] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
        # chunk c of 64 weights: sub-block 2c in the low nibbles, 2c + 1 in the high
        packed[:, 16:144] = (level[:, 0::2] | (level[:, 1::2] << 4)).reshape(-1, 128)
    return out.reshape(-1)


def int4_operands(weights):
    """(q [N, K] uint8 0..15, scales [N, K/32] float32) of q4_0 weights, weight = scale * (q - 8):
    the operands of torch's int4 kernels (backends/torch_int4.py, peers.py)."""
    q, scales, _ = int4_group_operands(weights)
    return q, scales


def int4_group_operands(weights):
    """(q [N, K] uint8 0..15, scales and zeros [N, K/32] float32) with weight = (q - 8) * scale +
    zero for each group of 32 along K: torch's group-wise int4 format. q4_0 is it with zeros 0
    (bit for bit); q4_K's sub-blocks are its groups, scale = d * sc_j and zero = 8 * scale -
    dmin * m_j (d * sc_j * q - dmin * m_j; the zero rounds once in float32)."""
    n, k = weights.n, weights.k
    if weights.format == "q4_K":
        blocks = weights.data.reshape(n, k // 256, 144)
        d = np.ascontiguousarray(blocks[..., 0:2]).view("<f2")[..., 0].astype(np.float32)
        dmin = np.ascontiguousarray(blocks[..., 2:4]).view("<f2")[..., 0].astype(np.float32)
        sc, m = _q4_k_scales_and_mins(blocks)
        scales = d[..., None] * sc.astype(np.float32)  # [N, K / 256, 8]: exact (11 x 6 bits)
        zeros = np.float32(8) * scales - dmin[..., None] * m.astype(np.float32)
        qs = blocks[..., 16:144].reshape(n, k // 256, 4, 32)
        q = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(n, k)  # sub-blocks 2c, 2c + 1 of each 64
        return q, scales.reshape(n, k // 32), zeros.reshape(n, k // 32)
    if weights.format != "q4_0":
        raise MatmulInputError(f"int4 operands are made from q4_0 or q4_K weights, not {weights.format}")
    blocks = weights.data.reshape(n, k // 32, 18)
    scales = np.ascontiguousarray(blocks[..., :2]).view("<f2")[..., 0].astype(np.float32)
    packed = blocks[..., 2:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(n, k)  # weights 0..15, then 16..31
    return q, scales, np.zeros_like(scales)
