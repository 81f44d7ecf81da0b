"""What the compiler made of a kernel: its SASS (the GPU's machine code), read without a GPU.

Each technique in cuda/ and triton/ exists to make the compiler emit particular instructions:
16-byte loads (``LDG.E.128``, ``LDS.128``), tensor-core loads and multiplies (``LDSM``,
``HMMA``, Hopper's ``HGMMA``), and no register spills (``STL``/``LDL``: stores and loads to
per-thread local memory, which lives in DRAM). nvcc compiles for any architecture on any
machine and ``cuobjdump -sass`` disassembles the result, so these can be checked where there
is no GPU at all (tests/test_sass.py).

    kernels = cuda_sass("cuda/wmma.cu", "sm_90")      # {kernel name: [instruction, ...]}
    opcodes(kernels["wmma_f16"])                       # Counter({"HMMA.16816.F32": 64, ...})
    find(kernels["wmma_f16"], "LDSM")                  # indices of every LDSM.*
    cubin_sass(compiled.asm["cubin"])                  # the same for a Triton kernel

An instruction is kept as cuobjdump prints it, without its address and encoding:
``@!P0 LDG.E.128.CONSTANT R4, desc[UR6][R2.64]``. An opcode is its first word after the
predicate, with every modifier: ``LDG.E.128.CONSTANT``.

Standalone on purpose: it needs only nvcc and cuobjdump, not the CUDA backend.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from functools import lru_cache
from pathlib import Path

from harness.env import cache, sources

NVCC_FLAGS = ("-std=c++17", "-O3")  # what the CUDA backend compiles with

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
# "        /*0a40*/                   LDSM.16.M88.4 R4, [R2] ;        /* 0x...*/"
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")


# ---- the tools -----------------------------------------------------------------------------
def nvcc() -> str | None:
    return shutil.which("nvcc")


def _installed_package_dirs(name: str) -> list[Path]:
    """Where an installed package's files are, without importing it (importing triton here
    would pre-empt the harness's choice of Triton's interpreter)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def cuobjdump_candidates() -> list[Path]:
    """Where cuobjdump may be, in the order they are tried."""
    found = shutil.which("cuobjdump")
    candidates = [Path(found)] if found else []
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates.append(Path(root) / "bin" / "cuobjdump")
    # Triton's wheel ships one to inspect the kernels it compiles.
    candidates += [d / "backends" / "nvidia" / "bin" / "cuobjdump" for d in _installed_package_dirs("triton")]
    # The nvidia-cuda-cuobjdump wheel: nvidia/<component>/bin/cuobjdump.
    for d in _installed_package_dirs("nvidia"):
        candidates += sorted(d.glob("*/bin/cuobjdump"))
    return candidates


def cuobjdump() -> str | None:
    for path in cuobjdump_candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def unavailable_reason() -> str | None:
    """Why SASS cannot be produced here, or None."""
    missing = [tool for tool, path in (("nvcc", nvcc()), ("cuobjdump", cuobjdump())) if path is None]
    if not missing:
        return None
    return (
        " and ".join(missing) + " not found (looked for nvcc on PATH; for cuobjdump on PATH, in $CUDA_HOME/bin, "
        "/usr/local/cuda/bin, Triton's wheel and the nvidia-cuda-cuobjdump wheel)"
    )


@lru_cache(maxsize=None)
def _nvcc_version(path: str) -> str:
    return subprocess.run([path, "--version"], capture_output=True, text=True).stdout


# ---- compiling ----------------------------------------------------------------------------------
def cache_dir() -> Path:
    """build/cuda-sass/ in a checkout; a per-user cache for an installed wheel."""
    if sources.in_checkout():
        root = sources.sources_root() / "build"
    else:
        root = cache.user_cache_root()
    return root / "cuda-sass"


def compile_cubin(source: str | Path, arch: str, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile one ``.cu`` file for ``arch`` (``sm_90``) to a cubin; no GPU needed.

    ``source`` is relative to the repository root (``cuda/wmma.cu``) or an absolute path.
    Cached on the source text, the flags and the nvcc version; raises RuntimeError with
    nvcc's message when the file does not compile.
    """
    compiler = nvcc()
    if compiler is None:
        raise RuntimeError("nvcc was not found on PATH")
    path = Path(source) if Path(source).is_absolute() else sources.source_path(str(source))
    # with the headers of cuda/ (ptx.h) that a source may include: an edit to one recompiles
    text = path.read_text() + "".join(h.read_text() for h in sorted(sources.source_path("cuda").glob("*.h")))
    flags = [*NVCC_FLAGS, f"-arch={arch}", "-cubin", "-I", str(sources.source_path("cuda")), *extra_flags]
    # the checkout's own folders named relative to it: a moved or copied checkout finds what it compiled
    root = sources.sources_root()
    keyed = " ".join(Path(f).relative_to(root).as_posix() if Path(f).is_relative_to(root) else f for f in flags)
    key = hashlib.sha256("\0".join([text, keyed, _nvcc_version(compiler)]).encode()).hexdigest()[:16]
    cubin = cache_dir() / f"{path.stem}-{arch}-{key}.cubin"
    if cache.intact(cubin):  # compiled, and still what that compilation recorded
        return cubin
    cubin.parent.mkdir(parents=True, exist_ok=True)
    # Written under a name of its own and renamed: a concurrent build never sees half a cubin.
    partial = cubin.parent / f"{cubin.name}.{os.getpid()}-{threading.get_ident()}.partial"
    command = [compiler, *flags, "-o", str(partial), str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"nvcc failed on {source} for {arch}:\n{' '.join(command)}\n{(done.stdout + done.stderr)[-6000:]}"
        )
    os.replace(partial, cubin)
    cache.record(cubin)
    return cubin


# ---- disassembling --------------------------------------------------------------------------------
def parse_sass(text: str) -> dict[str, list[str]]:
    """Split ``cuobjdump -sass`` output into {kernel name: instructions}; the ``Function :``
    headers delimit kernels."""
    kernels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        header = _FUNCTION.match(line)
        if header:
            current = kernels.setdefault(header[1], [])
            continue
        instruction = _INSTRUCTION.match(line)
        if instruction and current is not None:
            current.append(instruction[1])
    return kernels


def _disassemble(cubin: Path) -> dict[str, list[str]]:
    tool = cuobjdump()
    if tool is None:
        raise RuntimeError(unavailable_reason())
    done = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {cubin} failed:\n{done.stderr[-4000:]}")
    return parse_sass(done.stdout)


def cuda_sass(source: str | Path, arch: str, extra_flags: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """{kernel name: SASS instructions} of one ``.cu`` file compiled for ``arch``."""
    return _disassemble(compile_cubin(source, arch, extra_flags))


def cubin_sass(cubin: bytes) -> dict[str, list[str]]:
    """{kernel name: SASS instructions} of a cubin in memory (Triton's ``compiled.asm["cubin"]``)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        return _disassemble(path)


# ---- reading instructions -----------------------------------------------------------------------------
def opcode(instruction: str) -> str:
    """``@!P0 LDG.E.128.CONSTANT R4, [R2.64]`` -> ``LDG.E.128.CONSTANT``."""
    words = instruction.split()
    if words and words[0].startswith("@"):  # a predicate guards the instruction
        words = words[1:]
    return words[0] if words else ""


def opcodes(instructions: list[str]) -> Counter:
    """How often each opcode, modifiers included, occurs."""
    return Counter(opcode(i) for i in instructions)


def find(instructions: list[str], base: str, *modifiers: str) -> list[int]:
    """Indices of the instructions whose opcode is ``base`` with at least ``modifiers``, in
    any order: ``find(x, "LDG", "128")`` matches ``LDG.E.128`` and ``LDG.E.EF.128`` alike,
    which is what makes a check survive a compiler that orders or adds modifiers differently."""
    wanted = set(modifiers)
    hits = []
    for index, instruction in enumerate(instructions):
        name, *present = opcode(instruction).split(".")
        if name == base and wanted <= set(present):
            hits.append(index)
    return hits


def spills(instructions: list[str]) -> list[int]:
    """Indices of stores and loads to local memory (``STL``, ``LDL``): register spills, or an
    array the compiler could not keep in registers. ptxas's stack frame alone does not tell."""
    return sorted(find(instructions, "STL") + find(instructions, "LDL"))


def excerpt(instructions: list[str], indices: list[int], around: int = 3, windows: int = 3) -> str:
    """The instructions around the first few ``indices``, numbered, the indexed ones marked
    with ``>``: for an assertion message."""
    if not indices:
        return "  (none)"
    shown = []
    for index in indices[:windows]:
        lines = range(max(0, index - around), min(len(instructions), index + around + 1))
        shown.append("\n".join(f"{'>' if i == index else ' '} {i:5d}  {instructions[i]}" for i in lines))
    more = f"\n  ... and {len(indices) - windows} more" if len(indices) > windows else ""
    return "\n  ...\n".join(shown) + more
