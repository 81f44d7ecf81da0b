"""llama.cpp's own decode product as ggml-python ships it, as a peer of the decode rows: ggml's
CPU ``ggml_mul_mat``. An older ggml (0.15.3 in ggml-python 0.0.45) set up the simplest way: W
in a plain buffer (no repack) and llamafile's sgemm off. Current llama.cpp as its users run it
is ``llama.cpp.mul_mat`` (backends/llama_cpp.py); this row stays, labelled, for comparison.

``ggml.mul_mat`` is what llama.cpp runs for a Q4_0 or Q8_0 weight matrix on the CPU, through
the ``ggml-python`` package (``pip install ggml-python``, or this project's ``ggml`` extra;
it builds llama.cpp's ggml from source for this CPU, a minute or a few). In prepare, not
timed: a ggml context holding a weight tensor of type Q4_0 / Q8_0 with ne = [K, N] whose
bytes are a copy of ``QuantizedWeights.data`` (the layouts are the same; ggml's own
dequantize of the copy is checked to equal ``dequantize()``), an F32 activation tensor with
ne = [K, M] holding X, the node ``ggml_mul_mat(w, x)`` (ne = [N, M], i.e. Y [M, N] row-major),
its graph, a compute plan and its work buffer, and a ggml thread pool. ``run()`` is
``ggml_graph_compute`` alone.

What ggml computes: it first quantizes each row of X to Q8_0 blocks (32 int8 values and a
float16 scale ``d_x = max|x_block| / 127``, rounded to nearest), then takes each block's
integer dot product with the weights' quants exactly and sums ``d_w * d_x * sum_int`` in
float32. Its weights are exactly the format's; its activations are not X but X rounded to
within ``d_x / 2`` (plus the scale's float16 rounding). So the implementation declares
``activation_rounding="q8_0"`` and is checked with the extra error term that rounding
implies (harness/model/activation_error.py); the plain float32 tolerance, made for kernels that
multiply X itself, is hundreds of times too tight for it.

Threads: the ``threads`` option, as for every threaded row (compare passes its ``threads``,
1 by default); None means every core this process may run on, as c.decode does. The count is
ggml's ``n_threads``, served by one ggml thread pool made in prepare and kept for the row,
as llama.cpp keeps its own.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from harness.backends.c import thread_option
from harness.backends.decode import decode_inputs
from harness.model.core import Backend, Implementation, Prepared
from harness.model.quant import QuantizedWeights
from harness.model.registry import register

INSTALL = "pip install ggml-python, or pip install -e '.[ggml]' (it builds llama.cpp's ggml from source, a few minutes)"
WEIGHTS = ("q4_0", "q8_0")
# Context room beyond the tensors' data: alignment padding and bookkeeping.
_CONTEXT_SLACK = 1 << 20
# Rows of W dequantized at a time by the round-trip check (bounded memory at any N).
_ROUND_TRIP_ROWS = 1024


@lru_cache(maxsize=1)
def _ggml():
    """The ggml module (ggml-python), initialised for the CPU, or the ImportError/OSError."""
    import ggml

    ggml.ggml_cpu_init()
    return ggml


def _ggml_type(ggml, fmt: str) -> int:
    return {"q4_0": ggml.GGML_TYPE_Q4_0, "q8_0": ggml.GGML_TYPE_Q8_0}[fmt]


def ggml_dequantize(weights: QuantizedWeights, rows: slice = slice(None)) -> np.ndarray:
    """ggml's own dequantize (its type traits' ``to_float``) of ``weights.data``, rows
    ``rows`` of W, as float32 [rows, K]: the round trip that says the bytes mean to ggml what
    they mean to quant.py."""
    ggml = _ggml()
    start, stop, _ = rows.indices(weights.n)
    row_bytes = weights.nbytes // weights.n if weights.n else 0
    raw = np.ascontiguousarray(weights.data[start * row_bytes : stop * row_bytes])
    out = np.empty((stop - start, weights.k), np.float32)
    if out.size:
        traits = ggml.ggml_get_type_traits(_ggml_type(ggml, weights.format)).contents
        traits.to_float(ctypes.c_void_p(raw.ctypes.data), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
    return out


def check_round_trip(weights: QuantizedWeights) -> None:
    """Raise if ggml's dequantize of the bytes differs anywhere from ``weights.dequantize()``."""
    for start in range(0, weights.n, _ROUND_TRIP_ROWS):
        stop = min(weights.n, start + _ROUND_TRIP_ROWS)
        row_bytes = weights.nbytes // weights.n
        rows = weights.data[start * row_bytes : stop * row_bytes]
        part = QuantizedWeights(weights.format, stop - start, weights.k, rows)
        ours, theirs = part.dequantize(), ggml_dequantize(weights, slice(start, stop))
        if not np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)):
            row, col = (int(v) for v in np.argwhere(ours.view(np.uint32) != theirs.view(np.uint32))[0])
            raise RuntimeError(
                f"ggml reads these {weights.format} bytes differently: at W[{start + row}, {col}] ggml's dequantize "
                f"gives {theirs[row, col]!r}, quant.py's {ours[row, col]!r}"
            )


class _GgmlPrepared(Prepared):
    def __init__(self, x: np.ndarray, w: QuantizedWeights, threads: int):
        ggml = self._ggml = _ggml()
        m, (n, k) = x.shape[0], w.shape
        wtype = _ggml_type(ggml, w.format)
        data_bytes = w.nbytes + 4 * (m * k + m * n)
        size = data_bytes + 3 * ggml.ggml_tensor_overhead() + ggml.ggml_graph_overhead() + _CONTEXT_SLACK
        self.ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=size, mem_buffer=None, no_alloc=False))
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate a {size / 2**20:.0f} MiB context")
        self.threadpool = None
        self.w = ggml.ggml_new_tensor_2d(self.ctx, wtype, k, n)
        self.x = ggml.ggml_new_tensor_2d(self.ctx, ggml.GGML_TYPE_F32, k, m)
        if ggml.ggml_nbytes(self.w) != w.nbytes:
            raise RuntimeError(
                f"ggml sizes a {w.format} [{n}, {k}] tensor at {ggml.ggml_nbytes(self.w)} bytes, quant.py at {w.nbytes}"
            )
        ctypes.memmove(ggml.ggml_get_data(self.w), w.data.ctypes.data, w.nbytes)
        ctypes.memmove(ggml.ggml_get_data(self.x), x.ctypes.data, x.nbytes)
        self.y = ggml.ggml_mul_mat(self.ctx, self.w, self.x)  # ne = [N, M]: Y [M, N] row-major
        self.graph = ggml.ggml_new_graph(self.ctx)
        ggml.ggml_build_forward_expand(self.graph, self.y)
        params = ggml.ggml_threadpool_params_default(threads)
        self.threadpool = ggml.ggml_threadpool_new(ctypes.byref(params))
        if not self.threadpool:
            raise RuntimeError(f"ggml_threadpool_new failed for {threads} threads")
        self.plan = ggml.ggml_graph_plan(self.graph, threads, self.threadpool)
        self.work = np.empty(max(int(self.plan.work_size), 1), np.uint8)  # X as Q8_0 blocks goes here
        self.plan.work_data = self.work.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        self.plan_ref = ctypes.byref(self.plan)
        self.compute = ggml.ggml_graph_compute
        self.shape = (m, n)

    def run(self) -> None:
        status = self.compute(self.graph, self.plan_ref)
        if status != 0:  # GGML_STATUS_SUCCESS
            raise RuntimeError(f"ggml_graph_compute failed (status {status})")

    def result(self) -> np.ndarray:
        ggml = self._ggml
        out = (ctypes.c_float * (self.shape[0] * self.shape[1])).from_address(ggml.ggml_get_data(self.y))
        return np.ctypeslib.as_array(out).reshape(self.shape).copy()

    def __del__(self):
        ggml = getattr(self, "_ggml", None)
        if ggml is None:
            return
        if getattr(self, "threadpool", None):
            ggml.ggml_threadpool_free(self.threadpool)
            self.threadpool = None
        if getattr(self, "ctx", None):
            ggml.ggml_free(self.ctx)
            self.ctx = None


class GgmlBackend(Backend):
    """ggml's CPU mul_mat through ggml-python (see the module docstring)."""

    def unavailable_reason(self, impl):
        try:
            _ggml()
        except ImportError:
            return f"ggml-python is not installed: {INSTALL}"
        except OSError as error:  # the package is there, its shared library does not load
            return f"ggml-python's library does not load ({error}); reinstall it: {INSTALL}"
        return None

    def describe(self, impl) -> str | None:
        ggml = _ggml()
        simd = [
            name
            for name in ("avx512", "avx2", "avx", "neon")
            if getattr(ggml, f"ggml_cpu_has_{name}", None) and getattr(ggml, f"ggml_cpu_has_{name}")()
        ][:1]
        version = ggml.ggml_version().decode()
        return f"ggml {version} (ggml-python {ggml.__version__}), CPU" + (f" {simd[0].upper()}" if simd else "")

    def prepare(self, impl, a, b, options):
        x, b = decode_inputs(impl, a, b)  # every decode row's checks: W's format, X's dtype, shape and values
        threads = thread_option(impl, options)
        check_round_trip(b)
        return _GgmlPrepared(x, b, threads)


register(
    Implementation(
        name="ggml.mul_mat",
        language="ggml",
        device="cpu",
        dtypes=("float32",),
        weights=WEIGHTS,
        summary="ggml-python's older ggml (0.15): ggml_mul_mat, plain buffer, no repack, no llamafile (a peer)",
        backend=GgmlBackend(),
        options={"threads": None},
        threaded=True,
        peer=True,
        activation_rounding="q8_0",
    )
)
