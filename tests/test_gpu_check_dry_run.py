"""scripts/gpu_check.sh's control flow, on this machine, with every step replaced by a stand-in.

A GPU is lent rarely and briefly, so the script gets one try: its deadline, its outputs and
its handling of failing and overrunning steps are checked here, where they cost nothing. A fake
nvidia-smi stands on PATH; each step is a shell snippet (GPU_CHECK_STUB_<step>) that writes a
file, fails, or sleeps past the deadline, or the real step with CPU implementations in its
plan (GPU_STEPS_PLAN); the budgets are scaled down so the run takes seconds. No process a step
starts may outlive it.

The plan itself is checked against the deadline with the host-side setup of every comparison
group measured here (test_the_plan_fits_the_deadline_with_the_decode_rows_first). Measured on
the 2-core development machine (AMD EPYC, shared, so that figures varied by up to 2x between
runs), at the real shapes. One 1 x 28672 x 8192 q4_0 problem as harness.compare alone makes it:
inputs 1.9-4.7 s, W = B^T (NumPy's strided copy) 12-14 s, quantize 3.7-3.9 s, dequantize
0.8-1.1 s, the host's float64 reference 3.8-4.1 s, 25 s and 5.7 GB in all (1 x 16384 x 16384:
2.0, 20.8, 4.4, 1.2 and 4.7 s, 33 s and 6.5 GB), and 1.2 s more for the bf16 allowance of
torch.int4_gpu's row. As the GPU run makes them (SharedProblem in scripts/gpu_steps.py: W = B^T
by torch's blocked transpose, 0.8-1.6 s; the reference on the GPU; one W per shape for every
format), each group's host-side setup, the input guard's three digests a row included (2-3 s
each for cuBLAS's 1 GB float32 B), at full size: decode-q4_0 35-38 s (65 s under a heavy load
from elsewhere), gemm-new 8, decode-more 38, decode-batch 23, decode-cublas-bf16 12, gemv 37,
gemm 32; measured at N / 8 and scaled, as the test does, decode-q4_0 took 31-32 s, and
decode-q4_K (one shape, 1 x 28672 x 8192: llama.cpp's q4_K quantizer in NumPy) 58-67 s, so it
comes after every decode group that fits and the estimate leaves it no time: it runs only where
the groups before it finish early.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from leftovers import left_running

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
MAX_FILES_BACK = 8  # what the GPU machine returns from its output folder

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.name != "posix", reason="the GPU script is bash")]


def steps() -> list[str]:
    done = subprocess.run(["bash", str(SCRIPT), "--list-steps"], capture_output=True, text=True, check=True)
    return done.stdout.split()


def run(
    tmp_path: Path, stubs: dict[str, str], deadline: int, scale: float, env: dict | None = None, real=()
) -> tuple[subprocess.CompletedProcess, float, Path]:
    """The GPU script with every step but those in ``real`` replaced by its stub (or one that
    writes a file)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'name, driver_version'\necho 'Fake GPU, 0.0'\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    scratch = tmp_path / "tmp"  # the script's own temporary folder goes here, not into /tmp
    scratch.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(scratch),
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
        "MATMUL_GPU_DEADLINE": str(deadline),
        "MATMUL_GPU_TIME_SCALE": str(scale),
        "PYTHON": sys.executable,
        **(env or {}),
    }
    for name in steps():
        if name not in real:
            env[f"GPU_CHECK_STUB_{name}"] = stubs.get(name, 'echo "stand-in for $0" > "$STEP_DIR/done.txt"')
    began = time.monotonic()
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=deadline + 60
    )
    return done, time.monotonic() - began, out


def summary_lines(out: Path) -> dict[str, str]:
    lines = (out / "summary.txt").read_text().splitlines()
    return {line.split()[0]: line for line in lines if line and not line.startswith((" ", "gpu_check"))}


def archived(out: Path) -> set[str]:
    with tarfile.open(out / "results.tar") as tar:
        return set(tar.getnames())


def test_step_list_is_ordered_by_value():
    names = steps()
    # the never-run kernels' smoke tests, then the decode rows no GPU has measured yet, the
    # never-run GEMMs beside their baseline, the edge shapes; the rest as time allows
    assert names[:7] == ["environment", "loaders", "compile", "smoke", "decode", "comparison", "correctness"]
    assert names.index("verdicts") > names.index("rest") > names.index("correctness")
    assert names[-1] == "experiments"


def test_all_steps_pass(tmp_path):
    done, _, out = run(tmp_path, {"environment": 'nvidia-smi > "$STEP_DIR/gpu.txt"'}, deadline=60, scale=0.05)
    assert not list((tmp_path / "tmp").iterdir()), "the script left its working folder behind"
    assert done.returncode == 0, done.stdout + done.stderr
    lines = summary_lines(out)
    assert list(lines) == steps()
    assert all(" ok after " in line for line in lines.values()), lines
    names = archived(out)
    assert "environment/gpu.txt" in names and "experiments/done.txt" in names
    with tarfile.open(out / "results.tar") as tar:
        assert b"Fake GPU" in tar.extractfile("environment/gpu.txt").read()
    assert len([p for p in out.rglob("*") if p.is_file()]) <= MAX_FILES_BACK


def test_failure_does_not_stop_later_steps_and_deadline_kills_the_overrun(tmp_path):
    deadline = 14
    stubs = {
        "loaders": 'echo "pycuda: cannot build"; exit 3',
        "smoke": 'echo "cuda.wgmma ok" > "$STEP_DIR/smoke.txt"',
        # writes a partial result, then would run far past the deadline
        "comparison": 'echo partial > "$STEP_DIR/comparison.json"; sleep 600',
    }
    done, elapsed, out = run(tmp_path, stubs, deadline=deadline, scale=0.1)
    assert done.returncode != 0
    # The overrunning step would sleep 600 s: ending within a minute of the deadline (a margin
    # that holds on a loaded machine) shows it was killed there.
    assert elapsed < deadline + 60, f"took {elapsed:.1f}s against a {deadline}s deadline"

    lines = summary_lines(out)
    assert list(lines) == steps(), "every step is listed, run or not"
    assert "failed (exit 3)" in lines["loaders"]
    assert "pycuda: cannot build" in (out / "summary.txt").read_text(), "a failure shows its last lines"
    assert " ok after " in lines["compile"] and " ok after " in lines["smoke"], "steps after a failure still run"
    assert "| cuda.wgmma ok" in (out / "summary.txt").read_text(), "the smoke step's line per kernel is shown"
    assert "killed at its" in lines["comparison"]
    assert "skipped for time" in lines["experiments"]

    names = archived(out)
    assert "smoke/smoke.txt" in names, "results of earlier steps survive the kill"
    assert "comparison/comparison.json" in names, "what the killed step wrote is kept"
    assert len([p for p in out.rglob("*") if p.is_file()]) <= MAX_FILES_BACK


def test_usage_error():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


# ---- scripts/gpu_steps.py: the steps that run GPU code, with CPU implementations standing in --
STEPS_SCRIPT = ROOT / "scripts" / "gpu_steps.py"


@pytest.fixture(scope="module", autouse=True)
def c_library_built():
    """The C library built before any step runs: the steps' timeouts are scaled down to seconds,
    and a first build in a cold clone (under CI's load, 7 s and more) would be charged to the
    step that happened to load it first, which then reads as hung."""
    from harness.backends.c import clib

    clib.load()


def gpu_steps(*args, stand_ins: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_STEPS_STAND_IN": stand_ins}
    return subprocess.run(
        [sys.executable, str(STEPS_SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def test_smoke_records_a_hung_and_a_faulting_kernel_and_how_far_each_got(tmp_path):
    began = time.monotonic()
    done = gpu_steps(
        "smoke",
        "--out",
        tmp_path,
        "--kernels",
        "numpy.matmul",
        "c.blocked",
        "c.naive_ijk",
        "c.packed",
        "--shape",
        "40",
        "--dtype",
        "float32",
        "--timeout",
        6,
        "--progress-kernels",
        "c.blocked",
        stand_ins="c.blocked=hang,c.naive_ijk=fault",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    # Each hung try is killed at its 6 s timeout (a hang would run for an hour); the margin is
    # for a loaded machine.
    assert time.monotonic() - began < 100, "a hang costs its own timeout (twice: the progress try), no more"
    smoke = json.loads((tmp_path / "smoke.json").read_text())
    assert smoke["numpy.matmul"]["verdict"] == "ok" and smoke["c.packed"]["verdict"] == "ok", (
        "kernels after a hang still run"
    )
    assert smoke["c.blocked"]["verdict"] == "HUNG"
    assert "while running (launch and synchronize)" in smoke["c.blocked"]["detail"], "the phase it hung in"
    # tried again, built to report its progress (a CPU stand-in has none to report)
    assert "progress: not recorded" in smoke["c.blocked"]["detail"], smoke["c.blocked"]
    assert smoke["c.naive_ijk"]["verdict"] == "FAULT" and "illegal memory access" in smoke["c.naive_ijk"]["detail"]
    assert "c.blocked            HUNG" in (tmp_path / "smoke.txt").read_text()


def test_a_wrong_result_is_told_apart_from_a_fault(tmp_path, monkeypatch):
    # a kernel whose check fails: c.blocked with a tile the harness accepts but a stand-in result
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_steps as steps

    from harness.model.core import Matmul

    class Wrong:
        mode = "native"

        def run(self):
            pass

        def result(self):
            return np.zeros((8, 8), np.float32)

    monkeypatch.setattr(Matmul, "prepare", lambda self, a, b: Wrong())
    assert steps.smoke_one("c.blocked", "8", "float32", tmp_path / "phase") == steps.WRONG_EXIT
    assert (tmp_path / "phase").read_text() == "checked"


def test_a_cut_comparison_keeps_every_finished_row_and_skips_what_the_smoke_test_condemned(tmp_path):
    (tmp_path / "smoke.json").write_text(
        json.dumps(
            {
                "c.naive_ijk": {"verdict": "FAULT", "detail": "exit 2 while running"},
                "numpy.matmul": {"verdict": "ok", "detail": ""},
            }
        )
    )
    groups = [
        "base:numpy.matmul:48,64:float32",
        "faulted:c.naive_ijk:48:float32",
        "hangs:c.blocked:48:float32",
        "packed:c.packed:48,64:float32",
        "last:c.naive_ikj:48:float32",
    ]
    began = time.monotonic()
    done = gpu_steps(
        "compare",
        "--out",
        tmp_path,
        "--smoke",
        tmp_path / "smoke.json",
        "--budget",
        60,
        "--min-time",
        0.005,
        "--group-timeout",
        15,
        *[a for g in groups for a in ("--group", g)],
        stand_ins="c.blocked=hang",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - began < 100  # the hung group was killed at its 15 s, not left to hang
    groups_text = (tmp_path / "groups.txt").read_text()
    assert "c.naive_ijk          skipped: FAULT in the smoke step" in groups_text
    assert "hangs                killed after" in groups_text
    assert "packed               ok" in groups_text and "last                 ok" in groups_text, (
        "groups after a hang run"
    )
    rows = json.loads((tmp_path / "comparison.json").read_text())["results"]
    ran = {(r["implementation"], r["shape"]) for r in rows}
    assert ran == {
        ("numpy.matmul", "48x48x48"),
        ("numpy.matmul", "64x64x64"),
        ("c.packed", "48x48x48"),
        ("c.packed", "64x64x64"),
        ("c.naive_ikj", "48x48x48"),
    }, ran
    packed = [r for r in rows if r["implementation"] == "c.packed"]
    assert all(r["status"] == "ok" and r["speedup"] for r in packed), "ratios against the baseline group"


def test_a_comparison_killed_from_outside_keeps_the_groups_that_finished(tmp_path):
    # what the GPU script's step timeout does: the whole process group killed mid-group
    command = [
        sys.executable,
        str(STEPS_SCRIPT),
        "compare",
        "--out",
        str(tmp_path),
        "--budget",
        "100",
        "--min-time",
        "0.005",
        "--group",
        "base:numpy.matmul:48:float32",
        "--group",
        "hangs:c.blocked:48:float32",
    ]
    child = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "GPU_STEPS_STAND_IN": "c.blocked=hang"},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "compare-hangs.log").exists():
        time.sleep(0.2)
    time.sleep(1)
    os.killpg(child.pid, 9)
    child.wait()
    rows = json.loads((tmp_path / "comparison.json").read_text())["results"]
    assert [(r["implementation"], r["status"]) for r in rows] == [("numpy.matmul", "ok")]
    assert not list(tmp_path.glob(".comparison.*")), "no half-written file left behind"
    # The hung group ran in a session of its own, out of reach of the killpg: it dies with its parent.
    assert left_running() == {}, "the hung group's process outlived the step that started it"


def test_the_tests_step_names_failures_and_hangs_and_runs_past_a_hang(tmp_path):
    tests = tmp_path / "test_stand_in_gpu.py"
    tests.write_text(
        "import time, pytest\n"
        "def test_new_kernel_ok(): pass\n"
        "def test_new_kernel_hangs(): time.sleep(600)\n"
        "def test_new_kernel_wrong(): assert 1 == 2, 'result differs'\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_proven_kernel(n): pass\n"
    )
    out = tmp_path / "out"
    done = gpu_steps("tests", "--out", out, "--budget", 60, "--test-timeout", 3, "--first", "new_kernel", "--", tests)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (out / "tests-summary.txt").read_text()
    assert summary.startswith("5 tests, 2 pytest run(s): 1 failed, 1 hung, 3 passed"), summary
    assert "HUNG " in summary and "test_new_kernel_hangs (killed after 3s)" in summary
    assert "FAILED " in summary and "test_new_kernel_wrong" in summary and "result differs" in summary
    order = [
        line.split()[1].split("::")[1]
        for line in (out / "tests.log").read_text().splitlines()
        if line.startswith("START")
    ]
    assert order[:3] == ["test_new_kernel_ok", "test_new_kernel_hangs", "test_new_kernel_wrong"], (
        "the new kernels first"
    )
    assert order[3:] == ["test_proven_kernel[1]", "test_proven_kernel[2]"], "the tests after the hang still ran"


def steps_module():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_steps

    return gpu_steps


def test_the_default_plan_names_registered_gpu_implementations_and_covers_them_all():
    plan = steps_module()
    import harness

    parts = {part: plan.default_groups(part) for part in plan.PARTS}
    assert list(parts) == [s for s in steps() if s in parts], "the script runs the parts in the plan's order"
    assert sum(parts.values(), []) == plan.default_groups()
    planned = [name for group in plan.default_groups() for name in group.impls]
    assert sorted(set(planned)) == sorted(i.name for i in harness.implementations() if i.device == "gpu")
    groups = {group.name: group for group in plan.default_groups()}
    assert set(groups) == set(plan.DEVICE_SECONDS), "every group has its expected seconds on the device"

    # first the decode rows every decode verdict needs: q4_0 at >= 100 MB of weights through
    # ours and torch's int4 kernel, cuBLAS's float32 product at the same shapes
    (decode,) = parts["decode"]
    assert decode.impls == ["cuda.decode", "triton.decode", "torch.int4_gpu", "torch.cublas"], "ours first"
    assert decode.weights == ["q4_0", "float32"] and decode.dtypes == ["float32"]
    for shape in decode.shapes:
        _, n, k = (int(d) for d in shape.split("x"))
        assert n * k // 32 * 18 >= 100e6, f"{shape}: q4_0 weights under 100 MB"
    # then the never-run GEMMs beside their baseline, in the dtype of their verdicts
    (new,) = parts["comparison"]
    assert new.impls == ["torch.cublas", *plan.NEVER_RUN] and new.dtypes == [plan.SMOKE_DTYPE]
    for name in plan.NEVER_RUN:
        assert plan.SMOKE_DTYPE in harness.lookup(name).dtypes
    # the rest: the other decode problems, then what an H200 has measured before
    assert [g.name for g in parts["rest"]] == [
        "decode-more",
        "decode-batch",
        "decode-cublas-bf16",
        "decode-q4_K",
        "gemv",
        "gemm",
    ]
    assert groups["decode-more"].weights == ["q8_0", "bf16"] and groups["decode-more"].shapes == decode.shapes
    assert groups["decode-q4_K"].impls == ["cuda.decode", "triton.decode"] and groups["decode-q4_K"].weights == ["q4_K"]
    assert set(groups["decode-q4_K"].shapes) <= set(decode.shapes)
    assert groups["decode-cublas-bf16"].dtypes == ["bfloat16"] and groups["decode-cublas-bf16"].shapes == decode.shapes
    assert [int(s.split("x")[0]) for s in groups["decode-batch"].shapes] == [4, 16], "cuda/decode.cu's two tiles"
    assert groups["gemv"].impls[0] == groups["gemm"].impls[0] == "torch.cublas", "the baseline first in a problem"
    for group in groups.values():
        assert all(not harness.lookup(i).weights for i in group.impls) or group.weights, f"{group.name}: needs weights"


def test_a_decode_group_compares_each_weight_format_and_keeps_them_apart(tmp_path):
    """A group's fifth field is its weight formats: one decode problem each, rows kept per format."""
    done = gpu_steps(
        "compare",
        "--out",
        tmp_path,
        "--budget",
        60,
        "--min-time",
        0.005,
        "--group",
        "decode:numpy.matmul,c.decode:2x40x64:float32:q4_0,q8_0,float32",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "comparison.json").read_text())["results"]
    found = {(r["implementation"], r["weights"]): r["status"] for r in rows}
    assert found == {("c.decode", "q4_0"): "ok", ("c.decode", "q8_0"): "ok", ("numpy.matmul", "float32"): "ok"}, found

    # the inputs of the shape, and its W = B^T, made once for all three formats
    setups = [line for line in (tmp_path / "compare-decode.log").read_text().splitlines() if "host setup" in line]
    assert len(setups) == 3 and "inputs" in setups[0] and "W = B^T" in setups[0], setups
    assert not any("inputs" in line or "W = B^T" in line for line in setups[1:]), setups


def test_a_row_that_hangs_raises_or_crashes_costs_only_its_own_implementations_rows(tmp_path):
    """Each row is written when it ends (a hang later in the problem keeps it); a row past the
    task timeout is a hang, one that raises may have poisoned its process's CUDA context, and one
    may take its process with it: each time the group goes on in a new process without that
    implementation."""
    done = gpu_steps(
        "compare",
        "--out",
        tmp_path,
        "--budget",
        80,
        "--min-time",
        0.005,
        "--task-timeout",
        10,  # a row's own time: the process's one-off measurements come before its first row
        "--group",
        "g:numpy.matmul,c.blocked,c.naive_ijk,c.naive_ikj,c.packed:48,64:float32",
        stand_ins="c.blocked=hang,c.naive_ijk=fault,c.naive_ikj=crash",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    rows = json.loads((tmp_path / "comparison.json").read_text())["results"]
    found = {(r["implementation"], r["shape"]): r["status"].split(":")[0] for r in rows}
    assert found == {
        ("numpy.matmul", "48x48x48"): "ok",  # written before the hang that followed it
        ("c.blocked", "48x48x48"): "timed out",
        ("c.naive_ijk", "48x48x48"): "error",
        ("c.naive_ikj", "48x48x48"): "crashed",
        ("c.packed", "48x48x48"): "ok",
        ("numpy.matmul", "64x64x64"): "ok",
        ("c.blocked", "64x64x64"): "skipped",
        ("c.naive_ijk", "64x64x64"): "skipped",
        ("c.naive_ikj", "64x64x64"): "skipped",
        ("c.packed", "64x64x64"): "ok",
    }, found
    report = (tmp_path / "groups.txt").read_text()
    assert "g                    c.blocked timed out after 10s at 48x48x48 float32: left out" in report, report
    assert "c.naive_ijk raised at 48x48x48 float32: left out" in report and "illegal memory access" in report
    assert "c.naive_ikj crashed (exit -11) at 48x48x48 float32: left out" in report
    assert "g                    ok after" in report


def test_decode_problems_are_the_harness_problems_made_once_and_checked_on_the_device(monkeypatch):
    """SharedProblem (one set of inputs per shape for every format, the reference on the GPU)
    multiplies what harness.compare's own problem does, and DeviceReference (run here on torch's
    CPU tensors) judges a result as the host's check does, the activation rounding included."""
    plan = steps_module()
    from harness.model import inputs
    from harness.model.activation_error import extra_allowed
    from harness.model.checking import check
    from harness.run.compare import _Problem

    made = []
    make_inputs = inputs.make_inputs
    monkeypatch.setattr(inputs, "make_inputs", lambda *args: made.append(args) or make_inputs(*args))
    shape = inputs.parse_shape("3x40x128")
    for fmt in ["q4_0", "q8_0", "bf16", "float32"]:
        ours, theirs = (
            plan.shared_problem(shape, "float32", 0, ["cpu"], fmt),
            _Problem(shape, "float32", 0, ["cpu"], fmt),
        )
        (a, b), (a2, b2) = ours.inputs, theirs.inputs
        assert np.array_equal(a, a2) and np.array_equal(ours._float_b, theirs._float_b), fmt
        assert np.array_equal(b, b2) if fmt == "float32" else np.array_equal(b.data, b2.data), fmt
    assert len(made) == 1, "the shape's inputs were made once for its four problems"

    problem = _Problem(shape, "float32", 0, ["cpu"], "q4_0")
    x, w_t = problem.inputs[0], problem._float_b  # W^T [K, N]: the transposed view of W [N, K], which is sent
    reference = plan.DeviceReference(x, w_t, device="cpu")
    exact = (x.astype(np.float64) @ w_t.astype(np.float64)).astype(np.float32)
    wrong = exact.copy()
    wrong[1, 7] += 0.5
    for result in (exact, wrong, exact[:, :-1]):
        host, device = check(result, x, w_t), reference.check(result)
        assert (host.passed, host.max_abs_error) == pytest.approx((device.passed, device.max_abs_error)), result.shape
    # torch.int4_gpu's rounding of X to bfloat16: out of the float32 model, within its allowance
    import ml_dtypes

    rounded = (x.astype(ml_dtypes.bfloat16).astype(np.float64) @ w_t.astype(np.float64)).astype(np.float32)
    extra = extra_allowed(x, w_t, "bf16")
    assert not reference.check(rounded).passed and not check(rounded, x, w_t).passed
    assert reference.check(rounded, extra).passed and check(rounded, x, w_t, activation_rounding="bf16").passed


def test_the_tests_step_keeps_the_tests_of_one_loader(tmp_path):
    tests = tmp_path / "test_loaders_gpu.py"
    tests.write_text(
        "import pytest\n"
        "@pytest.fixture(params=['pycuda', 'cupy'])\n"
        "def loader(request): return request.param\n"
        "def test_context(loader): pass\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_kernel(n, loader): pass\n"
        "def test_triton(): pass\n"
    )
    out = tmp_path / "out"
    done = gpu_steps("tests", "--out", out, "--budget", 60, "--loader", "cupy", "--", tests)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (out / "tests-summary.txt").read_text()
    assert summary.startswith("4 tests, 1 pytest run(s): 4 passed; 3 of another CUDA loader than cupy left out"), (
        summary
    )
    ran = [line.split("::")[1] for line in (out / "tests.log").read_text().splitlines() if line.startswith("START")]
    assert sorted(ran) == ["test_context[cupy]", "test_kernel[cupy-1]", "test_kernel[cupy-2]", "test_triton"], ran


def test_no_process_a_step_starts_outlives_it(tmp_path):
    # A step that leaves a process of its own session behind and ends, and one that does so and
    # then runs past its limit: beyond the reach of `timeout`'s kill, both are found by the mark.
    stubs = {"loaders": "setsid sleep 300 & echo started", "smoke": "setsid sleep 300 & sleep 600"}
    done, _, out = run(tmp_path, stubs, deadline=40, scale=0.1)
    lines = summary_lines(out)
    assert lines["loaders"].startswith("loaders      ok, 1 process(es) it left running killed after"), lines
    assert lines["smoke"].startswith("smoke        killed at its 8s limit, 1 process(es) it left running killed")
    assert " ok after " in lines["compile"] and " ok after " in lines["decode"], "the steps around them run as usual"
    assert left_running() == {}


def test_the_decode_rows_are_written_first_and_every_row_reaches_the_verdicts(tmp_path):
    """The real comparison and verdicts steps, with CPU implementations in the plan: the decode
    step's rows are written before the baseline's, a later step measures only what is new (and
    gets its speedups from the baseline rows of the earlier one), the verdicts read every row,
    and a kernel that hangs and leaves a process of its own session behind leaves nothing."""
    plan = {
        "decode": ["decode-q4_0:c.decode,c.decode_int8,numpy.matmul:1x64x256,1x96x512:float32:q4_0,float32"],
        "comparison": ["gemm-new:numpy.matmul,c.packed:64:float32"],
        "rest": [
            "decode-more:c.decode:1x64x256:float32:q8_0,bf16",
            "gemm:numpy.matmul,c.packed,c.blocked,c.naive_ikj:64,96:float32",
        ],
    }
    env = {"GPU_STEPS_PLAN": json.dumps(plan), "GPU_STEPS_STAND_IN": "c.blocked=hang-detached"}
    real = ("decode", "comparison", "rest", "verdicts")
    done, _, out = run(tmp_path, {}, deadline=240, scale=0.4, env=env, real=real)
    assert done.returncode == 1, done.stdout + done.stderr  # the hang, and the verdicts of rows no GPU made
    lines = summary_lines(out)
    assert " ok after " in lines["decode"] and " ok after " in lines["comparison"], lines
    assert "1 process(es) it left running killed" in lines["rest"], lines
    assert "c.blocked timed out after 24s at 64x64x64 float32: left out" in (out / "summary.txt").read_text()
    assert "NOT JUDGED" in (out / "summary.txt").read_text(), "the verdicts ran"
    assert left_running() == {}

    with tarfile.open(out / "results.tar") as tar:
        records = {
            step: [json.loads(line) for line in tar.extractfile(f"{step}/rows.jsonl").read().splitlines()]
            for step in ("decode", "comparison", "rest")
        }
        merged = json.loads(tar.extractfile("verdicts/comparison.json").read())["results"]
    assert max(r["written"] for r in records["decode"]) < min(r["written"] for r in records["comparison"])
    assert {(r["row"]["implementation"], r["row"]["weights"]) for r in records["decode"]} == {
        ("c.decode", "q4_0"),
        ("c.decode_int8", "q4_0"),
        ("numpy.matmul", "float32"),
    }
    rest = {(r["row"]["implementation"], r["row"]["shape"]) for r in records["rest"]}
    assert ("numpy.matmul", "64x64x64") not in rest and ("c.packed", "64x64x64") not in rest, "measured already"
    every = [r["row"] for rows in records.values() for r in rows]
    assert sorted((r["implementation"], r["shape"], str(r["weights"])) for r in merged) == sorted(
        (r["implementation"], r["shape"], str(r["weights"])) for r in every
    ), "the verdicts read every row of the three steps"
    ikj = next(r for r in merged if r["implementation"] == "c.naive_ikj" and r["shape"] == "64x64x64")
    assert ikj["status"] == "ok" and ikj["speedup"], "its speedup against the baseline row of an earlier step"


# ---- the plan against the deadline, with the host-side setup measured here ---------------------
DEADLINE_S = 480
DECODE_BY_S = 200
SETUP_SCALE = 8  # N (and M above 16) divided by it, the seconds multiplied: see host_setup_seconds


def test_the_plan_fits_the_deadline_with_the_decode_rows_first():
    """Each step's expected seconds (gpu_check.sh --steps: measured on an H200, or estimated),
    a comparison step's being its groups' DEVICE_SECONDS plus their host-side setup measured
    here, in the order the script runs them: the decode rows are written within the first
    200 s, the steps before the rest of the comparison fit their caps, and the whole within the
    480 s deadline; the rest gets what is left, by value (its table is printed)."""
    plan = steps_module()
    table = [
        line.split()
        for line in subprocess.run(
            ["bash", str(SCRIPT), "--steps"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
    ]
    fixed = {name: float(expected) for name, _, _, expected in table if expected != "plan"}
    clock, ends, report = 0.0, {}, []
    for index, (name, _, most, expected) in enumerate(table):
        if expected != "plan":
            seconds, detail = fixed[name], ""
        else:
            after = sum(fixed[later] for later, *_ in table[index + 1 :] if later in fixed)
            budget = min(float(most), DEADLINE_S - 3 - clock - after)
            seconds, parts = 0.0, []
            for group in plan.default_groups(name):
                # the lesser of two measurements: the machine may be busy with other work
                host = min(sum(plan.host_setup_seconds(group, SETUP_SCALE).values()) for _ in range(2))
                cost = plan.DEVICE_SECONDS[group.name] + host
                fits = seconds + cost <= budget
                parts.append(f"{group.name} {plan.DEVICE_SECONDS[group.name]}+{host:.0f}" + ("" if fits else " (cut)"))
                seconds = seconds + cost if fits else budget
                if not fits:
                    break
            detail = f"  device+host: {', '.join(parts)}"
            assert name == "rest" or "(cut)" not in detail, f"{name} does not fit its {most}s:{detail}"
        assert seconds <= float(most), f"{name}: {seconds:.0f}s expected, capped at {most}s"
        clock += seconds
        ends[name] = clock
        report.append(f"{name:12} {seconds:5.0f}s  ends at {clock:4.0f}s{detail}")
    print("\n".join(report))
    assert ends["decode"] <= DECODE_BY_S, "\n".join(report)
    assert clock <= DEADLINE_S, "\n".join(report)
