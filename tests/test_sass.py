"""Each technique shows in the machine code: checked in the SASS, without a GPU.

A kernel can be correct and still miss the point of its technique: float4 loads that the
compiler splits into scalar ones, WMMA fragments that do not load with ldmatrix, registers that
spill to local memory. nvcc (for cuda/) and Triton's ptxas (for triton/) compile for sm_90 and
sm_80 on any machine, and ``cuobjdump -sass`` shows what came out (harness/tooling/sass.py).

Opcodes are matched on their base and modifiers in any order (``LDG`` with ``128`` matches
``LDG.E.128`` and ``LDG.E.128.CONSTANT``), so a compiler that spells a load differently does
not fail a check that still holds. The last tests compile kernels built to fail the checks,
so that a check which can never fail would be noticed.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

import pytest
import triton_aot

from harness.backends.cuda import resources, toolkit
from harness.env.sources import source_path
from harness.tooling import sass

CUDA_SOURCES = toolkit.cuda_sources()
ARCHS = ("sm_80", "sm_90")
# A source for one architecture only says so (wgmma.cu: `// @archs sm_90a`).
CUDA_BUILDS = [(source, arch) for source in CUDA_SOURCES for arch in toolkit.archs_for(source, ARCHS)]

needs_nvcc_and_cuobjdump = pytest.mark.skipif(
    sass.unavailable_reason() is not None, reason=str(sass.unavailable_reason())
)
needs_cuobjdump = pytest.mark.skipif(
    sass.cuobjdump() is None, reason="cuobjdump not found: " + str(sass.unavailable_reason())
)
_triton_installed = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


def needs_triton(test):
    """Triton's ahead-of-time compiles take seconds each: these checks are in the full tier."""
    return pytest.mark.slow(_triton_installed(test))


@lru_cache(maxsize=None)
def cuda_kernels(source: str, arch: str) -> dict[str, list[str]]:
    return sass.cuda_sass(source, arch)


# ---- the checks, shared by the real kernels and the ones built to fail -----------------------------
def _opcode_summary(instructions: list[str]) -> str:
    counts = sass.opcodes(instructions)
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def expect(instructions: list[str], where: str, base: str, *modifiers: str, why: str) -> list[int]:
    """Assert that an instruction ``base`` with ``modifiers`` is present; ``where`` names the
    kernel and the architecture."""
    hits = sass.find(instructions, base, *modifiers)
    wanted = ".".join((base, *modifiers))
    assert hits, (
        f"{where}: expected {wanted} ({why}), found none.\n"
        f"Its {base} instructions:\n{sass.excerpt(instructions, sass.find(instructions, base))}\n"
        f"All its opcodes: {_opcode_summary(instructions)}"
    )
    return hits


def expect_no_spills(instructions: list[str], where: str) -> None:
    hits = sass.spills(instructions)
    assert not hits, (
        f"{where}: expected no STL/LDL (registers spilled to local memory, which lives in DRAM), "
        f"found {len(hits)}:\n{sass.excerpt(instructions, hits)}"
    )


# ---- reading cuobjdump's output (no tools needed) ---------------------------------------------------------
CUOBJDUMP_OUTPUT = """
\tcode for sm_90
\t\tFunction : first
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000fe40000000800 */
        /*0010*/              @!P0 LDG.E.128.CONSTANT R4, desc[UR6][R2.64] ;  /* 0x0000000602047981 */
        /*0020*/                   STL [R1+0x4], R2 ;                     /* 0x0000040201007387 */
\t\t..........
\t\tFunction : second
        /*0000*/                   LDSM.16.MT88.4 R8, [R12] ;             /* 0x000000000c08783b */
        /*0010*/                   EXIT ;                                 /* 0x000000000000794d */
"""


def test_parse_sass():
    kernels = sass.parse_sass(CUOBJDUMP_OUTPUT)
    assert kernels == {
        "first": ["LDC R1, c[0x0][0x28]", "@!P0 LDG.E.128.CONSTANT R4, desc[UR6][R2.64]", "STL [R1+0x4], R2"],
        "second": ["LDSM.16.MT88.4 R8, [R12]", "EXIT"],
    }
    first = kernels["first"]
    assert sass.opcodes(first) == {"LDC": 1, "LDG.E.128.CONSTANT": 1, "STL": 1}
    assert sass.find(first, "LDG", "128") == [1] and sass.find(first, "LDG", "128", "EF") == []
    assert sass.find(first, "LD") == [] and sass.spills(first) == [2]
    assert "> " in sass.excerpt(first, [2]) and "STL [R1+0x4], R2" in sass.excerpt(first, [2])


# ---- cuda/ -------------------------------------------------------------------------------------------------
@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("source, arch", CUDA_BUILDS)
def test_cuda_kernels_do_not_spill(source, arch):
    kernels = cuda_kernels(source, arch)
    assert kernels, f"cuobjdump found no kernel in {source} for {arch}"
    for name, instructions in kernels.items():
        expect_no_spills(instructions, f"{name} ({source}) on {arch}")


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("arch", ARCHS)
def test_register_tiled_loads_16_bytes(arch):
    instructions = cuda_kernels("cuda/register_tiled.cu", arch)["register_tiled_f32"]
    where = f"register_tiled_f32 on {arch}"
    expect(instructions, where, "LDG", "128", why="float4 loads of A and B from global memory")
    expect(instructions, where, "LDS", "128", why="float4 reads of the shared tiles, TM or TN values at once")


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["gemv_bf16", "gemv_f32"])
def test_gemv_loads_16_bytes(kernel, arch):
    instructions = cuda_kernels("cuda/gemv.cu", arch)[kernel]
    expect(instructions, f"{kernel} on {arch}", "LDG", "128", why="W and x streamed in 16-byte vectors")


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["wmma_bf16", "wmma_f16"])
def test_wmma_uses_ldmatrix_and_tensor_cores(kernel, arch):
    instructions = cuda_kernels("cuda/wmma.cu", arch)[kernel]
    where = f"{kernel} on {arch}"
    expect(instructions, where, "LDSM", why="fragments loaded from shared memory with ldmatrix")
    expect(instructions, where, "HMMA", why="mma_sync on the tensor cores")
    if kernel == "wmma_bf16":
        expect(instructions, where, "HMMA", "BF16", why="BF16 inputs")
    # What the BF16 kernel compiled to before its fragments were loaded through inline PTX:
    # generic loads (LD, not LDS) and a MOVM transpose per register of B (see cuda/wmma.cu).
    generic = sass.find(instructions, "LD") + sass.find(instructions, "MOVM")
    assert not generic, (
        f"{where}: expected no generic LD or MOVM (fragment loads that missed ldmatrix), "
        f"found {len(generic)}:\n{sass.excerpt(instructions, sorted(generic))}"
    )


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["mma_bf16", "mma_f16"])
def test_mma_uses_cp_async_ldmatrix_and_mma_sync(kernel, arch):
    instructions = cuda_kernels("cuda/mma.cu", arch)[kernel]
    where = f"{kernel} on {arch}"
    expect(instructions, where, "LDGSTS", why="cp.async: global to shared memory without registers")
    expect(instructions, where, "LDSM", "M88", "4", why="A fragments with ldmatrix.x4")
    expect(instructions, where, "LDSM", "MT88", "4", why="B fragments with ldmatrix.x4.trans")
    expect(instructions, where, "HMMA", "16816", "F32", why="mma.sync.m16n8k16 with FP32 accumulators")
    if kernel == "mma_bf16":
        expect(instructions, where, "HMMA", "16816", "BF16", why="BF16 inputs")
    generic = sass.find(instructions, "LD") + sass.find(instructions, "MOVM")
    assert not generic, (
        f"{where}: expected no generic LD or MOVM, found:\n{sass.excerpt(instructions, sorted(generic))}"
    )


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("kernel", ["wgmma_bf16", "wgmma_f16"])
def test_wgmma_uses_tma_wgmma_mbarriers_and_setmaxnreg(kernel):
    instructions = cuda_kernels("cuda/wgmma.cu", "sm_90a")[kernel]
    where = f"{kernel} on sm_90a"
    expect(instructions, where, "UTMALDG", "2D", why="cp.async.bulk.tensor.2d: TMA boxes of A and B")
    expect(instructions, where, "HGMMA", "64x256x16", "F32", why="wgmma.mma_async m64n256k16, FP32 accumulators")
    if kernel == "wgmma_bf16":
        expect(instructions, where, "HGMMA", "64x256x16", "F32", "BF16", why="BF16 inputs")
    expect(instructions, where, "SYNCS", "ARRIVE", "TRANS64", why="mbarrier arrivals (arrive, arrive.expect_tx)")
    expect(instructions, where, "SYNCS", "PHASECHK", "TRANS64", "TRYWAIT", why="mbarrier.try_wait.parity")
    expect(instructions, where, "WARPGROUP", "DEPBAR", "LE", why="wgmma.wait_group")
    expect(instructions, where, "USETMAXREG", "DEALLOC", why="setmaxnreg.dec in the producer warp group")
    expect(instructions, where, "USETMAXREG", "TRY_ALLOC", why="setmaxnreg.inc in the consumer warp groups")
    # No operand goes through registers on its way to the tensor cores: no LDSM, no HMMA.
    for base in ("LDSM", "HMMA", "LDGSTS"):
        assert not sass.find(instructions, base), (
            f"{where}: unexpected {base}:\n{sass.excerpt(instructions, sass.find(instructions, base))}"
        )
    expect_no_spills(instructions, where)


# ---- what the emulator replaces, checked in the SASS against the source's own numbers -------------------
# The CPU emulation implements cuda/ptx.h's instructions itself, so a wrong immediate in a
# kernel's call (a wait_group count, a setmaxnreg value) or a wrapper that emits the wrong form
# would pass there: the SASS is where it shows. Each expected value is read from the kernel's
# source, so these checks follow an edit of the source instead of pinning today's numbers.
def _defines(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (\w+) (\S+)", text, flags=re.M))


def _template_arguments(text: str, function: str) -> list[int]:
    """The integer template arguments of every call ``ptx::function<...>()`` in ``text``, with
    the file's #define constants substituted (``STAGES - 2`` with STAGES 3 is 1)."""
    defines = _defines(text)
    values = []
    for expression in re.findall(rf"ptx::{function}<([^>]+)>\(", text):
        for name, value in defines.items():
            expression = re.sub(rf"\b{name}\b", value, expression)
        assert re.fullmatch(r"[\d\s+\-*/()]+", expression), f"cannot evaluate {function}<{expression}>"
        values.append(int(eval(expression)))  # digits and arithmetic only, checked above
    return values


def _immediates(instructions: list[str], base: str, *modifiers: str) -> list[int]:
    """The last operand (an immediate) of every ``base`` instruction with ``modifiers``."""
    hits = sass.find(instructions, base, *modifiers)
    return [int(instructions[i].rstrip(" ;").split(",")[-1].split()[-1], 0) for i in hits]


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("kernel", ["wgmma_bf16", "wgmma_f16"])
def test_wgmma_sass_has_the_sources_wait_counts_register_budget_and_b_transpose(kernel):
    text = source_path("cuda/wgmma.cu").read_text()
    instructions = cuda_kernels("cuda/wgmma.cu", "sm_90a")[kernel]
    where = f"{kernel} on sm_90a"
    waits = sorted(set(_template_arguments(text, "wgmma_wait_group")))
    assert sorted(set(_immediates(instructions, "WARPGROUP", "DEPBAR", "LE"))) == waits, (
        f"{where}: wgmma.wait_group counts in the SASS differ from the source's {waits}:\n"
        + sass.excerpt(instructions, sass.find(instructions, "WARPGROUP", "DEPBAR"))
    )
    (dec,) = _template_arguments(text, "setmaxnreg_dec")
    (inc,) = _template_arguments(text, "setmaxnreg_inc")
    assert _immediates(instructions, "USETMAXREG", "DEALLOC") == [dec], f"{where}: setmaxnreg.dec {dec}"
    alloc = sass.find(instructions, "USETMAXREG", "TRY_ALLOC")
    assert alloc and all(f", {inc:#x}" in instructions[i] for i in alloc), f"{where}: setmaxnreg.inc {inc}"
    # Every wgmma reads B MN-major (tnspB) and A K-major (no tnspA), as the descriptors say.
    hgmma = sass.find(instructions, "HGMMA")
    assert hgmma and all("tnspB" in instructions[i] and "tnspA" not in instructions[i] for i in hgmma), (
        f"{where}: expected every HGMMA with .tnspB and none with .tnspA:\n{sass.excerpt(instructions, hgmma)}"
    )
    # wgmma.fence (WARPGROUP.ARRIVE) before the first wgmma
    arrive = sass.find(instructions, "WARPGROUP", "ARRIVE")
    assert arrive and arrive[0] < hgmma[0], f"{where}: no wgmma.fence before the first wgmma"


@needs_nvcc_and_cuobjdump
def test_wgmma_register_budget_balances_within_the_register_file():
    # setmaxnreg moves registers between warp groups through the CTA's pool: the consumers'
    # increase can only be granted from what the launch allocated plus what the producer gave
    # back. If ptxas allocates fewer registers per thread than that needs, TRY_ALLOC spins
    # for ever (a deadlock no emulation shows); over 64K registers no launch fits on an SM.
    text = source_path("cuda/wgmma.cu").read_text()
    defines = _defines(text)
    consumers = int(defines["CONSUMERS"])
    threads = 128 * (consumers + 1)
    assert "__launch_bounds__(THREADS, 1)" in text and defines["THREADS"].startswith("(128")
    (dec,) = _template_arguments(text, "setmaxnreg_dec")
    (inc,) = _template_arguments(text, "setmaxnreg_inc")
    needed = 128 * dec + 128 * consumers * inc
    assert needed <= REGISTER_FILE, f"setmaxnreg asks for {needed} registers per CTA; an SM has {REGISTER_FILE}"
    kernels, _ = resources.compile_with_ptxas("cuda/wgmma.cu", "sm_90a")
    for kernel in kernels:
        allocated = kernel.registers * threads
        assert dec <= kernel.registers <= inc, (kernel.kernel, kernel.registers, dec, inc)
        assert allocated >= needed, (
            f"{kernel.kernel}: ptxas gave {kernel.registers} registers x {threads} threads = {allocated}, but the "
            f"producer's {dec} and the consumers' {inc} need {needed}: setmaxnreg.inc would never be granted"
        )


REGISTER_FILE = 65536  # 32-bit registers per SM on sm_80 and sm_90


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel", ["mma_bf16", "mma_f16"])
def test_mma_sass_has_the_sources_cp_async_groups_and_wait_counts(kernel, arch):
    text = source_path("cuda/mma.cu").read_text()
    instructions = cuda_kernels("cuda/mma.cu", arch)[kernel]
    where = f"{kernel} on {arch}"
    # cp.async.cg with 16 bytes: L2 only (BYPASS), 128-bit, zero-filling the part past src_bytes
    copies = sass.find(instructions, "LDGSTS")
    assert copies and all(".BYPASS.128" in instructions[i] for i in copies), (
        f"{where}: expected every LDGSTS as .BYPASS.128 (cp.async.cg, 16 bytes):\n{sass.excerpt(instructions, copies)}"
    )
    assert sass.find(instructions, "LDGDEPBAR"), f"{where}: no LDGDEPBAR: cp.async.commit_group emitted nothing"
    waits = sorted(set(_template_arguments(text, "cp_async_wait_group")))
    found = sorted(set(_immediates(instructions, "DEPBAR", "LE")))
    assert found == waits, f"{where}: cp.async.wait_group counts {found} in the SASS, {waits} in the source"


@needs_nvcc_and_cuobjdump
@pytest.mark.parametrize("source, arch", [("cuda/wgmma.cu", "sm_90a"), ("cuda/mma.cu", "sm_90")])
def test_the_progress_build_keeps_the_register_budget_and_the_measured_build_has_no_progress(source, arch):
    # The GPU script's smoke test tries a hung kernel again built with -DMATMUL_PROGRESS
    # (cuda/progress.h). That build must still meet the setmaxnreg budget (or it would deadlock
    # for another reason), and the build that is measured must carry none of it.
    import subprocess

    from harness.backends.cuda import resources, toolkit

    done = subprocess.run(
        [
            toolkit.nvcc(),
            *toolkit.NVCC_OPTIONS,
            f"-arch={arch}",
            "-cubin",
            "--ptxas-options=-v",
            "-DMATMUL_PROGRESS",
            "-I",
            str(source_path("cuda")),
            "-o",
            "/dev/null",
            str(source_path(source)),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    progress = {k.kernel: k for k in resources.parse_ptxas(done.stdout + done.stderr, source, arch)}
    measured = {k.kernel: k for k in resources.compile_with_ptxas(source, arch)[0]}
    assert progress.keys() == measured.keys()
    for name, kernel in progress.items():
        assert kernel.spill_stores == 0 and kernel.spill_loads == 0, kernel
        if source.endswith("wgmma.cu"):
            assert kernel.registers == measured[name].registers == 168, (kernel, measured[name])
    for _name, instructions in cuda_kernels(source, arch).items():
        assert not any("matmul_progress" in i for i in instructions)
    assert "MATMUL_PROGRESS_MARK" in source_path(source).read_text()


def test_template_arguments_are_read_with_the_files_constants():
    text = "#define STAGES 4\nptx::cp_async_wait_group<STAGES - 2>();\nptx::cp_async_wait_group<0>();\n"
    assert _template_arguments(text, "cp_async_wait_group") == [2, 0]
    assert _immediates(["WARPGROUP.DEPBAR.LE gsb0, 0x1", "DEPBAR.LE SB0, 0x3", "WARPGROUP.ARRIVE"], "DEPBAR", "LE") == [
        3
    ]


@needs_nvcc_and_cuobjdump
def test_tensor_map_is_aligned_as_the_driver_declares_it():
    from harness.backends.cuda import tensormap, toolkit

    header = Path(toolkit.cuda_root()) / "include" / "cuda.h"
    declared = re.search(r"typedef struct CUtensorMap_st \{\s*#if[^\n]*\n\s*alignas\((\d+)\)", header.read_text())
    assert declared, f"no alignas in {header}'s CUtensorMap_st"
    ours = re.search(r"struct alignas\((\d+)\) TensorMap", source_path("cuda/ptx.h").read_text())
    assert ours and int(ours.group(1)) == int(declared.group(1)) == tensormap.TENSOR_MAP_ALIGNMENT


# ---- triton/ --------------------------------------------------------------------------------------------------
def triton_kernels(*requests) -> list[triton_aot.Compiled]:
    try:
        return triton_aot.compile_kernels(*requests)
    except triton_aot.Skip as skip:
        pytest.skip(str(skip))


def triton_sass(compiled: triton_aot.Compiled) -> list[str]:
    kernels = sass.cubin_sass(compiled.cubin)
    assert len(kernels) == 1, (
        f"{compiled.name} on {compiled.arch}: expected one kernel in the cubin, got {list(kernels)}"
    )
    return next(iter(kernels.values()))


# What Triton should make of tl.dot in half precision: wgmma on Hopper, mma.sync on Ampere.
TENSOR_CORE = {
    90: ("HGMMA", "warpgroup MMAs (wgmma) on Hopper's tensor cores"),
    80: ("HMMA", "warp-level mma.sync on the tensor cores"),
}


@needs_cuobjdump
@needs_triton
@pytest.mark.parametrize("sm", [90, 80])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_triton_matmul_uses_tensor_cores(dtype, sm):
    # All four in one request: one child process (and Triton import) instead of four.
    built = triton_kernels(*[("matmul", d, s, "first") for d in ("bf16", "fp16") for s in (90, 80)])
    (compiled,) = [c for c in built if c.dtype == dtype and c.sm == sm]
    instructions = triton_sass(compiled)
    where = f"Triton {compiled.name} on {compiled.arch}"
    opcode, why = TENSOR_CORE[sm]
    expect(instructions, where, opcode, *(["BF16"] if dtype == "bf16" else []), why=why)
    expect_no_spills(instructions, where)


# One config per kernel, dtype and architecture; every config is in the slow test below.
TRITON_DEFAULT_SET = [
    ("matmul", "fp32", 90, "first"),
    ("matmul", "fp32", 80, "every"),
    ("gemv", "bf16", 90, "first"),
    ("gemv", "fp16", 90, "first"),
    ("gemv", "fp32", 90, "first"),
    ("gemv", "bf16", 80, "first"),
]


@needs_cuobjdump
@needs_triton
def test_triton_kernels_do_not_spill():
    for compiled in triton_kernels(*TRITON_DEFAULT_SET):
        instructions, where = triton_sass(compiled), f"Triton {compiled.name} on {compiled.arch}"
        expect_no_spills(instructions, where)
        if compiled.kernel == "gemv":
            expect(instructions, where, "LDG", "128", why="rows of W read in 16-byte vectors")


@pytest.mark.slow
@needs_cuobjdump
@needs_triton
def test_every_triton_autotune_config_fits_and_does_not_spill():
    """Every config the autotuner would try: for the matmul those its pruning keeps for the
    dtype on an H100/H200 (sm_90) or an A100 (sm_80)."""
    requests = [("matmul", dtype, sm, "every") for dtype in ("bf16", "fp32") for sm in (90, 80)]
    requests += [("gemv", dtype, 90, "every") for dtype in ("bf16", "fp32")]
    for compiled in triton_kernels(*requests):
        where = f"Triton {compiled.name} on {compiled.arch}"
        expect_no_spills(triton_sass(compiled), where)
        assert compiled.shared <= triton_aot.SHARED_MEMORY[compiled.sm], (
            f"{where}: uses {compiled.shared} bytes of shared memory, more than the "
            f"{triton_aot.SHARED_MEMORY[compiled.sm]} the pruning assumed"
        )


@needs_cuobjdump
@needs_triton
def test_triton_gemv_stage_count_changes_nothing():
    """Why triton/gemv.py has no num_stages axis: the SASS is the same for 1 and 4 stages."""
    one, four = triton_kernels(("gemv", "bf16", 90, 0, 1), ("gemv", "bf16", 90, 0, 4))
    assert triton_sass(one) == triton_sass(four), (
        f"Triton {one.name} and {four.name} on sm_90 differ: the stage count now changes the GEMV, "
        "so num_stages may be worth tuning again in triton/gemv.py"
    )


# triton/matmul_tma.py: every Hopper config it autotunes over, BF16, and the first in FP16.
TMA_SET = [("matmul_tma", "bf16", 90, "every"), ("matmul_tma", "fp16", 90, "first")]


@needs_cuobjdump
@needs_triton
def test_triton_tma_matmul_uses_tma_and_wgmma_without_spills():
    for compiled in triton_kernels(*TMA_SET):
        instructions, where = triton_sass(compiled), f"Triton {compiled.name} on {compiled.arch}"
        expect(instructions, where, "UTMALDG", why="A and B blocks loaded by TMA through the tensor descriptors")
        expect(instructions, where, "UTMASTG", why="C tiles stored by TMA through the descriptor")
        expect(
            instructions,
            where,
            "HGMMA",
            *(["BF16"] if compiled.dtype == "bf16" else []),
            why="warpgroup MMAs (wgmma) fed from shared memory",
        )
        expect_no_spills(instructions, where)
        assert compiled.shared <= triton_aot.SHARED_MEMORY[compiled.sm], (
            f"{where}: uses {compiled.shared} bytes of shared memory, more than the "
            f"{triton_aot.SHARED_MEMORY[compiled.sm]} of an H100/H200"
        )


@needs_cuobjdump
@needs_triton
def test_triton_tma_matmul_on_ampere_would_not_use_tma():
    """Why triton.matmul_tma refuses GPUs before sm_90 instead of running there: Triton rewrites
    the descriptors into plain pointer loads for sm_80, so the kernel would have no TMA (in
    Triton 3.9 not even a shared-memory pipeline: it stages 32 KiB where Hopper stages 160)."""
    (compiled,) = triton_kernels(("matmul_tma", "bf16", 80, 3))
    instructions = triton_sass(compiled)
    assert not sass.find(instructions, "UTMALDG"), f"Triton {compiled.name} on sm_80 has TMA loads: revisit the refusal"
    assert compiled.shared < 64 * 1024, (
        f"Triton {compiled.name} on sm_80 now pipelines ({compiled.shared} bytes): revisit"
    )
    expect(instructions, f"Triton {compiled.name} on sm_80", "HMMA", why="tl.dot still on the tensor cores")


# ---- the checks can fail -----------------------------------------------------------------------------------
SPILLING_KERNEL = r"""
// An array indexed at run time cannot live in registers, and 16 registers are too few anyway.
extern "C" __global__ void forced_to_spill(float* out, const int* index, int n)
{
    float scratch[64];
    for (int i = 0; i < 64; ++i) scratch[i] = out[i * n + threadIdx.x] * 2.f;
    out[threadIdx.x] = scratch[index[threadIdx.x] & 63];
}
"""

SCALAR_KERNEL = r"""
extern "C" __global__ void scalar_copy(const float* __restrict__ in, float* __restrict__ out, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
extern "C" __global__ void vector_copy(const float4* __restrict__ in, float4* __restrict__ out, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
"""


@needs_nvcc_and_cuobjdump
def test_spill_check_fails_on_a_kernel_that_spills(tmp_path):
    source = tmp_path / "spilling.cu"
    source.write_text(SPILLING_KERNEL)
    instructions = sass.cuda_sass(source, "sm_90", extra_flags=("-maxrregcount=16",))["forced_to_spill"]
    assert sass.find(instructions, "STL") and sass.find(instructions, "LDL"), _opcode_summary(instructions)
    with pytest.raises(AssertionError, match=r"(?s)forced_to_spill on sm_90: expected no STL/LDL.*> +\d+  (STL|LDL)"):
        expect_no_spills(instructions, "forced_to_spill on sm_90")


@needs_nvcc_and_cuobjdump
def test_vector_load_check_fails_on_scalar_loads(tmp_path):
    source = tmp_path / "copies.cu"
    source.write_text(SCALAR_KERNEL)
    kernels = sass.cuda_sass(source, "sm_90")
    expect(kernels["vector_copy"], "vector_copy on sm_90", "LDG", "128", why="float4 loads")
    with pytest.raises(AssertionError, match=r"scalar_copy on sm_90: expected LDG\.128 .*found none(.|\n)*LDG\.E"):
        expect(kernels["scalar_copy"], "scalar_copy on sm_90", "LDG", "128", why="float4 loads")
