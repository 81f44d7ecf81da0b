"""Adapter for c/: the C matmuls in the CMake-built shared library, called through cffi.

cffi releases the GIL for the duration of each C call, so the functions may run on several
Python threads at once; that is safe because none of them keeps static state.

Ctrl-C: Python delivers a signal to the main thread between bytecodes, so while the main
thread is inside a C call (c.naive_ijk at 2048^3: about a minute) Ctrl-C waits for it. A call
that may take longer than INTERRUPTIBLE_AFTER_S therefore runs on a worker thread while the
main thread waits in short slices, where KeyboardInterrupt arrives at once. C cannot be
stopped half-way: the abandoned call finishes on its own (its buffers are kept alive for it)
and its result is dropped. Shorter calls, which users time, stay direct.
"""

from __future__ import annotations

import os

import numpy as np

from harness.backends.c import clib
from harness.env.cores import usable_cores
from harness.env.interrupts import call_interruptibly
from harness.model.core import Backend, BrokenError, Implementation, MatmulInputError, Prepared, UnavailableError
from harness.model.registry import register

_SUFFIX = {"float32": "f32", "float64": "f64"}


# An output of at least this many bytes is allocated to start on a cache line (64 bytes).
# NumPy's large arrays start 16 bytes past one, so each 64-byte row piece of C that an
# AVX-512 micro-kernel loads and stores would straddle two lines: aligned, c.packed is faster
# by a tenth or more from 512^3 up, and below about 256^3 the gain is less than the aligned
# allocation costs, hence the threshold.
ALIGNED_OUTPUT_BYTES = 1 << 20
CACHE_LINE = 64


def aligned_empty(nbytes: int, alignment: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose data starts on an ``alignment``-byte
    boundary: a view into a slightly larger allocation, which it keeps alive as its base."""
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes]


def empty_output(m: int, n: int, dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous (m, n) array for a kernel to overwrite; cache-line
    aligned when it is large enough for that to pay (ALIGNED_OUTPUT_BYTES)."""
    nbytes = m * n * dtype.itemsize
    if nbytes < ALIGNED_OUTPUT_BYTES:
        return np.empty((m, n), dtype)
    return aligned_empty(nbytes, CACHE_LINE).view(dtype).reshape(m, n)


# A call that may run longer than this, at the fastest its kernel goes (each backend's
# fastest_gflops, for the best CPUs; on a slower one the calls left direct take up to a
# second or so), is made interruptible: the worker thread costs tens of microseconds, well
# under 0.1% of such a call.
INTERRUPTIBLE_AFTER_S = 0.2


class CCall(Prepared):
    """A C call made ready, for the harness's timer: its output and its arguments (cffi
    pointers into arrays it keeps alive) are made here, so run() is the call alone. Every C
    backend's prepare returns one (c.decode's and c.decode_int8's too)."""

    def __init__(self, function, args: tuple, output: np.ndarray, keep: tuple, check_status, interruptible=False):
        self.function, self.args, self.output = function, args, output
        self.keep = keep  # the inputs, alive while C holds pointers into them
        self.check_status, self.interruptible = check_status, interruptible

    def run(self) -> None:
        call = call_interruptibly if self.interruptible else lambda function, args: function(*args)
        self.check_status(call(self.function, self.args))

    def result(self) -> np.ndarray:
        return self.output.copy()


_CTYPES = {"float32": "float[]", "float64": "double[]"}


class CBackend(Backend):
    """Calls ``matmul_<kernel>_<f32|f64>(A, B, C, M, N, K, *options)`` from the C library.

    ``option_names`` lists, in the C signature's order, the implementation options passed
    after K (e.g. the blocked kernel's tile size).
    """

    def __init__(self, kernel: str, option_names: tuple[str, ...] = (), fastest_gflops: float = 100.0):
        self.kernel = kernel
        self.option_names = option_names
        self.fastest_gflops = fastest_gflops  # per thread, on the best CPU: what decides interruptible calls

    def interruptible_mnk(self, extra_args) -> float:
        """The M*N*K from which a call may take longer than INTERRUPTIBLE_AFTER_S."""
        return INTERRUPTIBLE_AFTER_S * self.fastest_gflops * 1e9 * self.threads(extra_args) / 2

    def threads(self, extra_args) -> int:
        return 1

    def unavailable_reason(self, impl):
        # Every machine this project installs on builds the C library: not having it is a fault.
        try:
            _, lib = clib.load()
        except clib.CLibraryError as error:
            raise BrokenError(str(error).splitlines()[0] + _tmpdir_hint()) from None
        missing = missing_functions(lib)
        if missing:
            override = os.environ.get("MATMUL_C_LIBRARY")
            where = f"MATMUL_C_LIBRARY={override}" if override else "the C library"
            exports = clib.exported_functions()
            named = ", ".join(f"{name} ({exports[name].file})" if name in exports else name for name in missing[:3])
            raise BrokenError(
                f"{where} lacks {named}{' and more' if len(missing) > 3 else ''}, "
                "declared MATMUL_API in the C sources: it is not a build of this project's C sources"
            )
        return None

    def extra_args(self, impl, options):
        values = [int(options[name]) for name in self.option_names]
        if "tile" in self.option_names and values[self.option_names.index("tile")] < 1:
            raise ValueError(f"{impl.name}: tile must be >= 1, got {options['tile']}")
        return values

    def check_status(self, status) -> None:
        if status:  # None for void kernels; a nonzero int is a failure
            raise MemoryError(f"C kernel failed with status {status} (could not allocate its buffers)")

    def _functions(self):
        ffi, lib = clib.load()
        return ffi, {dtype: getattr(lib, f"matmul_{self.kernel}_{suffix}") for dtype, suffix in _SUFFIX.items()}

    def prepare(self, impl, a, b, options):
        ffi, functions = self._functions()
        extra = self.extra_args(impl, options)
        c = empty_output(a.shape[0], b.shape[1], a.dtype)
        ctype = _CTYPES[a.dtype.name]
        (m, k), n = a.shape, b.shape[1]
        args = (ffi.from_buffer(ctype, a), ffi.from_buffer(ctype, b), ffi.from_buffer(ctype, c), m, n, k, *extra)
        interruptible = m * n * k >= self.interruptible_mnk(extra)
        return CCall(functions[a.dtype.name], args, c, (a, b), self.check_status, interruptible)

    def bind(self, impl, options):
        """``call(a, b) -> C`` for validated inputs: what ``harness.get(name)(a, b)`` runs, so
        it does only what must be done per call (one uninitialised output, three pointers, the
        C call); the options are checked and the library loaded once, here."""
        ffi, functions = self._functions()
        extra = tuple(self.extra_args(impl, options))
        # The C types resolved once (a type given as a string is looked up on every call).
        by_dtype = {np.dtype(name): (function, ffi.typeof(_CTYPES[name])) for name, function in functions.items()}
        check_status = self.check_status
        from_buffer, empty = ffi.from_buffer, np.empty
        long_call = self.interruptible_mnk(extra)

        def call(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            dtype = a.dtype
            function, ctype = by_dtype[dtype]
            m, k = a.shape
            n = b.shape[1]
            # No zero fill: every kernel overwrites C. (The size test is empty_output's, inline:
            # at 64^3 each function call is a measurable part of the whole.)
            if m * n * dtype.itemsize < ALIGNED_OUTPUT_BYTES:
                c = empty((m, n), dtype)
            else:
                c = empty_output(m, n, dtype)
            args = (from_buffer(ctype, a), from_buffer(ctype, b), from_buffer(ctype, c), m, n, k, *extra)
            status = call_interruptibly(function, args) if m * n * k >= long_call else function(*args)
            if status:  # None for void kernels, 0 for success
                check_status(status)
            return c

        return call

    def fast_call(self, impl, options, max_elements, max_output_bytes=ALIGNED_OUTPUT_BYTES, long_call_mnk=None):
        """bind()'s call, with the checks of Matmul's common case, compiled (fast_call.c: at
        64^3 the Python path costs half the kernel's time again); None where it was not built.
        From ``max_output_bytes`` of output bind()'s call takes over (it allocates those
        aligned), and from ``long_call_mnk`` (default: interruptible_mnk) M*N*K on (it runs
        those interruptibly)."""
        fast_call_type = clib.fast_call_type()
        if fast_call_type is None:
            return None
        ffi, lib = clib.load()
        extra = tuple(self.extra_args(impl, options))
        kernels = {dtype: ffi.addressof(lib, f"matmul_{self.kernel}_{suffix}") for dtype, suffix in _SUFFIX.items()}
        address = {dtype: int(ffi.cast("intptr_t", kernels[dtype])) for dtype in kernels if dtype in impl.dtypes}
        return fast_call_type(
            kernel_f32=address.get("float32"),
            kernel_f64=address.get("float64"),
            returns_status=ffi.typeof(kernels["float32"]).result.cname != "void",
            options=extra,
            max_elements=max_elements,
            max_output_bytes=max_output_bytes,
            long_call_mnk=float(self.interruptible_mnk(extra) if long_call_mnk is None else long_call_mnk),
            on_status=self.check_status,
        )


_missing_by_library: dict[int, list[str]] = {}


def missing_functions(lib) -> list[str]:
    """The declared functions (the MATMUL_API ones of c/*.c) that ``lib`` lacks. ffi.dlopen
    loads any shared library and looks a function up only when it is first used, so a library
    that is not ours (an unrelated MATMUL_C_LIBRARY) would otherwise fail mid-run; checked once
    per library."""
    key = id(lib)
    if key not in _missing_by_library:
        missing = []
        for name in dir(lib):
            try:
                getattr(lib, name)
            except AttributeError:
                missing.append(name)
        _missing_by_library[key] = missing
    return _missing_by_library[key]


def _tmpdir_hint() -> str:
    """Why a build may have failed when TMPDIR is unusable (the compiler writes its temporary
    files there, and its error names neither the variable nor the folder)."""
    folder = os.environ.get("TMPDIR")
    if folder and not (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
        return f" (TMPDIR={folder} is not a writable folder, and the compiler writes its temporary files there)"
    return ""


# The SIMD variants of c.packed, c.decode, c.decode_int8 and c.bf16, by the numbers their C gives
# them (each file's <prefix>_variant_supported and <prefix>_resolve_variant take and give these;
# a file answers 0 for a number that is not one of its kernels: c.bf16 has only avx512bf16 and
# amx, the others only portable, avx2 and avx512).
VARIANTS = {"auto": 0, "portable": 1, "avx2": 2, "avx512": 3, "avx512bf16": 4, "amx": 5}
# c.packed's paths, by the numbers c/packed.c gives them.
PACKED_PATHS = {"auto": 0, "vector": 1, "direct": 2, "nest": 3, "vector_read_ahead": 4}
_PACKED_ERRORS = {
    1: "the micro-kernel variant cannot run on this CPU or build",
    2: "the pack buffers could not be allocated (out of memory)",
    3: "a dimension is negative",
}
_PATH_ERROR = 4  # the vector path asked for a shape with neither M = 1 nor N <= 8


def thread_option(impl, options) -> int:
    """The ``threads`` option of a threaded implementation: a whole number >= 1, or every core
    this process may run on where it is None."""
    threads = options.get("threads")
    if threads is None:
        return usable_cores()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"{impl.name}: threads must be an integer >= 1 (or None for every core), got {threads!r}")
    return int(threads)


def variants_text(name: str, prefix: str) -> str:
    """What a variant-choosing kernel runs here, for `list` and the table's notes."""
    variants = ", ".join(supported_variants(prefix))
    return f"{resolved_variant(name, 'auto', prefix)} kernels (variant= takes {variants}); {clib.call_mode()}"


def supported_variants(prefix: str = "matmul_packed") -> list[str]:
    """The variants of the kernels ``prefix`` names (matmul_packed: c.packed; matmul_decode,
    matmul_decode_int8, matmul_bf16) this CPU can run, best last ("portable" always, except for
    matmul_bf16, which has no portable kernel)."""
    _, lib = clib.load()
    supported = getattr(lib, f"{prefix}_variant_supported")
    return [name for name, number in VARIANTS.items() if name != "auto" and supported(number)]


def resolved_variant(name: str, variant: str = "auto", prefix: str = "matmul_packed") -> str:
    """The variant ``variant`` of implementation ``name`` runs as here ("auto" resolved): a
    ValueError for an unknown one, UnavailableError for one this CPU cannot run."""
    _, lib = clib.load()
    number = getattr(lib, f"{prefix}_resolve_variant")(variant_number(name, variant))
    if number < 0:
        raise UnavailableError(
            f"{name}: variant {variant!r} cannot run on this CPU (it supports: "
            f"{', '.join(supported_variants(prefix))}); choose one of those or variant='auto'"
        )
    return next(text for text, n in VARIANTS.items() if n == number)


def variant_number(name: str, variant) -> int:
    if variant not in VARIANTS:
        raise ValueError(f"{name}: unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    return VARIANTS[variant]


def packed_variants() -> list[str]:
    """The micro-kernel variants of c.packed this CPU can run, best last ("portable" always)."""
    return supported_variants("matmul_packed")


def packed_variant(variant: str = "auto") -> str:
    """The variant ``variant`` runs as here ("auto" resolved); a clear error if it cannot run."""
    return resolved_variant("c.packed", variant, "matmul_packed")


def packed_blocking(variant: str = "auto", dtype: str = "float32") -> dict:
    """The register tile and cache blocks c.packed uses here: MR, NR, KC, MC, NC, the cache
    sizes (bytes) they were derived from, deep_KC, the KC it takes where K is long and M
    spans several A blocks on a CPU where that was measured to pay (KC elsewhere), and
    one_block_NC, the NC of a B panel where M fits in one A block (sized for L2, or NC where
    the CPU gains from long rows)."""
    ffi, lib = clib.load()
    sizes = ffi.new("int64_t[10]")
    code = lib.matmul_packed_blocking(variant_number("c.packed", variant), np.dtype(dtype).itemsize, sizes)
    if code:
        packed_variant(variant)  # raises the clear error for an unsupported variant
        raise ValueError(f"c.packed: no blocking for dtype {dtype}")
    names = ("MR", "NR", "KC", "MC", "NC", "L1", "L2", "L3", "deep_KC", "one_block_NC")
    return dict(zip(names, (int(v) for v in sizes)))


class PackedBackend(CBackend):
    """c.packed: ``matmul_packed_path_<f32|f64>(A, B, C, M, N, K, threads, variant, path)``,
    which returns an error code; the options are checked here so that C is only called with
    ones it takes (path="vector" on a shape without M = 1 or N <= 8 is refused by C, code 4)."""

    def __init__(self):
        super().__init__("packed_path", fastest_gflops=300.0)

    def threads(self, extra_args) -> int:
        return extra_args[0]

    def extra_args(self, impl, options):
        threads = thread_option(impl, options)
        variant = options.get("variant", "auto")
        packed_variant(variant)  # an unsupported variant fails here, before any C runs
        path = options.get("path", "auto")
        if path not in PACKED_PATHS:
            raise ValueError(f"{impl.name}: unknown path {path!r}; choose one of {', '.join(PACKED_PATHS)}")
        return [int(threads), VARIANTS[variant], PACKED_PATHS[path]]

    def describe(self, impl) -> str | None:
        return variants_text(impl.name, "matmul_packed")

    def check_status(self, code) -> None:
        if code == _PATH_ERROR:
            raise MatmulInputError(
                "c.packed: path='vector' needs M = 1 or N <= 8 (a GEMV, or dot products against B's few "
                "columns), as does 'vector_read_ahead'; use path='auto'"
            )
        if code:
            raise RuntimeError(f"c.packed failed (code {code}): {_PACKED_ERRORS.get(code, 'unknown error')}")


# c.bf16's variants and what the instructions are called, for the unavailable reason.
BF16_VARIANTS = ("auto", "avx512bf16", "amx")
BF16_UNAVAILABLE = "not on this CPU: needs AVX512_BF16 (vdpbf16ps) or AMX-BF16"


def bf16_variants() -> list[str]:
    """The kernels of c.bf16 this CPU can run, best last (possibly none)."""
    return supported_variants("matmul_bf16")


def bf16_variant(variant: str = "auto") -> str:
    """The variant ``variant`` of c.bf16 runs as here ("auto" resolved); a ValueError for a name
    that is not one of its kernels, UnavailableError for one this CPU cannot run."""
    if variant not in BF16_VARIANTS:
        raise ValueError(f"c.bf16: unknown variant {variant!r}; choose one of {', '.join(BF16_VARIANTS)}")
    if not bf16_variants():
        raise UnavailableError(f"c.bf16: {BF16_UNAVAILABLE}")
    return resolved_variant("c.bf16", variant, "matmul_bf16")


def bf16_blocking(variant: str = "auto") -> dict:
    """The register tile and cache blocks of c.bf16's kernel here: MR (rows of its tile; 32
    columns), KC (the longest piece of the K sum: K is cut into equal pieces of at most KC),
    MC, NC, and own_B_max, the bytes of B up to which threads that cut C along M each pack
    their own B rather than share one (0: they always share)."""
    bf16_variant(variant)  # the clear error for an unknown or unsupported variant
    ffi, lib = clib.load()
    sizes = ffi.new("int64_t[5]")
    if lib.matmul_bf16_blocking(VARIANTS[variant], sizes):
        raise UnavailableError(f"c.bf16: {BF16_UNAVAILABLE}")
    return dict(zip(("MR", "KC", "MC", "NC", "own_B_max"), (int(v) for v in sizes)))


class Bf16Backend(CBackend):
    """c.bf16: ``matmul_bf16(A, B, C, M, N, K, threads, variant, out_bf16)`` on the bfloat16
    bit patterns (the arrays viewed as uint16), float32 sums, C rounded to bfloat16 inside the
    timed call (out_bf16 = 1), as the harness's bfloat16 rows answer in the problem's dtype."""

    _ERRORS = {
        1: "the variant cannot run on this CPU or build",
        2: "the pack buffers could not be allocated (out of memory)",
        3: "a dimension is negative",
    }

    def __init__(self):
        super().__init__("bf16", fastest_gflops=2000.0)
        self.functions = ("matmul_bf16", "matmul_bf16_variant_supported", "matmul_bf16_resolve_variant")

    def threads(self, extra_args) -> int:
        return extra_args[0]

    def unavailable_reason(self, impl):
        broken = super().unavailable_reason(impl)
        if broken:
            return broken
        return None if bf16_variants() else BF16_UNAVAILABLE

    def extra_args(self, impl, options):
        threads = thread_option(impl, options)
        variant = options.get("variant", "auto")
        bf16_variant(variant)  # an unknown or unsupported variant fails here, before any C runs
        return [int(threads), VARIANTS[variant], 1]

    def describe(self, impl) -> str | None:
        if not bf16_variants():
            return None
        return variants_text(impl.name, "matmul_bf16")

    def check_status(self, code) -> None:
        if code:
            raise RuntimeError(f"c.bf16 failed (code {code}): {self._ERRORS.get(code, 'unknown error')}")

    def prepare(self, impl, a, b, options):
        ffi, lib = clib.load()
        extra = self.extra_args(impl, options)
        (m, k), n = a.shape, b.shape[1]
        c = empty_output(m, n, a.dtype)
        bits = np.uint16
        args = (
            ffi.from_buffer("uint16_t[]", a.view(bits)),
            ffi.from_buffer("uint16_t[]", b.view(bits)),
            ffi.from_buffer("uint16_t[]", c.view(bits)),
            m,
            n,
            k,
            *extra,
        )
        interruptible = m * n * k >= self.interruptible_mnk(extra)
        return CCall(lib.matmul_bf16, args, c, (a, b), self.check_status, interruptible)

    def bind(self, impl, options):
        ffi, lib = clib.load()
        extra = tuple(self.extra_args(impl, options))
        function, ctype, from_buffer = lib.matmul_bf16, ffi.typeof("uint16_t[]"), ffi.from_buffer
        check_status, long_call = self.check_status, self.interruptible_mnk(extra)

        def call(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            (m, k), n = a.shape, b.shape[1]
            c = empty_output(m, n, a.dtype)
            args = (
                from_buffer(ctype, a.view(np.uint16)),
                from_buffer(ctype, b.view(np.uint16)),
                from_buffer(ctype, c.view(np.uint16)),
                m,
                n,
                k,
                *extra,
            )
            status = call_interruptibly(function, args) if m * n * k >= long_call else function(*args)
            if status:
                check_status(status)
            return c

        return call

    def fast_call(self, impl, options, max_elements):
        return None  # its arrays are passed as their bits (uint16): bind()'s call does that


register(
    Implementation(
        name="c.naive_ijk",
        language="c",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="textbook triple loop in C: strided column walk, serial sum, no SIMD",
        backend=CBackend("naive_ijk", fastest_gflops=2.0),
        source="c/naive.c",
    )
)
register(
    Implementation(
        name="c.naive_ikj",
        language="c",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="i, p, j order in C: unit-stride inner loop the compiler vectorizes",
        backend=CBackend("naive_ikj", fastest_gflops=20.0),
        source="c/naive.c",
    )
)
register(
    Implementation(
        name="c.blocked",
        language="c",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="ikj run tile by tile so a tile of B is reused from cache",
        backend=CBackend("blocked", ("tile",), fastest_gflops=60.0),
        source="c/blocked.c",
        options={"tile": 64},
    )
)
register(
    Implementation(
        name="c.goto",
        language="c",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="the five-loop Goto/BLIS algorithm: A and B packed per cache level, a register-tile micro-kernel",
        backend=CBackend("goto", fastest_gflops=100.0),
        source="c/goto.c",
    )
)
register(
    Implementation(
        name="c.packed",
        language="c",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="Goto/BLIS: packed panels, cache blocks from the cache sizes, SIMD register-tile micro-kernel, threads",
        backend=PackedBackend(),
        source="c/packed.c",
        options={"threads": None, "variant": "auto", "path": "auto"},
        threaded=True,
    )
)
register(
    Implementation(
        name="c.bf16",
        language="c",
        device="cpu",
        dtypes=("bfloat16",),
        summary="bfloat16 in, float32 sums: B packed in k pairs, AMX tiles (TDPBF16PS) or AVX512_BF16 vdpbf16ps",
        backend=Bf16Backend(),
        source="c/bf16.c",
        options={"threads": None, "variant": "auto"},
        threaded=True,
    )
)
