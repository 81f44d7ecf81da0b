"""The CPU emulation of CUDA (cuda/emu/): the same ``.cu`` files, compiled with g++.

Opt-in with ``MATMUL_CUDA_EMULATE=1``. Needs a C++20 g++ (or ``$CXX``); each file is built into
``build/cuda-emu/`` and rebuilt when it or the emulation changes (the cache key hashes contents,
never a path or a time, so a moved or copied checkout runs what it has built). A build is
recorded by size and hash (harness/env/cache.py) and checked before it is used: one emptied or
truncated since is built again, never loaded (a truncated library kills the process with
SIGBUS). Launches come from plans.py, exactly as on the GPU. Rows are marked "emulated" and
never timed: the emulator says nothing about speed, only about what the kernels compute (and,
under its sanitizer variants, races and out-of-bounds accesses).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import shutil
import subprocess
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.backends.c.clib import interprocess_lock
from harness.backends.cuda import plans, tensormap
from harness.backends.cuda.plans import Launch, TensorMapArg
from harness.backends.cuda.toolkit import cache_root, relative_to_sources
from harness.env import cache, files, sources
from harness.env.interrupts import call_interruptibly
from harness.env.switches import switch
from harness.model.core import Prepared
from harness.model.inputs import dtype_name

EMULATE_ENV = "MATMUL_CUDA_EMULATE"


def emulation_requested() -> bool:
    return switch(EMULATE_ENV)


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or None


def emulation_unavailable_reason() -> str | None:
    cxx = compiler()
    if not cxx:
        return "the CPU emulation needs a C++20 compiler: g++ (or $CXX) was not found"
    return None


def _emu_dir() -> Path:
    return sources.source_path("cuda/emu")


def _emu_inputs() -> list[Path]:
    root = _emu_dir()
    # cuda/*.h (ptx.h): headers the kernels include, which pick the emulation's side here.
    return sorted(
        [
            root / "cuda_emu.h",
            root / "emu_launcher.h",
            *root.glob("selfcheck*.h"),
            *(root / "include").glob("*.h"),
            *sources.source_path("cuda").glob("*.h"),
        ]
    )


def emu_build_dir() -> Path:
    return cache_root() / "cuda-emu"


_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_KERNEL_PATTERN = re.compile(r'extern\s+"C"\s+__global__\s+' + _BOUNDS + r"void\s+" + _BOUNDS + r"(\w+)\s*\(")


def kernel_names(source_text: str) -> list[str]:
    """The ``extern "C" __global__`` kernels of a ``.cu`` file, in order: those written out, and
    those a macro makes once per entry of an X-macro list (``TABLE(KERNEL)``, where
    ``#define KERNEL(fmt, mt) extern "C" __global__ void decode_##fmt##_m##mt##_f32(...``)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", source_text, flags=re.S)
    joined = text.replace("\\\n", " ")
    names = _KERNEL_PATTERN.findall(re.sub(r"^\s*#define[^\n]*", "", joined, flags=re.M))
    makers = {
        macro: ([p.strip() for p in params.split(",")], pattern)
        for macro, params, pattern in re.findall(
            r'^\s*#define\s+(\w+)\(([^)]*)\)\s+extern\s+"C"\s+__global__\s+' + _BOUNDS + r"void\s+" + _BOUNDS
            + r"([\w#]+)\s*\(",
            joined,
            flags=re.M,
        )
    }  # fmt: skip
    tables = plans.kernel_tables(text)
    for table, macro in re.findall(r"^\s*(\w+)\((\w+)\)\s*$", joined, flags=re.M):
        if table in tables and macro in makers:
            params, pattern = makers[macro]
            for entry in tables[table]:
                name = pattern
                for param, value in zip(params, entry):
                    name = re.sub(rf"\b{param}\b|(?<=##){param}|{param}(?=##)", value, name)
                names.append(name.replace("##", ""))
    return names


def emulation_flags(variant: str = "fibers", sanitize: str | None = None) -> list[str]:
    flags = [
        "-std=c++20",
        "-fPIC",
        "-pthread",
        "-fno-strict-aliasing",
        "-Wno-unknown-pragmas",
        "-U_FORTIFY_SOURCE",
        "-I",
        str(_emu_dir()),
        "-I",
        str(_emu_dir() / "include"),
        "-I",
        str(sources.source_path("cuda")),
    ]
    # -fno-gnu-unique: two emulated libraries in one process would otherwise share their inline
    # (thread-local) globals and crash; hidden visibility keeps everything but the entry points private.
    if "clang" not in _compiler_version():
        flags.append("-fno-gnu-unique")
    flags.append("-fvisibility=hidden")
    if variant == "threads":
        flags.append("-DEMU_THREADS")
    if sanitize:
        flags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g", "-O1"]
    else:
        flags += ["-O2"]
    return flags


@lru_cache(maxsize=None)
def _compiler_version() -> str:
    cxx = compiler()
    if not cxx:
        return ""
    done = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return done.stdout.splitlines()[0] if done.stdout else ""


def translation_unit(source: Path, kernels: list[str], main: str = "") -> str:
    entries = " ".join(f"EMU_KERNEL({name})" for name in kernels)
    return (
        f"// Generated by harness/backends/cuda/emulation.py: {source.name} on the CPU emulation (cuda/emu/).\n"
        '#include "cuda_emu.h"\n'
        f'#include "{source.as_posix()}"\n'
        '#include "emu_launcher.h"\n'
        f"EMU_KERNELS({entries})\n"
        f"{main}"
    )


_build_lock = threading.Lock()


def build_emulation(
    relative: str,
    variant: str = "fibers",
    sanitize: str | None = None,
    source_text: str | None = None,
    main: str = "",
    executable: bool = False,
    tag: str = "",
) -> Path:
    """Compile ``relative`` (a ``cuda/*.cu`` file) with g++ against the emulation.

    Returns a shared library (or, with ``executable``, a program whose ``main`` is ``main``).
    ``source_text`` replaces the file's text (the sanitizer test removes a barrier this way).
    The output is cached under build/cuda-emu/, keyed on a hash of everything that goes into it.
    """
    reason = emulation_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    path = sources.source_path(relative)
    text = path.read_text() if source_text is None else source_text
    flags = emulation_flags(variant, sanitize)
    root = sources.sources_root()
    digest = hashlib.sha256()
    # Contents and names relative to the checkout, never where it is: a moved or copied
    # checkout (times reset or not) finds what it built under the same key.
    for part in (
        text,
        main,
        " ".join(relative_to_sources(flag) for flag in flags),
        _compiler_version(),
        str(executable),
        *(f"{p.relative_to(root).as_posix()}\0{p.read_text()}" for p in _emu_inputs()),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    key = digest.hexdigest()[:16]
    out_dir = emu_build_dir()
    stem = f"{path.stem}{'-' + tag if tag else ''}-{variant}{'-' + sanitize if sanitize else ''}-{key}"
    output = out_dir / (stem + ("" if executable else ".so"))
    # Built already, and byte for byte what its build recorded: nothing to lock or write, so a
    # read-only checkout runs what it has built.
    if cache.intact(output):
        return output
    try:
        with _build_lock, interprocess_lock(out_dir):
            if cache.intact(output):  # another process built it while this one waited
                return output
            cache.forget(output)  # a damaged one (emptied, truncated) and its record: never loaded
            kernels = kernel_names(text)
            if not kernels:
                raise RuntimeError(f'{relative} declares no extern "C" __global__ kernel')
            source_file = out_dir / f"{stem}.src.cu"
            files.write_text(source_file, text)
            unit = out_dir / f"{stem}.cpp"
            files.write_text(unit, translation_unit(source_file, kernels, main))
            temporary = output.with_name(output.name + f".tmp{os.getpid()}")
            command = [compiler(), *flags, *([] if executable else ["-shared"]), str(unit), "-o", str(temporary)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(
                    f"compiling {relative} for the CPU emulation failed:\n{' '.join(command)}\n{done.stderr[-6000:]}"
                )
            os.replace(temporary, output)
            cache.record(output)  # last: only a finished build is ever found intact
    except OSError as error:
        if not isinstance(error, PermissionError) and error.errno != errno.EROFS:
            raise
        # a read-only checkout that lacks it: say so, never "not run here"
        raise RuntimeError(
            f"{output.name} must be built for the CPU emulation (it is missing, or changed since its build), "
            f"but {out_dir} cannot be written ({error.strerror or error}): make it writable"
        ) from error
    return output


class EmulatedLibrary:
    """An emulated ``.cu`` file, loaded with ctypes."""

    _CTYPES = {"P": ctypes.c_void_p, "i": ctypes.c_int, "I": ctypes.c_uint, "f": ctypes.c_float, "q": ctypes.c_longlong}

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.emu_kernel_name.restype = ctypes.c_char_p
        self.lib.emu_kernel_signature.restype = ctypes.c_char_p
        self.lib.emu_launch.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_uint),
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        self.kernels = {}
        for i in range(self.lib.emu_kernel_count()):
            name = self.lib.emu_kernel_name(i).decode()
            self.kernels[name] = (i, self.lib.emu_kernel_signature(i).decode())

    def encode_tensor_map(self, arg: TensorMapArg, address: int, pitch_bytes: int, dtype: str) -> bytes:
        """A tensor map for the emulated TMA, from the emulation's cuTensorMapEncodeTiled."""
        if not hasattr(self, "_encoder"):
            try:
                self._encoder = tensormap.declare(self.lib.emu_tensor_map_encode_tiled)
            except AttributeError:
                raise RuntimeError(
                    f"{self.path.name} has no emulated TMA (its source does not include ptx.h)"
                ) from None
        return tensormap.encode(self._encoder, arg, address, pitch_bytes, dtype)

    def launch(self, launch: Launch, pointers: dict[str, int], tensor_maps: dict | None = None) -> None:
        """``pointers``: the buffers' addresses by name; ``tensor_maps``: the 128 bytes of each
        TensorMapArg of the launch (by the buffer it maps)."""
        if launch.kernel not in self.kernels:
            raise RuntimeError(
                f"kernel {launch.kernel} not found in {self.path.name} (it has {', '.join(self.kernels)})"
            )
        index, signature = self.kernels[launch.kernel]
        if signature != launch.signature:
            raise RuntimeError(
                f"{launch.kernel} takes ({signature}) but the harness passes ({launch.signature}): "
                "update plan() in harness/backends/cuda/plans.py"
            )
        addresses, keep = [], []
        for code, arg in zip(signature, launch.args):
            if code == "T":  # 128 bytes by value, 64-byte aligned as the kernel's parameter type is
                raw = ctypes.create_string_buffer(tensormap.TENSOR_MAP_BYTES + 64)
                offset = (-ctypes.addressof(raw)) % 64
                ctypes.memmove(
                    ctypes.addressof(raw) + offset, (tensor_maps or {})[arg.buffer], tensormap.TENSOR_MAP_BYTES
                )
                keep.append(raw)
                addresses.append(ctypes.addressof(raw) + offset)
                continue
            value = self._CTYPES[code](pointers[arg] if isinstance(arg, str) else arg)
            keep.append(value)
            addresses.append(ctypes.addressof(value))
        arg_pointers = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
        grid = (ctypes.c_uint * 3)(*launch.grid)
        block = (ctypes.c_uint * 3)(*launch.block)
        error = ctypes.create_string_buffer(8192)  # a deadlock report names every thread's wait
        if self.lib.emu_launch(index, grid, block, arg_pointers, error, len(error)) != 0:
            raise RuntimeError(f"emulated launch of {launch.kernel} failed: {error.value.decode()}")


_libraries: dict[Path, EmulatedLibrary] = {}


def emulated_library(relative: str) -> EmulatedLibrary:
    path = build_emulation(relative)
    if path not in _libraries:
        _libraries[path] = EmulatedLibrary(path)
    return _libraries[path]


def _aligned_copy(array: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A copy of ``array`` whose data starts on an ``alignment``-byte boundary (as cudaMalloc's
    do), so the kernels' 16-byte vector paths run in the emulator too."""
    raw = np.empty(array.nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    out = raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


class EmulatedPrepared(Prepared):
    mode = "emulated"
    loader = "emulation"

    def __init__(self, library: EmulatedLibrary, launch: Launch, inputs: dict, out_shape, dtype, result_shape):
        self.library, self.launch = library, launch
        self.buffers = {name: _aligned_copy(array) for name, array in inputs.items()}
        # NaN-filled, so an element the kernel never wrote cannot pass the check
        self.buffers["C"] = _aligned_copy(np.full(out_shape, np.nan, dtype=dtype))
        self.pointers = {name: array.ctypes.data for name, array in self.buffers.items()}
        self.tensor_maps = {
            arg.buffer: library.encode_tensor_map(
                arg,
                self.pointers[arg.buffer],
                self.buffers[arg.buffer].strides[0],
                dtype_name(self.buffers[arg.buffer].dtype),
            )
            for arg in launch.args
            if isinstance(arg, TensorMapArg)
        }
        self.result_shape = result_shape

    def run(self) -> None:
        # An emulated launch can take seconds (a big grid, --allow-slow): made where Ctrl-C still
        # stops the wait for it. Its arguments hold self, so an abandoned launch keeps its buffers.
        call_interruptibly(EmulatedPrepared._launch, (self,))

    def _launch(self) -> None:
        self.library.launch(self.launch, self.pointers, self.tensor_maps)

    def result(self) -> np.ndarray:
        return self.buffers["C"].reshape(self.result_shape).copy()
