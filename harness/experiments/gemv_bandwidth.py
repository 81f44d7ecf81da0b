"""GEMV bandwidth: the achieved GB/s of every matrix-vector product against the memory peak.

A GEMV (M = 1) reads each weight once and does one multiply-add with it: its speed is the
speed at which the matrix streams from memory. Every GEMV kernel (and every GEMM asked for an
M = 1 product) is therefore scored in GB/s of compulsory traffic (the matrix, the vector and the
result, once each) against the bandwidth the memory can deliver.
"""

from __future__ import annotations

from harness.experiments.arguments import shape_without_zeros
from harness.experiments.common import (
    cpu_bandwidth_gbps,
    gpu_peaks,
    inputs,
    measure,
    pyplot,
    require_a_device,
    say,
    wanted,
    write,
)
from harness.model.registry import implementations

NAME = "gemv-bandwidth"
TITLE = "GEMV bandwidth: achieved GB/s against the memory's peak"
DURATION = "about 30 seconds"  # on a 2-core machine, said before it starts

CPU_SHAPES = ("1x4096x4096", "1x8192x8192")
GPU_SHAPES = ("1x8192x8192", "1x16384x16384")


def add_arguments(parser) -> None:

    parser.add_argument(
        "--cpu-shapes",
        nargs="+",
        type=shape_without_zeros,
        default=list(CPU_SHAPES),
        metavar="SHAPE",
        help="CPU GEMV shapes, 1xNxK",
    )


def run(out_dir, cpu_shapes=CPU_SHAPES) -> dict:
    require_a_device()
    peaks, rows = {}, []
    if wanted("cpu"):
        peaks["cpu"] = cpu_bandwidth_gbps()
    for impl in implementations():  # the float ones: decode kernels are the decode experiment's
        if impl.device != "cpu" or impl.language == "python" or "cpu" not in peaks or impl.weights:
            continue
        for shape in cpu_shapes:
            a, b = inputs(shape, "float32")
            say(f"  {impl.name} {shape}")
            rows.append(measure(impl.name, a, b, min_time=0.3))
    gpu = gpu_peaks() if wanted("gpu") else None
    if gpu:
        peaks["gpu"] = gpu["bandwidth_gbps"]
        for impl in implementations():
            if impl.device != "gpu" or impl.weights:
                continue
            for dtype in ("bfloat16", "float32"):
                if dtype not in impl.dtypes:
                    continue
                for shape in GPU_SHAPES:
                    a, b = inputs(shape, dtype)
                    say(f"  {impl.name} {shape} {dtype}")
                    rows.append(measure(impl.name, a, b, min_time=0.3))
    for row in rows:
        if "gbytes_per_s" in row:
            row["pct_of_peak"] = 100 * row["gbytes_per_s"] / peaks[row["device"]]

    plt = pyplot()
    measured = [r for r in rows if "gbytes_per_s" in r]
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(len(measured), 4) + 1.5))
    labels = [f"{r['implementation']} {r['shape']} {r['dtype']}" for r in measured]
    ax.barh(
        labels,
        [r["pct_of_peak"] for r in measured],
        color=["tab:orange" if r["device"] == "gpu" else "tab:blue" for r in measured],
    )
    ax.axvline(100, color="red", linestyle="--")
    ax.invert_yaxis()
    ax.set_xlabel("% of peak memory bandwidth (CPU: measured copy, one core; GPU: datasheet HBM)")
    ax.set_title("GEMV: a bandwidth problem", fontsize=10)
    for i, r in enumerate(measured):
        ax.text(r["pct_of_peak"], i, f" {r['gbytes_per_s']:.1f} GB/s", va="center", fontsize=7)
    fig.tight_layout()
    return write(out_dir, NAME, {"peak_gbps": peaks, "rows": rows}, fig)


def summarize(data: dict) -> str:
    lines = [
        "- peak bandwidth: " + ", ".join(f"{d.upper()} {v:.1f} GB/s" for d, v in data["peak_gbps"].items()),
        "",
        "| implementation | shape | dtype | GB/s | % of peak |",
        "|---|---|---|---:|---:|",
    ]
    for r in data["rows"]:
        if "gbytes_per_s" in r:
            lines.append(
                f"| `{r['implementation']}` | {r['shape']} | {r['dtype']} | {r['gbytes_per_s']:.1f} | "
                f"{r['pct_of_peak']:.0f}% |"
            )
    return "\n".join(lines)


def findings(data: dict) -> list[str]:
    text = ["memory roof: " + ", ".join(f"{d} {g:,.1f} GB/s" for d, g in data["peak_gbps"].items())]
    for row in sorted((r for r in data["rows"] if r.get("gbytes_per_s")), key=lambda r: -r["gbytes_per_s"])[:4]:
        share = f" ({row['pct_of_peak']:.0f}% of the roof)" if row.get("pct_of_peak") else ""
        if (row.get("pct_of_peak") or 0) > 100:
            share += "?: above the roof, which was measured low (caches, or a busy machine)"
        text.append(f"  {row['implementation']} {row['shape']} {row['dtype']}: {row['gbytes_per_s']:,.1f} GB/s{share}")
    return text
