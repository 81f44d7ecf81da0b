"""A user's kernel cannot take the run down: it is checked and timed in a worker process, where
a crash or a hang is a row and the run goes on (harness/run/isolation.py), and Ctrl-C stops any run
at once. Through the public command line and API, as a user meets them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import harness
from harness.backends.external import ExternalError

HANG_MARGIN_S = 60  # a bound against a hang, not a speed: these machines are shared and noisy

SIGNATURE = "void {name}_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K)"
KERNELS = {
    "segv": "{{ *(volatile float *)0 = 1.0f; }}",
    "hang": '{{ for (;;) __asm__ volatile(""); }}',
    "good": """{{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {{
            float s = 0;
            for (int64_t p = 0; p < K; p++) s += A[i * K + p] * B[p * N + j];
            C[i * N + j] = s;
        }}
}}""",
    "writes_a": "{{ ((float *)A)[0] = 42.0f; for (int64_t i = 0; i < M * N; i++) C[i] = 0; }}",
    "exits": "{{ exit(3); }}",
}


def c_kernel(folder: Path, kind: str, function: str = "mm", file_name: str | None = None) -> str:
    """A C file holding one kernel of ``kind``; its FILE:FUNCTION."""
    path = folder / (file_name or f"{kind}.c")
    path.parent.mkdir(parents=True, exist_ok=True)
    body = KERNELS[kind].format()
    path.write_text(f"#include <stdint.h>\n#include <stdlib.h>\n{SIGNATURE.format(name=function)}\n{body}\n")
    return f"{path}:{function}"


pytestmark = pytest.mark.usefixtures("forget_user_kernels")  # each test's kernels leave with it


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """User kernels compiled into this test's own cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "matmul-reference" / "external"


def run_cli(*args, cwd, timeout=HANG_MARGIN_S, env=None):
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_chaos_a_crash_a_hang_and_two_good_rows(tmp_path, own_cache):
    """The issue's test: a crashing, a hanging and a correct user kernel beside c.packed give
    four rows, exit 1 and a complete JSON, in seconds, with nothing left running."""
    specs = [c_kernel(tmp_path, kind) for kind in ("segv", "hang", "good")]
    out = tmp_path / "out.json"
    started = time.monotonic()
    done = run_cli(
        "compare",
        "--shapes",
        "16",
        "--impls",
        *specs,
        "c.packed",
        "--no-baseline",
        "--timeout",
        "2",
        "--min-time",
        "0.01",
        "--no-progress",
        "--json",
        str(out),
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    statuses = {row["implementation"]: row["status"] for row in json.loads(out.read_text())["results"]}
    assert len(statuses) == 4, statuses
    assert statuses["segv.mm"] == "crashed: SIGSEGV in segv.c:mm"
    assert statuses["hang.mm"].startswith("timed out: hang.c:mm took longer than 2 s")
    assert statuses["good.mm"] == "ok" and statuses["c.packed"] == "ok"
    assert elapsed < HANG_MARGIN_S
    assert "crashed" in done.stdout and "timed out" in done.stdout


def test_the_rows_after_a_crash_still_run_and_are_timed(tmp_path, own_cache):
    """A crashed worker is replaced: the same kernel's next problem gets a worker of its own,
    and the good kernel's rows are timed in theirs."""
    crash, good = c_kernel(tmp_path, "segv"), c_kernel(tmp_path, "good")
    results = harness.compare([8, 24], [crash, good], baselines=False, min_time=0.01)
    assert [row.status for row in results.rows if row.implementation == "segv.mm"] == [
        "crashed: SIGSEGV in segv.c:mm"
    ] * 2
    good_rows = [row for row in results.rows if row.implementation == "good.mm"]
    assert [row.passed for row in good_rows] == [True, True]
    assert all(row.median_s and row.median_s > 0 and row.gflops for row in good_rows)
    assert results.settings["isolate"] == "user"


def test_a_kernel_that_exits_or_writes_its_inputs_is_a_failed_row(tmp_path, own_cache):
    exits, writes = c_kernel(tmp_path, "exits"), c_kernel(tmp_path, "writes_a")
    results = harness.compare([8], [exits, writes, "c.naive_ikj"], baselines=False, min_time=0.01)
    statuses = {row.implementation: row.status for row in results.rows}
    assert statuses["exits.mm"] == "crashed: exit status 3 in exits.c:mm"
    assert statuses["writes_a.mm"].startswith("FAILED: writes_a.mm wrote into its input A")
    assert statuses["c.naive_ikj"] == "ok"  # and the row after it saw the inputs as they were
    assert all(row.failed for row in results.rows if row.implementation != "c.naive_ikj")


def test_python_kernels_are_isolated_too(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text(
        textwrap.dedent(
            """
            import os
            import numpy as np

            def good(a, b):
                return a @ b

            def raises(a, b):
                raise RuntimeError("not written yet")

            def leaves(a, b):
                os._exit(7)

            def wrong_shape(a, b):
                return np.zeros((1, 1), a.dtype)

            def writes(a, b):
                a[0, 0] = 1.0
                return a @ b
            """
        )
    )
    names = ["good", "raises", "leaves", "wrong_shape", "writes"]
    results = harness.compare([8], [f"{source}:{name}" for name in names], baselines=False, min_time=0.01)
    statuses = {row.implementation: row.status for row in results.rows}
    assert statuses["mine.good"] == "ok"
    assert statuses["mine.raises"] == "error: RuntimeError: not written yet"
    assert statuses["mine.leaves"] == "crashed: exit status 7 in mine.py:leaves"
    assert statuses["mine.wrong_shape"].startswith("error: ResultError: mine.wrong_shape returned ndarray (1, 1)")
    assert statuses["mine.writes"].startswith("FAILED: mine.writes tried to write into its inputs")


def test_a_hang_in_python_is_cut_at_the_timeout(tmp_path):
    source = tmp_path / "slow.py"
    source.write_text("import time\n\ndef matmul(a, b):\n    time.sleep(3600)\n")
    started = time.monotonic()
    results = harness.compare([8], [f"{source}:matmul"], baselines=False, timeout=1)
    assert time.monotonic() - started < HANG_MARGIN_S
    (row,) = results.rows
    assert row.status.startswith("timed out: slow.py:matmul took longer than 1 s on one call"), row.status


def test_our_own_kernels_can_be_isolated_as_well(tmp_path):
    results = harness.compare([32], ["c.packed", "numpy.matmul"], baselines=False, isolate="all", min_time=0.01)
    assert all(row.passed and row.median_s > 0 for row in results.rows), [row.status for row in results.rows]
    assert results.settings["isolate"] == "all"


@pytest.mark.parametrize(
    "keyword, value, says",
    [
        ("isolate", "some", "isolate must be one of user, all"),
        ("timeout", 0, "timeout must be"),
        ("timeout", float("nan"), "timeout must be"),
        ("timeout", float("inf"), "timeout must be"),
    ],
)
def test_isolation_options_are_checked(keyword, value, says):
    with pytest.raises(ValueError, match=says):
        harness.compare([8], ["c.naive_ikj"], baselines=False, **{keyword: value})


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_timeout_is_a_usage_error(tmp_path, value):
    done = run_cli("compare", "--shapes", "8", "--impls", "c.naive_ikj", "--timeout", value, cwd=tmp_path)
    assert done.returncode == 2 and "--timeout" in done.stderr and "Traceback" not in done.stderr


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(child) for child in listing.read().split()]
    except OSError:
        return []


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the worker through /proc")
def test_ctrl_c_stops_a_run_inside_a_hanging_kernel_at_once(tmp_path, own_cache):
    """SIGINT to the command's process group (what a terminal's Ctrl-C sends) while the user's
    kernel spins in C: the command ends at once, as one stopped by SIGINT does, with no traceback
    from the worker."""
    spec = c_kernel(tmp_path, "hang")
    process = subprocess.Popen(
        [sys.executable, "-m", "harness", "compare", "--shapes", "16", "--impls", spec, "--no-baseline"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + HANG_MARGIN_S
        while not _children(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _children(process.pid), "the worker never started"
        time.sleep(1.0)  # into the kernel: the worker starts and loads it well within this
        os.killpg(process.pid, signal.SIGINT)
        interrupted = time.monotonic()
        out, err = process.communicate(timeout=HANG_MARGIN_S)
        took = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGINT, err
    assert "interrupted" in err and "Traceback" not in err
    assert took < 10, took  # about 0.1 s on an idle machine; 10 s is a bound against a hang


def test_ctrl_c_stops_a_long_emulated_cuda_launch(tmp_path):
    """The CUDA emulation's launch is C (fibers): made where Ctrl-C still stops the wait."""
    process = subprocess.Popen(
        [sys.executable, "-m", "harness", "compare", "--shapes", "2048", "--impls", "cuda.tiled"]
        + ["--no-baseline", "--allow-slow", "--no-progress"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MATMUL_CUDA_EMULATE": "1"},
    )
    try:
        time.sleep(4.0)  # started, inputs made, inside the launch (about 100 s long)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        out, err = process.communicate(timeout=HANG_MARGIN_S)
        took = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGINT, err
    assert took < 10, took


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the process through /proc")
def test_ctrl_c_reaches_a_long_user_c_call_made_in_this_process(tmp_path, own_cache):
    """harness.get(name)(a, b) runs the user's C in the caller's process (no worker): a long
    call is made where Ctrl-C still stops the wait for it."""
    spec = c_kernel(tmp_path, "hang")
    script = (
        "import sys, numpy as np, harness\n"
        f"matmul = harness.get(harness.add_external({spec!r}))\n"
        "a = np.ones((256, 256), np.float32)\n"
        "print('calling', flush=True)\n"
        "try:\n    matmul(a, a)\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "calling"
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        out, err = process.communicate(timeout=HANG_MARGIN_S)
        took = time.monotonic() - interrupted
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert out.strip() == "interrupted", err
    assert took < 10, took


def test_two_files_with_one_stem_get_two_names(tmp_path, own_cache):
    first = c_kernel(tmp_path / "v1", "good", file_name="mine.c")
    second = c_kernel(tmp_path / "v2", "segv", file_name="mine.c")
    results = harness.compare([8], [first, second], baselines=False, min_time=0.01)
    statuses = {row.implementation: row.status for row in results.rows}
    assert statuses == {"mine.mm": "ok", "v2/mine.mm": "crashed: SIGSEGV in v2/mine.c:mm"}
    assert harness.add_external(second) == "v2/mine.mm"  # the same file again: the same name


def test_a_name_with_glob_characters_is_taken_literally(tmp_path, own_cache):
    """A file called [c].c is not the pattern [c] (which matches the repository's c.packed)."""
    spec = c_kernel(tmp_path, "good", function="packed", file_name="[c].c")
    results = harness.compare([8], [spec], baselines=False, min_time=0.01)
    assert [(row.implementation, row.status) for row in results.rows] == [("[c].packed", "ok")]


def test_a_damaged_cached_kernel_is_built_again(tmp_path, own_cache):
    """An emptied or truncated library in the cache is rebuilt, never loaded (loading a
    truncated shared library can end the process with SIGBUS)."""
    spec = c_kernel(tmp_path, "good")
    args = ("compare", "--shapes", "8", "--impls", spec, "--no-baseline", "--min-time", "0.01")
    env = {"XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"]}
    assert run_cli(*args, cwd=tmp_path, env=env).returncode == 0
    (library,) = own_cache.glob("good-*.so")
    for damage in (lambda data: b"", lambda data: data[: len(data) // 2]):
        library.write_bytes(damage(library.read_bytes()))
        done = run_cli(*args, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        (rebuilt,) = own_cache.glob("good-*.so")
        assert rebuilt == library and library.stat().st_size > 1000


@pytest.mark.parametrize("setting", ["", "relative/cache"])
def test_a_relative_or_empty_cache_home_is_ignored(tmp_path, monkeypatch, setting):
    """The XDG spec: XDG_CACHE_HOME must be an absolute path, else it is ignored; nothing is
    built into the folder a command was started from."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", setting)
    work = tmp_path / "work"
    spec = c_kernel(tmp_path / "src", "good")
    work.mkdir()
    monkeypatch.chdir(work)
    assert harness.add_external(spec) == "good.mm"
    assert list(work.iterdir()) == []
    assert list((home / ".cache" / "matmul-reference" / "external").glob("good-*.so"))


def test_an_unwritable_cache_is_an_external_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    spec = c_kernel(tmp_path, "good")
    with pytest.raises(ExternalError, match="cannot build good.c into the cache folder"):
        harness.add_external(spec)


def test_an_empty_problem_is_checked_never_timed():
    """A product with a dimension 0 is checked (zeros, or nothing) and never timed: a time
    measured from a no-op would give a rate and a ratio that mean nothing."""
    results = harness.compare(["1x0x3", "4x4x0"], ["c.naive_ikj", "numpy.matmul"], min_time=0.01)
    assert all(row.passed for row in results.rows)
    assert not any(row.timed or row.gflops or row.speedup for row in results.rows)
    assert "empty" in str(results)
