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


def _split(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def bench_shapes(config) -> tuple[list[str], bool]:
    """(shapes, chosen_by_user)."""
    chosen = config.getoption("--matmul-shapes") or os.environ.get("MATMUL_BENCH_SHAPES")
    return _split(chosen or DEFAULT_BENCH_SHAPES), bool(chosen)


def bench_dtypes(config) -> list[str]:
    return _split(config.getoption("--matmul-dtypes") or os.environ.get("MATMUL_BENCH_DTYPES") or DEFAULT_BENCH_DTYPES)
