"""The C library: find it (building it first in a checkout), declare it to cffi, load it.

In a checkout the library is built with CMake into ``build/harness-c/`` and rebuilt whenever
what it is built from changes: a stamp beside it records a hash of the contents of every C
source and header, CMakeLists.txt and harness/backends/c/call_glue.py, the CPU that built it, and the size
and SHA-256 of the library (and of the call glue) that the build produced. The library is
current only while all of that still matches: an edited ``c/*.c`` takes effect on the next
run; a build killed while linking (which can leave a truncated library) is rebuilt, not
loaded; and the checkout's build uses ``-march=native``, so a checkout moved to another CPU is
rebuilt there. Nothing in the stamp is a path or a time, so a copy of the checkout, moved
(``cp -a``) or with its times reset (``cp -r``), runs what it has built; and when the library
is current nothing is locked or written, so a read-only checkout works. A rebuild that is
needed where the build folder cannot be written is an error that says so.

An installed wheel uses the library it was built with (``harness/_lib``), which is compiled
for plain x86-64 (pyproject.toml). ``MATMUL_C_LIBRARY=/path/to/libmatmul.so`` overrides both
(the sanitizer build uses it): exactly that file is loaded, or the error says why not.

Before it is loaded, a library is checked to be a whole ELF file (``_refuse_if_truncated``):
the checkout's is vouched for by its stamp's hash, but MATMUL_C_LIBRARY's and the installed
one are not, and a truncated shared library is mapped past its end, where the first touch of a
missing page kills the process with SIGBUS, which no ``try`` catches.

Before its first call, the library is asked which instruction-set extensions it was compiled
for and which of them this CPU lacks (c/build_isa.c); a library built for another CPU is
refused with an error that names them, never run into an illegal instruction.

The library is called through the compiled call glue built beside it (call_glue.py: cffi's
API mode, cheaper per call), or, where that could not be built or MATMUL_C_LIBRARY names the
library (``_glue_beside`` says why), through ``ffi.dlopen``; ``call_mode()`` says which.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from harness.backends.c import call_glue
from harness.env import cache, files, sources

CALL_GLUE_SOURCE = "harness/backends/c/call_glue.py"  # relative to the checkout: it generates the glue
FAST_CALL_SOURCE = "harness/backends/c/fast_call.c"  # the compiled common case of a call (its comment says why)
FAST_CALL_MODULE = "_matmul_fast_call"
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


def library_filename() -> str:
    return LIBRARY_NAMES.get(sys.platform, "libmatmul.so")


def checkout_build_dir() -> Path:
    return sources.sources_root() / "build" / "harness-c"


def _c_inputs(root: Path) -> list[Path]:
    return [
        root / "CMakeLists.txt",
        root / CALL_GLUE_SOURCE,
        root / FAST_CALL_SOURCE,
        *sorted((root / "c").rglob("*.[ch]")),
    ]


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


BUILT_ON_ANOTHER_CPU = "it was built on another CPU"


def _inputs_digest(root: Path) -> str:
    """A hash of the names (relative to ``root``) and contents of everything the build reads:
    no absolute path and no time, so a moved or copied checkout gets the same one."""
    digest = hashlib.sha256()
    for path in _c_inputs(root):
        content = path.read_bytes()
        digest.update(f"{path.relative_to(root).as_posix()}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def _extension_files(folder: Path, module: str) -> list[Path]:
    """The extension ``module`` in ``folder`` as this interpreter can import it (the file names it would try)."""
    return [folder / f"{module}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES]


def _glue_files(folder: Path) -> list[Path]:
    """The call glue, and the fast call beside it, in ``folder`` (every file name they may have)."""
    return _extension_files(folder, call_glue.MODULE_NAME) + _extension_files(folder, FAST_CALL_MODULE)


def _stamp_text(library: Path, root: Path) -> str:
    """What a finished build of ``library`` from ``root``'s sources on this CPU writes beside it:
    the inputs' hash, this CPU, then ``<size> <sha256> <name>`` of the library and of the call
    glue built with it (the glue is linked against that library: one stamp vouches for both, and
    for the fast call built beside them)."""
    built = [library, *(glue for glue in _glue_files(library.parent) if glue.is_file())]
    lines = [f"sources {_inputs_digest(root)}", f"cpu {this_cpu()}"]
    lines += [f"{cache.fingerprint(artefact)} {artefact.name}" for artefact in built]
    return "\n".join(lines) + "\n"


def write_stamp(library: Path, root: Path) -> None:
    """Record ``library`` (and its glue) as a finished build of ``root``'s sources on this CPU."""
    files.write_text(_stamp(library), _stamp_text(library, root))


def _recorded_artefacts(library: Path) -> dict[str, str]:
    """The files the stamp beside ``library`` vouches for: {name: "<size> <sha256>"} (empty when
    there is no stamp, or one that is not this format)."""
    try:
        lines = _stamp(library).read_text().splitlines()
    except (OSError, ValueError):  # ValueError: not UTF-8
        return {}
    recorded = {}
    for line in lines[2:]:
        fingerprint, _, name = line.rpartition(" ")
        if fingerprint and name == Path(name).name:  # a plain file name beside the library
            recorded[name] = fingerprint
    return recorded


def _matches(path: Path, fingerprint: str | None) -> bool:
    try:
        return fingerprint is not None and cache.fingerprint(path) == fingerprint
    except OSError:
        return False


def _stale_reason(library: Path, root: Path) -> str | None:
    """Why ``library`` is not what a finished build of ``root``'s current sources on this CPU
    produced, or None when it is (then it may be loaded as it is)."""
    try:
        lines = _stamp(library).read_text().splitlines()
    except (OSError, ValueError):  # no library, or no stamp: never finished building
        return "no build of it has finished"
    recorded = _recorded_artefacts(library)
    if len(lines) < 3 or library.name not in recorded or not lines[0].startswith("sources "):
        return "no build of it has finished"  # or one from before the stamps held hashes
    try:
        if lines[0] != f"sources {_inputs_digest(root)}":
            return "its sources changed since it was built"
    except OSError as error:
        return f"its source {error.filename} cannot be read"
    if lines[1] != f"cpu {this_cpu()}":
        return BUILT_ON_ANOTHER_CPU
    for name, fingerprint in recorded.items():
        if not _matches(library.parent / name, fingerprint):
            return f"{name} is not what its build produced (missing, emptied, truncated or replaced since)"
    return None


def _is_stale(library: Path, root: Path) -> bool:
    """True unless ``library`` is what a finished build of ``root``'s current sources on this
    CPU produced, byte for byte."""
    return _stale_reason(library, root) is not None


def cmake_executable() -> str:
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


def build_in_checkout(build_dir: Path | None = None, *extra_cmake_args: str, clean_first: bool = False) -> Path:
    """Configure and build the C library with CMake; returns the library path. ``clean_first``
    recompiles every object (CMake alone would only relink objects built for another CPU:
    the compiler flags, ``-march=native``, read the same)."""
    root = sources.sources_root()
    build_dir = build_dir or checkout_build_dir()
    exported_functions()  # a name marked in two files: said here, not as the linker's duplicate symbol
    cmake = cmake_executable()
    library = build_dir / library_filename()
    # The stamp goes first and comes back last: a build killed on the way leaves none. A library
    # left by a build killed while linking can be newer than the objects, and CMake would keep
    # it: remove it (and the glue linked to it) so they are linked again; unlinking leaves a
    # loaded copy intact, and the stamp then vouches only for what this build produced.
    for stale in (_stamp(library), library, *_glue_files(build_dir)):
        stale.unlink(missing_ok=True)
    clean_first = _forget_configuration_of_another_checkout(build_dir, root) or clean_first
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
        [cmake, "--build", str(build_dir), "--parallel", *(["--clean-first"] if clean_first else [])],
    ]
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            log = build_dir / "build-error.log"
            output = done.stdout + done.stderr
            build_dir.mkdir(parents=True, exist_ok=True)
            files.write_text(log, f"$ {' '.join(command)}\n{output}")
            raise CLibraryError(f"building the C library failed: {first_error(output)}\n(full log: {log})")
    if not library.is_file():
        raise CLibraryError(f"CMake finished but {library} is missing")
    write_stamp(library, root)  # last, and whole: the build is complete
    return library


def _forget_configuration_of_another_checkout(build_dir: Path, root: Path) -> bool:
    """CMake refuses to build in a folder configured for another source folder (the build/ of a
    checkout that was copied or moved, then edited): start its configuration afresh. True when
    it did (every object is then rebuilt)."""
    try:
        text = (build_dir / "CMakeCache.txt").read_text()
    except (OSError, ValueError):
        return False
    configured = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", text, flags=re.M)
    if configured is None or os.path.realpath(configured[1]) == os.path.realpath(root):
        return False
    (build_dir / "CMakeCache.txt").unlink()
    shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
    return True


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
        return Path(os.path.abspath(override))  # that very file: dlopen searches no folders for it
    if sources.in_checkout():
        root, build_dir = sources.sources_root(), checkout_build_dir()
        library = build_dir / library_filename()
        reason = _stale_reason(library, root)
        if reason is None:
            return library  # current: no lock, nothing written (a read-only checkout works)
        try:
            with _build_lock, interprocess_lock(build_dir):
                reason = _stale_reason(library, root)  # another process may have built it
                if reason is not None:
                    build_in_checkout(clean_first=reason == BUILT_ON_ANOTHER_CPU)
        except OSError as error:  # a read-only checkout that needs a build: say so, never "unavailable"
            raise CLibraryError(
                f"the C library {library} must be built again ({reason}), but {build_dir} cannot be "
                f"written ({error.strerror or error}): make the checkout writable, or point "
                "MATMUL_C_LIBRARY at a build of it"
            ) from error
        return library
    installed = sources.PACKAGE_DIR / "_lib" / library_filename()
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


def _glue_beside(library: Path, module: str = call_glue.MODULE_NAME) -> Path | None:
    """The call glue to call ``library`` through, or None for ffi.dlopen (``module``: the fast
    call built with it, which is used only with the glue).

    In a checkout, only glue that the library's current stamp vouches for (built with it, byte
    for byte as that build left it). With MATMUL_C_LIBRARY, never: the glue finds the library
    it calls through its own runpath ($ORIGIN, then the folder it was built in) and
    LD_LIBRARY_PATH, never through the name the variable gives, so nothing proves it would call
    that file (beside an empty.so it called the libmatmul.so next to it). dlopen of the named
    path loads exactly that file, at about 2 us more a call: the overrides are sanitizer and
    instruction-set builds, run for correctness, not timed. An installed wheel's glue was built
    and installed with its library, beside it."""
    if os.environ.get("MATMUL_C_LIBRARY"):
        return None
    candidates = _extension_files(library.parent, module)
    if sources.in_checkout():
        recorded = _recorded_artefacts(library)
        return next((glue for glue in candidates if _matches(glue, recorded.get(glue.name))), None)
    return next((glue for glue in candidates if glue.is_file()), None)


@lru_cache(maxsize=None)
def _load(path: str):
    """(ffi, lib, mode, FastCall or None) for the library at ``path``: through its call glue
    when there is one, else through ffi.dlopen; refused if it is truncated, or was compiled for
    instructions this CPU lacks."""
    _refuse_if_truncated(Path(path))
    loaded = _load_through_glue(Path(path))
    if loaded is None:
        return (*dlopen_file(Path(path)), "dlopen", None)
    _refuse_if_built_for_another_cpu(path, *loaded[:2])
    return loaded


def dlopen_file(path: Path):
    """(ffi, lib) for the library file at ``path``, opened through ffi.dlopen with this
    checkout's declarations, as ``_load`` opens one without its glue: refused if truncated or
    compiled for instructions this CPU lacks. For a second build beside the one ``load()``
    gives (``python -m harness ab``); each dlopen'd file binds its own functions."""
    import cffi

    _refuse_if_truncated(path)
    ffi = cffi.FFI()
    ffi.cdef(cdef_text())
    try:
        lib = ffi.dlopen(str(path))
    except OSError as error:
        raise CLibraryError(f"cannot load the C library {path}: {error}") from error
    _refuse_if_built_for_another_cpu(str(path), ffi, lib)
    return ffi, lib


def _load_through_glue(library: Path):
    glue = _glue_beside(library)
    if glue is None:
        return None
    _refuse_if_truncated(glue)
    try:
        module = _import_extension(call_glue.MODULE_NAME, glue)
    except ImportError:  # built for another interpreter, or damaged: dlopen still works
        return None
    return module.ffi, module.lib, "compiled glue", _fast_call_beside(library)


def _fast_call_beside(library: Path):
    """The FastCall class built beside ``library`` and its glue, or None (built without NumPy's
    headers, or not importable here: the Python path makes the same checks)."""
    found = _glue_beside(library, FAST_CALL_MODULE)
    if found is None:
        return None
    _refuse_if_truncated(found)
    try:
        return _import_extension(FAST_CALL_MODULE, found).FastCall
    except ImportError:  # e.g. built against a NumPy whose C API this one lacks
        return None


def _import_extension(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PT_LOAD = 1


def _refuse_if_truncated(path: Path) -> None:
    """Raise CLibraryError when ``path`` is an ELF file shorter than its own headers say (a build
    or a copy that did not finish): the loader maps its segments as the headers give them, and
    the first touch of a page past the end of the file is a SIGBUS that kills the process.
    Checked from the ELF header and program headers alone, before anything maps the file. A file
    that cannot be opened, or is not ELF at all (a Mach-O library on macOS), is left to dlopen,
    whose error says why."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            needed = _elf_extent(handle, size)
    except OSError:
        return
    if needed is not None and needed > size:
        override = os.environ.get("MATMUL_C_LIBRARY")
        named = f"MATMUL_C_LIBRARY={path}" if override else f"the C library file {path}"  # no glue with it
        what = "it is empty" if size == 0 else f"{size} bytes where its ELF headers describe {needed}"
        raise CLibraryError(
            f"{named} is truncated ({what}: a build or copy that did not finish); "
            f"rebuild it{', or unset MATMUL_C_LIBRARY' if override else ''}"
        )


def _elf_extent(handle, size: int) -> int | None:
    """The bytes the ELF file open in ``handle`` (``size`` bytes long) must have for its program
    headers, every loadable segment and its section header table to be in it; None when it is
    not ELF, or its headers are too malformed to read (dlopen refuses those cleanly)."""
    header = handle.read(64)
    magic = b"\x7fELF"
    if not header.startswith(magic):
        return len(magic) if magic.startswith(header) else None  # empty, or cut inside the magic
    wide = header[4:5] == b"\x02"  # ELFCLASS64 (else ELFCLASS32)
    order = ">" if header[5:6] == b"\x02" else "<"  # ELFDATA2MSB (else little-endian)
    header_size, entry = (64, order + "IIQQQQ") if wide else (52, order + "IIIIII")
    if len(header) < header_size:
        return header_size
    if wide:
        phoff, shoff = struct.unpack_from(order + "QQ", header, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", header, 54)
    else:
        phoff, shoff = struct.unpack_from(order + "II", header, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", header, 42)
    # extended numbering (shnum 0) keeps the count in the first section header: one at least
    needed = max(header_size, shoff + max(shnum, 1) * shentsize if shoff else 0, phoff + phnum * phentsize)
    if needed > size or phentsize < struct.calcsize(entry):  # cut short, or malformed (dlopen says so)
        return needed if needed > size else None
    handle.seek(phoff)
    table = handle.read(phnum * phentsize)
    for index in range(phnum):
        fields = struct.unpack_from(entry, table, index * phentsize)
        # 64-bit: type, flags, offset, vaddr, paddr, filesz; 32-bit: type, offset, vaddr, paddr, filesz
        kind, offset, filesz = (fields[0], fields[2], fields[5]) if wide else (fields[0], fields[1], fields[4])
        if kind == PT_LOAD:
            needed = max(needed, offset + filesz)
    return needed


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
_loaded = None  # (ffi, lib, mode, FastCall) once loaded: the library is located, built and loaded once per process


def load():
    """(ffi, lib), located (and in a stale checkout built) on the first call only, so a call
    through cffi costs no file-system work. A process keeps the copy it loaded first anyway
    (the dynamic loader will not load one path twice): an edited ``c/*.c`` takes effect in the
    next process. A checkout's library that will not load is rebuilt once (a damaged file)."""
    global _loaded
    if _standing_in is not None:
        return _standing_in
    if _loaded is None:
        with _load_lock:
            if _loaded is None:
                _loaded = _locate_and_load()
    return _loaded[:2]


_standing_in = None  # (ffi, lib) of another build while loaded_as() holds it, else None


@contextmanager
def loaded_as(ffi, lib):
    """Inside, load() gives (ffi, lib), a build opened with dlopen_file: a backend's prepare()
    binds that build's functions into the call it returns, which keeps them after the ``with``
    (``python -m harness ab`` prepares the same implementation from two builds so)."""
    global _standing_in
    before, _standing_in = _standing_in, (ffi, lib)
    try:
        yield
    finally:
        _standing_in = before


def call_mode() -> str:
    """How the library is called: "compiled glue" (cffi's API mode) or "dlopen"."""
    load()
    return _loaded[2]


def fast_call_type():
    """harness/backends/c/fast_call.c's FastCall, built and loaded beside the call glue, or None
    (no glue, or built without NumPy's headers)."""
    load()
    return _loaded[3]


def _locate_and_load():
    path = library_path()
    try:
        return _load(str(path))
    except CLibraryBuiltForAnotherCPU:
        raise  # loaded already: the process keeps this copy, rebuilt or not
    except CLibraryError as error:
        if os.environ.get("MATMUL_C_LIBRARY") or not sources.in_checkout():
            raise
        try:
            _stamp(path).unlink(missing_ok=True)
        except OSError:  # a read-only checkout cannot build it again: the load's error stands
            raise error from None
        _load.cache_clear()
        return _load(str(library_path()))
