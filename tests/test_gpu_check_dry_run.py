"""scripts/gpu_check.sh's control flow, on this machine, with every step replaced by a stand-in.

A GPU is lent rarely and briefly, so the script gets one try: its deadline, its outputs and
its handling of failing and overrunning steps are checked here, where they cost nothing. A fake
nvidia-smi stands on PATH; each step is a shell snippet (GPU_CHECK_STUB_<step>) that writes a
file, fails, or sleeps past the deadline; the budgets are scaled down so the run takes seconds.
"""
from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
MAX_FILES_BACK = 8  # what the GPU machine returns from its output folder

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the GPU script is bash")


def steps() -> list[str]:
    done = subprocess.run(["bash", str(SCRIPT), "--list-steps"], capture_output=True, text=True, check=True)
    return done.stdout.split()


def run(tmp_path: Path, stubs: dict[str, str], deadline: int, scale: float) -> tuple[subprocess.CompletedProcess, float, Path]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'name, driver_version'\necho 'Fake GPU, 0.0'\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
           "MATMUL_GPU_DEADLINE": str(deadline), "MATMUL_GPU_TIME_SCALE": str(scale)}
    for name in steps():
        env[f"GPU_CHECK_STUB_{name}"] = stubs.get(name, 'echo "stand-in for $0" > "$STEP_DIR/done.txt"')
    began = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=deadline + 60)
    return done, time.monotonic() - began, out


def summary_lines(out: Path) -> dict[str, str]:
    lines = (out / "summary.txt").read_text().splitlines()
    return {line.split()[0]: line for line in lines if line and not line.startswith((" ", "gpu_check"))}


def archived(out: Path) -> set[str]:
    with tarfile.open(out / "results.tar") as tar:
        return set(tar.getnames())


def test_step_list_is_ordered_by_value():
    names = steps()
    assert names[:5] == ["environment", "loaders", "compile", "correctness", "comparison"]
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
        "correctness": 'echo passed > "$STEP_DIR/correctness.txt"',
        # writes a partial result, then would run far past the deadline
        "comparison": 'echo partial > "$STEP_DIR/comparison.json"; sleep 600',
    }
    done, elapsed, out = run(tmp_path, stubs, deadline=deadline, scale=0.1)
    assert done.returncode != 0
    assert elapsed < deadline + 8, f"took {elapsed:.1f}s against a {deadline}s deadline"

    lines = summary_lines(out)
    assert list(lines) == steps(), "every step is listed, run or not"
    assert "failed (exit 3)" in lines["loaders"]
    assert "pycuda: cannot build" in (out / "summary.txt").read_text(), "a failure shows its last lines"
    assert " ok after " in lines["compile"] and " ok after " in lines["correctness"], "steps after a failure still run"
    assert "killed at its" in lines["comparison"]
    assert "skipped for time" in lines["experiments"]

    names = archived(out)
    assert "correctness/correctness.txt" in names, "results of earlier steps survive the kill"
    assert "comparison/comparison.json" in names, "what the killed step wrote is kept"
    assert len([p for p in out.rglob("*") if p.is_file()]) <= MAX_FILES_BACK


def test_usage_error():
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
