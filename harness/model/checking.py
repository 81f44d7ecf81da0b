"""One reference and one error model for every implementation.

The reference is the float64 product of exactly the inputs the implementation saw (a bfloat16
input is rounded once on the host, and the reference multiplies those rounded values). With
it come two per-element magnitudes, both in float64: ``|C|_ij`` and the terms' norm
``T_ij = sqrt(sum_k (a_ik b_kj)^2)`` (one more product, ``(A*A) @ (B*B)``).

The error model. A kernel sums the K products ``a_ik b_kj`` in some order in an accumulator
with unit roundoff ``u_acc`` (float32 for float16 and bfloat16 inputs, as tensor cores and
Triton accumulate; the dtype's own otherwise), then rounds the sum to the output dtype (unit
roundoff ``u``). Each addition rounds its partial sum with a relative error of at most
``u_acc``; modelled as independent and zero-mean (round to nearest), the K errors add up like a
random walk, so the accumulated error stays within a few ``u_acc * sqrt(K)`` times the typical
partial sum. A partial sum is at most about ``|C| + T`` in magnitude: ``|C|`` when the terms
share a sign and the sum grows steadily, ``T`` when signs are mixed and it wanders. So, per
element,

    allowed_ij = 2 * u * |C_ij| + SAFETY * u_acc * sqrt(K) * (|C_ij| + T_ij) + floor

with SAFETY = 4, ``2 * u`` one unit in the last place of the output (rounding to nearest
costs half of it; some converters truncate, as Triton's CPU interpreter does to bfloat16), and
``floor`` the dtype's smallest normal number (underflow). This is a
statistical bound, not a worst case: the worst-case bound ``K * u_acc * (|A| @ |B|)_ij`` is
hundreds of times larger and would pass a kernel that drops a term of the sum. Honest kernels
sit well inside it (the tests draw large K, sums of non-negative terms, mixed magnitudes and
values near overflow); the classic wrong kernels (a dropped term, a shifted or transposed
output, one element off, a result rounded through a narrower dtype, TF32 for an FP32 problem)
fall outside it.

Infinities and NaNs: where the reference is NaN the result must be NaN; where it is +-Inf
(infinite inputs) the result must be the same infinity. A result of +-Inf where the reference
is finite is correct when the exact value overflows the output dtype (``|C_ij| + allowed_ij``
reaches its largest finite value, same sign). Where the terms' magnitudes can carry a partial
sum past the accumulator's range (``sqrt(K) * T_ij`` beyond its largest finite value), an
infinity of the exact result's sign is accepted, and if the exact result is in range, an
intermediate overflow is legitimate: any infinity or NaN is accepted. Anything else that is
not finite fails, so a broken kernel never passes and never reports inflated speed.

The result must also have the problem's dtype and shape: an FP32 problem answered in FP16
fails, whatever its values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from harness.model.activation_error import extra_allowed
from harness.model.inputs import dtype_name, numpy_dtype
from harness.model.quant import QuantizedWeights

ACCUMULATES_IN = {"float16": "float32", "bfloat16": "float32"}
SAFETY = 4.0


@lru_cache(maxsize=None)
def _limits(name: str) -> tuple[float, float, float]:
    """(unit roundoff, largest finite, smallest normal) of a dtype, from its finfo."""
    import ml_dtypes

    info = ml_dtypes.finfo(numpy_dtype(name))  # ml_dtypes.finfo knows NumPy's dtypes and bfloat16
    return float(info.eps) / 2, float(info.max), float(info.smallest_normal)


@dataclass(frozen=True)
class Reference:
    """The float64 product and the terms' norm T (see the module docstring)."""

    product: np.ndarray
    terms_norm: np.ndarray


def reference(a, b) -> np.ndarray:
    """C = A @ B in float64."""
    return np.matmul(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))


def reference_data(a, b, product: np.ndarray | None = None) -> Reference:
    a64 = np.asarray(a, dtype=np.float64)
    b64 = np.asarray(b, dtype=np.float64)
    product = np.matmul(a64, b64) if product is None else product
    with np.errstate(over="ignore", invalid="ignore"):
        terms_norm = np.sqrt(np.matmul(a64 * a64, b64 * b64))
    return Reference(product, terms_norm)


def tolerance(dtype, k: int, product, terms_norm):
    """``allowed`` per element (an array like ``product``), for a result in ``dtype`` of a
    product with inner dimension ``k``. Works on NumPy arrays and torch tensors alike."""
    name = dtype_name(dtype)
    if name not in ("float64", "float32", "float16", "bfloat16"):
        raise TypeError(f"no error model for dtype {name}")
    u_out, _, smallest_normal = _limits(name)
    u_acc = _limits(ACCUMULATES_IN.get(name, name))[0]
    magnitude = abs(product)
    return 2 * u_out * magnitude + SAFETY * u_acc * max(int(k), 1) ** 0.5 * (magnitude + terms_norm) + smallest_normal


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    max_abs_error: float
    message: str
    worst_ratio: float = 0.0  # max over elements of error / allowed: below 1 passes

    def __bool__(self) -> bool:
        return self.passed


def check(result, a, b, ref=None, *, activation_rounding: str | None = None) -> CheckOutcome:
    """Compare ``result`` with the float64 reference of ``a @ b`` (``ref``: the float64
    product, or a ``Reference``; computed here when not given). ``activation_rounding``
    ("q8_0"): the result is of a kernel that rounds A that way before multiplying
    (``Implementation.activation_rounding``); the error that implies is allowed on top
    (harness/model/activation_error.py).

    ``b`` may be decode weights (``harness.quant.quantize(w, "q8_0")``, W [N, K]): the result
    is then Y = X @ W^T, checked against X times the weights the format holds
    (``b.dequantize()``, exact in float32), as a comparison checks its decode rows."""

    a = np.asarray(a)
    if isinstance(b, QuantizedWeights):
        b = b.dequantize().T
    b = np.asarray(b)
    if not isinstance(ref, Reference):
        ref = reference_data(a, b, ref)
    result = np.asarray(result)
    if result.shape != ref.product.shape:
        return CheckOutcome(False, float("inf"), f"result shape {result.shape}, expected {ref.product.shape}")
    # by value: a big-endian float32 problem answered in native float32 has the right dtype
    if result.dtype.newbyteorder("=") != a.dtype.newbyteorder("="):
        return CheckOutcome(
            False,
            float("inf"),
            f"result dtype {dtype_name(result.dtype)}, expected the problem's {dtype_name(a.dtype)}",
        )
    if ref.product.size == 0:
        return CheckOutcome(True, 0.0, "empty result")
    extra = None
    if activation_rounding is not None:
        extra = extra_allowed(a, b, activation_rounding)
    return compare_elements(np, result.astype(np.float64), ref.product, ref.terms_norm, a.dtype, a.shape[1], extra)


def compare_elements(xp, got, ref, terms_norm, dtype, k: int, extra=None) -> CheckOutcome:
    """The error model on float64 arrays of one array library ``xp``: NumPy, or torch for
    tensors on a GPU (harness.backends.gpu.DeviceProblem), where an 8192^2 product is checked in
    milliseconds. ``dtype`` is the problem's; ``k`` the inner dimension; ``extra``, where
    given, is added to the allowance per element (activation_error.py)."""
    name = dtype_name(dtype)
    allowed = tolerance(name, k, ref, terms_norm)
    if extra is not None:
        allowed = allowed + extra
    largest_out = _limits(name)[1]
    largest_acc = _limits(ACCUMULATES_IN.get(name, name))[1]
    ref_nan, got_nan = xp.isnan(ref), xp.isnan(got)
    ref_inf, got_inf = xp.isinf(ref), xp.isinf(got)
    # partial sums can leave the accumulator's range; for a result in range that makes any
    # infinity or NaN legitimate (which one depends on the order of the sum)
    may_overflow = ~(terms_norm * max(int(k), 1) ** 0.5 < largest_acc)
    intermediate = may_overflow & (abs(ref) < largest_out)

    if (ref_nan & ~got_nan).any():
        return CheckOutcome(
            False, float("nan"), f"{int((ref_nan & ~got_nan).sum())} numbers where the reference has NaN"
        )
    wrong_nan = got_nan & ~ref_nan & ~intermediate
    if wrong_nan.any():
        return CheckOutcome(False, float("nan"), f"{int(wrong_nan.sum())} NaN where the reference has a number")
    if (ref_inf & (got != ref)).any():
        return CheckOutcome(False, float("inf"), "infinities differ from the reference")
    overflowed = got_inf & ~ref_inf & ~ref_nan
    reaches_range = (abs(ref) + allowed >= largest_out) | may_overflow
    legitimate = (reaches_range & (xp.sign(got) == xp.sign(ref))) | intermediate
    if (overflowed & ~legitimate).any():
        return CheckOutcome(
            False,
            float("inf"),
            f"{int((overflowed & ~legitimate).sum())} infinities where the exact result is finite "
            f"and within the {name} range",
        )

    finite = ~ref_nan & ~ref_inf & ~got_nan & ~got_inf
    error = abs(got[finite] - ref[finite])
    bound = allowed[finite]
    if not error.shape[0]:
        return CheckOutcome(True, 0.0, "ok")
    ratio = error / bound
    worst = int(xp.argmax(ratio))
    max_error, worst_ratio = float(error.max()), float(ratio[worst])
    bad = ratio > 1
    if bad.any():
        return CheckOutcome(
            False,
            max_error,
            f"{int(bad.sum())} of {error.shape[0]} elements out of tolerance "
            f"(worst error {float(error[worst]):.3g}, allowed {float(bound[worst]):.3g})",
            worst_ratio,
        )
    return CheckOutcome(True, max_error, "ok", worst_ratio)
