"""Exercise C of the by-hand text: GFLOP/s of the tiled (blocked) matmul against its tile size.

``python -m harness tile-sweep`` times ``c.blocked`` at one shape for each tile size and draws
it against horizontal lines for what it should beat and what it is measured against: the
naive C loops (``c.naive_ikj``; ``c.naive_ijk``, at a smaller shape when the asked one would
take minutes, as the plot and JSON say), the packed SIMD matmul that is the next step
(``c.packed``) and the BLAS (``numpy.matmul``). Every product is checked against the
float64 reference before it is timed; a wrong one is reported, never timed.

What to expect. c.blocked runs naive ikj tile by tile: for each tile of B (``tile`` rows of
B deep; ``tile`` columns wide, but never narrower than its 256-byte register chunk, 64
float32 or 32 float64 columns) it sweeps every row of A, holding a chunk of C's row in
registers across the tile's depth. So the tile sets two things the curve shows:

- how often a chunk of C is loaded and stored: once per ``tile`` multiply-adds per element.
  Small tiles pay that and the loop overhead, and still beat naive ikj, which loads and stores
  C on every multiply-add; the curve rises as the tile deepens.
- how much of B must stay in cache to be reused by the next row of A: tile x tile elements
  (64 x 64 float32 = 16 KiB). While that fits in L1 the curve rises; past L1 (B now streams
  from L2, which almost keeps up with this kernel) it dips a little or holds; once the tile
  outgrows L2 every row of A fetches it again from L3 and the curve falls, towards naive ikj
  and below. The plot marks where the B tile fills L1 and L2 (read from the OS where it says,
  per core), and the findings name them.

The best sits in between, and still well below the BLAS, which also packs and keeps a 2-D
block of C in registers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from harness.env import files
from harness.experiments.arguments import count_at_least, positive_seconds, shape_without_zeros
from harness.model.checking import check, reference
from harness.model.core import InputGuard, Matmul, wrote_inputs_message
from harness.model.inputs import Shape, make_inputs, parse_shape
from harness.model.registry import lookup
from harness.model.timing import time_cpu
from harness.run import machine
from harness.run.compare import blas_limits
from harness.run.render import rate_text
from harness.run.results import finite_or_null

NAME = "tile-sweep"
TITLE = "Tile sweep: c.blocked's GFLOP/s against its tile size, beside naive C and the BLAS (exercise C)"
DURATION = "about 1 minute"  # on a 2-core machine, said before it starts
# c.naive_ijk runs at about 1 GFLOP/s: 1024^3 would take seconds per repeat, so it is timed at
# this size instead when the sweep's shape is larger (its speed hardly depends on size once
# B is out of cache, which 512 already is for its column walk).
NAIVE_IJK_MAX = 512
# c.blocked's widest register chunk (WIDE_CHUNK_BYTES in c/blocked.c): its tiles are never
# narrower than this many bytes of a row of B.
CHUNK_BYTES = 256
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def cache_sizes(root: Path = CACHE_DIR) -> dict[str, int]:
    """Bytes of one core's L1 data, L2 and L3 caches, as Linux lists them; {} where it does not."""
    sizes = {}
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        return sizes
    for entry in entries:
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            text = (entry / "size").read_text().strip().upper()
        except OSError:
            continue
        if kind == "Instruction" or not text:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1], 1)
        try:
            size = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
        sizes.setdefault(f"l{level}", size)
    return sizes


def b_tile_bytes(tile: int, shape: Shape, itemsize: int) -> int:
    """Bytes of the tile of B that c.blocked reuses from cache for every row of A."""
    width = max(tile, CHUNK_BYTES // itemsize)
    return min(tile, shape.k) * min(width, shape.n) * itemsize


def _kib(size: int) -> str:
    return f"{size / 2**20:g} MiB" if size >= 2**20 else f"{size / 2**10:g} KiB"


def _where(size: int, caches: dict) -> str:
    """The smallest cache that holds `size` bytes."""
    for level in ("l1", "l2", "l3"):
        if level in caches and size <= caches[level]:
            return level.upper()
    return "memory"


def add_arguments(parser) -> None:

    parser.add_argument(
        "--shape",
        type=shape_without_zeros,
        default=parse_shape(1024),
        metavar="SHAPE",
        help="N or MxNxK (default 1024)",
    )
    parser.add_argument(
        "--tiles",
        nargs="+",
        type=count_at_least(1),
        default=[8, 16, 32, 64, 128, 256],
        metavar="TILE",
        help="tile sizes (default 8 16 32 64 128 256)",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=1, help="threads for c.packed and the BLAS (default 1)")
    parser.add_argument(
        "--min-time", type=positive_seconds, default=0.2, help="seconds of timed runs per point (default 0.2)"
    )


def summarize(data: dict) -> str:
    """Markdown: one row per tile size, then the reference lines."""
    lines = ["| what | shape | GFLOP/s |", "|---|---|---:|"]
    for row in data["sweep"]:
        speed = rate_text(row["gflops"]) if "gflops" in row else row["status"]
        lines.append(f"| `c.blocked` tile {row['tile']} | {row['shape']} | {speed} |")
    for row in data["lines"]:
        speed = rate_text(row["gflops"]) if "gflops" in row else row["status"]
        lines.append(f"| `{row['implementation']}` | {row['shape']} | {speed} |")
    return "\n".join(lines) + "\n\n" + " ".join(findings(data)[1:])


def _measure(name: str, shape: Shape, dtype: str, min_time: float, **options) -> dict:
    impl = lookup(name)
    entry = {"implementation": name, "shape": str(shape), "options": options}
    reason = impl.unavailable_reason()
    if reason:
        return {**entry, "status": f"unavailable: {reason}"}
    a, b = make_inputs(shape, dtype)
    expected = reference(a, b)  # before the row runs, as compare does; the row gets read-only views
    guard = InputGuard(a, b)
    prepared = Matmul(impl, allow_slow=True, **options).prepare(guard.a, guard.b)
    prepared.run()
    result = prepared.result()
    if guard.written():
        return {**entry, "status": f"FAILED: {wrote_inputs_message(name, guard.written())}"}
    outcome = check(result, a, b, expected)
    entry["max_abs_error"] = outcome.max_abs_error
    if not outcome.passed:
        return {**entry, "status": f"FAILED: {outcome.message}"}
    timing = time_cpu(prepared.run, min_time=min_time)
    return {**entry, "status": "ok", **timing.as_dict(), "gflops": shape.flops / timing.median_s / 1e9}


def run(
    out_dir,
    shape=1024,
    tiles: Sequence[int] = (8, 16, 32, 64, 128, 256),
    dtype: str = "float32",
    threads: int = 1,
    min_time: float = 0.2,
) -> dict:
    """Time c.blocked at every tile size and the reference lines; write tile-sweep.json/.png."""
    shape = parse_shape(shape)
    tiles = [int(t) for t in tiles]
    if not tiles or min(tiles) < 1:
        raise ValueError(f"tile sizes must be >= 1, got {tiles}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    small = (
        shape
        if shape.flops <= Shape(NAIVE_IJK_MAX, NAIVE_IJK_MAX, NAIVE_IJK_MAX).flops
        else Shape(*(min(d, NAIVE_IJK_MAX) for d in shape))
    )

    with blas_limits(threads):
        sweep = [{"tile": t, **_measure("c.blocked", shape, dtype, min_time, tile=t)} for t in tiles]
        lines = [
            _measure("c.naive_ikj", shape, dtype, min_time),
            _measure("c.naive_ijk", small, dtype, min_time),
            _measure("c.packed", shape, dtype, min_time, threads=threads),
            _measure("numpy.matmul", shape, dtype, min_time),
        ]
    for row in sweep + lines:
        label = f"tile {row['tile']:>4}" if "tile" in row else row["implementation"]
        speed = f"{row['gflops']:8.2f} GFLOP/s" if "gflops" in row else row["status"]
        print(f"{label:<14} {row['shape']:>16}  {speed}", flush=True)
    ok = [row for row in sweep if row["status"] == "ok"]
    best = max(ok, key=lambda row: row["gflops"]) if ok else None
    print(f"best tile: {best['tile'] if best else None}", flush=True)
    itemsize = 4 if dtype == "float32" else 8
    for row in sweep:
        row["b_tile_bytes"] = b_tile_bytes(row["tile"], shape, itemsize)
    data = {
        "experiment": NAME,
        "description": "c.blocked GFLOP/s against tile size (exercise C), beside naive C, packed C and the BLAS",
        "shape": str(shape),
        "dtype": dtype,
        "threads": threads,
        "note": "c.blocked and the naive loops run on one thread; c.packed and numpy.matmul on `threads`",
        "sweep": sweep,
        "best_tile": best["tile"] if best else None,
        "lines": lines,
        "caches": cache_sizes(),
        "machine": machine.machine_info(),
    }
    files.write_text(
        out_dir / f"{NAME}.json", json.dumps(finite_or_null(data), indent=2, default=str, allow_nan=False) + "\n"
    )
    _plot(data, out_dir / f"{NAME}.png")
    return data


def _plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    points = [(row["tile"], row["gflops"]) for row in data["sweep"] if row["status"] == "ok"]
    if points:
        ax.plot(
            [p[0] for p in points], [p[1] for p in points], marker="o", color="C0", label=f"c.blocked ({data['shape']})"
        )
    styles = {
        "c.naive_ikj": ("C1", "--"),
        "c.naive_ijk": ("C2", ":"),
        "c.packed": ("C3", "-."),
        "numpy.matmul": ("C4", "-"),
    }
    for line in data["lines"]:
        if line["status"] != "ok":
            continue
        color, style = styles.get(line["implementation"], ("gray", "--"))
        at = "" if line["shape"] == data["shape"] else f" at {line['shape']}"
        ax.axhline(
            line["gflops"], color=color, linestyle=style, label=f"{line['implementation']}{at}: {line['gflops']:.1f}"
        )
    caches = data.get("caches") or {}
    itemsize = 4 if data["dtype"] == "float32" else 8
    for level, style in (("l1", ":"), ("l2", "--")):
        if level in caches:  # the tile edge whose tile x tile B tile just fills this cache
            edge = math.sqrt(caches[level] / itemsize)
            ax.axvline(
                edge,
                color="gray",
                linestyle=style,
                linewidth=1,
                label=f"B tile = {level.upper()} ({_kib(caches[level])}): tile {edge:.0f}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([row["tile"] for row in data["sweep"]])
    ax.set_xticklabels([str(row["tile"]) for row in data["sweep"]])
    ax.set_xlabel("tile edge (elements): c.blocked cuts i, p and j into tiles of this size")
    ax.set_ylabel("GFLOP/s (2*M*N*K / median time)")
    cpu = data["machine"].get("cpu_model", "")
    ax.set_title(f"tile sweep, {data['shape']} {data['dtype']}, {data['threads']} thread(s) - {cpu}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    try:
        files.save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)


def findings(data: dict) -> list[str]:
    sweep = {r["tile"]: r.get("gflops") for r in data["sweep"] if r.get("gflops")}
    lines = {r["implementation"]: r.get("gflops") for r in data["lines"] if r.get("gflops")}
    best = data.get("best_tile")
    caches = data.get("caches") or {}
    sizes = {r["tile"]: r["b_tile_bytes"] for r in data["sweep"] if "b_tile_bytes" in r}
    text = [f"c.blocked at {data['shape']}: " + ", ".join(f"T={t}: {g:.1f}" for t, g in sweep.items()) + " GFLOP/s"]
    if best in sweep:
        held = f", its B tile {_kib(sizes[best])}" if best in sizes else ""
        held += f" in {_where(sizes[best], caches)}" if held and caches else ""
        text.append(
            f"best tile {best} ({sweep[best]:.1f} GFLOP/s{held}); beside it "
            + ", ".join(f"{name} {g:.1f}" for name, g in lines.items())
            + "."
        )
    if caches:
        text.append(
            "Caches of one core: " + ", ".join(f"{k.upper()} {_kib(v)}" for k, v in sorted(caches.items())) + "."
        )
        fits = [t for t in sweep if t in sizes and "l2" in caches and sizes[t] <= caches["l2"]]
        beyond = [t for t in sweep if t in sizes and "l2" in caches and sizes[t] > caches["l2"]]
        if fits and beyond:
            last, first = max(fits), min(beyond)
            text.append(
                f"Past the L2: tile {first}'s B tile ({_kib(sizes[first])}) no longer fits and "
                f"comes from L3 for every row of A: {sweep[first]:.1f} GFLOP/s against "
                f"{sweep[last]:.1f} at tile {last}."
            )
    small = min(sweep) if sweep else None
    if small is not None and "c.naive_ikj" in lines:
        text.append(
            f"Smallest tile {small}: {sweep[small]:.1f} GFLOP/s against naive ikj's "
            f"{lines['c.naive_ikj']:.1f} (it loads and stores C once per {small} multiply-adds, "
            "ikj on every one)."
        )
    return text
