"""The by-hand text's exercise D: tile quantization.

(M, 4096) @ (4096, 4096) for M in {127, 128, 129, 255, 256, 257}. A GPU kernel that cuts C into
128-row tiles runs a whole extra row of tiles for M = 129, nearly idle: the time jumps where M
crosses a multiple of the tile height, while the FLOPs grow by under 1%. On the CPU the same
experiment shows the (much smaller) steps of the packed kernel's MR-row micro-tiles and of
OpenBLAS's blocking.
"""

from __future__ import annotations

from harness.experiments.arguments import count_at_least
from harness.experiments.common import inputs, measure, pyplot, require_a_device, say, wanted, write
from harness.model.registry import REGISTRY
from harness.run.plotting import readable_log_ticks
from harness.run.render import format_time

NAME = "tile-quantization"
TITLE = "Tile quantization: (M, 4096) @ (4096, 4096) around multiples of 128 (exercise D)"
DURATION = "about 1 minute on the CPU; seconds on a GPU"  # on a 2-core machine, said before it starts

M_VALUES = (127, 128, 129, 255, 256, 257)
CPU_IMPLS = ("numpy.matmul", "c.packed", "c.blocked")
GPU_IMPLS = ("torch.cublas", "triton.matmul", "cuda.register_tiled", "cuda.wmma", "cuda.tiled")


def add_arguments(parser) -> None:

    parser.add_argument("--size", type=count_at_least(1), default=4096, help="N = K (default 4096)")
    parser.add_argument("--m", type=count_at_least(1), nargs="+", default=list(M_VALUES))


def run(out_dir, size: int = 4096, m=M_VALUES) -> dict:
    require_a_device()
    rows = []
    plans = [("cpu", "float32", [n for n in CPU_IMPLS if n in REGISTRY])] if wanted("cpu") else []
    if wanted("gpu"):
        plans.append(("gpu", "bfloat16", [n for n in GPU_IMPLS if n in REGISTRY]))
        plans.append(("gpu", "float32", [n for n in GPU_IMPLS if n in REGISTRY]))
    for device, dtype, names in plans:
        for rows_m in m:
            a, b = inputs(f"{rows_m}x{size}x{size}", dtype)
            for name in names:
                if dtype not in REGISTRY[name].dtypes:
                    continue
                say(f"  {name} {rows_m}x{size}x{size} {dtype}")
                entry = measure(name, a, b, min_time=0.3)
                entry.update(m=rows_m, device=device)
                rows.append(entry)

    data = {"size": size, "m_values": list(m), "rows": rows}
    return write(out_dir, NAME, data, figure(data))


def figure(data: dict):
    """Time and GFLOP/s against M, the M values evenly spaced (they cluster around 128 and 256)."""
    plt = pyplot()
    m_values, size = data["m_values"], data["size"]
    position = {m: i for i, m in enumerate(m_values)}
    series = sorted({(r["implementation"], r["dtype"]) for r in data["rows"] if "seconds" in r})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, dtype in series:
        points = sorted(
            (r["m"], r["seconds"], r["gflops"])
            for r in data["rows"]
            if r["implementation"] == name and r["dtype"] == dtype and "seconds" in r
        )
        label = f"{name} ({dtype})"
        left.plot([position[p[0]] for p in points], [p[1] * 1e3 for p in points], "o-", label=label)
        right.plot([position[p[0]] for p in points], [p[2] for p in points], "o-", label=label)
    for axis in (left, right):
        for i in range(1, len(m_values)):  # a dotted line wherever M crosses a multiple of 128
            if m_values[i - 1] // 128 != (m_values[i] - 1) // 128 or m_values[i - 1] % 128 == 0:
                axis.axvline(i - 0.5, color="grey", linestyle=":", linewidth=1)
        axis.set_xticks(range(len(m_values)), [str(m) for m in m_values])
        axis.set_xlabel("M (dotted: a multiple of 128 crossed)")

    left.set_yscale("log")
    readable_log_ticks(left.yaxis)
    left.set_ylabel("ms (log scale)")
    left.set_title(f"time of (M, {size}) @ ({size}, {size})", fontsize=10)
    right.set_yscale("log")
    readable_log_ticks(right.yaxis)
    right.set_ylabel("GFLOP/s (log scale)")
    right.set_title("throughput: " + what_it_shows(data), fontsize=10)
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    fig.tight_layout()
    return fig


DIP = 0.15  # a throughput drop this large just past a multiple of 128 is a step, not noise


def dips(data: dict) -> dict[tuple[str, str], float]:
    """Per implementation and dtype, the largest relative drop in GFLOP/s from M = 128k to
    M = 128k + 1 (what tile quantization predicts for a 128-row tile)."""
    rate = {(r["implementation"], r["dtype"], r["m"]): r["gflops"] for r in data["rows"] if r.get("gflops")}
    found = {}
    for (name, dtype, m), gflops in rate.items():
        if m % 128 == 0 and (name, dtype, m + 1) in rate:
            drop = 1 - rate[(name, dtype, m + 1)] / gflops
            found[(name, dtype)] = max(drop, found.get((name, dtype), -1.0))
    return found


def what_it_shows(data: dict) -> str:
    """The finding the data supports, device by device, for the plot's title."""
    rows = {(r["implementation"], r["dtype"]): r["device"] for r in data["rows"] if r.get("gflops")}
    parts = []
    for device in sorted(set(rows.values())):
        steps = {key: drop for key, drop in dips(data).items() if rows.get(key) == device and drop > DIP}
        if steps:
            (name, dtype), drop = max(steps.items(), key=lambda item: item[1])
            parts.append(f"{device.upper()}: dips just past multiples of 128 ({name} {dtype}: -{drop:.0%})")
        else:
            parts.append(f"{device.upper()}: no step at multiples of 128 beyond {DIP:.0%} noise")
    return "; ".join(parts) or "nothing timed"


def summarize(data: dict) -> str:
    m_values = data["m_values"]
    series = sorted({(r["implementation"], r["dtype"]) for r in data["rows"] if "seconds" in r})
    lines = [
        "| implementation | dtype | " + " | ".join(f"M={m}" for m in m_values) + " |",
        "|---|---|" + "---:|" * len(m_values),
    ]
    for name, dtype in series:
        cells = []
        for m in m_values:
            hit = [
                r
                for r in data["rows"]
                if r["implementation"] == name and r["dtype"] == dtype and r["m"] == m and "seconds" in r
            ]
            cells.append(format_time(hit[0]["seconds"]) if hit else "")
        lines.append(f"| `{name}` | {dtype} | " + " | ".join(cells) + " |")
    skipped = sorted({f"`{r['implementation']}`: {r['skipped']}" for r in data["rows"] if "skipped" in r})
    if skipped:
        lines.append("\nNot measured: " + "; ".join(skipped))
    return "\n".join(lines)


def findings(data: dict) -> list[str]:
    text = []
    by_impl: dict = {}
    for row in data["rows"]:
        if row.get("gflops"):
            by_impl.setdefault((row["implementation"], row["dtype"]), {})[row["m"]] = row["gflops"]
    for (name, dtype), points in by_impl.items():
        steps = [f"M={m}: {points[m]:,.0f}" if points[m] >= 100 else f"M={m}: {points[m]:.3g}" for m in sorted(points)]
        text.append(f"{name} {dtype} GFLOP/s: " + ", ".join(steps))
    return text or ["nothing was timed"]
