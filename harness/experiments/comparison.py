"""The main side-by-side comparison, as an experiment: every implementation that runs here
at a few sizes, for the report (the same as ``python -m harness compare``)."""

from __future__ import annotations

from pathlib import Path

from harness.experiments.arguments import shape_without_zeros
from harness.experiments.common import gpu_present, say
from harness.run.compare import compare
from harness.run.render import format_time, rate_text, ratio_text

NAME = "comparison"
TITLE = "Every implementation side by side"
# on a 2-core machine, said before it starts
DURATION = "about 9 minutes on 2 cores (pure Python and naive C at 1024^3 dominate)"

CPU_SHAPES = ("128", "512", "1024", "1x4096x4096")
GPU_SHAPES = ("1024", "2048", "4096", "8192", "1x8192x8192", "1x16384x16384")


def add_arguments(parser) -> None:

    parser.add_argument(
        "--shapes",
        nargs="+",
        type=shape_without_zeros,
        default=None,
        help="default: 128 512 1024 1x4096x4096 (and GPU sizes with a GPU)",
    )
    parser.add_argument("--threads", type=int, default=1)


def run(out_dir, shapes=None, threads: int = 1) -> dict:
    out_dir = Path(out_dir)
    shapes = list(shapes or CPU_SHAPES)
    say(f"comparing every implementation at {', '.join(shapes)}")
    results = compare(shapes, None, ["float32"], threads=threads, progress=True)
    if gpu_present() and not any(s in GPU_SHAPES for s in shapes):
        gpu = compare(
            list(GPU_SHAPES), ["cuda.*", "triton.*", "torch.*"], ["float32", "bfloat16", "float16"], progress=True
        )
        results.rows += gpu.rows
    print(results)
    results.to_json(out_dir / f"{NAME}.json")
    results.to_csv(out_dir / f"{NAME}.csv")
    results.plot(out_dir / f"{NAME}.png")
    return {"experiment": NAME, **results.to_dict()}


def summarize(data: dict) -> str:
    """The rows that ran, as a table; the rest grouped by implementation with the reason."""
    lines = [
        "| implementation | device | shape | dtype | median | GFLOP/s | % peak | vs baseline | status |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    not_run: dict[str, list[str]] = {}
    for r in data["results"]:
        if r["status"].startswith(("skipped", "unavailable")):
            not_run.setdefault(r["implementation"], []).append(f"{r['shape']} {r['dtype']}: {r['status']}")
            continue
        median = format_time(r.get("median_s"))
        gflops = rate_text(r.get("gflops"))
        peak = f"{r['peak_pct']:.1f}%" if r.get("peak_pct") else ""
        speedup = ratio_text(r.get("speedup"))
        status = r["status"] if r.get("mode", "native") == "native" else f"{r['status']} ({r['mode']}, not timed)"
        lines.append(
            f"| `{r['implementation']}` | {r['device']} | {r['shape']} | {r['dtype']} | {median} | {gflops} | "
            f"{peak} | {speedup} | {status.replace('|', '/')} |"
        )
    if not_run:
        lines += ["", "Not run here:", ""]
        for name, reasons in not_run.items():
            shapes = ", ".join(reason.split(":", 1)[0] for reason in reasons)
            first = reasons[0].split(": ", 1)[1]  # the others differ only in the shape they name
            lines.append(f"- `{name}` at {shapes}. {first[0].upper()}{first[1:]}")
    return "\n".join(lines)


def findings(data: dict) -> list[str]:
    rows = [r for r in data["results"] if r.get("gflops")]
    best: dict = {}
    for r in rows:
        key = (r["shape"], r["dtype"], r["device"])
        if key not in best or r["gflops"] > best[key]["gflops"]:
            best[key] = r
    return [
        f"fastest at {shape} {dtype} ({device}): {r['implementation']} {r['gflops']:,.1f} GFLOP/s"
        for (shape, dtype, device), r in best.items()
    ]
