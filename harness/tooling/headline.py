"""The README's headline: what each ladder's best rung reaches, from the committed results.

``python -m harness headline`` reads the main comparison of each results folder
(``results/cpu/comparison.json``, ``results/gpu/comparison.json``), and for each ladder (the
pure-Python, C, CUDA and Triton implementations) on the biggest square problem and on the GEMV
problem it ran, names the first rung and the best one, with the best one's speed against the
device's library baseline and its share of the machine's peak. It writes the table (Markdown,
which the README embeds between markers and a test keeps current) and a figure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.env import files
from harness.model.inputs import parse_shape
from harness.run.plotting import readable_log_ticks
from harness.run.render import format_time, rate_text, ratio_text, short_shape

LADDERS = ("python", "c", "cuda", "triton")  # our implementations; every other language is a library
# Rungs that are not the ladder's technique at work: python.tiled_model models the GPU's tiled
# kernel with NumPy tiles (to count its loads), so it is no pure-Python rung to rank.
MODELS = ("python.tiled_model",)
DTYPES = ("float32", "bfloat16")  # float16 runs the same kernels as bfloat16: one is enough
START, END = "<!-- headline:start -->", "<!-- headline:end -->"


@dataclass(frozen=True)
class Line:
    machine: str
    problem: str  # "1024^3 float32", "GEMV 1x4096x4096 float32"
    ladder: str
    first: dict  # the ladder's first rung that ran (registry order), as a comparison row
    best: dict  # its fastest rung
    baseline: str  # the library it is measured against
    gemv: bool


def _machine_name(data: dict) -> str:
    machine = data.get("machine", {})
    gpu = machine.get("gpu")
    rows = data.get("results", [])
    if isinstance(gpu, dict) and gpu.get("name") and any(row.get("device") == "gpu" for row in rows):
        return gpu["name"]
    threads = (data.get("settings") or {}).get("threads") or machine.get("cores", "?")
    model = machine.get("cpu_model", "CPU").replace("(R)", "").replace("(TM)", "").replace(" Processor", "")
    return f"{model}, {threads} thread{'' if threads == 1 else 's'}"


def lines_from(path) -> list[Line]:
    """The headline lines of one comparison JSON."""
    data = json.loads(Path(path).read_text())
    rows = [
        row
        for row in data.get("results", [])
        if row.get("status") == "ok" and row.get("median_s") and row["implementation"] not in MODELS
    ]
    machine = _machine_name(data)
    baselines = {
        row["implementation"]
        for row in rows
        if row.get("speedup") and abs(row["speedup"] - 1) < 1e-12 and row["language"] not in LADDERS
    }
    problems = {}
    for row in rows:
        if row["dtype"] in DTYPES:
            shape = parse_shape(row["shape"])
            kind = "gemv" if shape.m == 1 else "gemm"
            problems.setdefault((kind, row["dtype"]), set()).add(row["shape"])
    out = []
    for (kind, dtype), shapes in sorted(problems.items(), key=lambda item: (item[0][0], DTYPES.index(item[0][1]))):
        by_size = sorted(shapes, key=lambda text: parse_shape(text).flops, reverse=True)
        for ladder in LADDERS:
            ran = [
                row for row in rows if row["language"] == ladder and row["dtype"] == dtype and row["shape"] in shapes
            ]
            if not ran:
                continue
            # The biggest problem the ladder's first rung ran at (pure Python stops at 512^3), so
            # that the line shows what climbing the whole ladder buys.
            first_name = ran[0]["implementation"]
            shape = next(
                text
                for text in by_size
                if any(row["implementation"] == first_name and row["shape"] == text for row in ran)
            )
            rungs = [row for row in ran if row["shape"] == shape]
            base = next(
                (
                    row["implementation"]
                    for row in rows
                    if row["shape"] == shape and row["dtype"] == dtype and row["implementation"] in baselines
                ),
                "",
            )
            best = max(rungs, key=lambda row: row["gflops"] or 0)
            problem = f"{'GEMV ' if kind == 'gemv' else ''}{short_shape(shape)} {dtype}"
            out.append(Line(machine, problem, ladder, rungs[0], best, base, kind == "gemv"))
    return out


def headline_lines(directories=("results/cpu", "results/gpu")) -> list[Line]:
    lines = []
    for directory in directories:
        path = Path(directory) / "comparison.json"
        if path.is_file():
            lines += lines_from(path)
    return lines


def table(lines: list[Line]) -> str:
    """The Markdown table: one line per ladder and problem."""
    out = [
        "| machine | problem | ladder | first rung | best rung | climb | time | speed | vs baseline | % peak |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for line in lines:
        best = line.best
        speed = (
            f"{rate_text(best.get('gbytes_per_s'))} GB/s" if line.gemv else f"{rate_text(best.get('gflops'))} GFLOP/s"
        )
        climb = line.first["median_s"] / best["median_s"]  # how many times faster the best rung is
        ratio = best.get("speedup")
        if not ratio:
            vs = ""
        elif ratio < 0.1:  # pure Python: how many times slower reads at a glance, 1/3,051x does not
            vs = f"{1 / ratio:,.0f}x slower than {line.baseline}"
        else:
            vs = f"{ratio_text(ratio)} {line.baseline}"
        # A CPU GEMV's % peak is of the FMA roof, which it cannot approach: bandwidth bounds it
        cpu_gemv = line.gemv and best.get("device") == "cpu"
        peak = f"{best['peak_pct']:.0f}%" if best.get("peak_pct") is not None and not cpu_gemv else ""
        peak = "<1%" if peak == "0%" else peak
        out.append(
            f"| {line.machine} | {line.problem} | {line.ladder} | `{line.first['implementation']}` | "
            f"`{best['implementation']}` | {climb:,.0f}x | {format_time(best['median_s'])} | {speed} | "
            f"{vs} | {peak} |"
        )
    return "\n".join(out) + "\n"


def figure(lines: list[Line], path) -> Path:
    """Each ladder's first and best rung as speed against the library baseline (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [line for line in lines if line.best.get("speedup") and line.first.get("speedup")]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(shown) + 1.6))
    labels = [f"{line.ladder}: {line.problem}\n{line.machine.split(',')[0]}" for line in shown]
    positions = range(len(shown))
    firsts = ax.barh(
        [p + 0.2 for p in positions],
        [line.first["speedup"] for line in shown],
        height=0.4,
        color="#bbbbbb",
        label="first rung",
    )
    ax.bar_label(
        firsts, labels=[line.first["implementation"] for line in shown], fontsize=6, padding=2, color="#555555"
    )
    bars = ax.barh(
        [p - 0.2 for p in positions],
        [line.best["speedup"] for line in shown],
        height=0.4,
        color="#1f77b4",
        label="best rung",
    )
    ax.bar_label(
        bars,
        labels=[f"{line.best['implementation']} {ratio_text(line.best['speedup'])}" for line in shown],
        fontsize=7,
        padding=2,
    )
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(positions), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    readable_log_ticks(ax.xaxis)
    values = [line.first["speedup"] for line in shown] + [line.best["speedup"] for line in shown]
    if values:
        ax.set_xlim(min(values) / 2, max(values) * 30)
    ax.set_xlabel("speed against the library baseline (NumPy's BLAS on the CPU, cuBLAS on the GPU; log scale)")
    ax.set_title("What each ladder buys: its first and its best rung", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", which="major", alpha=0.3)
    fig.tight_layout()
    try:
        return files.save_figure(fig, path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)


def write(directories=("results/cpu", "results/gpu"), out="results") -> tuple[Path, Path]:
    """Write <out>/headline.md and <out>/headline.png from the comparisons in ``directories``."""
    lines = headline_lines(directories)
    if not lines:
        raise FileNotFoundError(
            f"no comparison.json with timed rows in {', '.join(map(str, directories))}; "
            "run `python -m harness comparison --out DIR` first"
        )
    return (files.write_text(Path(out) / "headline.md", table(lines)), figure(lines, Path(out) / "headline.png"))
