"""The reference texts' exercises as reproducible commands.

Each experiment is a module here that satisfies ``Experiment`` (below; a test checks every one).
``python -m harness <NAME> --out DIR`` runs one; ``python -m harness experiments --out DIR`` runs
them all and ``python -m harness report DIR`` gathers them into DIR/REPORT.md.
"""

from __future__ import annotations

import argparse
from typing import Protocol, runtime_checkable

from harness.experiments import (
    association,
    blas_grid,
    comparison,
    decode,
    gemv_bandwidth,
    loads,
    loop_orders,
    prefill,
    roofline,
    tile_quantization,
    tile_sweep,
)


@runtime_checkable
class Experiment(Protocol):
    """What the command line and the report need of an experiment module."""

    NAME: str  # the subcommand, and the stem of its files: <out_dir>/<NAME>.json and .png
    TITLE: str  # one line: the report's heading and the command's help
    DURATION: str  # how long it takes on a 2-core machine, said before it starts

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Its options; each one's dest is a keyword of ``run``."""

    def run(self, out_dir, **options) -> dict:
        """Measure, write <out_dir>/<NAME>.json (numbers and the machine) and <NAME>.png, and
        return what it wrote."""

    def summarize(self, data: dict) -> str:
        """Markdown for the report, from the JSON ``run`` wrote."""

    def findings(self, data: dict) -> list[str]:
        """What it found, in a few lines for the terminal."""


EXPERIMENTS = {
    module.NAME: module
    for module in (
        comparison,
        loads,
        loop_orders,
        tile_sweep,
        tile_quantization,
        association,
        roofline,
        gemv_bandwidth,
        blas_grid,
        decode,
        prefill,
    )
}
