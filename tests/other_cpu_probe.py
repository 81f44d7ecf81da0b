"""Run by tests/test_other_cpus.py on an emulated CPU (qemu's user mode): what each C
implementation is there (its kernels, or why it cannot run) and whether its products pass
the float64 check on edge shapes, on one thread and two. Prints one JSON object.

Not a test file itself: it is a script, run as `python tests/other_cpu_probe.py` under the
emulator, with MATMUL_C_LIBRARY naming the library to load."""

from __future__ import annotations

import json

import harness
from harness.backends.c import clib
from harness.model import quant
from harness.model.errors import MatmulInputError
from harness.model.registry import describe

# M = 1 (GEMV) and N = 1 (dot products) paths, edges past every register tile, the decode
# kernels' row path (M <= 8), their tiles (M >= 9) and whole q4_K super-blocks (K = 256)
GEMM_SHAPES = ["1x1x1", "7x15x17", "17x33x65", "1x129x300", "129x1x77", "65x64x63"]
DECODE_SHAPES = ["1x24x256", "5x33x256", "12x40x512"]


def probe(impl) -> dict:
    entry = {"unavailable": impl.unavailable_reason(), "detail": None, "checked": 0, "failures": []}
    if entry["unavailable"]:
        return entry
    entry["detail"] = describe(impl)
    problems = []
    for dtype in impl.dtypes:
        if impl.weights:
            for fmt in impl.weights:
                for shape in DECODE_SHAPES:
                    try:
                        problems.append((f"{shape} {fmt}", *quant.make_decode_inputs(shape, fmt, seed=1)))
                    except MatmulInputError:
                        continue  # a format that cannot hold this N x K
        else:
            for shape in GEMM_SHAPES:
                problems.append((f"{shape} {dtype}", *harness.make_inputs(shape, dtype, seed=1)))
    for label, a, b in problems:
        for threads in (1, 2) if impl.threaded else (1,):
            try:
                options = {"threads": threads} if impl.threaded else {}
                result = harness.get(impl.name, **options)(a, b)
                outcome = harness.check(result, a, b, activation_rounding=impl.activation_rounding)
                if not outcome.passed:
                    entry["failures"].append(f"{label} on {threads} thread(s): {outcome.message}")
            except Exception as error:  # said, not raised: the other problems still run
                entry["failures"].append(f"{label} on {threads} thread(s): {type(error).__name__}: {error}")
            entry["checked"] += 1
    return entry


def main() -> None:
    report = {"library_isa": clib.build_isa(), "implementations": {}}
    for impl in harness.implementations():
        if impl.language == "c":
            report["implementations"][impl.name] = probe(impl)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
