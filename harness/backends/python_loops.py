"""Adapter for python/: pure-Python loops on lists of rows, and the tiled CPU model."""

from __future__ import annotations

import numpy as np

from ..core import Implementation
from ..registry import register
from ..sources import load_python_source

# Pure CPython manages roughly 10-20 MFLOP/s; 2*512^3 FLOPs (the by-hand text's exercise B)
# is a few tens of seconds, 4096^3 would be hours.
PURE_PYTHON_MAX_FLOPS = 2 * 512**3
PURE_PYTHON_RATE = 1.5e7


class _ListsPrepared:
    mode = "native"

    def __init__(self, function, a, b):
        self.function = function
        self.dtype = a.dtype
        self.shape = (a.shape[0], b.shape[1])
        self.a_rows = a.astype(np.float64).tolist()  # Python floats: conversion is not timed
        self.b_rows = b.astype(np.float64).tolist()
        self.output = None

    def run(self) -> None:
        self.output = self.function(self.a_rows, self.b_rows)

    def result(self) -> np.ndarray:
        return np.array(self.output, dtype=np.float64).reshape(self.shape).astype(self.dtype)


class PythonLoopsBackend:
    """Calls ``function(a_rows, b_rows) -> c_rows`` from a source file in python/."""

    def __init__(self, function: str):
        self.function = function

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        module = load_python_source(impl.source)
        return _ListsPrepared(getattr(module, self.function), a, b)


class _TiledModelPrepared:
    mode = "native"

    def __init__(self, function, a, b, tile):
        self.function, self.a, self.b, self.tile = function, a, b, tile
        self.output = None
        self.elements_loaded = None

    def run(self) -> None:
        self.output, self.elements_loaded = self.function(self.a, self.b, self.tile)

    def result(self) -> np.ndarray:
        return self.output


class TiledModelBackend:
    """The chapter-12 ``tiled_matmul(a, b, tile) -> (C, elements_loaded)`` model."""

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        module = load_python_source(impl.source)
        return _TiledModelPrepared(module.tiled_matmul, a, b, int(options["tile"]))


_slow = dict(max_flops=PURE_PYTHON_MAX_FLOPS, slow_rate=PURE_PYTHON_RATE)

register(
    Implementation(
        name="python.ijk",
        language="python",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="textbook triple loop: each output a dot product of a row and a column",
        backend=PythonLoopsBackend("matmul_ijk"),
        source="python/loops.py",
        **_slow,
    )
)
register(
    Implementation(
        name="python.ikj",
        language="python",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="i, p, j order: each row of C a running sum of scaled rows of B",
        backend=PythonLoopsBackend("matmul_ikj"),
        source="python/loops.py",
        **_slow,
    )
)
register(
    Implementation(
        name="python.outer",
        language="python",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="sum of outer products: one rank-1 update of all of C per k",
        backend=PythonLoopsBackend("matmul_outer"),
        source="python/loops.py",
        **_slow,
    )
)
register(
    Implementation(
        name="python.tiled_model",
        language="python",
        device="cpu",
        dtypes=("float32",),
        summary="chapter-12 tiled kernel modelled on the CPU with NumPy tiles; counts its loads",
        backend=TiledModelBackend(),
        source="python/tiling.py",
        options={"tile": 16},
        # one NumPy tile product per (i, j, p) triple: about 2e8 FLOP/s, so 8192^3 takes 1.5 hours
        max_flops=2 * 1024**3,
        slow_rate=2e8,
    )
)
