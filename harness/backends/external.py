"""Your own matmul, kept outside this repository, beside ours: ``FILE:FUNCTION``.

    python -m harness compare --impls path/to/mine.py:matmul c.packed --shapes 512
    python -m harness compare --impls path/to/mine.c:my_matmul --shapes 512
    pytest --benchmark-only --matmul-impls path/to/mine.py:matmul
    harness.add_external("path/to/mine.py:matmul")      # from Python: returns its name

- ``mine.py:matmul``: a Python function ``matmul(a, b) -> C`` on two NumPy arrays (float32 or
  float64, C-contiguous, read-only: never write into them) returning the product as a NumPy
  array of their dtype. It may call anything: a Triton wrapper, a CuPy kernel, a C library.
- ``mine.c:my_matmul``: a C file with the project's signature (c/matmul.h),
  ``void my_matmul_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K)``
  and/or the same with ``_f64`` and double (or one unsuffixed ``my_matmul`` on float). It is
  compiled here with the system's C compiler (``-O3 -march=native``; ``CC`` chooses another)
  into the user cache folder (cache.py), rebuilt when the file changes or the cached library
  is damaged, and called through ctypes.

Either is registered as ``<file stem>.<function>`` (``mine.matmul``; a second file with that
stem, in another folder, as ``v2/mine.matmul``), checked against the same float64 reference
with the same error model before it is timed, and shows up in every table, JSON and plot like
ours. ``compare`` runs it in a worker process of its own (isolation.py), where a crash or a
hang is a row; called through ``harness.get`` it runs in the caller's process.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.env import cache, sources
from harness.env.interrupts import call_interruptibly
from harness.model.core import Backend, Implementation, Prepared
from harness.model.registry import REGISTRY, register

# From this many multiply-adds a call (which may take seconds: a naive loop does about one per
# nanosecond) runs where Ctrl-C can stop the wait for it (backends/c.py); below, the worker
# thread's tens of microseconds would show in the timing.
INTERRUPTIBLE_MNK = 1 << 24

C_TYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double}
SUFFIXES = {"float32": "_f32", "float64": "_f64"}


class ExternalError(ValueError):
    """A FILE:FUNCTION that cannot be used; the message says why."""


@lru_cache(maxsize=None)
def _compiler_identity(compiler: str) -> str:
    """The compiler and its version: an upgraded compiler builds the library again."""
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    except OSError:
        version = ""
    return f"{compiler} {version}"


def is_external(spec: str) -> bool:
    """True for FILE:FUNCTION (a file that ends .py or .c), as opposed to a name or pattern."""
    path, _, function = spec.rpartition(":")
    return bool(path and function) and path.endswith((".py", ".c"))


def add_external(spec: str) -> str:
    """Register the implementation ``spec`` names (FILE:FUNCTION) and return its name. Adding the
    same file and function again replaces it (an edited file takes effect)."""
    path_text, _, function = spec.rpartition(":")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise ExternalError(f"{spec}: no such file {path}")
    if not function.isidentifier():
        raise ExternalError(f"{spec}: {function!r} is not a function name")
    name = _name_for(path, function)
    existing = REGISTRY.get(name)
    if existing is not None and external_recipe(existing) is None:
        raise ExternalError(f"{spec}: its name {name!r} is one of this repository's implementations; rename the file")
    impl = implementation_from_recipe(("external", str(path), function, name))
    try:
        problem = impl.backend.unavailable_reason(impl)  # a typo in the name, a file that does not compile
    except OSError as error:  # an unwritable cache, say: a reason, not a traceback
        problem = f"{error.strerror or error}: {error.filename or ''}".rstrip(": ")
    if problem:
        raise ExternalError(f"{spec}: {problem}")
    register(impl, replace=True)
    return name


def _name_for(path: Path, function: str) -> str:
    """``<stem>.<function>``, or, when another file with that stem is registered already,
    the folders above it too (``v2/mine.matmul``) until the name is its own: two files never
    share a row."""
    parts = path.parts[:-1]
    for depth in range(len(parts) + 1):
        prefix = "/".join(parts[len(parts) - depth :]) if depth else ""
        name = f"{prefix}/{path.stem}.{function}" if prefix else f"{path.stem}.{function}"
        existing = REGISTRY.get(name)
        if existing is None or external_recipe(existing) in (None, ("external", str(path), function, name)):
            return name
    return f"{path}.{function}"  # unreachable: the full path is unique


def external_recipe(impl: Implementation) -> tuple | None:
    """("external", file, function, name) for a user's implementation, None for ours: what a
    worker process (isolation.py) needs to make it again."""
    backend = impl.backend
    if isinstance(backend, (_PythonFunction, _CFunction)):
        return ("external", str(backend.path), backend.function, impl.name)
    return None


def spec_text(impl: Implementation) -> str:
    """How a user named ``impl``: ``mine.c:my_matmul``, with the folders its name has
    (``v2/mine.c:my_matmul``, when two files are called mine.c)."""
    folders = impl.name.rpartition("/")[0]
    return f"{folders + '/' if folders else ''}{impl.backend.path.name}:{impl.backend.function}"


def implementation_from_recipe(recipe: tuple) -> Implementation:
    """The Implementation of a user's FILE:FUNCTION (not registered: add_external does that)."""
    _, path_text, function, name = recipe
    path = Path(path_text)
    if path.suffix == ".py":
        backend, language, dtypes = _PythonFunction(path, function), "python", ("float32", "float64")
    else:
        backend, language = _CFunction(path, function), "c"
        dtypes = backend.dtypes()
    return Implementation(
        name=name,
        language=language,
        device="cpu",
        dtypes=dtypes,
        summary=f"your own: {function} in {path}",
        backend=backend,
        source=str(path),
    )


class _Prepared(Prepared):
    def __init__(self, call, a, b):
        self.call, self.a, self.b = call, a, b
        self.c = None

    def run(self) -> None:
        self.c = self.call(self.a, self.b)

    def result(self) -> np.ndarray:
        return self.c


class _PythonFunction(Backend):
    def __init__(self, path: Path, function: str):
        self.path, self.function = path, function

    def _load(self):
        spec = importlib.util.spec_from_file_location(f"_external_{self.path.stem}", self.path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            raise ExternalError(f"{self.path} failed to import: {type(error).__name__}: {error}") from error
        function = getattr(module, self.function, None)
        if not callable(function):
            raise ExternalError(f"{self.path} has no function {self.function}")
        return function

    def unavailable_reason(self, impl):
        try:
            self._load()
        except ExternalError as error:
            return str(error)
        return None

    def bind(self, impl, options):
        return self._load()

    def prepare(self, impl, a, b, options):
        return _Prepared(self._load(), a, b)


class _CFunction(Backend):
    def __init__(self, path: Path, function: str):
        self.path, self.function = path, function
        self._loaded: tuple[str, ctypes.CDLL] | None = None  # (built library's path, it)

    def _library(self):
        """The file compiled and loaded: once per version of its text (the path names it)."""
        library = self._build()
        if self._loaded is None or self._loaded[0] != str(library):
            self._loaded = (str(library), ctypes.CDLL(str(library)))
        return self._loaded[1]

    def _build(self) -> Path:
        """The compiled library in the cache, built when missing or damaged. Its name holds a
        hash of everything that makes it (the file's text, the project's headers, the compiler
        and flags), never a path or a time, so a moved or read-only checkout reuses it; and it
        is loaded only when it is byte for byte what its build wrote (cache.intact)."""
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not compiler:
            raise ExternalError(f"{self.path}: no C compiler (cc, gcc or clang) to build it with; set CC")
        headers = sources.source_path("c")
        flags = ["-O3", "-march=native", "-shared", "-fPIC"]
        key = hashlib.sha256(
            "\0".join(
                [self.path.read_text(), _compiler_identity(compiler), *flags]
                + [header.read_text() for header in sorted(headers.glob("*.h"))]
            ).encode()
        ).hexdigest()[:16]
        folder = cache.user_cache_root() / "external"
        library = folder / f"{self.path.stem}-{key}.so"
        if cache.intact(library):
            return library
        try:
            folder.mkdir(parents=True, exist_ok=True)
            cache.forget(library)  # damaged, or never finished: built again, never loaded
            partial = library.with_suffix(f".{os.getpid()}.partial")
            done = subprocess.run(
                [compiler, *flags, "-I", str(headers), "-o", str(partial), str(self.path)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[-300:])
                raise ExternalError(f"{self.path} does not compile: {first}")
            os.replace(partial, library)
            cache.record(library)
        except OSError as error:
            raise ExternalError(
                f"cannot build {self.path.name} into the cache folder {folder}: {error.strerror or error}; "
                "set XDG_CACHE_HOME to a folder you can write"
            ) from None
        return library

    def _symbols(self, library) -> dict[str, object]:
        found = {}
        for dtype, suffix in SUFFIXES.items():
            symbol = getattr(library, self.function + suffix, None)
            if symbol is not None:
                found[dtype] = symbol
        if not found and getattr(library, self.function, None) is not None:
            found["float32"] = getattr(library, self.function)
        if not found:
            raise ExternalError(
                f"{self.path} defines none of {self.function}_f32, {self.function}_f64, {self.function}"
            )
        for dtype, symbol in found.items():
            pointer = ctypes.POINTER(C_TYPES[dtype])
            symbol.argtypes = [pointer, pointer, pointer, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
            symbol.restype = None
        return found

    def dtypes(self) -> tuple[str, ...]:
        try:
            return tuple(self._symbols(self._library()))
        except ExternalError:
            return ("float32",)  # unavailable_reason says why

    def unavailable_reason(self, impl):
        try:
            self._symbols(self._library())
        except (ExternalError, OSError) as error:
            return str(error)
        return None

    def bind(self, impl, options):
        symbols = self._symbols(self._library())

        def call(a, b):
            (m, k), n = a.shape, b.shape[1]
            c = np.empty((m, n), dtype=a.dtype)
            name = "float32" if a.dtype == np.float32 else "float64"
            pointer = ctypes.POINTER(C_TYPES[name])
            arguments = (a.ctypes.data_as(pointer), b.ctypes.data_as(pointer), c.ctypes.data_as(pointer), m, n, k)
            if m * n * k >= INTERRUPTIBLE_MNK:
                call_interruptibly(symbols[name], arguments)
            else:
                symbols[name](*arguments)
            return c

        return call

    def prepare(self, impl, a, b, options):
        return _Prepared(self.bind(impl, options), a, b)
