"""The GPU run's plumbing that needs no GPU: finding the toolkit, choosing a loader, judging the
speed targets from a comparison's JSON, and failing GPU tests that would skip when a GPU is
required."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.cuda import loaders, toolkit
from harness.tooling import verdicts

ROOT = Path(__file__).resolve().parents[1]


def fake_toolkit(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "include").mkdir()
    (path / "include" / "cuda.h").write_text("/* stand-in */\n")
    nvcc = path / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    return path


@pytest.fixture
def clean_toolkit_env(monkeypatch):
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    toolkit.cuda_root.cache_clear()
    yield monkeypatch
    toolkit.cuda_root.cache_clear()


def test_cuda_root_prefers_cuda_home(tmp_path, clean_toolkit_env):
    root = fake_toolkit(tmp_path / "cuda-x")
    clean_toolkit_env.setenv("CUDA_HOME", str(root))
    assert toolkit.cuda_root() == root.resolve()
    assert toolkit.nvcc() == str(root.resolve() / "bin" / "nvcc")


def test_cuda_root_skips_a_folder_without_cuda_h(tmp_path, clean_toolkit_env):
    (tmp_path / "bare" / "bin").mkdir(parents=True)
    clean_toolkit_env.setenv("CUDA_HOME", str(tmp_path / "bare"))
    found = toolkit.cuda_root()
    assert found is None or (found / "include" / "cuda.h").is_file()


def test_cuda_root_follows_a_wrapper_nvcc_to_its_toolkit(tmp_path, clean_toolkit_env):
    """nvcc on PATH may be a script outside the toolkit: the TOP its --dryrun prints is used."""
    clean_toolkit_env.setattr(toolkit, "CONVENTIONAL_ROOT", str(tmp_path / "no-such-folder"))
    root = fake_toolkit(tmp_path / "toolkit")
    (root / "bin" / "nvcc").write_text(f"#!/bin/sh\necho '#$ TOP={root}/bin/..' >&2\n")
    wrapper_dir = tmp_path / "wrappers"
    wrapper_dir.mkdir()
    wrapper = wrapper_dir / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {root}/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    clean_toolkit_env.setenv("PATH", f"{wrapper_dir}{os.pathsep}{os.environ['PATH']}")
    assert toolkit.cuda_root() == root.resolve()


def test_unknown_loader_is_a_reason(monkeypatch):
    monkeypatch.setenv(loaders.LOADER_ENV, "ctypes")
    monkeypatch.setattr(loaders.gpu, "cuda_unavailable_reason", lambda: None)
    assert "expected one of pycuda, cupy" in loaders.native_unavailable_reason()


def test_missing_loaders_are_named(monkeypatch):
    monkeypatch.delenv(loaders.LOADER_ENV, raising=False)
    monkeypatch.setattr(loaders.gpu, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(loaders, "loader_unavailable_reason", lambda name: f"{name} is not importable")
    reason = loaders.native_unavailable_reason()
    assert "pycuda is not importable" in reason and "cupy is not importable" in reason


def comparison(rows, copy_gbps=4300.0, datasheet=4800.0) -> dict:
    return {
        "machine": {"gpu": {"copy_bandwidth_gbps": copy_gbps, "datasheet": {"bandwidth": datasheet}}},
        "results": rows,
    }


def row(name, shape, dtype, status="ok", speedup=None, gbytes=None, median=1e-3, gflops=1e5):
    return {
        "implementation": name,
        "shape": shape,
        "dtype": dtype,
        "status": status,
        "median_s": median,
        "speedup": speedup,
        "gbytes_per_s": gbytes,
        "gflops": gflops,
    }


def outcomes(document) -> dict:
    return {(v.target.implementation, v.target.shape, v.target.dtype): v for v in verdicts.judge([document])}


def test_verdicts_met_missed_and_not_judged():
    found = outcomes(
        comparison(
            [
                row("cuda.register_tiled", "4096x4096x4096", "float32", speedup=0.62),
                row("cuda.wmma", "4096x4096x4096", "bfloat16", speedup=0.10),
                row(
                    "cuda.wmma", "8192x8192x8192", "bfloat16", status="FAILED: 3 elements out of tolerance", median=None
                ),
                row("cuda.gemv", "1x16384x16384", "bfloat16", gbytes=4000.0),
            ]
        )
    )
    assert found[("cuda.register_tiled", "4096x4096x4096", "float32")].outcome == "met"
    assert found[("cuda.wmma", "4096x4096x4096", "bfloat16")].outcome == "missed"
    assert found[("cuda.wmma", "8192x8192x8192", "bfloat16")].outcome == "not judged"
    gemv = found[("cuda.gemv", "1x16384x16384", "bfloat16")]
    assert gemv.outcome == "met"
    assert "83% of the 4800 GB/s datasheet" in gemv.detail and "93% of the 4300 GB/s measured copy" in gemv.detail
    assert found[("triton.gemv", "1x16384x16384", "float16")].outcome == "not judged"


def test_decode_verdicts_judge_the_copy_share_and_the_int4_peer_by_weight_format():
    def decode_row(name, shape, median, gbytes, weights="q4_0", status="ok"):
        return {**row(name, shape, "float32", status=status, gbytes=gbytes, median=median), "weights": weights}

    found = {
        (v.target.implementation, v.target.shape, v.target.kind): v
        for v in verdicts.judge(
            [
                comparison(
                    [
                        decode_row("cuda.decode", "1x16384x16384", 40e-6, 3800.0),
                        decode_row("torch.int4_gpu", "1x16384x16384", 50e-6, 3000.0),
                        decode_row(
                            "cuda.decode", "1x16384x16384", 1e-3, 10.0, weights="q8_0"
                        ),  # another problem: not judged here
                        decode_row("cuda.decode", "1x28672x8192", 60e-6, 2200.0),
                        decode_row("torch.int4_gpu", "1x28672x8192", 40e-6, 3300.0, status="FAILED: out of tolerance"),
                    ]
                )
            ]
        )
    }
    copy = found[("cuda.decode", "1x16384x16384", "copy")]
    assert copy.outcome == "met" and "88% of the 4300 GB/s measured copy" in copy.detail
    peer = found[("cuda.decode", "1x16384x16384", "vs_peer")]
    assert peer.outcome == "met" and "1.25x torch.int4_gpu" in peer.detail
    assert found[("cuda.decode", "1x28672x8192", "copy")].outcome == "missed"
    assert found[("cuda.decode", "1x28672x8192", "vs_peer")].outcome == "not judged"
    assert found[("triton.decode", "1x16384x16384", "copy")].outcome == "not judged"
    assert "q4_0 weights: at least 1.00x torch.int4_gpu" in peer.line()


def test_verdicts_command_exit_status(tmp_path):
    path = tmp_path / "comparison.json"
    path.write_text(json.dumps(comparison([row("cuda.register_tiled", "4096x4096x4096", "float32", speedup=0.2)])))
    done = subprocess.run(
        [sys.executable, "-m", "harness", "verdicts", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "MISSED" in done.stdout and "0.20x cuBLAS" in done.stdout
    assert done.stdout.count("\n") == len(verdicts.TARGETS)


def test_require_gpu_turns_gpu_skips_into_failures():
    env = {**os.environ, "MATMUL_REQUIRE_GPU": "1"}
    env.pop("MATMUL_CUDA_EMULATE", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "-n",
            "0",
            "tests/test_cuda_gpu.py::test_loader_shares_torch_context",
            "tests/test_triton_gpu.py",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    if "passed" in done.stdout and "failed" not in done.stdout:
        pytest.skip("a GPU is here: nothing would skip")
    assert done.returncode != 0
    assert "MATMUL_REQUIRE_GPU=1, but this GPU test would be skipped" in done.stdout
    assert "MATMUL_REQUIRE_GPU=1, but the module would be skipped" in done.stdout


@pytest.mark.parametrize("case", ["ok", "nan", "inf", "off"])
def test_the_check_gives_one_verdict_in_numpy_and_torch(case):
    """harness.backends.gpu.DeviceProblem checks on the GPU with torch; the rule is the same code."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from harness import make_inputs
    from harness.model import checking

    a, b = make_inputs("33x17x65", "float32", seed=5)
    data = checking.reference_data(a, b)
    ref = data.product
    result = ref.astype(np.float32)
    if case == "nan":
        result[3, 4] = np.nan
    elif case == "inf":
        result[0, 0] = np.inf
    elif case == "off":
        result[5, 6] += 1e-2
    by_numpy = checking.check(result, a, b, data)
    by_torch = checking.compare_elements(
        torch,
        torch.from_numpy(result.astype(np.float64)),
        torch.from_numpy(ref),
        torch.from_numpy(data.terms_norm),
        result.dtype,
        a.shape[1],
    )
    assert (by_torch.passed, by_torch.message) == (by_numpy.passed, by_numpy.message)
    assert by_torch.worst_ratio == pytest.approx(by_numpy.worst_ratio)
    assert by_numpy.passed == (case == "ok")


def test_results_round_trip_through_json(tmp_path):
    """A comparison's JSON (a GPU run's, say) can be read back to print, plot and judge."""
    import harness
    from harness.run.compare import Results

    results = harness.compare(["8x9x10"], "numpy.matmul", ["float32"], min_time=0.001)
    back = Results.from_json(results.to_json(tmp_path / "r.json"))
    assert [r.__dict__ for r in back.rows] == [r.__dict__ for r in results.rows]
    assert back.plot(tmp_path / "r.png").stat().st_size > 0


def test_triton_check_mode_keeps_one_config_per_kernel(monkeypatch):
    # The GPU correctness step compiles each autotuned kernel once per specialization, not
    # once per config (tests/test_triton_gpu.py sets CHECK_MODE from MATMUL_TRITON_CHECK_MODE).
    torch = pytest.importorskip("torch")
    from harness.backends import triton_kernels

    if triton_kernels.setup()[1]:
        pytest.skip(f"Triton cannot load here: {triton_kernels.setup()[1]}")
    matmul = triton_kernels.load_source("triton/matmul.py")
    for dtype in (torch.float16, torch.float32):
        named_args = {"a_ptr": torch.empty(1, dtype=dtype)}
        monkeypatch.setattr(matmul, "CHECK_MODE", False)
        every = matmul._prune_configs(matmul.HOPPER_CONFIGS, named_args)
        monkeypatch.setattr(matmul, "CHECK_MODE", True)
        assert len(every) > 1 and matmul._prune_configs(matmul.HOPPER_CONFIGS, named_args) == every[:1]
    # FP32 keeps a config that does not spill, not the first of the list
    fp32 = matmul._prune_configs(matmul.HOPPER_CONFIGS, {"a_ptr": torch.empty(1, dtype=torch.float32)})
    assert matmul._accumulators_per_thread(fp32[0]) <= matmul.FP32_ACCUMULATORS
    tma = triton_kernels.load_source("triton/matmul_tma.py")
    assert "CHECK_MODE" in tma._autotuned_kernel.__code__.co_names  # read where the autotuner is built


def test_every_cuda_technique_is_planned_from_its_own_source_and_every_source_is_found():
    # The sources are found by globbing cuda/*.cu; each technique's launch is its .cu's `@launch`.
    import harness
    from harness.backends.cuda import plans

    assert "cuda/wgmma.cu" in toolkit.cuda_sources() and toolkit.archs_for("cuda/wgmma.cu") == ("sm_90a",)
    assert toolkit.archs_for("cuda/tiled.cu") == toolkit.ARCHS
    specs = plans.launch_specs()
    for impl in harness.implementations("cuda.*"):
        techniques = [plans.decode_technique(fmt, 1) for fmt in impl.weights] or [impl.backend.technique]
        for technique in techniques:
            assert specs[technique].source == impl.source, impl.name
    launch = plans.plan("tiled", "float32", 33, 40, 7)  # TILE = 16 in cuda/tiled.cu
    assert (launch.grid, launch.block, launch.args, launch.signature) == (
        (3, 3, 1),
        (16, 16, 1),
        ("A", "B", "C", 33, 40, 7),
        "PPPiii",
    )


def test_a_launch_declaration_that_cannot_be_read_says_where(tmp_path, monkeypatch):
    from harness.backends.cuda import plans
    from harness.env import sources

    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "one.cu").write_text(
        "#define T 8 // tile\n// @launch one grid (cdiv(N, T)) block (T * 4) args (A, B, C, N, K)\n"
    )
    monkeypatch.setattr(sources, "sources_root", lambda: tmp_path)
    assert plans.plan("one", "float32", 1, 17, 5).grid == (3, 1, 1)
    (tmp_path / "cuda" / "two.cu").write_text("// @launch one grid (1) block (32) args (A, B, C, N, K)\n")
    with pytest.raises(plans.LaunchDeclarationError, match="declared in both cuda/one.cu and cuda/two.cu"):
        plans.plan("one", "float32", 1, 17, 5)
    (tmp_path / "cuda" / "two.cu").write_text("// @launch two grid (cdiv(N, TILE)) block (32) args (A, B, C, N, K)\n")
    with pytest.raises(plans.LaunchDeclarationError, match=r"cuda/two.cu: @launch two grid: TILE is not"):
        plans.plan("two", "float32", 1, 17, 5)


def test_a_kernel_family_is_declared_and_named_once_from_its_x_macro_list():
    """decode.cu's formats x rows: one list makes the wrappers, their launches and the names
    the emulation registers; a declaration over a list the file lacks says which."""
    from harness.backends.cuda import emulation, plans

    text = (
        "// @launch k_{0}_m{1} for each KERNELS grid (cdiv(N, {1})) block (32) args (A, B, C, M, N, K)\n"
        "#define KERNELS(X) \\\n    X(a, 1) X(b, 4)\n"
        '#define KERNEL(f, mt) extern "C" __global__ void k_##f##_m##mt##_f32(float* A) { go<mt>(A); }\n'
        "KERNELS(KERNEL)\n"
        'extern "C" __global__ void plain_f32(float* A) {}\n'
    )
    specs = plans.launch_declarations("family.cu", text)
    assert [spec.technique for spec in specs] == ["k_a_m1", "k_b_m4"]
    assert specs[1].evaluate("grid", {"M": 1, "N": 10, "K": 1}) == 3
    assert emulation.kernel_names(text) == ["plain_f32", "k_a_m1_f32", "k_b_m4_f32"]
    with pytest.raises(plans.LaunchDeclarationError, match=r"no `#define OTHER\(X\)"):
        plans.launch_declarations("family.cu", text.replace("for each KERNELS", "for each OTHER"))
