"""Adapter for cuda/: the hand-written CUDA kernels, on a GPU through PyCUDA or on the CPU
through the project's own emulation of CUDA (cuda/emu/).

One description of every launch serves both paths. ``plan()`` turns a technique and a shape
into a ``Launch``: the kernel's name, grid, block and argument list (buffers named "A", "B",
"C", then the sizes). The native path hands exactly that to PyCUDA (``prepared_call`` with
device pointers from PyTorch tensors); the emulated path hands it to the same ``.cu`` file
compiled with g++ against cuda/emu/ (``emu_launch`` with host pointers). So the emulator runs
the kernels that the GPU runs, with the launch geometry that the GPU gets.

Which path runs:
- native: a CUDA GPU visible to PyTorch, and pycuda importable. PyCUDA shares PyTorch's
  context (``pycuda.autoprimaryctx``: the device's primary context, which the CUDA runtime and
  so PyTorch use), compiles each ``.cu`` for the device's architecture, and caches the module.
- emulated: set ``MATMUL_CUDA_EMULATE=1``. Needs a C++20 g++ (or ``$CXX``); the library is
  built into ``build/cuda-emu/`` and rebuilt when a source or the emulation changes. Rows
  are marked "emulated" and never timed: the emulator says nothing about speed.
- otherwise the implementations are unavailable, and the reason says which of the above is
  missing.

``ptxas_report()`` (``python -m harness cuda-info``) compiles every ``.cu`` with nvcc
``--ptxas-options=-v`` and reports registers per thread, shared memory per block, stack frame
and spills per kernel and architecture; no GPU is needed for that.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .. import sources
from ..clib import interprocess_lock
from ..core import Implementation
from ..inputs import Shape, dtype_name
from . import torch_gpu

EMULATE_ENV = "MATMUL_CUDA_EMULATE"
NVCC_OPTIONS = ("-std=c++17", "-O3")  # the same for PyCUDA and for the ptxas report
ARCHS = ("sm_80", "sm_90")            # what the compile check builds for (BF16 WMMA needs sm_80)
CUDA_SOURCES = ("cuda/naive.cu", "cuda/tiled.cu", "cuda/register_tiled.cu", "cuda/wmma.cu", "cuda/gemv.cu")


# ---- launch geometry: one description for both paths --------------------------------------
@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple            # "A", "B", "C" name a buffer; ints are passed as C ints
    signature: str         # PyCUDA's prepare() format: P pointer, i int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_SUFFIX = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def plan(technique: str, dtype: str, m: int, n: int, k: int) -> Launch:
    """The launch of ``technique`` for C [m, n] = A [m, k] @ B [k, n] (a GEMV: y [n] = W [n, k] x [k]).

    Block shapes and tile sizes here must match the constants in the ``.cu`` file; the header
    comment of each file states its launch.
    """
    suffix = _SUFFIX[dtype]
    gemm = ("A", "B", "C", m, n, k)
    if technique in ("naive", "tiled"):  # 16 x 16 threads, one output each
        return Launch(f"{technique}_{suffix}", (cdiv(n, 16), cdiv(m, 16), 1), (16, 16, 1), gemm, "PPPiii")
    if technique == "register_tiled_2x2":  # 16 x 16 threads, 2 x 2 outputs each: 32 x 32 per block
        return Launch(f"register_tiled_2x2_{suffix}", (cdiv(n, 32), cdiv(m, 32), 1), (16, 16, 1), gemm, "PPPiii")
    if technique == "register_tiled":  # 256 threads, 8 x 8 outputs each: 128 x 128 per block, 1-D grid
        return Launch(f"register_tiled_{suffix}", (cdiv(m, 128) * cdiv(n, 128), 1, 1), (256, 1, 1), gemm, "PPPiii")
    if technique == "wmma":  # 4 warps, 64 x 64 each: 128 x 128 per block, 1-D grid
        return Launch(f"wmma_{suffix}", (cdiv(m, 128) * cdiv(n, 128), 1, 1), (128, 1, 1), gemm, "PPPiii")
    if technique == "gemv":  # 8 warps, one row each
        return Launch(f"gemv_{suffix}", (cdiv(n, 8), 1, 1), (256, 1, 1), ("A", "B", "C", n, k), "PPPii")
    raise ValueError(f"unknown CUDA technique {technique!r}")


def _buffers(operation: str, a: np.ndarray, b: np.ndarray):
    """The kernel's input buffers and the shape of its output, from the harness's A and B.

    A GEMV kernel wants W [N, K] row-major and x [K]; the harness gives x as A [1, K] and W as
    B = W^T [K, N], so W is made contiguous here, in prepare (not timed).
    """
    if operation == "gemv":
        return {"A": np.ascontiguousarray(b.T), "B": np.ascontiguousarray(a.reshape(-1))}, (b.shape[1],)
    return {"A": a, "B": b}, (a.shape[0], b.shape[1])


# ---- which path ---------------------------------------------------------------------------------
def emulation_requested() -> bool:
    return os.environ.get(EMULATE_ENV, "") not in ("", "0", "false", "no")


@lru_cache(maxsize=None)
def native_unavailable_reason() -> str | None:
    reason = torch_gpu.cuda_unavailable_reason()
    if reason:
        return reason
    try:
        import pycuda.driver  # noqa: F401  (ImportError without libcuda.so.1: a reason, not a crash)
    except Exception as error:
        return (f"pycuda is not importable ({type(error).__name__}: {error}); `pip install pycuda`, or on a "
                "machine without network see scripts/prepare_gpu_wheels.sh")
    return None


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or None


def emulation_unavailable_reason() -> str | None:
    cxx = compiler()
    if not cxx:
        return "the CPU emulation needs a C++20 compiler: g++ (or $CXX) was not found"
    return None


# ---- the emulated path ----------------------------------------------------------------------------
def _emu_dir() -> Path:
    return sources.source_path("cuda/emu")


def _emu_inputs() -> list[Path]:
    root = _emu_dir()
    return sorted([root / "cuda_emu.h", root / "emu_launcher.h", *(root / "include").glob("*.h")])


def _cache_root() -> Path:
    """build/ in a checkout; a per-user cache for an installed wheel (its folder may be read-only)."""
    if sources.in_checkout():
        return sources.sources_root() / "build"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matmul-reference"


def emu_build_dir() -> Path:
    return _cache_root() / "cuda-emu"


_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_KERNEL_PATTERN = re.compile(r'extern\s+"C"\s+__global__\s+' + _BOUNDS + r"void\s+" + _BOUNDS + r"(\w+)\s*\(")


def kernel_names(source_text: str) -> list[str]:
    """The ``extern "C" __global__`` kernels of a ``.cu`` file, in order."""
    return _KERNEL_PATTERN.findall(re.sub(r"//[^\n]*|/\*.*?\*/", "", source_text, flags=re.S))


def emulation_flags(variant: str = "fibers", sanitize: str | None = None) -> list[str]:
    flags = ["-std=c++20", "-fPIC", "-pthread", "-fno-strict-aliasing", "-Wno-unknown-pragmas", "-U_FORTIFY_SOURCE",
             "-I", str(_emu_dir()), "-I", str(_emu_dir() / "include")]
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
        f"// Generated by harness/backends/cuda.py: {source.name} on the CPU emulation (cuda/emu/).\n"
        '#include "cuda_emu.h"\n'
        f'#include "{source.as_posix()}"\n'
        '#include "emu_launcher.h"\n'
        f"EMU_KERNELS({entries})\n"
        f"{main}"
    )


_build_lock = threading.Lock()


def build_emulation(relative: str, variant: str = "fibers", sanitize: str | None = None,
                    source_text: str | None = None, main: str = "", executable: bool = False,
                    tag: str = "") -> Path:
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
    digest = hashlib.sha256()
    for part in (text, main, " ".join(flags), _compiler_version(), str(executable),
                 *(p.read_text() for p in _emu_inputs())):
        digest.update(part.encode())
        digest.update(b"\0")
    key = digest.hexdigest()[:16]
    out_dir = emu_build_dir()
    stem = f"{path.stem}{'-' + tag if tag else ''}-{variant}{'-' + sanitize if sanitize else ''}-{key}"
    output = out_dir / (stem + ("" if executable else ".so"))
    with _build_lock, interprocess_lock(out_dir):
        if output.is_file():
            return output
        kernels = kernel_names(text)
        if not kernels:
            raise RuntimeError(f'{relative} declares no extern "C" __global__ kernel')
        source_file = out_dir / f"{stem}.src.cu"
        source_file.write_text(text)
        unit = out_dir / f"{stem}.cpp"
        unit.write_text(translation_unit(source_file, kernels, main))
        temporary = output.with_name(output.name + f".tmp{os.getpid()}")
        command = [compiler(), *flags, *([] if executable else ["-shared"]), str(unit), "-o", str(temporary)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {relative} for the CPU emulation failed:\n{' '.join(command)}\n"
                               f"{done.stderr[-6000:]}")
        os.replace(temporary, output)
    return output


class EmulatedLibrary:
    """An emulated ``.cu`` file, loaded with ctypes."""

    _CTYPES = {"P": ctypes.c_void_p, "i": ctypes.c_int, "I": ctypes.c_uint, "f": ctypes.c_float, "q": ctypes.c_longlong}

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.emu_kernel_name.restype = ctypes.c_char_p
        self.lib.emu_kernel_signature.restype = ctypes.c_char_p
        self.lib.emu_launch.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                                        ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_int]
        self.kernels = {}
        for i in range(self.lib.emu_kernel_count()):
            name = self.lib.emu_kernel_name(i).decode()
            self.kernels[name] = (i, self.lib.emu_kernel_signature(i).decode())

    def launch(self, launch: Launch, pointers: dict[str, int]) -> None:
        if launch.kernel not in self.kernels:
            raise RuntimeError(f"kernel {launch.kernel} not found in {self.path.name} (it has {', '.join(self.kernels)})")
        index, signature = self.kernels[launch.kernel]
        if signature != launch.signature:
            raise RuntimeError(f"{launch.kernel} takes ({signature}) but the harness passes ({launch.signature}): "
                               "update plan() in harness/backends/cuda.py")
        values = []
        for code, arg in zip(signature, launch.args):
            values.append(self._CTYPES[code](pointers[arg] if isinstance(arg, str) else arg))
        arg_pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        grid = (ctypes.c_uint * 3)(*launch.grid)
        block = (ctypes.c_uint * 3)(*launch.block)
        error = ctypes.create_string_buffer(512)
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
    out = raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


class _EmulatedPrepared:
    mode = "emulated"

    def __init__(self, library: EmulatedLibrary, launch: Launch, inputs: dict, out_shape, dtype, result_shape):
        self.library, self.launch = library, launch
        self.buffers = {name: _aligned_copy(array) for name, array in inputs.items()}
        self.buffers["C"] = _aligned_copy(np.zeros(out_shape, dtype=dtype))
        self.pointers = {name: array.ctypes.data for name, array in self.buffers.items()}
        self.result_shape = result_shape

    def run(self) -> None:
        self.library.launch(self.launch, self.pointers)

    def result(self) -> np.ndarray:
        return self.buffers["C"].reshape(self.result_shape).copy()


# ---- the native path --------------------------------------------------------------------------------
_modules: dict = {}
_native_lock = threading.Lock()


def _pycuda_context():
    """Make PyTorch's device current and share its (primary) context with PyCUDA."""
    import torch

    torch.cuda.init()
    # autoprimaryctx retains the primary context of the device CUDA_DEVICE names (else the
    # first usable one): make that PyTorch's current device.
    os.environ.setdefault("CUDA_DEVICE", str(torch.cuda.current_device()))
    import pycuda.autoprimaryctx as autoprimaryctx

    return autoprimaryctx


def native_function(relative: str, kernel: str, signature: str):
    """The compiled kernel (cached per source file, modification time and architecture)."""
    with _native_lock:
        context = _pycuda_context()
        major, minor = context.device.compute_capability()
        arch = f"sm_{major}{minor}"
        path = sources.source_path(relative)
        key = (str(path), path.stat().st_mtime_ns, arch)
        module = _modules.get(key)
        if module is None:
            from pycuda.compiler import SourceModule

            # no_extern_c: the sources include C++ headers (cuda_bf16.h, mma.h) and say
            # `extern "C"` themselves, so the kernel names are not mangled.
            module = SourceModule(path.read_text(), arch=arch, no_extern_c=True, options=list(NVCC_OPTIONS),
                                  include_dirs=[str(path.parent)])
            _modules[key] = module
        function = module.get_function(kernel)
        function.prepare(signature)
        return function


class _NativePrepared:
    mode = "native"

    def __init__(self, relative: str, launch: Launch, inputs: dict, out_shape, dtype: str, result_shape):
        import torch

        self.launch_plan = launch
        self.function = native_function(relative, launch.kernel, launch.signature)
        self.tensors = {name: torch_gpu.to_device(array) for name, array in inputs.items()}
        self.tensors["C"] = torch.zeros(out_shape, dtype=torch_gpu.torch_dtype(dtype), device="cuda")
        self.args = [self.tensors[a].data_ptr() if isinstance(a, str) else int(a) for a in launch.args]
        self.result_shape = result_shape
        self.grid = tuple(int(g) for g in launch.grid)
        self.block = tuple(int(b) for b in launch.block)
        torch.cuda.synchronize()

    def launch(self) -> None:
        # PyCUDA launches on the legacy default stream, which is PyTorch's default stream too.
        self.function.prepared_call(self.grid, self.block, *self.args)

    def run(self) -> None:
        import torch

        self.launch()
        torch.cuda.synchronize()

    def time(self, min_time: float):
        return torch_gpu.time_cuda(self.launch, min_time)

    def result(self) -> np.ndarray:
        return torch_gpu.to_numpy(self.tensors["C"]).reshape(self.result_shape)


# ---- the backend -----------------------------------------------------------------------------------
class CudaBackend:
    """Runs ``technique`` from ``impl.source`` natively or emulated (see the module docstring)."""

    def __init__(self, technique: str):
        self.technique = technique

    def unavailable_reason(self, impl):
        if emulation_requested():
            return emulation_unavailable_reason()
        reason = native_unavailable_reason()
        if reason:
            return f"{reason}; set {EMULATE_ENV}=1 to check the kernels on the CPU emulation (correctness only)"
        return None

    def run_mode(self, impl) -> str:
        # The harness caps the size of emulated problems (core.STAND_IN_MAX_FLOPS).
        return "emulated" if emulation_requested() else "native"

    def prepare(self, impl, a, b, options):
        dtype = dtype_name(a.dtype)
        shape = Shape(a.shape[0], b.shape[1], a.shape[1])
        launch = plan(self.technique, dtype, shape.m, shape.n, shape.k)
        inputs, out_shape = _buffers(impl.operation, a, b)
        result_shape = (shape.m, shape.n)
        if emulation_requested():
            library = emulated_library(impl.source)
            return _EmulatedPrepared(library, launch, inputs, out_shape, a.dtype, result_shape)
        return _NativePrepared(impl.source, launch, inputs, out_shape, dtype, result_shape)

    def peak_gflops(self, impl, dtype):
        return torch_gpu.peak_for(impl.operation, dtype)


# ---- registers and shared memory, from ptxas ---------------------------------------------------------
@dataclass(frozen=True)
class KernelResources:
    source: str
    kernel: str
    arch: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


@lru_cache(maxsize=None)
def _nvcc_version() -> str:
    done = subprocess.run([nvcc(), "--version"], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1] if done.stdout else ""


def parse_ptxas(text: str, source: str, arch: str) -> list[KernelResources]:
    """Registers, shared memory, stack and spills per entry function from ``ptxas -v`` output."""
    found: dict[str, dict] = {}
    order: list[str] = []
    current = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            if current not in found:
                found[current] = {"registers": 0, "shared_bytes": 0, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}
                order.append(current)
            continue
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            current = m.group(1) if m.group(1) in found else None
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            found[current].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            found[current]["registers"] = int(m.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            found[current]["shared_bytes"] = int(smem.group(1)) if smem else 0
    return [KernelResources(source, name, arch, **found[name]) for name in order]


def compile_with_ptxas(relative: str, arch: str) -> tuple[list[KernelResources], str]:
    """Compile one ``.cu`` with nvcc for ``arch`` (no GPU needed); (resources, ptxas log).

    Raises RuntimeError with nvcc's message when the file does not compile. Cached under
    build/cuda-ptxas/ on the source text, the nvcc version and the flags.
    """
    compiler_path = nvcc()
    if not compiler_path:
        raise RuntimeError("nvcc was not found (looked on PATH, $CUDA_HOME, $CUDA_PATH and /usr/local/cuda)")
    path = sources.source_path(relative)
    text = path.read_text()
    command_flags = [*NVCC_OPTIONS, f"-arch={arch}", "-cubin", "--ptxas-options=-v", "-I", str(path.parent)]
    key = hashlib.sha256("\0".join([text, " ".join(command_flags), _nvcc_version()]).encode()).hexdigest()[:16]
    cache = _cache_root() / "cuda-ptxas" / f"{path.stem}-{arch}-{key}.json"
    if cache.is_file():
        data = json.loads(cache.read_text())
        return [KernelResources(**r) for r in data["kernels"]], data["log"]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cubin = cache.with_suffix(f".{os.getpid()}.{threading.get_ident()}.cubin")
    command = [compiler_path, *command_flags, "-o", str(cubin), str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    cubin.unlink(missing_ok=True)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {relative} for {arch}:\n{' '.join(command)}\n{log[-6000:]}")
    kernels = parse_ptxas(log, relative, arch)
    cache.write_text(json.dumps({"kernels": [asdict(k) for k in kernels], "log": log}))
    return kernels, log


def ptxas_report(archs=ARCHS, files=CUDA_SOURCES) -> list[KernelResources]:
    jobs = [(f, a) for f in files for a in archs]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda job: compile_with_ptxas(*job)[0], jobs))
    return [k for kernels in results for k in kernels]


def resource_table(archs=ARCHS) -> str:
    """Text table of ``ptxas_report``: what ``python -m harness cuda-info`` prints."""
    rows = ptxas_report(archs)
    header = ("source", "kernel", "arch", "regs/thread", "smem/block", "stack", "spills (st/ld)")
    lines = [header] + [
        (r.source, r.kernel, r.arch, str(r.registers), f"{r.shared_bytes} B", f"{r.stack_bytes} B",
         f"{r.spill_stores}/{r.spill_loads}" + ("  SPILLS" if r.spills else ""))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out) + "\n"


# ---- the registry's entries ----------------------------------------------------------------------
_REQUIRES = ("gpu", "pycuda")

IMPLEMENTATIONS = [
    Implementation(
        "cuda.naive", "cuda", "gpu", ("float32",),
        "one thread per output, A and B read from global memory",
        CudaBackend("naive"), source="cuda/naive.cu", requires=_REQUIRES,
    ),
    Implementation(
        "cuda.tiled", "cuda", "gpu", ("float32",),
        "the chapter's 16x16 shared-memory tiles: each load reused 16 times",
        CudaBackend("tiled"), source="cuda/tiled.cu", requires=_REQUIRES,
    ),
    Implementation(
        "cuda.register_tiled_2x2", "cuda", "gpu", ("float32",),
        "the chapter's exercise: 16x16 tiles, 2x2 outputs per thread",
        CudaBackend("register_tiled_2x2"), source="cuda/register_tiled.cu", requires=_REQUIRES,
    ),
    Implementation(
        "cuda.register_tiled", "cuda", "gpu", ("float32",),
        "128x128 block tiles, 8x8 outputs per thread, float4 loads, double-buffered",
        CudaBackend("register_tiled"), source="cuda/register_tiled.cu", requires=_REQUIRES,
    ),
    Implementation(
        "cuda.wmma", "cuda", "gpu", ("bfloat16", "float16"),
        "tensor cores via nvcuda::wmma, 128x128 tiles staged in shared memory, FP32 accumulate",
        CudaBackend("wmma"), source="cuda/wmma.cu", requires=_REQUIRES,
    ),
    Implementation(
        "cuda.gemv", "cuda", "gpu", ("bfloat16", "float32"),
        "y = W x: a warp per row, 16-byte coalesced loads, shuffle reduction",
        CudaBackend("gemv"), source="cuda/gemv.cu", operation="gemv", requires=_REQUIRES,
    ),
]
