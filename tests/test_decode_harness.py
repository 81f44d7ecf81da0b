"""The harness's side of decode: problems whose weights are quantized once, outside the timed
region, checked against the float64 product of the weights the format holds, and reported in
bytes actually read against the memory roof of the threads used."""

from __future__ import annotations

import json

import numpy as np
import pytest

import harness
from harness.cli import main
from harness.model import quant, registry
from harness.model.core import MatmulInputError


class _DequantizingBackend(harness.Backend):
    """A user's decode kernel: dequantize W, then X @ W^T in float32 (what a weight-only kernel
    computes), or a deliberately wrong variant."""

    def __init__(self, wrong: bool = False):
        self.wrong = wrong
        self.prepared = 0

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        backend = self
        backend.prepared += 1
        assert isinstance(b, quant.QuantizedWeights) and a.dtype == np.float32

        class Prepared(harness.Prepared):
            def run(self):
                w = b.dequantize()
                if backend.wrong:  # a scale read from the wrong block: the first block of each row
                    w = w.copy()
                    w[:, 32:64] = w[:, :32]
                self.y = a @ w.T

            def result(self):
                return self.y

        return Prepared()


@pytest.fixture
def decode_kernels(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    import sys

    monkeypatch.setattr(sys.modules["harness.run.compare"], "REGISTRY", registry.REGISTRY)
    for name, wrong in (("mine.decode", False), ("mine.wrong_decode", True)):
        harness.register(
            harness.Implementation(
                name=name,
                language="python",
                device="cpu",
                dtypes=("float32",),
                weights=("q4_0", "q8_0"),
                summary="a test's decode kernel",
                backend=_DequantizingBackend(wrong),
            )
        )
    return registry.REGISTRY


def test_a_decode_problem_is_checked_against_the_weights_the_format_holds(decode_kernels):
    results = harness.compare(["1x64x128", "3x33x96"], ["mine.*"], weights=["q4_0", "q8_0"], min_time=0.01)
    for shape in ("1x64x128", "3x33x96"):
        for fmt in ("q4_0", "q8_0"):
            assert results.row("mine.decode", shape, weights=fmt).passed
            wrong = results.row("mine.wrong_decode", shape, weights=fmt)
            assert wrong.status.startswith("FAILED") and wrong.median_s is None  # never timed
        # the float32 product is added, so every row has a "vs base": NumPy's float32 GEMV
        base = results.row("numpy.matmul", shape, weights="float32")
        assert base.passed and base.speedup == pytest.approx(1.0)
        assert results.row("mine.decode", shape, weights="q4_0").speedup is not None


def test_decode_rows_count_the_bytes_actually_read(decode_kernels):
    results = harness.compare(["2x64x128"], ["mine.decode"], weights=["q4_0", "q8_0"], min_time=0.01, baselines=False)
    for fmt, bytes_per_block in (("q4_0", 18), ("q8_0", 34)):
        row = results.row("mine.decode", "2x64x128", weights=fmt)
        weights = 64 * 128 // 32 * bytes_per_block
        activations_and_output = (2 * 128 + 2 * 64) * 4
        assert row.gbytes_per_s == pytest.approx((weights + activations_and_output) / row.median_s / 1e9)
        if harness.run.machine.memory_roof_gbps(1):
            assert row.memory_pct == pytest.approx(100 * row.gbytes_per_s / harness.run.machine.memory_roof_gbps(1))
    assert "% mem" in str(results) and "GB/s" in results.render(200)  # GB/s where there is room


def test_quantizing_is_outside_the_timed_region_and_done_once_per_problem(decode_kernels, monkeypatch):
    calls = []
    real = quant.quantize
    monkeypatch.setattr(quant, "quantize", lambda w, fmt: calls.append(fmt) or real(w, fmt))
    harness.compare(["1x64x64"], ["mine.*"], weights=["q8_0"], min_time=0.01, baselines=False)
    assert calls == ["q8_0"]  # one problem, two rows, each prepared (and timed) on the same bytes


def test_a_k_the_block_does_not_divide_is_refused_by_name(decode_kernels):
    results = harness.compare(["1x64x100"], ["mine.decode"], weights=["q4_0"], baselines=False)
    row = results.row("mine.decode", "1x64x100", weights="q4_0")
    assert row.status.startswith("skipped") and "multiple of the block" in row.status


def test_decode_and_plain_kernels_stay_apart(decode_kernels):
    x = np.ones((1, 64), np.float32)
    w = quant.quantize(np.ones((8, 64), np.float32), "q4_0")
    with pytest.raises(MatmulInputError, match="takes a float B"):
        harness.get("numpy.matmul").prepare(x, w)
    with pytest.raises(MatmulInputError, match="takes quantized weights"):
        harness.get("mine.decode").prepare(x, np.ones((64, 8), np.float32))
    with pytest.raises(MatmulInputError, match="does not take bf16"):
        harness.get("mine.decode").prepare(x, quant.quantize(np.ones((8, 64), np.float32), "bf16"))
    with pytest.raises(MatmulInputError, match="inner dimensions"):
        harness.get("mine.decode").prepare(np.ones((1, 32), np.float32), w)
    # a plain comparison that names a decode kernel says why it has no row
    results = harness.compare([64], ["mine.decode"], baselines=False)
    assert "takes quantized weights" in results.rows[0].status


def test_unknown_weight_formats_are_refused(decode_kernels):
    with pytest.raises(MatmulInputError, match="q3_k"):
        harness.compare(["1x64x64"], ["mine.decode"], weights=["q3_k"])


def test_the_command_line_compares_formats_and_writes_them(decode_kernels, tmp_path, capsys):
    out = tmp_path / "decode.json"
    csv_path = tmp_path / "decode.csv"
    code = main(
        [
            "compare",
            "--shapes",
            "1x64x128",
            "--impls",
            "mine.decode",
            "--weights",
            "q4_0",
            "q8_0",
            "--min-time",
            "0.01",
            "--json",
            str(out),
            "--csv",
            str(csv_path),
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "q4_0" in printed and "q8_0" in printed and "% mem" in printed
    rows = json.loads(out.read_text())["results"]
    assert {row["weights"] for row in rows} == {"q4_0", "q8_0", "float32"}
    assert all("memory_pct" in row for row in rows)
    assert "weights" in csv_path.read_text().splitlines()[0]
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--shapes", "1x64x128", "--weights", "q5_1"])
    assert exit_info.value.code == 2


def test_the_memory_roof_is_measured_for_the_threads_a_row_uses():
    one = harness.run.machine.memory_roof_gbps(1)
    if one is None:
        pytest.skip("no measured memory roof here (the C library's roof functions are missing)")
    from harness.env.cores import usable_cores

    if usable_cores() < 2:
        pytest.skip("one core: no multi-thread roof to measure")
    two = harness.run.machine.memory_roof_gbps(2)
    # two cores read at least about as fast as one (a busy machine can make them no faster)
    assert two is not None and two > 0.5 * one


def test_torchs_int4_kernel_gets_the_q4_0_weights_exactly():
    if not harness.lookup("torch.int4").available:
        pytest.skip(harness.lookup("torch.int4").unavailable_reason())
    shapes = ["1x16x32", "3x32x96", "17x48x4128", "5x33x64"]
    results = harness.compare(shapes, ["torch.int4"], weights=["q4_0"], min_time=0.01, baselines=False, threads=1)
    for shape in shapes[:3]:
        assert results.row("torch.int4", shape, weights="q4_0").passed, shape
    refused = results.row("torch.int4", "5x33x64", weights="q4_0")
    assert refused.status.startswith("skipped") and "multiple of 16" in refused.status


def test_q4_k_reaches_torchs_int4_kernel_as_scales_and_zero_points():
    rng = np.random.default_rng(3)
    w = quant.quantize(rng.standard_normal((16, 512)).astype(np.float32), "q4_K")
    q, scales, zeros = quant.int4_group_operands(w)
    assert q.dtype == np.uint8 and q.max() <= 15 and scales.shape == zeros.shape == (16, 16)
    rebuilt = (q.astype(np.float64) - 8) * np.repeat(scales, 32, axis=1) + np.repeat(zeros, 32, axis=1)
    np.testing.assert_allclose(rebuilt, w.dequantize(), rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(zeros).max())
    with pytest.raises(MatmulInputError, match="q4_0 or q4_K"):
        quant.int4_group_operands(quant.quantize(np.ones((16, 64), np.float32), "q8_0"))
    if not harness.lookup("torch.int4").available:
        pytest.skip(harness.lookup("torch.int4").unavailable_reason())
    shapes = ["1x16x256", "3x32x512", "17x48x4352"]
    results = harness.compare(shapes, ["torch.int4"], weights=["q4_K"], min_time=0.01, baselines=False, threads=2)
    for shape in shapes:
        assert results.row("torch.int4", shape, weights="q4_K").passed, shape


def test_the_int8_roof_is_measured_within_what_the_core_allows():
    from harness.run import machine

    if not {"avx2"} & set(machine.simd_flags()):
        pytest.skip("no int8 SIMD instruction the roof measures on this CPU")
    roof = machine.measured_int8_roof()
    assert roof is not None and 0 < roof["median"] <= roof["best"]
    # at least the FMA roof's float32 rate: a byte product is never slower than a float one
    fma = machine.measured_fma_roofs()
    assert fma is None or roof["best"] >= 0.5 * fma["float32"]["best"]
    # and at most what the core allows: roof_bound's clock x SIMD bytes x 2 x FMA units (its
    # formula is tested with a fixed clock in test_caches_heal.py), which is 4x the float32 FMA
    # rate on the same pipes. Measured against the FMA loop run beside it, not against a clock
    # measured at another moment: a busy machine measures its clock low (2.8 GHz for 3.8 in one
    # run of the full tier here), and the bound with it.
    from harness.backends.c import clib

    ffi, lib = clib.load()
    int8_now = fma_now = 0.0
    for _ in range(2):  # interleaved, each the best of its trials
        fma_now = max(fma_now, lib.matmul_measure_fma_gflops(4, 15, ffi.NULL))
        int8_now = max(int8_now, lib.matmul_measure_int8_gops(15, ffi.NULL))
    assert 0 < int8_now <= machine.BOUND_MARGIN * 4 * fma_now
