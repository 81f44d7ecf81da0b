"""The GPU script's steps that run GPU code, built so that one bad kernel costs only its own rows.

scripts/gpu_check.sh calls them; each runs its pieces in child processes under their own
timeouts, because a hung kernel cannot be interrupted from Python and a faulting one poisons
its process's CUDA context for every later launch:

    python scripts/gpu_steps.py smoke   --out DIR [--timeout S]
    python scripts/gpu_steps.py compare --out DIR [--budget S] [--group NAME:IMPLS:SHAPES:DTYPES[:WEIGHTS] ...]
    python scripts/gpu_steps.py tests   --out DIR [--budget S] [--test-timeout S] [--first PATTERN ...] TESTS...

smoke    Each kernel that has never run on a GPU, at one shape that wraps its pipeline ring
         and gives its persistent blocks uneven numbers of tiles, alone in a process: ok,
         WRONG (the check failed), FAULT (an error, the message kept) or HUNG (killed at its
         timeout, with the phase it had reached). A pipelined kernel that hung is tried once
         more, built to report how far its producer and consumers got (cuda/progress.h).
         smoke.json and smoke.txt.
compare  The comparison in groups, one process each: the baseline (cuBLAS) first, then each
         never-run kernel alone, then the proven ones, then the decode kernels (quantized
         weights: a group's WEIGHTS); a kernel the smoke step found hung or faulting is
         skipped. Every finished problem (shape, dtype, weight format) appends its rows to
         rows.jsonl at once, and comparison.json and .csv are rewritten whole after every group, so a run cut
         anywhere keeps what finished. groups.txt says how each group ended.
tests    pytest with a timeout per test: the tests matching --first (the never-run kernels)
         before the rest; a test that hangs is recorded and pytest restarted past it; every
         failure and hang named in tests-summary.txt.

The dry run (tests/test_gpu_check_dry_run.py) replaces the GPU with CPU implementations through
--kernels and --group, and GPU_STEPS_STAND_IN="name=hang,name=fault" makes a child process
stand in a hang or a fault when it reaches that implementation.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAND_IN_ENV = "GPU_STEPS_STAND_IN"

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
# same shapes. Then batched decode, M = 2..16, at one of them, in q4_0.
DECODE_SHAPES = ["1x16384x16384", "1x28672x8192"]
DECODE_WEIGHTS = ["q4_0", "q8_0", "bf16", "float32"]  # in order of value: the verdicts judge q4_0
BATCH_SHAPES = ["2x28672x8192", "4x28672x8192", "8x28672x8192", "16x28672x8192"]


def default_groups() -> list[tuple[str, list[str], list[str], list[str], list[str]]]:
    """(name, implementations, shapes, dtypes, weight formats) in order of value, from the
    registry: the baseline, each never-run kernel alone, then the proven kernels of each
    language, then the decode kernels and their GPU peers (weight formats: [] for a plain
    matmul). GEMV shapes run only the GEMV kernels (a GEMM kernel at M = 1 says nothing the
    GEMV rows do not)."""
    import harness

    gpu = [impl for impl in harness.implementations() if impl.device == "gpu" and not impl.baseline]
    baselines = [impl.name for impl in harness.implementations() if impl.device == "gpu" and impl.baseline]
    groups = [("baseline", baselines, GEMM_SHAPES + GEMV_SHAPES, ALL_DTYPES, [])]
    groups += [(name, [name], GEMM_SHAPES, list(harness.lookup(name).dtypes), []) for name in NEVER_RUN]
    for language in ("cuda", "triton"):
        proven = [
            impl.name
            for impl in gpu
            if impl.language == language
            and impl.operation == "gemm"
            and impl.name not in NEVER_RUN
            and not impl.weights
        ]
        groups.append((language, proven, GEMM_SHAPES, ALL_DTYPES, []))
    groups.append(("gemv", [impl.name for impl in gpu if impl.operation == "gemv"], GEMV_SHAPES, ALL_DTYPES, []))
    decode = [impl.name for impl in gpu if impl.weights]  # ours and the GPU peers (torch.int4_gpu)
    groups.append(("decode", baselines + decode, DECODE_SHAPES, ["float32"], DECODE_WEIGHTS))
    groups.append(("decode-cublas-bf16", baselines, DECODE_SHAPES, ["bfloat16"], []))
    groups.append(
        ("decode-batch", [impl.name for impl in gpu if "q4_0" in impl.weights], BATCH_SHAPES, ["float32"], ["q4_0"])
    )
    return groups


# ---- shared pieces -------------------------------------------------------------------------
def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader, or a kill, never sees half)."""
    from harness.env import files

    files.write_text(path, text)


def stand_in(name: str) -> None:
    """In the dry run, behave as a hung or a faulting kernel would when ``name`` is reached."""
    wanted = dict(item.split("=", 1) for item in os.environ.get(STAND_IN_ENV, "").split(",") if "=" in item)
    behaviour = wanted.get(name)
    if behaviour == "hang":
        while True:  # a kernel that never finishes: nothing in Python can interrupt it either
            time.sleep(3600)
    if behaviour == "fault":
        raise RuntimeError(f"CUDA error: an illegal memory access was encountered ({name}, a stand-in)")


PARENT_ENV = "GPU_STEPS_PARENT"
# The tests step runs the tests it names, whatever their tier (-m ""), one at a time on the one
# GPU, each under its own timeout: never in pytest-xdist workers, which the repository's addopts
# (-n auto) would otherwise start.
SERIAL = ["-m", ""] + (["-n", "0"] if importlib.util.find_spec("xdist") else [])


def run_child(command: list[str], timeout: float, log: Path) -> tuple[str, int | None]:
    """Run ``command`` in its own process group, output appended to ``log``; ("done", code), or
    ("timeout", None) after killing the whole group (a child's own children included). The
    child dies with this process too (die_with_parent): its own group is out of reach of a kill
    aimed at ours."""
    with log.open("a") as out:
        child = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            env={**os.environ, PARENT_ENV: str(os.getpid())},
        )
        try:
            return "done", child.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            return "timeout", None


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
def compare_group(
    impls: list[str],
    shapes: list[str],
    dtypes: list[str],
    rows_file: Path,
    min_time: float,
    weights: list[str] | None = None,
) -> int:
    """Check and time ``impls`` at every shape, dtype and weight format (``weights``: decode
    problems; none for a plain matmul), appending each problem's rows to ``rows_file`` as soon
    as they are measured."""
    from dataclasses import asdict

    import harness
    from harness.run.results import finite_or_null

    # formats outermost: the first (q4_0, which the verdicts judge) is measured at every shape
    # before the others, in case the step's time runs out
    for fmt in weights or [None]:
        for shape in shapes:
            for dtype in dtypes:
                for name in impls:
                    stand_in(name)
                results = harness.compare(
                    [shape],
                    impls,
                    [dtype],
                    threads=None,
                    min_time=min_time,
                    baselines=False,
                    weights=[fmt] if fmt else None,
                )
                with rows_file.open("a") as handle:
                    for row in results.rows:
                        record = finite_or_null(
                            {"row": asdict(row), "machine": results.machine, "settings": results.settings}
                        )
                        handle.write(json.dumps(record, default=str) + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                problem = f"{shape} {dtype}{' ' + fmt if fmt else ''}"
                print(
                    f"{' '.join(impls)} {problem}: "
                    + ", ".join(f"{r.implementation} {r.status}" for r in results.rows),
                    flush=True,
                )
    return 0


def merge_rows(out: Path) -> int:
    """comparison.json and .csv from every row written so far; the number of rows."""
    from harness.run.results import Results, Row, fill_speedups

    rows, machine, settings = [], {}, {}
    fields = set(Row.__dataclass_fields__)
    rows_file = out / "rows.jsonl"
    lines = rows_file.read_text().splitlines() if rows_file.exists() else []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the last line of a process killed while writing it
            continue
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


def parse_group(text: str) -> tuple[str, list[str], list[str], list[str], list[str]]:
    parts = text.split(":")
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(f"--group {text!r}: expected NAME:IMPL,...:SHAPE,...:DTYPE,...[:WEIGHTS,...]")
    name, impls, shapes, dtypes = parts[:4]
    weights = parts[4].split(",") if len(parts) == 5 and parts[4] else []
    return name, impls.split(","), shapes.split(","), dtypes.split(","), weights


GROUP_SHARE = 0.35  # of the comparison's budget, at most, for any group but the last


def condemned_by_smoke(smoke_json: Path | None) -> dict:
    """The kernels the smoke step found hung or faulting: running them again would only cost
    the time of their timeout, or poison the process."""
    if not smoke_json or not smoke_json.exists():
        return {}
    return {k: v for k, v in json.loads(smoke_json.read_text()).items() if v["verdict"] in ("HUNG", "FAULT")}


def compare(
    out: Path,
    groups,
    budget: float,
    min_time: float,
    plot: bool,
    smoke_json: Path | None,
    group_timeout: float | None = None,
) -> int:
    ends = time.monotonic() + budget
    condemned = condemned_by_smoke(smoke_json)
    status, report = 0, []
    for index, (name, impls, shapes, dtypes, weights) in enumerate(groups):
        left = ends - time.monotonic()
        skipped = [impl for impl in impls if impl in condemned]
        impls = [impl for impl in impls if impl not in condemned]
        for impl in skipped:
            report.append(
                f"{impl:20} skipped: {condemned[impl]['verdict']} in the smoke step ({condemned[impl]['detail']})"
            )
            status = 1
        if not impls:
            continue
        if left < 5:
            report.append(f"{name:20} skipped for time ({left:.0f}s left)")
            status = 1
            continue
        # The last group may use all that is left; the others at most a share of the budget,
        # so a group that hangs past the smoke test still leaves time for the ones after it.
        last = index == len(groups) - 1
        timeout = left if last else min(left, group_timeout or max(30.0, GROUP_SHARE * budget))
        began = time.monotonic()
        log = out / f"compare-{name}.log"
        ended, code = run_child(
            [
                sys.executable,
                __file__,
                "_compare_group",
                ",".join(impls),
                ",".join(shapes),
                ",".join(dtypes),
                str(out / "rows.jsonl"),
                str(min_time),
                ",".join(weights),
            ],
            timeout,
            log,
        )
        took = time.monotonic() - began
        if ended == "timeout":
            outcome = f"killed after {took:.0f}s (hung, or out of time): {last_lines(log, 1)}"
            status = 1
        elif code == 0:
            outcome = f"ok after {took:.0f}s"
        else:
            outcome = f"failed (exit {code}) after {took:.0f}s: {last_lines(log, 1)}"
            status = 1
        count = merge_rows(out)
        report.append(f"{name:20} {outcome}")
        print(f"compare {name}: {outcome}; {count} rows so far", flush=True)
        write_whole(out / "groups.txt", "\n".join(report) + "\n")
    write_whole(out / "groups.txt", "\n".join(report) + "\n")
    if plot and (out / "comparison.json").exists():
        from harness.run.compare import Results

        Results.from_json(out / "comparison.json").plot(out / "comparison.png")
    return status


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
        self.ids: list[str] = []

    def pytest_collection_modifyitems(self, items):
        self.ids = [absolute_id(item) for item in items]


def collect(tests: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, __file__, "_collect", *tests], cwd=ROOT, capture_output=True, text=True)
    return [line[3:] for line in done.stdout.splitlines() if line.startswith("ID ")]


def run_tests(out: Path, tests: list[str], first: list[str], budget: float, test_timeout: float) -> int:
    ends = time.monotonic() + budget
    ids = collect(tests)
    if not ids:
        write_whole(out / "tests-summary.txt", f"no tests collected from {' '.join(tests)}\n")
        return 1
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
        impls, shapes, dtypes, rows_file, min_time = argv[1:6]
        weights = [w for w in (argv[6] if len(argv) > 6 else "").split(",") if w]
        return compare_group(
            impls.split(","), shapes.split(","), dtypes.split(","), Path(rows_file), float(min_time), weights
        )
    if argv and argv[0] == "_collect":
        collector = Collector()
        pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *SERIAL, *argv[1:]], plugins=[collector])
        print("".join(f"ID {test_id}\n" for test_id in collector.ids))
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
    compare_parser.add_argument("--group", type=parse_group, action="append", dest="groups")
    compare_parser.add_argument("--budget", type=float, default=200)
    compare_parser.add_argument("--min-time", type=float, default=0.1)
    compare_parser.add_argument("--no-plot", action="store_true")
    compare_parser.add_argument(
        "--group-timeout",
        type=float,
        help=f"seconds for any group but the last (default {GROUP_SHARE:.0%} of the budget, at least 30)",
    )
    compare_parser.add_argument(
        "--smoke", type=Path, help="the smoke step's smoke.json: its hung and faulting kernels are skipped"
    )
    tests_parser = commands.add_parser("tests")
    tests_parser.add_argument("tests", nargs="+")
    tests_parser.add_argument("--first", nargs="*", default=[])
    tests_parser.add_argument("--budget", type=float, default=150)
    tests_parser.add_argument("--test-timeout", type=float, default=60)
    for sub in (smoke_parser, compare_parser, tests_parser):
        sub.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "smoke":
        return smoke(args.out, args.kernels, args.shape, args.dtype, args.timeout, args.progress_kernels)
    if args.command == "compare":
        return compare(
            args.out,
            args.groups or default_groups(),
            args.budget,
            args.min_time,
            not args.no_plot,
            args.smoke,
            args.group_timeout,
        )
    return run_tests(args.out, args.tests, args.first, args.budget, args.test_timeout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
