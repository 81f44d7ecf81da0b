"""Adapter for python/: pure-Python loops on lists of rows, and the tiled CPU model."""

from __future__ import annotations

import numpy as np

from harness.env.sources import load_python_source
from harness.model.core import Backend, Implementation, Prepared
from harness.model.registry import register

# The rates (FLOP/s) a refusal's estimate divides by, as measured: each loop order run three
# times at 320^3 (1.8-2.0 s each; the median, prepared.run() only: the lists are made outside
# it) by CPython 3.11 on an AMD EPYC (family 23, model 49: Zen 2; lscpu's model name "AMD
# EPYC"), 2 cores. At 448^3 (5.4-5.9 s, one run each) each was 7-8% slower.
# About 30-35 MFLOP/s, so 2*512^3 FLOPs (the by-hand text's exercise B) is some 8 seconds and
# 4096^3 over an hour.
PURE_PYTHON_MAX_FLOPS = 2 * 512**3
IJK_RATE = 3.3e7  # 320^3 in 1.97 s
IKJ_RATE = 3.6e7  # 320^3 in 1.82 s
OUTER_RATE = 3.5e7  # 320^3 in 1.87 s
# python.tiled_model pays per NumPy tile product (one per (i, j, p) triple of 16-tiles), not per
# multiply-add: 1100^3 in 1.98 s (median of three, same machine and method), 1.35e9 FLOP/s;
# 1280^3 (3.0 s) ran at 1.39e9, 2048^3 (13.7 s) at 1.25e9.
TILED_MODEL_RATE = 1.35e9


class _ListsPrepared(Prepared):
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


class PythonLoopsBackend(Backend):
    """Calls ``function(a_rows, b_rows) -> c_rows`` from a source file in python/."""

    def __init__(self, function: str):
        self.function = function

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        module = load_python_source(impl.source)
        return _ListsPrepared(getattr(module, self.function), a, b)


class _TiledModelPrepared(Prepared):
    def __init__(self, function, a, b, tile):
        self.function, self.a, self.b, self.tile = function, a, b, tile
        self.output = None
        self.elements_loaded = None

    def run(self) -> None:
        self.output, self.elements_loaded = self.function(self.a, self.b, self.tile)

    def result(self) -> np.ndarray:
        return self.output


class TiledModelBackend(Backend):
    """The chapter-12 ``tiled_matmul(a, b, tile) -> (C, elements_loaded)`` model."""

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        module = load_python_source(impl.source)
        return _TiledModelPrepared(module.tiled_matmul, a, b, int(options["tile"]))


register(
    Implementation(
        name="python.ijk",
        language="python",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="textbook triple loop: each output a dot product of a row and a column",
        backend=PythonLoopsBackend("matmul_ijk"),
        source="python/loops.py",
        max_flops=PURE_PYTHON_MAX_FLOPS,
        slow_rate=IJK_RATE,
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
        max_flops=PURE_PYTHON_MAX_FLOPS,
        slow_rate=IKJ_RATE,
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
        max_flops=PURE_PYTHON_MAX_FLOPS,
        slow_rate=OUTER_RATE,
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
        # about as long as the loops' limit at its measured rate (2*1024^3 was some 10 s at the 2e8
        # FLOP/s once assumed, and 1.6 s in fact); 8192^3 would take some 14 minutes
        max_flops=2 * 1792**3,
        slow_rate=TILED_MODEL_RATE,
    )
)
