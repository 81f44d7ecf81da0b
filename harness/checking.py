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
    got = result.astype(np.float64)
    finite_a = a[np.isfinite(a.astype(np.float64))].astype(np.float64)
    finite_b = b[np.isfinite(b.astype(np.float64))].astype(np.float64)
    scale = (np.abs(finite_a).max() if finite_a.size else 0.0) * (np.abs(finite_b).max() if finite_b.size else 0.0)
    atol, rtol = tolerance(result.dtype if result.dtype != object else a.dtype, a.shape[1], scale)

    ref_nan, got_nan = np.isnan(ref), np.isnan(got)
    ref_inf, got_inf = np.isinf(ref), np.isinf(got)
    if np.any(got_nan & ~ref_nan):
        return CheckOutcome(False, float("nan"), f"{int(np.sum(got_nan & ~ref_nan))} NaN where the reference has a number")
    if np.any(ref_nan & ~got_nan):
        return CheckOutcome(False, float("nan"), f"{int(np.sum(ref_nan & ~got_nan))} numbers where the reference has NaN")
    if np.any(ref_inf != got_inf) or np.any(ref[ref_inf] != got[ref_inf]):
        return CheckOutcome(False, float("inf"), "infinities differ from the reference")
    finite = ~ref_nan & ~ref_inf
    error = np.abs(got[finite] - ref[finite])
    allowed = atol + rtol * np.abs(ref[finite])
    max_error = float(error.max()) if error.size else 0.0
    bad = error > allowed
    if np.any(bad):
        worst = int(np.argmax(error - allowed))
        return CheckOutcome(
            False,
            max_error,
            f"{int(bad.sum())} of {error.size} elements out of tolerance "
            f"(worst error {error[worst]:.3g}, allowed {allowed[worst]:.3g})",
        )
    return CheckOutcome(True, max_error, "ok")
