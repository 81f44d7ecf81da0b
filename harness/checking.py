"""One reference and one tolerance for every implementation.

The reference is NumPy in float64 on exactly the inputs the implementation saw (a bfloat16
input is rounded once on the host, and the reference multiplies those rounded values).
A result passes when, element by element,

    |result - reference| <= atol + rtol * |reference|

with (atol, rtol) from ``tolerance``; where the reference is NaN the result must be NaN,
where it is +-Inf the result must be the same infinity, and a NaN or Inf where the reference
is finite is a failure: a broken kernel must never pass (and never report inflated speed).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .inputs import dtype_name

_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def reference(a, b) -> np.ndarray:
    """C = A @ B in float64."""
    return np.matmul(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))


def tolerance(dtype, k: int, scale: float = 1.0) -> tuple[float, float]:
    """(atol, rtol) for a product with inner dimension ``k`` in ``dtype``.

    rtol covers rounding the result to ``dtype``. atol covers the accumulation: each of the K
    additions may round, with an error of eps times the running sum, which the classic bound
    keeps under K * eps * max|A| * max|B| per term; ``scale`` is max|A| * max|B|. Half-precision
    inputs accumulate in float32 (as tensor cores and Triton do), so their accumulation uses
    float32's eps.
    """
    name = dtype_name(dtype)
    if name not in _EPS:
        raise TypeError(f"no tolerance defined for dtype {name}")
    eps_out = _EPS[name]
    eps_acc = _EPS["float32"] if name in ("float16", "bfloat16") else eps_out
    rtol = 4.0 * eps_out
    atol = 2.0 * eps_acc * max(int(k), 1) * max(float(scale), np.finfo(np.float64).tiny)
    return atol, rtol


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    max_abs_error: float
    message: str

    def __bool__(self) -> bool:
        return self.passed


def check(result, a, b, ref=None) -> CheckOutcome:
    """Compare ``result`` with the float64 reference of ``a @ b``."""
    a = np.asarray(a)
    b = np.asarray(b)
    ref = reference(a, b) if ref is None else ref
    result = np.asarray(result)
    if result.shape != ref.shape:
        return CheckOutcome(False, float("inf"), f"result shape {result.shape}, expected {ref.shape}")
    if ref.size == 0:
        return CheckOutcome(True, 0.0, "empty result")
    dtype = result.dtype if result.dtype != object else a.dtype
    return compare_elements(np, result.astype(np.float64), ref, a.astype(np.float64), b.astype(np.float64),
                            dtype, a.shape[1])


def _finite_abs_max(xp, x) -> float:
    values = xp.abs(x[xp.isfinite(x)])
    return float(values.max()) if values.shape[0] else 0.0


def compare_elements(xp, got, ref, a, b, dtype, k: int) -> CheckOutcome:
    """This module's rule, on float64 arrays of one array library ``xp``: NumPy, or torch for
    tensors on a GPU (harness.gpu.check), where an 8192^2 product is checked in milliseconds
    instead of seconds. ``dtype`` is the result's; ``k`` the inner dimension."""
    scale = _finite_abs_max(xp, a) * _finite_abs_max(xp, b)
    atol, rtol = tolerance(dtype, k, scale)

    ref_nan, got_nan = xp.isnan(ref), xp.isnan(got)
    ref_inf, got_inf = xp.isinf(ref), xp.isinf(got)
    if (got_nan & ~ref_nan).any():
        return CheckOutcome(False, float("nan"), f"{int((got_nan & ~ref_nan).sum())} NaN where the reference has a number")
    if (ref_nan & ~got_nan).any():
        return CheckOutcome(False, float("nan"), f"{int((ref_nan & ~got_nan).sum())} numbers where the reference has NaN")
    if (ref_inf != got_inf).any() or (ref[ref_inf] != got[ref_inf]).any():
        return CheckOutcome(False, float("inf"), "infinities differ from the reference")
    finite = ~ref_nan & ~ref_inf
    error = xp.abs(got[finite] - ref[finite])
    allowed = atol + rtol * xp.abs(ref[finite])
    max_error = float(error.max()) if error.shape[0] else 0.0
    bad = error > allowed
    if bad.any():
        worst = int(xp.argmax(error - allowed))
        return CheckOutcome(
            False,
            max_error,
            f"{int(bad.sum())} of {error.shape[0]} elements out of tolerance "
            f"(worst error {float(error[worst]):.3g}, allowed {float(allowed[worst]):.3g})",
        )
    return CheckOutcome(True, max_error, "ok")
