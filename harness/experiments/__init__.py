"""The reference texts' exercises as reproducible commands.

Each experiment is a module here with ``NAME``, ``TITLE``, ``add_arguments(parser)``,
``run(out_dir, ...) -> dict`` (measures, writes ``<out_dir>/<NAME>.json`` with its numbers and
the machine's info, and ``<out_dir>/<NAME>.png``) and ``summarize(data) -> str`` (Markdown for
the report). ``python -m harness <NAME> --out DIR`` runs one; ``python -m harness experiments
--out DIR`` runs them all and ``python -m harness report DIR`` gathers them into DIR/REPORT.md.
"""
from __future__ import annotations

from . import association, blas_grid, comparison, gemv_bandwidth, loads, loop_orders, roofline, tile_quantization, tile_sweep

EXPERIMENTS = {
    module.NAME: module
    for module in (comparison, loads, loop_orders, tile_sweep, tile_quantization, association, roofline, gemv_bandwidth,
                   blas_grid)
}
