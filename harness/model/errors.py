"""The errors of the model: what a refused input, a wrong result, or an implementation that
cannot run raises. Apart from core.py, so that the weight formats (quant.py), which core
validates, can raise them without importing core."""

from __future__ import annotations


class MatmulInputError(ValueError):
    """Inputs an implementation cannot take: wrong ndim, shapes, dtype, or size."""


class ResultError(RuntimeError):
    """An implementation returned something other than an array of the problem's dtype and shape."""


class UnavailableError(RuntimeError):
    """The implementation cannot run on this machine (no GPU, a package missing, ...)."""


class BrokenError(UnavailableError):
    """The implementation should run here, but its build or load failed (the C library did not
    build, MATMUL_C_LIBRARY names a library that is not ours): a fault to fix, which a
    comparison reports as an error, unlike a machine that lacks a GPU or a package."""


__all__ = ["BrokenError", "MatmulInputError", "ResultError", "UnavailableError"]
