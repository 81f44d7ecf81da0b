"""What an implementation is, and the one call path every implementation goes through.

An ``Implementation`` is metadata, stated once (name, language, device, operation, dtypes,
shape limits, requirements, source, summary), plus a ``backend``: the adapter for its
language, which knows how to load the source, convert inputs and launch.

Every call is split in two so that one timer and one checker serve every language:

    prepared = backend.prepare(impl, a, b, options)   # conversion, packing, copies: not timed
    prepared.run()                                    # the multiplication: timed; GPU work is
                                                      # synchronised before it returns
    prepared.result()                                 # the product as a NumPy array
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from harness.env.switches import switch
from harness.model.errors import BrokenError, MatmulInputError, ResultError, UnavailableError
from harness.model.inputs import Shape, dtype_name, numpy_dtype
from harness.model.quant import QuantizedWeights
from harness.model.timing import Timing

ALLOW_SLOW_ENV = "MATMUL_ALLOW_SLOW"


class Prepared:
    """One problem made ready to run (by ``Backend.prepare``): ``run()`` is the timed call,
    ``result()`` the product as a NumPy array. Subclass it; the attributes and ``time`` below
    are the defaults a subclass overrides where they differ."""

    mode = "native"  # or "emulated" / "interpreted": a CPU stand-in for GPU code, checked and never timed
    loader = None  # what loaded a compiled GPU kernel (pycuda, cupy, emulation), for the row
    path = None  # the kernel path a library picked for this problem ("q4_0_8x8 repack"), for the row

    def run(self) -> None:
        """The multiplication, and nothing else (GPU work synchronised before it returns)."""
        raise NotImplementedError(f"{type(self).__name__} must define run()")

    def result(self) -> np.ndarray:
        """The product of the last run, as a new NumPy array."""
        raise NotImplementedError(f"{type(self).__name__} must define result()")

    def time(self, min_time: float) -> Timing | None:
        """A timing it takes itself (GPU adapters: CUDA events, L2 flushed between repeats), or
        None: the harness then times ``run()`` with perf_counter (timing.time_cpu)."""
        return None


class Backend(ABC):
    """The adapter for one language: how its implementations are loaded, checked and run.

    Subclass it, define the two abstract hooks, and override the others where the default
    (each says what it is) is wrong for your language. The harness calls nothing else."""

    @abstractmethod
    def unavailable_reason(self, impl: "Implementation") -> str | None:
        """None when the implementation can run here, else why not (raise BrokenError where its
        build or load failed: a fault, unlike a machine that lacks a GPU)."""

    @abstractmethod
    def prepare(self, impl: "Implementation", a: np.ndarray, b, options: Mapping[str, Any]) -> Prepared:
        """Convert and stage the (validated, C-contiguous) inputs; nothing timed happens here."""

    def run_mode(self, impl: "Implementation") -> str:
        """How prepare() would run here: "native", or "emulated"/"interpreted" for a CPU
        stand-in of GPU code (slow: compare() caps its problem size). Default: native."""
        return "native"

    def estimate_seconds(self, impl: "Implementation", shape: Shape, dtype: str) -> float | None:
        """How long a stand-in run of ``shape`` would take, from the launch it would make (a
        GEMV of 10^6 outputs is cheap in FLOPs and slow in an interpreter). Default None: its
        FLOPs at STAND_IN_FALLBACK_FLOPS_PER_S."""
        return None

    def shape_problem(self, impl: "Implementation", shape: Shape) -> str | None:
        """Why a kernel cannot take a shape its metadata allows (torch's int4 kernel needs N to
        be a multiple of 16), or None (the default)."""
        return None

    def bind(self, impl: "Implementation", options: Mapping[str, Any]):
        """``call(a, b) -> ndarray``, the direct call ``Matmul.__call__`` makes: the per-call
        work alone (no staging, no copy of the result). Default None: prepare, run, result."""
        return None

    def fast_call(self, impl: "Implementation", options: Mapping[str, Any], max_elements: int):
        """``fast(a, b) -> ndarray or None``: bind()'s call for the inputs of ``Matmul``'s common
        case (``common_case`` says which), None for any others, with the checks compiled into it
        (at small sizes Python's checks are a measurable part of the call). Default None:
        ``Matmul`` checks in Python and makes bind()'s call."""
        return None

    def peak_gflops(self, impl: "Implementation", dtype: str) -> float | None:
        """The peak FLOP rate a GPU row's % peak is taken against (CPU rows use the measured
        roof of the cores they ran on). Default None: no % peak."""
        return None

    def describe(self, impl: "Implementation") -> str | None:
        """What the implementation runs on this machine when that varies (a library's version
        and kernel set), for the table's notes and the JSON. Default None."""
        return None


@dataclass(frozen=True, kw_only=True)
class Implementation:
    name: str  # "<language>.<technique>", e.g. "c.blocked"
    language: str  # python, c, numpy, cuda, triton, torch
    device: str  # cpu or gpu
    dtypes: tuple[str, ...]  # the input dtypes it accepts
    summary: str  # one line, for tables
    backend: Backend = field(repr=False, compare=False)
    source: str | None = None  # relative to the repository root
    operation: str = "gemm"  # gemm, or gemv (M = 1 only)
    weights: tuple[str, ...] = ()  # weight formats of a decode GEMV (quant.py: "q8_0", "q4_0", "bf16"):
    # B arrives as quant.QuantizedWeights of W [N, K]; () = a float B
    max_flops: float | None = None  # bigger problems are refused unless allow_slow
    slow_rate: float | None = None  # FLOP/s, to say how long a refused problem would take
    multiple_of: int = 1  # M, N and K must be multiples of this
    requires: tuple[str, ...] = ()  # what it needs to run: "gpu", "pycuda", "triton", ...
    options: Mapping[str, Any] = field(default_factory=dict)  # default keyword options
    baseline: bool = False  # the library baseline for its device
    peer: bool = False  # a library a user would pick instead: shown beside the baseline
    threaded: bool = False  # accepts a `threads` option
    activation_rounding: str | Mapping[str, str] | None = None  # "q8_0": rounds X to Q8_0 blocks before
    # multiplying (ggml's CPU mat-vec); checked with the extra error that implies (activation_error.py), on top of
    # the float32 model. A mapping names the rounding per weight format ({"q4_0": "q8_0", "q4_K": "q8_K"}).

    def __post_init__(self):
        if not isinstance(self.backend, Backend):
            raise TypeError(
                f"{self.name}: backend must be a harness.Backend (subclass it and define unavailable_reason and "
                f"prepare), got {type(self.backend).__name__}"
            )

    def rounding_for(self, weights: str | None) -> str | None:
        """How this implementation rounds X before multiplying weights in format ``weights``."""
        rounding = self.activation_rounding
        if isinstance(rounding, Mapping):
            return rounding.get(weights)
        return rounding

    def unavailable_reason(self) -> str | None:
        return self.availability()[0]

    def availability(self) -> tuple[str | None, bool]:
        """(why it cannot run here, or None; whether that is a fault: a build or load that
        failed, raised by the backend as BrokenError, rather than something this machine lacks)."""
        try:
            return self.backend.unavailable_reason(self), False
        except BrokenError as error:
            return str(error), True
        except Exception as error:  # a probe that fails is a reason, not a crash
            return f"{type(error).__name__}: {error}", False

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None


# A CPU stand-in for GPU code (the CUDA emulation, Triton's interpreter) is checked, never
# timed; a row estimated to take longer than this is refused unless allow_slow. The estimate
# is the backend's (``estimate_seconds``), from the launch it would make: a GEMV of 10^6
# outputs is cheap in FLOPs and slow in an interpreter, which pays per program it runs.
STAND_IN_BUDGET_S = 10.0
# What a stand-in whose backend gives no estimate is assumed to manage (the CUDA emulation's
# rate on its FLOPs, backends/cuda/__init__.py).
STAND_IN_FALLBACK_FLOPS_PER_S = 5e7


def run_mode(impl: Implementation) -> str:
    """How ``impl`` runs on this machine: native, or a CPU stand-in (emulated, interpreted)."""
    return impl.backend.run_mode(impl)


def stand_in_seconds(impl: Implementation, shape: Shape, dtype, mode: str) -> float:
    """How long ``impl`` would take on ``shape`` running ``mode`` (emulated, interpreted) here."""
    estimate = impl.backend.estimate_seconds(impl, shape, dtype_name(dtype))
    return estimate if estimate is not None else shape.flops / STAND_IN_FALLBACK_FLOPS_PER_S


def duration_text(seconds: float) -> str:
    """About how long, in the unit a person reads: 40 seconds, 6 minutes, 2.5 hours."""
    if seconds > 3600:
        return f"about {seconds / 3600:.1f} hours"
    if seconds >= 90:
        return f"about {seconds / 60:.0f} minutes"
    return f"about {seconds:.0f} seconds"


def slow_allowed(allow_slow: bool | None) -> bool:
    if allow_slow is not None:
        return allow_slow
    return switch(ALLOW_SLOW_ENV)


def problem_bytes(shape: Shape, dtype) -> int:
    """Host memory a checked run needs: A, B and C in the dtype, the float64 reference and the
    error model's second float64 product (checking.py), and the float64 copies of A and B."""
    if isinstance(dtype, np.dtype):
        itemsize = dtype.itemsize  # the call path's case: no name lookup
    else:
        try:
            itemsize = numpy_dtype(dtype).itemsize
        except TypeError:  # a dtype no implementation takes: refused elsewhere, sized as float64 here
            itemsize = 8
    m, n, k = shape
    return (m * k + k * n + m * n) * itemsize + 8 * (2 * m * n + 2 * (m * k + k * n))


@lru_cache(maxsize=1)
def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_problem(impl: Implementation, shape: Shape, dtype, allow_slow: bool | None = None) -> None:
    """Refuse, with a message that names what is wrong, a problem ``impl`` cannot take."""
    name = dtype_name(dtype)
    if name not in impl.dtypes:
        raise MatmulInputError(f"{impl.name} does not support dtype {name} (it supports {', '.join(impl.dtypes)})")
    if impl.operation == "gemv" and shape.m != 1:
        raise MatmulInputError(f"{impl.name} is a GEMV: it needs M = 1 (A of shape (1, K)), got A with M = {shape.m}")
    problem = impl.backend.shape_problem(impl, shape)
    if problem:
        raise MatmulInputError(f"{impl.name} {problem}, got {shape} (MxNxK)")
    if impl.multiple_of > 1 and any(d % impl.multiple_of for d in shape):
        raise MatmulInputError(
            f"{impl.name} needs M, N and K to be multiples of {impl.multiple_of}, got {shape} (MxNxK)"
        )
    if impl.device != "cpu" and shape.flops and not slow_allowed(allow_slow):
        mode = run_mode(impl)
        seconds = stand_in_seconds(impl, shape, dtype, mode) if mode != "native" else 0.0
        if seconds > STAND_IN_BUDGET_S:
            raise MatmulInputError(
                f"{impl.name} runs {mode} on the CPU here and would take too long at {shape} (MxNxK) "
                f"({duration_text(seconds)}): the limit for CPU stand-ins, which are checked and never timed, is "
                f"{STAND_IN_BUDGET_S:.0f} seconds. Pass allow_slow=True (or --allow-slow, or set {ALLOW_SLOW_ENV}=1) "
                "to run it anyway"
            )
    needed = problem_bytes(shape, dtype)
    memory = physical_memory_bytes()
    if memory and needed > memory:
        raise MatmulInputError(
            f"{shape} (MxNxK) in {name} needs about {needed / 2**30:.0f} GiB for its inputs, result and float64 "
            f"reference; this machine has {memory / 2**30:.0f} GiB"
        )
    if impl.max_flops is not None and shape.flops > impl.max_flops and not slow_allowed(allow_slow):
        estimate = limit = ""
        if impl.slow_rate:  # its time is its FLOPs at the rate it manages (pure Python: per multiply-add)
            estimate = f" ({duration_text(shape.flops / impl.slow_rate)})"
            limit = f"{duration_text(impl.max_flops / impl.slow_rate)}, "
        raise MatmulInputError(
            f"{impl.name} would take too long at {shape} (MxNxK){estimate}: the limit is {limit}"
            f"{impl.max_flops:.2g} FLOPs. Pass allow_slow=True (or --allow-slow, or set {ALLOW_SLOW_ENV}=1) to run "
            "it anyway"
        )


def _plain_array(impl: Implementation, label: str, x) -> np.ndarray:
    """``x`` as a plain, native-byte-order ndarray, or a MatmulInputError saying why not.

    A masked array is refused: no kernel here can honour a mask, and multiplying the hidden
    values would be silently wrong (pass ``x.filled(value)`` or ``x.data`` to choose). Other
    subclasses (np.matrix, np.memmap) are read as the plain arrays they hold. A big-endian
    array is converted to native order: its bytes must never reach C or a GPU as they are.
    """
    if type(x) is np.ndarray:  # the common case, checked first: the call path is timed by users
        return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))
    if isinstance(x, np.ma.MaskedArray):
        raise MatmulInputError(
            f"{impl.name}: {label} is a masked array, and masks are not honoured; pass {label}.filled(value) "
            f"or {label}.data to say which values to multiply"
        )
    if not isinstance(x, np.ndarray):
        raise MatmulInputError(f"{impl.name} expects NumPy arrays, got {type(x).__name__} for {label}")
    x = np.asarray(x)
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    return x


def validate_inputs(impl: Implementation, a, b, allow_slow: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check a and b for ``impl``; return native-order, aligned, C-contiguous arrays (copies
    where needed), so no implementation ever sees strides, offsets or byte orders.

    The caller's arrays are never modified: a non-contiguous, misaligned, Fortran-ordered or
    byte-swapped input is copied, never reinterpreted.
    """
    if impl.weights or is_quantized(b):
        return _validate_decode_inputs(impl, a, b, allow_slow)
    a = _plain_array(impl, "A", a)
    b = _plain_array(impl, "B", b)
    if a.ndim != 2 or b.ndim != 2:
        raise MatmulInputError(
            f"{impl.name} expects two 2-D arrays, A [M, K] and B [K, N]; got {a.ndim}-D A {a.shape} and {b.ndim}-D "
            f"B {b.shape}"
        )
    if a.shape[1] != b.shape[0]:
        raise MatmulInputError(
            f"inner dimensions do not match: A is {a.shape} and B is {b.shape}; "
            f"A's columns ({a.shape[1]}) must equal B's rows ({b.shape[0]})"
        )
    if a.dtype != b.dtype:
        raise MatmulInputError(f"A and B must have the same dtype, got {dtype_name(a.dtype)} and {dtype_name(b.dtype)}")
    check_problem(impl, Shape(a.shape[0], b.shape[1], a.shape[1]), a.dtype, allow_slow)
    return _contiguous_aligned(a), _contiguous_aligned(b)


def is_quantized(b) -> bool:
    """Whether ``b`` is a decode problem's weights (quant.QuantizedWeights) rather than a float B."""

    return isinstance(b, QuantizedWeights)


def _validate_decode_inputs(impl: Implementation, x, weights, allow_slow: bool | None):
    """A decode problem: activations X [M, K] and quantized weights W [N, K] (Y = X @ W^T)."""
    if not impl.weights:
        raise MatmulInputError(
            f"{impl.name} takes a float B [K, N], not {weights.format} weights; pass weights.dequantize().T "
            "to multiply by the weights they hold"
        )
    if not is_quantized(weights):
        raise MatmulInputError(
            f"{impl.name} takes quantized weights W [N, K] (harness.quant.quantize(w, format), formats "
            f"{', '.join(impl.weights)}), got {type(weights).__name__} for B"
        )
    if weights.format not in impl.weights:
        raise MatmulInputError(
            f"{impl.name} does not take {weights.format} weights (it takes {', '.join(impl.weights)})"
        )
    x = _plain_array(impl, "X", x)
    if x.ndim != 2:
        raise MatmulInputError(f"{impl.name} expects activations X [M, K] as a 2-D array, got {x.ndim}-D {x.shape}")
    if x.shape[1] != weights.k:
        raise MatmulInputError(
            f"inner dimensions do not match: X is {x.shape} and W is [{weights.n}, {weights.k}]; "
            f"X's columns ({x.shape[1]}) must equal W's columns ({weights.k})"
        )
    check_problem(impl, Shape(x.shape[0], weights.n, weights.k), x.dtype, allow_slow)
    return _contiguous_aligned(x), weights


def output_shape(a: np.ndarray, b) -> tuple[int, int]:
    """C's shape: [M, N] for A [M, K] times B [K, N] or times quantized W [N, K]."""
    return (a.shape[0], b.n if is_quantized(b) else b.shape[1])


def _contiguous_aligned(x: np.ndarray) -> np.ndarray:
    flags = x.flags
    if flags.c_contiguous and flags.aligned:
        return x  # the common case, without np.require's argument parsing
    return np.require(x, requirements=["C_CONTIGUOUS", "ALIGNED"])


def check_result(impl: Implementation, result, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An implementation must return an ndarray of the problem's dtype and shape; anything
    else is a bug in it, reported as one rather than passed on."""
    expected = output_shape(a, b)
    if not isinstance(result, np.ndarray) or result.shape != expected or result.dtype != a.dtype:
        got = (
            f"{type(result).__name__} {getattr(result, 'shape', '')} {dtype_name(result.dtype)}"
            if isinstance(result, np.ndarray)
            else type(result).__name__
        )
        raise ResultError(f"{impl.name} returned {got}; it must return a {expected} {dtype_name(a.dtype)} array")
    return result


def _digest(x: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(x).view(np.uint8).data, digest_size=16).digest()


def read_only_view(x: np.ndarray) -> np.ndarray:
    view = x.view()
    view.flags.writeable = False
    return view


class InputGuard:
    """What a checked row hands an implementation: read-only views of its inputs, and a digest
    of their bytes taken before it runs, to tell afterwards whether it wrote into them anyway
    (C writes through a pointer whatever NumPy's flags say). A row that writes into its inputs
    is a wrong implementation, and would change the problem every later row is checked on."""

    def __init__(self, a: np.ndarray, b: np.ndarray):
        self.a, self.b = read_only_view(a), read_only_view(b)
        self._digests = (_digest(a), _digest(b))

    def written(self) -> list[str]:
        """The inputs ("A", "B") whose bytes changed since the guard was made."""
        return [label for label, x, before in zip("AB", (self.a, self.b), self._digests) if _digest(x) != before]


def wrote_inputs_message(name: str, written: list[str]) -> str:
    return f"{name} wrote into its input {' and '.join(written)} (inputs are read-only; a matmul must not change them)"


def tried_to_write_inputs(error: BaseException) -> bool:
    """NumPy's refusal to write into a read-only array: the only read-only arrays a row gets are its inputs."""
    return isinstance(error, ValueError) and "read-only" in str(error)


@dataclass
class EmptyProduct(Prepared):
    product: np.ndarray
    mode: str = "native"

    def run(self) -> None:
        pass

    def result(self) -> np.ndarray:
        return self.product.copy()


def common_case(call, dtypes: tuple[np.dtype, ...], max_elements: int):
    """``fast(a, b)``: ``call(a, b)`` for the common case, None for any other inputs.

    The common case: plain (not a subclass), C-contiguous, aligned, writeable (NumPy's "carray"
    flag: a read-only input takes the full path) 2-D arrays of one of ``dtypes``, the same for
    both, no dimension 0, K matching, and at most ``max_elements`` elements in A, B and C
    together, so that the memory check cannot fail. It is what validate_inputs would pass
    unchanged, so it needs no validation. (harness/backends/c/fast_call.c makes the same
    checks in C.)"""

    def fast(a, b):
        if type(a) is np.ndarray and type(b) is np.ndarray:
            dtype = a.dtype
            shape_a, shape_b = a.shape, b.shape
            if dtype is b.dtype and dtype in dtypes and len(shape_a) == 2 and len(shape_b) == 2:
                (m, k), (k_b, n) = shape_a, shape_b
                if (
                    k == k_b
                    and m
                    and n
                    and k
                    and m * k + k * n + m * n <= max_elements
                    and a.flags.carray
                    and b.flags.carray
                ):
                    return call(a, b)
        return None

    return fast


class Matmul:
    """``harness.get(name)``: an implementation callable on two NumPy arrays.

    ``Matmul(impl)(a, b)`` validates, prepares, runs and returns the product as a new array.
    Keyword options (``tile=32``, ``threads=2``, ...) override the implementation's defaults.
    """

    def __init__(self, impl: Implementation, allow_slow: bool | None = None, **options):
        self.impl = impl
        self.allow_slow = allow_slow
        unknown = set(options) - set(impl.options) - ({"threads"} if impl.threaded else set())
        if unknown:
            known = sorted(set(impl.options) | ({"threads"} if impl.threaded else set()))
            raise TypeError(
                f"{impl.name} takes no option {', '.join(sorted(unknown))} (its options: {', '.join(known) or 'none'})"
            )
        self.options = {**impl.options, **options}
        self._call = None  # the backend's bound call, made on first use
        self._fast = None  # fast(a, b) -> product, or None off the common case; made on first use

    def __repr__(self) -> str:
        return f"<matmul {self.impl.name}: {self.impl.summary}>"

    @property
    def name(self) -> str:
        return self.impl.name

    def prepare(self, a, b) -> Prepared:
        return self._prepare_validated(*validate_inputs(self.impl, a, b, self.allow_slow))

    def _prepare_validated(self, a: np.ndarray, b: np.ndarray) -> Prepared:
        reason, broken = self.impl.availability()
        if reason:
            raise (BrokenError if broken else UnavailableError)(f"{self.impl.name} is unavailable here: {reason}")
        if 0 in a.shape or 0 in b.shape:
            # Nothing to compute, and a GPU grid of zero blocks is an error: every
            # implementation gives what NumPy gives (zeros when K = 0, else an empty array).
            # (and it runs where the implementation would: a CPU stand-in's row is not timed)
            return EmptyProduct(np.zeros(output_shape(a, b), dtype=a.dtype), mode=run_mode(self.impl))
        prepared = self.impl.backend.prepare(self.impl, a, b, self.options)
        if not isinstance(prepared, Prepared):
            raise TypeError(
                f"{type(self.impl.backend).__name__}.prepare returned {type(prepared).__name__}: it must return a "
                "harness.Prepared (subclass it: run() and result())"
            )
        return prepared

    def __call__(self, a, b) -> np.ndarray:
        fast = self._fast
        if fast is None:
            fast = self._fast_path()
        if fast:
            c = fast(a, b)
            if c is not None:
                return c
        a, b = validate_inputs(self.impl, a, b, self.allow_slow)  # once: the call path is timed by users
        if 0 not in a.shape and 0 not in b.shape:
            call = self._bound_call()
            if call is not None:  # the backend's direct call: no staging, no copy of the result
                return check_result(self.impl, call(a, b), a, b)
        prepared = self._prepare_validated(a, b)
        prepared.run()
        return check_result(self.impl, prepared.result(), a, b)

    def _fast_path(self):
        """``fast(a, b)``: the product for inputs of the common case, which users time at small
        sizes, None for any others (they take the full path); the backend's compiled one, or
        ``common_case`` checked in Python before its bound call. False for implementations whose
        checks depend on more than dtype, shape and memory (GEMV-only, multiples, FLOP limits,
        non-CPU devices) or that have no bound call."""
        impl = self.impl
        simple = impl.device == "cpu" and impl.operation != "gemv" and impl.multiple_of <= 1 and impl.max_flops is None
        try:
            call = self._bound_call() if simple else None
        except UnavailableError:  # the full path reports it, after checking the inputs as always
            call = None
        memory = physical_memory_bytes()
        if not call or not memory:
            self._fast = False
            return False
        dtypes = []
        for name in impl.dtypes:
            try:
                dtypes.append(numpy_dtype(name))
            except TypeError:  # bfloat16 without ml_dtypes: the full path explains
                pass
        # problem_bytes is at most (itemsize + 16) bytes per element of A, B and C: below
        # this many elements the problem fits in memory whatever the dtype.
        max_elements = memory // 24
        self._fast = impl.backend.fast_call(impl, self.options, max_elements) or common_case(
            call, tuple(dtypes), max_elements
        )
        return self._fast

    def _bound_call(self):
        """The backend's ``bind(impl, options)`` call, made once per Matmul (the options are
        fixed, so they are checked once), or None for backends that only prepare."""
        if self._call is None:
            reason, broken = self.impl.availability()
            if reason:
                raise (BrokenError if broken else UnavailableError)(f"{self.impl.name} is unavailable here: {reason}")
            self._call = self.impl.backend.bind(self.impl, self.options) or False
        return self._call or None
