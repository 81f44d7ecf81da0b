"""Current llama.cpp as its users run it, as the decode rows' peer: ggml's CPU backend with the
weights placed as llama.cpp's model loader places them.

Two rows, one library:

    llama.cpp.mul_mat          W offered to the CPU backend's repack buffer first, as the loader
                               does (q4_0 becomes q4_0_8x8 and q4_K q4_K_8x8 on AVX2; the
                               ggml_gemv_* / ggml_gemm_* kernels multiply it); a format it does
                               not repack (q8_0 on x86) stays in the plain CPU buffer
    llama.cpp.mul_mat_plain    W in the plain CPU buffer (llama.cpp's --no-repack): llamafile's
                               tinyBLAS for two or more rows of X (q4_0, q8_0), else vec_dot

Which kernel path ran is said per row (``Prepared.path``, the JSON's ``path``, the table's
notes): the buffer W got, and what the repack turned it into, as ggml itself logs it.

Both round X as ggml does before its integer dot products: to Q8_0 blocks for q4_0 and q8_0
weights, to Q8_K (256-wide, float32 scale) for q4_K, declared per format so the check allows
that rounding (activation_error.py) and nothing more.

The build is optional and separate from the project's own C library (``python -m harness
build-llama-cpp``, a minute or two): it downloads ``llama-cpp-python``'s source distribution
from PyPI (version LLAMA_CPP_PYTHON, which vendors llama.cpp at a named commit), keeps its ggml
tree, builds ggml's CPU backend for this CPU as llama.cpp's own build does by default
(GGML_NATIVE, OpenMP, llamafile on), then this folder's ``llama_cpp_glue.c`` against it, all in
the user cache. ``--source DIR`` builds a llama.cpp checkout of your own instead. Without a
build, the rows say how to make one.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.backends.c import thread_option
from harness.backends.c.clib import BUILT_ON_ANOTHER_CPU, this_cpu
from harness.backends.decode import decode_inputs
from harness.env import cache, files
from harness.env.cores import usable_cores
from harness.model.core import Backend, BrokenError, Implementation, Prepared
from harness.model.errors import UnavailableError
from harness.model.quant import FORMATS, QuantizedWeights, format_of
from harness.model.registry import register

LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors llama.cpp 0c1e570 (2026-10-01)
BUILD_COMMAND = "python -m harness build-llama-cpp"
# What ggml rounds X to before its integer dot products, per weight format (its vec_dot_type).
ROUNDING = {"q4_0": "q8_0", "q8_0": "q8_0", "q4_K": "q8_K"}
WEIGHTS = tuple(fmt for fmt in ROUNDING if fmt in FORMATS)
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DGGML_OPENMP=ON",
    "-DGGML_LLAMAFILE=ON",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_BUILD_TESTS=OFF",
    "-DGGML_BUILD_EXAMPLES=OFF",
)
_GLUE_SOURCE = Path(__file__).with_name("llama_cpp_glue.c")
_ERROR_BYTES = 256


def build_root() -> Path:
    return cache.user_cache_root() / "llama.cpp"


def _glue_path() -> Path:
    return build_root() / "libmatmul_llama_cpp.so"


def _info_path() -> Path:
    return build_root() / "build-info.json"


def build_info() -> dict:
    """What was built (the llama.cpp commit, where it came from, the CPU), or {} with no build."""
    try:
        return json.loads(_info_path().read_text())
    except (OSError, ValueError):
        return {}


def version_text() -> str:
    info = build_info()
    commit = (info.get("llama_cpp_commit") or "unknown")[:7]
    return f"llama.cpp {commit} ({info.get('source', 'unknown source')}), ggml {info.get('ggml_version', '?')}"


# ---- the build -------------------------------------------------------------------------------


def _download_sdist(folder: Path, say) -> tuple[Path, str]:
    """llama-cpp-python's sdist unpacked into ``folder``: (its llama.cpp tree, its commit)."""
    say(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON}'s source distribution from PyPI")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        + [f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(folder)],
        check=True,
    )
    (archive,) = folder.glob("llama_cpp_python-*.tar.gz")
    top = f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    wanted = (f"{top}/vendor/llama.cpp/ggml/", f"{top}/.git/modules/vendor/llama.cpp/HEAD")
    with tarfile.open(archive) as tar:
        members = [member for member in tar.getmembers() if member.name.startswith(wanted)]
        tar.extractall(folder, members=members, filter="data")
    head = folder / top / ".git/modules/vendor/llama.cpp/HEAD"
    commit = head.read_text().strip() if head.is_file() else "unknown"
    return folder / top / "vendor/llama.cpp", commit


def _commit_of(tree: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build(source: Path | None = None, say=print) -> Path:
    """Build ggml's CPU backend and the glue into the user cache; the glue library's path."""
    root = build_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-cpp-") as scratch:
        if source is None:
            tree, commit = _download_sdist(Path(scratch), say)
            origin = f"llama-cpp-python {LLAMA_CPP_PYTHON}"
        else:
            tree, commit, origin = Path(source).resolve(), _commit_of(Path(source)), f"checkout {source}"
        ggml_tree = tree / "ggml"
        if not (ggml_tree / "CMakeLists.txt").is_file():
            raise UnavailableError(f"{tree} holds no ggml/CMakeLists.txt: not a llama.cpp tree")
        src = root / "ggml"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(ggml_tree, src)
    pkg_config_template = src / "ggml.pc.in"  # the sdist leaves it out; ggml's CMake wants one
    if not pkg_config_template.exists():
        pkg_config_template.write_text("")
    build_dir = root / "build"
    shutil.rmtree(build_dir, ignore_errors=True)
    say(f"building ggml's CPU backend ({' '.join(CMAKE_OPTIONS[1:4])}) in {build_dir}")
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), *CMAKE_OPTIONS], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", str(usable_cores())], check=True, capture_output=True)
    libs = build_dir / "src"
    glue = _glue_path()
    say(f"building the glue {glue.name}")
    subprocess.run(
        [os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", str(_GLUE_SOURCE), "-I", str(src / "include")]
        + ["-L", str(libs), "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{libs}", "-o", str(glue)],
        check=True,
    )
    cache.record(glue)
    lib = ctypes.CDLL(str(glue))
    lib.llama_cpp_ggml_version.restype = ctypes.c_char_p
    info = {
        "llama_cpp_commit": commit,
        "source": origin,
        "ggml_version": lib.llama_cpp_ggml_version().decode(),
        "cmake_options": list(CMAKE_OPTIONS),
        "cpu": this_cpu(),
    }
    files.write_text(_info_path(), json.dumps(info, indent=2) + "\n")
    say(f"built {version_text()}")
    return glue


# ---- loading ----------------------------------------------------------------------------------


def _declare(lib) -> None:
    c_int64, c_void_p, c_char_p = ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
    lib.llama_cpp_peer_new.restype = c_void_p
    lib.llama_cpp_peer_new.argtypes = [ctypes.c_int, c_int64, c_int64, c_int64, c_void_p, ctypes.c_size_t]
    lib.llama_cpp_peer_new.argtypes += [c_void_p, ctypes.c_int, ctypes.c_int, c_char_p, ctypes.c_size_t]
    lib.llama_cpp_peer_run.argtypes, lib.llama_cpp_peer_run.restype = [c_void_p], ctypes.c_int
    lib.llama_cpp_peer_result.argtypes, lib.llama_cpp_peer_result.restype = [c_void_p, c_void_p], None
    lib.llama_cpp_peer_free.argtypes, lib.llama_cpp_peer_free.restype = [c_void_p], None
    for name in ("llama_cpp_peer_placement", "llama_cpp_peer_repacked"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [c_void_p], c_char_p
    lib.llama_cpp_ggml_version.restype = c_char_p


@lru_cache(maxsize=1)
def load():
    """The glue library (ctypes), or UnavailableError (not built) / BrokenError (built, unusable)."""
    glue = _glue_path()
    if not glue.is_file():
        raise UnavailableError(f"llama.cpp is not built here: {BUILD_COMMAND} (downloads and builds it, a minute)")
    if not cache.intact(glue):
        raise BrokenError(f"the llama.cpp glue {glue} changed since it was built; rebuild: {BUILD_COMMAND}")
    if build_info().get("cpu") != this_cpu():
        raise BrokenError(f"llama.cpp in {build_root()}: {BUILT_ON_ANOTHER_CPU} (native build); {BUILD_COMMAND}")
    try:
        lib = ctypes.CDLL(str(glue))
    except OSError as error:
        raise BrokenError(f"the llama.cpp glue does not load ({error}); rebuild: {BUILD_COMMAND}") from error
    _declare(lib)
    return lib


def quantize_reference(w: np.ndarray, format: str) -> np.ndarray:
    """llama.cpp's own quantizer (``ggml_quantize_chunk``, no importance matrix: the
    ``quantize_row_*_ref`` functions) of float32 W [N, K], as the 1-D packed bytes; the
    reference harness.quant is tested against. UnavailableError without a build."""
    lib = load()
    fmt = format_of(format)
    w32 = np.ascontiguousarray(w, dtype=np.float32)
    n, k = w32.shape
    out = np.zeros(n * (k // fmt.block_size) * fmt.bytes_per_block, np.uint8)
    quantize = lib.ggml_quantize_chunk
    quantize.restype = ctypes.c_size_t
    quantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    quantize.argtypes += [ctypes.c_int64, ctypes.c_void_p]
    written = quantize(fmt.ggml_type, w32.ctypes.data, out.ctypes.data, 0, n, k, None)
    if written != out.size:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes of {format}, expected {out.size}")
    return out


# ---- the rows -----------------------------------------------------------------------------------


class _LlamaCppPrepared(Prepared):
    def __init__(self, lib, x: np.ndarray, w: QuantizedWeights, threads: int, repack: bool):
        self.lib, self.shape = lib, (x.shape[0], w.n)
        error = ctypes.create_string_buffer(_ERROR_BYTES)
        fmt = FORMATS[w.format]
        self.peer = lib.llama_cpp_peer_new(
            *(fmt.ggml_type, w.n, w.k, x.shape[0], w.data.ctypes.data, w.nbytes, x.ctypes.data),
            *(threads, int(repack), error, _ERROR_BYTES),
        )
        if not self.peer:
            raise RuntimeError(f"llama.cpp could not set up the product: {error.value.decode()}")
        self.path = _path_text(lib, self.peer, w.format, x.shape[0])

    def run(self) -> None:
        status = self.lib.llama_cpp_peer_run(self.peer)
        if status != 0:  # GGML_STATUS_SUCCESS
            raise RuntimeError(f"ggml_backend_graph_compute failed (status {status})")

    def result(self) -> np.ndarray:
        out = np.empty(self.shape, np.float32)
        self.lib.llama_cpp_peer_result(self.peer, out.ctypes.data)
        return out

    def __del__(self):
        if getattr(self, "peer", None):
            self.lib.llama_cpp_peer_free(self.peer)
            self.peer = None


def _path_text(lib, peer, fmt: str, m: int) -> str:
    """The kernel path of this product: the repack layout, else what ggml_compute_forward_mul_mat
    picks for a plain weight (llamafile's tinyBLAS takes q4_0 and q8_0 with two or more rows of X
    on x86 with AVX; otherwise the format's vec_dot)."""
    repacked = lib.llama_cpp_peer_repacked(peer).decode()
    if repacked:
        return f"{repacked} repack"
    placement = lib.llama_cpp_peer_placement(peer).decode()
    if fmt in ("q4_0", "q8_0") and m >= 2 and lib.llama_cpp_has_llamafile() and lib.llama_cpp_has_avx():
        return f"tinyBLAS ({placement} buffer)"
    return f"vec_dot ({placement} buffer)"


class LlamaCppBackend(Backend):
    """ggml's CPU backend from a current llama.cpp build (see the module docstring)."""

    def unavailable_reason(self, impl):
        load()  # UnavailableError / BrokenError say why
        return None

    def describe(self, impl) -> str | None:
        placement = (
            "weights offered to CPU_REPACK first, as llama.cpp's loader"
            if impl.options["repack"]
            else ("weights in the plain CPU buffer (--no-repack)")
        )
        return f"{version_text()}, GGML_NATIVE + OpenMP + llamafile; {placement}"

    def prepare(self, impl, a, b, options):
        x, b = decode_inputs(impl, a, b)  # the checks every decode row makes, X's finiteness included
        return _LlamaCppPrepared(load(), x, b, thread_option(impl, options), bool(options.get("repack", True)))


for _name, _repack, _summary in (
    ("llama.cpp.mul_mat", True, "current llama.cpp's CPU mul_mat, W placed as its loader does (repacked where it can)"),
    ("llama.cpp.mul_mat_plain", False, "current llama.cpp's CPU mul_mat, W in the plain buffer (tinyBLAS / vec_dot)"),
):
    register(
        Implementation(
            name=_name,
            language="llama.cpp",
            device="cpu",
            dtypes=("float32",),
            weights=WEIGHTS,
            summary=_summary + " (a peer)",
            backend=LlamaCppBackend(),
            options={"threads": None, "repack": _repack},
            threaded=True,
            peer=True,
            activation_rounding={fmt: ROUNDING[fmt] for fmt in WEIGHTS},
        )
    )
