"""The comparison's plot: GFLOP/s against shape for GEMMs, a panel of GB/s bars for GEMVs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.env import files
from harness.model.inputs import parse_shape
from harness.run.render import short_shape

if TYPE_CHECKING:
    from harness.run.results import Results


def plot(results: "Results", path, title: str | None = None) -> Path:
    """GFLOP/s against problem size, one line per implementation and dtype; GEMV shapes
    (M = 1), which no size axis orders sensibly, get a panel of their own in GB/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [row for row in results.rows if row.gflops is not None]
    gemv = [row for row in timed if parse_shape(row.shape).m == 1]
    gemm = [row for row in timed if parse_shape(row.shape).m != 1]
    panels = 2 if gemv and gemm else 1
    fig, axes = plt.subplots(
        1, panels, figsize=(9 + 5 * (panels - 1), 5.5), squeeze=False, gridspec_kw={"width_ratios": [9, 5][:panels]}
    )
    several_dtypes = len({row.dtype for row in timed}) > 1

    def label_of(implementation: str, weights: str | None, dtype: str) -> str:
        # a decode kernel runs once per weight format: each is a series (and a bar) of its own
        name = f"{implementation} {weights}" if weights else implementation
        return f"{name} ({dtype})" if several_dtypes else name

    def label(row):
        return label_of(row.implementation, row.weights, row.dtype)

    if timed and all(row.device == "gpu" for row in timed) and results.machine.get("gpu"):
        heading = title or f"matmul - {results.machine['gpu'].get('name', 'GPU')}"
    else:
        cpu = results.machine.get("cpu_model", "")
        threads = results.settings.get("threads")
        heading = title or f"matmul - {cpu}" + (f", {threads} thread(s)" if threads else "")
    # One colour per implementation, one line style per dtype: a dozen series stay apart.
    names = sorted({row.implementation for row in timed})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
    styles = {dtype: style for dtype, style in zip(sorted({row.dtype for row in timed}), ("-", "--", ":", "-."))}
    dtypes = ", ".join(sorted({row.dtype for row in timed}))
    heading += f" ({dtypes})" if dtypes else ""
    if gemm or not gemv:
        ax = axes[0][0]
        # one tick per shape, in order of FLOPs and labelled MxNxK: 512x512x1024 stays
        # readable, where a "size" axis (the cube root of M*N*K) would hide it
        shapes = sorted({row.shape for row in gemm}, key=lambda text: parse_shape(text).flops)
        series: dict[tuple[str, str | None, str], list[tuple[int, float]]] = {}
        for row in gemm:
            key = (row.implementation, row.weights, row.dtype)
            series.setdefault(key, []).append((shapes.index(row.shape), row.gflops))
        for (implementation, weights, dtype), points in series.items():
            points.sort()
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="o",
                color=colours[implementation],
                linestyle=styles[dtype],
                label=label_of(implementation, weights, dtype),
            )
        ax.set_xticks(range(len(shapes)), [short_shape(text) for text in shapes])
        ax.set_xlim(-0.3, len(shapes) - 0.7)
        ax.set_yscale("log")
        readable_log_ticks(ax.yaxis)
        ax.set_xlabel("shape (MxNxK; N^3 a square), in order of FLOPs")
        ax.set_ylabel("GFLOP/s (2*M*N*K / median time)")
        ax.set_title(heading, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if series:
            # below the axes, where it hides no point however many series there are
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    if gemv:
        ax = axes[0][panels - 1]
        names = [f"{label(row)} {row.shape}" for row in gemv]
        values = [row.gbytes_per_s for row in gemv]
        bars = ax.barh(names, values, color=[colours[row.implementation] for row in gemv])
        # GB/s spans orders of magnitude (pure Python to BLAS): a log axis keeps every bar
        # visible, and each bar carries its value
        ax.set_xscale("log")
        readable_log_ticks(ax.xaxis)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values], fontsize=7, padding=2)
        ax.set_xlim(min(values) / 2, max(values) * 4)
        ax.invert_yaxis()
        ax.set_xlabel("GB/s (matrix, vector and result, once each; log scale)")
        ax.set_title("GEMV shapes (M = 1): a bandwidth problem" if gemm else heading, fontsize=10)
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    try:
        return files.save_figure(fig, path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def readable_log_ticks(axis) -> None:
    """Plain numbers (0.1, 10, 1,000) on a log axis instead of 10^k, and no unlabelled minor
    ticks. An axis spanning under two decades (18 to 54 GFLOP/s) is labelled at 1, 2 and 5
    times the powers of ten, where powers alone would leave it with no number at all."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    class ReadableLogLocator(LogLocator):
        def tick_values(self, vmin, vmax):
            narrow = vmin > 0 and vmax > 0 and max(vmin, vmax) / min(vmin, vmax) < 100
            self.set_params(subs=(1.0, 2.0, 5.0) if narrow else (1.0,))
            return super().tick_values(vmin, vmax)

    axis.set_major_locator(ReadableLogLocator(base=10, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())
