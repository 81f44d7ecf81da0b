"""scripts/gpu_check.sh's control flow, on this machine, with every step replaced by a stand-in.

A GPU is lent rarely and briefly, so the script gets one try: its deadline, its outputs and
its handling of failing and overrunning steps are checked here, where they cost nothing. A fake
nvidia-smi stands on PATH; each step is a shell snippet (GPU_CHECK_STUB_<step>) that writes a
file, fails, or sleeps past the deadline; the budgets are scaled down so the run takes seconds.
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
    tmp_path: Path, stubs: dict[str, str], deadline: int, scale: float
) -> tuple[subprocess.CompletedProcess, float, Path]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'name, driver_version'\necho 'Fake GPU, 0.0'\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
        "MATMUL_GPU_DEADLINE": str(deadline),
        "MATMUL_GPU_TIME_SCALE": str(scale),
    }
    for name in steps():
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
    # the never-run kernels' smoke tests first, then the comparison, then the edge shapes
    assert names[:6] == ["environment", "loaders", "compile", "smoke", "comparison", "correctness"]
    assert names.index("verdicts") > names.index("comparison")
    assert names[-1] == "experiments"


def test_all_steps_pass(tmp_path):
    done, _, out = run(tmp_path, {"environment": 'nvidia-smi > "$STEP_DIR/gpu.txt"'}, deadline=60, scale=0.05)
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
        40,
        "--min-time",
        0.005,
        "--no-plot",
        "--group-timeout",
        8,
        *[a for g in groups for a in ("--group", g)],
        stand_ins="c.blocked=hang",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - began < 100  # the hung group was killed at its 8 s, not left to hang
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
        "--no-plot",
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


def test_the_default_plan_names_registered_gpu_implementations_and_covers_them_all():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_steps as steps

    import harness

    planned = [name for _, impls, _, _, _ in steps.default_groups() for name in impls]
    assert planned[0] == "torch.cublas", "the baseline first"
    assert planned[1 : 1 + len(steps.NEVER_RUN)] == steps.NEVER_RUN, "then each never-run kernel"
    assert sorted(set(planned)) == sorted(i.name for i in harness.implementations() if i.device == "gpu")
    for name in steps.NEVER_RUN:
        assert steps.SMOKE_DTYPE in harness.lookup(name).dtypes

    # the decode groups: every GPU kernel that takes quantized weights, at >= 100 MB of q4_0
    # weights, with cuBLAS's float32 product in the same problems and its BF16 GEMV beside them
    decode = {name: (impls, shapes, dtypes, weights) for name, impls, shapes, dtypes, weights in steps.default_groups()}
    impls, shapes, dtypes, weights = decode["decode"]
    assert {"cuda.decode", "triton.decode", "torch.int4_gpu", "torch.cublas"} <= set(impls)
    assert {"q4_0", "q8_0", "bf16", "float32"} <= set(weights) and dtypes == ["float32"]
    for shape in shapes:
        _, n, k = (int(d) for d in shape.split("x"))
        assert n * k // 32 * 18 >= 100e6, f"{shape}: q4_0 weights under 100 MB"
    assert decode["decode-cublas-bf16"][2] == ["bfloat16"] and decode["decode-cublas-bf16"][1] == shapes
    assert [int(s.split("x")[0]) for s in decode["decode-batch"][1]] == [2, 4, 8, 16]
    for name, (impls, _, _, weights) in decode.items():
        assert all(not harness.lookup(i).weights for i in impls) or weights, f"{name}: decode kernels need weights"


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
        "--no-plot",
        "--group",
        "decode:numpy.matmul,c.decode:2x40x64:float32:q4_0,q8_0,float32",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "comparison.json").read_text())["results"]
    found = {(r["implementation"], r["weights"]): r["status"] for r in rows}
    assert found == {("c.decode", "q4_0"): "ok", ("c.decode", "q8_0"): "ok", ("numpy.matmul", "float32"): "ok"}, found
