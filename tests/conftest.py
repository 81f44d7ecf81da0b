"""Shared test settings: benchmark shape options, and benchmarks run once outside --benchmark-only."""
from __future__ import annotations

import os

import pytest

DEFAULT_BENCH_SHAPES = "128 512 1024 1x4096x4096"
DEFAULT_BENCH_DTYPES = "float32"


def pytest_addoption(parser):
    group = parser.getgroup("matmul", "matmul benchmarks")
    group.addoption(
        "--matmul-shapes", default=None,
        help="benchmark shapes, N or MxNxK separated by spaces or commas "
        f"(env MATMUL_BENCH_SHAPES; default '{DEFAULT_BENCH_SHAPES}'; pure Python only runs the small ones)",
    )
    group.addoption(
        "--matmul-dtypes", default=None,
        help=f"benchmark dtypes (env MATMUL_BENCH_DTYPES; default '{DEFAULT_BENCH_DTYPES}')",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Plain `pytest` runs each benchmark once, as a check that it works; only
    # `pytest --benchmark-only` (or --benchmark-enable) times them.
    if hasattr(config.option, "benchmark_disable") and not (
        config.getoption("benchmark_only") or config.getoption("benchmark_enable")
    ):
        config.option.benchmark_disable = True


REQUIRE_GPU_ENV = "MATMUL_REQUIRE_GPU"


def _gpu_required() -> bool:
    return os.environ.get(REQUIRE_GPU_ENV, "") not in ("", "0", "false", "no")


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


def _split(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def bench_shapes(config) -> tuple[list[str], bool]:
    """(shapes, chosen_by_user)."""
    chosen = config.getoption("--matmul-shapes") or os.environ.get("MATMUL_BENCH_SHAPES")
    return _split(chosen or DEFAULT_BENCH_SHAPES), bool(chosen)


def bench_dtypes(config) -> list[str]:
    return _split(config.getoption("--matmul-dtypes") or os.environ.get("MATMUL_BENCH_DTYPES") or DEFAULT_BENCH_DTYPES)
