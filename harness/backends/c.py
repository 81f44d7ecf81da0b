"""Adapter for c/: the C matmuls in the CMake-built shared library, called through cffi.

cffi releases the GIL for the duration of each C call, so the functions may run on several
Python threads at once; that is safe because none of them keeps static state.
"""
from __future__ import annotations

import numpy as np

from .. import clib
from ..core import Implementation

_SUFFIX = {"float32": ("f32", "float"), "float64": ("f64", "double")}


class _CPrepared:
    mode = "native"

    def __init__(self, function, ffi, a, b, extra_args):
        suffix, ctype = _SUFFIX[a.dtype.name]
        self.a, self.b = a, b  # keep the arrays alive while C holds pointers into them
        self.c = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        self.args = (
            ffi.from_buffer(f"{ctype}[]", a),
            ffi.from_buffer(f"{ctype}[]", b),
            ffi.from_buffer(f"{ctype}[]", self.c),
            a.shape[0], b.shape[1], a.shape[1],
            *extra_args,
        )
        self.function = function

    def run(self) -> None:
        status = self.function(*self.args)  # None for void kernels; nonzero int = failure
        if status:
            raise MemoryError(f"C kernel failed with status {status} (could not allocate its buffers)")

    def result(self) -> np.ndarray:
        return self.c.copy()


class CBackend:
    """Calls ``matmul_<kernel>_<f32|f64>(A, B, C, M, N, K, *options)`` from the C library.

    ``option_names`` lists, in the C signature's order, the implementation options passed
    after K (e.g. the blocked kernel's tile size).
    """

    def __init__(self, kernel: str, option_names: tuple[str, ...] = ()):
        self.kernel = kernel
        self.option_names = option_names

    def unavailable_reason(self, impl):
        try:
            clib.load()
        except clib.CLibraryError as error:
            return str(error).splitlines()[0]
        return None

    def extra_args(self, impl, options):
        values = [int(options[name]) for name in self.option_names]
        if "tile" in self.option_names and values[self.option_names.index("tile")] < 1:
            raise ValueError(f"{impl.name}: tile must be >= 1, got {options['tile']}")
        return values

    def prepare(self, impl, a, b, options):
        ffi, lib = clib.load()
        suffix = _SUFFIX[a.dtype.name][0]
        function = getattr(lib, f"matmul_{self.kernel}_{suffix}")
        return _CPrepared(function, ffi, a, b, self.extra_args(impl, options))


IMPLEMENTATIONS = [
    Implementation(
        "c.naive_ijk", "c", "cpu", ("float32", "float64"),
        "textbook triple loop in C: strided column walk, serial sum, no SIMD",
        CBackend("naive_ijk"), source="c/naive.c",
    ),
    Implementation(
        "c.naive_ikj", "c", "cpu", ("float32", "float64"),
        "i, p, j order in C: unit-stride inner loop the compiler vectorizes",
        CBackend("naive_ikj"), source="c/naive.c",
    ),
    Implementation(
        "c.blocked", "c", "cpu", ("float32", "float64"),
        "ikj run tile by tile so a tile of B is reused from cache",
        CBackend("blocked", ("tile",)), source="c/blocked.c", options={"tile": 64},
    ),
]
