"""Shared test settings: benchmark shape options, and benchmarks run once outside --benchmark-only."""

from __future__ import annotations

import os
import sys
import uuid

# A run started in a scratch copy of the repository (scripts/mutants.py's BOOTSTRAP) tests that
# copy's harness in every process: pytest-xdist's workers are fresh interpreters, where the
# editable install's finder would otherwise import the installed checkout's harness instead.
_TESTED_CHECKOUT = os.environ.get("MATMUL_TESTED_CHECKOUT")
if _TESTED_CHECKOUT:
    sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_")]
    if _TESTED_CHECKOUT not in sys.path:
        sys.path.insert(0, _TESTED_CHECKOUT)

import pytest  # noqa: E402
from leftovers import RUN_MARK, left_running  # noqa: E402

DEFAULT_BENCH_SHAPES = "128 512 1024 1x4096x4096"
DEFAULT_BENCH_DTYPES = "float32"
DEFAULT_DECODE_SHAPES = "1x4096x14336"  # Llama-3-8B's down projection, one token
DEFAULT_DECODE_WEIGHTS = "q4_0 q8_0 q4_K bf16 float32"


def pytest_addoption(parser):
    group = parser.getgroup("matmul", "matmul benchmarks")
    group.addoption(
        "--matmul-shapes",
        default=None,
        help="benchmark shapes, N or MxNxK separated by spaces or commas "
        f"(env MATMUL_BENCH_SHAPES; default '{DEFAULT_BENCH_SHAPES}'; pure Python only runs the small ones)",
    )
    group.addoption(
        "--matmul-impls",
        default=None,
        help="your own implementations to benchmark beside ours, FILE:FUNCTION separated by spaces "
        "(env MATMUL_BENCH_IMPLS; e.g. 'mine.py:matmul mine.c:my_matmul', see harness/backends/external.py)",
    )
    group.addoption(
        "--matmul-dtypes",
        default=None,
        help=f"benchmark dtypes (env MATMUL_BENCH_DTYPES; default '{DEFAULT_BENCH_DTYPES}')",
    )
    group.addoption(
        "--matmul-decode-shapes",
        default=None,
        help=f"decode benchmark shapes MxNxK, W [N, K] (env MATMUL_BENCH_DECODE_SHAPES; default '{DEFAULT_DECODE_SHAPES}')",
    )
    group.addoption(
        "--matmul-weights",
        default=None,
        help=f"decode benchmark weight formats (env MATMUL_BENCH_WEIGHTS; default '{DEFAULT_DECODE_WEIGHTS}')",
    )


# ---- no process outlives its test (tests/leftovers.py) ------------------------------------------
@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    yield
    left = left_running(kill=True)
    if left:
        listing = "; ".join(f"{pid}: {command[:160]}" for pid, command in left.items())
        pytest.fail(f"the test left {len(left)} process(es) running (now killed): {listing}", pytrace=False)


# ---- users' kernels a test registers leave with it ------------------------------------------------
@pytest.fixture
def forget_user_kernels():
    """The kernels a test registers (FILE:FUNCTION) leave the registry with it, so its names are
    its own and a later test that lists every implementation sees only the registry's own."""
    from harness.model.registry import REGISTRY

    before = set(REGISTRY)
    yield
    for name in set(REGISTRY) - before:
        del REGISTRY[name]


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per core, but none when benchmarks are timed
    (pytest-benchmark times nothing under xdist) or when there is a single core."""
    if config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False):
        return 0
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return count if count > 1 else 0


def pytest_sessionstart(session):
    # A pytest that a test starts (a guide's command, the C tests in another build) is a run of
    # its own, not one more xdist worker: the worker's variables, read by now, are not passed on.
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        os.environ.pop(name, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # A mark of this pytest process's own (a pytest run inside a test, or an xdist worker, gets
    # a new one): its tests' processes, and only theirs, are checked after each test.
    os.environ[RUN_MARK] = uuid.uuid4().hex
    # Plain `pytest` runs each benchmark once, as a check that it works; only
    # `pytest --benchmark-only` (or --benchmark-enable) times them.
    if hasattr(config.option, "benchmark_disable") and not (
        config.getoption("benchmark_only") or config.getoption("benchmark_enable")
    ):
        config.option.benchmark_disable = True
    # pytest-benchmark's ten default columns make 230-column tables: keep the ones compared
    # (the summary after them has GFLOP/s); --benchmark-columns still chooses.
    if hasattr(config.option, "benchmark_columns") and not config.option.benchmark_columns:
        config.option.benchmark_columns = ["min", "median", "iqr", "rounds"]
    # Your own implementations join the registry before the suite is parametrized over it.
    external = config.getoption("--matmul-impls", default=None) or os.environ.get("MATMUL_BENCH_IMPLS")
    if external:
        from harness.backends.external import ExternalError, add_external

        for spec in _split(external):
            try:
                add_external(spec)
            except ExternalError as error:
                raise pytest.UsageError(f"--matmul-impls: {error}") from None


REQUIRE_GPU_ENV = "MATMUL_REQUIRE_GPU"


def _gpu_required() -> bool:
    from harness.env.switches import switch

    return switch(REQUIRE_GPU_ENV)


def _is_gpu_module(path) -> bool:
    return "gpu" in os.path.basename(str(path))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """With MATMUL_REQUIRE_GPU=1 (the GPU script sets it) a GPU test module that would be
    skipped as a whole fails instead: on a GPU machine a skip can only hide a problem."""
    outcome = yield
    report = outcome.get_result()
    if _gpu_required() and report.skipped and _is_gpu_module(getattr(collector, "path", "")):
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_GPU_ENV}=1, but the module would be skipped: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With MATMUL_REQUIRE_GPU=1 a GPU test that would skip fails instead, with the skip's reason."""
    outcome = yield
    report = outcome.get_result()
    if _gpu_required() and report.skipped and item.get_closest_marker("gpu") is not None:
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_GPU_ENV}=1, but this GPU test would be skipped: {report.longrepr}"


# ---- pytest --benchmark-only: groups in numeric order, compact columns, a GFLOP/s summary -----
def _group_key(group: str | None):
    """'1024x1024x1024 float32' sorts after '128x128x128 float32': by FLOPs, then dtype."""
    from harness.model.inputs import parse_shape

    try:
        shape_text, dtype = (group or "").split(" ", 1)
        return (0, parse_shape(shape_text).flops, dtype)
    except ValueError:
        return (1, 0, group or "")


@pytest.hookimpl(hookwrapper=True)
def pytest_benchmark_group_stats(config, benchmarks, group_by):
    outcome = yield
    outcome.force_result(sorted(outcome.get_result(), key=lambda pair: _group_key(pair[0])))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    session = getattr(config, "_benchmarksession", None)
    if session is None or session.disabled or not session.benchmarks:
        return
    for line in benchmark_summary(session.benchmarks):
        terminalreporter.write_line(line)


def benchmark_summary(benchmarks) -> list[str]:
    """One block per shape and dtype, in numeric order: median, GFLOP/s, % of peak and
    speed against the baseline (numpy.matmul on the CPU, torch.cublas on the GPU)."""
    import harness
    from harness.run import machine
    from harness.run.render import format_time, ratio_text

    groups: dict[str, list] = {}
    for bench in benchmarks:
        if bench.stats is not None and bench.extra_info.get("flops"):
            groups.setdefault(bench.group, []).append(bench)
    lines = [
        "",
        "matmul summary: the median of each benchmark, GFLOP/s = 2*M*N*K / median,",
        "% of one core's measured FMA roof ('?' where a kernel beat it: the roof was",
        "measured low); decode groups: GB/s of the bytes read (packed weights, X, Y),",
        "% of one core's memory roof",
    ]
    blocks = []  # (group, rate's name, roof's name, rows)
    for group in sorted(groups, key=_group_key):
        cases = groups[group]
        baseline = {}
        for bench in cases:
            impl = harness.lookup(bench.extra_info["implementation"])
            if impl.baseline:
                baseline[impl.device] = bench.stats.median
        decode = any("weights" in bench.extra_info for bench in cases)
        # decode: GB/s of the bytes read, against the one-thread memory roof; else % of the FMA roof
        rate, roof = ("GB/s", "% mem") if decode else ("GFLOP/s", "% peak")
        rows = []
        for bench in sorted(cases, key=lambda b: b.stats.median, reverse=True):
            impl = harness.lookup(bench.extra_info["implementation"])
            median = bench.stats.median
            dtype = bench.extra_info["dtype"]
            if decode:
                value = bench.extra_info["bytes"] / median / 1e9
                peak = machine.memory_roof_gbps(1) if impl.device == "cpu" else None
                label = f"{impl.name} ({bench.extra_info['weights']})"
            else:
                value = bench.extra_info["flops"] / median / 1e9
                peak = machine.cpu_peak_gflops(dtype, 1) if impl.device == "cpu" else None
                label = impl.name
            share = f"{100 * value / peak:.0f}%" + ("?" if value > peak else "") if peak else ""
            base = baseline.get(impl.device)
            speed = ratio_text(base / median) if base else ""
            rows.append((label, format_time(median), f"{value:.3g}", share, speed))
        blocks.append((group, rate, roof, rows))
    # the names' column as wide as the longest ("llama.cpp.mul_mat_plain (q4_K)"), in every block
    width = max([len("implementation")] + [len(row[0]) for *_, rows in blocks for row in rows])
    for group, rate, roof, rows in blocks:
        lines += ["", f"{group}:", f"  {'implementation':<{width}} {'median':>10} {rate:>10} {roof:>7} {'vs base':>9}"]
        lines += [f"  {label:<{width}} {t:>10} {v:>10} {share:>7} {speed:>9}" for label, t, v, share, speed in rows]
    return lines


def _split(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def bench_shapes(config) -> tuple[list[str], bool]:
    """(shapes, chosen_by_user)."""
    chosen = config.getoption("--matmul-shapes") or os.environ.get("MATMUL_BENCH_SHAPES")
    return _split(chosen or DEFAULT_BENCH_SHAPES), bool(chosen)


def bench_decode(config) -> tuple[list[str], list[str]]:
    """(decode shapes, weight formats) of the decode benchmarks."""
    shapes = config.getoption("--matmul-decode-shapes") or os.environ.get("MATMUL_BENCH_DECODE_SHAPES")
    weights = config.getoption("--matmul-weights") or os.environ.get("MATMUL_BENCH_WEIGHTS")
    return _split(shapes or DEFAULT_DECODE_SHAPES), _split(weights or DEFAULT_DECODE_WEIGHTS)


def bench_dtypes(config) -> list[str]:
    return _split(config.getoption("--matmul-dtypes") or os.environ.get("MATMUL_BENCH_DTYPES") or DEFAULT_BENCH_DTYPES)
