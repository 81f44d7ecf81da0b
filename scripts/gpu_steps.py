"""The GPU script's steps that run GPU code, built so that one bad kernel costs only its own rows.

scripts/gpu_check.sh calls them; each runs its pieces in child processes under their own
timeouts, because a hung kernel cannot be interrupted from Python and a faulting one poisons
its process's CUDA context for every later launch:

    python scripts/gpu_steps.py smoke   --out DIR [--timeout S]
    python scripts/gpu_steps.py compare --out DIR [--part PART | --group NAME:IMPLS:SHAPES:DTYPES[:WEIGHTS] ...]
                                        [--budget S] [--task-timeout S] [--prior ROWS.jsonl ...]
    python scripts/gpu_steps.py merge   --out DIR [--plot] ROWS.jsonl ...
    python scripts/gpu_steps.py tests   --out DIR [--budget S] [--test-timeout S] [--first PATTERN ...]
                                        [--loader NAME|auto] TESTS...

smoke    Each kernel that has never run on a GPU, at one shape that wraps its pipeline ring
         and gives its persistent blocks uneven numbers of tiles, alone in a process: ok,
         WRONG (the check failed), FAULT (an error, the message kept) or HUNG (killed at its
         timeout, with the phase it had reached). A pipelined kernel that hung is tried once
         more, built to report how far its producer and consumers got (cuda/progress.h).
         smoke.json and smoke.txt.
compare  One part of the plan (default_groups: the GPU script runs "decode", then "comparison",
         then, after the correctness tests, "rest"), in groups of one process each; a
         kernel the smoke step found hung or faulting is skipped. A group's process makes each
         problem's inputs once (one W per shape for every weight format, the float64 reference
         on the GPU: SharedProblem) and appends each implementation's row to rows.jsonl as soon
         as it is measured. A row that takes longer than --task-timeout is a hang: the process
         is killed, the row says so, and the group goes on in a new process without that
         implementation. comparison.json and .csv (with the --prior steps' rows: the speedups
         need the baseline's) are rewritten whole after every group, so a run cut anywhere keeps
         what finished; groups.txt says how each group ended, and each group's log what its
         host-side setup cost.
merge    comparison.json and .csv from the rows.jsonl of several compare steps (the verdicts'
         input), optionally with the plot.
tests    pytest with a timeout per test: the tests matching --first (the never-run kernels)
         before the rest; with --loader, the tests of one CUDA loader only; a test that hangs is
         recorded and pytest restarted past it; every failure and hang named in tests-summary.txt.

The dry run (tests/test_gpu_check_dry_run.py) replaces the GPU with CPU implementations through
--kernels and --group (or GPU_STEPS_PLAN, a plan for every part), and
GPU_STEPS_STAND_IN="name=hang,name=fault" makes a child process stand in a hang or a fault when
it reaches that implementation ("crash": a fault that kills the process; "hang-detached": a hang
that has also started a process of its own session, as a compiler or a server would, which only
the GPU script's sweep can find). It
also times each group's host-side setup here (host_setup_seconds) to check that the plan fits.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAND_IN_ENV = "GPU_STEPS_STAND_IN"
PLAN_ENV = "GPU_STEPS_PLAN"  # JSON {part: ["NAME:IMPLS:SHAPES:DTYPES[:WEIGHTS]", ...]}: replaces default_groups

# Never run on a GPU before (cuda.mma, cuda.wgmma and triton.matmul_tma). The smoke shape:
# 2048 x 4096 is 16 x 16 = 256 tiles of 128 x 256 on 132 SMs (124 persistent blocks take two
# tiles, 8 take one), and K = 1024 is 16 steps of 64, four turns of a four-stage ring.
NEVER_RUN = ["cuda.wgmma", "cuda.mma", "triton.matmul_tma"]
SMOKE_SHAPE = "2048x4096x1024"
SMOKE_DTYPE = "bfloat16"

GEMM_SHAPES = ["4096", "8192"]
GEMV_SHAPES = ["1x16384x16384"]
ALL_DTYPES = ["float32", "bfloat16", "float16"]
# Decode: X [M, K] float32 times W [N, K] in each format, W at least 100 MB in q4_0 (151 and 132
# MB), so the L2 (50-60 MB) cannot hold it; "float32" is the plain product (cuBLAS's FP32 GEMV),
# and cuBLAS's BF16 GEMV (torch.matmul on bfloat16 weights) is the plain bfloat16 problem at the
# same shapes. Then batched decode at one of them, in q4_0 (BATCH_SHAPES).
DECODE_SHAPES = ["1x16384x16384", "1x28672x8192"]
FLOAT_WEIGHTS = "float32"  # a decode problem's unquantized weights: the plain product (harness.run.compare)
DECODE_WEIGHTS = ["q4_0", "q8_0", "bf16", "q4_K", FLOAT_WEIGHTS]  # in order of value: the verdicts judge q4_0
BATCH_SHAPES = ["4x28672x8192", "16x28672x8192"]  # the 4- and 16-row tiles of cuda/decode.cu
# q4_K, no verdict's and never measured on a GPU, at one of the decode shapes (W 132 MB): its host
# side (llama.cpp's quantizer, in NumPy) takes about a minute a shape on the development machine,
# so it is a group of its own, after the decode rows that fit the plan (NEW_WEIGHTS_SHAPES).
NEW_WEIGHTS = ["q4_K"]
NEW_WEIGHTS_SHAPES = ["1x28672x8192"]

# The GPU script's comparison steps, in the order it runs them: the decode rows the verdicts
# judge first (never measured yet), then the never-run GEMM kernels beside their baseline, then
# (after the correctness tests) the other decode problems and what an H200 has measured before.
PARTS = ("decode", "comparison", "rest")


class Group(NamedTuple):
    """One process of the comparison: every implementation at every shape, dtype and weight
    format (``weights``: decode problems; [] for a plain matmul), problem by problem, each
    problem's inputs made once for all its rows."""

    name: str
    impls: list[str]
    shapes: list[str]
    dtypes: list[str]
    weights: list[str]


def default_groups(part: str | None = None) -> list[Group]:
    """The groups of one part of the plan (all of them, in order, for None), in order of value,
    from the registry. Implementations that multiply the same inputs share a group (and so its
    inputs and references): a hang or a fault costs only that implementation's rows, since the
    group goes on in a new process without it (compare). In each problem the baseline comes
    first, our kernels before their peers. GPU_STEPS_PLAN replaces the plan (the dry run).

    decode           q4_0 at both decode shapes: cuda.decode, triton.decode, torch.int4_gpu,
                     and cuBLAS's FP32 product at the same shapes (every decode verdict)
    comparison       GEMM 4096 and 8192 in bfloat16: cuBLAS, then the never-run kernels (their
                     verdicts)
    rest             decode in q8_0 and bf16, batched decode (M = 4, 16) in q4_0, cuBLAS's BF16
                     GEMV at the decode shapes, decode in q4_K at 1x28672x8192; GEMV
                     1x16384x16384 (cuBLAS, cuda.gemv, triton.gemv); every GEMM in float32,
                     float16 and bfloat16 (cuBLAS first; the rows measured in an earlier step are
                     not measured again)
    """
    if os.environ.get(PLAN_ENV):
        plan = json.loads(os.environ[PLAN_ENV])
        return [parse_group(text) for name in (PARTS if part is None else [part]) for text in plan.get(name, [])]
    import harness

    gpu = [impl for impl in harness.implementations() if impl.device == "gpu" and not impl.baseline]
    baselines = [impl.name for impl in harness.implementations() if impl.device == "gpu" and impl.baseline]
    ours_first = sorted(gpu, key=lambda impl: impl.peer)
    q4_0 = [impl.name for impl in ours_first if "q4_0" in impl.weights]
    more = [w for w in DECODE_WEIGHTS if w not in ("q4_0", FLOAT_WEIGHTS, *NEW_WEIGHTS)]
    gemm = [impl.name for impl in gpu if impl.operation == "gemm" and not impl.weights]
    plan = {
        "decode": [Group("decode-q4_0", q4_0 + baselines, DECODE_SHAPES, ["float32"], ["q4_0", FLOAT_WEIGHTS])],
        "comparison": [Group("gemm-new", baselines + NEVER_RUN, GEMM_SHAPES, [SMOKE_DTYPE], [])],
        "rest": [
            Group(
                "decode-more",
                [i.name for i in ours_first if set(more) & set(i.weights)],
                DECODE_SHAPES,
                ["float32"],
                more,
            ),
            Group("decode-batch", q4_0, BATCH_SHAPES, ["float32"], ["q4_0"]),
            Group("decode-cublas-bf16", baselines, DECODE_SHAPES, ["bfloat16"], []),
            Group(
                "decode-q4_K",
                [i.name for i in ours_first if set(NEW_WEIGHTS) & set(i.weights)],
                NEW_WEIGHTS_SHAPES,
                ["float32"],
                NEW_WEIGHTS,
            ),
            Group("gemv", baselines + [i.name for i in gpu if i.operation == "gemv"], GEMV_SHAPES, ALL_DTYPES, []),
            Group("gemm", baselines + [n for n in gemm if n not in NEVER_RUN] + NEVER_RUN, GEMM_SHAPES, ALL_DTYPES, []),
        ],
    }
    return [group for name in (PARTS if part is None else [part]) for group in plan[name]]


# Seconds each group of the plan is expected to keep the GPU machine busy beyond its host-side
# setup (host_setup_seconds measures that): its process's start (Python, torch, the CUDA
# context: about 5 s), compiles (nvcc's cubins are cached by the compile step; Triton about 2 s
# a config), autotuning, the timed runs (min_time 0.1 s a row, the L2 flushed before each
# repeat: about 0.3 s a row), copies to the GPU and the float64 references there. Measured in
# the H200 run of 2026-12-04 (results/gpu/2026-12-04/: a group's whole time there less its host
# setup, 10-20 s), else estimated (the groups that did not run or finish there).
# tests/test_gpu_check_dry_run.py adds the host setup measured where it runs and checks that
# the plan fits the GPU script's deadline.
DEVICE_SECONDS = {
    "decode-q4_0": 95,  # 8 rows; killed at 102 s after its 7th, 20 s of it host setup
    "gemm-new": 25,  # 8 rows; triton.matmul_tma tunes 8 configs at 2 shapes (25 s in all)
    "decode-more": 45,  # 8 rows; triton.decode tunes 6 configs for each of 2 formats (62 s in all)
    "decode-batch": 30,  # 6 rows; triton.decode's rows kernel tunes up to 9 configs per shape (41 s)
    "decode-cublas-bf16": 12,  # 2 rows (17 s in all)
    "decode-q4_K": 20,  # 2 rows; triton.decode tunes 6 configs
    "gemv": 20,  # 8 rows; triton.gemv tunes per dtype
    "gemm": 90,  # 25 rows to measure (the rest refused, or measured by gemm-new); triton.matmul tunes per problem
}


# ---- shared pieces -------------------------------------------------------------------------
def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader, or a kill, never sees half)."""
    from harness.env import files

    files.write_text(path, text)


def stand_in(name: str) -> None:
    """In the dry run, behave as a hung or a faulting kernel would when ``name`` is reached."""
    wanted = dict(item.split("=", 1) for item in os.environ.get(STAND_IN_ENV, "").split(",") if "=" in item)
    behaviour = wanted.get(name)
    if behaviour == "hang-detached":
        # what a kernel's build or a compile server may leave: a process of its own session,
        # out of reach of any kill aimed at this one's group, that does not die with it either
        subprocess.Popen(["sleep", "3600"], start_new_session=True)
        behaviour = "hang"
    if behaviour == "hang":
        while True:  # a kernel that never finishes: nothing in Python can interrupt it either
            time.sleep(3600)
    if behaviour == "fault":
        raise RuntimeError(f"CUDA error: an illegal memory access was encountered ({name}, a stand-in)")
    if behaviour == "crash":  # a fault that takes the process with it
        os.kill(os.getpid(), signal.SIGSEGV)


PARENT_ENV = "GPU_STEPS_PARENT"
# The tests step runs the tests it names, whatever their tier (-m ""), one at a time on the one
# GPU, each under its own timeout: never in pytest-xdist workers, which the repository's addopts
# (-n auto) would otherwise start.
SERIAL = ["-m", ""] + (["-n", "0"] if importlib.util.find_spec("xdist") else [])


def run_child(
    command: list[str], timeout: float, log: Path, phase_file: Path | None = None, stall: float | None = None
) -> tuple[str, int | dict | None]:
    """Run ``command`` in its own process group, output appended to ``log``; ("done", code), or
    ("timeout", None) after killing the whole group (a child's own children included). The
    child dies with this process too (die_with_parent): its own group is out of reach of a kill
    aimed at ours. With ``stall``: a child that writes ``phase_file`` (write_phase) and stays
    more than ``stall`` seconds in a phase that is a row's is killed too: ("stalled", phase)."""
    with log.open("a") as out:
        child = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            env={**os.environ, PARENT_ENV: str(os.getpid())},
        )
        ends = time.monotonic() + max(timeout, 1)
        seen, since = None, time.monotonic()
        while True:
            try:
                return "done", child.wait(timeout=max(min(0.5, ends - time.monotonic()), 0.01))
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= ends:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return "timeout", None
            if stall is None or phase_file is None:
                continue
            phase = read_phase(phase_file)
            if phase != seen:
                seen, since = phase, now
            elif now - since > stall and phase.get("row"):
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return "stalled", phase


def read_phase(phase_file: Path) -> dict:
    try:
        return json.loads(phase_file.read_text())
    except (OSError, ValueError):
        return {}


def write_phase(phase_file: Path, **phase) -> None:
    """What a child is doing, for run_child's ``stall`` (a row's phase carries ``row``)."""
    write_whole(phase_file, json.dumps({**phase, "at": time.time()}))


def die_with_parent() -> None:
    """Called first by every child step (run_child): when the step that started it is killed (the
    GPU script's timeout kills the step's process group, which the child left), the kernel would
    otherwise go on holding the GPU through the next steps. Linux: the kernel sends SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.environ.get(PARENT_ENV) not in (None, str(os.getppid())):
        os._exit(1)  # the parent died before the line above took effect


def last_lines(path: Path, count: int = 3) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-count:])


# ---- smoke -----------------------------------------------------------------------------------
WRONG_EXIT, FAULT_EXIT = 1, 2


# The pipelined kernels that can report how far they got (cuda/progress.h): a second try at
# one that hung is built to, and says it (the first try is the build that is measured).
PROGRESS_KERNELS = ["cuda.wgmma", "cuda.mma"]
PROGRESS_ENV = "MATMUL_CUDA_PROGRESS"


def report_progress_before(seconds: float, prepared_ref: list) -> None:
    """In the child: shortly before the parent's timeout, print what the kernel reported (a
    hung synchronize never returns, but pinned host memory can still be read) and end."""

    def report():
        progress = getattr(prepared_ref[0], "progress", None) if prepared_ref else None
        if progress is None:
            print("progress: not recorded (this kernel has no progress build)", flush=True)
        else:
            words = [int(v) for v in progress.tolist()]
            print(
                f"progress: block 0's producer issued {words[0]} k-steps; its consumers finished "
                f"{words[1]} and {words[2]}",
                flush=True,
            )
        os._exit(HUNG_EXIT)

    timer = threading.Timer(max(seconds, 0.5), report)
    timer.daemon = True
    timer.start()


def smoke_one(name: str, shape: str, dtype: str, phase_file: Path, watch_seconds: float | None = None) -> int:
    """One kernel, one shape: 0 when correct, WRONG_EXIT when the check fails; an error
    propagates. With ``watch_seconds``, the kernel's progress report is printed then."""

    def phase(text: str) -> None:
        write_whole(phase_file, text)

    prepared_ref: list = []
    if watch_seconds is not None:
        report_progress_before(watch_seconds, prepared_ref)

    phase("importing the harness")
    import harness

    source = harness.lookup(name).source
    if harness.lookup(name).language == "triton" and source:
        from harness.backends import triton_kernels

        # One config, as the correctness tests take (MATMUL_TRITON_CHECK_MODE): whether the kernel
        # runs is the question here, and tuning matmul_tma's eight would cost its timeout.
        module = triton_kernels.load_source(source)
        if hasattr(module, "CHECK_MODE"):
            module.CHECK_MODE = True
    phase("making the inputs")
    a, b = harness.make_inputs(shape, dtype, seed=3)
    phase("preparing (compiling, copying to the GPU)")
    prepared = harness.get(name).prepare(a, b)
    prepared_ref.append(prepared)
    phase("running (launch and synchronize)")
    stand_in(name)
    prepared.run()
    phase("copying the result back")
    outcome = harness.check(prepared.result(), a, b)
    phase("checked")
    print(f"{name} at {shape} {dtype} ({prepared.mode}): {'ok' if outcome.passed else 'WRONG: ' + outcome.message}")
    return 0 if outcome.passed else WRONG_EXIT


def smoke(
    out: Path,
    kernels: list[str],
    shape: str,
    dtype: str,
    timeout: float,
    progress_kernels: list[str] = PROGRESS_KERNELS,
) -> int:
    results = {}
    for name in kernels:
        phase_file = out / f".phase-{name}"
        log = out / f"smoke-{name}.log"
        began = time.monotonic()
        ended, code = run_child(
            [sys.executable, __file__, "_smoke_one", name, shape, dtype, str(phase_file)], timeout, log
        )
        took = time.monotonic() - began
        reached = phase_file.read_text() if phase_file.exists() else "not started"
        phase_file.unlink(missing_ok=True)
        if ended == "timeout":
            verdict, detail = "HUNG", f"killed after {took:.0f}s while {reached}"
            if name in progress_kernels:
                detail += "; " + diagnose_hang(out, name, shape, dtype, timeout)
        elif code == 0:
            verdict, detail = "ok", f"{took:.1f}s"
        elif code == WRONG_EXIT:
            verdict, detail = "WRONG", last_lines(log, 1)
        else:
            verdict, detail = "FAULT", f"exit {code} while {reached}: {last_lines(log, 1)}"
        results[name] = {
            "verdict": verdict,
            "detail": detail,
            "shape": shape,
            "dtype": dtype,
            "seconds": round(took, 1),
        }
        print(f"smoke {name:20} {verdict:5} {detail}", flush=True)
        write_whole(out / "smoke.json", json.dumps(results, indent=2) + "\n")
    lines = [f"{name:20} {r['verdict']:5} {r['detail']}" for name, r in results.items()]
    write_whole(out / "smoke.txt", "\n".join(lines) + "\n")
    return 0 if all(r["verdict"] == "ok" for r in results.values()) else 1


def diagnose_hang(out: Path, name: str, shape: str, dtype: str, timeout: float) -> str:
    """Run a kernel that hung again, built to report its progress, and say how far it got."""
    log = out / f"smoke-{name}-progress.log"
    os.environ[PROGRESS_ENV] = "1"
    try:
        run_child(
            [
                sys.executable,
                __file__,
                "_smoke_one",
                name,
                shape,
                dtype,
                str(out / f".phase-{name}-progress"),
                str(max(timeout - 3, 1)),
            ],
            timeout,
            log,
        )
    finally:
        del os.environ[PROGRESS_ENV]
        (out / f".phase-{name}-progress").unlink(missing_ok=True)
    lines = (
        [line for line in log.read_text(errors="replace").splitlines() if line.startswith("progress:")]
        if log.exists()
        else []
    )
    return lines[-1] if lines else "progress: no report (the second try did not reach the kernel)"


# ---- compare ---------------------------------------------------------------------------------
# A group's process makes each problem once, whichever harness.compare call (one per
# implementation, so that each row is written as soon as it is measured) asks for it; and the
# float inputs of the current shape once for every weight format (SharedProblem).
_SHARED: dict = {}  # key (shape, dtype, seed), a, b and, once a format needs it, w = B^T
_PROBLEM: dict = {}  # key (shape, dtype, seed, format), problem
SETUP_TIMES: dict[str, float] = {}  # host seconds of the current problem's setup, by piece
REFERENCE = {"where": "auto"}  # "auto": on the GPU if one is here, else the host's; "skip": host_setup_seconds


def _timed(label: str, make):
    began = time.perf_counter()
    value = make()
    SETUP_TIMES[label] = SETUP_TIMES.get(label, 0.0) + time.perf_counter() - began
    return value


def shared_inputs(shape, dtype: str, seed: int):
    """harness.make_inputs(shape, dtype, seed), read-only, made once for the problems of a shape."""
    key = (str(shape), dtype, seed)
    if _SHARED.get("key") != key:
        from harness.model.inputs import make_inputs

        _SHARED.clear()
        a, b = _timed("inputs", lambda: make_inputs(shape, dtype, seed))
        a.flags.writeable = b.flags.writeable = False
        _SHARED.update(key=key, a=a, b=b)
    return _SHARED["a"], _SHARED["b"]


def shared_weights() -> np.ndarray:
    """W = B^T [N, K], C-contiguous (what quantize takes), of the current shape, made once for
    all its weight formats. torch's blocked transpose takes 0.8 s at 28672 x 8192 where NumPy's
    strided copy (np.ascontiguousarray(b.T)) took 12-20 s on a 2-core development machine."""
    if "w" not in _SHARED:
        b = _SHARED["b"]
        try:
            import torch
        except ImportError:
            w = _timed("W = B^T", lambda: np.ascontiguousarray(b.T))
        else:
            with warnings.catch_warnings():  # b is read-only; it is only read
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                w = _timed("W = B^T", lambda: torch.from_numpy(b).T.contiguous().numpy())
        w.flags.writeable = False
        _SHARED["w"] = w
    return _SHARED["w"]


def _float64_tensor(array: np.ndarray, device: str):
    """``array`` on ``device`` as float64, sent in its own precision (BF16 through int16)."""
    import torch

    array = np.ascontiguousarray(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        if array.dtype.name == "bfloat16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        return tensor.to(device).to(torch.float64)


class DeviceReference:
    """A @ B in float64 and its terms' norm (the two arrays of checking.Reference), computed on
    ``device``, where results are checked (checking.compare_elements, as gpu.DeviceProblem
    does), with an activation rounding's allowance where a row needs one. B may be the
    transposed view of a C-contiguous W [N, K] (a decode problem's weights): W is sent as it is
    and transposed there, since a host transpose of 235 million floats takes seconds."""

    def __init__(self, a: np.ndarray, b: np.ndarray, device: str = "cuda"):
        import torch

        self.k, self.dtype, self.device = a.shape[1], a.dtype, device
        a64 = _float64_tensor(a, device)
        transposed = b.T.flags.c_contiguous and not b.flags.c_contiguous
        b64 = _float64_tensor(b.T, device).T if transposed else _float64_tensor(b, device)
        self.product = a64 @ b64
        self.terms_norm = torch.sqrt((a64 * a64) @ (b64 * b64))

    def check(self, result: np.ndarray, extra: np.ndarray | None = None):
        import torch

        from harness.model.checking import CheckOutcome, compare_elements

        result = np.asarray(result)
        expected = tuple(self.product.shape)
        if result.shape != expected:
            return CheckOutcome(False, float("inf"), f"result shape {result.shape}, expected {expected}")
        if result.dtype != self.dtype:
            return CheckOutcome(
                False, float("inf"), f"result dtype {result.dtype.name}, expected the problem's {self.dtype.name}"
            )
        if result.size == 0:
            return CheckOutcome(True, 0.0, "empty result")
        got = _float64_tensor(result, self.device)
        allowance = None if extra is None else _float64_tensor(extra, self.device)
        return compare_elements(torch, got, self.product, self.terms_norm, result.dtype, self.k, allowance)


@functools.lru_cache(maxsize=None)
def shared_problem_class():
    """SharedProblem, made when first needed (the harness is imported by the child steps only)."""
    from harness.backends import gpu
    from harness.model.checking import reference_data
    from harness.run.compare import _Problem

    class SharedProblem(_Problem):
        """harness.compare's problem (harness/run/compare.py's _Problem: the same seeded inputs,
        quantized weights, checks and input guard), made as a GPU run can afford: the float
        inputs of a shape once for every weight format (shared_inputs, shared_weights), and the
        float64 reference on the GPU whatever the problem's size (DeviceReference), where the
        host's took 4-8 s per decode problem. At 1 x 28672 x 8192 in q4_0 that is 10-12 s of
        host time instead of 24-35 s, and 4-5 s for each further format at that shape."""

        def _make_inputs(self):
            if self._inputs is not None:  # made again by _Problem.written: a row wrote into them
                _SHARED.clear()
            a, b = shared_inputs(self.shape, self.dtype, self.seed)
            if not self.quantized:
                self._float_b = b
                return a, b
            from harness.model.quant import quantize

            w = _timed(f"quantize {self.weights}", lambda: quantize(shared_weights(), self.weights))
            self._float_b = _timed("dequantize", w.dequantize).T
            return a, w

        @property
        def inputs(self):
            if self._inputs is None:
                self._inputs = self._make_inputs()
                # before any row runs, as _Problem's: nothing can have touched what it is made from
                self._reference = self._make_reference(self._inputs[0])
            return self._inputs

        def _make_reference(self, a):
            if REFERENCE["where"] == "skip":
                return None
            if "gpu" in self.devices and gpu.available():
                return _timed("reference (GPU)", lambda: DeviceReference(a, self._float_b))
            return _timed("reference (host)", lambda: reference_data(a, self._float_b))

        def allowance(self, activation_rounding: str | None):
            """The extra error allowed a row that rounds X (activation_error.py), on the host."""
            if activation_rounding is None:
                return None
            from harness.model.activation_error import extra_allowed

            a = self.inputs[0]
            return _timed(
                f"{activation_rounding} allowance", lambda: extra_allowed(a, self._float_b, activation_rounding)
            )

        def check(self, result, activation_rounding=None):
            self.inputs  # noqa: B018 - the reference is made with the inputs
            if isinstance(self._reference, DeviceReference):
                return self._reference.check(result, self.allowance(activation_rounding))
            return super().check(result, activation_rounding)

    return SharedProblem


def shared_problem(shape, dtype: str, seed: int, devices: list[str], weights: str | None = None):
    """Installed as harness.run.compare._Problem in a group's process (compare_group): the same
    SharedProblem for every harness.compare call that asks for the same problem."""
    key = (str(shape), dtype, seed, weights)
    if _PROBLEM.get("key") != key:
        _PROBLEM.clear()
        _PROBLEM.update(key=key, problem=shared_problem_class()(shape, dtype, seed, devices, weights=weights))
    return _PROBLEM["problem"]


def belongs(impl, fmt: str | None) -> bool:
    """Whether ``impl`` gets a row in a group's problems of weight format ``fmt`` (None: a plain
    matmul, where a decode kernel named in the group gets a row that says why it cannot run)."""
    if fmt is None:
        return True
    if fmt == FLOAT_WEIGHTS:
        return not impl.weights
    return fmt in impl.weights


def takes(impl, shape, dtype: str, fmt: str | None) -> bool:
    """Whether ``impl`` runs the problem on its own device: harness.model.core.check_problem's
    questions, its limits for CPU stand-ins and memory aside. A row that cannot is refused
    before it needs the problem's inputs."""
    if dtype not in impl.dtypes or (impl.weights and fmt in (None, FLOAT_WEIGHTS)):
        return False
    if impl.operation == "gemv" and shape.m != 1:
        return False
    if impl.multiple_of > 1 and any(d % impl.multiple_of for d in shape):
        return False
    if impl.max_flops is not None and shape.flops > impl.max_flops:  # (unless allow_slow: not in a GPU run)
        return False
    try:
        return not impl.backend.shape_problem(impl, shape)
    except Exception:  # the row will say what is wrong
        return False


def group_tasks(group: Group):
    """(shape, dtype, weight format or None, implementations) in the order a group runs them:
    shapes outermost, so that the inputs of a shape, and its W, serve every format."""
    import harness
    from harness.model.inputs import dtype_name, parse_shape

    for shape in group.shapes:
        for dtype in group.dtypes:
            for fmt in group.weights or [None]:
                names = [name for name in group.impls if belongs(harness.lookup(name), fmt)]
                if names:
                    yield parse_shape(shape), dtype_name(dtype), fmt, names


def problem_text(shape, dtype: str, fmt: str | None) -> str:
    return f"{shape} {dtype}{' ' + fmt if fmt else ''}"


def append_rows(rows_file: Path, rows, machine: dict, settings: dict) -> None:
    """Append ``rows`` to ``rows_file`` for good (flushed and synced: a kill a moment later keeps them)."""
    from dataclasses import asdict

    from harness.run.results import finite_or_null

    with rows_file.open("a") as handle:
        for row in rows:
            record = finite_or_null({"row": asdict(row), "machine": machine, "settings": settings})
            handle.write(json.dumps({**record, "written": time.time()}, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_records(rows_file: Path) -> list[dict]:
    lines = rows_file.read_text().splitlines() if rows_file.exists() else []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a process killed while writing it
            continue
    return records


def rows_done(rows_file: Path) -> set[tuple]:
    """(implementation, shape, dtype, weight format) of every row in ``rows_file``."""
    return {
        (r["row"]["implementation"], r["row"]["shape"], r["row"]["dtype"], r["row"]["weights"])
        for r in read_records(rows_file)
    }


RESTART_EXIT = 75  # a group's process ends after a row that raised: the group goes on in a new one


def compare_group(spec: dict) -> int:
    """In a group's process: check and time each implementation of the group ``spec`` (a
    Group's fields, with rows, prior, phase, min_time and skip) at every problem, one
    harness.compare call per implementation, each row appended to the rows file as soon as it
    is measured. A row already in the rows file or a prior one (this group's earlier process,
    an earlier step) is not measured again; an implementation in ``skip`` gets a row that says
    why, and is not run. After a row that raised (an error or a crash) the process ends
    (RESTART_EXIT): a fault can leave its CUDA context unusable for every row after it."""
    import harness
    from harness.model.errors import MatmulInputError
    from harness.run import compare as comparing
    from harness.run import machine
    from harness.run.results import Row

    shared_problem_class()  # (made from compare's own _Problem, before this replaces it)
    comparing._Problem = shared_problem
    group = Group(*(spec[field] for field in Group._fields))
    rows_file, phase_file, skip = Path(spec["rows"]), Path(spec["phase"]), spec.get("skip", {})
    done = set().union(*(rows_done(Path(f)) for f in [rows_file, *spec.get("prior", [])]))
    # What harness.compare measures once per process (the clock, the FMA and read roofs: a second
    # or more, several on a busy host) is measured here, outside the first row's time limit.
    write_phase(phase_file, setup="the machine's description")
    machine.machine_info()
    for shape, dtype, fmt, names in group_tasks(group):
        todo = [name for name in names if (name, str(shape), dtype, fmt) not in done]
        text = problem_text(shape, dtype, fmt)
        SETUP_TIMES.clear()
        live = [harness.lookup(name) for name in todo if name not in skip]
        if any(takes(impl, shape, dtype, fmt) and impl.availability()[0] is None for impl in live):
            write_phase(phase_file, setup=text)
            problem = shared_problem(shape, dtype, 0, [impl.device for impl in live], fmt)
            try:
                problem.inputs  # noqa: B018 - made here, outside any row's time limit
            except MatmulInputError:
                pass  # each row says why
        for name in todo:
            impl = harness.lookup(name)
            if name in skip:
                row = Row(name, impl.language, impl.device, str(shape), dtype, f"skipped: {skip[name]}", weights=fmt)
                append_rows(rows_file, [row], {}, {})
                continue
            task = [name, str(shape), dtype, fmt]
            write_phase(phase_file, row=task)
            try:
                stand_in(name)
            except RuntimeError as error:  # the dry run's fault, as harness.compare reports a real one
                rows = [Row(name, impl.language, impl.device, str(shape), dtype, f"error: {error}", weights=fmt)]
                machine, settings = {}, {}
            else:
                results = harness.compare(
                    [shape],
                    [name],
                    [dtype],
                    threads=None,
                    min_time=spec["min_time"],
                    baselines=False,
                    weights=[fmt] if fmt else None,
                )
                rows, machine, settings = results.rows, results.machine, results.settings
            append_rows(rows_file, rows, machine, settings)
            print(f"{name} {text}: " + ", ".join(r.status for r in rows), flush=True)
            raised = [r.status for r in rows if r.status.startswith(("error", "crashed"))]
            if raised:
                write_phase(phase_file, restart=task, status=raised[0])
                return RESTART_EXIT
        if SETUP_TIMES:
            pieces = ", ".join(f"{label} {seconds:.1f}s" for label, seconds in SETUP_TIMES.items())
            print(f"host setup of {text}: {pieces} (total {sum(SETUP_TIMES.values()):.1f}s)", flush=True)
    write_phase(phase_file, finished=True)
    return 0


def host_setup_seconds(group: Group, scale: int = 1) -> dict[str, float]:
    """{problem: seconds} the host spends on ``group``'s problems in a GPU run, measured here,
    through the code that run uses: each problem's SharedProblem (the inputs, W = B^T, the
    quantized and dequantized weights; not the reference, which the GPU computes), and for each
    of its rows the input guard's three digests (harness.run.compare: before the row, after its
    check, after its timing) and the allowance of a row that rounds X. With ``scale``, at shapes
    whose N (and M, where above 16) are divided by ``scale``, the seconds multiplied by it:
    every piece is linear in the number of elements. Not counted: what the implementations'
    prepare does on the host (repacking, copies to the GPU), with their compiles and timing."""
    import harness
    from harness.model.inputs import Shape

    REFERENCE["where"] = "skip"
    seconds: dict[str, float] = {}

    # CPU seconds of this process, not wall time: another job on a shared machine stretches the
    # wall time of the same work (this measures what the work costs, the plan's question).
    def setup(shape, dtype, fmt, rows) -> float:
        began = time.process_time()
        problem = shared_problem(shape, dtype, 0, ["gpu"], fmt)
        problem.inputs  # noqa: B018
        for impl in rows:
            problem.row_inputs()
            problem.written()
            problem.written()
            problem.allowance(impl.rounding_for(fmt))
        return time.process_time() - began

    try:
        tasks = []
        for shape, dtype, fmt, names in group_tasks(group):
            rows = [harness.lookup(name) for name in names if takes(harness.lookup(name), shape, dtype, fmt)]
            if rows:
                tasks.append((shape, dtype, fmt, rows))
        # Each piece's first call costs a second or more once per process (imports, NumPy's
        # first use of a routine): paid first at a tiny shape, so that it is not multiplied.
        for shape, dtype, fmt, rows in tasks:
            setup(Shape(min(shape.m, 2), 8, shape.k), dtype, fmt, rows)
        for shape, dtype, fmt, rows in tasks:
            small = Shape(shape.m if shape.m <= 16 else max(1, shape.m // scale), max(1, shape.n // scale), shape.k)
            seconds[problem_text(shape, dtype, fmt)] = setup(small, dtype, fmt, rows) * scale
    finally:
        REFERENCE["where"] = "auto"
        _SHARED.clear()
        _PROBLEM.clear()
    return seconds


def lost_row(name: str, shape: str, dtype: str, fmt: str | None, status: str):
    """The row of a task whose process was lost with it."""
    import harness
    from harness.run.results import Row

    impl = harness.lookup(name)
    return Row(name, impl.language, impl.device, shape, dtype, status, weights=fmt)


def timed_out_row(name: str, shape: str, dtype: str, fmt: str | None, seconds: float):
    status = (
        f"timed out: no result after {seconds:.0f}s at {problem_text(shape, dtype, fmt)} (hung, or far too slow); "
        "killed with its group's process, which went on without it"
    )
    return lost_row(name, shape, dtype, fmt, status)


def crashed_row(name: str, shape: str, dtype: str, fmt: str | None, code: int, last_line: str):
    status = f"crashed: its group's process died (exit {code}) at {problem_text(shape, dtype, fmt)}: {last_line}"
    return lost_row(name, shape, dtype, fmt, status[:300])


def merge_rows(out: Path, rows_files: list[Path]) -> int:
    """comparison.json and .csv in ``out`` from every row written so far to ``rows_files``; the
    number of rows."""
    from harness.run.results import Results, Row, fill_speedups

    rows, machine, settings = [], {}, {}
    fields = set(Row.__dataclass_fields__)
    for rows_file in dict.fromkeys(Path(f).resolve() for f in rows_files):
        for record in read_records(rows_file):
            rows.append(Row(**{k: v for k, v in record["row"].items() if k in fields}))
            if "gpu" in record["machine"] or not machine:
                machine = record["machine"]
            settings = settings or record["settings"]
    fill_speedups(rows)
    results = Results(rows, machine, settings)
    for suffix, writer in (("json", results.to_json), ("csv", results.to_csv)):
        staging = out / f".comparison.{suffix}.partial"
        writer(staging)
        os.replace(staging, out / f"comparison.{suffix}")
    return len(rows)


def parse_group(text: str) -> Group:
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(f"--group {text!r}: expected NAME:IMPL,...:SHAPE,...:DTYPE,...[:WEIGHTS,...]")
    name, impls, shapes, dtypes = parts[:4]
    weights = parts[4].split(",") if len(parts) == 5 and parts[4] else []
    return Group(name, impls.split(","), shapes.split(","), dtypes.split(","), weights)


# Of a step's budget, at most, for any group but the last: a row that hangs costs only the task
# timeout (the group goes on without it), so this bounds only a group slow throughout.
GROUP_SHARE = 0.6


def condemned_by_smoke(smoke_json: Path | None) -> dict:
    """The kernels the smoke step found hung or faulting: running them again would only cost
    the time of their timeout, or poison the process."""
    if not smoke_json or not smoke_json.exists():
        return {}
    return {k: v for k, v in json.loads(smoke_json.read_text()).items() if v["verdict"] in ("HUNG", "FAULT")}


def compare(
    out: Path,
    groups: list[Group],
    budget: float,
    min_time: float,
    plot: bool,
    smoke_json: Path | None,
    group_timeout: float | None = None,
    task_timeout: float | None = None,
    prior: list[Path] | None = None,
) -> int:
    ends = time.monotonic() + budget
    condemned = {name: {**v, "where": "the smoke step"} for name, v in condemned_by_smoke(smoke_json).items()}
    for record in (r for f in prior or [] for r in read_records(f)):  # a hang costs its timeout once only
        row = record["row"]
        if row["status"].startswith(("timed out", "crashed")) and row["implementation"] not in condemned:
            verdict = "HUNG" if row["status"].startswith("timed out") else "CRASHED"
            condemned[row["implementation"]] = {"verdict": verdict, "detail": row["status"], "where": "a comparison"}
    status, report = 0, []
    rows_file = out / "rows.jsonl"
    for index, group in enumerate(groups):
        left = ends - time.monotonic()
        skipped = [impl for impl in group.impls if impl in condemned]
        impls = [impl for impl in group.impls if impl not in condemned]
        for impl in skipped:
            why = condemned[impl]
            report.append(f"{impl:20} skipped: {why['verdict']} in {why['where']} ({why['detail'][:150]})")
            status = 1
        if not impls:
            continue
        if left < 5:
            report.append(f"{group.name:20} skipped for time ({left:.0f}s left)")
            status = 1
            continue
        # The last group may use all that is left; the others at most a share of the budget,
        # so a group that hangs past the smoke test still leaves time for the ones after it.
        last = index == len(groups) - 1
        timeout = left if last else min(left, group_timeout or max(30.0, GROUP_SHARE * budget))
        began = time.monotonic()
        group_ends = began + timeout
        log, phase_file = out / f"compare-{group.name}.log", out / f".phase-{group.name}"
        left_out: dict[str, str] = {}  # implementations that hung or raised, and why
        while True:
            spec = {
                **group._asdict(),
                "impls": impls,
                "rows": str(rows_file),
                "prior": [str(f) for f in prior or []],
                "phase": str(phase_file),
                "min_time": min_time,
                "skip": left_out,
            }
            command = [sys.executable, __file__, "_compare_group", json.dumps(spec)]
            ended, code = run_child(command, group_ends - time.monotonic(), log, phase_file, task_timeout)
            if ended == "stalled":
                # A row past its limit: that implementation hung (or is far too slow to be worth
                # its time). Its row says so, and the group goes on in a new process without it.
                name, shape, dtype, fmt = code["row"]
                text = problem_text(shape, dtype, fmt)
                why = f"timed out at {text}"
                if (name, shape, dtype, fmt) not in rows_done(rows_file):  # (it may have ended just before the kill)
                    append_rows(rows_file, [timed_out_row(name, shape, dtype, fmt, task_timeout)], {}, {})
                report.append(f"{group.name:20} {name} timed out after {task_timeout:.0f}s at {text}: left out")
            elif ended == "done" and code == RESTART_EXIT:
                phase = json.loads(phase_file.read_text())
                name, shape, dtype, fmt = phase["restart"]
                text = problem_text(shape, dtype, fmt)
                why = f"raised at {text}"
                report.append(f"{group.name:20} {name} raised at {text}: left out ({phase['status'][:150]})")
            elif ended == "done" and code != 0 and "row" in (phase := read_phase(phase_file)):
                # the process died in a row (a signal, an abort): that row's implementation again
                name, shape, dtype, fmt = phase["row"]
                text = problem_text(shape, dtype, fmt)
                why = f"crashed at {text}"
                append_rows(rows_file, [crashed_row(name, shape, dtype, fmt, code, last_lines(log, 1))], {}, {})
                report.append(f"{group.name:20} {name} crashed (exit {code}) at {text}: left out")
            else:
                break
            left_out[name] = f"{name} {why} earlier in its group"
            status = 1
            if group_ends - time.monotonic() < 5:
                ended = "timeout"
                break
        phase_file.unlink(missing_ok=True)
        took = time.monotonic() - began
        if ended == "timeout":
            outcome = f"killed after {took:.0f}s (hung, or out of time): {last_lines(log, 1)}"
            status = 1
        elif code == 0:
            outcome = f"ok after {took:.0f}s"
        else:
            outcome = f"failed (exit {code}) after {took:.0f}s: {last_lines(log, 1)}"
            status = 1
        count = merge_rows(out, [*(prior or []), rows_file])
        report.append(f"{group.name:20} {outcome}")
        print(f"compare {group.name}: {outcome}; {count} rows so far", flush=True)
        write_whole(out / "groups.txt", "\n".join(report) + "\n")
    write_whole(out / "groups.txt", "\n".join(report) + "\n")
    if not (out / "comparison.json").exists():
        merge_rows(out, [*(prior or []), rows_file])
    if plot:
        plot_comparison(out)
    return status


def plot_comparison(out: Path) -> None:
    from harness.run.compare import Results

    Results.from_json(out / "comparison.json").plot(out / "comparison.png")


# ---- tests -----------------------------------------------------------------------------------
OUTCOMES = ("PASSED", "FAILED", "SKIPPED", "HUNG")
HUNG_EXIT = 124


def absolute_id(item) -> str:
    """A test's node id with its file as an absolute path: the same whatever folder pytest
    starts in or takes as its root."""
    return f"{item.path}::{item.nodeid.split('::', 1)[1]}"


class TimeoutPlugin:
    """Loaded into pytest by ``tests``: logs each test as it starts and ends, and ends the
    process when one runs past its timeout (a hung kernel cannot be interrupted otherwise)."""

    def __init__(self, log: Path, timeout: float):
        self.log, self.timeout = log, timeout
        self.timer: threading.Timer | None = None

    def _write(self, text: str) -> None:
        with self.log.open("a") as handle:
            handle.write(text + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def pytest_runtest_protocol(self, item, nextitem):
        self._write(f"START {absolute_id(item)}")
        self.timer = threading.Timer(self.timeout, self._expire, args=(absolute_id(item),))
        self.timer.daemon = True
        self.timer.start()

    def _expire(self, test_id):
        self._write(f"HUNG {test_id} (killed after {self.timeout:.0f}s)")
        os._exit(HUNG_EXIT)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        if report.when == "call" or report.outcome != "passed":
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
            message = " ".join(str(crash or report.longrepr).split())[:300] if report.failed else ""
            self._write(f"{report.outcome.upper()} {absolute_id(item)} {message}".rstrip())

    def pytest_runtest_logfinish(self, nodeid, location):
        if self.timer:
            self.timer.cancel()


class Collector:
    def __init__(self):
        self.ids: list[tuple[str, str | None]] = []  # (test id, the CUDA loader it runs with, if any)

    def pytest_collection_modifyitems(self, items):
        self.ids = [
            (absolute_id(item), getattr(item, "callspec", None) and item.callspec.params.get("loader"))
            for item in items
        ]


def default_loader() -> str | None:
    """The CUDA loader the harness uses in this environment (the comparison's), None if none is here."""
    from harness.backends.cuda import loaders

    forced = os.environ.get(loaders.LOADER_ENV, "").strip().lower()
    return forced or next((name for name in loaders.LOADERS if loaders.loader_unavailable_reason(name) is None), None)


def collect(tests: list[str]) -> tuple[list[str], dict[str, str | None], str | None]:
    """(test ids, {test id: its loader parameter}, the loader the harness uses here)."""
    done = subprocess.run([sys.executable, __file__, "_collect", *tests], cwd=ROOT, capture_output=True, text=True)
    found = [json.loads(line[3:]) for line in done.stdout.splitlines() if line.startswith("ID ")]
    used = next((line[7:] or None for line in done.stdout.splitlines() if line.startswith("LOADER ")), None)
    return [test_id for test_id, _ in found], dict(map(tuple, found)), used


def run_tests(
    out: Path, tests: list[str], first: list[str], budget: float, test_timeout: float, loader: str | None = None
) -> int:
    ends = time.monotonic() + budget
    ids, loader_of, used = collect(tests)
    if not ids:
        write_whole(out / "tests-summary.txt", f"no tests collected from {' '.join(tests)}\n")
        return 1
    # One loader: the CUDA kernels are the same through either, and the comparison's rows came
    # through this one; the other's tests would double the CUDA tests' time.
    keep = used if loader == "auto" else loader
    left_out = [i for i in ids if keep and loader_of.get(i) not in (None, keep)]
    ids = [i for i in ids if i not in left_out]
    ordered = [i for i in ids if any(p in i for p in first)] + [i for i in ids if not any(p in i for p in first)]
    log = out / "tests.log"
    log.write_text("")
    finished: dict[str, str] = {}  # nodeid -> outcome line
    runs = 0
    while True:
        remaining = [i for i in ordered if i not in finished]
        left = ends - time.monotonic()
        if not remaining or left < 5:
            break
        runs += 1
        command = [
            sys.executable,
            __file__,
            "_pytest",
            str(log),
            str(test_timeout),
            "--junitxml",
            str(out / f"tests-{runs}.xml"),
            *remaining,
        ]
        ended, code = run_child(command, left, out / "tests-output.txt")
        for line in log.read_text().splitlines():
            word, _, rest = line.partition(" ")
            nodeid = rest.split(" ", 1)[0]
            # A test's last word counts (a teardown failure after a pass), but a failure stays one.
            if word in OUTCOMES and not finished.get(nodeid, "").startswith("FAILED"):
                finished[nodeid] = line
        if ended == "timeout":
            break
        if code != HUNG_EXIT:  # pytest got through the list, passing or not
            break
    counts: dict[str, int] = {}
    for line in finished.values():
        counts[line.split(" ", 1)[0]] = counts.get(line.split(" ", 1)[0], 0) + 1
    not_run = [i for i in ordered if i not in finished]
    lines = [
        f"{len(ids)} tests, {runs} pytest run(s): "
        + ", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items()))
        + (f", {len(not_run)} not run (out of time)" if not_run else "")
        + (f"; {len(left_out)} of another CUDA loader than {keep} left out" if left_out else "")
    ]
    lines += [line.replace(f"{ROOT}{os.sep}", "") for line in finished.values() if line.startswith(("FAILED", "HUNG"))]
    write_whole(out / "tests-summary.txt", "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    bad = any(line.startswith(("FAILED", "HUNG")) for line in finished.values())
    return 1 if bad or not_run else 0


# ---- the command line ------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    if argv and argv[0].startswith("_"):  # a child step
        die_with_parent()
    if argv and argv[0] == "_smoke_one":
        try:
            return smoke_one(argv[1], argv[2], argv[3], Path(argv[4]), float(argv[5]) if len(argv) > 5 else None)
        except Exception:  # a fault, a compile error: told apart from a wrong result (exit 1)
            import traceback

            traceback.print_exc()
            return FAULT_EXIT
    if argv and argv[0] == "_compare_group":
        return compare_group(json.loads(argv[1]))
    if argv and argv[0] == "_collect":
        collector = Collector()
        pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *SERIAL, *argv[1:]], plugins=[collector])
        print("".join(f"ID {json.dumps(found)}\n" for found in collector.ids))
        print(f"LOADER {default_loader() or ''}")
        return 0
    if argv and argv[0] == "_pytest":
        return pytest.main(
            ["-q", "-p", "no:cacheprovider", *SERIAL, *argv[3:]],
            plugins=[TimeoutPlugin(Path(argv[1]), float(argv[2]))],
        )

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    smoke_parser = commands.add_parser("smoke")
    smoke_parser.add_argument("--kernels", nargs="+", default=NEVER_RUN)
    smoke_parser.add_argument("--shape", default=SMOKE_SHAPE)
    smoke_parser.add_argument("--dtype", default=SMOKE_DTYPE)
    smoke_parser.add_argument("--timeout", type=float, default=40, help="seconds per kernel, compile included")
    smoke_parser.add_argument(
        "--progress-kernels",
        nargs="*",
        default=PROGRESS_KERNELS,
        help="kernels tried again, built to report their progress, when they hang",
    )
    compare_parser = commands.add_parser("compare")
    plan = compare_parser.add_mutually_exclusive_group()
    plan.add_argument("--part", choices=PARTS, help="one part of default_groups (default: all of them)")
    plan.add_argument("--group", type=parse_group, action="append", dest="groups")
    compare_parser.add_argument("--budget", type=float, default=200)
    compare_parser.add_argument("--min-time", type=float, default=0.1)
    compare_parser.add_argument("--plot", action="store_true", help="comparison.png at the end")
    compare_parser.add_argument(
        "--group-timeout",
        type=float,
        help=f"seconds for any group but the last (default {GROUP_SHARE:.0%} of the budget, at least 30)",
    )
    compare_parser.add_argument(
        "--task-timeout", type=float, help="seconds for one row (compile and tuning included): past them, a hang"
    )
    compare_parser.add_argument(
        "--prior", type=Path, nargs="*", default=[], help="rows.jsonl of earlier compare steps, merged into the JSON"
    )
    compare_parser.add_argument(
        "--smoke", type=Path, help="the smoke step's smoke.json: its hung and faulting kernels are skipped"
    )
    merge_parser = commands.add_parser("merge")
    merge_parser.add_argument("rows", type=Path, nargs="+", help="rows.jsonl files (missing ones are passed over)")
    merge_parser.add_argument("--plot", action="store_true")
    tests_parser = commands.add_parser("tests")
    tests_parser.add_argument("tests", nargs="+")
    tests_parser.add_argument("--first", nargs="*", default=[])
    tests_parser.add_argument("--budget", type=float, default=150)
    tests_parser.add_argument("--test-timeout", type=float, default=60)
    tests_parser.add_argument(
        "--loader", help="only this CUDA loader's tests of those parametrized by one ('auto': the harness's choice)"
    )
    for sub in (smoke_parser, compare_parser, merge_parser, tests_parser):
        sub.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "smoke":
        return smoke(args.out, args.kernels, args.shape, args.dtype, args.timeout, args.progress_kernels)
    if args.command == "compare":
        return compare(
            args.out,
            args.groups or default_groups(args.part),
            args.budget,
            args.min_time,
            args.plot,
            args.smoke,
            args.group_timeout,
            args.task_timeout,
            args.prior,
        )
    if args.command == "merge":
        count = merge_rows(args.out, args.rows)
        print(f"{count} rows from {', '.join(str(f) for f in args.rows if f.exists()) or 'nothing'}")
        if args.plot and count:
            plot_comparison(args.out)
        return 0 if count else 1
    return run_tests(args.out, args.tests, args.first, args.budget, args.test_timeout, args.loader)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
