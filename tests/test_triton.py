"""The Triton matmul and GEMV: correctness on edge shapes, every dtype, any strides, bad input.

Without a GPU these run on Triton's CPU interpreter (TRITON_INTERPRET=1, set by the harness
when it is imported, before Triton is), with small blocks and small shapes because the
interpreter is slow. With a GPU the same tests run natively; the large shapes, the autotuner
and the speed targets are in test_triton_gpu.py.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import harness  # first: it chooses the interpreter before anything imports triton

# isort: split

import numpy as np
import pytest
import triton_aot
from code_edits import replace_code

from harness import MatmulInputError, check, make_inputs
from harness.backends import triton_kernels
from harness.tooling import sass

ROOT = Path(__file__).resolve().parents[1]
MODE, REASON = triton_kernels.setup()
if REASON:
    pytest.skip(f"Triton kernels unavailable: {REASON}", allow_module_level=True)

import torch  # noqa: E402  (after the harness: see above)

DEVICE = "cuda" if MODE == "native" else "cpu"
DTYPES = ["float32", "float16", "bfloat16"]
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Small enough for the interpreter, and legal for tl.dot on a GPU (blocks of at least 16).
SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 3}


@pytest.fixture(scope="module")
def matmul_source():
    return triton_kernels.load_source("triton/matmul.py")


@pytest.fixture(scope="module")
def gemv_source():
    return triton_kernels.load_source("triton/gemv.py")


def tensor(shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=generator) * 2 - 1).to(TORCH_DTYPES[dtype]).to(DEVICE)


def assert_close(result, a, b):
    """Check a torch result against the float64 reference of a @ b, with the harness's tolerance."""
    np_a = triton_kernels.to_numpy(a)
    np_b = triton_kernels.to_numpy(b)
    outcome = check(triton_kernels.to_numpy(result), np_a, np_b)
    assert outcome.passed, outcome.message


# --- through the harness, as compare and the benchmark suite call them ----------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["100x130x70", "1x130x70", "17x15x1", "33x65x129"])
def test_matmul_shapes_and_dtypes(shape, dtype):
    a, b = make_inputs(shape, dtype)
    a_before, b_before = a.copy(), b.copy()
    mm = harness.get("triton.matmul")
    prepared = mm.prepare(a, b)
    assert prepared.mode == ("native" if MODE == "native" else "interpreted")
    prepared.run()
    c = prepared.result()
    assert c.dtype == a.dtype and c.shape == (a.shape[0], b.shape[1])
    outcome = check(c, a, b)
    assert outcome.passed, outcome.message
    np.testing.assert_array_equal(a, a_before)  # inputs never modified
    np.testing.assert_array_equal(b, b_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["1x130x70", "1x1x1", "1x17x300"])
def test_gemv_shapes_and_dtypes(shape, dtype):
    a, b = make_inputs(shape, dtype)
    c = harness.get("triton.gemv")(a, b)
    assert c.dtype == a.dtype and c.shape == (1, b.shape[1])
    outcome = check(c, a, b)
    assert outcome.passed, outcome.message


def test_gemv_refuses_m_above_one():
    a, b = make_inputs("2x8x8", "float32")
    with pytest.raises(MatmulInputError, match="M = 1"):
        harness.get("triton.gemv")(a, b)


def test_empty_products():
    for shape in ("5x4x0", "0x4x3"):
        a, b = make_inputs(shape, "float16")
        c = harness.get("triton.matmul")(a, b)
        assert c.shape == (a.shape[0], b.shape[1]) and not c.any()


def test_compare_marks_interpreted_rows_and_does_not_time_them():
    results = harness.compare(["9x10x11"], "triton.matmul", ["bfloat16"], baselines=False)
    row = results.row("triton.matmul", "9x10x11", "bfloat16")
    assert row.passed, row.status
    if MODE == "interpreted":
        assert row.mode == "interpreted" and row.median_s is None and row.gflops is None
        assert "interpreted, not timed" in str(results)


# --- the wrappers directly: strides, configs ----------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_transposed_and_strided_inputs_need_no_copy(matmul_source, dtype):
    m, n, k = 40, 50, 36
    a_t = tensor((k, m), dtype, 1)  # A stored as [K, M]: a_t.T is A, column-major
    b_t = tensor((n, k), dtype, 2)
    wide = tensor((m, 2 * k), dtype, 3)
    a_before, b_before = a_t.clone(), b_t.clone()
    for a, b in [(a_t.T, b_t.T), (a_t.T, b_t.T.contiguous()), (wide[:, ::2], b_t.T)]:
        assert not (a.is_contiguous() and b.is_contiguous())
        c = matmul_source.matmul(a, b, config=SMALL)
        assert c.is_contiguous() and c.dtype == a.dtype
        assert_close(c, a, b)
    assert torch.equal(a_t, a_before) and torch.equal(b_t, b_before)


def test_matmul_last_group_shorter_than_group_m(matmul_source):
    # 100 rows in 16-row blocks is 7 tile-rows: with GROUP_M = 3, groups of 3, 3 and a ragged 1;
    # GROUP_M = 1 is plain row-major order.
    a, b = tensor((100, 20), "float16", 4), tensor((20, 40), "float16", 5)
    for group_m in (1, 3):
        assert_close(matmul_source.matmul(a, b, config={**SMALL, "GROUP_M": group_m}), a, b)


def test_matmul_default_config(matmul_source):
    # Interpreted: the one small config; native: the autotuner.
    a, b = tensor((33, 47), "bfloat16", 6), tensor((47, 65), "bfloat16", 7)
    assert_close(matmul_source.matmul(a, b), a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_wrapper_any_strides(gemv_source, dtype):
    n, k = 70, 90
    w = tensor((n, k), dtype, 8)
    x_wide = tensor((2 * k,), dtype, 9)
    for weights, x in [(w, x_wide[:k]), (w.T.contiguous().T, x_wide[::2])]:  # row-major W; W read through B^T
        y = gemv_source.gemv(weights, x)
        assert y.shape == (n,) and y.dtype == w.dtype
        assert_close(y[None, :], x[None, :], weights.T)


# --- bad input ----------------------------------------------------------------------------------------
def test_matmul_wrapper_bad_input(matmul_source):
    a, b = tensor((4, 5), "float32"), tensor((6, 3), "float32")
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(6, 3\)"):
        matmul_source.matmul(a, b)
    with pytest.raises(ValueError, match="2-D"):
        matmul_source.matmul(a[0], b)
    with pytest.raises(TypeError, match="one dtype"):
        matmul_source.matmul(a, tensor((5, 3), "float16"))
    with pytest.raises(TypeError, match="unsupported dtype torch.float64"):
        matmul_source.matmul(a.double(), b[:5].double())
    with pytest.raises(TypeError, match="torch.Tensor"):
        matmul_source.matmul(np.ones((4, 5), np.float32), b[:5])
    with pytest.raises(ValueError, match="tensors on meta"):
        matmul_source.matmul(a.to("meta"), b[:5].to("meta"))
    with pytest.raises(ValueError, match="BLOCK_K must be a power of two >= 16"):
        matmul_source.matmul(a, b[:5], config={**SMALL, "BLOCK_K": 8})


def test_gemv_wrapper_bad_input(gemv_source):
    w, x = tensor((4, 5), "float16"), tensor((6,), "float16")
    with pytest.raises(ValueError, match=r"\(4, 5\).*6"):
        gemv_source.gemv(w, x)
    with pytest.raises(ValueError, match="1-D"):
        gemv_source.gemv(w, x[None, :5])
    with pytest.raises(TypeError, match="one dtype"):
        gemv_source.gemv(w, x[:5].float())


def test_harness_refuses_float64_and_mismatched_shapes():
    with pytest.raises(MatmulInputError, match="float64"):
        harness.get("triton.matmul")(*make_inputs("4x4x4", "float64"))
    a, _ = make_inputs("4x5x6", "float16")
    with pytest.raises(MatmulInputError, match=r"\(4, 6\).*\(4, 5\)"):
        harness.get("triton.matmul")(a, a[:, :5])


# --- the interpreter has to be chosen before Triton is imported ------------------------------------------
@pytest.mark.skipif(MODE == "native", reason="only meaningful where Triton has to run on its interpreter")
def test_triton_imported_first_is_reported_not_run_wrongly():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import triton, harness\n"
        "reason = harness.lookup('triton.matmul').unavailable_reason()\n"
        "print(reason)\n"
        "assert reason and 'imported before TRITON_INTERPRET=1' in reason, reason\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


# --- without a GPU, still compile for one: Hopper and Ampere, ahead of time -----------------------------
# tests/triton_aot.py compiles the kernels for sm_90 and sm_80 with the ptxas that Triton's wheel
# carries. This catches a kernel that no longer compiles natively (the interpreter accepts things
# the compiler does not), one that lost its tensor-core path or its 16-byte loads, and register
# spills, which show in the SASS as local-memory stores and loads (STL/LDL); cuobjdump's LOCAL
# count does not see them. tests/test_sass.py checks more of the SASS.
AOT_BUILDS = [
    ("matmul", "fp16", 90, "first"),
    ("matmul", "bf16", 90, "first"),
    ("matmul", "bf16", 80, "first"),
    ("matmul", "fp32", 90, "first"),
    ("gemv", "bf16", 90, 2),
    ("gemv", "fp16", 80, 1),
    ("matmul_tma", "bf16", 90, "first"),
]


@pytest.mark.slow  # ahead-of-time compiles for two GPUs: seconds each
def test_kernels_compile_for_hopper_and_ampere():
    try:
        built = triton_aot.compile_kernels(*AOT_BUILDS)
    except triton_aot.Skip as skip:
        pytest.skip(str(skip))
    for compiled in built:
        where = f"{compiled.name} for {compiled.arch}"
        if compiled.kernel == "matmul" and compiled.dtype != "fp32":
            instruction = "wgmma" if compiled.sm >= 90 else "mma.sync"
            assert instruction in compiled.ptx, f"{where}: no tensor-core instruction ({instruction}) in the PTX"
        if compiled.kernel == "matmul_tma":
            for instruction in ("cp.async.bulk.tensor", "wgmma"):  # TMA copies feeding warpgroup MMAs
                assert instruction in compiled.ptx, f"{where}: no {instruction} in the PTX"
        if compiled.kernel == "gemv":
            assert re.search(r"ld\.global[.\w]*\.v4\.b32", compiled.ptx), f"{where}: no 16-byte loads of W"
        if sass.cuobjdump():
            (instructions,) = sass.cubin_sass(compiled.cubin).values()
            spilled = sass.spills(instructions)
            assert not spilled, f"{where} spills registers (STL/LDL):\n{sass.excerpt(instructions, spilled)}"


def test_autotune_configs_pruned_to_shared_memory(matmul_source, monkeypatch):
    # Half precision keeps every config; FP32 (twice the bytes, and FMAs with every operand in
    # registers) keeps the configs with BLOCK_K = 32 and at most 64 accumulators per thread.
    for limit, configs, fp32_kept in [
        (232448, matmul_source.HOPPER_CONFIGS, 5),  # H100/H200: 227 KiB per block
        (166912, matmul_source.AMPERE_CONFIGS, 4),
    ]:  # A100: 163 KiB
        monkeypatch.setattr(matmul_source, "_shared_memory_limit", lambda index, limit=limit: limit)
        for dtype, expected in [("float16", len(configs)), ("bfloat16", len(configs)), ("float32", fp32_kept)]:
            kept = matmul_source._prune_configs(configs, {"a_ptr": tensor((2, 2), dtype)})
            assert len(kept) == expected, (limit, dtype, [(c.kwargs, c.num_warps, c.num_stages) for c in kept])
        fp32 = matmul_source._prune_configs(configs, {"a_ptr": tensor((2, 2), "float32")}, INPUT_PRECISION="ieee")
        assert all(matmul_source._accumulators_per_thread(c) <= matmul_source.FP32_ACCUMULATORS for c in fp32)
    # TF32 runs on the tensor cores: the register limit is for FP32 FMAs only.
    tf32 = matmul_source._prune_configs(
        matmul_source.AMPERE_CONFIGS, {"a_ptr": tensor((2, 2), "float32")}, INPUT_PRECISION="tf32"
    )
    assert any(matmul_source._accumulators_per_thread(c) > matmul_source.FP32_ACCUMULATORS for c in tf32)
    monkeypatch.setattr(matmul_source, "_shared_memory_limit", lambda index: 1024)  # nothing fits: keep the smallest
    assert len(matmul_source._prune_configs(matmul_source.AMPERE_CONFIGS, {"a_ptr": tensor((2, 2), "float32")})) == 1


# --- the persistent TMA matmul (triton/matmul_tma.py) ------------------------------------------------------
# Triton 3.9's interpreter runs host-side tensor descriptors: a block load becomes a masked load
# with zero fill, with TMA's alignment rules asserted (base, strides, block offsets). The TMA
# instructions themselves are checked in the ahead-of-time compile (test_sass.py).
@pytest.fixture(scope="module")
def tma_source():
    return triton_kernels.load_source("triton/matmul_tma.py")


HALF = ["float16", "bfloat16"]
# 1, 7, 17 and 65 in each dimension; 130 and 70 are not multiples of 8 (padded copies), 33x64x48
# and 48x24x40 are (read in place).
TMA_SHAPES = ["1x1x1", "7x17x65", "65x7x17", "17x65x7", "1x130x70", "100x130x70", "33x64x48", "48x24x40"]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", TMA_SHAPES)
def test_matmul_tma_shapes_and_dtypes(shape, dtype):
    a, b = make_inputs(shape, dtype)
    a_before, b_before = a.copy(), b.copy()
    prepared = harness.get("triton.matmul_tma").prepare(a, b)
    assert prepared.mode == ("native" if MODE == "native" else "interpreted")
    prepared.run()
    c = prepared.result()
    assert c.dtype == a.dtype and c.shape == (a.shape[0], b.shape[1])
    outcome = check(c, a, b)
    assert outcome.passed, outcome.message
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


@pytest.mark.parametrize("subtile", [False, True])
def test_matmul_tma_persistent_loop(tma_source, subtile):
    # 7 x 5 = 35 tiles of 16 x 32: one program walks all of them, 4 walk about 9 each (35 is
    # not a multiple of 4), 64 are more than there are tiles (one each). GROUP_M = 3 leaves a
    # short last group of tile-rows; 1 is plain row-major order.
    a, b = tensor((100, 40), "bfloat16", 10), tensor((40, 150), "bfloat16", 11)
    for programs in (1, 4, 64):
        for group_m in (1, 3):
            config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": group_m, "EPILOGUE_SUBTILE": subtile}
            c = tma_source.matmul_tma(a, b, config=config, programs=programs)
            assert c.is_contiguous() and c.shape == (100, 150)
            assert_close(c, a, b)


def test_matmul_tma_default_config(tma_source):
    # Interpreted: the one small config; native: the autotuner.
    a, b = tensor((33, 48), "float16", 12), tensor((48, 72), "float16", 13)
    assert_close(tma_source.matmul_tma(a, b), a, b)


def test_tma_alignment_rules_and_padded_copies(tma_source):
    aligned = tensor((9, 24), "float16", 14)  # 48-byte rows
    assert tma_source.tma_operand(aligned) is aligned  # read in place, no copy
    # What TMA refuses, as Triton's own descriptor checks it: K = 7 halves is a 14-byte row stride.
    odd = tensor((9, 7), "float16", 15)
    with pytest.raises(AssertionError, match="16-byte aligned"):
        tma_source.TensorDescriptor(odd, [9, 7], [7, 1], [16, 16])
    for t in (odd, aligned.T, aligned[:, 1:]):  # odd row length, transposed view, unaligned base
        assert not tma_source.tma_compatible(t)
        copy = tma_source.tma_operand(t)
        assert tma_source.tma_compatible(copy) and copy.shape == t.shape and torch.equal(copy, t)
        assert copy.stride(0) % 8 == 0 and copy.stride(1) == 1
        tma_source.TensorDescriptor(copy, list(copy.shape), [copy.stride(0), 1], [16, 16])  # accepted now


@pytest.mark.parametrize("dtype", HALF)
def test_matmul_tma_transposed_and_strided_inputs(tma_source, dtype):
    m, n, k = 40, 50, 36
    a_t, b_t, wide = tensor((k, m), dtype, 16), tensor((n, k), dtype, 17), tensor((m, 2 * k), dtype, 18)
    before = [t.clone() for t in (a_t, b_t, wide)]
    for a, b in [(a_t.T, b_t.T), (wide[:, ::2], b_t.T.contiguous()), (wide[:, 1 : k + 1], b_t.T)]:
        assert_close(tma_source.matmul_tma(a, b), a, b)
    assert all(torch.equal(t, u) for t, u in zip((a_t, b_t, wide), before))  # inputs untouched


def test_tma_unavailable_reasons(tma_source):
    assert tma_source.tma_unavailable_reason(None) is None  # the interpreter: no GPU to ask
    assert tma_source.tma_unavailable_reason((9, 0)) is None and tma_source.tma_unavailable_reason((10, 0)) is None
    older = tma_source.tma_unavailable_reason((8, 6))
    assert "sm_86" in older and "sm_90" in older and "triton.matmul" in older
    missing = tma_source.tma_unavailable_reason((9, 0), descriptors=False)
    assert "no tensor descriptors" in missing and tma_source.triton.__version__ in missing


def test_harness_reports_tma_kernel_unavailable_on_older_gpus(tma_source, monkeypatch):
    impl = harness.lookup("triton.matmul_tma")
    if MODE == "interpreted":
        assert impl.unavailable_reason() is None  # interpreted: no GPU that could be too old
    # As on an A100 with native Triton: the row says why, and points at triton.matmul.
    plain = triton_kernels.load_source("triton/matmul.py")  # loaded before the mode is faked
    monkeypatch.setattr(triton_kernels, "setup", lambda: ("native", None))
    monkeypatch.setattr(triton_kernels, "load_source", lambda relative: tma_source if "tma" in relative else plain)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (8, 0))
    reason = impl.unavailable_reason()
    assert reason and "sm_80" in reason and "triton.matmul" in reason
    assert harness.lookup("triton.matmul").unavailable_reason() is None  # the plain kernel still runs


def test_matmul_tma_bad_input(tma_source):
    a, b = tensor((4, 8), "float16"), tensor((8, 3), "float16")
    with pytest.raises(TypeError, match="float32.*use triton.matmul"):
        tma_source.matmul_tma(a.float(), b.float())
    with pytest.raises(ValueError, match=r"\(4, 8\).*\(4, 8\)"):
        tma_source.matmul_tma(a, a)
    with pytest.raises(ValueError, match="2-D"):
        tma_source.matmul_tma(a[0], b)
    with pytest.raises(TypeError, match="one dtype"):
        tma_source.matmul_tma(a, b.to(torch.bfloat16))
    with pytest.raises(TypeError, match="torch.Tensor"):
        tma_source.matmul_tma(np.ones((4, 8), np.float16), b)
    with pytest.raises(ValueError, match="BLOCK_K must be a power of two >= 16"):
        tma_source.matmul_tma(a, b, config={"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 8})
    with pytest.raises(ValueError, match="at most 256"):
        tma_source.matmul_tma(a, b, config={"BLOCK_M": 16, "BLOCK_N": 512, "BLOCK_K": 16})
    with pytest.raises(ValueError, match="programs must be at least 1"):
        tma_source.matmul_tma(a, b, programs=0)
    with pytest.raises(MatmulInputError, match="float32"):
        harness.get("triton.matmul_tma")(*make_inputs("4x4x4", "float32"))
    for shape in ("5x4x0", "0x4x3", "3x0x4"):  # empty products: zeros, no launch (a descriptor needs sizes > 0)
        a0, b0 = make_inputs(shape, "bfloat16")
        c = harness.get("triton.matmul_tma")(a0, b0)
        assert c.shape == (a0.shape[0], b0.shape[1]) and not c.any()


def test_tma_configs_fit_hopper_shared_memory(tma_source):
    # Every Hopper config fits an H100/H200's 227 KiB per block; with 170 KiB the pruning keeps
    # those that fit (128 x 128 x 64, 4 stages: 160 KiB), and the smallest when none does.
    assert tma_source.prune_configs(tma_source.HOPPER_CONFIGS, 232448) == tma_source.HOPPER_CONFIGS
    small = tma_source.prune_configs(tma_source.HOPPER_CONFIGS, 170 * 1024)
    assert len(small) == 2 and all(tma_source.shared_memory_bytes(c) == 160 * 1024 for c in small)
    assert len(tma_source.prune_configs(tma_source.HOPPER_CONFIGS, 1024)) == 1
    config = tma_source.HOPPER_CONFIGS[0]  # 128 x 256 x 64, 3 stages, whole C tile staged
    assert tma_source.shared_memory_bytes(config) == (3 * (128 + 256) * 64 + 128 * 256) * 2


# --- the interpreter made strict (triton_kernels.StrictInterpreter) ---------------------------------
def _mutated_matmul(tmp_path, old: str, new: str):
    """triton/matmul.py with one edit, loaded from a file of its own (Triton reads the source)."""
    import importlib.util

    text = harness.env.sources.source_path("triton/matmul.py").read_text()
    path = tmp_path / f"matmul_mutant_{abs(hash(new))}.py"
    path.write_text(replace_code(text, old, new, language="python", count=None))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _strict_matmul(module, shape: str, dtype: str):
    a, b = make_inputs(shape, dtype, seed=2)
    with triton_kernels.StrictInterpreter() as strict:
        c = module.matmul(triton_kernels.to_torch(a, DEVICE), triton_kernels.to_torch(b, DEVICE))
    return check(triton_kernels.to_numpy(c), a, b), strict


STRICT_MUTANTS = {
    # masked-off lanes of B's K tail read as NaN instead of the interpreter's zeros
    "k tail without other": (
        "b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)",
        "b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left)",
        "NaN",
    ),
    # rows past M read past A's storage: an out-of-bounds load, not whatever lies there
    "rows past M not wrapped": (
        "offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M",
        "offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "out-of-bounds load",
    ),
    # FP32 multiplied in TF32, as the tensor cores would: outside the FP32 tolerance
    "fp32 as tf32": (
        '"INPUT_PRECISION": "tf32" if (dtype != torch.float32 or allow_tf32) else "ieee",',
        '"INPUT_PRECISION": "tf32",',
        "wrong",
    ),
}


@pytest.mark.skipif(MODE != "interpreted", reason="the strict interpreter is for interpreted runs")
def test_strict_interpreter_passes_the_intact_kernel(tmp_path):
    for dtype in ("float32", "bfloat16"):
        outcome, strict = _strict_matmul(triton_kernels.load_source("triton/matmul.py"), "33x65x129", dtype)
        assert outcome.passed, outcome.message
        assert strict.precisions and set(strict.precisions) == {"ieee" if dtype == "float32" else "tf32"}


@pytest.mark.skipif(MODE != "interpreted", reason="the strict interpreter is for interpreted runs")
@pytest.mark.parametrize("mutant", list(STRICT_MUTANTS))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the plain run multiplies whatever lies past A
def test_strict_interpreter_catches_what_the_plain_one_lets_through(tmp_path, mutant):
    old, new, how = STRICT_MUTANTS[mutant]
    module = _mutated_matmul(tmp_path, old, new)
    a, b = make_inputs("33x65x129", "float32", seed=2)
    plain = module.matmul(triton_kernels.to_torch(a, DEVICE), triton_kernels.to_torch(b, DEVICE))
    if how != "out-of-bounds load":  # reading past A may land anywhere; the rest pass the plain interpreter
        assert check(triton_kernels.to_numpy(plain), a, b).passed, "the plain interpreter already catches it"
    if how == "out-of-bounds load":
        with pytest.raises(Exception, match="out-of-bounds load"):
            _strict_matmul(module, "33x65x129", "float32")
        return
    outcome, _ = _strict_matmul(module, "33x65x129", "float32")
    assert not outcome.passed
    if how == "NaN":
        assert "NaN" in outcome.message or "nan" in outcome.message.lower()


@pytest.mark.skipif(MODE != "interpreted", reason="the strict interpreter is for interpreted runs")
def test_prepared_records_the_precision_each_launch_requests():
    a, b = make_inputs("17x15x40", "float32")
    prepared = harness.get("triton.matmul").prepare(a, b)
    prepared.run()
    assert prepared.precisions and set(prepared.precisions) == {"ieee"}
    tf32 = harness.get("triton.matmul", allow_tf32=True).prepare(a, b)
    tf32.run()
    assert set(tf32.precisions) == {"tf32"}
    assert not check(tf32.result(), a, b).passed, "FP32 in TF32 should miss the FP32 tolerance"
