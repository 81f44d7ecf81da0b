"""NumPy's matmul: the BLAS NumPy links (usually OpenBLAS), the CPU baseline."""

from __future__ import annotations

import numpy as np

from ..core import Implementation
from ..registry import register


class _NumpyPrepared:
    mode = "native"

    def __init__(self, a, b):
        self.a, self.b = a, b
        self.c = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)

    def run(self) -> None:
        np.matmul(self.a, self.b, out=self.c)

    def result(self) -> np.ndarray:
        return self.c.copy()


class NumpyBackend:
    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        return _NumpyPrepared(a, b)


register(
    Implementation(
        name="numpy.matmul",
        language="numpy",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="NumPy's matmul, i.e. its BLAS sgemm/dgemm (the CPU baseline)",
        backend=NumpyBackend(),
        baseline=True,
    )
)
