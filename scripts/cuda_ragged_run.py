"""Run every CUDA kernel once at ragged shapes and check each product: the program that
scripts/gpu_check.sh runs under compute-sanitizer (memcheck, racecheck).

Ragged shapes (no dimension a multiple of any tile) make every kernel take its edge paths,
where out-of-bounds accesses and missing barriers hide. Exit status 1 if a product is wrong.
Runs anywhere the CUDA implementations can (on the CPU emulation with MATMUL_CUDA_EMULATE=1).
"""

from __future__ import annotations

import sys

import harness
from harness.model.inputs import Shape
from harness.model.quant import make_decode_inputs

GEMM_SHAPES = (Shape(67, 45, 33), Shape(129, 131, 70))
GEMV_SHAPES = (Shape(1, 45, 67), Shape(1, 131, 1030))
# every path along K: one lane a row (96), 8 lanes (544), the warp (1056, 4128); each tile of rows of X
DECODE_SHAPES = (
    Shape(1, 45, 96),
    Shape(1, 67, 544),
    Shape(3, 45, 544),
    Shape(9, 33, 544),
    Shape(5, 131, 1056),
    Shape(17, 33, 4128),
)
# q4_K, a lane a super-block of 256: one lane a row (768), 8 lanes (1280: 5 super-blocks, with 4
# and 2 lanes a row for rows of X in fours and sixteens, a stage of X and part of one), the warp
# (8448: 33 super-blocks, one lane with a second step)
Q4K_DECODE_SHAPES = (
    Shape(1, 45, 768),
    Shape(1, 67, 1280),
    Shape(1, 33, 8448),
    Shape(3, 45, 1280),
    Shape(9, 33, 768),
    Shape(17, 33, 8448),
)


def main() -> int:
    failures = 0
    for impl in harness.implementations("cuda.*"):
        reason = impl.unavailable_reason()
        if reason:
            print(f"{impl.name}: unavailable: {reason}")
            failures += 1
            continue
        if impl.weights:  # decode: X [M, K] times W [N, K] in each format, M past one pass of 16 rows
            for fmt in impl.weights:
                for shape in Q4K_DECODE_SHAPES if fmt == "q4_K" else DECODE_SHAPES:
                    x, w = make_decode_inputs(shape, fmt, seed=3)
                    outcome = harness.check(harness.get(impl.name)(x, w), x, w.dequantize().T)
                    print(f"{impl.name} {fmt} {shape}: {outcome.message}", flush=True)
                    failures += not outcome.passed
            continue
        for dtype in impl.dtypes:
            for shape in GEMV_SHAPES if impl.operation == "gemv" else GEMM_SHAPES:
                a, b = harness.make_inputs(shape, dtype, seed=3)
                outcome = harness.check(harness.get(impl.name)(a, b), a, b)
                print(f"{impl.name} {dtype} {shape}: {outcome.message}", flush=True)
                failures += not outcome.passed
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
