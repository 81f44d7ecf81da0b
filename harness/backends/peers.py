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
- ``torch.int4``: PyTorch's CPU weight-only int4 kernel (``_weight_int4pack_mm_for_cpu``) on
  decode problems with q4_0 or q4_K weights. Its format is group-wise int4 with a scale and a
  zero point per group; q4_0 is exactly that with groups of 32 and zero points 0 (w = (q - 8) d),
  so the same weights reach it bit for bit, repacked in prepare; q4_K's sub-blocks of 32 are
  its groups, with scale d * sc and zero 8 d sc - dmin m (the zero rounds once in float32).
  (torch's int8 kernel keeps one scale per row, which no q8_0 matrix is: it has no row here.)

All take a ``threads`` option (BLIS's and PyTorch's own thread counts).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

import numpy as np

from harness.model.core import Backend, Implementation, Prepared
from harness.model.inputs import bfloat16_dtype
from harness.model.quant import int4_group_operands
from harness.model.registry import register

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
        text = f"system {_describe_library(library)} ({where})"
        # e.g. Debian's BLIS 0.9 on Zen 5: built before that CPU had a kernel set
        generic = ": BLIS's reference C, this build of BLIS has no kernel set for this CPU"
    else:
        try:
            import blis
            import blis.cy
        except ImportError:
            return None
        text = (
            f"the blis package {getattr(blis, '__version__', '')}".rstrip()
            + ", "
            + _describe_library(ctypes.CDLL(blis.cy.__file__))
        )
        generic = ": BLIS's reference C, not what a BLIS built for this CPU runs"
    return text + generic if "generic kernels" in text else text


class _BlisPrepared(Prepared):
    def __init__(self, a, b, threads):
        self.c = np.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)
        self._call = self._cblas(a, b, threads) if 0 not in a.shape + b.shape else (lambda: None)

    def _cblas(self, a, b, threads):
        """The timed call, its arguments made once here (BLAS leaves an empty sum's C unwritten,
        hence the zeros above for the shapes that skip it)."""
        library, _ = system_blis()
        if library is None:
            import blis.py

            # beta = 0: the package's gemm adds to `out` by default (beta = 1), which would
            # accumulate every timed run into C and read C besides.
            return lambda: blis.py.gemm(a, b, out=self.c, beta=0.0)
        if threads is not None:
            library.bli_thread_set_num_threads(ctypes.c_int64(threads))
        gemm = library.cblas_sgemm if a.dtype == np.float32 else library.cblas_dgemm
        scalar = ctypes.c_float if a.dtype == np.float32 else ctypes.c_double
        (m, k), n = a.shape, b.shape[1]
        pointers = [ctypes.c_void_p(x.ctypes.data) for x in (a, b, self.c)]
        arguments = (
            ROW_MAJOR,
            NO_TRANS,
            NO_TRANS,
            m,
            n,
            k,
            scalar(1.0),
            pointers[0],
            k,
            pointers[1],
            n,
            scalar(0.0),
            pointers[2],
            n,
        )
        self._keep = (a, b)  # the pointers above are into these
        return lambda: gemm(*arguments)  # ctypes releases the GIL for the call

    def run(self) -> None:
        self._call()

    def result(self) -> np.ndarray:
        return self.c.copy()


class BlisBackend(Backend):
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
        gemms = {
            np.dtype(np.float32): (library.cblas_sgemm, ctypes.c_float),
            np.dtype(np.float64): (library.cblas_dgemm, ctypes.c_double),
        }

        def call(a, b):
            gemm, scalar = gemms[a.dtype]
            (m, k), n = a.shape, b.shape[1]
            c = np.empty((m, n), dtype=a.dtype)
            gemm(
                ROW_MAJOR,
                NO_TRANS,
                NO_TRANS,
                m,
                n,
                k,
                scalar(1.0),
                ctypes.c_void_p(a.ctypes.data),
                k,
                ctypes.c_void_p(b.ctypes.data),
                n,
                scalar(0.0),
                ctypes.c_void_p(c.ctypes.data),
                n,
            )
            return c

        return call

    def prepare(self, impl, a, b, options):
        return _BlisPrepared(a, b, options.get("threads"))


class _TorchPrepared(Prepared):
    def __init__(self, a, b, threads):
        import torch

        if threads is not None:
            torch.set_num_threads(int(threads))
        # Copies, made here and not timed: torch would warn about the read-only views the
        # harness hands out, and must never write into the caller's arrays anyway.
        self.a, self.b = _to_torch(a, copy=True), _to_torch(b, copy=True)
        self.c = torch.empty((a.shape[0], b.shape[1]), dtype=self.a.dtype)
        self.matmul = torch.matmul

    def run(self) -> None:
        self.matmul(self.a, self.b, out=self.c)

    def result(self) -> np.ndarray:
        return _to_numpy(self.c).copy()


def _to_torch(array: np.ndarray, copy: bool):
    """A CPU tensor of ``array``: shared where it may be (writeable, and not ``copy``), else a copy.
    torch knows no ml_dtypes.bfloat16, so a bfloat16 array's bits go over as int16 and are
    relabelled torch.bfloat16 (the same 16 bits)."""
    import torch

    bfloat16 = array.dtype.name == "bfloat16"
    if bfloat16:
        array = array.view(np.int16)
    tensor = torch.from_numpy(array) if array.flags.writeable and not copy else torch.tensor(array)
    return tensor.view(torch.bfloat16) if bfloat16 else tensor


def _to_numpy(tensor) -> np.ndarray:
    """``tensor``'s NumPy view (bfloat16 as ml_dtypes' bfloat16, through its int16 bits)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(bfloat16_dtype())
    return tensor.numpy()


class TorchCpuBackend(Backend):
    def unavailable_reason(self, impl):
        try:
            import torch  # noqa: F401
        except ImportError:
            return "PyTorch is not installed"
        return None

    def describe(self, impl) -> str | None:
        import torch

        backends = [
            name
            for name, on in (
                ("MKL", torch.backends.mkl.is_available()),
                ("oneDNN", torch.backends.mkldnn.is_available()),
            )
            if on
        ]
        return f"PyTorch {torch.__version__} on the CPU" + (f" ({', '.join(backends)})" if backends else "")

    def bind(self, impl, options):
        """The direct call: the arrays shared with torch (copied only when read-only, which
        torch's tensors cannot be), the product handed back as NumPy's."""
        import torch

        threads = options.get("threads")
        if threads is not None:
            torch.set_num_threads(int(threads))

        return lambda a, b: _to_numpy(torch.matmul(_to_torch(a, copy=False), _to_torch(b, copy=False)))

    def prepare(self, impl, a, b, options):
        return _TorchPrepared(a, b, options.get("threads"))


class _TorchInt4Prepared(Prepared):
    def __init__(self, x: np.ndarray, weights, threads):
        import torch

        if threads is not None:
            torch.set_num_threads(int(threads))
        nibbles, scales, zeros = int4_group_operands(weights)  # [N, K] 0..15, [N, K / 32] twice
        self.w = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(nibbles.astype(np.int32)), 1)
        scale = torch.from_numpy(np.ascontiguousarray(scales.T))  # [K / 32, N]
        zero = torch.from_numpy(np.ascontiguousarray(zeros.T))
        self.scales_and_zeros = torch.stack([scale, zero], dim=-1).contiguous()
        self.x = torch.tensor(x)
        self.mm = torch.ops.aten._weight_int4pack_mm_for_cpu
        self.y = None

    def run(self) -> None:
        self.y = self.mm(self.x, self.w, 32, self.scales_and_zeros)

    def result(self) -> np.ndarray:
        return self.y.numpy().copy()


class TorchInt4Backend(TorchCpuBackend):
    def unavailable_reason(self, impl):
        reason = super().unavailable_reason(impl)
        if reason:
            return reason
        import torch

        if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
            return f"PyTorch {torch.__version__} has no _weight_int4pack_mm_for_cpu (it came in 2.5)"
        return None

    def shape_problem(self, impl, shape) -> str | None:
        return "needs N to be a multiple of 16 (its packing of the weights)" if shape.n % 16 else None

    def bind(self, impl, options):
        return None  # only prepare: the weights are repacked once, outside the timed call

    def prepare(self, impl, a, b, options):
        return _TorchInt4Prepared(a, b, options.get("threads"))


register(
    Implementation(
        name="blis.gemm",
        language="blis",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="BLIS's sgemm/dgemm through CBLAS, with the kernel set BLIS picks for this CPU (a peer)",
        backend=BlisBackend(),
        options={"threads": None},
        threaded=True,
        peer=True,
    )
)
register(
    Implementation(
        name="torch.cpu",
        language="torch",
        device="cpu",
        dtypes=("float32", "float64", "bfloat16"),
        summary="torch.matmul on CPU tensors: MKL or oneDNN (bfloat16: oneDNN, AMX where the CPU has it; a peer)",
        backend=TorchCpuBackend(),
        options={"threads": None},
        threaded=True,
        peer=True,
    )
)
register(
    Implementation(
        name="torch.int4",
        language="torch",
        device="cpu",
        dtypes=("float32",),
        weights=("q4_0", "q4_K"),
        summary="torch's CPU weight-only int4 kernel: q4_0 and q4_K as group-32 int4, scales and zeros (a peer)",
        backend=TorchInt4Backend(),
        options={"threads": None},
        threaded=True,
        peer=True,
    )
)
