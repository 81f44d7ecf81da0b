"""Current llama.cpp as the decode rows' peer (harness/backends/llama_cpp.py); the Q8_K
activation model its k-quant path is checked with; and the DRAM rotation every CPU decode row
is timed with (harness/run/compare.py).

The model's and the rotation's tests run everywhere. Those of llama.cpp itself need its
optional build (``python -m harness build-llama-cpp``; CI makes it) and are skipped, saying
so, where it is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import harness
from harness.backends import llama_cpp
from harness.model.checking import check
from harness.model.core import Backend, Implementation, Prepared
from harness.model.inputs import make_inputs
from harness.model.quant import FORMATS, quantize
from harness.model.registry import REGISTRY
from harness.run import compare as compare_module
from harness.run import machine

PEERS = ("llama.cpp.mul_mat", "llama.cpp.mul_mat_plain")
REASON = harness.lookup(PEERS[0]).unavailable_reason()
needs_llama_cpp = pytest.mark.skipif(REASON is not None, reason=f"llama.cpp unavailable: {REASON}")
FORMATS_TAKEN = llama_cpp.WEIGHTS
# K: one block (one Q4_K super-block), a few; N: one row, not a multiple of 8 (no repack), a
# multiple of 8 (repack); M: one row (gemv, vec_dot), two to four (tinyBLAS, gemm), past 16.
EDGE_SHAPES = [f"{m}x{n}x{k}" for k in (256, 768) for n in (1, 12, 24) for m in (1, 2, 4, 17)]


# ---- the Q8_K activation model (no llama.cpp needed) -------------------------------------------


def q8_k_activations(x: np.ndarray, levels: float = -127.0) -> np.ndarray:
    """X as ggml rounds it for its k-quant dot products: per block of 256, iscale = -127 / max
    (max the value of largest magnitude), q = round(iscale * x) to nearest even, x~ = q / iscale
    in float32. Other ``levels`` make a coarser (wrong) rounding."""
    m, k = x.shape
    blocks = x.reshape(m, k // 256, 256).astype(np.float32)
    index = np.abs(blocks).argmax(axis=-1)[..., None]
    signed_max = np.take_along_axis(blocks, index, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(signed_max != 0, np.float32(levels) / signed_max, 0).astype(np.float32)
        d = np.where(iscale != 0, np.float32(1) / iscale, 0).astype(np.float32)
    return (np.rint(blocks * iscale) * d).reshape(m, k)


def test_a_kernel_that_rounds_x_to_q8_k_passes_and_a_coarser_one_fails():
    rng = np.random.default_rng(3)
    x = (rng.uniform(-1, 1, (5, 1024)) * np.repeat(10.0 ** rng.uniform(-3, 2, (5, 4)), 256, axis=1)).astype(np.float32)
    w = rng.uniform(-1, 1, (37, 1024)).astype(np.float32)
    exact = lambda xs: (xs.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)  # noqa: E731
    assert check(exact(q8_k_activations(x)), x, w.T, activation_rounding="q8_K").passed
    coarse = check(exact(q8_k_activations(x, levels=-15.0)), x, w.T, activation_rounding="q8_K")
    assert not coarse.passed
    # The plain float32 model is far too tight for it: the declaration is what lets it pass.
    assert not check(exact(q8_k_activations(x)), x, w.T).passed


def test_q8_k_needs_whole_blocks_of_256():
    x = np.ones((1, 288), np.float32)
    with pytest.raises(ValueError, match="multiple of 256"):
        check(x @ np.ones((288, 2), np.float32), x, np.ones((288, 2), np.float32), activation_rounding="q8_K")


# ---- the DRAM rotation (no llama.cpp needed) ---------------------------------------------------


def test_the_rotation_fills_the_arena_and_refuses_tiny_weights(monkeypatch):
    monkeypatch.setattr(compare_module, "weight_arena_bytes", lambda: 100 * 2**20)
    assert compare_module.weight_rotation(10 * 2**20) == (10, "dram")
    assert compare_module.weight_rotation(300 * 2**20) == (1, "dram")  # W alone fills it
    assert compare_module.weight_rotation(2**20) == (1, "cache")  # 100 copies: too small to matter


def test_the_arena_is_at_least_four_last_level_caches():
    assert compare_module.weight_arena_bytes() >= 4 * machine.last_level_cache_bytes()
    assert machine.last_level_cache_bytes() > 0


class _Recording(Backend):
    """A decode kernel that notes which copy of W each call multiplied (by its buffer address)."""

    seen: list = []

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        seen = self.seen

        class Run(Prepared):
            def run(self):
                seen.append(b.data.ctypes.data)

            def result(self):
                return (a.astype(np.float64) @ b.dequantize().T.astype(np.float64)).astype(np.float32)

        return Run()


@pytest.fixture
def recording_kernel():
    impl = Implementation(
        name="test.recording_decode",
        language="python",
        device="cpu",
        dtypes=("float32",),
        weights=("q8_0",),
        summary="notes the W of each call",
        backend=_Recording(),
    )
    REGISTRY[impl.name] = impl
    _Recording.seen = []
    yield impl
    del REGISTRY[impl.name]


def test_each_timed_call_reads_the_next_copy_of_w(monkeypatch, recording_kernel):
    w_bytes = 64 * (256 // 32) * 34  # 64 x 256 in q8_0
    monkeypatch.setattr(compare_module, "weight_arena_bytes", lambda: 6 * w_bytes)
    results = harness.compare(["1x64x256"], [recording_kernel.name], weights=["q8_0"], baselines=False, min_time=0.01)
    (row,) = results.rows
    assert row.passed and (row.weights_from, row.weight_copies) == ("dram", 6)
    timed = _Recording.seen[1:]  # the first call is the check
    assert len(set(timed)) == 6, "the timed calls did not rotate through six copies of W"
    assert all(timed[i] != timed[i + 1] for i in range(len(timed) - 1))
    assert results.settings["weights_from"] == "dram"
    assert "read W from DRAM" in str(results)


def test_dram_rows_are_scored_against_the_read_roof_measured_beside_them(monkeypatch, recording_kernel):
    w_bytes = 64 * (256 // 32) * 34
    monkeypatch.setattr(compare_module, "weight_arena_bytes", lambda: 6 * w_bytes)
    measured = iter([30.0, 10.0, 20.0])  # one per round: the median, 20, is the roof
    asked = []
    monkeypatch.setattr(
        machine, "read_gbps_now", lambda nbytes, threads: asked.append((nbytes, threads)) or next(measured)
    )
    results = harness.compare(
        ["1x64x256"], [recording_kernel.name], weights=["q8_0"], baselines=False, min_time=0.01, rounds=3
    )
    (row,) = results.rows
    assert asked == [(6 * w_bytes, 1)] * 3  # after each round, over the arena the row rotated through
    assert (row.memory_roof, row.memory_roof_gbps) == ("beside", 20.0)
    assert row.memory_pct == pytest.approx(100 * row.gbytes_per_s / 20.0)
    assert "against the read roof measured beside the rows" in " ".join(str(results).split())


def test_a_roof_that_cannot_be_measured_beside_leaves_the_kept_one(monkeypatch, recording_kernel):
    w_bytes = 64 * (256 // 32) * 34
    monkeypatch.setattr(compare_module, "weight_arena_bytes", lambda: 6 * w_bytes)
    monkeypatch.setattr(machine, "read_gbps_now", lambda nbytes, threads: None)
    monkeypatch.setattr(machine, "memory_roof_gbps", lambda threads=1: 50.0)
    (row,) = harness.compare(["1x64x256"], [recording_kernel.name], weights=["q8_0"], baselines=False, min_time=0.01)
    assert (row.memory_roof, row.memory_roof_gbps) == ("best kept", 50.0)
    assert row.memory_pct == pytest.approx(100 * row.gbytes_per_s / 50.0)


def test_rows_from_cache_are_not_given_a_dram_roof(monkeypatch, recording_kernel):
    monkeypatch.setattr(machine, "read_gbps_now", lambda nbytes, threads: pytest.fail("measured a roof for cache rows"))
    harness.compare(
        ["1x64x256"], [recording_kernel.name], weights=["q8_0"], baselines=False, min_time=0.01, weights_from="cache"
    )


def test_the_read_roof_is_measured_now_over_the_bytes_asked():
    gbps = machine.read_gbps_now(64 * 2**20, 1)
    if gbps is None:
        pytest.skip("the C library's read roof is not available here")
    assert 0 < gbps < 10_000


def test_cache_mode_repeats_one_w_and_says_so(recording_kernel):
    results = harness.compare(
        ["1x64x256"], [recording_kernel.name], weights=["q8_0"], baselines=False, min_time=0.01, weights_from="cache"
    )
    (row,) = results.rows
    assert (row.weights_from, row.weight_copies) == ("cache", 1)
    assert len(set(_Recording.seen)) == 1
    assert "weights_from='cache'" in " ".join(str(results).split())


def test_weights_from_must_be_known():
    with pytest.raises(ValueError, match="weights_from must be one of dram, cache"):
        harness.compare(["1x64x256"], ["c.decode"], weights=["q8_0"], weights_from="l3")


# ---- llama.cpp itself ---------------------------------------------------------------------------


def test_without_a_build_the_rows_say_how_to_make_one(tmp_path):
    code = (
        "import harness; print(harness.lookup('llama.cpp.mul_mat').unavailable_reason());"
        "r = harness.compare(['1x8x256'], ['llama.cpp.*'], weights=['q4_0'], baselines=False);"
        "print({row.status.split(':')[0] for row in r.rows})"
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "python -m harness build-llama-cpp" in out
    assert "{'unavailable'}" in out


@needs_llama_cpp
@pytest.mark.parametrize("fmt", FORMATS_TAKEN)
def test_every_edge_shape_passes_in_both_placements(fmt):
    results = harness.compare(EDGE_SHAPES, list(PEERS), weights=[fmt], baselines=False, min_time=0.001)
    bad = [(r.implementation, r.shape, r.status) for r in results.rows if not r.passed]
    assert not bad


@needs_llama_cpp
def test_the_row_names_the_kernel_path_that_ran():
    shapes = ["1x16x256", "4x16x256", "4x12x256"]
    results = harness.compare(shapes, list(PEERS), weights=["q4_0", "q8_0"], baselines=False, min_time=0.001)
    path = {(r.implementation, r.shape, r.weights): r.path for r in results.rows}
    avx2 = "avx2" in machine.simd_flags()
    if avx2:  # ggml repacks q4_0 for AVX2 only where N is a multiple of 8
        assert path["llama.cpp.mul_mat", "1x16x256", "q4_0"] == "q4_0_8x8 repack"
        assert path["llama.cpp.mul_mat", "4x16x256", "q4_0"] == "q4_0_8x8 repack"
    assert "repack" not in path["llama.cpp.mul_mat", "4x12x256", "q4_0"]
    assert all("repack" not in path["llama.cpp.mul_mat_plain", shape, fmt] for shape in shapes for fmt in ("q4_0",))
    assert path["llama.cpp.mul_mat", "1x16x256", "q8_0"].startswith("vec_dot")  # x86 does not repack q8_0
    if avx2:
        assert path["llama.cpp.mul_mat", "4x16x256", "q8_0"].startswith("tinyBLAS")
    assert "q4_0_8x8 repack" in " ".join(str(results).split()) or not avx2
    if "q4_K" in FORMATS_TAKEN and avx2:  # Q4_K repacks too (Q8_K activations)
        q4k = harness.compare(["4x16x256"], [PEERS[0]], weights=["q4_K"], baselines=False, min_time=0.001)
        assert q4k.rows[0].path == "q4_K_8x8 repack"


@needs_llama_cpp
def test_the_version_is_named_in_the_json(tmp_path):
    results = harness.compare(["1x16x256"], [PEERS[0]], weights=["q4_0"], baselines=False, min_time=0.001)
    data = json.loads(open(results.to_json(tmp_path / "r.json")).read())
    described = data["machine"]["implementations"][PEERS[0]]
    assert "llama.cpp" in described and "ggml" in described
    assert llama_cpp.build_info()["llama_cpp_commit"][:7] in described
    assert data["results"][0]["path"] == "q4_0_8x8 repack" or "avx2" not in machine.simd_flags()


@needs_llama_cpp
@pytest.mark.parametrize("fmt", [f for f in ("q4_0", "q8_0", "q4_K") if f in FORMATS])
def test_llama_cpp_reads_the_bytes_as_quant_py_does(fmt):
    """llama.cpp's quantizer gives quant.py's bytes (the reference of quant.py's q4_K tests)."""
    _, b = make_inputs("1x64x512", "float32", 4)
    w = np.ascontiguousarray(b.T)
    assert np.array_equal(llama_cpp.quantize_reference(w, fmt), quantize(w, fmt).data)


@needs_llama_cpp
def test_bad_inputs_are_refused_by_name():
    impl = harness.lookup(PEERS[0])
    x, b = make_inputs("2x16x256", "float32", 0)
    w = quantize(np.ascontiguousarray(b.T), "q4_0")
    with pytest.raises(harness.MatmulInputError, match="takes float32 activations X"):
        impl.backend.prepare(impl, x.astype(np.float64), w, impl.options)
    with pytest.raises(harness.MatmulInputError, match="QuantizedWeights"):
        impl.backend.prepare(impl, x, b, impl.options)
