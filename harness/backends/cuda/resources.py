"""Registers, shared memory, stack and spills of every CUDA kernel, from ptxas (no GPU needed).

``python -m harness cuda-info`` prints ``resource_table()``. The figures come from the same
compilation the GPU loaders load (toolkit.compile_cubin), so they describe what runs.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from harness.backends.cuda.toolkit import ARCHS, archs_for, compile_cubin, cuda_sources
from harness.env import sources


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
                found[current] = {
                    "registers": 0,
                    "shared_bytes": 0,
                    "stack_bytes": 0,
                    "spill_stores": 0,
                    "spill_loads": 0,
                }
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
            found[current].update(
                stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            found[current]["registers"] = int(m.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            found[current]["shared_bytes"] = int(smem.group(1)) if smem else 0
    return [KernelResources(source, name, arch, **found[name]) for name in order]


def compile_with_ptxas(relative: str, arch: str) -> tuple[list[KernelResources], str]:
    """Compile one ``.cu`` with nvcc for ``arch``; (resources per kernel, ptxas log)."""
    _, log = compile_cubin(relative, arch)
    return parse_ptxas(log, relative, arch), log


def _jobs(files, archs) -> list[tuple[str, str]]:
    """(source, arch) pairs: each source for the asked architectures, except that a source with
    its own (wgmma.cu: sm_90a) is compiled for those whenever their base (sm_90) is asked for."""
    jobs = []
    for f in files:
        own = archs_for(f, archs)
        jobs += [(f, a) for a in own if a in archs or a.rstrip("a") in archs]
    return jobs


def ptxas_report(archs=ARCHS, files=None) -> list[KernelResources]:
    """Resources of every kernel of ``files`` (default: every cuda/*.cu) for ``archs``."""
    jobs = _jobs(cuda_sources() if files is None else files, archs)
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda job: compile_with_ptxas(*job)[0], jobs))
    return [k for kernels in results for k in kernels]


def _try_compile(job) -> tuple[list[KernelResources], str | None]:
    try:
        return compile_with_ptxas(*job)[0], None
    except RuntimeError as error:
        lines = [line for line in str(error).splitlines() if "error" in line.lower()]
        first = (lines[1] if len(lines) > 1 else lines[0] if lines else str(error)).strip()
        first = first.replace(str(sources.sources_root()) + "/", "")
        return [], f"{job[0]} does not compile for {job[1]}: {first}"


def resource_table(archs=ARCHS) -> str:
    """Text table of ``ptxas_report``: what ``python -m harness cuda-info`` prints. A file that
    does not compile for an architecture (BF16 tensor cores need sm_80) is listed below it
    with nvcc's first error, and the other files are still reported."""
    jobs = _jobs(cuda_sources(), archs)
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        outcomes = list(pool.map(_try_compile, jobs))
    rows = [k for kernels, _ in outcomes for k in kernels]
    failures = [failure for _, failure in outcomes if failure]
    if not rows:
        raise RuntimeError("\n".join(failures))
    header = ("source", "kernel", "arch", "regs/thread", "smem/block", "stack", "spills (st/ld)")
    lines = [header] + [
        (
            r.source,
            r.kernel,
            r.arch,
            str(r.registers),
            f"{r.shared_bytes} B",
            f"{r.stack_bytes} B",
            f"{r.spill_stores}/{r.spill_loads}" + ("  SPILLS" if r.spills else ""),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out + failures) + "\n"
