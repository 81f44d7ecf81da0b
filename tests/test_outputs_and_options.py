"""Where outputs go (devices, FIFOs, symlinks), which options a command takes, what a refusal
estimates, what ``harness.check`` takes, and which BLAS the baseline ran."""

from __future__ import annotations

import json
import math
import os
import platform
import stat
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest

import harness
from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
# one cheap row: checked and timed in milliseconds, no baseline or peers
CHEAP = ["compare", "--shapes", "8", "--impls", "c.naive_ikj", "--no-baseline", "--min-time", "0.01", "--no-progress"]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``main`` in this process: its exit code (a usage error's too), stdout and stderr."""
    try:
        code = main(list(args))
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


# ---- outputs that are not regular files ---------------------------------------------------------
def device_number(path: str) -> tuple[bool, int]:
    info = os.stat(path)
    return stat.S_ISCHR(info.st_mode), info.st_rdev


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null here")
def test_json_and_csv_to_dev_null_are_written_into_it_and_it_stays_the_device(capsys):
    before = device_number("/dev/null")
    code, out, err = cli(capsys, *CHEAP, "--json", "/dev/null", "--csv", "/dev/null")
    assert code == 0, err
    assert "wrote /dev/null" in out
    assert device_number("/dev/null") == before and before[0]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_json_to_dev_full_is_an_error_that_says_the_device_is_full(capsys):
    before = device_number("/dev/full")
    code, out, err = cli(capsys, *CHEAP, "--json", "/dev/full")
    assert code == 1
    assert "cannot write /dev/full: No space left on device" in err and "Traceback" not in err
    assert "wrote /dev/full" not in out
    assert device_number("/dev/full") == before and before[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_gets_the_json_and_stays_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    try:
        code, out, err = cli(capsys, *CHEAP, "--json", str(fifo))
    finally:
        if reader.is_alive() and not received:  # nothing opened it for writing: let the reader go
            with suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=30)
    assert code == 0, err
    assert json.loads(received[0])["results"][0]["implementation"] == "c.naive_ikj"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [path.name for path in tmp_path.iterdir()] == ["results.json"]  # no temporary file beside it


def test_a_dangling_symlink_into_a_missing_folder_is_refused_and_no_folder_is_made(tmp_path, capsys):
    missing = tmp_path / "missing" / "deeper"
    link = tmp_path / "results.json"
    link.symlink_to(missing / "results.json")
    code, out, err = cli(capsys, *CHEAP, "--json", str(link))
    assert code == 2 and f"cannot write {link}" in err and str(missing) in err
    assert "matmul" not in out  # refused before anything was measured
    assert not (tmp_path / "missing").exists()
    results = harness.compare([8], ["c.naive_ikj"], baselines=False, min_time=0.01)
    with pytest.raises(FileNotFoundError, match="symlink") as caught:
        results.to_json(link)
    assert caught.value.filename == str(link) and not (tmp_path / "missing").exists()


def test_a_dangling_symlink_into_a_folder_that_exists_is_written_through(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "results.json"
    link.symlink_to(tmp_path / "elsewhere" / "results.json")
    code, out, err = cli(capsys, *CHEAP, "--json", str(link))
    assert code == 0, err
    assert link.is_symlink() and json.loads((tmp_path / "elsewhere" / "results.json").read_text())["results"]


# ---- --plot formats -------------------------------------------------------------------------------
def test_an_unsupported_plot_suffix_is_a_usage_error_before_anything_is_measured(tmp_path, capsys):
    code, out, err = cli(capsys, *CHEAP, "--plot", str(tmp_path / "x.txt"), "--json", str(tmp_path / "r.json"))
    assert code == 2 and "--plot" in err and ".txt" in err and ".png" in err and ".svg" in err
    assert "Traceback" not in err and "matmul" not in out
    assert list(tmp_path.iterdir()) == []  # neither the JSON nor the plot


def test_a_plot_in_another_supported_format_is_drawn(tmp_path, capsys):
    code, out, err = cli(capsys, *CHEAP, "--plot", str(tmp_path / "r.svg"))
    assert code == 0, err
    assert "<svg" in (tmp_path / "r.svg").read_text()


def test_results_plot_refuses_an_unsupported_suffix_and_writes_nothing(tmp_path):
    results = harness.compare([8], ["c.naive_ikj"], baselines=False, min_time=0.01)
    with pytest.raises(ValueError, match=r"\.txt.*\.png"):
        results.plot(tmp_path / "x.txt")
    assert list(tmp_path.iterdir()) == []


# ---- every number of every command is checked before anything runs --------------------------------
BAD_OPTIONS = [
    *(("compare", "--min-time", value) for value in ("-1", "nan", "0", "inf", "-inf", "soon")),
    ("blas-grid", "--sample-time", "-1"),
    ("blas-grid", "--sample-time", "nan"),
    ("blas-grid", "--rounds", "0"),
    ("blas-grid", "--shapes", "0"),
    ("blas-grid", "--shapes", "0x0x0"),
    ("blas-grid", "--shapes", "64x0x64"),
    ("blas-grid", "--threads", "0"),
    ("decode", "--batches", "0"),
    ("decode", "--batches", "-2"),
    ("decode", "--min-time", "0"),
    ("decode", "--batch-shape", "0x4096"),
    ("decode", "--batch-shape", "4096"),
    ("decode", "--shapes", "1x0x4096"),
    ("decode", "--shapes", "4x4096x4096"),
    ("decode", "--threads", "0"),
    ("tile-sweep", "--shape", "1x0x3"),
    ("tile-sweep", "--tiles", "0"),
    ("tile-sweep", "--min-time", "inf"),
    ("tile-sweep", "--threads", "0"),
    ("loads", "--size", "0"),
    ("loads", "--tiles", "-4"),
    ("loop-orders", "--size", "0"),
    ("tile-quantization", "--size", "0"),
    ("tile-quantization", "--m", "0"),
    ("association", "--size", "-1"),
    ("association", "--threads", "0"),
    ("roofline", "--cpu-gemm", "0"),
    ("gemv-bandwidth", "--cpu-shapes", "1x0x8"),
    ("comparison", "--shapes", "0"),
    ("comparison", "--threads", "-1"),
]


@pytest.mark.parametrize(("command", "option", "value"), BAD_OPTIONS)
def test_a_bad_number_is_a_usage_error_naming_its_option(tmp_path, capsys, command, option, value):
    out_option = [] if command == "compare" else ["--out", str(tmp_path / "out")]
    code, out, err = cli(capsys, command, f"{option}={value}", *out_option)
    assert code == 2, (out, err)
    assert option in err and "Traceback" not in err
    assert "==" not in out and "matmul" not in out  # nothing started


def test_compare_still_takes_a_zero_dimension(capsys):
    code, out, err = cli(capsys, *CHEAP[:2], "0", "1x0x3", *CHEAP[3:])
    assert code != 2, err  # not a usage error: such rows are checked, and have nothing to time


@pytest.mark.parametrize("min_time", [-1, 0, 0.0, math.nan, math.inf, True, "0.1", None])
def test_compare_refuses_a_min_time_that_is_not_a_finite_positive_number(min_time):
    with pytest.raises(ValueError, match="min_time"):
        harness.compare([8], ["c.naive_ikj"], baselines=False, min_time=min_time)


def test_compare_takes_a_small_positive_min_time():
    results = harness.compare([8], ["c.naive_ikj"], baselines=False, min_time=np.float64(0.001))
    assert results.rows[0].passed and results.settings["min_time_s"] == 0.001


# ---- refusals estimate from measured rates ---------------------------------------------------------
def _measured_seconds(name: str, a, b) -> float:
    from harness.model.core import Matmul

    prepared = Matmul(harness.lookup(name), allow_slow=True).prepare(a, b)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        prepared.run()
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "shape", "weights"),
    [
        ("python.ijk", "96", None),
        ("python.ikj", "96", None),
        ("python.outer", "96", None),
        ("python.tiled_model", "256", None),
        ("python.decode", "1x256x1024", "q8_0"),
    ],
)
def test_a_stand_ins_time_estimate_is_within_a_factor_of_5_of_its_time(name, shape, weights):
    impl = harness.lookup(name)
    parsed = harness.parse_shape(shape)
    a, b = harness.make_inputs(parsed, "float32")
    if weights:
        b = harness.quant.quantize(np.ascontiguousarray(b.T), weights)
    estimate = parsed.flops / impl.slow_rate  # what a refusal says (core.check_problem)
    measured = _measured_seconds(name, a, b)
    assert 1 / 5 < estimate / measured < 5, f"{name} at {shape}: estimated {estimate:.3g} s, took {measured:.3g} s"


# ---- harness.check with quantized weights ----------------------------------------------------------
def test_check_takes_quantized_weights_and_checks_against_what_they_hold():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (3, 128)).astype(np.float32)
    w = rng.uniform(-1, 1, (5, 128)).astype(np.float32)
    weights = harness.quant.quantize(w, "q8_0")  # W [N, K]: Y = X @ W^T
    y = harness.get("python.decode")(x, weights)
    outcome = harness.check(y, x, weights)
    assert outcome.passed, outcome.message
    assert harness.check((x @ weights.dequantize().T).astype(np.float32), x, weights).passed

    wrong = y.copy()
    wrong[1, 2] += 0.01 * (1 + abs(wrong[1, 2]))
    outcome = harness.check(wrong, x, weights)
    assert not outcome.passed and "1 of 15 elements out of tolerance" in outcome.message
    # the float weights' product is not what q8_0 weights multiply by: it fails too
    assert not harness.check((x @ w.T).astype(np.float32), x, weights).passed


# ---- which BLAS the baseline ran ---------------------------------------------------------------------
def _compare_numpy(tmp_path: Path, name: str, environment: dict) -> tuple[str, dict]:
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "compare", "--shapes", "8", "--impls", "numpy.matmul"]
        + ["--min-time", "0.01", "--no-progress", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(out.read_text())["machine"]["implementations"]


def _openblas_that_picks_its_kernels():
    from harness.backends.numpy_blas import numpy_blas

    pool = numpy_blas()
    if pool is None or pool.get("internal_api") != "openblas" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("NumPy's BLAS here is not OpenBLAS on x86-64")
    config = getattr(np.__config__, "CONFIG", {})  # NumPy 1.26 and later
    configuration = config.get("Build Dependencies", {}).get("blas", {}).get("openblas configuration")
    if configuration and "DYNAMIC_ARCH" not in configuration:
        pytest.skip("this OpenBLAS is built for one CPU: OPENBLAS_CORETYPE changes nothing")
    return pool


def test_the_table_and_json_name_numpys_blas_and_say_when_a_kernel_is_forced(tmp_path):
    pool = _openblas_that_picks_its_kernels()
    plain = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    # Sandybridge (AVX, 2011): no x86-64 CPU this runs on (AVX2 or AVX-512) gets it by default
    table, described = _compare_numpy(tmp_path, "forced", {**plain, "OPENBLAS_CORETYPE": "Sandybridge"})
    text = described["numpy.matmul"]
    assert text.startswith(f"OpenBLAS {pool['version']}") and "Sandybridge kernels" in text
    assert "! OPENBLAS_CORETYPE=Sandybridge is set" in text and "without it" in text
    assert "numpy.matmul: OpenBLAS" in table and "! OPENBLAS_CORETYPE=Sandybridge is set" in table

    table, described = _compare_numpy(tmp_path, "plain", plain)
    text = described["numpy.matmul"]
    assert text.startswith(f"OpenBLAS {pool['version']}") and text.endswith(" kernels")
    assert "OPENBLAS_CORETYPE" not in text and "OPENBLAS_CORETYPE" not in table and "\n!" not in text
    assert f"numpy.matmul: {text}" in table
