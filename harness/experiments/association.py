"""The by-hand text's exercise E: association order, (A@B)@C against A@(B@C).

With A (1 x 4096), B and C (4096 x 4096) the product is the same, but (A@B)@C is two
vector-matrix products (67 MFLOP) and A@(B@C) a full 4096^3 matmul first (137 GFLOP): about
2000x the work, and (since a GEMV runs at memory speed, not compute speed) a smaller but still
huge ratio in time.
"""

from __future__ import annotations

import numpy as np

from harness.backends.gpu import time_cuda
from harness.experiments.arguments import count_at_least
from harness.experiments.common import pyplot, require_a_device, say, wanted, write
from harness.model.inputs import make_inputs
from harness.model.timing import time_cpu
from harness.run.plotting import readable_log_ticks
from harness.run.render import format_time, rate_text

NAME = "association"
TITLE = "Association order: (A@B)@C against A@(B@C) (exercise E)"
DURATION = "about 10 seconds"  # on a 2-core machine, said before it starts


def add_arguments(parser) -> None:

    parser.add_argument("--size", type=count_at_least(1), default=4096, help="the inner sizes (default 4096)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")


def flops(m: int, size: int) -> dict:
    left_first = 2 * m * size * size + 2 * m * size * size
    right_first = 2 * size**3 + 2 * m * size * size
    return {"(A@B)@C": left_first, "A@(B@C)": right_first}


def run(out_dir, size: int = 4096, threads: int = 1) -> dict:
    require_a_device()
    a, _ = make_inputs(f"1x{size}x{size}", "float32", seed=1)
    b, c = make_inputs(size, "float32", seed=2)
    counts = flops(1, size)
    rows, agree = [], None
    if wanted("cpu"):
        say(f"CPU (NumPy, {threads} thread(s)): timing (A@B)@C and A@(B@C) at {size}")
        agree, rows = _cpu_rows(a, b, c, counts, size, threads)
    if wanted("gpu"):
        rows += _gpu_rows(a, b, c, counts)
    for row in rows:
        say(f"  {row['device']} {row['order']}: {rate_text(row['flops'] / 1e9)} GFLOP in {format_time(row['seconds'])}")
    ratios = {}
    for device in sorted({r["device"] for r in rows}):
        times = {r["order"]: r["seconds"] for r in rows if r["device"] == device}
        ratios[device] = times["A@(B@C)"] / times["(A@B)@C"]
    flop_ratio = counts["A@(B@C)"] / counts["(A@B)@C"]
    say(f"FLOP ratio {flop_ratio:.0f}x; time ratio " + ", ".join(f"{d} {r:.0f}x" for d, r in ratios.items()))

    data = {
        "size": size,
        "threads": threads,
        "flops": counts,
        "flop_ratio": flop_ratio,
        "time_ratio": ratios,
        "results_agree": agree,
        "rows": rows,
    }
    return write(out_dir, NAME, data, figure(data))


def figure(data: dict):
    """Each order's time, as labelled bars (log scale: the two differ by orders of magnitude)."""

    rows, size = data["rows"], data["size"]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{r['device']} {r['order']}" for r in rows]
    bars = ax.barh(
        labels,
        [r["seconds"] for r in rows],
        color=["tab:green" if r["order"] == "(A@B)@C" else "tab:red" for r in rows],
    )
    ax.bar_label(bars, labels=[format_time(r["seconds"]) for r in rows], fontsize=8, padding=3)
    ax.set_xscale("log")
    readable_log_ticks(ax.xaxis)
    ax.set_xlim(min(r["seconds"] for r in rows) / 3, max(r["seconds"] for r in rows) * 5)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (log scale)")
    ax.set_title(
        f"(A@B)@C vs A@(B@C), A 1x{size}, B and C {size}x{size}: {data['flop_ratio']:.0f}x the FLOPs", fontsize=10
    )
    fig.tight_layout()
    return fig


def _cpu_rows(a, b, c, counts, size, threads) -> tuple[bool, list[dict]]:
    from threadpoolctl import threadpool_limits

    rows = []
    with threadpool_limits(limits=threads):
        left = lambda: (a @ b) @ c  # noqa: E731
        right = lambda: a @ (b @ c)  # noqa: E731
        agree = _agree(left(), right(), size)
        for label, function in (("(A@B)@C", left), ("A@(B@C)", right)):
            timing = time_cpu(function, min_time=0.3, min_repeats=2, warmup=1 if label == "(A@B)@C" else 0)
            rows.append(
                {
                    "order": label,
                    "device": "cpu",
                    "library": "numpy",
                    "flops": counts[label],
                    "seconds": timing.median_s,
                    "gflops": counts[label] / timing.median_s / 1e9,
                }
            )
    return agree, rows


def _agree(x: np.ndarray, y: np.ndarray, size: int) -> bool:
    """The two orders agree to float32 rounding of sums of size^2 terms (relative, in norm)."""
    difference = np.linalg.norm(x.astype(np.float64) - y)
    return bool(difference <= 1e-5 * size * np.linalg.norm(x.astype(np.float64)))


def _gpu_rows(a, b, c, counts) -> list[dict]:
    import torch

    ta, tb, tc = (torch.from_numpy(x).cuda() for x in (a, b, c))
    rows = []
    for label, function in (("(A@B)@C", lambda: (ta @ tb) @ tc), ("A@(B@C)", lambda: ta @ (tb @ tc))):
        seconds = time_cuda(function, min_time=0.3).median_s
        rows.append(
            {
                "order": label,
                "device": "gpu",
                "library": "torch (cuBLAS)",
                "flops": counts[label],
                "seconds": seconds,
                "gflops": counts[label] / seconds / 1e9,
            }
        )
    return rows


def summarize(data: dict) -> str:
    lines = ["| device | order | GFLOP | time | GFLOP/s |", "|---|---|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(
            f"| {r['device']} ({r['library']}) | {r['order']} | {rate_text(r['flops'] / 1e9)} | "
            f"{format_time(r['seconds'])} | {rate_text(r['gflops'])} |"
        )
    lines.append("")
    lines.append(
        f"FLOP ratio {data['flop_ratio']:.0f}x; measured time ratio "
        + ", ".join(f"{d}: {r:.0f}x" for d, r in data["time_ratio"].items())
        + ". A GEMV runs at memory speed, so the cheap order gains less in time than in FLOPs."
    )
    return "\n".join(lines)


def findings(data: dict) -> list[str]:
    ratios = ", ".join(f"{device} {ratio:.0f}x" for device, ratio in data["time_ratio"].items())
    return [
        f"A@(B@C) does {data['flop_ratio']:.0f}x the FLOPs of (A@B)@C and takes {ratios} the time",
        {
            True: "the two orders agree",
            False: "the two orders DISAGREE",
            None: "agreement checked on the CPU only (not run here)",
        }[data.get("results_agree")],
    ]
