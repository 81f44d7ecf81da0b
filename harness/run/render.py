"""The terminal table of a comparison and the words around it: what ``print(results)`` shows.

Cells are sized for an 80-column terminal: times in the unit that keeps three digits readable,
ratios far below 1 as fractions (1/310x), and every row that did not run summed up in one line
per reason below the table.
"""

from __future__ import annotations

import io
import math
import re
import shutil
import textwrap
from typing import TYPE_CHECKING

from harness.model.inputs import parse_shape

if TYPE_CHECKING:
    from harness.run.results import Results, Row

NOISY_SPREAD = 0.25  # interquartile range over median beyond which a row is flagged


def table(results: "Results", width: int = 100):
    """The rows that ran (checked, and timed where they run natively), as a rich Table
    sized for ``width`` columns: below 110, only the columns a reader compares (for decode,
    % mem without GFLOP/s and GB/s)."""
    from rich import box
    from rich.table import Table

    wide = width >= 110
    decode = results.decode  # decode problems: bandwidth is the measure, the weights the variable
    title = (
        "decode: Y[M,N] = X[M,K] @ W[N,K]^T, W stored in each format; shapes MxNxK"
        if decode
        else "matmul: C[M,N] = A[M,K] @ B[K,N], shapes MxNxK (N^3: a square)"
    )
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), title_justify="left", title=title
    )
    columns = [
        ("implementation", "left"),
        ("shape", "right"),
        ("weights" if decode else "dtype", "left"),
        ("time", "right"),
    ]
    if wide:
        columns += [("spread", "right")]
    # A decode row is read by how near the memory roof it comes (% mem): its GFLOP/s and GB/s
    # only where there is room for them.
    if wide or not decode:
        columns += [("GFLOP/s", "right")]
    if wide and decode:
        columns += [("GB/s", "right")]
    columns += [("% mem", "right")] if decode else [("% peak", "right")]
    columns += [("vs base", "right")]
    if wide:
        columns += [("max err", "right"), ("threads", "right")]
    columns += [("check", "left")]
    for header, justify in columns:
        # Numbers never wrap; a long implementation name folds onto a second line instead of
        # pushing the numbers out of an 80-column terminal.
        wraps = header in ("implementation", "check")
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    for row in results.ran():
        kind = row.weights if decode else short_dtype(row.dtype)
        cells = [row.implementation, short_shape(row.shape), kind or "", time_cell(row)]
        if wide:
            cells.append(fmt(row.spread, "±{:.0%}"))
        if wide or not decode:
            cells.append(rate_text(row.gflops))
        if wide and decode:
            cells.append(rate_text(row.gbytes_per_s))
        cells.append(peak_cell(row.memory_pct) if decode else peak_cell(row.peak_pct))
        cells.append(ratio_text(row.speedup))
        if wide:
            cells += [fmt(row.max_abs_error, "{:.1e}"), fmt(row.threads, "{}")]
        cells.append(check_cell(row))
        table.add_row(*cells)
    return table


def not_run(results: "Results") -> list[str]:
    """One line per implementation that did not run somewhere: why, and how often."""
    reasons: dict[str, dict[str, list[str | None]]] = {}  # name -> reason -> each row's time estimate
    totals: dict[str, int] = {}
    for row in results.rows:
        totals[row.implementation] = totals.get(row.implementation, 0) + 1
        if row.status.startswith(("skipped", "unavailable")):
            detail = row.status.split(": ", 1)[-1]
            reason = general_reason(row.implementation, detail)
            estimate = re.search(r"\((about [^)]*)\)", detail)
            reasons.setdefault(row.implementation, {}).setdefault(reason, []).append(
                estimate.group(1) if estimate else None
            )
    grouped: dict[str, list[str]] = {}  # one line per reason, naming every implementation it stopped
    for name, by_reason in reasons.items():
        parts = []
        for reason, estimates in by_reason.items():
            text = reason
            if len(estimates) == 1 and estimates[0]:
                text += f" ({estimates[0]})"  # one problem: how long it would have taken
            if len(estimates) != totals[name]:
                text += f" ({len(estimates)} of {totals[name]})"
            if "too long" in reason:
                text += "; allow_slow=True (--allow-slow, MATMUL_ALLOW_SLOW=1) runs it anyway"
            parts.append(text)
        grouped.setdefault("; ".join(parts), []).append(name)
    return [f"{', '.join(names)}: {reason}" for reason, names in grouped.items()]


def weights_from_notes(results: "Results") -> list[str]:
    """Where the timed decode rows read their weights from (compare's ``weights_from``)."""
    timed = [row for row in results.ran() if row.weights_from]
    dram = [row for row in timed if row.weights_from == "dram"]
    warm = sorted({f"{row.shape} {row.weights}" for row in timed if row.weights_from == "cache"})
    arena = results.settings.get("weight_arena_bytes")
    notes = []
    if dram:
        counts = sorted({row.weight_copies for row in dram})
        copies = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        notes.append(
            f"CPU decode rows read W from DRAM: each timed call multiplied the next of {copies} copies of W"
            + (f" ({arena / 2**20:.0f} MiB or more in all)" if arena else "")
        )
    if warm:
        reason = "weights_from='cache'" if results.settings.get("weights_from") == "cache" else "W too small to rotate"
        notes.append(f"W read from cache (one W, repeated; {reason}): {', '.join(warm)}")
    return notes


def roof_notes(results: "Results") -> list[str]:
    """What each decode row's % mem is against: the read roof measured beside it, or the best kept."""
    notes = []
    for kind, text in (
        ("beside", "the read roof measured beside the rows (their arena streamed after each round, same threads)"),
        ("best kept", "the best read roof this machine has measured (kept across runs)"),
    ):
        roofs = sorted({row.memory_roof_gbps for row in results.ran() if row.memory_roof == kind})
        if roofs:
            span = f"{roofs[0]:.1f}" if len(roofs) == 1 else f"{roofs[0]:.1f}-{roofs[-1]:.1f}"
            notes.append(f"% mem{' (other rows)' if notes else ''}: against {text}, {span} GB/s")
    return notes


def path_notes(results: "Results") -> list[str]:
    """The kernel paths a library picked per problem (llama.cpp: repack, tinyBLAS, vec_dot)."""
    by_impl: dict[str, dict[str, list[str]]] = {}
    for row in results.ran():
        if row.path:
            where = f"{row.weights or row.dtype} M = {parse_shape(row.shape).m}"
            entries = by_impl.setdefault(row.implementation, {}).setdefault(row.path, [])
            if where not in entries:
                entries.append(where)
    return [
        f"{name} ran " + "; ".join(f"{path} ({', '.join(wheres)})" for path, wheres in paths.items())
        for name, paths in by_impl.items()
    ]


def render(results: "Results", width: int | None = None) -> str:
    """The table and, below it, what did not run here and why: what ``print`` shows.
    ``width`` defaults to the terminal's (``COLUMNS``), 100 when there is none."""
    from rich.console import Console

    width = width or shutil.get_terminal_size((100, 24)).columns
    console = Console(file=io.StringIO(), width=width, color_system=None)
    out = []
    if results.ran():
        console.print(table(results, width))
        out.append(console.file.getvalue().rstrip("\n"))
    notes = []
    if any(row.spread is not None and row.spread > NOISY_SPREAD for row in results.ran()):
        notes.append(
            f"! the timings of this row spread over ±{NOISY_SPREAD:.0%}: the machine was busy; "
            "rerun it, or raise --min-time"
        )
    # a decode table shows % mem instead of % peak
    if not results.decode and any(row.peak_pct is not None and row.peak_pct > 100 for row in results.ran()):
        notes.append(
            "? above 100% of the peak: the roof was under-measured on this machine (see the JSON's machine section)"
        )
    if any(row.memory_pct is not None and row.memory_pct > 100 for row in results.ran()):
        notes.append(
            "? above 100% of the memory roof: the roof read less than the row did (measured beside it, a busy or "
            "slow moment of the host's memory fell on the roof; --rounds 3 takes the median of three)"
        )
    stand_ins = sorted({row.mode for row in results.ran() if row.mode != "native"})
    if stand_ins:
        notes.append(f"ok* {' / '.join(stand_ins)}, not timed: GPU code checked on a CPU stand-in")
    empty = sorted({row.shape for row in results.ran() if "0" in row.shape.split("x")})
    if empty:
        notes.append(f"{', '.join(empty)}: empty problems (a dimension 0), checked and never timed")
    rounds = results.settings.get("rounds", 1)
    if rounds > 1:
        notes.append(f"each time is its row's median of {rounds} rounds, the rows timed in turn (--rounds)")
    notes += weights_from_notes(results) + roof_notes(results) + path_notes(results)
    for row in results.ran():
        if not row.passed:
            notes.append(f"{row.implementation} {row.shape} {row.dtype}: {row.status}")
    for name, text in results.machine.get("implementations", {}).items():
        if any(row.implementation == name for row in results.ran()):
            # a description's further lines are warnings ("! ..."): each a note of its own
            description, *warnings = str(text).split("\n")
            notes.append(f"{name}: {description}")
            notes += warnings
    for note in notes:
        out.append(textwrap.fill(note, width, subsequent_indent="  "))
    missing = not_run(results)
    if missing:
        out.append("not run here:")
        out += [textwrap.fill(line, width, initial_indent="  ", subsequent_indent="    ") for line in missing]
    return "\n".join(out) + "\n"


def ratio_text(ratio) -> str:
    """A speed ratio a person reads: 1.03x, 0.35x; below 0.1 as a fraction, 1/310x, so that the
    pure-Python rows say how far behind they are instead of all reading 0.00x."""
    if ratio is None or (isinstance(ratio, float) and not math.isfinite(ratio)) or ratio <= 0:
        return ""
    if ratio >= 0.1:
        return f"{ratio:.2f}x"
    return f"1/{1 / ratio:,.0f}x"


def rate_text(value) -> str:
    """A rate (GFLOP/s, GB/s) in plain digits: 0.0125, 93.1, 5,370 (never 5.37e+03)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def fmt(value, pattern: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)


def format_time(seconds) -> str:
    """Three significant digits in the unit that keeps them readable: 12.3 us, 4.56 ms, 789 s, 2.1 h."""
    if seconds is None:
        return ""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 100:
        return f"{seconds:.0f} s"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= factor or unit == "ns":
            value = seconds / factor
            return f"{value:.{max(0, 2 - int(math.floor(math.log10(value)))) if value > 0 else 0}f} {unit}"
    return ""


def time_cell(row: "Row") -> str:
    text = format_time(row.median_s)
    if text and row.spread is not None and row.spread > NOISY_SPREAD:
        text += " !"
    return text


def peak_cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.0f}%?" if value > 100 else f"{value:.0f}%" if value >= 10 else f"{value:.1f}%"


def check_cell(row: "Row") -> str:
    """ok, ok* (a CPU stand-in: checked, not timed), FAILED or error (the reason below the table)."""
    if row.passed:
        return "ok" if row.mode == "native" else "ok*"
    return row.status.split(":", 1)[0]


def short_shape(shape: str) -> str:
    m, n, k = shape.split("x")
    return f"{m}^3" if m == n == k else shape


def short_dtype(name: str) -> str:
    return {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}.get(name, name)


def general_reason(name: str, reason: str) -> str:
    """A refusal's reason without its problem's particulars (the shape, the dtype, what was
    got), so one line can stand for every problem it refused: its first clause, to act on."""
    if reason.startswith(name + " "):
        reason = reason[len(name) + 1 :]
    reason = re.sub(r" at \d+x\d+x\d+ \(MxNxK\)| \(about [^)]*\)|,? got .*$| \(got [^)]*\)", "", reason)
    for separator in ("; ", ". ", ": the limit"):
        reason = reason.split(separator, 1)[0]
    return reason.rstrip(" .:")
