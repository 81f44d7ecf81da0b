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
  ridge);
- ours against current llama.cpp (both of its placements: repacked as its loader does, and
  plain) and torch's int4 kernel, in q4_0, q8_0 and q4_K at M = 1, 4 and 16 on 1 and 2 threads,
  at the first three shapes, each problem's rows timed in three rounds in turn (PEER_ROUNDS).

Every CPU row reads W from DRAM, as a model's decode does (compare's ``weights_from="dram"``:
each timed call multiplies the next of enough copies of W to exceed the last-level cache four
times over); the memory roof is measured the same way, streaming 512 MiB.

Every row is checked before it is timed (harness.compare with weights=...); the libraries a
user would pick (NumPy, BLIS, torch for float32; llama.cpp and ggml where built) run beside ours.
"""

from __future__ import annotations

from harness.experiments.arguments import count_at_least, nk_shape, positive_seconds, shape_without_zeros
from harness.experiments.common import pyplot, say, write
from harness.model.inputs import parse_shape
from harness.model.registry import REGISTRY
from harness.run import machine
from harness.run.compare import compare
from harness.run.render import format_time, ratio_text

NAME = "decode"
TITLE = "Decode: GEMV time against bytes per weight and against the batch (quantized weights)"
# said before it starts
DURATION = "about 40 minutes on 2 cores (making, quantizing and copying weight matrices of up to 940 MB is much of it)"

# MxNxK: M activation rows, W [N, K]
SHAPES = ("1x4096x4096", "1x14336x4096", "1x4096x14336", "1x8192x28672")
FORMATS = ("float32", "bf16", "q8_0", "q4_0", "q4_K")
BATCH_SHAPE = "4096x14336"  # N x K of the down projection
BATCHES = (1, 2, 4, 8, 16, 32, 64)
BYTES_PER_WEIGHT = {"float32": 4.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_K": 144 / 256}
# The sweep against llama.cpp: its formats, and batches from decode to a few rows.
PEER_FORMATS = ("q4_0", "q8_0", "q4_K")
PEER_BATCHES = (1, 4, 16)
# Its rows are timed in rounds (compare's rounds): at M = 1 both sides stream W at close to the
# memory roof, and on a shared machine that roof moved by a third between rows a minute apart,
# more than the ratios the table is about.
PEER_ROUNDS = 3
PEER_PREFIXES = ("llama.cpp.", "ggml.", "torch.int4")
MARKED_RATIO = 1.2  # ours against llama.cpp: the line the peer panel marks, and the findings' threshold
OURS = ("c.decode", "c.decode_int8", "c.packed")  # c.packed: the float32 GEMV the quantized ones are measured against


def add_arguments(parser) -> None:

    parser.add_argument("--shapes", nargs="+", type=_decode_shape, default=list(SHAPES), help="M = 1 shapes, 1xNxK")
    parser.add_argument("--batches", nargs="+", type=count_at_least(1), default=list(BATCHES), help="batch sizes M")
    parser.add_argument("--batch-shape", type=nk_shape, default=BATCH_SHAPE, help="NxK of the batch sweep")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="thread counts of the M = 1 sweep")
    parser.add_argument(
        "--peer-batches",
        nargs="+",
        type=count_at_least(1),
        default=list(PEER_BATCHES),
        help="batch sizes M of the sweep against llama.cpp (at the first three shapes)",
    )
    parser.add_argument(
        "--peer-rounds",
        type=count_at_least(1),
        default=PEER_ROUNDS,
        help="rounds of the sweep against llama.cpp: each problem's rows timed that many times in turn, "
        "each row's median round kept (compare's rounds)",
    )
    parser.add_argument("--min-time", type=positive_seconds, default=0.2, help="seconds of timed runs per row")


def _decode_shape(text: str) -> str:
    """--shapes: 1xNxK, N and K 1 or more."""
    import argparse

    if parse_shape(shape_without_zeros(text)).m != 1:
        raise argparse.ArgumentTypeError(f"invalid decode shape {text!r}: expected M = 1, 1xNxK")
    return text


def _impls() -> list[str]:
    return [name for name in (*OURS, *(n for n in REGISTRY if n.startswith(PEER_PREFIXES))) if name in REGISTRY]


def _rows(results, sweep: str, threads: int) -> list[dict]:
    rows = []
    for row in results.rows:
        entry = {k: v for k, v in vars(row).items() if v is not None}
        entry.update(sweep=sweep, threads_asked=threads, m=parse_shape(row.shape).m)
        rows.append(entry)
    return rows


def run(
    out_dir,
    shapes=SHAPES,
    batches=BATCHES,
    batch_shape: str = BATCH_SHAPE,
    threads=(1, 2),
    min_time: float = 0.2,
    peer_batches=PEER_BATCHES,
    peer_rounds: int = PEER_ROUNDS,
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
    peer_shapes = [f"{m}x{shape.split('x', 1)[1]}" for shape in shapes[:3] for m in peer_batches]
    for count in threads:
        say(f"  against llama.cpp, {count} thread(s): {', '.join(peer_shapes)} in {', '.join(PEER_FORMATS)}")
        results = compare(
            peer_shapes,
            _impls(),
            weights=list(PEER_FORMATS),
            threads=count,
            min_time=min_time,
            baselines=False,
            rounds=peer_rounds,
        )
        rows += _rows(results, "peers", count)
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
        "peer_formats": list(PEER_FORMATS),
        "weights_from": "dram",
        "peer_rounds": peer_rounds,
        "implementations": _descriptions(),
    }
    return write(out_dir, NAME, data, figure(data))


def _descriptions() -> dict[str, str]:
    """What each row ran (the llama.cpp build and its commit, the libraries' versions)."""
    from harness.model.registry import describe

    return {name: text for name in _impls() if (text := describe(REGISTRY[name]))}


def _best(rows: list[dict], **match) -> dict | None:
    """The fastest timed row among ``rows`` matching ``match`` (ours and the peers alike)."""
    timed = [r for r in rows if r.get("median_s") and all(r.get(key) == value for key, value in match.items())]
    return min(timed, key=lambda r: r["median_s"]) if timed else None


def _ours(rows: list[dict], **match) -> dict | None:
    return _best([r for r in rows if r["implementation"] in OURS], **match)


def figure(data: dict):
    plt = pyplot()
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    rows = data["rows"]
    peers = [r for r in rows if r["sweep"] == "peers"]
    fig, axes = plt.subplots(1, 3 if peers else 2, figsize=(19 if peers else 13, 5.2))
    left, right = axes[0], axes[1]
    threads = max(int(t) for t in data["memory_roof_gbps"])
    roof, roof_kind = _plotted_roof(data, threads)
    for index, shape in enumerate(
        sorted({r["shape"] for r in rows if r["sweep"] == "bytes"}, key=lambda s: parse_shape(s).flops)
    ):
        points = {
            f: (BYTES_PER_WEIGHT[f], row["median_s"] * 1e3)
            for f in data["formats"]
            if (row := _ours(rows, sweep="bytes", shape=shape, weights=f, threads_asked=threads))
        }
        colour = plt.get_cmap("tab10")(index)
        line = [point for f, point in points.items() if f != "q4_K"]  # q4_K: as many bytes as q4_0, its own marker
        left.plot(*zip(*line), marker="o", color=colour, label=f"{shape[2:]} (N x K)") if line else None
        if "q4_K" in points:
            left.plot(*points["q4_K"], marker="x", markersize=8, color=colour, linestyle="none")
        if roof:
            n, k = parse_shape(shape).n, parse_shape(shape).k
            bytes_ = [0.5, 4.0]
            left.plot(bytes_, [b * n * k / roof / 1e6 for b in bytes_], linestyle=":", color=colour, linewidth=0.8)
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    # a range of a decade or two: ticks at 1, 2 and 5 of each, written plainly (0.2, not 2x10^-1)
    left.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    left.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    left.yaxis.set_minor_formatter(NullFormatter())
    ticks: dict[float, list[str]] = {}
    for f in data["formats"]:
        ticks.setdefault(BYTES_PER_WEIGHT[f], []).append(f)
    left.set_xticks(list(ticks), [f"{' / '.join(names)}\n{at:.3g} B" for at, names in ticks.items()])
    left.set_xlabel("bytes per weight")
    left.set_ylabel("ms per product (ours: best of c.decode, c.decode_int8; float32: c.packed)")
    left.set_title(
        f"M = 1, {threads} thread(s): time against bytes (x: q4_K)"
        + (f"\ndotted: bytes / memory roof ({roof_kind} {roof:.0f} GB/s)" if roof else ""),
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
    if peers:
        _peer_panel(axes[2], peers, data, plt)
    fig.tight_layout()
    return fig


def _plotted_roof(data: dict, threads: int) -> tuple[float | None, str]:
    """The roof the time-against-bytes panel draws: the median of those measured beside its
    rows where they were (the roof they are scored against), else the best kept."""
    import statistics

    beside = [
        r["memory_roof_gbps"]
        for r in data["rows"]
        if r["sweep"] == "bytes" and r.get("memory_roof") == "beside" and r.get("threads") == threads
    ]
    if beside:
        return statistics.median(beside), "beside, median"
    return data["memory_roof_gbps"].get(str(threads)), "best kept"


def _peer_panel(axis, peers: list[dict], data: dict, plt) -> None:
    """Ours against llama.cpp's faster placement: the speed ratio against M, one line per format
    and thread count, the geometric mean over the shapes."""
    import math

    batches = sorted({r["m"] for r in peers})
    for index, fmt in enumerate(data.get("peer_formats", [])):
        for threads, style in zip(sorted({r["threads_asked"] for r in peers}), ("-", "--", ":")):
            points = []
            for m in batches:
                ratios = [
                    ratio
                    for shape in {r["shape"] for r in peers if r["m"] == m}
                    if (ratio := _ratio(*_pair(peers, shape=shape, threads_asked=threads, weights=fmt)))
                ]
                if ratios:
                    points.append((m, math.exp(sum(map(math.log, ratios)) / len(ratios))))
            if points:
                axis.plot(
                    *zip(*points),
                    marker="o",
                    linestyle=style,
                    color=plt.get_cmap("tab10")(index),
                    label=f"{fmt}, {threads} thread(s)",
                )
    axis.axhline(1.0, color="gray", linewidth=0.8)
    axis.axhline(MARKED_RATIO, color="gray", linewidth=0.8, linestyle=":")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    low, high = axis.get_ylim()
    ticks = [t for t in (0.25, 0.5, 0.67, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0) if low <= t <= high]
    axis.set_yticks(ticks, [f"{t:g}x" for t in ticks])
    axis.minorticks_off()
    axis.set_xticks(batches, [str(m) for m in batches])
    axis.set_xlabel("batch M")
    axis.set_ylabel("ours vs llama.cpp (speed ratio; above 1: ours faster)")
    axis.set_title("against current llama.cpp, W from DRAM (geometric mean over shapes)", fontsize=9)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7)


def _pair(rows: list[dict], **match) -> tuple[dict | None, dict | None]:
    return _ours(rows, **match), _llama_cpp(rows, **match)


def _ratio(a: dict | None, b: dict | None) -> float | None:
    return b["median_s"] / a["median_s"] if a and b else None


def summarize(data: dict) -> str:
    rows = data["rows"]
    roofs = ", ".join(f"{t} thread(s) {g:.1f} GB/s" for t, g in data["memory_roof_gbps"].items() if g)
    lines = [
        f"- memory roof (streaming read, the best this machine kept): {roofs or 'not measured'}",
        *_roofs_beside(rows),
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
    lines += ["", *peer_table(data), "", *(f"- {line}" for line in findings(data))]
    return "\n".join(lines)


def _roofs_beside(rows: list[dict]) -> list[str]:
    """The range of the read roofs measured beside the rows, per thread count: how far the
    memory moved during the run (% mem is against these)."""
    lines = []
    for threads in sorted({r["threads"] for r in rows if r.get("memory_roof") == "beside"}):
        roofs = [r["memory_roof_gbps"] for r in rows if r.get("memory_roof") == "beside" and r["threads"] == threads]
        span = f"{min(roofs):.1f}" if min(roofs) == max(roofs) else f"{min(roofs):.1f}-{max(roofs):.1f}"
        lines.append(
            f"- read roof measured beside the rows, {threads} thread(s): {span} GB/s "
            "(% mem is against the one beside each row)"
        )
    return lines


def _llama_cpp(rows: list[dict], **match) -> dict | None:
    return _best([r for r in rows if r["implementation"].startswith("llama.cpp.")], **match)


def peer_table(data: dict) -> list[str]:
    """Ours against current llama.cpp (the faster of its two placements, its kernel path named)
    and torch's int4 kernel, weights from DRAM."""
    rows = [r for r in data["rows"] if r["sweep"] == "peers"]
    if not rows:
        return []
    lines = [
        "Against current llama.cpp (the faster of `llama.cpp.mul_mat` and `llama.cpp.mul_mat_plain`), weights "
        "from DRAM:",
        "",
        "| shape (MxNxK) | threads | weights | ours | time | % mem | llama.cpp | its path | time | % mem "
        "| ours vs llama.cpp | ceiling | torch.int4 |",
        "|---|---:|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    keys = sorted(
        {(r["shape"], r["threads_asked"], r["weights"]) for r in rows},
        key=lambda key: (parse_shape(key[0]).n * parse_shape(key[0]).k, key[1], key[2], parse_shape(key[0]).m),
    )
    for shape, threads, fmt in keys:
        match = {"shape": shape, "threads_asked": threads, "weights": fmt}
        ours, peer = _ours(rows, **match), _llama_cpp(rows, **match)
        torch_int4 = _best([r for r in rows if r["implementation"] == "torch.int4"], **match)
        if not ours:
            continue
        lines.append(
            f"| {shape} | {threads} | {fmt} | `{ours['implementation']}` | {format_time(ours['median_s'])} | "
            f"{_percent(ours.get('memory_pct'))} | "
            + (
                f"`{peer['implementation']}` | {peer.get('path') or ''} | {format_time(peer['median_s'])} | "
                f"{_percent(peer.get('memory_pct'))} | {ratio_text(_ratio(ours, peer))} | "
                f"{ratio_text(_ceiling(peer))} | "
                if peer
                else "| | | | | | "
            )
            + (f"{format_time(torch_int4['median_s'])} |" if torch_int4 else " |")
        )
    beside = all(r.get("memory_roof") == "beside" for r in rows if r.get("memory_pct") is not None)
    roof = (
        "the read roof measured beside the rows (their arena of W streamed after each round, same threads)"
        if beside
        else "the best read roof this machine kept"
    )
    lines += [
        "",
        f"% mem: of {roof}. Ceiling: what a kernel reading W at that roof would be against llama.cpp "
        "(100 / its % mem): no kernel goes past it while W comes from DRAM.",
    ]
    return lines


def _percent(value) -> str:
    return f"{value:.0f}%" if value is not None else ""


def _ceiling(peer: dict) -> float | None:
    """The most any kernel can be against ``peer`` while both read W at the memory roof: the
    inverse of the fraction of the roof ``peer`` reads at."""
    pct = peer.get("memory_pct")
    return 100.0 / pct if pct else None


def findings(data: dict) -> list[str]:
    """At most eight lines: one per question the sweeps answer, each a range over shapes and threads."""
    rows = data["rows"]
    out = []
    threads = max(int(t) for t in data["memory_roof_gbps"])
    speedups, roof_pcts = [], []
    for shape in {r["shape"] for r in rows if r["sweep"] == "bytes"}:
        f32 = _ours(rows, sweep="bytes", shape=shape, weights="float32", threads_asked=threads)
        q4 = _ours(rows, sweep="bytes", shape=shape, weights="q4_0", threads_asked=threads)
        if f32 and q4 and _ratio(q4, f32):
            speedups.append((_ratio(q4, f32), shape))
            # how near the roof: from the table against llama.cpp where it has the problem (its
            # rows are timed in rounds; this sweep's once, a slow minute deciding the verdict)
            in_rounds = _ours(rows, sweep="peers", shape=shape, weights="q4_0", threads_asked=threads)
            roof_pcts.append((in_rounds or q4).get("memory_pct") or 0)
    if speedups:
        (low, at_low), (high, at_high) = min(speedups), max(speedups)
        bound = "memory" if min(roof_pcts) >= 70 else "the unpacking arithmetic, not memory"
        out.append(
            f"M = 1, {threads} thread(s): q4_0 runs at {ratio_text(low)} ({at_low}) to {ratio_text(high)} "
            f"({at_high}) the speed of float32 for {4 / BYTES_PER_WEIGHT['q4_0']:.1f}x fewer bytes, at "
            f"{min(roof_pcts):.0f}-{max(roof_pcts):.0f}% of the memory roof: bound by {bound}"
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
                f"M = 1, {fmt}: ours against the best peer (same shape and threads): {ratio_text(low[0])} "
                f"({low[1]}, {low[2]} thread(s)) to {ratio_text(high[0])} ({high[1]}, {high[2]} thread(s))"
            )
    peers = [r for r in rows if r["sweep"] == "peers"]
    for fmt in data.get("peer_formats", []):
        per_threads = []
        for threads_asked in sorted({r["threads_asked"] for r in peers}):
            ratios = []
            for shape in sorted({r["shape"] for r in peers}):
                match = {"shape": shape, "threads_asked": threads_asked, "weights": fmt}
                ratio = _ratio(_ours(peers, **match), _llama_cpp(peers, **match))
                if ratio:
                    ratios.append((ratio, shape))
            if ratios:
                (low, at_low), (high, at_high) = min(ratios), max(ratios)
                per_threads.append(
                    f"{threads_asked} thread(s) {ratio_text(low)} ({at_low}) to {ratio_text(high)} ({at_high})"
                )
        if per_threads:
            out.append(f"{fmt}, weights from DRAM: ours against llama.cpp: {'; '.join(per_threads)}")
    short = [
        (ratio, match, ceiling)
        for shape, threads_asked, fmt in sorted({(r["shape"], r["threads_asked"], r["weights"]) for r in peers})
        for match in [{"shape": shape, "threads_asked": threads_asked, "weights": fmt}]
        if (peer := _llama_cpp(peers, **match))
        and (ratio := _ratio(_ours(peers, **match), peer))
        and ratio < MARKED_RATIO
        and (ceiling := _ceiling(peer))
    ]
    if short:
        out.append(
            f"under {MARKED_RATIO}x llama.cpp, and the most the memory roof allows there (the ceiling): "
            + "; ".join(
                f"{m['weights']} {m['shape']} {m['threads_asked']}T {ratio_text(ratio)} (ceiling {ratio_text(c)})"
                for ratio, m, c in short
            )
        )
    batch = sorted({r["m"] for r in rows if r["sweep"] == "batch"})
    ridges = []
    for fmt in data["formats"]:
        times = {m: row["median_s"] for m in batch if (row := _ours(rows, sweep="batch", m=m, weights=fmt))}
        if 1 in times and len(times) > 1:
            ridge = next((m for m in sorted(times) if times[m] > 1.3 * times[1]), None)
            largest = max(times)
            ridges.append(f"{fmt} at M = {ridge}" if ridge else f"{fmt} not by M = {largest}")
    if ridges:
        out.append(
            "batch: the batch's multiply-adds, not the bytes, start to set the time (30% over M = 1): "
            + ", ".join(ridges)
        )
    return out
