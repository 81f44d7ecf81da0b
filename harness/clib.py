"""The C library: find it (building it first in a checkout), declare it to cffi, load it.

In a checkout the library is built with CMake into ``build/harness-c/`` and rebuilt whenever
a C source, header or CMakeLists.txt is newer than it, so an edited ``c/*.c`` takes effect on
the next run. A build counts only once it has finished: a stamp beside the library records
the size and time of the library a successful build produced, so a build killed while linking
(which can leave a truncated library newer than its sources) is rebuilt, not loaded. When the
library is current nothing is locked or written, so a read-only checkout works. The stamp
also names the CPU that built it: the checkout's build uses ``-march=native``, so a checkout
moved to another CPU is rebuilt there. An installed wheel uses the library it was built with
(``harness/_lib``), which is compiled for plain x86-64 (pyproject.toml).
``MATMUL_C_LIBRARY=/path/to/libmatmul.so`` overrides both (the sanitizer build uses it).

Before its first call, the library is asked which instruction-set extensions it was compiled
for and which of them this CPU lacks (c/build_isa.c); a library built for another CPU is
refused with an error that names them, never run into an illegal instruction.

The library is called through the compiled call glue built beside it (call_glue.py: cffi's
API mode, cheaper per call), or, where that could not be built, through
``ffi.dlopen``; ``call_mode()`` says which.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from . import call_glue, files, sources

LIBRARY_NAMES = {"linux": "libmatmul.so", "darwin": "libmatmul.dylib"}


class CLibraryError(RuntimeError):
    """The C library could not be built or loaded; the message says how to fix it."""


class CLibraryBuiltForAnotherCPU(CLibraryError):
    """The library uses instructions this CPU lacks (loading it again would not help)."""


_build_lock = threading.Lock()


@contextmanager
def interprocess_lock(build_dir: Path):
    """Serialise builds across processes (pytest workers, a second shell) on one build dir.

    The lock file is never followed through a symlink nor truncated (files.locked): a link
    planted at build/.../.build.lock is refused, not written through. Where there is no flock
    (Windows), builds are only serialised within a process."""
    build_dir.mkdir(parents=True, exist_ok=True)
    with files.locked(build_dir / ".build.lock"):
        yield


def _library_filename() -> str:
    return LIBRARY_NAMES.get(sys.platform, "libmatmul.so")


def checkout_build_dir() -> Path:
    return sources.sources_root() / "build" / "harness-c"


def _c_inputs(root: Path) -> list[Path]:
    return [root / "CMakeLists.txt", root / "harness" / "call_glue.py", *sorted((root / "c").rglob("*.[ch]"))]


def _stamp(library: Path) -> Path:
    return library.with_name(library.name + ".built")


@lru_cache(maxsize=None)
def this_cpu() -> str:
    """Names this CPU model and its instruction-set flags, for telling one machine's builds
    from another's (a digest: the flags line alone is over a thousand characters)."""
    identity = f"{platform.machine()} {platform.processor()}"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            wanted = [line for line in cpuinfo if line.startswith(("model name", "flags"))]
        identity += "".join(sorted(set(wanted)))
    except OSError:  # not Linux: the machine and processor names are what there is
        pass
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _fingerprint(library: Path) -> str:
    info = library.stat()
    return f"{info.st_size} {info.st_mtime_ns}\nbuilt on cpu {this_cpu()}\n"


def _is_stale(library: Path, root: Path) -> bool:
    """True unless ``library`` is what a finished build on this CPU produced and newer than
    every source."""
    try:
        if _stamp(library).read_text() != _fingerprint(library):
            return True
    except OSError:  # no library, or no stamp: never finished building
        return True
    built = library.stat().st_mtime_ns
    return any(p.stat().st_mtime_ns > built for p in _c_inputs(root))


def _cmake() -> str:
    found = shutil.which("cmake")
    if found:
        return found
    try:  # the `cmake` package from PyPI puts one beside the interpreter
        import cmake  # type: ignore

        return str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
    except ImportError:
        raise CLibraryError(
            "cmake is needed to build the C library in a checkout; install it "
            "(`pip install cmake` or your system's package) or reinstall with `pip install .`"
        ) from None


def build_in_checkout(build_dir: Path | None = None, *extra_cmake_args: str) -> Path:
    """Configure and build the C library with CMake; returns the library path."""
    root = sources.sources_root()
    build_dir = build_dir or checkout_build_dir()
    exported_functions()  # a name marked in two files: said here, not as the linker's duplicate symbol
    cmake = _cmake()
    # A library left by a build killed while linking can be newer than the objects, and CMake
    # would keep it: remove it so it is linked again (unlinking leaves a loaded copy intact).
    (build_dir / _library_filename()).unlink(missing_ok=True)
    commands = [
        # This interpreter's headers for the call glue, whatever python3 is first on PATH.
        [
            cmake,
            "-S",
            str(root),
            "-B",
            str(build_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DPython_EXECUTABLE={sys.executable}",
            *extra_cmake_args,
        ],
        [cmake, "--build", str(build_dir), "--parallel"],
    ]
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            log = build_dir / "build-error.log"
            output = done.stdout + done.stderr
            build_dir.mkdir(parents=True, exist_ok=True)
            files.write_text(log, f"$ {' '.join(command)}\n{output}")
            raise CLibraryError(f"building the C library failed: {first_error(output)}\n(full log: {log})")
    library = build_dir / _library_filename()
    if not library.is_file():
        raise CLibraryError(f"CMake finished but {library} is missing")
    library.touch()  # a no-op rebuild must still make the library newer than its sources
    files.write_text(_stamp(library), _fingerprint(library))  # last, and whole: the build is complete
    return library


def first_error(output: str) -> str:
    """The compiler's first error, with the line before it when that names the function."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if re.search(r"\berror\b", line, flags=re.I):
            context = lines[index - 1] if index and "In function" in lines[index - 1] else ""
            return (context + "\n" if context else "") + line.strip()
    return lines[-1].strip() if lines else "(no output)"


def library_path() -> Path:
    """The library to load, building it first when running from a stale checkout."""
    override = os.environ.get("MATMUL_C_LIBRARY")
    if override:
        return Path(override)
    if sources.in_checkout():
        library = checkout_build_dir() / _library_filename()
        if not _is_stale(library, sources.sources_root()):
            return library  # current: no lock, nothing written (a read-only checkout works)
        with _build_lock, interprocess_lock(checkout_build_dir()):
            if _is_stale(library, sources.sources_root()):  # another process may have built it
                build_in_checkout()
        return library
    installed = sources.PACKAGE_DIR / "_lib" / _library_filename()
    if not installed.is_file():
        raise CLibraryError(f"the installed C library {installed} is missing; reinstall with `pip install .`")
    return installed


def exported_functions() -> dict:
    """The library's functions by name (call_glue.Export: declaration and file), gathered from
    the MATMUL_API marks of c/*.c; a clear error if two files mark the same name."""
    try:
        return call_glue.exported_functions(sources.source_path("c"))
    except call_glue.DeclarationError as error:
        raise CLibraryError(f"the C sources' declarations: {error}") from None


def cdef_text() -> str:
    """The declarations for cffi, gathered from the MATMUL_API definitions of c/*.c."""
    return "\n".join(export.declaration for export in exported_functions().values()) + "\n"


def _glue_beside(library: Path) -> Path | None:
    """The call glue built beside ``library`` for this interpreter, if it is there and (in a
    checkout) at least as new as the sources it was generated from."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        glue = library.parent / f"{call_glue.MODULE_NAME}{suffix}"
        if glue.is_file():
            break
    else:
        return None
    if sources.in_checkout() and not os.environ.get("MATMUL_C_LIBRARY"):
        root = sources.sources_root()
        inputs = (*call_glue.source_files(root / "c"), root / "harness" / "call_glue.py")
        newest_input = max(p.stat().st_mtime_ns for p in inputs)
        if glue.stat().st_mtime_ns < newest_input:
            return None
    return glue


@lru_cache(maxsize=None)
def _load(path: str):
    """(ffi, lib, mode) for the library at ``path``: through its call glue when there is one,
    else through ffi.dlopen; refused if it was compiled for instructions this CPU lacks."""
    loaded = _load_through_glue(Path(path))
    if loaded is None:
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(cdef_text())
        try:
            loaded = ffi, ffi.dlopen(path), "dlopen"
        except OSError as error:
            raise CLibraryError(f"cannot load the C library {path}: {error}") from error
    _refuse_if_built_for_another_cpu(path, *loaded[:2])
    return loaded


def _load_through_glue(library: Path):
    glue = _glue_beside(library)
    if glue is None:
        return None
    try:
        spec = importlib.util.spec_from_file_location(call_glue.MODULE_NAME, glue)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.ffi, module.lib, "compiled glue"
    except ImportError:  # built for another interpreter, or damaged: dlopen still works
        return None


def _isa_list(ffi, lib, query: str) -> list[str]:
    """What one of build_isa.c's two functions writes, as a list of extension names."""
    size = 1024  # every name build_isa.c knows fits many times over
    buffer = ffi.new("char[]", size)
    try:
        count = getattr(lib, query)(buffer, size)
    except AttributeError:  # dlopen: the symbol is looked up at first use
        raise CLibraryError(
            f"the C library has no {query}(): it is not this project's library, or a build older "
            "than its sources; rebuild it (or unset MATMUL_C_LIBRARY)"
        ) from None
    if count < 0:
        raise CLibraryError(f"{query}() needed more than {size} bytes")
    return ffi.string(buffer).decode().split()


def _refuse_if_built_for_another_cpu(path: str, ffi, lib) -> None:
    missing = _isa_list(ffi, lib, "matmul_build_missing_isa")
    if missing:
        raise CLibraryBuiltForAnotherCPU(
            f"the C library {path} was compiled for instructions this CPU lacks ({', '.join(missing)}): "
            "it was built for another CPU (-march=native or MATMUL_MARCH). Rebuild it on this one "
            "(`pip install .`, or in a checkout delete build/harness-c), or build a portable one with "
            "-DMATMUL_NATIVE=OFF (`pip install . -Ccmake.define.MATMUL_NATIVE=OFF`)"
        )


def build_isa() -> list[str]:
    """The instruction-set extensions, beyond plain x86-64, the loaded library was compiled for
    (empty for a portable build)."""
    return _isa_list(*load(), "matmul_build_isa")


_load_lock = threading.Lock()
_loaded = None  # (ffi, lib, mode) once loaded: the library is located, built and loaded once per process


def load():
    """(ffi, lib), located (and in a stale checkout built) on the first call only, so a call
    through cffi costs no file-system work. A process keeps the copy it loaded first anyway
    (the dynamic loader will not load one path twice): an edited ``c/*.c`` takes effect in the
    next process. A checkout's library that will not load is rebuilt once (a damaged file)."""
    global _loaded
    if _loaded is None:
        with _load_lock:
            if _loaded is None:
                _loaded = _locate_and_load()
    return _loaded[:2]


def call_mode() -> str:
    """How the library is called: "compiled glue" (cffi's API mode) or "dlopen"."""
    load()
    return _loaded[2]


def _locate_and_load():
    path = library_path()
    try:
        return _load(str(path))
    except CLibraryBuiltForAnotherCPU:
        raise  # loaded already: the process keeps this copy, rebuilt or not
    except CLibraryError:
        if os.environ.get("MATMUL_C_LIBRARY") or not sources.in_checkout():
            raise
        _stamp(path).unlink(missing_ok=True)
        _load.cache_clear()
        return _load(str(library_path()))
