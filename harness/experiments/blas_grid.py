"""c.packed against the BLAS across the shape space, through the call a user makes.

``python -m harness blas-grid`` times ``harness.get("c.packed", threads=t)(a, b)`` (the
public call: validation, allocation and all), NumPy's ``a @ b`` (OpenBLAS, pinned to t
threads) and the peers registered beside it, BLIS (``blis.gemm``) and torch's CPU matmul
(``torch.cpu``), through the same kind of call, on every shape of the grid below, float32 and
float64, on 1 and 2 threads, and prints c.packed's speed as a ratio to each (above 1 =
c.packed is faster).

How it is timed: on one thread the calls of one case are interleaved, round after round (each
round times each call for at least ``--sample-time`` seconds, in batches for the fast ones,
each round in another order: ``timing.round_order``, as compare and ab take them).
Each call's time is the median over the rounds, and each ratio the median over the rounds of
the ratio within a round, whose calls run back to back: a burst of noise, or a drift of the
machine's speed between rounds, falls on all of them alike. On more than one thread, each
library runs its rounds in a block of its own, after a pause (SETTLE_SECONDS) and a warm-up
call: on a machine with as many cores as threads, the previous library's idle workers
(spinning, or slow to wake) take a core from the next one after every switch, which
interleaving would put on every sample. The JSON keeps each ratio's range over the rounds, and
the plot draws it. Every c.packed product is checked against the float64 reference
first; a wrong one is reported and not timed.

Which BLIS ran, and its kernel set, is recorded (backends/peers.py): the system's BLIS built
for this CPU where one is installed, else the ``blis`` package, which on some CPUs runs generic
reference code (and one thread whatever is asked).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Sequence

import numpy as np

from harness.backends.peers import blis_description
from harness.experiments.arguments import count_at_least, positive_seconds, shape_without_zeros
from harness.experiments.common import pyplot, write
from harness.model.checking import check, reference
from harness.model.core import Matmul
from harness.model.inputs import Shape, make_inputs, parse_shape
from harness.model.registry import lookup
from harness.model.timing import SETTLE_SECONDS, interleaved_samples, seconds_per_call
from harness.run import machine
from harness.run.compare import blas_limits

NAME = "blas-grid"
TITLE = "c.packed against NumPy's BLAS, BLIS and torch on the whole shape grid, 1 and 2 threads"
DURATION = "about 8 minutes for the whole grid"  # on a 2-core machine, said before it starts

# The grid: squares, a ragged cube, GEMV (M = 1), matrix-vector (N = 1), small M, small K.
SHAPES = (
    "128",
    "256",
    "512",
    "1024",
    "2048",
    "4096",
    "1023x1025x1027",
    "1x4096x4096",
    "1x8192x8192",
    "4096x1x4096",
    "8x4096x4096",
    "16x4096x4096",
    "64x4096x4096",
    "4096x4096x16",
    "4096x4096x64",
)
TWO_THREADS_ONLY = {"4096"}  # 4096^3 takes seconds a call on one thread; the default grid skips it there
SMALL_SHAPE = "64"  # the call-overhead case, with its own target

TARGET_MIN = 0.9  # c.packed / NumPy on every shape
TARGET_MEDIAN = 1.0  # on the median shape
TARGET_SMALL = 0.7  # at 64^3


def add_arguments(parser) -> None:

    parser.add_argument(
        "--shapes",
        nargs="+",
        type=shape_without_zeros,
        default=list(SHAPES),
        metavar="SHAPE",
        help="shapes, N or MxNxK (default: the grid)",
    )
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="thread counts (default 1 2)")
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "float64"],
        choices=["float32", "float64"],
        metavar="DTYPE",
        help="float32, float64 (default both)",
    )
    parser.add_argument("--rounds", type=count_at_least(1), default=5, help="interleaved rounds per case (default 5)")
    parser.add_argument(
        "--sample-time",
        type=positive_seconds,
        default=0.05,
        help="seconds each call is timed for in one round (default 0.05)",
    )


# The peers c.packed is compared with besides NumPy: column key -> registered implementation.
PEERS = {"blis": "blis.gemm", "torch": "torch.cpu"}

# A cell streams its operands from DRAM when what it reads is over twice the last-level cache
# and it does at most this many FLOPs per byte (GEMV and matrix-vector: 0.5 in float32): its
# time is the memory's, which on a shared host moves by a third from minute to minute. The read
# roof is measured over as many bytes on the same threads beside each library's samples, so
# that each library's time is also a share of the roof it had then (``roof_pct``).
STREAMED_MAX_FLOPS_PER_BYTE = 1


def blis_kernel() -> str | None:
    """Which BLIS runs and its kernel set (haswell, skx, zen3, generic...), or None without one."""

    return blis_description()


def read_bytes(shape: Shape, dtype: str) -> int:
    """What a product reads at least: A and B once."""
    m, n, k = shape
    return (m * k + k * n) * np.dtype(dtype).itemsize


def streams_from_memory(shape: Shape, dtype: str) -> bool:
    """Whether a cell's time is set by reading its operands from DRAM (STREAMED_MAX_FLOPS_PER_BYTE)."""
    nbytes = read_bytes(shape, dtype)
    return nbytes > 2 * machine.last_level_cache_bytes() and shape.flops <= STREAMED_MAX_FLOPS_PER_BYTE * nbytes


def measure_case(shape: Shape, dtype: str, threads: int, rounds: int, sample_time: float) -> dict:
    a, b = make_inputs(shape, dtype)
    packed = Matmul(lookup("c.packed"), threads=threads)
    outcome = check(packed(a, b), a, b, reference(a, b))
    entry = {"shape": str(shape), "dtype": dtype, "threads": threads}
    if not outcome.passed:
        return {**entry, "skipped": f"c.packed FAILED its check: {outcome.message}"}
    calls = {"c.packed": lambda: packed(a, b), "numpy": lambda: a @ b}
    for key, name in PEERS.items():
        peer = lookup(name)
        if peer.available:
            call = Matmul(peer, threads=threads)
            calls[key] = lambda call=call: call(a, b)
    roofs: dict[str, list[float]] = {name: [] for name in calls}  # a streamed cell's read roofs beside each library
    nbytes = read_bytes(shape, dtype)

    def read_roof(name: str) -> None:
        if streams_from_memory(shape, dtype) and (roof := machine.read_gbps_now(nbytes, threads)):
            roofs[name].append(roof)

    with blas_limits(threads):
        if threads == 1:
            samples = interleaved_samples(calls, rounds, sample_time, after_sample=read_roof)
        else:
            samples = {name: [] for name in calls}
            # One library at a time: on a machine with as many cores as threads, a library's
            # idle workers (spinning, or slow to wake) take a core from the next one for a
            # while after every switch, which interleaving would pay on every sample (and the
            # read roof too: it is measured before and after the block, once they sleep).
            for name, call in calls.items():
                time.sleep(SETTLE_SECONDS)
                read_roof(name)
                seconds_per_call(call, sample_time)  # its threads awake and its data in cache
                for _ in range(rounds):
                    samples[name].append(seconds_per_call(call, sample_time))
                time.sleep(SETTLE_SECONDS)
                read_roof(name)
    seconds = {name: statistics.median(values) for name, values in samples.items()}
    gflops = {name: shape.flops / s / 1e9 for name, s in seconds.items()}
    row = {**entry, "seconds": seconds, "gflops": gflops}
    if any(roofs.values()):
        # each library's median time against the median of the roofs measured beside it
        row["roof_pct"] = {
            name: 100.0 * nbytes / seconds[name] / 1e9 / statistics.median(values)
            for name, values in roofs.items()
            if values
        }
    for other, key in (("numpy", "vs_numpy"), *((peer, f"vs_{peer}") for peer in PEERS)):
        if other not in samples:
            row[key], row[key + "_range"] = None, None
            continue
        # Paired within each round (its calls run back to back), so a drift in the machine's
        # speed from one round to the next cancels out of the ratio.
        ratios = [theirs / ours for theirs, ours in zip(samples[other], samples["c.packed"])]
        row[key], row[key + "_range"] = statistics.median(ratios), [min(ratios), max(ratios)]
    return row


def verdict(rows: list[dict]) -> dict:
    """The issue's targets, judged on the measured rows (the 64^3 row judged on its own)."""
    grid = [r for r in rows if "vs_numpy" in r and r["shape"] != str(parse_shape(SMALL_SHAPE))]
    small = [r for r in rows if "vs_numpy" in r and r["shape"] == str(parse_shape(SMALL_SHAPE))]
    if not grid:
        return {}
    ratios = [r["vs_numpy"] for r in grid]
    blis = [r["vs_blis"] for r in grid if r["vs_blis"] is not None]
    torch = [r["vs_torch"] for r in grid if r.get("vs_torch") is not None]
    worst = min(grid, key=lambda r: r["vs_numpy"])
    result = {
        "min_vs_numpy": min(ratios),
        "worst_case": f"{worst['shape']} {worst['dtype']} {worst['threads']}t",
        "median_vs_numpy": statistics.median(ratios),
        "min_vs_blis": min(blis) if blis else None,
        "min_vs_torch": min(torch) if torch else None,
        "below_min": [
            f"{r['shape']} {r['dtype']} {r['threads']}t: {r['vs_numpy']:.2f}" + _roof_note(r)
            for r in grid
            if r["vs_numpy"] < TARGET_MIN
        ],
    }
    result["small_vs_numpy"] = min((r["vs_numpy"] for r in small), default=None)
    return result


def _roof_note(row: dict) -> str:
    """ " (c.packed 81%, NumPy 84% of the read roof)" for a streamed cell, else ""."""
    pcts = row.get("roof_pct") or {}
    if "c.packed" not in pcts or "numpy" not in pcts:
        return ""
    return f" (c.packed {pcts['c.packed']:.0f}%, NumPy {pcts['numpy']:.0f}% of the read roof)"


def roof_lines(rows: list[dict]) -> list[str]:
    """One line per streamed cell: each library's share of the read roof measured beside its samples."""
    return [
        f"{r['shape']} {r['dtype']} {r['threads']}t: "
        + ", ".join(f"{name} {pct:.0f}%" for name, pct in r["roof_pct"].items())
        for r in rows
        if r.get("roof_pct")
    ]


def run(
    out_dir,
    shapes: Sequence[str] = SHAPES,
    threads: Sequence[int] = (1, 2),
    dtypes: Sequence[str] = ("float32", "float64"),
    rounds: int = 5,
    sample_time: float = 0.05,
    progress=None,
) -> dict:

    if progress is None and sys.stderr.isatty():
        progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    parsed = [parse_shape(s) for s in shapes]
    default_grid = list(shapes) == list(SHAPES)  # shapes the user names run at every thread count
    if default_grid:
        parsed.insert(0, parse_shape(SMALL_SHAPE))
    two_threads_only = {parse_shape(s) for s in TWO_THREADS_ONLY} if default_grid else set()
    rows = []
    for t in threads:
        for dtype in dtypes:
            for shape in parsed:
                if t == 1 and shape in two_threads_only:
                    continue
                row = measure_case(shape, dtype, t, rounds, sample_time)
                rows.append(row)
                if progress:
                    progress(_row_line(row))
    data = {
        "description": TITLE,
        "blis_kernel": blis_kernel(),
        "rounds": rounds,
        "sample_time": sample_time,
        "targets": {"min_vs_numpy": TARGET_MIN, "median_vs_numpy": TARGET_MEDIAN, "at_64_vs_numpy": TARGET_SMALL},
        "rows": rows,
        "verdict": verdict(rows),
    }
    data = write(out_dir, NAME, data, _figure(data))
    print(table(data), flush=True)
    return data


def _row_line(row: dict) -> str:
    if "skipped" in row:
        return f"{row['shape']:>16} {row['dtype']} {row['threads']}t: {row['skipped']}"
    peers = "".join(f" {row[f'vs_{p}']:5.2f}x {p}" for p in PEERS if row.get(f"vs_{p}") is not None)
    return (
        f"{row['shape']:>16} {row['dtype']} {row['threads']}t: {row['gflops']['c.packed']:7.1f} GFLOP/s, "
        f"{row['vs_numpy']:5.2f}x NumPy{peers}"
    )


def table(data: dict) -> str:
    """Ratios c.packed / NumPy (and / BLIS / torch), one row per shape, one column per dtype
    and thread count; fits 80 columns."""
    rows = data["rows"]
    columns = sorted({(r["dtype"], r["threads"]) for r in rows}, key=lambda c: (c[0], c[1]))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    by_key = {(r["shape"], r["dtype"], r["threads"]): r for r in rows}
    heads = [f"{'f32' if d == 'float32' else 'f64'} {t}t" for d, t in columns]
    lines = [
        "c.packed speed / NumPy's (/ BLIS's / torch's); above 1 = c.packed faster",
        f"{'shape (MxNxK)':<15}" + "".join(f"{h:>16}" for h in heads),
    ]
    for shape in shapes:
        cells = []
        for d, t in columns:
            r = by_key.get((shape, d, t))
            if r is None:
                cells.append("-")
            elif "skipped" in r:
                cells.append("FAILED")
            else:
                peers = "".join(f"/{r[f'vs_{p}']:.2f}" for p in PEERS if r.get(f"vs_{p}") is not None)
                cells.append(f"{r['vs_numpy']:.2f}{peers}")
        lines.append(f"{shape:<15}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def summarize(data: dict) -> str:
    v = data.get("verdict") or {}
    text = ["```", table(data), "```", ""]
    if v:
        text.append(
            f"Worst shape {v['worst_case']} at {v['min_vs_numpy']:.2f}x NumPy (target {TARGET_MIN}); median "
            f"{v['median_vs_numpy']:.2f}x (target {TARGET_MEDIAN}); least against BLIS "
            + (f"{v['min_vs_blis']:.2f}x" if v["min_vs_blis"] is not None else "not measured")
            + (f"; 64^3 {v['small_vs_numpy']:.2f}x (target {TARGET_SMALL})" if v.get("small_vs_numpy") else "")
            + "; least against torch "
            + (f"{v['min_vs_torch']:.2f}x" if v.get("min_vs_torch") is not None else "not measured")
            + f". BLIS: {data['blis_kernel'] or 'not installed'}."
        )
    streamed = roof_lines(data["rows"])
    if streamed:
        text += [
            "",
            "Cells that read their operands from DRAM, where the memory sets the time: each library's "
            "median time as a share of the read roof measured beside it (as many bytes, the same threads; "
            "on one thread after each of its samples, on two before and after its block of samples), so "
            "that a slow minute shows as a low roof, not as a slow library:",
            "",
            *(f"- {line}" for line in streamed),
        ]
    return "\n".join(text)


def findings(data: dict) -> list[str]:
    """The verdict on the targets (run() prints the whole table)."""
    v = data.get("verdict") or {}
    if not v:
        return ["nothing measured"]
    lines = [
        f"worst {v['min_vs_numpy']:.2f}x NumPy ({v['worst_case']}), median {v['median_vs_numpy']:.2f}x; "
        f"least against BLIS ({data['blis_kernel'] or 'not installed'}): "
        + (f"{v['min_vs_blis']:.2f}x" if v["min_vs_blis"] is not None else "not measured")
        + ", against torch: "
        + (f"{v['min_vs_torch']:.2f}x" if v.get("min_vs_torch") is not None else "not measured")
    ]
    if v.get("small_vs_numpy") is not None:
        lines.append(f"64^3 through the public call: {v['small_vs_numpy']:.2f}x NumPy")
    if v["below_min"]:
        lines.append(f"{len(v['below_min'])} case(s) below {TARGET_MIN}x NumPy: {'; '.join(v['below_min'])}")
    shares = {
        name: [r["roof_pct"][name] for r in data["rows"] if name in r.get("roof_pct", {})]
        for name in ("c.packed", "numpy")
    }
    if all(shares.values()):
        lines.append(
            "cells read from DRAM, share of the read roof measured beside them: "
            + ", ".join(f"{name} {min(p):.0f}-{max(p):.0f}%" for name, p in shares.items())
        )
    return lines


def _figure(data: dict):

    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator

    rows = [r for r in data["rows"] if "vs_numpy" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in data["rows"]))
    figure, ax = plt.subplots(figsize=(10, 4.8))
    styles = {
        ("float32", 1): ("o", "tab:blue"),
        ("float32", 2): ("o", "tab:orange"),
        ("float64", 1): ("s", "tab:blue"),
        ("float64", 2): ("s", "tab:orange"),
    }
    offsets = {("float32", 1): -0.15, ("float32", 2): -0.05, ("float64", 1): 0.05, ("float64", 2): 0.15}
    for (dtype, threads), (marker, colour) in styles.items():
        mine = [r for r in rows if (r["dtype"], r["threads"]) == (dtype, threads)]
        if not mine:
            continue
        xs = [shapes.index(r["shape"]) + offsets[(dtype, threads)] for r in mine]
        ax.scatter(
            xs,
            [r["vs_numpy"] for r in mine],
            marker=marker,
            color=colour,
            label=f"{dtype}, {threads} thread{'s' * (threads > 1)}",
            facecolors="none" if dtype == "float64" else colour,
        )
        spans = [(x, r["vs_numpy_range"]) for x, r in zip(xs, mine) if r.get("vs_numpy_range")]
        if spans:  # the ratio's range over the rounds: how far one round can be from the median
            ax.vlines(
                [x for x, _ in spans],
                [lo for _, (lo, hi) in spans],
                [hi for _, (lo, hi) in spans],
                color=colour,
                linewidth=1,
                alpha=0.6,
            )
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(TARGET_MIN, color="grey", linestyle="--", linewidth=1, label=f"{TARGET_MIN}x (the floor)")
    ax.set_xticks(range(len(shapes)), shapes, rotation=45, ha="right", fontsize=8)
    # A log scale: a ratio of 2 and one of 0.5 are as far from 1, and one noisy round's bar
    # reaching 7 does not flatten the 0.7-1.3 band where the verdict is decided.
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ticks = [t for t in (0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1, 1.2, 1.5, 2, 3, 5, 10, 20) if low <= t <= high]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylabel("c.packed speed / NumPy's (OpenBLAS), log scale\nmedian of the rounds, bar: their range")
    ax.set_title(f"c.packed through harness.get(...)(a, b) against NumPy, {machine.cpu_model()}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return figure
