"""Loading and launching the compiled kernels on a GPU: PyCUDA first, CuPy as the fallback.

Both loaders take the cubin that toolkit.compile_cubin made for the device's architecture and
launch the ``Launch`` that plans.py describes, on the legacy default stream, inside PyTorch's
(primary) context, with device pointers of PyTorch tensors. So they differ only in the
library that calls ``cuModuleLoadData`` and ``cuLaunchKernel``, and every row records which
one ran.

- PyCUDA (``pip install pycuda``) is the project's loader: ``pycuda.autoprimaryctx`` retains
  the device's primary context, the one the CUDA runtime and so PyTorch use.
- CuPy's ``RawModule`` is the fallback for machines where PyCUDA cannot be built or imported
  (it ships as wheels for each CUDA major version). CuPy uses the CUDA runtime, so it shares
  the primary context by construction.

``MATMUL_CUDA_LOADER=pycuda`` or ``=cupy`` forces one; otherwise the first that imports wins.
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.backends import gpu
from harness.backends.cuda import parameters, tensormap
from harness.backends.cuda.plans import Launch, TensorMapArg
from harness.backends.cuda.toolkit import compile_cubin, native_arch
from harness.env.switches import switch
from harness.model.core import Prepared

LOADER_ENV = "MATMUL_CUDA_LOADER"
LOADERS = ("pycuda", "cupy")


def _device_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
    return f"sm_{major}{minor}"


class PyCudaLoader:
    name = "pycuda"

    @staticmethod
    def probe() -> None:
        import pycuda.driver  # noqa: F401  (ImportError without libcuda.so.1: a reason, not a crash)

    def __init__(self):
        import torch

        torch.cuda.init()
        # autoprimaryctx retains the primary context of the device CUDA_DEVICE names (else the
        # first usable one): make that PyTorch's current device.
        os.environ.setdefault("CUDA_DEVICE", str(torch.cuda.current_device()))
        import pycuda.autoprimaryctx  # noqa: F401
        import pycuda.driver

        self.driver = pycuda.driver

    def load(self, cubin: Path, kernel: str, signature: str, shared_bytes: int = 0):
        image = cubin.read_bytes()
        module = self.driver.module_from_buffer(image)
        function = module.get_function(kernel)
        # prepared_call passes one parameter buffer: each argument goes at the offset the
        # compiler recorded in the cubin, which for a 128-byte aligned tensor map is not where a
        # plain packing would put it (harness/backends/cuda/parameters.py).
        function.prepare(parameters.buffer_format(kernel, signature, parameters.layout(image, kernel)))
        if shared_bytes > 48 * 1024:  # dynamic shared memory above 48 KiB is an opt-in per function
            function.set_attribute(self.driver.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)

        def launch(grid, block, args):
            # prepared_call launches on the legacy default stream, PyTorch's default stream too.
            function.prepared_call(grid, block, *args, shared_size=shared_bytes)

        launch.module = module  # keep the module alive as long as the launcher
        return launch

    def set_global_pointer(self, launch, name: str, value: int) -> None:
        """Set the module's ``__device__`` pointer ``name`` to ``value``."""
        address, _ = launch.module.get_global(name)
        self.driver.memcpy_htod(address, np.array([value], dtype=np.uint64))


class CupyLoader:
    name = "cupy"

    @staticmethod
    def probe() -> None:
        import cupy  # noqa: F401

    def __init__(self):
        import cupy

        self.cupy = cupy

    def _tensor_map(self, raw: bytes):
        """A CUtensorMap by value: a NumPy structured scalar of 128 bytes, aligned as the kernel's
        parameter type is in the parameter buffer (CuPy passes structured scalars as structs;
        make_aligned_dtype, CuPy 13+, carries the alignment)."""
        make_aligned = getattr(self.cupy, "make_aligned_dtype", None)
        if make_aligned is None:
            raise RuntimeError(
                f"CuPy {self.cupy.__version__} cannot pass a {tensormap.TENSOR_MAP_ALIGNMENT}-byte-aligned "
                "CUtensorMap by value (cupy.make_aligned_dtype, CuPy 13+): use PyCUDA "
                "(MATMUL_CUDA_LOADER=pycuda)"
            )
        dtype = make_aligned(np.dtype([("opaque", np.uint64, (16,))]), alignment=tensormap.TENSOR_MAP_ALIGNMENT)
        return np.frombuffer(raw, dtype=dtype)[0]

    def load(self, cubin: Path, kernel: str, signature: str, shared_bytes: int = 0):
        module = self.cupy.RawModule(path=str(cubin))
        function = module.get_function(kernel)  # loads the module (the cubin stays in build/)
        # Pointers pass by value as 64-bit integers, ints as C ints: the kernel's parameter
        # buffer has the same bytes either way.
        converters = {
            "P": np.uint64,
            "i": np.int32,
            "I": np.uint32,
            "f": np.float32,
            "q": np.int64,
            "T": self._tensor_map,
        }

        if shared_bytes > 48 * 1024:
            function.max_dynamic_shared_size_bytes = shared_bytes

        def launch(grid, block, args):
            # CuPy's current stream, unless set otherwise, is the legacy default stream: PyTorch's.
            function(
                grid, block, tuple(converters[code](arg) for code, arg in zip(signature, args)), shared_mem=shared_bytes
            )

        launch.module = module
        return launch

    def set_global_pointer(self, launch, name: str, value: int) -> None:
        value_bytes = np.array([value], dtype=np.uint64)
        launch.module.get_global(name).copy_from_host(value_bytes.ctypes.data, value_bytes.nbytes)


# cuda/progress.h: with this set, the pipelined kernels are built to report how far they got
# into mapped pinned memory (the GPU script's smoke test sets it to diagnose a hang).
PROGRESS_ENV = "MATMUL_CUDA_PROGRESS"
PROGRESS_SOURCES = ("cuda/wgmma.cu", "cuda/mma.cu")
PROGRESS_SLOTS = 4


_LOADER_CLASSES = {"pycuda": PyCudaLoader, "cupy": CupyLoader}


def _forced() -> str | None:
    value = os.environ.get(LOADER_ENV, "").strip().lower()
    if value and value not in _LOADER_CLASSES:
        raise ValueError(f"{LOADER_ENV}={value!r}: expected one of {', '.join(LOADERS)}")
    return value or None


@lru_cache(maxsize=None)  # a failed import is not cached by Python: probe each loader once
def loader_unavailable_reason(name: str) -> str | None:
    try:
        _LOADER_CLASSES[name].probe()
    except Exception as error:
        return f"{name} is not importable ({type(error).__name__}: {error})"
    return None


def native_unavailable_reason() -> str | None:
    """None when a CUDA GPU and a loader are here, else why not."""
    reason = gpu.cuda_unavailable_reason()
    if reason:
        return reason
    try:
        forced = _forced()
    except ValueError as error:
        return str(error)
    candidates = [forced] if forced else list(LOADERS)
    reasons = [loader_unavailable_reason(name) for name in candidates]
    if all(reasons):
        return (
            "no loader for the compiled kernels: "
            + "; ".join(reasons)
            + ". `pip install pycuda` (or cupy-cuda12x / cupy-cuda13x), or on a machine without network "
            "see scripts/prepare_gpu_wheels.sh"
        )
    return None


_active: dict[str, object] = {}
_functions: dict = {}
_lock = threading.Lock()


def active_loader():
    """The loader this process uses (chosen once: the forced one, else the first that imports)."""
    forced = _forced()
    name = forced or next((n for n in LOADERS if loader_unavailable_reason(n) is None), None)
    if name is None:
        raise RuntimeError(native_unavailable_reason() or "no CUDA kernel loader")
    if name not in _active:
        _active[name] = _LOADER_CLASSES[name]()
    return _active[name]


def native_function(relative: str, kernel: str, signature: str, shared_bytes: int = 0, defines: tuple[str, ...] = ()):
    """``launch(grid, block, args)`` for ``kernel`` of ``relative``, compiled for this GPU.

    Cached per loader, source file (its text is in the cubin's cache key), architecture and
    the macros it was built with.
    """
    with _lock:
        loader = active_loader()
        arch = native_arch(relative, _device_arch())
        cubin, _ = compile_cubin(relative, arch, defines)
        key = (loader.name, str(cubin), kernel, signature, shared_bytes)
        if key not in _functions:
            _functions[key] = loader.load(cubin, kernel, signature, shared_bytes)
        return _functions[key]


def progress_wanted(relative: str) -> bool:

    return relative in PROGRESS_SOURCES and switch(PROGRESS_ENV)


class NativePrepared(Prepared):
    def __init__(self, relative: str, launch: Launch, inputs: dict, out_shape, dtype: str, result_shape):
        import torch

        self.loader = active_loader().name
        self.launch_plan = launch
        self.progress = None  # with MATMUL_CUDA_PROGRESS: what block 0 reports (cuda/progress.h)
        defines = ("MATMUL_PROGRESS",) if progress_wanted(relative) else ()
        self.function = native_function(relative, launch.kernel, launch.signature, launch.shared_bytes, defines)
        if defines:
            # Pinned host memory is mapped for the GPU under unified addressing: the kernel
            # writes it through the same pointer, and the host reads it while the kernel runs.
            self.progress = torch.zeros(PROGRESS_SLOTS, dtype=torch.int64, pin_memory=True)
            active_loader().set_global_pointer(self.function, "matmul_progress", self.progress.data_ptr())
        self.tensors = {name: gpu.to_device(array) for name, array in inputs.items()}
        # NaN-filled, so an element the kernel never wrote cannot pass the check
        self.tensors["C"] = torch.full(out_shape, float("nan"), dtype=gpu.torch_dtype(dtype), device="cuda")
        self.args = [self._argument(a, dtype) for a in launch.args]
        self.result_shape = result_shape
        self.grid = tuple(int(g) for g in launch.grid)
        self.block = tuple(int(b) for b in launch.block)
        torch.cuda.synchronize()

    def _argument(self, arg, dtype: str):
        if isinstance(arg, TensorMapArg):  # encoded by the driver over the device buffer
            tensor = self.tensors[arg.buffer]
            return tensormap.encode(
                tensormap.driver_encoder(), arg, tensor.data_ptr(), tensor.stride(0) * tensor.element_size(), dtype
            )
        return self.tensors[arg].data_ptr() if isinstance(arg, str) else int(arg)

    def launch(self) -> None:
        self.function(self.grid, self.block, self.args)

    def run(self) -> None:
        import torch

        self.launch()
        torch.cuda.synchronize()

    def time(self, min_time: float):
        return gpu.time_cuda(self.launch, min_time)

    def result(self) -> np.ndarray:
        return gpu.to_numpy(self.tensors["C"]).reshape(self.result_shape)
