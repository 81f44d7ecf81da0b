"""Where decode turns into prefill: time per token against the batch, from M = 1 to 1024.

Decode multiplies one row of activations (a token) by each weight matrix; prompt processing
(prefill) multiplies hundreds at once. Per token, decode pays for reading all of W; with M
rows W is read once for all of them, so the time per token falls as 1 / M until the
multiply-adds, not W's bytes, set the time, and then stays flat at the compute roof. The
kernels that multiply bytes (``c.decode_int8``, llama.cpp) have the int8 roof as theirs
(``machine.measured_int8_roof``: vpdpbusd on AVX-512 VNNI, vpmaddubsw on AVX2); the
float32 rows (``c.packed`` and NumPy's BLAS on the dequantized product) the FMA roof.

One W [N, K] (4096 x 4096 by default, Llama-3-8B's attention projections) in q8_0, q4_0, q4_K
and float32, M = 1 .. 1024 on 1 and 2 threads, ours beside current llama.cpp (both of its
placements; its kernel path named) through harness.compare: every row checked before it is
timed, W read from DRAM as in the decode experiment.
"""

from __future__ import annotations

from harness.experiments.arguments import count_at_least, nk_shape, positive_seconds
from harness.experiments.common import pyplot, write
from harness.model.inputs import parse_shape
from harness.model.registry import REGISTRY
from harness.run import machine
from harness.run.compare import compare
from harness.run.render import format_time, ratio_text

NAME = "prefill"
TITLE = "Prefill: time per token against the batch M = 1 .. 1024, int8 and float32 kernels beside llama.cpp"
DURATION = "about 15 minutes on 2 cores"

SHAPE = "4096x4096"  # N x K
BATCHES = (1, 4, 16, 64, 128, 256, 512, 1024)
FORMATS = ("q8_0", "q4_0", "q4_K", "float32")
OURS = ("c.decode_int8", "c.decode", "c.packed")  # c.packed: the float32 product
PEERS = ("llama.cpp.mul_mat", "llama.cpp.mul_mat_plain")
TARGET_BATCHES = (128, 512, 1024)  # the prefill sizes the targets are stated at
# Each problem's rows are timed in rounds (compare's rounds), each row's median round kept: on a
# shared machine one row timed once caught a slow spell (q4_0 at M = 128 on two threads of a
# Zen 4: 0.62x llama.cpp in one pass; 1.49x in five rounds a minute later).
ROUNDS = 3


def add_arguments(parser) -> None:
    parser.add_argument("--shape", default=SHAPE, type=nk_shape, help="N x K of W")
    parser.add_argument("--batches", nargs="+", type=count_at_least(1), default=list(BATCHES), help="batch sizes M")
    parser.add_argument(
        "--formats",
        nargs="+",
        default=list(FORMATS),
        choices=FORMATS,
        metavar="FORMAT",
        help=f"W's formats: {', '.join(FORMATS)} (default all)",
    )
    parser.add_argument("--threads", nargs="+", type=count_at_least(1), default=[1, 2], help="thread counts")
    parser.add_argument(
        "--rounds",
        type=count_at_least(1),
        default=ROUNDS,
        help="each problem's rows timed that many times in turn, each row's median round kept",
    )
    parser.add_argument("--min-time", type=positive_seconds, default=0.2, help="seconds of timed runs per row")


def _impls() -> list[str]:
    return [name for name in (*OURS, *PEERS) if name in REGISTRY]


def run(
    out_dir, shape=SHAPE, batches=BATCHES, formats=FORMATS, threads=(1, 2), min_time: float = 0.2, rounds: int = ROUNDS
) -> dict:
    n, k = (int(v) for v in shape.split("x"))
    rows = []
    for count in threads:
        results = compare(
            [f"{m}x{n}x{k}" for m in batches],
            _impls(),
            weights=list(formats),
            threads=count,
            min_time=min_time,
            baselines=False,
            rounds=rounds,
        )
        for row in results.rows:
            entry = {key: value for key, value in vars(row).items() if value is not None}
            entry.update(threads_asked=count, m=parse_shape(row.shape).m)
            rows.append(entry)
    data = {
        "rows": rows,
        "shape": f"{n}x{k}",
        "formats": list(formats),
        "threads": list(threads),
        "rounds": rounds,
        "int8_roof_gops_per_core": machine.cpu_int8_peak_gops(1),
        "float32_roof_gflops_per_core": machine.cpu_peak_gflops("float32", cores=1),
        "memory_roof_gbps": {str(count): machine.memory_roof_gbps(count) for count in threads},
        "implementations": {name: text for name in _impls() if (text := _describe(name))},
    }
    return write(out_dir, NAME, data, figure(data))


def _describe(name: str) -> str | None:
    from harness.model.registry import describe

    return describe(REGISTRY[name])


def _best(rows: list[dict], names, **match) -> dict | None:
    timed = [
        r
        for r in rows
        if r["implementation"].startswith(names)
        and r.get("median_s")
        and all(r.get(key) == value for key, value in match.items())
    ]
    return min(timed, key=lambda r: r["median_s"]) if timed else None


def _ours(rows, **match):
    return _best(rows, OURS, **match)


def _llama_cpp(rows, **match):
    return _best(rows, ("llama.cpp.",), **match)


def _ratio(ours: dict | None, peer: dict | None) -> float | None:
    return peer["median_s"] / ours["median_s"] if ours and peer else None


def figure(data: dict):
    plt = pyplot()
    rows = data["rows"]
    threads = data["threads"]
    fig, axes = plt.subplots(1, len(threads), figsize=(7 * len(threads), 5.2), squeeze=False)
    n, k = (int(v) for v in data["shape"].split("x"))
    for axis, count in zip(axes[0], threads):
        for index, fmt in enumerate(data["formats"]):
            colour = plt.get_cmap("tab10")(index)
            for pick, style, who in ((_ours, "-", "ours"), (_llama_cpp, "--", "llama.cpp")):
                points = [
                    (m, row["median_s"] / m * 1e3)
                    for m in sorted({r["m"] for r in rows})
                    if (row := pick(rows, m=m, weights=fmt, threads_asked=count))
                ]
                if points:
                    axis.plot(*zip(*points), marker="o", linestyle=style, color=colour, label=f"{fmt}, {who}")
        ms = sorted({r["m"] for r in rows})
        # each roof as the time per token it allows: 2 N K operations at that many per second
        roofs = [(data.get("int8_roof_gops_per_core"), "black", "int8 roof", "GOP/s")]
        if "float32" in data["formats"]:
            roofs.append((data.get("float32_roof_gflops_per_core"), "grey", "float32 FMA roof", "GFLOP/s"))
        for per_core, colour, name, unit in roofs:
            if per_core:
                axis.plot(
                    ms,
                    [2 * n * k / (per_core * count) / 1e6] * len(ms),
                    linestyle=":",
                    color=colour,
                    linewidth=0.9,
                    label=f"{name} ({per_core * count:.0f} {unit})",
                )
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xticks(ms, [str(m) for m in ms])
        axis.set_xlabel("batch M (tokens sharing each read of W)")
        axis.set_ylabel("ms per token")
        axis.set_title(f"W {n} x {k}, {count} thread(s); solid: ours, dashed: llama.cpp", fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def summarize(data: dict) -> str:
    rows = data["rows"]
    int8 = data.get("int8_roof_gops_per_core")
    lines = [
        f"- W {data['shape']}; int8 roof (one core, measured): "
        + (f"{int8:.0f} GOP/s" if int8 else "not measured")
        + "; float32 FMA roof: "
        + (f"{data['float32_roof_gflops_per_core']:.0f} GFLOP/s" if data.get("float32_roof_gflops_per_core") else "?")
        + (
            f"; each time is its row's median of {data['rounds']} rounds, a problem's rows timed in turn"
            if data.get("rounds", 1) > 1
            else ""
        ),
        "",
        "| M | threads | weights | ours | time per token | % peak | llama.cpp | its path | time per token | ours vs "
        "llama.cpp |",
        "|---:|---:|---|---|---:|---:|---|---|---:|---:|",
    ]
    keys = sorted({(r["m"], r["threads_asked"], r["weights"]) for r in rows if r.get("weights")})
    for m, count, fmt in keys:
        match = {"m": m, "threads_asked": count, "weights": fmt}
        ours, peer = _ours(rows, **match), _llama_cpp(rows, **match)
        if not ours:
            continue
        peak = f"{ours['peak_pct']:.0f}% {ours.get('peak_of', '')}" if ours.get("peak_pct") is not None else ""
        theirs = (
            f"`{peer['implementation']}` | {peer.get('path') or ''} | {format_time(peer['median_s'] / m)} | "
            f"{ratio_text(_ratio(ours, peer))}"
            if peer
            else " | | | "
        )
        lines.append(
            f"| {m} | {count} | {fmt} | `{ours['implementation']}` | {format_time(ours['median_s'] / m)} | {peak} "
            f"| {theirs} |"
        )
    return "\n".join([*lines, "", *(f"- {line}" for line in findings(data))])


def findings(data: dict) -> list[str]:
    """One line per format: ours against llama.cpp at the prefill sizes, and the fraction of the
    peak; one line on where the time per token stops falling."""
    rows = data["rows"]
    out = []
    for fmt in data["formats"]:
        parts = []
        for count in data["threads"]:
            ratios = [
                (ratio, m)
                for m in TARGET_BATCHES
                if (
                    ratio := _ratio(
                        *(pick(rows, m=m, weights=fmt, threads_asked=count) for pick in (_ours, _llama_cpp))
                    )
                )
            ]
            peaks = [
                row["peak_pct"]
                for m in TARGET_BATCHES
                if (row := _ours(rows, m=m, weights=fmt, threads_asked=count)) and row.get("peak_pct") is not None
            ]
            text = f"{count} thread(s)"
            if ratios:
                (low, at_low), (high, at_high) = min(ratios), max(ratios)
                text += f" {ratio_text(low)} (M = {at_low}) to {ratio_text(high)} (M = {at_high}) llama.cpp"
            if peaks:
                text += f", {min(peaks):.0f}-{max(peaks):.0f}% of its peak"
            if ratios or peaks:
                parts.append(text)
        if parts:
            out.append(f"{fmt}, M = {'/'.join(map(str, TARGET_BATCHES))}: ours at " + "; ".join(parts))
    turns = []
    count = max(data["threads"])
    for fmt in data["formats"]:
        per_token = {
            m: row["median_s"] / m
            for m in sorted({r["m"] for r in rows})
            if (row := _ours(rows, m=m, weights=fmt, threads_asked=count))
        }
        if len(per_token) > 1:
            floor = min(per_token.values())
            flat = next((m for m, t in per_token.items() if t <= 1.25 * floor), None)
            turns.append(f"{fmt} from M = {flat}")
    if turns:
        out.append(
            f"time per token within 25% of its lowest ({count} thread(s); compute, not W's bytes, sets it): "
            + ", ".join(turns)
        )
    return out
