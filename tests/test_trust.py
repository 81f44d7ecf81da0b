"""What makes every row trustworthy: inputs that cannot be misread, a check that cannot be fooled
and does not fail right answers, a build that cannot wedge, and honest exit codes and files.

Each case here was a way to get a wrong answer, a wrong verdict or a wedged checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import harness
from harness.backends.c import clib
from harness.model import checking
from harness.model.core import MatmulInputError, ResultError

ROOT = Path(__file__).resolve().parents[1]
C_KERNELS = [impl.name for impl in harness.implementations("c.*") if not impl.weights and "float32" in impl.dtypes]
DECODE_KERNELS = [impl.name for impl in harness.implementations("c.*") if impl.weights]


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


# ---- inputs that cannot be misread ---------------------------------------------------------------
@pytest.mark.parametrize("name", C_KERNELS + ["numpy.matmul", "python.ikj"])
def test_big_endian_inputs_are_converted_not_misread(name):
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    b = np.ones((3, 2), ">f4")
    result = harness.get(name)(a, b)
    np.testing.assert_array_equal(result, np.array([[3, 3], [12, 12]], dtype=np.float32))
    assert result.dtype == np.float32 and result.dtype.isnative


def test_big_endian_through_the_cuda_emulation(monkeypatch):
    monkeypatch.setenv("MATMUL_CUDA_EMULATE", "1")
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    b = np.ones((3, 2), ">f4")
    np.testing.assert_array_equal(harness.get("cuda.tiled")(a, b), [[3, 3], [12, 12]])


def test_masked_arrays_are_refused_by_name():
    a = np.ma.masked_array(np.ones((2, 2), np.float32), mask=[[0, 1], [0, 0]])
    with pytest.raises(MatmulInputError, match="masked array"):
        harness.get("c.packed")(a, np.ones((2, 2), np.float32))


@pytest.mark.parametrize("name", C_KERNELS)
def test_misaligned_buffers_are_copied_before_c_sees_them(name):
    raw = np.arange(2 + 4 * 12, dtype=np.uint8).tobytes()
    a = np.frombuffer(raw, dtype=np.float32, offset=2, count=12).reshape(3, 4)  # 2 bytes off alignment
    assert not a.flags.aligned
    b = np.ones((4, 5), np.float32)
    before = a.copy()
    result = harness.get(name)(a, b)
    assert harness.check(result, a, b).passed
    np.testing.assert_array_equal(a, before)


@pytest.mark.parametrize("name", DECODE_KERNELS)
def test_decode_kernels_get_big_endian_and_misaligned_activations_converted(name):
    weights = harness.quant.quantize(np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64), "q8_0")
    expected = np.arange(64, dtype=np.float32)[None, :] / 64 @ weights.dequantize().T
    big_endian = (np.arange(64, dtype=np.float32) / 64).astype(">f4").reshape(1, 64)
    raw = np.concatenate([np.zeros(2, np.uint8), (np.arange(64, dtype=np.float32) / 64).view(np.uint8)]).tobytes()
    misaligned = np.frombuffer(raw, dtype=np.float32, offset=2, count=64).reshape(1, 64)
    assert not misaligned.flags.aligned
    for x in (big_endian, misaligned):
        before = x.copy()
        result = harness.get(name)(x, weights)
        assert result.dtype == np.float32 and result.dtype.isnative
        assert harness.check(
            result,
            before.astype(np.float32),
            weights.dequantize().T,
            activation_rounding=harness.lookup(name).activation_rounding,
        ).passed
        np.testing.assert_allclose(result, expected, rtol=0.02, atol=0.02)
        np.testing.assert_array_equal(x, before)


def test_a_result_of_the_wrong_dtype_is_a_bug_not_an_answer(monkeypatch):
    impl = harness.model.registry.lookup("numpy.matmul")

    class Wrong(harness.Prepared):
        mode = "native"

        def run(self):
            pass

        def result(self):
            return np.zeros((2, 2), np.float16)

    monkeypatch.setattr(type(impl.backend), "prepare", lambda self, impl, a, b, options: Wrong())
    with pytest.raises(ResultError, match="float16"):
        harness.get("numpy.matmul")(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))


# ---- a check that cannot be fooled -----------------------------------------------------------------
def test_a_float32_problem_answered_in_float16_fails():
    a, b = harness.make_inputs("64x64x64", "float32")
    exact = checking.reference(a, b)
    assert not harness.check(exact.astype(np.float16), a, b).passed
    rounded = exact.astype(np.float16).astype(np.float32)
    assert not harness.check(rounded, a, b).passed


def test_one_large_element_does_not_loosen_every_other_element():
    a, b = harness.make_inputs("64x64x64", "float32")
    a = a.copy()
    a[0, 0] = 1e6
    wrong = np.zeros((64, 64), np.float32)
    wrong[0] = checking.reference(a, b)[0]
    outcome = harness.check(wrong, a, b)
    assert not outcome.passed and "63" in outcome.message or "4032" in outcome.message


def test_an_error_of_3e_5_relative_fails_at_512x512x4096():
    a, b = harness.make_inputs("512x512x4096", "float32")
    exact = checking.reference(a, b)
    off = (exact * (1 + 3e-5)).astype(np.float32)
    assert harness.check(exact.astype(np.float32), a, b).passed
    assert not harness.check(off, a, b).passed


def tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32's 10-bit mantissa (round to nearest on the bits)."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def wrong_kernels(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    exact = checking.reference(a, b)
    one_off = exact.copy()
    one_off[3, 5] += 1e-3 * (1 + abs(exact[3, 5]))
    return {
        "dropped k term": checking.reference(np.delete(a, 7, axis=1), np.delete(b, 7, axis=0)),
        "transposed output": exact.T.copy(),
        "shifted output": np.roll(exact, 1, axis=1),
        "one element off": one_off,
        "rounded through float16": exact.astype(np.float16),
        "TF32 for FP32": checking.reference(tf32(a), tf32(b)),
    }


@pytest.mark.parametrize("k", [64, 512, 4096])
@pytest.mark.parametrize(
    "kind",
    [
        "dropped k term",
        "transposed output",
        "shifted output",
        "one element off",
        "rounded through float16",
        "TF32 for FP32",
    ],
)
def test_the_classic_wrong_kernels_fail(kind, k):
    a, b = harness.make_inputs(f"48x48x{k}", "float32", seed=k)
    result = wrong_kernels(a, b)[kind].astype(np.float32)
    outcome = harness.check(result, a, b)
    assert not outcome.passed, f"{kind} at K = {k} passed: {outcome}"


# ---- and does not fail right results ---------------------------------------------------------------
def sequential_float32(a: np.ndarray, b: np.ndarray, fma: bool = False) -> np.ndarray:
    """The least accurate honest kernel: one float32 running sum per output, k in order."""
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            terms = a[i].astype(np.float64) * b[:, j]
            out[i, j] = np.cumsum(terms if fma else terms.astype(np.float32), dtype=np.float32)[-1]
    return out


@pytest.mark.parametrize("fma", [False, True])
def test_a_sequential_float32_sum_of_2_to_20_non_negative_terms_passes(fma):
    rng = np.random.default_rng(1)
    a = rng.random((2, 2**20), dtype=np.float32)
    b = rng.random((2**20, 2), dtype=np.float32)
    outcome = harness.check(sequential_float32(a, b, fma), a, b)
    assert outcome.passed, outcome


def adversarial(kind: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(len(kind))
    if kind == "large K":
        a, b = rng.standard_normal((3, 65536)), rng.standard_normal((65536, 3))
    elif kind == "non-negative":
        a, b = rng.random((6, 8192)), rng.random((8192, 5))
    elif kind == "mixed magnitudes":
        a = rng.standard_normal((16, 512)) * 10.0 ** rng.integers(-6, 6, (16, 1))
        b = rng.standard_normal((512, 16)) * 10.0 ** rng.integers(-6, 6, (1, 16))
    elif kind == "cancellation":
        a = rng.standard_normal((8, 1024))
        b = np.concatenate([rng.standard_normal((512, 8)), np.zeros((512, 8))])
        a[:, 512:] = -a[:, :512]
        b[512:] = b[:512]
    else:
        raise ValueError(kind)
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["large K", "non-negative", "mixed magnitudes", "cancellation"])
def test_honest_kernels_pass_on_adversarial_data(kind, dtype):
    a, b = adversarial(kind, dtype)
    honest = {"library (blocked)": np.matmul(a, b)}
    if dtype == "float32":
        honest["sequential float32"] = sequential_float32(a, b)
        honest["float64 then rounded"] = checking.reference(a, b).astype(np.float32)
    for label, result in honest.items():
        outcome = harness.check(result, a, b)
        assert outcome.passed, f"{label} on {kind}: {outcome}"


def test_half_precision_inputs_with_float32_accumulation_pass():
    for dtype in ("float16", "bfloat16"):
        a, b = harness.make_inputs("32x32x4096", dtype)
        result = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
        assert harness.check(result, a, b).passed, dtype


def test_an_overflow_the_exact_result_makes_is_correct():
    a = np.full((2, 2), 2e38, np.float32)
    b = np.ones((2, 2), np.float32)
    with np.errstate(over="ignore"):  # the overflow is the point
        result = np.matmul(a, b)  # 4e38 overflows float32: +inf is the right float32 answer
    assert np.isinf(result).all()
    assert harness.check(result, a, b).passed
    assert not harness.check(-result, a, b).passed  # the wrong infinity is still wrong
    finite = np.full((2, 2), 1.0, np.float32)
    assert not harness.check(np.full((2, 2), np.inf, np.float32), finite, finite).passed


def test_near_overflow_values_that_stay_finite_pass():
    a = np.full((3, 4), 1e37, np.float32)
    a[:, 1::2] = -1e37
    b = np.full((4, 3), 3.0, np.float32)
    result = np.matmul(a, b)
    assert harness.check(result, a, b).passed


def test_headroom_figures_are_reported():
    """``worst_ratio`` (error / allowed) is what the README quotes as headroom."""
    a, b = harness.make_inputs("64x64x4096", "float32")
    outcome = harness.check(np.matmul(a, b), a, b)
    assert outcome.passed and 0 < outcome.worst_ratio < 1


# ---- a build that cannot wedge ---------------------------------------------------------------------
@pytest.fixture
def library():
    clib.load()  # built and current
    path = clib.checkout_build_dir() / clib.library_filename()
    yield path
    if clib._is_stale(path, harness.env.sources.sources_root()):
        clib.build_in_checkout()


def test_a_library_truncated_by_a_killed_link_is_rebuilt(library):
    # an empty file newer than every source, put in place as a new file: this process has
    # the library mapped, and writing into that file would crash it
    empty = library.with_name("truncated.tmp")
    empty.write_bytes(b"")
    os.replace(empty, library)
    assert clib._is_stale(library, harness.env.sources.sources_root())
    assert clib.library_path().stat().st_size > 0


def test_a_current_library_takes_no_lock(library, monkeypatch):
    def no_lock(*args):
        raise AssertionError("the build lock was taken for a current library")

    monkeypatch.setattr(clib, "interprocess_lock", no_lock)
    assert clib.library_path() == library
    a = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(harness.get("c.packed")(a, a), np.full((4, 4), 4.0))


def test_the_library_is_called_through_the_compiled_glue_and_dlopen_still_works(library, tmp_path):
    # The build puts cffi's compiled call glue beside the library when this interpreter has
    # its headers; without it, the harness calls the same library through ffi.dlopen.
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("this interpreter has no headers to build the call glue against")
    assert clib.call_mode() == "compiled glue"
    copy = tmp_path / library.name
    shutil.copy(library, copy)  # no glue beside it
    ffi, lib, mode, fast_call = clib._load(str(copy))
    assert mode == "dlopen" and fast_call is None, "the fast call is used only with the glue built beside it"
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    c = np.empty((2, 4), np.float32)
    lib.matmul_naive_ikj_f32(
        ffi.from_buffer("float[]", a), ffi.from_buffer("float[]", b), ffi.from_buffer("float[]", c), 2, 4, 3
    )
    np.testing.assert_array_equal(c, a @ b)


# ---- honest exit codes and files -------------------------------------------------------------------
def test_compare_exits_non_zero_when_nothing_ran():
    if harness.lookup("torch.cublas").unavailable_reason() is None:
        pytest.skip("a GPU is here: the row runs")
    done = run_cli("compare", "--shapes", "64", "--impls", "torch.cublas", "--no-progress")
    assert done.returncode == 1 and "nothing ran" in done.stderr, done.stdout + done.stderr
    assert "not run here" in done.stdout and "torch.cublas" in done.stdout  # and it says why


def test_json_is_strict_when_a_row_fails(tmp_path):
    results = harness.compare(["8"], "numpy.matmul", ["float32"], min_time=0.001)
    results.rows[0].max_abs_error = float("nan")
    results.rows[0].gflops = float("inf")
    text = results.to_json(tmp_path / "r.json").read_text()
    row = json.loads(text)["results"][0]  # json.loads accepts NaN; the file must not contain it
    assert "NaN" not in text and "Infinity" not in text
    assert row["max_abs_error"] is None and row["gflops"] is None


def test_threads_zero_records_the_threads_used():
    results = harness.compare(["64"], ["c.packed", "numpy.matmul"], ["float32"], threads=None, min_time=0.001)
    from harness.env.cores import usable_cores

    assert results.row("c.packed", "64").threads == usable_cores()
    assert results.row("numpy.matmul", "64").threads >= 1


def test_a_shape_too_big_is_refused_before_any_input_is_built():
    done = run_cli("compare", "--shapes", "100000", "--impls", "python.ijk", "c.packed", "--no-progress", timeout=60)
    assert "Traceback" not in done.stderr
    assert "not run here" in done.stdout and "559 GiB" in done.stdout


def test_an_unwritable_output_path_is_refused_before_the_run(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run_cli("compare", "--shapes", "8", "--impls", "numpy.matmul", "--json", str(blocker / "out.json"))
    assert done.returncode == 2 and "cannot write" in done.stderr
    assert "matmul comparison" not in done.stdout


def test_the_tiled_model_has_a_size_cap():
    with pytest.raises(MatmulInputError, match="too long"):
        harness.get("python.tiled_model").prepare(np.ones((2048, 2048), np.float32), np.ones((2048, 2048), np.float32))
    assert os.environ.get("MATMUL_ALLOW_SLOW") is None
