"""The libraries a user would pick instead of writing a matmul, as rows of every CPU table.

NumPy (its BLAS, usually OpenBLAS) is the CPU baseline; these stand beside it wherever they
are installed, so a table says what each rung of the ladder is worth against what one would
actually use:

- ``blis.gemm``: BLIS through its CBLAS interface (``cblas_sgemm`` / ``cblas_dgemm``). The
  system's BLIS (Debian and Ubuntu: ``libblis4-pthread``) is built with every kernel set and
  picks the one for this CPU at run time (zen3, haswell, skx, ...). Where none is installed,
  the ``blis`` package (cython-blis) stands in; its wheels carry fewer kernel sets, and on some
  CPUs it runs BLIS's ``generic`` reference kernels, which no one would choose: the row's
  description says which library and kernel set ran.
- ``torch.cpu``: ``torch.matmul`` on CPU tensors (MKL or oneDNN in PyTorch's CPU builds).

Both take a ``threads`` option (BLIS's and PyTorch's own thread counts).
"""
from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

import numpy as np

from ..core import Implementation
from ..registry import register

# CBLAS enums
ROW_MAJOR, NO_TRANS = 101, 111
# Where distributions put BLIS when it is not the system's default BLAS.
SYSTEM_BLIS_NAMES = ("blis", "blis-pthread", "blis-openmp", "blis64")


@lru_cache(maxsize=1)
def system_blis():
    """(library, path) of a system BLIS with CBLAS, or (None, why not)."""
    for name in SYSTEM_BLIS_NAMES:
        path = ctypes.util.find_library(name)
        if not path:
            continue
        try:
            library = ctypes.CDLL(path)
            for symbol in ("cblas_sgemm", "cblas_dgemm", "bli_arch_query_id", "bli_arch_string"):
                getattr(library, symbol)
        except (OSError, AttributeError) as error:
            return None, f"{path} is not a BLIS with CBLAS ({error})"
        return library, path
    return None, "no system BLIS (Debian/Ubuntu: apt install libblis4-pthread)"


def _describe_library(library) -> str:
    library.bli_arch_string.restype = ctypes.c_char_p
    library.bli_arch_query_id.restype = ctypes.c_int
    kernels = library.bli_arch_string(library.bli_arch_query_id()).decode()
    version = ""
    if hasattr(library, "bli_info_get_version_str"):
        library.bli_info_get_version_str.restype = ctypes.c_char_p
        version = " " + library.bli_info_get_version_str().decode()
    return f"BLIS{version}, {kernels} kernels"


@lru_cache(maxsize=1)
def blis_description() -> str | None:
    """Which BLIS ``blis.gemm`` runs and its kernel set, e.g. "system BLIS 0.9.0, zen3 kernels
    (libblis.so.4)"; None where there is none."""
    library, where = system_blis()
    if library is not None:
        return f"system {_describe_library(library)} ({where})"
    try:
        import blis
        import blis.cy
    except ImportError:
        return None
    text = f"the blis package {getattr(blis, '__version__', '')}".rstrip() + ", " + _describe_library(ctypes.CDLL(blis.cy.__file__))
    if "generic kernels" in text:
        text += ": BLIS's reference C, not what a BLIS built for this CPU runs"
    return text


class _BlisPrepared:
    mode = "native"

    def __init__(self, a, b, threads):
        self.c = np.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)
        self._call = self._cblas(a, b, threads) if 0 not in a.shape + b.shape else (lambda: None)

    def _cblas(self, a, b, threads):
        """The timed call, its arguments made once here (BLAS leaves an empty sum's C unwritten,
        hence the zeros above for the shapes that skip it)."""
        library, _ = system_blis()
        if library is None:
            import blis.py

            return lambda: blis.py.gemm(a, b, out=self.c)
        if threads is not None:
            library.bli_thread_set_num_threads(ctypes.c_int64(threads))
        gemm = library.cblas_sgemm if a.dtype == np.float32 else library.cblas_dgemm
        scalar = ctypes.c_float if a.dtype == np.float32 else ctypes.c_double
        (m, k), n = a.shape, b.shape[1]
        pointers = [ctypes.c_void_p(x.ctypes.data) for x in (a, b, self.c)]
        arguments = (ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, scalar(1.0), pointers[0], k, pointers[1], n,
                     scalar(0.0), pointers[2], n)
        self._keep = (a, b)  # the pointers above are into these
        return lambda: gemm(*arguments)  # ctypes releases the GIL for the call

    def run(self) -> None:
        self._call()

    def result(self) -> np.ndarray:
        return self.c.copy()


class BlisBackend:
    def unavailable_reason(self, impl):
        if blis_description() is None:
            return f"{system_blis()[1]}, and the blis package is not installed"
        return None

    def describe(self, impl) -> str | None:
        return blis_description()

    def bind(self, impl, options):
        """The direct call (Matmul.__call__): as little around cblas_?gemm as NumPy puts
        around its own, so that the two are compared call for call."""
        library, _ = system_blis()
        threads = options.get("threads")
        if library is None:
            import blis.py

            return lambda a, b: blis.py.gemm(a, b)
        if threads is not None:
            library.bli_thread_set_num_threads(ctypes.c_int64(threads))
        gemms = {np.dtype(np.float32): (library.cblas_sgemm, ctypes.c_float),
                 np.dtype(np.float64): (library.cblas_dgemm, ctypes.c_double)}

        def call(a, b):
            gemm, scalar = gemms[a.dtype]
            (m, k), n = a.shape, b.shape[1]
            c = np.empty((m, n), dtype=a.dtype)
            gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, scalar(1.0), ctypes.c_void_p(a.ctypes.data), k,
                 ctypes.c_void_p(b.ctypes.data), n, scalar(0.0), ctypes.c_void_p(c.ctypes.data), n)
            return c

        return call

    def prepare(self, impl, a, b, options):
        return _BlisPrepared(a, b, options.get("threads"))


class _TorchPrepared:
    mode = "native"

    def __init__(self, a, b, threads):
        import torch

        if threads is not None:
            torch.set_num_threads(int(threads))
        # Copies, made here and not timed: torch would warn about the read-only views the
        # harness hands out, and must never write into the caller's arrays anyway.
        self.a, self.b = torch.tensor(a), torch.tensor(b)
        self.c = torch.empty((a.shape[0], b.shape[1]), dtype=self.a.dtype)
        self.matmul = torch.matmul

    def run(self) -> None:
        self.matmul(self.a, self.b, out=self.c)

    def result(self) -> np.ndarray:
        return self.c.numpy().copy()


class TorchCpuBackend:
    def unavailable_reason(self, impl):
        try:
            import torch  # noqa: F401
        except ImportError:
            return "PyTorch is not installed"
        return None

    def describe(self, impl) -> str | None:
        import torch

        backends = [name for name, on in (("MKL", torch.backends.mkl.is_available()),
                                          ("oneDNN", torch.backends.mkldnn.is_available())) if on]
        return f"PyTorch {torch.__version__} on the CPU" + (f" ({', '.join(backends)})" if backends else "")

    def bind(self, impl, options):
        """The direct call: the arrays shared with torch (copied only when read-only, which
        torch's tensors cannot be), the product handed back as NumPy's."""
        import torch

        threads = options.get("threads")
        if threads is not None:
            torch.set_num_threads(int(threads))

        def tensor(x):
            return torch.from_numpy(x) if x.flags.writeable else torch.tensor(x)

        return lambda a, b: torch.matmul(tensor(a), tensor(b)).numpy()

    def prepare(self, impl, a, b, options):
        return _TorchPrepared(a, b, options.get("threads"))


register(Implementation(
    name="blis.gemm", language="blis", device="cpu", dtypes=("float32", "float64"),
    summary="BLIS's sgemm/dgemm through CBLAS, with the kernel set BLIS picks for this CPU (a peer)",
    backend=BlisBackend(), options={"threads": None}, threaded=True, peer=True,
))
register(Implementation(
    name="torch.cpu", language="torch", device="cpu", dtypes=("float32", "float64"),
    summary="torch.matmul on CPU tensors: MKL or oneDNN (a peer)",
    backend=TorchCpuBackend(), options={"threads": None}, threaded=True, peer=True,
))
