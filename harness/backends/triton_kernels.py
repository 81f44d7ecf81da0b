"""Adapter for triton/: the Triton matmuls and GEMV, native on a GPU, interpreted without one.

(Named triton_kernels, not triton, so that nothing here can be mistaken for the real package.)

With a CUDA GPU the sources are compiled by Triton and autotuned; ``run`` synchronises, and
``time`` uses the cuBLAS baseline's timer (``harness.backends.gpu.time_cuda``: CUDA events, the L2
flushed before every repeat), so the two are measured alike.

Without one they run on Triton's CPU interpreter, on CPU torch tensors, as a correctness
check only: the Prepared's mode is "interpreted", so tables mark the rows and nothing times
them. The interpreter is made strict for each launch (``StrictInterpreter``): masked-off lanes
of a load without ``other`` read NaN, an unmasked access outside the kernel's tensors is an
error, and TF32 dots round their FP32 operands as the GPU does. The interpreter has to be
chosen before Triton builds its kernels: ``@triton.jit``
reads TRITON_INTERPRET when it decorates a function, and that includes the helpers inside
``triton.language`` (``tl.zeros`` and friends), decorated when ``triton.language`` is first
imported. So:

- at import (``import harness``), if Triton is not imported yet, TRITON_INTERPRET is unset,
  and this machine plainly has no GPU (no NVIDIA or AMD device nodes, or macOS), it sets
  TRITON_INTERPRET=1 for the process: the earliest moment the harness gets;
- otherwise it decides at first use: TRITON_INTERPRET as the user set it, else native when
  ``torch.cuda.is_available()``, else it sets TRITON_INTERPRET=1 then;
- if ``triton.language`` was already imported without the interpreter, the kernels would fail
  inside it: the implementations then report themselves unavailable, saying to set
  TRITON_INTERPRET=1 before starting Python (or to import harness before triton).
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache

import numpy as np

from harness.backends import gpu
from harness.backends.decode import decode_inputs
from harness.backends.gpu import to_numpy
from harness.env.sources import load_python_source
from harness.model.core import Backend, BrokenError, Implementation, Prepared
from harness.model.registry import register
from harness.model.timing import Timing

INTERPRET_ENV = "TRITON_INTERPRET"
INTERPRETED_SECONDS_PER_PROGRAM = 3e-3
INTERPRETED_SECONDS_PER_STEP = 3e-3
_TRUE = ("1", "true", "on", "yes")  # what Triton itself reads as true


def _plainly_no_gpu() -> bool:
    """True only where a GPU is certainly absent; cheap (no torch, no driver calls)."""
    if sys.platform == "darwin":
        return True  # no CUDA on macOS
    if sys.platform.startswith("linux"):
        # CUDA cannot run without /dev/nvidiactl, nor ROCm without /dev/kfd.
        return not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd", "/proc/driver/nvidia"))
    return False  # elsewhere, leave it to torch at first use


if INTERPRET_ENV not in os.environ and "triton" not in sys.modules and _plainly_no_gpu():
    os.environ[INTERPRET_ENV] = "1"


def _language_interpreted() -> bool | None:
    """Whether triton.language's own jitted helpers were built for the interpreter."""
    from triton.language import standard

    kinds = {type(v).__name__ for v in vars(standard).values()} & {"JITFunction", "InterpretedFunction"}
    if not kinds:
        return None  # a Triton that keeps no jitted helpers there: nothing to check
    return kinds == {"InterpretedFunction"}


@lru_cache(maxsize=None)
def setup() -> tuple[str | None, str | None]:
    """(mode, None) with mode "native" or "interpreted", or (None, why neither can run)."""
    try:
        import torch
    except ImportError as error:
        return None, f"needs PyTorch ({error}); pip install torch"
    value = os.environ.get(INTERPRET_ENV)
    if value is None:
        interpret = not torch.cuda.is_available()
        if interpret:
            os.environ[INTERPRET_ENV] = "1"
    else:
        interpret = value.strip().lower() in _TRUE
        if not interpret and not torch.cuda.is_available():
            return None, f"no CUDA GPU here, and {INTERPRET_ENV}={value} rules out Triton's CPU interpreter"
    try:
        import triton

        if getattr(triton, "__file__", None) is None:  # a namespace package: some folder named triton
            raise ImportError(f"import triton found only the folder(s) {', '.join(triton.__path__)}")
        import triton.language  # noqa: F401
    except ImportError as error:
        return None, f"needs Triton ({error}); pip install triton (Linux)"
    if interpret and _language_interpreted() is False:
        return None, (
            f"Triton was imported before {INTERPRET_ENV}=1 was set, so its kernels would fail in the "
            f"interpreter; start Python with {INTERPRET_ENV}=1 (or import harness before triton)"
        )
    if not interpret and _language_interpreted() is True:
        return None, f"Triton was imported with {INTERPRET_ENV} on; restart Python without it to run natively"
    return ("interpreted" if interpret else "native"), None


def load_source(relative: str):
    """The Triton source, built for the mode ``setup`` chose (raises if it cannot be)."""
    mode, reason = setup()
    if reason:
        raise RuntimeError(reason)
    want = mode == "interpreted"
    module = load_python_source(relative)
    missing = [
        f"{name} ({meaning})" for name, meaning in TritonBackend.SOURCE_NAMES.items() if not hasattr(module, name)
    ]
    if missing:  # a rung being written: a fault to fix, said in its row
        raise BrokenError(f"{relative} defines no {'; no '.join(missing)}")
    if module.INTERPRETED != want:  # loaded earlier in this process, with the environment changed since
        raise RuntimeError(
            f"{relative} was built {'for the interpreter' if module.INTERPRETED else 'natively'} "
            f"but this process now runs Triton {mode}; restart Python"
        )
    return module


# --- NumPy <-> torch (back to NumPy: gpu.to_numpy, which takes CPU tensors too) -------------
def to_torch(array: np.ndarray, device: str):
    """A new torch tensor holding ``array`` (never a view of it: inputs must stay untouched)."""
    import torch

    array = np.array(array, copy=True, order="C")
    if array.dtype.name == "bfloat16":
        # torch.from_numpy knows no ml_dtypes.bfloat16: move the bits as int16 and relabel them.
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(array).to(device)


# --- the interpreter made strict --------------------------------------------------------------------
class StrictInterpreter:
    """Triton's interpreter, for one interpreted launch, made to fail where the GPU could differ:

    - a masked load without ``other`` reads NaN in its masked-off lanes (the interpreter gives
      zeros; the GPU gives whatever the registers held), so a kernel that relies on them fails;
    - an unmasked lane that loads or stores outside every tensor the kernel was given (their
      storages' bytes) raises IndexError: a guard past each input, where the interpreter would
      read or write whatever lies there;
    - each tl.dot's requested ``input_precision`` is recorded (``precisions``), and TF32 is
      carried out as TF32 (FP32 operands rounded to 10 mantissa bits, as the tensor cores do),
      so FP32 multiplied in TF32 fails an FP32 tolerance as it would on the GPU.

    It patches the interpreter's builder while the launch runs (the interpreter has one, shared
    by the process): a context manager, not reentrant.
    """

    def __init__(self):
        self.precisions: list[str] = []
        self._ranges: list[tuple[int, int]] = []
        self._saved = {}

    def __enter__(self):
        from triton.runtime import interpreter

        builder, executor = interpreter.InterpreterBuilder, interpreter.GridExecutor
        self._saved = {
            (builder, "create_masked_load"): builder.create_masked_load,
            (builder, "create_masked_store"): builder.create_masked_store,
            (builder, "create_dot"): builder.create_dot,
            (executor, "_init_args_hst"): executor._init_args_hst,
        }
        strict = self
        load, store, dot, init_args = (self._saved[key] for key in self._saved)

        def init_args_hst(grid, args_dev, kwargs):
            args_hst, kwargs_hst = init_args(grid, args_dev, kwargs)
            strict._ranges = []
            for arg in [*args_hst, *kwargs_hst.values()]:
                tensor = getattr(arg, "base", arg)  # a tensor descriptor's tensor
                if hasattr(tensor, "untyped_storage"):
                    storage = tensor.untyped_storage()
                    strict._ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
            return args_hst, kwargs_hst

        def masked_load(builder_self, ptrs, mask, other, cache_policy, is_volatile):
            strict._check_bounds(ptrs, mask, "load")
            dtype_np = interpreter._get_np_dtype(ptrs.get_element_ty())
            if other is None and np.issubdtype(dtype_np, np.floating):
                other = interpreter.TensorHandle(np.full_like(ptrs.data, np.nan, dtype=dtype_np), ptrs.get_element_ty())
            return load(builder_self, ptrs, mask, other, cache_policy, is_volatile)

        def masked_store(builder_self, ptrs, value, mask, cache_policy):
            strict._check_bounds(ptrs, mask, "store")
            return store(builder_self, ptrs, value, mask, cache_policy)

        def strict_dot(builder_self, a, b, d, input_precision, max_num_imprecise_acc):
            precision = getattr(input_precision, "name", str(input_precision)).lower()
            strict.precisions.append(precision)
            if precision == "tf32" and a.dtype == interpreter.tl.float32 and b.dtype == interpreter.tl.float32:
                a = interpreter.TensorHandle(interpreter._round_f32_to_tf32(a.data), a.dtype)
                b = interpreter.TensorHandle(interpreter._round_f32_to_tf32(b.data), b.dtype)
            return dot(builder_self, a, b, d, input_precision, max_num_imprecise_acc)

        builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
        builder.create_dot, executor._init_args_hst = strict_dot, init_args_hst
        return self

    def __exit__(self, *exc):
        for (owner, name), original in self._saved.items():
            setattr(owner, name, original)
        return False

    def _check_bounds(self, ptrs, mask, what: str) -> None:
        if not self._ranges:
            return  # pointers into nothing the launch was given: not ours to judge
        addresses = ptrs.data.astype(np.uint64)
        active = np.broadcast_to(mask.data, addresses.shape) if mask is not None else np.ones(addresses.shape, bool)
        itemsize = np.uint64(interpreter_itemsize(ptrs))
        inside = np.zeros(addresses.shape, dtype=bool)
        for low, high in self._ranges:
            inside |= (addresses >= np.uint64(low)) & (addresses + itemsize <= np.uint64(high))
        outside = active & ~inside
        if outside.any():
            raise IndexError(
                f"out-of-bounds {what}: {int(outside.sum())} unmasked lane(s) address memory outside "
                "every tensor the kernel was given (Triton's interpreter would have read or written it)"
            )


def interpreter_itemsize(ptrs) -> int:
    from triton.runtime import interpreter

    return np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize


# --- the Prepared and the backend -------------------------------------------------------------------
class _TritonPrepared(Prepared):
    def __init__(self, mode: str, launch, shape: tuple[int, int]):
        self.mode = mode
        self.launch = launch
        self.shape = shape
        self.output = None
        self.precisions: list[str] = []  # interpreted: each tl.dot's input_precision, in order

    def run(self) -> None:
        if self.mode == "interpreted":
            with StrictInterpreter() as strict:
                self.output = self.launch()
            self.precisions = strict.precisions
            return
        self.output = self.launch()
        import torch

        torch.cuda.synchronize()

    def result(self) -> np.ndarray:
        if self.output is None:
            raise RuntimeError("result() before run()")
        return to_numpy(self.output).reshape(self.shape)

    def time(self, min_time: float) -> Timing:
        if self.mode != "native":
            raise RuntimeError(f"{self.mode} runs are correctness checks; they are not timed")
        # The timer the cuBLAS baseline uses (CUDA events, L2 flushed before every repeat),
        # so the ratio between the two compares kernels, not timers.
        return gpu.time_cuda(self.launch, min_time)


class TritonBackend(Backend):
    """Loads ``function`` from a file in triton/ and calls it on torch tensors.

    What such a file defines for the harness (its contract, checked when it is loaded: a file
    that lacks a name is an error row that says which and what it means) is ``SOURCE_NAMES``,
    plus the launch wrapper itself and, in INTERPRETER_CONFIG, the ``blocks`` keys.

    ``gemv`` backends take the harness's M = 1 problem, A [1, K] and B [K, N], as
    x = A[0] and W = B transposed into an [N, K] row-major copy (see triton/gemv.py for why),
    made while preparing, outside the timed region.
    """

    SOURCE_NAMES = {
        "INTERPRETED": "True when its kernels were built for Triton's CPU interpreter, which TRITON_INTERPRET "
        'decides as the file is imported: INTERPRETED = type(my_kernel).__name__ == "InterpretedFunction"',
        "INTERPRETER_CONFIG": "the block sizes its wrapper launches with in the interpreter (a dict; the harness "
        "estimates an interpreted run's time from them)",
    }

    def __init__(self, function: str, gemv: bool = False, needs_tma: bool = False):
        self.function = function
        self.gemv = gemv
        self.needs_tma = needs_tma  # the source says itself whether this GPU and Triton have TMA
        self.blocks = ("BLOCK_N", "BLOCK_K") if gemv else ("BLOCK_M", "BLOCK_N", "BLOCK_K")  # INTERPRETER_CONFIG's

    def source_problem(self, module) -> str | None:
        """What ``module`` lacks of the contract (SOURCE_NAMES, the wrapper, the blocks), or None."""
        missing = [f"{name} ({meaning})" for name, meaning in self.SOURCE_NAMES.items() if not hasattr(module, name)]
        if not callable(getattr(module, self.function, None)):
            missing.append(f"{self.function} (the launch wrapper the harness calls)")
        blocks = getattr(module, "INTERPRETER_CONFIG", None)
        if isinstance(blocks, dict):
            missing += [f"INTERPRETER_CONFIG[{key!r}]" for key in self.blocks if key not in blocks]
        if not missing:
            return None
        return "defines no " + "; no ".join(missing)

    def unavailable_reason(self, impl):
        mode, reason = setup()
        if reason:
            return reason
        problem = self.source_problem(load_source(impl.source))
        if problem:  # a rung being written: a fault to fix, said in its row
            raise BrokenError(f"{impl.source} {problem}")
        if not self.needs_tma:
            return None
        import torch

        capability = torch.cuda.get_device_capability() if mode == "native" else None  # interpreted: no GPU
        return load_source(impl.source).tma_unavailable_reason(capability)

    def run_mode(self, impl) -> str:
        return setup()[0] or "native"  # unavailable: let the reason, not a size cap, say so

    def estimate_seconds(self, impl, shape, dtype: str) -> float:
        """How long Triton's interpreter would take: it runs each program (one tile of the
        output, with the source's INTERPRETER_CONFIG blocks) one after another in NumPy, and
        each step along K, so the cost is programs x steps, nearly whatever the block sizes.
        triton.gemv at 1x1000000x1 (62,500 programs of one step) took 6 minutes on a 2-core
        development machine; how that splits between a program and a step is a guess."""
        blocks = load_source(impl.source).INTERPRETER_CONFIG
        steps = -(-shape.k // blocks["BLOCK_K"])
        tiles = -(-shape.n // blocks["BLOCK_N"])
        if not self.gemv:
            tiles *= -(-shape.m // blocks["BLOCK_M"])
        return tiles * (INTERPRETED_SECONDS_PER_PROGRAM + steps * INTERPRETED_SECONDS_PER_STEP)

    def prepare(self, impl, a, b, options):
        module = load_source(impl.source)
        mode = setup()[0]
        device = "cuda" if mode == "native" else "cpu"
        function = getattr(module, self.function)
        kwargs = {k: v for k, v in options.items() if v is not None}
        if self.gemv:
            x = to_torch(a[0], device)
            w = to_torch(np.ascontiguousarray(b.T), device)
            launch = lambda: function(w, x, **kwargs)  # noqa: E731
        else:
            ta, tb = to_torch(a, device), to_torch(b, device)
            launch = lambda: function(ta, tb, **kwargs)  # noqa: E731
        return _TritonPrepared(mode, launch, (a.shape[0], b.shape[1]))

    def peak_gflops(self, impl, dtype: str) -> float | None:
        # For the GEMV the roof is HBM bandwidth, so "% peak" reads as % of it (see harness.backends.gpu).
        return gpu.peak_for(impl.operation, dtype)


register(
    Implementation(
        name="triton.matmul",
        language="triton",
        device="gpu",
        dtypes=("float32", "float16", "bfloat16"),
        summary="tl.dot on BLOCK_M x BLOCK_N tiles in grouped order (L2 reuse), FP32 accumulate, autotuned",
        backend=TritonBackend("matmul"),
        source="triton/matmul.py",
        requires=("gpu", "torch", "triton"),
        options={"allow_tf32": False, "config": None},
    )
)
register(
    Implementation(
        name="triton.matmul_tma",
        language="triton",
        device="gpu",
        dtypes=("float16", "bfloat16"),
        summary="persistent (one program per SM, grouped tile order), A, B and C moved by TMA via "
        "tensor descriptors; sm_90+",
        backend=TritonBackend("matmul_tma", needs_tma=True),
        source="triton/matmul_tma.py",
        requires=("gpu", "torch", "triton"),
        options={"config": None, "programs": None},
    )
)
register(
    Implementation(
        name="triton.gemv",
        language="triton",
        device="gpu",
        dtypes=("float32", "float16", "bfloat16"),
        summary="y = W x streamed at HBM bandwidth: rows of W split across programs, FP32 accumulate",
        backend=TritonBackend("gemv", gemv=True),
        source="triton/gemv.py",
        operation="gemv",
        requires=("gpu", "torch", "triton"),
        options={"config": None},
    )
)


class TritonDecodeBackend(TritonBackend):
    """triton/decode.py: Y = X W^T for W quantized (quant.QuantizedWeights). In prepare (not
    timed) the weights' bytes become the two tensors the kernel reads (``pack``: the scales
    apart from the quants, the same values) on the device, and X a float32 tensor."""

    def __init__(self):
        super().__init__("decode")
        self.blocks = ("BLOCK_N", "BLOCK_B")

    SOURCE_NAMES = {
        **TritonBackend.SOURCE_NAMES,
        "MAX_M": "the most rows of X one program takes",
        "pack": "pack(format, n, k, data) -> (scales, quants): the weights' bytes as the two tensors the kernel reads",
    }

    def estimate_seconds(self, impl, shape, dtype: str) -> float:
        module = load_source(impl.source)
        blocks = module.INTERPRETER_CONFIG
        programs = -(-shape.n // blocks["BLOCK_N"]) * -(-shape.m // module.MAX_M)
        steps = -(-shape.k // (32 * blocks["BLOCK_B"]))
        return programs * (INTERPRETED_SECONDS_PER_PROGRAM + steps * INTERPRETED_SECONDS_PER_STEP)

    def prepare(self, impl, a, b, options):
        import torch

        x, w = decode_inputs(impl, a, b)
        module = load_source(impl.source)
        mode = setup()[0]
        device = "cuda" if mode == "native" else "cpu"
        scales, quants = module.pack(w.format, w.n, w.k, torch.from_numpy(w.data.copy()))
        scales = scales.to(device) if scales is not None else None
        quants = quants.to(device)
        tx = to_torch(x, device)
        kwargs = {k: v for k, v in options.items() if v is not None}
        launch = lambda: module.decode(tx, w.format, scales, quants, **kwargs)  # noqa: E731
        return _TritonPrepared(mode, launch, (x.shape[0], w.n))


register(
    Implementation(
        name="triton.decode",
        language="triton",
        device="gpu",
        dtypes=("float32",),
        weights=("q8_0", "q4_0", "q4_K", "bf16"),
        summary="decode, Y = X W^T with W in q8_0 / q4_0 / q4_K / bf16: blocks of W dequantized in registers, each "
        "applied to M = 1..16 rows of X, FP32 accumulate",
        backend=TritonDecodeBackend(),
        source="triton/decode.py",
        requires=("gpu", "torch", "triton"),
        options={"config": None},
    )
)
