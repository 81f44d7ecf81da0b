"""cuda/ptx.h's inline PTX, read back as PTX: every wrapper passes its arguments where the PTX
ISA puts them.

The CPU emulation replaces these wrappers with its own implementations (cuda/emu/include/
ptx_emu.h), so a wrapper that swaps two B registers of mma.sync, clears wgmma's B-transpose
immediate, inverts try_wait's predicate or emits nothing for commit_group passes every
emulated test, and the SASS does not show register order. Here each wrapper is compiled alone
into a probe kernel whose every argument comes from a distinct kernel parameter or array
element, and the PTX nvcc writes (inline asm is pasted in with its operands substituted) is
traced back: each operand of the instruction must be the argument the ISA says goes there.

PTX ISA operand orders used (ISA 8.x): mma.sync d, a, b, c; ldmatrix d, [address];
cp.async.cg.shared.global [dst], [src], cp-size, src-size; mbarrier.arrive.expect_tx _, [bar],
tx-count; mbarrier.try_wait.parity p, [bar], parity; cp.async.bulk.tensor.2d [dst], [map,
{x, y}], [bar]; wgmma.mma_async d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b,
imm-trans-a, imm-trans-b; setmaxnreg.{inc,dec} N; {cp.async,wgmma}.wait_group N.
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache

import pytest
from code_edits import replace_code

from harness.env.sources import source_path
from harness.tooling import sass

pytestmark = pytest.mark.skipif(sass.nvcc() is None, reason="nvcc not found on PATH")

PROBES = r"""
#include "ptx.h"

// Inputs come from `in` (array element i is ("in", i)) or from scalar parameters (("param", k));
// results go to `out` in order, so out[j] names what the wrapper returned in its j-th place.
extern "C" __global__ void probe_mma_bf16(const unsigned* in, const float* acc, float* out)
{
    const unsigned a[4] = {in[0], in[1], in[2], in[3]};
    const unsigned b[2] = {in[4], in[5]};
    const float c[4] = {acc[0], acc[1], acc[2], acc[3]};
    float d[4];
    ptx::mma_m16n8k16_bf16(d, a, b, c);
    for (int i = 0; i < 4; ++i) out[i] = d[i];
}
extern "C" __global__ void probe_mma_f16(const unsigned* in, const float* acc, float* out)
{
    const unsigned a[4] = {in[0], in[1], in[2], in[3]};
    const unsigned b[2] = {in[4], in[5]};
    const float c[4] = {acc[0], acc[1], acc[2], acc[3]};
    float d[4];
    ptx::mma_m16n8k16_f16(d, a, b, c);
    for (int i = 0; i < 4; ++i) out[i] = d[i];
}
extern "C" __global__ void probe_ldmatrix_x4(unsigned address, unsigned* out)
{
    unsigned r[4];
    ptx::ldmatrix_x4(r[0], r[1], r[2], r[3], address);
    for (int i = 0; i < 4; ++i) out[i] = r[i];
}
extern "C" __global__ void probe_ldmatrix_x4_trans(unsigned address, unsigned* out)
{
    unsigned r[4];
    ptx::ldmatrix_x4_trans(r[0], r[1], r[2], r[3], address);
    for (int i = 0; i < 4; ++i) out[i] = r[i];
}
extern "C" __global__ void probe_ldmatrix_x2(unsigned address, unsigned* out)
{
    unsigned r[2];
    ptx::ldmatrix_x2(r[0], r[1], address);
    for (int i = 0; i < 2; ++i) out[i] = r[i];
}
extern "C" __global__ void probe_ldmatrix_x2_trans(unsigned address, unsigned* out)
{
    unsigned r[2];
    ptx::ldmatrix_x2_trans(r[0], r[1], address);
    for (int i = 0; i < 2; ++i) out[i] = r[i];
}
extern "C" __global__ void probe_ldmatrix_x1(unsigned address, unsigned* out)
{
    unsigned r;
    ptx::ldmatrix_x1(r, address);
    out[0] = r;
}
extern "C" __global__ void probe_ldmatrix_x1_trans(unsigned address, unsigned* out)
{
    unsigned r;
    ptx::ldmatrix_x1_trans(r, address);
    out[0] = r;
}
extern "C" __global__ void probe_cp_async(unsigned dst, const void* src, unsigned src_bytes)
{
    ptx::cp_async_16(dst, src, src_bytes);
    ptx::cp_async_commit_group();
    ptx::cp_async_wait_group<3>();
}
extern "C" __global__ void probe_mbarrier(unsigned bar, unsigned count, unsigned bytes, unsigned parity, unsigned* out)
{
    ptx::mbarrier_init(bar, count);
    ptx::fence_mbarrier_init();
    ptx::mbarrier_arrive_expect_tx(bar, bytes);
    ptx::mbarrier_arrive(bar);
    out[0] = ptx::mbarrier_try_wait_parity(bar, parity);
}
extern "C" __global__ void probe_tma(const __grid_constant__ ptx::TensorMap map, unsigned dst, int x, int y, unsigned bar)
{
    ptx::fence_proxy_async();
    ptx::tma_load_2d(dst, &map, x, y, bar);
}
extern "C" __global__ void probe_wgmma(const float* in, unsigned long long a_desc, unsigned long long b_desc,
                                       int scale_d, float* out)
{
    float d[128];
    for (int i = 0; i < 128; ++i) d[i] = in[i];
    ptx::wgmma_fence();
    ptx::wgmma_m64n256k16_bf16(d, a_desc, b_desc, scale_d);
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<1>();
    for (int i = 0; i < 128; ++i) out[i] = d[i];
}
extern "C" __global__ void probe_setmaxnreg()
{
    ptx::setmaxnreg_dec<40>();
    ptx::setmaxnreg_inc<232>();
}
"""

REGISTER = r"%[a-z]+\d+"


@pytest.fixture(scope="module")
def ptx() -> str:
    return real_ptx()


@lru_cache(maxsize=None)
def probes_ptx(ptx_header: str) -> str:
    """The probes compiled to PTX for sm_90a against the ptx.h whose text is ``ptx_header``."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="ptx-probes-") as scratch:  # removed after, whatever happens
        folder = Path(scratch)
        (folder / "ptx.h").write_text(ptx_header)
        probe = folder / "probes.cu"
        probe.write_text(PROBES)
        command = [
            sass.nvcc(),
            "-arch=sm_90a",
            "-ptx",
            "-O3",
            "-I",
            str(folder),
            "-o",
            str(folder / "probes.ptx"),
            str(probe),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return (folder / "probes.ptx").read_text()


def real_ptx() -> str:
    return probes_ptx(source_path("cuda/ptx.h").read_text())


def kernel_body(text: str, name: str) -> list[str]:
    """The PTX statements of one probe kernel, one per item (multi-statement asm blocks split)."""
    start = text.index(f".entry {name}(")
    end = text.find(".entry ", start + 1)
    body = text[start : end if end > 0 else len(text)]
    statements = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        statements += [part.strip() for part in line.split(";") if part.strip()]
    return statements


class Trace:
    """Where each PTX register of a probe kernel got its value: ("param", k), ("in", array
    parameter k, element i) or ("const", value); and what each out[j] was stored from."""

    def __init__(self, ptx: str, name: str):
        self.statements = kernel_body(ptx, name)
        self.origin: dict[str, tuple] = {}
        self.stored: dict[int, str] = {}
        pointers: dict[str, int] = {}
        for s in self.statements:
            if m := re.match(rf"ld\.param\.\w+\s+({REGISTER}),\s*\[\w+_param_(\d+)\]", s):
                self.origin[m[1]] = ("param", int(m[2]))
            elif m := re.match(rf"cvta\.to\.global\.u64\s+({REGISTER}),\s*({REGISTER})", s):
                if self.origin.get(m[2], ("",))[0] == "param":
                    pointers[m[1]] = self.origin[m[2]][1]
            elif m := re.match(rf"(?:mov|cvt)\.\w+(?:\.\w+)?\s+({REGISTER}),\s*({REGISTER})$", s):
                if m[2] in self.origin:
                    self.origin[m[1]] = self.origin[m[2]]
                elif m[2] in pointers:
                    pointers[m[1]] = pointers[m[2]]
            elif m := re.match(
                rf"ld\.global(?:\.nc)?\.(?:v(\d)\.)?\w+\s+(\{{[^}}]*\}}|{REGISTER}),\s*\[({REGISTER})(?:\+(\d+))?\]", s
            ):
                base = pointers.get(m[3])
                registers = re.findall(REGISTER, m[2])
                size = 4 if "64" not in s.split()[0] else 8
                for lane, register in enumerate(registers):
                    self.origin[register] = ("in", base, (int(m[4] or 0) // size) + lane)
            elif m := re.match(
                rf"st\.global\.(?:v(\d)\.)?\w+\s+\[({REGISTER})(?:\+(\d+))?\],\s*(\{{[^}}]*\}}|{REGISTER})", s
            ):
                for lane, register in enumerate(re.findall(REGISTER, m[4])):
                    self.stored[int(m[3] or 0) // 4 + lane] = register
            elif m := re.match(rf"selp\.\w+\s+({REGISTER}),\s*(\S+),\s*(\S+),\s*(\S+)$", s):
                self.origin[m[1]] = ("selp", m[2], m[3], m[4])
            elif m := re.match(rf"setp\.ne\.\w+\s+({REGISTER}),\s*({REGISTER}),\s*0$", s):
                self.origin[m[1]] = ("nonzero", m[2])

    def instruction(self, opcode: str) -> list[str]:
        """The operands of the one statement starting with ``opcode``, split at top-level commas."""
        found = [s for s in self.statements if s.startswith(opcode + " ") or s == opcode]
        assert len(found) == 1, f"expected one {opcode}, found {found}"
        operands, depth, current = [], 0, ""
        for char in found[0][len(opcode) :].strip():
            depth += char in "{[" and 1 or 0
            depth -= char in "}]" and 1 or 0
            if char == "," and depth == 0:
                operands.append(current.strip())
                current = ""
            else:
                current += char
        return operands + ([current.strip()] if current.strip() else [])

    def of(self, operand: str) -> list[tuple]:
        """The origins of the registers in one operand ({%r1, %r2} or [%r3] or %r4)."""
        return [self.origin.get(r, ("unknown", r)) for r in re.findall(REGISTER, operand)]

    def stored_from(self, register: str) -> int | None:
        hits = [j for j, r in self.stored.items() if r == register]
        return hits[0] if len(hits) == 1 else None


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_mma_sync_takes_d_a_b_c_in_the_isas_order(ptx, dtype):
    trace = Trace(ptx, f"probe_mma_{dtype}")
    d, a, b, c = trace.instruction(f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32")
    assert trace.of(a) == [("in", 0, i) for i in range(4)], f"A registers a[0..3] in order: {a}"
    assert trace.of(b) == [("in", 0, i) for i in (4, 5)], f"B registers b[0..1] in order: {b}"
    assert trace.of(c) == [("in", 1, i) for i in range(4)], f"C registers c[0..3] in order: {c}"
    assert [trace.stored_from(r) for r in re.findall(REGISTER, d)] == [0, 1, 2, 3], f"D registers d[0..3] in order: {d}"


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_writes_its_registers_in_order_with_trans_where_named(ptx, count, trans):
    trace = Trace(ptx, f"probe_ldmatrix_x{count}{'_trans' if trans else ''}")
    opcode = f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16"
    destinations, address = trace.instruction(opcode)
    assert [trace.stored_from(r) for r in re.findall(REGISTER, destinations)] == list(range(count))
    assert trace.of(address) == [("param", 0)]


def test_cp_async_takes_dst_src_size_then_src_bytes_and_commits_and_waits(ptx):
    trace = Trace(ptx, "probe_cp_async")
    dst, src, size, src_bytes = trace.instruction("cp.async.cg.shared.global")
    assert trace.of(dst) == [("param", 0)] and trace.of(src)[0][1] == 1 and size == "16"
    assert trace.of(src_bytes) == [("param", 2)]
    assert trace.instruction("cp.async.commit_group") == []
    assert trace.instruction("cp.async.wait_group") == ["3"]


def test_mbarrier_operands_and_try_wait_returns_true_when_the_phase_completed(ptx):
    trace = Trace(ptx, "probe_mbarrier")
    bar, count = trace.instruction("mbarrier.init.shared::cta.b64")
    assert trace.of(bar) == [("param", 0)] and trace.of(count) == [("param", 1)]
    assert trace.instruction("fence.mbarrier_init.release.cluster") == []
    sink, bar, bytes_ = trace.instruction("mbarrier.arrive.expect_tx.shared::cta.b64")
    assert sink == "_" and trace.of(bar) == [("param", 0)] and trace.of(bytes_) == [("param", 2)]
    assert trace.of(trace.instruction("mbarrier.arrive.shared::cta.b64")[1]) == [("param", 0)]
    predicate, bar, parity = trace.instruction("mbarrier.try_wait.parity.shared::cta.b64")
    assert trace.of(bar) == [("param", 0)] and trace.of(parity) == [("param", 3)]
    # The wrapper's result is 1 exactly when the predicate is set (the phase completed): its
    # selp, then the compiler's bool (done != 0) stored to out[0].
    (done,) = [r for r, origin in trace.origin.items() if origin[:1] == ("selp",) and origin[3] == predicate]
    assert trace.origin[done] == ("selp", "1", "0", predicate), trace.origin[done]
    stored = trace.origin.get(trace.stored[0])
    assert stored[:3] == ("selp", "1", "0") and trace.origin.get(stored[3]) == ("nonzero", done), stored


def test_tma_load_takes_dst_map_corner_and_barrier_in_order(ptx):
    trace = Trace(ptx, "probe_tma")
    assert trace.instruction("fence.proxy.async.shared::cta") == []
    dst, source, bar = trace.instruction("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes")
    assert trace.of(dst) == [("param", 1)] and trace.of(bar) == [("param", 4)]
    inner = source.strip("[]")
    assert re.search(r"\{\s*(%r\d+),\s*(%r\d+)\s*\}", inner), source
    x, y = re.findall(REGISTER, inner)[1:]
    assert trace.of(x) == [("param", 2)] and trace.of(y) == [("param", 3)], f"corner (x = column, y = row): {source}"


def test_wgmma_takes_the_accumulators_in_order_b_transposed_and_a_not(ptx):
    trace = Trace(ptx, "probe_wgmma")
    assert trace.instruction("wgmma.fence.sync.aligned") == []
    operands = trace.instruction("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16")
    d, a_desc, b_desc, scale_d, scale_a, scale_b, trans_a, trans_b = operands
    registers = re.findall(REGISTER, d)
    assert len(registers) == 128
    assert trace.of(d) == [("in", 0, i) for i in range(128)], "the accumulators d[0..127] in order"
    assert [trace.stored_from(r) for r in registers] == list(range(128))
    assert trace.of(a_desc) == [("param", 1)] and trace.of(b_desc) == [("param", 2)]
    assert (scale_a, scale_b) == ("1", "1"), "A and B not negated"
    assert (trans_a, trans_b) == ("0", "1"), "A K-major (not transposed), B MN-major (transposed)"
    setp = [s for s in trace.statements if s.startswith("setp.ne.b32")]
    assert len(setp) == 1 and setp[0].split()[1].rstrip(",") == scale_d, "scale-d is the predicate scale_d != 0"
    assert trace.instruction("wgmma.commit_group.sync.aligned") == []
    assert trace.instruction("wgmma.wait_group.sync.aligned") == ["1"]


def test_setmaxnreg_passes_its_count(ptx):
    trace = Trace(ptx, "probe_setmaxnreg")
    assert trace.instruction("setmaxnreg.dec.sync.aligned.u32") == ["40"]
    assert trace.instruction("setmaxnreg.inc.sync.aligned.u32") == ["232"]


# Realistic one-line mistakes in ptx.h, each of which the emulation cannot see (it replaces the
# asm): every one must fail the check written for its wrapper.
WRAPPER_MUTANTS = {
    "mma.sync with its B registers swapped": (
        '"r"(b[0]), "r"(b[1]),\n                   "f"(c[0])',
        '"r"(b[1]), "r"(b[0]),\n                   "f"(c[0])',
        lambda ptx: test_mma_sync_takes_d_a_b_c_in_the_isas_order(ptx, "bf16"),
    ),
    "wgmma with the B transpose bit cleared": (
        "p, 1, 1, 0, 1;",
        "p, 1, 1, 0, 0;",
        test_wgmma_takes_the_accumulators_in_order_b_transposed_and_a_not,
    ),
    "try_wait with its predicate inverted": (
        "selp.u32 %0, 1, 0, p;",
        "selp.u32 %0, 0, 1, p;",
        test_mbarrier_operands_and_try_wait_returns_true_when_the_phase_completed,
    ),
    "a commit_group that emits nothing": (
        'asm volatile("cp.async.commit_group;" ::: "memory");',
        'asm volatile("" ::: "memory");',
        test_cp_async_takes_dst_src_size_then_src_bytes_and_commits_and_waits,
    ),
    "ldmatrix.x4 with two destinations swapped": (
        ': "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(address) : "memory");\n}\n__device__ __forceinline__ void ldmatrix_x1_trans',
        ': "=r"(r1), "=r"(r0), "=r"(r2), "=r"(r3) : "r"(address) : "memory");\n}\n__device__ __forceinline__ void ldmatrix_x1_trans',
        lambda ptx: test_ldmatrix_writes_its_registers_in_order_with_trans_where_named(ptx, 4, False),
    ),
    "a TMA corner with x and y swapped": (
        '"r"(x), "r"(y), "r"(bar)',
        '"r"(y), "r"(x), "r"(bar)',
        test_tma_load_takes_dst_map_corner_and_barrier_in_order,
    ),
    "a wait_group that ignores its count": (
        'asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");',
        'asm volatile("cp.async.wait_group 0;" ::: "memory");',
        test_cp_async_takes_dst_src_size_then_src_bytes_and_commits_and_waits,
    ),
}


@pytest.mark.parametrize("mutant", WRAPPER_MUTANTS)
def test_each_check_fails_on_a_mutated_wrapper(mutant):
    old, new, check = WRAPPER_MUTANTS[mutant]
    header = replace_code(source_path("cuda/ptx.h").read_text(), old, new, count=None, first_only=True)
    with pytest.raises(AssertionError):
        check(probes_ptx(header))  # the first place: the bf16 wrapper of a pair
