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
  into a cache folder, rebuilt when the file changes, and called through ctypes.

Either is registered as ``<file stem>.<function>`` (``mine.matmul``), checked against the same
float64 reference with the same error model before it is timed, and shows up in every table,
JSON and plot like ours.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

from . import sources
from .core import Implementation
from .registry import REGISTRY, register

C_TYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double}
SUFFIXES = {"float32": "_f32", "float64": "_f64"}


class ExternalError(ValueError):
    """A FILE:FUNCTION that cannot be used; the message says why."""


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
    name = f"{path.stem}.{function}"
    existing = REGISTRY.get(name)
    if existing is not None and not isinstance(existing.backend, (_PythonFunction, _CFunction)):
        raise ExternalError(f"{spec}: its name {name!r} is one of this repository's implementations; rename the file")
    if path.suffix == ".py":
        backend = _PythonFunction(path, function)
        dtypes = ("float32", "float64")
    else:
        backend = _CFunction(path, function)
        dtypes = backend.dtypes()
    problem = backend.unavailable_reason(None)  # a typo in the name, a file that does not compile
    if problem:
        raise ExternalError(f"{spec}: {problem}")
    language = "python" if path.suffix == ".py" else "c"
    register(
        Implementation(
            name=name,
            language=language,
            device="cpu",
            dtypes=dtypes,
            summary=f"your own: {function} in {path}",
            backend=backend,
            source=str(path),
        ),
        replace=True,
    )
    return name


class _Prepared:
    mode = "native"

    def __init__(self, call, a, b):
        self.call, self.a, self.b = call, a, b
        self.c = None

    def run(self) -> None:
        self.c = self.call(self.a, self.b)

    def result(self) -> np.ndarray:
        return self.c


class _PythonFunction:
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


class _CFunction:
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
        compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not compiler:
            raise ExternalError(f"{self.path}: no C compiler (cc, gcc or clang) to build it with; set CC")
        flags = ["-O3", "-march=native", "-shared", "-fPIC", "-I", str(sources.source_path("c"))]
        key = hashlib.sha256("\0".join([self.path.read_text(), compiler, *flags]).encode()).hexdigest()[:16]
        folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "matmul-reference" / "external"
        library = folder / f"{self.path.stem}-{key}.so"
        if not library.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            partial = library.with_suffix(f".{os.getpid()}.partial")
            done = subprocess.run(
                [compiler, *flags, "-o", str(partial), str(self.path)], capture_output=True, text=True
            )
            if done.returncode != 0:
                partial.unlink(missing_ok=True)
                first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[-300:])
                raise ExternalError(f"{self.path} does not compile: {first}")
            os.replace(partial, library)
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
            symbols[name](a.ctypes.data_as(pointer), b.ctypes.data_as(pointer), c.ctypes.data_as(pointer), m, n, k)
            return c

        return call

    def prepare(self, impl, a, b, options):
        return _Prepared(self.bind(impl, options), a, b)
