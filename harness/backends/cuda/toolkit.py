"""The CUDA toolkit: where it is, and ``.cu`` files compiled by its nvcc into cubins.

Every GPU path loads the same cubin, compiled here with the same flags (``NVCC_OPTIONS``):
PyCUDA and CuPy are only loaders. The register report (resources.py) reads the ptxas output
of the same compilation, so what it reports is what runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from functools import lru_cache
from pathlib import Path

from harness.env import cache, files, sources

NVCC_OPTIONS = ("-std=c++17", "-O3")
ARCHS = ("sm_80", "sm_90")  # what the compile check builds for (BF16 WMMA needs sm_80)
CONVENTIONAL_ROOT = "/usr/local/cuda"


def cuda_sources() -> list[str]:
    """Every kernel source, ``cuda/*.cu``, found rather than listed (a new file is compiled and
    checked because it is there)."""
    return sorted(f"cuda/{path.name}" for path in sources.source_path("cuda").glob("*.cu"))


def source_archs(source: str) -> tuple[str, ...] | None:
    """The architectures a source exists for, when it says so in its header comment, as in
    ``// @archs sm_90a`` (wgmma, TMA and setmaxnreg are in the architecture-specific sm_90a
    target: "a", code that runs on sm_90 and on no later GPU); None for every one from ARCHS."""
    found = re.search(r"^\s*//\s*@archs\s+([\w ,]+)$", sources.source_path(source).read_text(), flags=re.M)
    return tuple(found[1].replace(",", " ").split()) if found else None


def archs_for(source: str, archs=ARCHS) -> tuple[str, ...]:
    """The architectures ``source`` is compiled for by the checks (``archs`` unless it has its own)."""
    return source_archs(source) or tuple(archs)


def native_arch(source: str, device_arch: str) -> str:
    """What to compile ``source`` for on a GPU of ``device_arch`` (sm_90 -> sm_90a for wgmma.cu);
    raises RuntimeError when the source cannot run there."""
    own = source_archs(source)
    if own is None:
        return device_arch
    for arch in own:
        if arch.rstrip("a") == device_arch:
            return arch
    raise RuntimeError(f"{source} runs on {', '.join(a.rstrip('a') for a in own)} only (this GPU is {device_arch})")


def cache_root() -> Path:
    """build/ in a checkout; a per-user cache for an installed wheel (its folder may be read-only)."""
    if sources.in_checkout():
        return sources.sources_root() / "build"
    return cache.user_cache_root()


def _is_toolkit(root) -> bool:
    return bool(root) and (Path(root) / "include" / "cuda.h").is_file() and (Path(root) / "bin" / "nvcc").is_file()


@lru_cache(maxsize=None)
def cuda_root() -> Path | None:
    """The CUDA toolkit's root folder (the one holding bin/nvcc and include/cuda.h).

    In order: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, then the TOP that the nvcc on PATH
    prints with ``--dryrun`` (nvcc on PATH may be a wrapper script outside the toolkit, so its
    parent folder proves nothing). None when no candidate has include/cuda.h.
    """
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), CONVENTIONAL_ROOT):
        if _is_toolkit(candidate):
            return Path(candidate).resolve()
    on_path = shutil.which("nvcc")
    if on_path:
        done = subprocess.run(
            [on_path, "--dryrun", "-c", "-x", "cu", "/dev/null", "-o", "/dev/null"], capture_output=True, text=True
        )
        match = re.search(r"^#\$ TOP=(.+)$", done.stdout + done.stderr, flags=re.M)
        if match and _is_toolkit(match.group(1).strip()):
            return Path(match.group(1).strip()).resolve()
    return None


def nvcc() -> str | None:
    root = cuda_root()
    if root:
        return str(root / "bin" / "nvcc")
    return shutil.which("nvcc")


@lru_cache(maxsize=None)
def nvcc_version() -> str:
    done = subprocess.run([nvcc(), "--version"], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1] if done.stdout else ""


_compile_lock = threading.Lock()


def compile_cubin(relative: str, arch: str, defines: tuple[str, ...] = ()) -> tuple[Path, str]:
    """Compile one ``.cu`` file for ``arch`` (no GPU needed); (cubin path, ptxas -v log).
    ``defines`` are macros to define (``MATMUL_PROGRESS``: cuda/progress.h).

    Raises RuntimeError with nvcc's message when the file does not compile. Cached under
    build/cuda-cubin/ on the source text, the flags (with the checkout's own folders named
    relative to it, so a moved or copied checkout finds what it compiled) and the nvcc version;
    a cached cubin or log that is no longer what its compilation recorded (harness/env/cache.py) is
    compiled again, never loaded.
    """
    compiler = nvcc()
    if not compiler:
        raise RuntimeError("nvcc was not found (looked in $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and on PATH)")
    path = sources.source_path(relative)
    # The headers next to the sources (ptx.h) are part of what compiles: an edit to one recompiles.
    text = path.read_text() + "".join(h.read_text() for h in sorted(path.parent.glob("*.h")))
    flags = [
        *NVCC_OPTIONS,
        f"-arch={arch}",
        "-cubin",
        "--ptxas-options=-v",
        "-I",
        str(path.parent),
        *(f"-D{name}" for name in defines),
    ]
    keyed = " ".join(relative_to_sources(flag) for flag in flags)
    key = hashlib.sha256("\0".join([text, keyed, nvcc_version()]).encode()).hexdigest()[:16]
    out_dir = cache_root() / "cuda-cubin"
    cubin = out_dir / f"{path.stem}-{arch}-{key}.cubin"
    log_file = cubin.with_suffix(".log.json")
    if cache.intact(cubin) and cache.intact(log_file):
        return cubin, json.loads(log_file.read_text())["log"]
    out_dir.mkdir(parents=True, exist_ok=True)
    temporary = cubin.with_name(f"{cubin.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
    command = [compiler, *flags, "-o", str(temporary), str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        temporary.unlink(missing_ok=True)
        raise RuntimeError(f"nvcc failed on {relative} for {arch}:\n{' '.join(command)}\n{log[-6000:]}")
    # The log first, then the cubin, each replaced atomically and recorded once whole: a cubin
    # found intact implies its log.
    with _compile_lock:
        files.write_text(log_file, json.dumps({"log": log}))
        cache.record(log_file)
        os.replace(temporary, cubin)
        cache.record(cubin)
    return cubin, log


def relative_to_sources(flag: str) -> str:
    """``flag`` with the checkout's own folder left out (an include folder of the sources), for
    cache keys that do not change when the checkout is moved or copied."""
    root = sources.sources_root()
    return Path(flag).relative_to(root).as_posix() if Path(flag).is_relative_to(root) else flag
