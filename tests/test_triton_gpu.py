"""GPU only: the Triton kernels compiled and autotuned, checked at the shapes that find bugs.

Skipped (with the reason) on machines without a CUDA GPU, where test_triton.py checks the
same kernels on Triton's CPU interpreter. The speed targets (triton.matmul at least 0.9x cuBLAS, triton.matmul_tma
at least 0.95x, triton.gemv at least 80% of HBM)
are judged from the GPU comparison's JSON, not re-measured here: ``python -m harness verdicts``.
"""

import harness  # first: it decides how Triton is set up before anything imports it

# isort: split

import numpy as np
import pytest

from harness import check, make_inputs
from harness.backends import triton_kernels

MODE, REASON = triton_kernels.setup()
if REASON or MODE != "native":
    pytest.skip(
        f"needs a CUDA GPU with native Triton ({REASON or 'Triton runs on its CPU interpreter here'})",
        allow_module_level=True,
    )

import torch  # noqa: E402

from harness.env.switches import switch  # noqa: E402

pytestmark = pytest.mark.gpu

# The GPU script's correctness step sets this: the autotuned kernels keep one config each, so
# the shapes below cost a compile per specialization instead of one per config (about 64
# compiles for matmul_tma alone otherwise). Speed is the comparison's business, not this file's.
CHECK_MODE_ENV = "MATMUL_TRITON_CHECK_MODE"
if switch(CHECK_MODE_ENV):
    for _relative in ("triton/matmul.py", "triton/matmul_tma.py"):
        triton_kernels.load_source(_relative).CHECK_MODE = True
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", ["1000x1030x700", "1x4096x4096", "129x127x4097"])
def test_matmul_native(shape, dtype):
    a, b = make_inputs(shape, dtype)
    prepared = harness.get("triton.matmul").prepare(a, b)
    assert prepared.mode == "native"
    prepared.run()
    outcome = check(prepared.result(), a, b)
    assert outcome.passed, outcome.message


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", ["1x4096x4096", "1x1000x3001"])
def test_gemv_native(shape, dtype):
    a, b = make_inputs(shape, dtype)
    outcome = check(harness.get("triton.gemv")(a, b), a, b)
    assert outcome.passed, outcome.message


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_transposed_views(dtype):
    source = triton_kernels.load_source("triton/matmul.py")
    a_np, b_np = make_inputs("1024x768x512", dtype)
    a_t = triton_kernels.to_torch(np.ascontiguousarray(a_np.T), "cuda")  # A stored column-major
    b_t = triton_kernels.to_torch(np.ascontiguousarray(b_np.T), "cuda")
    c = source.matmul(a_t.T, b_t.T)
    torch.cuda.synchronize()
    outcome = check(triton_kernels.to_numpy(c), a_np, b_np)
    assert outcome.passed, outcome.message


def test_compare_times_native_rows():
    results = harness.compare(["1024"], "triton.matmul", ["float16"], baselines=False, min_time=0.05)
    row = results.row("triton.matmul", "1024", "float16")
    assert row.passed and row.mode == "native" and row.median_s and row.gflops, row


# triton.matmul_tma: needs sm_90+ (it reports itself unavailable on older GPUs, with the reason).
TMA_REASON = harness.lookup("triton.matmul_tma").unavailable_reason()
needs_tma = pytest.mark.skipif(TMA_REASON is not None, reason=f"triton.matmul_tma: {TMA_REASON}")


@needs_tma
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", ["1000x1030x700", "1x4096x4096", "129x127x4097", "2048x1024x512", "5000x3000x2000"])
def test_matmul_tma_native(shape, dtype):
    # 1030, 700 and 127 are not multiples of 8 (operands copied into padded rows); 5000 x 3000
    # is 24 x 12 = 288 tiles of 128 x 256 (a bit over two per SM on an H100/H200).
    a, b = make_inputs(shape, dtype)
    prepared = harness.get("triton.matmul_tma").prepare(a, b)
    assert prepared.mode == "native"
    prepared.run()
    outcome = check(prepared.result(), a, b)
    assert outcome.passed, outcome.message


@needs_tma
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmul_tma_transposed_views(dtype):
    source = triton_kernels.load_source("triton/matmul_tma.py")
    a_np, b_np = make_inputs("1024x768x512", dtype)
    a_t = triton_kernels.to_torch(np.ascontiguousarray(a_np.T), "cuda")
    b_t = triton_kernels.to_torch(np.ascontiguousarray(b_np.T), "cuda")
    c = source.matmul_tma(a_t.T, b_t.T)
    torch.cuda.synchronize()
    outcome = check(triton_kernels.to_numpy(c), a_np, b_np)
    assert outcome.passed, outcome.message


@needs_tma
def test_compare_times_native_tma_rows():
    results = harness.compare(["1024"], "triton.matmul_tma", ["bfloat16"], baselines=False, min_time=0.05)
    row = results.row("triton.matmul_tma", "1024", "bfloat16")
    assert row.passed and row.mode == "native" and row.median_s and row.gflops, row


# triton.decode with one config per kernel (the GPU script's correctness step checks the autotuned
# path through the comparison): the first M = 1 config of each format (64 bytes of W per thread,
# pipelined), its unpipelined twin, and a decode_rows_kernel config that holds 16 rows of X.
# K = 96: one partial step; 544: 17 blocks, a partial last step; 4128: a step of one block at
# the end; 4096: whole steps only. 17 rows: a second pass of 16.
DECODE_SHAPES = [f"{m}x{n}x{k}" for m in (1, 3, 17) for n, k in [(1, 32), (7, 96), (65, 544), (33, 4128), (4096, 4096)]]
# q4_K: its blocks are chunks of 64 weights, 4 a super-block of 256: K = 256, one partial step;
# 1280, 20 chunks; 8448, 132 chunks, a step of 4 at the end; 4096, whole steps.
Q4K_DECODE_SHAPES = [
    f"{m}x{n}x{k}" for m in (1, 3, 17) for n, k in [(1, 256), (7, 768), (65, 1280), (33, 8448), (512, 4096)]
]


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "bf16", "q4_K"])
@pytest.mark.parametrize("m1_config", [0, 1])
def test_decode_native_at_the_edge_shapes_with_fixed_configs(fmt, m1_config):
    from harness.model.quant import make_decode_inputs

    module = triton_kernels.load_source("triton/decode.py")
    m1 = module.CONFIGS[fmt][m1_config]
    rows = next(config for config in module.ROWS_CONFIGS if module.fits(config, module.MAX_M))
    for shape in Q4K_DECODE_SHAPES if fmt == "q4_K" else DECODE_SHAPES:
        x, w = make_decode_inputs(shape, fmt, seed=7)
        scales, quants = module.pack(fmt, w.n, w.k, torch.from_numpy(w.data.copy()))
        scales = scales.cuda() if scales is not None else None
        chosen = m1 if x.shape[0] == 1 else rows
        config = {**chosen.kwargs, "num_warps": chosen.num_warps}
        y = module.decode(torch.from_numpy(x).cuda(), fmt, scales, quants.cuda(), config=config)
        torch.cuda.synchronize()
        outcome = check(y.cpu().numpy(), x, w.dequantize().T)
        assert outcome.passed, f"triton.decode {fmt} at {shape} with {config}: {outcome.message}"
