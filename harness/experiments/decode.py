"""What decode costs: time against bytes per weight, and against the batch.

The chapter ends on decode: each projection multiplies one activation row (or a few, with
batching) by a weight matrix, so the kernel reads every weight once and does one multiply-add
with it. Its time is the weights' bytes over the memory bandwidth, until the arithmetic of
unpacking a block (4-bit weights) or of the batch's multiply-adds catches up. Two sweeps at
Llama-3-8B's projection shapes (W [N, K]: 4096 x 4096, 14336 x 4096, 4096 x 14336) and one
whose quantized weights exceed the last-level cache (8192 x 28672):

- M = 1, weights in float32, bf16, q8_0 and q4_0 (4, 2, 1.0625 and 0.5625 bytes per weight),
  on 1 and 2 threads: while memory-bound, time is proportional to bytes;
- the down projection (4096 x 14336) at M = 1 to 64 on 2 threads: the batch reads the same
  weights, so time stays flat until the multiply-adds, not the bytes, set it (the roofline's
  ridge).

Every row is checked before it is timed (harness.compare with weights=...); the libraries a
user would pick (NumPy, BLIS, torch for float32; ggml where installed) run beside ours.
"""

from __future__ import annotations

from harness.experiments.arguments import count_at_least, positive_seconds, shape_without_zeros
from harness.experiments.common import pyplot, say, write
from harness.model.inputs import parse_shape
from harness.model.registry import REGISTRY
from harness.run import machine
from harness.run.compare import compare
from harness.run.render import format_time, ratio_text

NAME = "decode"
TITLE = "Decode: GEMV time against bytes per weight and against the batch (quantized weights)"
# said before it starts
DURATION = "about 10 minutes on 2 cores (making and quantizing 940 MB weight matrices is a good part of it)"

# MxNxK: M activation rows, W [N, K]
SHAPES = ("1x4096x4096", "1x14336x4096", "1x4096x14336", "1x8192x28672")
FORMATS = ("float32", "bf16", "q8_0", "q4_0")
BATCH_SHAPE = "4096x14336"  # N x K of the down projection
BATCHES = (1, 2, 4, 8, 16, 32, 64)
BYTES_PER_WEIGHT = {"float32": 4.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
OURS = ("c.decode", "c.decode_int8", "c.packed")  # c.packed: the float32 GEMV the quantized ones are measured against


def add_arguments(parser) -> None:

    parser.add_argument("--shapes", nargs="+", type=_decode_shape, default=list(SHAPES), help="M = 1 shapes, 1xNxK")
    parser.add_argument("--batches", nargs="+", type=count_at_least(1), default=list(BATCHES), help="batch sizes M")
    parser.add_argument("--batch-shape", type=_batch_shape, default=BATCH_SHAPE, help="NxK of the batch sweep")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="thread counts of the M = 1 sweep")
    parser.add_argument("--min-time", type=positive_seconds, default=0.2, help="seconds of timed runs per row")


def _decode_shape(text: str) -> str:
    """--shapes: 1xNxK, N and K 1 or more."""
    import argparse

    if parse_shape(shape_without_zeros(text)).m != 1:
        raise argparse.ArgumentTypeError(f"invalid decode shape {text!r}: expected M = 1, 1xNxK")
    return text


def _batch_shape(text: str) -> str:
    """--batch-shape: NxK, both 1 or more (the batch sweep's W [N, K])."""
    import argparse

    n, _, k = text.strip().lower().partition("x")
    if not (n.isdigit() and k.isdigit() and int(n) >= 1 and int(k) >= 1):
        raise argparse.ArgumentTypeError(f"invalid batch shape {text!r}: expected NxK, both 1 or more, e.g. 4096x14336")
    return f"{int(n)}x{int(k)}"


def _impls() -> list[str]:
    return [name for name in (*OURS, *(n for n in REGISTRY if n.startswith("ggml."))) if name in REGISTRY]


def _rows(results, sweep: str, threads: int) -> list[dict]:
    rows = []
    for row in results.rows:
        entry = {k: v for k, v in vars(row).items() if v is not None}
        entry.update(sweep=sweep, threads_asked=threads, m=parse_shape(row.shape).m)
        rows.append(entry)
    return rows


def run(
    out_dir, shapes=SHAPES, batches=BATCHES, batch_shape: str = BATCH_SHAPE, threads=(1, 2), min_time: float = 0.2
) -> dict:
    if any(parse_shape(s).m != 1 for s in shapes):
        raise ValueError(f"--shapes are M = 1 decode shapes (1xNxK), got {' '.join(shapes)}")
    n, k = (int(v) for v in batch_shape.lower().split("x"))
    rows = []
    for count in threads:
        say(f"  M = 1, {count} thread(s): {', '.join(shapes)} in {', '.join(FORMATS)}")
        results = compare(list(shapes), _impls(), weights=list(FORMATS), threads=count, min_time=min_time)
        rows += _rows(results, "bytes", count)
    batch_threads = max(threads)
    say(f"  batch M = {', '.join(map(str, batches))} at N x K = {n} x {k}, {batch_threads} thread(s)")
    results = compare(
        [f"{m}x{n}x{k}" for m in batches], _impls(), weights=list(FORMATS), threads=batch_threads, min_time=min_time
    )
    rows += _rows(results, "batch", batch_threads)
    roofs = {str(count): machine.memory_roof_gbps(count) for count in threads}
    peak = machine.cpu_peak_gflops("float32", cores=batch_threads)
    data = {
        "rows": rows,
        "memory_roof_gbps": roofs,
        "peak_gflops": peak,
        "batch_threads": batch_threads,
        "batch_shape": f"{n}x{k}",
        "formats": list(FORMATS),
        "bytes_per_weight": BYTES_PER_WEIGHT,
    }
    return write(out_dir, NAME, data, figure(data))


def _best(rows: list[dict], **match) -> dict | None:
    """The fastest timed row among ``rows`` matching ``match`` (ours and the peers alike)."""
    timed = [r for r in rows if r.get("median_s") and all(r.get(key) == value for key, value in match.items())]
    return min(timed, key=lambda r: r["median_s"]) if timed else None


def _ours(rows: list[dict], **match) -> dict | None:
    return _best([r for r in rows if r["implementation"] in OURS], **match)


def figure(data: dict):
    plt = pyplot()
    rows = data["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    threads = max(int(t) for t in data["memory_roof_gbps"])
    roof = data["memory_roof_gbps"].get(str(threads))
    for index, shape in enumerate(
        sorted({r["shape"] for r in rows if r["sweep"] == "bytes"}, key=lambda s: parse_shape(s).flops)
    ):
        points = [
            (BYTES_PER_WEIGHT[f], row["median_s"] * 1e3)
            for f in data["formats"]
            if (row := _ours(rows, sweep="bytes", shape=shape, weights=f, threads_asked=threads))
        ]
        colour = plt.get_cmap("tab10")(index)
        left.plot(*zip(*points), marker="o", color=colour, label=f"{shape[2:]} (N x K)") if points else None
        if roof:
            n, k = parse_shape(shape).n, parse_shape(shape).k
            bytes_ = [0.5, 4.0]
            left.plot(bytes_, [b * n * k / roof / 1e6 for b in bytes_], linestyle=":", color=colour, linewidth=0.8)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xticks(
        [BYTES_PER_WEIGHT[f] for f in data["formats"]], [f"{f}\n{BYTES_PER_WEIGHT[f]:.3g} B" for f in data["formats"]]
    )
    left.set_xlabel("bytes per weight")
    left.set_ylabel("ms per product (ours: best of c.decode, c.decode_int8; float32: c.packed)")
    left.set_title(
        f"M = 1, {threads} thread(s): time against bytes (dotted: bytes / memory roof"
        + (f", {roof:.0f} GB/s)" if roof else ")"),
        fontsize=9,
    )
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7)

    n, k = (int(v) for v in data["batch_shape"].split("x"))
    for index, fmt in enumerate(data["formats"]):
        points = [
            (m, row["median_s"] * 1e3)
            for m in sorted({r["m"] for r in rows if r["sweep"] == "batch"})
            if (row := _ours(rows, sweep="batch", m=m, weights=fmt))
        ]
        if points:
            right.plot(*zip(*points), marker="o", color=plt.get_cmap("tab10")(index), label=fmt)
    if data.get("peak_gflops"):
        ms = sorted({r["m"] for r in rows if r["sweep"] == "batch"})
        right.plot(
            ms,
            [2 * m * n * k / data["peak_gflops"] / 1e6 for m in ms],
            linestyle="--",
            color="gray",
            label=f"float32 FMA roof ({data['peak_gflops']:.0f} GFLOP/s; not the int8 kernels')",
        )
    right.set_xscale("log", base=2)
    batches = sorted({r["m"] for r in rows if r["sweep"] == "batch"})
    right.set_xticks(batches, [str(m) for m in batches])
    right.set_yscale("log")
    right.set_xlabel("batch M (activation rows sharing each weight read)")
    right.set_ylabel("time per product (ms)")
    right.set_title(f"batched decode, W {n} x {k}, {data['batch_threads']} thread(s)", fontsize=9)
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _ratio(a: dict | None, b: dict | None) -> float | None:
    return b["median_s"] / a["median_s"] if a and b else None


def summarize(data: dict) -> str:
    rows = data["rows"]
    roofs = ", ".join(f"{t} thread(s) {g:.1f} GB/s" for t, g in data["memory_roof_gbps"].items() if g)
    lines = [
        f"- memory roof (streaming read, measured): {roofs or 'not measured'}",
        "",
        "| shape (MxNxK) | threads | weights | ours | time | GB/s | % mem | best peer | peer time | ours vs peer |",
        "|---|---:|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for row in rows:
        if row["sweep"] != "bytes" or row["implementation"] not in OURS or not row.get("median_s"):
            continue
        peers = [
            r
            for r in rows
            if r["sweep"] == "bytes"
            and r["implementation"] not in OURS
            and r["shape"] == row["shape"]
            and r.get("weights") == row.get("weights")
            and r["threads_asked"] == row["threads_asked"]
        ]
        peer = _best(peers)
        memory = f"{row['memory_pct']:.0f}%" if row.get("memory_pct") is not None else ""
        versus = (
            f"`{peer['implementation']}` | {format_time(peer['median_s'])} | {ratio_text(_ratio(row, peer))}"
            if peer
            else " | | "
        )
        lines.append(
            f"| {row['shape']} | {row['threads_asked']} | {row.get('weights')} | `{row['implementation']}` | "
            f"{format_time(row['median_s'])} | {row.get('gbytes_per_s', 0):.1f} | {memory} | {versus} |"
        )
    lines += ["", *(f"- {line}" for line in findings(data))]
    return "\n".join(lines)


def findings(data: dict) -> list[str]:
    rows = data["rows"]
    out = []
    threads = max(int(t) for t in data["memory_roof_gbps"])
    shapes = sorted({r["shape"] for r in rows if r["sweep"] == "bytes"}, key=lambda s: parse_shape(s).flops)
    for shape in shapes:
        f32 = _ours(rows, sweep="bytes", shape=shape, weights="float32", threads_asked=threads)
        q4 = _ours(rows, sweep="bytes", shape=shape, weights="q4_0", threads_asked=threads)
        if f32 and q4:
            bound = "memory" if (q4.get("memory_pct") or 0) >= 70 else "the unpacking arithmetic, not memory"
            out.append(
                f"{shape}, {threads} thread(s): q4_0 runs at {ratio_text(_ratio(q4, f32))} the speed of "
                f"float32 for {4 / BYTES_PER_WEIGHT['q4_0']:.1f}x fewer bytes, at "
                f"{q4.get('memory_pct', 0):.0f}% of the memory roof: bound by {bound}"
            )
    for fmt in ("q4_0", "q8_0", "float32"):
        ratios = []
        for row in rows:
            if row["sweep"] == "bytes" and row.get("weights") == fmt and row["implementation"] in OURS:
                best = _ours(rows, sweep="bytes", shape=row["shape"], weights=fmt, threads_asked=row["threads_asked"])
                peers = [
                    r
                    for r in rows
                    if r["sweep"] == "bytes"
                    and r.get("weights") == fmt
                    and r["shape"] == row["shape"]
                    and r["threads_asked"] == row["threads_asked"]
                    and r["implementation"] not in OURS
                ]
                if best is row and _best(peers):
                    ratios.append((_ratio(row, _best(peers)), row["shape"], row["threads_asked"]))
        if ratios:
            low, high = min(ratios), max(ratios)
            out.append(
                f"{fmt}: ours against the best peer (same shape and threads): {ratio_text(low[0])} "
                f"({low[1]}, {low[2]} thread(s)) to {ratio_text(high[0])} ({high[1]}, {high[2]} thread(s))"
            )
    batch = sorted({r["m"] for r in rows if r["sweep"] == "batch"})
    for fmt in data["formats"]:
        times = {m: row["median_s"] for m in batch if (row := _ours(rows, sweep="batch", m=m, weights=fmt))}
        if 1 in times and len(times) > 1:
            ridge = next((m for m in sorted(times) if times[m] > 1.3 * times[1]), None)
            growth = ", ".join(f"M={m} {times[m] / times[1]:.2f}x" for m in sorted(times) if m > 1)
            turn = f"compute starts to set the time at M = {ridge}" if ridge else "still memory-bound at the largest M"
            out.append(f"batch, {fmt}: time against M = 1: {growth}; {turn}")
    return out
