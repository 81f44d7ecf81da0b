"""Each experiment runs end to end at a small size, writes its JSON and plot, and reports
numbers that follow from the definitions; the report gathers them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import harness
from harness.experiments import EXPERIMENTS
from harness.model.inputs import parse_shape
from harness.run import machine
from harness.tooling.report import write_report


def _outputs(directory, name):
    data = json.loads((directory / f"{name}.json").read_text())
    assert (directory / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert data["machine"]["cpu_model"]
    return data


def test_loads_follow_the_one_over_t_law(tmp_path):
    EXPERIMENTS["loads"].run(tmp_path, size=64, tiles=(4, 8, 16, 32))
    data = _outputs(tmp_path, "loads")
    for row in data["tiles"]:
        assert row["elements_loaded"] == 2 * 64**3 // row["tile"]
        assert row["naive_over_tiled"] == row["tile"]
    pair = next(s for s in data["shared_memory"] if s["tile"] == 64 and s["dtype"] == "float32")
    assert pair["bytes"] == 32 * 1024 and pair["fits_default_per_block"]


def test_loop_orders_agree_and_explain(tmp_path):
    EXPERIMENTS["loop-orders"].run(tmp_path, size=24)
    data = _outputs(tmp_path, "loop-orders")
    assert data["python_orders_agree"]
    assert {r["implementation"] for r in data["python"]} == {"python.ijk", "python.ikj", "python.outer"}
    assert {"c.naive_ijk", "c.naive_ikj", "c.blocked"} <= {r["implementation"] for r in data["c"]}
    assert "ijk / ikj" in data["explanation"] and data["ratios"]["c_ijk_over_ikj"] > 0


def test_association_counts_flops(tmp_path):
    EXPERIMENTS["association"].run(tmp_path, size=256)
    data = _outputs(tmp_path, "association")
    assert data["flops"]["(A@B)@C"] == 4 * 256 * 256
    assert data["flops"]["A@(B@C)"] == 2 * 256**3 + 2 * 256 * 256
    assert data["results_agree"] and data["time_ratio"]["cpu"] > 1


def test_tile_quantization_measures_each_m(tmp_path):
    EXPERIMENTS["tile-quantization"].run(tmp_path, size=128, m=(7, 8, 9))
    data = _outputs(tmp_path, "tile-quantization")
    measured = [r for r in data["rows"] if "seconds" in r]
    assert {r["m"] for r in measured} == {7, 8, 9}
    assert {"numpy.matmul", "c.blocked"} <= {r["implementation"] for r in measured}


def test_roofline_points_sit_under_the_roofs(tmp_path):
    EXPERIMENTS["roofline"].run(tmp_path, cpu_gemm="96")
    data = _outputs(tmp_path, "roofline")
    roof = data["roofs"]["cpu"]
    assert roof["bandwidth_gbps"] > 0 and roof["float32"] > 0
    points = [p for p in data["points"] if "gflops" in p]
    assert points and all(p["intensity"] > 0 for p in points)
    gemv = next(p for p in points if p["implementation"] == "numpy.matmul" and p["shape"].startswith("1x"))
    assert gemv["intensity"] < 1  # a GEMV sits on the bandwidth slope


def test_gemv_bandwidth_is_a_fraction_of_the_peak(tmp_path):
    EXPERIMENTS["gemv-bandwidth"].run(tmp_path, cpu_shapes=("1x512x512",))
    data = _outputs(tmp_path, "gemv-bandwidth")
    rows = [r for r in data["rows"] if "gbytes_per_s" in r]
    assert rows and all(r["pct_of_peak"] > 0 for r in rows)


def test_report_gathers_every_result(tmp_path):
    EXPERIMENTS["loads"].run(tmp_path, size=32, tiles=(4, 8))
    EXPERIMENTS["association"].run(tmp_path, size=128)
    report = write_report(tmp_path).read_text()
    assert "![loads](loads.png)" in report and "![association](association.png)" in report
    assert "AMD" in report or "CPU:" in report


def test_report_without_results_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="harness experiments"):
        write_report(tmp_path)


def test_experiment_command_line(tmp_path):
    out = tmp_path / "a-folder-whose-name-is-long-enough-to-wrap-the-line-that-names-it"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "loads", "--size", "32", "--tiles", "4", "8", "--out", str(out)],
        capture_output=True,
        text=True,
        env=os.environ | {"COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    assert (out / "loads.json").is_file()
    lines = done.stdout.splitlines()
    assert lines[0].startswith("== loads: ") and all(len(line) <= 80 for line in lines if " " in line.strip()), lines
    assert str(out / "loads.json") in done.stdout.split()  # a path too long for the line is kept whole
    done = subprocess.run([sys.executable, "-m", "harness", "report", str(out)], capture_output=True, text=True)
    assert done.returncode == 0 and (out / "REPORT.md").is_file()


def test_blas_grid_measures_pairs_and_judges_the_targets(tmp_path, monkeypatch):
    from harness.experiments import blas_grid

    monkeypatch.setattr(blas_grid, "TWO_THREADS_ONLY", {"8"})  # as 4096 is in the default grid
    data = EXPERIMENTS["blas-grid"].run(
        tmp_path, shapes=("8", "1x33x17"), threads=(1, 2), dtypes=("float32",), rounds=3, sample_time=0.001
    )
    # A grid the user names runs every shape at every thread count.
    assert {(r["shape"], r["threads"]) for r in data["rows"]} == {
        (shape, t) for shape in ("8x8x8", "1x33x17") for t in (1, 2)
    }
    for row in data["rows"]:
        lo, hi = row["vs_numpy_range"]
        assert 0 < lo <= row["vs_numpy"] <= hi
        assert row["gflops"]["c.packed"] > 0
    assert (tmp_path / "blas-grid.json").is_file() and (tmp_path / "blas-grid.png").is_file()
    assert all(len(line) <= 80 for line in blas_grid.table(data).splitlines())

    def row(shape, ratio, blis=2.0):
        return {"shape": shape, "dtype": "float32", "threads": 1, "vs_numpy": ratio, "vs_blis": blis}

    verdict = blas_grid.verdict([row("64x64x64", 0.5), row("128x128x128", 1.2), row("256x256x256", 0.8, 0.9)])
    assert verdict["min_vs_numpy"] == 0.8 and verdict["worst_case"] == "256x256x256 float32 1t"
    assert verdict["median_vs_numpy"] == 1.0 and verdict["min_vs_blis"] == 0.9
    assert verdict["small_vs_numpy"] == 0.5  # 64^3 is judged on its own target
    assert verdict["below_min"] == ["256x256x256 float32 1t: 0.80"]


def test_blas_grid_scores_cells_read_from_dram_against_the_roof_beside_them(tmp_path, monkeypatch):
    from harness.experiments import blas_grid

    monkeypatch.setattr(machine, "last_level_cache_bytes", lambda: 1024)  # so that 1x64x64 streams
    monkeypatch.setattr(machine, "read_gbps_now", lambda nbytes, threads: 2.0)
    shape = parse_shape("1x64x64")
    assert blas_grid.streams_from_memory(shape, "float32") and not blas_grid.streams_from_memory(
        parse_shape("8x64x64"), "float32"
    )  # 8 rows do 4 FLOPs a byte: the kernel, not the memory, sets their time
    data = blas_grid.run(
        tmp_path, shapes=("1x64x64",), threads=(1, 2), dtypes=("float32",), rounds=3, sample_time=0.001
    )
    nbytes = blas_grid.read_bytes(shape, "float32")
    for row in data["rows"]:  # on one thread and on two: the median time's share of a roof of 2 GB/s
        for name, seconds in row["seconds"].items():
            assert row["roof_pct"][name] == pytest.approx(100 * nbytes / seconds / 1e9 / 2.0)
    assert "read their operands from DRAM" in blas_grid.summarize(
        data
    ) and "1x64x64 float32 1t: c.packed" in blas_grid.summarize(data)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_experiment_keeps_the_contract(name):
    """Each module satisfies ``Experiment``, and every option its parser defines is a keyword
    its ``run`` takes (the command line passes them all), so none can be added on one side only."""
    import argparse
    import inspect

    from harness.experiments import Experiment

    module = EXPERIMENTS[name]
    assert isinstance(module, Experiment), f"{name} lacks part of the Experiment protocol"
    assert module.NAME == name
    assert all(isinstance(getattr(module, field), str) and getattr(module, field) for field in ("TITLE", "DURATION"))
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    parameters = inspect.signature(module.run).parameters
    assert next(iter(parameters)) == "out_dir"
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for option in vars(parser.parse_args([])):
        assert takes_any or option in parameters, f"{name}: --{option} is not a keyword of run()"


def test_the_contract_check_can_fail():
    import types

    from harness.experiments import Experiment

    incomplete = types.SimpleNamespace(
        NAME="x", TITLE="t", DURATION="d", add_arguments=print, run=print, summarize=print
    )  # no findings()
    assert not isinstance(incomplete, Experiment)


def test_decode_sweeps_bytes_and_batch(tmp_path):
    from harness.experiments import decode

    data = decode.run(
        tmp_path,
        shapes=["1x64x256"],
        batches=[1, 2, 4],
        batch_shape="64x256",
        threads=[1],
        min_time=0.01,
        peer_rounds=2,
    )
    assert data["peer_rounds"] == 2
    assert (tmp_path / "decode.json").is_file() and (tmp_path / "decode.png").is_file()
    rows = [r for r in data["rows"] if r["implementation"] in decode.OURS]
    assert {r.get("weights") for r in rows if r["sweep"] == "bytes"} == set(decode.FORMATS)
    assert all(r["status"] == "ok" for r in rows)
    assert {r["m"] for r in data["rows"] if r["sweep"] == "batch"} == {1, 2, 4}
    # against llama.cpp: ours in every format it compares, at every batch asked
    assert {(r["weights"], r["m"]) for r in rows if r["sweep"] == "peers"} == {
        (fmt, m) for fmt in decode.PEER_FORMATS for m in decode.PEER_BATCHES
    }
    summary = decode.summarize(data)
    assert "memory roof" in summary
    if harness.lookup("llama.cpp.mul_mat").available:
        assert "Against current llama.cpp" in summary and "repack" in summary


def test_decode_says_how_far_the_memory_roof_lets_ours_get_past_llama_cpp():
    from harness.experiments import decode

    def row(impl, median_s, pct, m=1):
        return {
            "implementation": impl,
            "sweep": "peers",
            "shape": f"{m}x4096x4096",
            "m": m,
            "threads": 2,
            "threads_asked": 2,
            "weights": "q4_0",
            "status": "ok",
            "median_s": median_s,
            "memory_pct": pct,
            "memory_roof_gbps": 50.0,
            "memory_roof": "beside",
        }

    rows = [
        row("c.decode_int8", 2.0e-4, 45.0),  # 0.95x llama.cpp, which reads at 47.5% of the roof
        row("llama.cpp.mul_mat", 1.9e-4, 47.5),
        row("c.decode_int8", 2.0e-4, 50.0, m=4),  # 2x: not short of 1.2x
        row("llama.cpp.mul_mat", 4.0e-4, 25.0, m=4),
    ]
    data = {"rows": rows, "memory_roof_gbps": {"2": 80.0}, "formats": [], "peer_formats": ["q4_0"]}
    table = decode.peer_table(data)
    first = next(line for line in table if line.startswith("| 1x4096x4096"))
    assert "| 0.95x | 2.11x |" in first  # ours vs llama.cpp, then the ceiling: 100 / 47.5
    assert "measured beside the rows" in " ".join(table)
    (short,) = [line for line in decode.findings(data) if line.startswith("under 1.2x")]
    assert "q4_0 1x4096x4096 2T 0.95x (ceiling 2.11x)" in short and "4x4096x4096" not in short
    assert "read roof measured beside the rows, 2 thread(s): 50.0 GB/s" in decode.summarize(data)


def test_prefill_times_each_batch_per_token_beside_llama_cpp(tmp_path, monkeypatch):
    from harness.experiments import prefill

    rounds_asked = []
    real_compare = prefill.compare

    def compare_in_rounds(*args, **kwargs):
        rounds_asked.append(kwargs.get("rounds"))
        return real_compare(*args, **kwargs)

    monkeypatch.setattr(prefill, "compare", compare_in_rounds)
    data = prefill.run(
        tmp_path,
        shape="64x256",
        batches=[1, 128],
        formats=["q8_0", "q4_K", "float32"],
        threads=[1],
        min_time=0.01,
        rounds=2,
    )
    assert (tmp_path / "prefill.json").is_file() and (tmp_path / "prefill.png").is_file()
    ours = [r for r in data["rows"] if r["implementation"] in prefill.OURS and r["status"] != "skipped"]
    assert {(r["weights"], r["m"]) for r in ours} == {(f, m) for f in ("q8_0", "q4_K", "float32") for m in (1, 128)}
    assert all(r["status"] == "ok" for r in ours), [r["status"] for r in ours]
    # the int8 kernels are scored against the int8 roof, the float32 product against the FMA roof
    if data["int8_roof_gops_per_core"]:
        assert {r.get("peak_of") for r in ours if r["implementation"] == "c.decode_int8"} == {"int8"}
    assert {r.get("peak_of") for r in ours if r["implementation"] == "c.packed"} <= {"float32", None}
    summary = prefill.summarize(data)
    assert "| 128 | 1 | q8_0 |" in summary and "time per token" in summary
    assert "median of 2 rounds" in summary and rounds_asked == [2]
    lines = prefill.findings(data)
    assert lines and all(line.strip() for line in lines)
    if harness.lookup("llama.cpp.mul_mat").available:
        assert any("llama.cpp" in line for line in lines)
