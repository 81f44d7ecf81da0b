"""cuda.decode at M = 1 held to an instruction budget per 32-weight block, read in its SASS.

A GEMV over 4-bit weights reads so few bytes per weight that the instructions spent on each
block, not the memory, can be its limit: the first version of cuda/decode.cu spent 194 per
q4_0 block (an I2F and a multiply per weight), which caps an H200 at 3.1 TB/s whatever the
memory does. So the loop is counted here, without a GPU, against what 85% of the H200's HBM
bandwidth asks of it.

The arithmetic. An H200 (the GPU of results/gpu/) has 132 SMs of 4 warp schedulers, each
issuing at most one warp-instruction per cycle, at 1.98 GHz (max_sm_clock in
results/gpu/REPORT.md), and 4.8 TB/s of HBM3e (harness/backends/gpu.py's datasheet figure):

    issue rate        132 x 4 x 1.98e9            = 1.045e12 warp-instructions/s
    85% of the HBM    0.85 x 4.8e12               = 4.08e12 bytes/s
    allowed per block issue rate x block bytes / 4.08e12, in warp-instructions:
                      q4_0 (18 bytes per 32 weights)  4.61
                      q8_0 (34 bytes)                 8.71
                      bf16 (64 bytes)                16.40
                      q4_K (144 bytes per 256 weights: 18 per 32, 4.5 bits a weight)
                                                      4.61 per 32 weights, 36.9 per super-block

Each lane of the loop works on a block of its own (a warp covers 32 blocks per trip and row),
so one warp-instruction of the loop serves 32 blocks, and the budget per lane and block is 32
times those: 147.6 (q4_0), 278.8 (q8_0) and 524.9 (bf16) instructions; for q4_K, whose lanes
each take a whole super-block, 1181 per super-block, 147.6 per 32 weights, the unit counted
here (a q4_K sub-block). The integer pipe takes 16
lanes per scheduler per cycle (64 per SM: half the issue rate), so at most half of each budget
may be integer instructions (LOP3, PRMT, shifts, adds, IMAD, compares, moves). And no
int-to-float conversion belongs in the loop: I2F runs at 16 per SM per cycle, an eighth of
the FP32 rate.

Counted: the loop that reads W (its evict-first 16-byte loads) of each M = 1 kernel compiled
for sm_90, every instruction from its head to its backward branch, divided by the blocks one
trip reads (those loads, 1, 2 or 4 per block; q4_K: 9 per super-block of 8 sub-blocks, its
header and 8 of quants). Today's kernel: q4_0 118, q8_0 128, bf16 92 (the first version: 194,
157, 83), so by its counts it is memory-bound: q4_0 could issue 5.1 TB/s of blocks.

q4_K (nvcc 13.0): 143.8 per sub-block (2301 per trip of 2 rows x 1 super-block), 39.9 of them
integer, of the 147.6 allowed: an issue roof of 4.19 TB/s, 87% of the HBM. Every weight is
dequantized exactly, as ggml's float32 weights are ((d sc_j) q - dmin m_j, one rounding), not
scaled once per block as q4_0's are, so a weight costs one more FFMA: 4.125 instructions a
weight (LOP3 + FADD to make its nibble a float, FFMA to dequantize, FFMA to accumulate; a
shift per 8 weights), 132 per sub-block, and 11.8 for the rest (16-byte loads of W and of X,
the scales and mins). Written in C the nibble's mask-and-exponent LOP3 becomes two (176 per
sub-block): the kernel writes it as PTX (test_the_q4_k_budget_fails_without_one_lop3_a_nibble).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from code_edits import replace_code

from harness.backends import gpu
from harness.env.sources import source_path
from harness.model import quant
from harness.tooling import sass

needs_sass = pytest.mark.skipif(sass.unavailable_reason() is not None, reason=str(sass.unavailable_reason()))

SMS, SCHEDULERS, CLOCK_HZ = 132, 4, 1.98e9  # an H200
HBM_BYTES_PER_S = dict(gpu.GPU_PEAKS)["H200"]["bandwidth"] * 1e9
FRACTION = 0.85
ISSUE_RATE = SMS * SCHEDULERS * CLOCK_HZ  # warp-instructions per second
LANES = 32  # blocks a warp-instruction of the loop serves

BLOCK_BYTES = {"q4_0": 18, "q8_0": 34, "bf16": 64, "q4_K": 144 / 8}  # per 32 weights
VECTORS = {"q4_0": 1, "q8_0": 2, "bf16": 4, "q4_K": 9 / 8}  # 16-byte loads of W per block (q4_K: 9 per 8)
INTEGER = {
    "LOP3", "LOP", "PRMT", "SHF", "SHL", "SHR", "IADD3", "IADD", "VIADD", "LEA", "IMAD", "IMUL",
    "ISETP", "SEL", "IMNMX", "VIMNMX", "VIADDMNMX", "IABS", "MOV", "P2R", "R2P", "PLOP3", "POPC",
    "FLO", "BMSK", "SGXT", "BREV", "I2FP",
}  # fmt: skip
CONVERSIONS = {"I2F", "I2FP", "F2I", "F2F", "I2I"}


def budget(fmt: str) -> float:
    """Instructions per lane and block at which the loop issues FRACTION of the HBM bandwidth."""
    return LANES * ISSUE_RATE * BLOCK_BYTES[fmt] / (FRACTION * HBM_BYTES_PER_S)


def bandwidth_by_issue(fmt: str, per_block: float) -> float:
    """Bytes per second of W the loop could consume if issue were its only limit."""
    return ISSUE_RATE * LANES / per_block * BLOCK_BYTES[fmt]


@dataclass
class Loop:
    body: list[str]
    blocks: float  # blocks of W one trip reads, per lane

    @property
    def per_block(self) -> float:
        return len(self.body) / self.blocks

    def count(self, names: set[str]) -> int:
        return sum(sass.opcode(i).split(".")[0] in names for i in self.body)


def loops(instructions: list[str]) -> list[tuple[int, int]]:
    """(head, branch) of every backward branch. sm_70 and later encode every instruction in 16
    bytes and cuobjdump numbers a kernel's from 0, so the one at index i is at address 16 i."""
    found = []
    for index, text in enumerate(instructions):
        target = re.search(r"(0x[0-9a-f]+)$", text)
        if sass.opcode(text).split(".")[0] == "BRA" and target:
            head = int(target[1], 16) // 16
            if head <= index:
                found.append((head, index))
    return found


def w_loop(instructions: list[str], fmt: str) -> Loop:
    """The innermost loop that streams W (evict-first 16-byte loads)."""
    candidates = []
    for head, branch in loops(instructions):
        body = instructions[head : branch + 1]
        loads = len(sass.find(body, "LDG", "128", "EF"))
        if loads:
            candidates.append(Loop(body, loads / VECTORS[fmt]))
    assert candidates, "no loop with evict-first 16-byte loads (LDG.E.EF.128) of W"
    return min(candidates, key=lambda loop: len(loop.body))


def check_budget(instructions: list[str], fmt: str, where: str) -> Loop:
    loop = w_loop(instructions, fmt)
    allowed = budget(fmt)
    summary = ", ".join(f"{k} x{v}" for k, v in sorted(sass.opcodes(loop.body).items()))
    roof = bandwidth_by_issue(fmt, loop.per_block) / 1e12
    assert loop.per_block <= allowed, (
        f"{where}: {loop.per_block:.1f} instructions per {fmt} block ({len(loop.body)} per trip of "
        f"{loop.blocks:g} blocks), more than the {allowed:.0f} that issue {FRACTION:.0%} of the H200's "
        f"HBM bandwidth: issue alone caps it at {roof:.2f} TB/s.\nThe loop: {summary}"
    )
    integer = loop.count(INTEGER) / loop.blocks
    assert integer <= allowed / 2, (
        f"{where}: {integer:.1f} integer instructions per {fmt} block, more than the {allowed / 2:.0f} the "
        f"integer pipe (half the issue rate) allows.\nThe loop: {summary}"
    )
    conversions = loop.count(CONVERSIONS)
    assert not conversions, f"{where}: {conversions} int/float conversions in the loop.\nThe loop: {summary}"
    return loop


FORMATS = ["q4_0", "q8_0", "bf16", "q4_K"]


def test_the_budgets_follow_from_the_h200s_figures():
    assert {f: round(budget(f)) for f in FORMATS} == {"q4_0": 148, "q8_0": 279, "bf16": 525, "q4_K": 148}
    assert BLOCK_BYTES["q4_0"] == quant.FORMATS["q4_0"].bytes_per_block
    assert BLOCK_BYTES["q8_0"] == quant.FORMATS["q8_0"].bytes_per_block
    assert BLOCK_BYTES["bf16"] == 32 * quant.FORMATS["bf16"].bytes_per_block
    q4_k = quant.FORMATS["q4_K"]  # 144 bytes per 256 weights: 4.5 bits a weight, as q4_0
    assert BLOCK_BYTES["q4_K"] * q4_k.block_size / 32 == q4_k.bytes_per_block and q4_k.bits_per_weight == 4.5
    assert round(budget("q4_K") * q4_k.block_size / 32) == 1181  # per super-block
    assert VECTORS["q4_K"] * q4_k.block_size / 32 * 16 == q4_k.bytes_per_block
    # the first version's 774 instructions per 4 q4_0 blocks: issue-bound near 3.1 TB/s
    assert bandwidth_by_issue("q4_0", 774 / 4) == pytest.approx(3.1e12, rel=0.01)


def test_loops_are_found_by_their_backward_branches():
    instructions = ["MOV R1, RZ", "LDG.E.EF.128 R4, desc[UR4][R2.64]", "FFMA R1, R4, R5, R1", "@P0 BRA 0x10", "EXIT"]
    assert loops(instructions) == [(1, 3)]
    loop = w_loop(instructions, "q4_0")
    assert loop.blocks == 1 and loop.per_block == 3 and loop.count(INTEGER) == 0


@needs_sass
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_m1_loop_fits_the_budget_that_reaches_85_percent_of_hbm(fmt):
    kernel = f"decode_{fmt}_m1_f32"
    instructions = sass.cuda_sass("cuda/decode.cu", "sm_90")[kernel]
    loop = check_budget(instructions, fmt, f"{kernel} on sm_90")
    if fmt in ("q4_0", "q8_0"):  # the scale once per block: converted (fp16 to fp32) once, no multiply per weight
        assert loop.count({"FMUL"}) == 0, sass.opcodes(loop.body)
        assert loop.count({"HADD2"}) == loop.blocks, sass.opcodes(loop.body)
    if fmt == "q4_K":
        # each weight: a FADD (its nibble as a float), an FFMA (dequantized: one rounding) and an
        # FFMA (times x); each sub-block: d sc_j and dmin m_j, an FFMA each; each super-block: d
        # and dmin converted once (HADD2) and multiplied by 2^23 once (FMUL)
        supers = loop.blocks / 8
        assert loop.count({"FADD"}) == 32 * loop.blocks, sass.opcodes(loop.body)
        assert loop.count({"FFMA"}) == (64 + 2) * loop.blocks, sass.opcodes(loop.body)
        assert loop.count({"HADD2"}) == loop.count({"FMUL"}) == 2 * supers, sass.opcodes(loop.body)


@needs_sass
@pytest.mark.parametrize(
    "kernel",
    ["decode_q4_0_m4_f32", "decode_q4_0_m16_f32", "decode_q8_0_m16_f32", "decode_q4_K_m4_f32", "decode_q4_K_m16_f32"],
)
def test_the_batched_loops_read_x_from_shared_memory(kernel):
    """M > 1: the rows of X come from the block's stage in shared memory (LDS.128), 8 per row of
    X and block, none from global memory inside the loop."""
    fmt = kernel.split("_m")[0].removeprefix("decode_")
    rows_of_x = int(kernel.split("_m")[1].split("_")[0])
    loop = w_loop(sass.cuda_sass("cuda/decode.cu", "sm_90")[kernel], fmt)
    x_loads = len(sass.find(loop.body, "LDS", "128"))
    rows_of_w = {"q4_0": 4, "q8_0": 2, "q4_K": 2}[fmt]
    assert x_loads == 8 * rows_of_x * loop.blocks / rows_of_w, sass.opcodes(loop.body)
    scale_loads = 0 if fmt == "q4_K" else loop.blocks  # q4_K's scales are in its super-block's 16-byte header
    assert loop.count({"LDG"}) == VECTORS[fmt] * loop.blocks + scale_loads  # W's quants and scales only


@needs_sass
def test_the_budget_fails_on_a_conversion_per_weight(tmp_path):
    """The check can fail: the same kernel with each weight converted by I2F and scaled, as the
    first version did, is over the q4_0 budget and has conversions in its loop."""
    text = source_path("cuda/decode.cu").read_text()
    converted = replace_code(
        text,
        "return __uint_as_float(__byte_perm(bytes, exponent, 0x7540 + which)) - offset;",
        "const float unit = exponent == TWO_23 ? 1.f : 0.0625f, magic = exponent == TWO_23 ? 8388608.f : 524288.f;"
        "return (float)((bytes >> 8 * which) & 0xffu) * unit - (offset - magic);",
    )
    source = tmp_path / "decode_converted.cu"
    source.write_text(converted)
    instructions = sass.cuda_sass(source, "sm_90")["decode_q4_0_m1_f32"]
    with pytest.raises(AssertionError, match=r"instructions per q4_0 block|int/float conversions"):
        check_budget(instructions, "q4_0", "decode_q4_0_m1_f32 with I2F")
    assert w_loop(instructions, "q4_0").count(CONVERSIONS) > 0


@needs_sass
def test_the_q4_k_budget_fails_without_one_lop3_a_nibble(tmp_path):
    """The q4_K check can fail too: with the nibble's mask and exponent written in C (what the
    kernel's PTX lop3 stands for), the compiler spends two LOP3s a weight, and the loop is over
    the budget (176 instructions a sub-block with nvcc 13.0)."""
    text = source_path("cuda/decode.cu").read_text()
    in_c = replace_code(
        text,
        'asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(out) : "r"(word), "r"(mask), "r"(exponent));',
        "out = (word & mask) | exponent;",
    )
    source = tmp_path / "decode_two_lop3.cu"
    source.write_text(in_c)
    instructions = sass.cuda_sass(source, "sm_90")["decode_q4_K_m1_f32"]
    with pytest.raises(AssertionError, match=r"instructions per q4_K block"):
        check_budget(instructions, "q4_K", "decode_q4_K_m1_f32 with two LOP3s a nibble")
    assert w_loop(instructions, "q4_K").count({"LOP3"}) >= 2 * 32 * w_loop(instructions, "q4_K").blocks
