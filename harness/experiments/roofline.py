"""The roofline: each implementation's measured point under the machine's two roofs.

A kernel with arithmetic intensity I (FLOPs per byte of compulsory memory traffic: A and B
read once, C written once) can run no faster than min(peak FLOP/s, I x bandwidth). A square
matmul has I ~ N/6 (float32), far right of the ridge, so only the kernel's own quality keeps
it below the compute roof; a GEMV has I ~ 0.5 and sits on the bandwidth slope, where no amount
of tiling helps. CPU roofs: one core's peak from the measured clock, the SIMD width and two FMA
units, and the bandwidth one core sustains copying a large buffer. GPU roofs: the datasheet.
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
from harness.model.registry import REGISTRY, implementations
from harness.run import machine
from harness.run.plotting import readable_log_ticks
from harness.run.render import rate_text

NAME = "roofline"
TITLE = "Roofline: measured points under the compute and bandwidth roofs"
DURATION = "about 1 minute"  # on a 2-core machine, said before it starts

CPU_SHAPES = {"gemm": "1024", "gemv": "1x4096x4096"}
PYTHON_SHAPE = "128"
GPU_SHAPES = {"gemm": "4096", "gemv": "1x16384x16384"}


def add_arguments(parser) -> None:

    parser.add_argument(
        "--cpu-gemm", type=shape_without_zeros, default=CPU_SHAPES["gemm"], help="CPU GEMM shape (default 1024)"
    )


def intensity(shape: str, itemsize: int) -> float:
    m, n, k = (int(v) for v in (shape.split("x") if "x" in shape else [shape] * 3))
    return 2 * m * n * k / ((m * k + k * n + m * n) * itemsize)


def run(out_dir, cpu_gemm: str = CPU_SHAPES["gemm"]) -> dict:
    require_a_device()
    roofs, points = {}, []
    if wanted("cpu"):
        bandwidth = cpu_bandwidth_gbps()
        roofs["cpu"] = {
            "device": machine.cpu_model() + " (one core)",
            "bandwidth_gbps": bandwidth,
            "float32": machine.cpu_peak_gflops("float32"),
            "float64": machine.cpu_peak_gflops("float64"),
        }
        say(f"CPU roofs: {roofs['cpu']['float32']:.0f} GFLOP/s FP32 peak (one core), {bandwidth:.1f} GB/s measured")
    for impl in implementations():  # the float ones: decode kernels are the decode experiment's
        if impl.device != "cpu" or "cpu" not in roofs or impl.weights:
            continue
        shapes = [PYTHON_SHAPE] if impl.language == "python" else [cpu_gemm, CPU_SHAPES["gemv"]]
        for shape in shapes:
            a, b = inputs(shape, "float32")
            say(f"  {impl.name} {shape}")
            points.append({**measure(impl.name, a, b, min_time=0.2), "intensity": intensity(shape, 4)})
    peaks = gpu_peaks()
    if wanted("gpu") and peaks:
        roofs["gpu"] = peaks
        for impl in implementations():
            if impl.device != "gpu" or impl.weights:
                continue
            for dtype in ("bfloat16", "float32"):
                if dtype not in impl.dtypes:
                    continue
                shape = GPU_SHAPES["gemv"] if impl.operation == "gemv" else GPU_SHAPES["gemm"]
                a, b = inputs(shape, dtype)
                say(f"  {impl.name} {shape} {dtype}")
                points.append(
                    {**measure(impl.name, a, b, min_time=0.2), "intensity": intensity(shape, a.dtype.itemsize)}
                )
        for shape in (GPU_SHAPES["gemv"],):  # cuBLAS as a GEMV too, beside the GEMV kernels
            if "torch.cublas" in REGISTRY:
                a, b = inputs(shape, "bfloat16")
                points.append({**measure("torch.cublas", a, b), "intensity": intensity(shape, 2)})

    data = {"roofs": roofs, "points": points}
    return write(out_dir, NAME, data, figure(data))


def figure(data: dict):
    """Each device's roofs and the measured points, on log-log axes."""

    roofs, points = data["roofs"], data["points"]
    plt = pyplot()
    panels = [d for d in ("cpu", "gpu") if d in roofs]
    fig, axes = plt.subplots(1, len(panels), figsize=(10 * len(panels), 5.5), squeeze=False)
    for axis, device in zip(axes[0], panels):
        roof = roofs[device]
        low, high = 2.0**-4, 2.0**12
        for dtype, style in (("float32", "-"), ("float64", "--"), ("bfloat16", "-.")):
            if roof.get(dtype):
                # the bandwidth slope up to the ridge, then flat: drawn through the ridge itself,
                # so the corner sits at peak / bandwidth, not at the nearest sampled power of two
                ridge = roof[dtype] / roof["bandwidth_gbps"]
                xs = [low, ridge, high] if low < ridge < high else [low, high]
                axis.plot(
                    xs,
                    [min(roof[dtype], x * roof["bandwidth_gbps"]) for x in xs],
                    "k" + style,
                    linewidth=1,
                    label=f"roof {dtype} (ridge {ridge:.1f} FLOP/byte)",
                )
        markers = "osD^v<>pPX*h"
        mine = [p for p in points if p.get("device") == device and "gflops" in p]
        for index, point in enumerate(mine):
            name = f"{point['implementation']} {point['shape']}" + (
                "" if point["dtype"] == "float32" else f" {point['dtype']}"
            )
            axis.scatter(point["intensity"], point["gflops"], s=36, marker=markers[index % len(markers)], label=name)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        readable_log_ticks(axis.yaxis)
        axis.set_xlabel("arithmetic intensity (FLOP per byte of A, B and C)")
        axis.set_ylabel("GFLOP/s")
        axis.set_title(f"{device.upper()}: {roof['device']}", fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def summarize(data: dict) -> str:
    lines = []
    for device, roof in data["roofs"].items():
        lines.append(
            f"- {device.upper()} roofs ({roof['device']}): FP32 {roof['float32']:.0f} GFLOP/s, "
            f"bandwidth {roof['bandwidth_gbps']:.1f} GB/s"
        )
    lines += [
        "",
        "| implementation | shape | dtype | FLOP/byte | GFLOP/s | % of the roof at its intensity |",
        "|---|---|---|---:|---:|---:|",
    ]
    for p in data["points"]:
        if "gflops" not in p:
            continue
        roof = data["roofs"][p["device"]]
        ceiling = min(roof.get(p["dtype"]) or roof["float32"], p["intensity"] * roof["bandwidth_gbps"])
        lines.append(
            f"| `{p['implementation']}` | {p['shape']} | {p['dtype']} | {p['intensity']:.3g} | "
            f"{rate_text(p['gflops'])} | {100 * p['gflops'] / ceiling:.1f}% |"
        )
    return "\n".join(lines)


def findings(data: dict) -> list[str]:
    text = []
    for device, roof in data["roofs"].items():
        text.append(
            f"{device} roofs ({roof.get('device', '')}): FP32 {roof['float32']:,.0f} GFLOP/s, "
            f"{roof['bandwidth_gbps']:,.1f} GB/s, ridge at {roof['float32'] / roof['bandwidth_gbps']:.1f} FLOP/byte"
        )
    best = sorted((p for p in data["points"] if p.get("gflops")), key=lambda p: -p["gflops"])[:3]
    text += [
        f"  {p['implementation']} {p['shape']} {p['dtype']}: {p['gflops']:,.1f} GFLOP/s at "
        f"{p['intensity']:.0f} FLOP/byte"
        for p in best
    ]
    return text
