"""The launches the harness plans for a CUDA implementation, for tests that check each of them."""

from __future__ import annotations

from harness.backends.cuda import plans


def planned_launches(impl):
    """(dtype, launch) for each launch ``impl`` is planned with: a matmul or GEMV its one
    technique per dtype; a decode kernel one per weight format and tile of rows of X (M = 1, 3,
    16, 17 cover each tile and a ragged one)."""
    for dtype in impl.dtypes:
        m = 1 if impl.operation == "gemv" else 64
        techniques = (
            [plans.decode_technique(fmt, m) for fmt in impl.weights for m in (1, 3, 16, 17)]
            if impl.weights
            else [impl.backend.technique]
        )
        for technique in techniques:
            yield dtype, plans.plan(technique, dtype, m, 64, 64)
