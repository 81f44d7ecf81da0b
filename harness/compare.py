"""``harness.compare``: check and time implementations side by side.

For every (shape, dtype, implementation): refuse what the implementation cannot take (the
row says why), prepare the inputs (not timed), run once and check the product against the
float64 reference, and only then time it. A product that fails its check is never timed.
Emulated and interpreted runs (CPU stand-ins for GPU code) are checked but not timed.
"""
from __future__ import annotations

import csv
import io
import json
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import files, machine
from .checking import Reference, check, reference_data
from .core import InputGuard, Matmul, MatmulInputError, check_problem, tried_to_write_inputs, wrote_inputs_message
from .inputs import Shape, dtype_name, make_inputs, parse_shape
from .registry import REGISTRY, implementations
from .timing import time_cpu


@dataclass
class Row:
    implementation: str
    language: str
    device: str
    shape: str            # MxNxK
    dtype: str
    status: str           # "ok", "FAILED: ...", "skipped: ...", "unavailable: ...", "error: ..."
    mode: str = "native"  # native, emulated, interpreted
    loader: str | None = None  # what loaded a compiled GPU kernel (pycuda, cupy, emulation)
    median_s: float | None = None
    min_s: float | None = None
    spread: float | None = None
    repeats: int | None = None
    gflops: float | None = None
    gbytes_per_s: float | None = None  # (M*K + K*N + M*N) * itemsize / time: the least traffic
    peak_pct: float | None = None
    speedup: float | None = None  # baseline time / this time, same shape, dtype and device
    max_abs_error: float | None = None
    threads: int | None = None

    @property
    def passed(self) -> bool:
        return self.status == "ok"

    @property
    def timed(self) -> bool:
        return self.median_s is not None


@dataclass
class Results:
    rows: list[Row]
    machine: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, implementation: str, shape, dtype: str = "float32") -> Row:
        shape = str(parse_shape(shape))
        for row in self.rows:
            if row.implementation == implementation and row.shape == shape and row.dtype == dtype_name(dtype):
                return row
        raise KeyError(f"no result for {implementation} at {shape} {dtype}")

    # --- output -----------------------------------------------------------------------
    def table(self, width: int = 100):
        """The rows that ran (checked, and timed where they run natively), as a rich Table
        sized for ``width`` columns: below 110, only the columns a reader compares."""
        from rich import box
        from rich.table import Table

        wide = width >= 110
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), title_justify="left",
                      title="matmul: C[M,N] = A[M,K] @ B[K,N], shapes MxNxK (N^3: a square)")
        columns = [("implementation", "left"), ("shape", "right"), ("dtype", "left"), ("time", "right")]
        if wide:
            columns += [("spread", "right")]
        columns += [("GFLOP/s", "right"), ("% peak", "right"), ("vs base", "right")]
        if wide:
            columns += [("max err", "right"), ("threads", "right")]
        columns += [("check", "left")]
        for header, justify in columns:
            table.add_column(header, justify=justify, no_wrap=header != "check")
        for row in self.ran():
            cells = [row.implementation, _short_shape(row.shape), _short_dtype(row.dtype), _time_cell(row)]
            if wide:
                cells.append(_fmt(row.spread, "±{:.0%}"))
            cells += [_fmt(row.gflops, "{:,.3g}" if (row.gflops or 0) < 1000 else "{:,.0f}"), _peak_cell(row.peak_pct),
                      ratio_text(row.speedup)]
            if wide:
                cells += [_fmt(row.max_abs_error, "{:.1e}"), _fmt(row.threads, "{}")]
            cells.append(_check_cell(row))
            table.add_row(*cells)
        return table

    def ran(self) -> list[Row]:
        """Rows that ran (checked, passed or not), per shape the timed ones first."""
        shapes = list(dict.fromkeys((row.shape, row.dtype) for row in self.rows))
        ran = [row for row in self.rows if not row.status.startswith(("skipped", "unavailable"))]
        return sorted(ran, key=lambda row: (shapes.index((row.shape, row.dtype)), not row.timed))

    def not_run(self) -> list[str]:
        """One line per implementation that did not run somewhere: why, and how often."""
        import re

        reasons: dict[str, dict[str, list[str | None]]] = {}  # name -> reason -> each row's time estimate
        totals: dict[str, int] = {}
        for row in self.rows:
            totals[row.implementation] = totals.get(row.implementation, 0) + 1
            if row.status.startswith(("skipped", "unavailable")):
                detail = row.status.split(": ", 1)[-1]
                reason = _general_reason(row.implementation, detail)
                estimate = re.search(r"\((about [^)]*)\)", detail)
                reasons.setdefault(row.implementation, {}).setdefault(reason, []).append(
                    estimate.group(1) if estimate else None)
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

    def render(self, width: int | None = None) -> str:
        """The table and, below it, what did not run here and why: what ``print`` shows.
        ``width`` defaults to the terminal's (``COLUMNS``), 100 when there is none."""
        import shutil
        import textwrap

        from rich.console import Console

        width = width or shutil.get_terminal_size((100, 24)).columns
        console = Console(file=io.StringIO(), width=width, color_system=None)
        out = []
        if self.ran():
            console.print(self.table(width))
            out.append(console.file.getvalue().rstrip("\n"))
        notes = []
        if any(row.spread is not None and row.spread > NOISY_SPREAD for row in self.ran()):
            notes.append(f"! the timings of this row spread over ±{NOISY_SPREAD:.0%}: the machine was busy; "
                         "rerun it, or raise --min-time")
        if any(row.peak_pct is not None and row.peak_pct > 100 for row in self.ran()):
            notes.append("? above 100% of the peak: the roof was under-measured on this machine "
                         "(see the JSON's machine section)")
        stand_ins = sorted({row.mode for row in self.ran() if row.mode != "native"})
        if stand_ins:
            notes.append(f"ok* {' / '.join(stand_ins)}, not timed: GPU code checked on a CPU stand-in")
        for row in self.ran():
            if not row.passed:
                notes.append(f"{row.implementation} {row.shape} {row.dtype}: {row.status}")
        for name, text in self.machine.get("implementations", {}).items():
            if any(row.implementation == name for row in self.ran()):
                notes.append(f"{name}: {text}")
        for note in notes:
            out.append(textwrap.fill(note, width, subsequent_indent="  "))
        missing = self.not_run()
        if missing:
            out.append("not run here:")
            out += [textwrap.fill(line, width, initial_indent="  ", subsequent_indent="    ") for line in missing]
        return "\n".join(out) + "\n"

    def __str__(self) -> str:
        return self.render()

    @classmethod
    def from_json(cls, path) -> "Results":
        """Results written by ``to_json``, to print, plot or judge again."""
        data = json.loads(Path(path).read_text())
        fields = set(Row.__dataclass_fields__)
        rows = [Row(**{k: v for k, v in row.items() if k in fields}) for row in data["results"]]
        return cls(rows, data.get("machine", {}), data.get("settings", {}))

    def to_dict(self) -> dict:
        return {"machine": self.machine, "settings": self.settings, "results": [asdict(r) for r in self.rows]}

    def to_json(self, path) -> Path:
        """Strict JSON: a number that is NaN or infinite (the error of a failed row) is
        written as null; the row's status says what happened."""
        return files.write_text(path, json.dumps(_finite_or_null(self.to_dict()), indent=2, default=str,
                                                 allow_nan=False) + "\n")

    def to_csv(self, path) -> Path:
        names = list(Row.__dataclass_fields__)
        with files.replacing(path, newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=names)
            writer.writeheader()
            for row in self.rows:
                writer.writerow(asdict(row))
        return Path(path)

    def plot(self, path, title: str | None = None) -> Path:
        """GFLOP/s against problem size, one line per implementation and dtype; GEMV shapes
        (M = 1), which no size axis orders sensibly, get a panel of their own in GB/s."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        timed = [row for row in self.rows if row.gflops is not None]
        gemv = [row for row in timed if parse_shape(row.shape).m == 1]
        gemm = [row for row in timed if parse_shape(row.shape).m != 1]
        panels = 2 if gemv and gemm else 1
        fig, axes = plt.subplots(1, panels, figsize=(9 + 5 * (panels - 1), 5.5), squeeze=False,
                                 gridspec_kw={"width_ratios": [9, 5][:panels]})
        several_dtypes = len({row.dtype for row in timed}) > 1

        def label(row):
            return f"{row.implementation} ({row.dtype})" if several_dtypes else row.implementation

        if timed and all(row.device == "gpu" for row in timed) and self.machine.get("gpu"):
            heading = title or f"matmul - {self.machine['gpu'].get('name', 'GPU')}"
        else:
            cpu = self.machine.get("cpu_model", "")
            threads = self.settings.get("threads")
            heading = title or f"matmul - {cpu}" + (f", {threads} thread(s)" if threads else "")
        # One colour per implementation, one line style per dtype: a dozen series stay apart.
        names = sorted({row.implementation for row in timed})
        colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
        styles = {dtype: style for dtype, style in zip(sorted({row.dtype for row in timed}), ("-", "--", ":", "-."))}
        dtypes = ", ".join(sorted({row.dtype for row in timed}))
        heading += f" ({dtypes})" if dtypes else ""
        if gemm or not gemv:
            ax = axes[0][0]
            # one tick per shape, in order of FLOPs and labelled MxNxK: 512x512x1024 stays
            # readable, where a "size" axis (the cube root of M*N*K) would hide it
            shapes = sorted({row.shape for row in gemm}, key=lambda text: parse_shape(text).flops)
            series: dict[tuple[str, str], list[tuple[int, float]]] = {}
            for row in gemm:
                series.setdefault((row.implementation, row.dtype), []).append((shapes.index(row.shape), row.gflops))
            for (name, dtype), points in series.items():
                points.sort()
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colours[name],
                        linestyle=styles[dtype], label=f"{name} ({dtype})" if several_dtypes else name)
            ax.set_xticks(range(len(shapes)), [_short_shape(text) for text in shapes])
            ax.set_xlim(-0.3, len(shapes) - 0.7)
            ax.set_yscale("log")
            _readable_log_ticks(ax.yaxis)
            ax.set_xlabel("shape (MxNxK; N^3 a square), in order of FLOPs")
            ax.set_ylabel("GFLOP/s (2*M*N*K / median time)")
            ax.set_title(heading, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if series:
                # below the axes, where it hides no point however many series there are
                ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
        if gemv:
            ax = axes[0][panels - 1]
            names = [f"{label(row)} {row.shape}" for row in gemv]
            values = [row.gbytes_per_s for row in gemv]
            bars = ax.barh(names, values, color=[colours[row.implementation] for row in gemv])
            # GB/s spans orders of magnitude (pure Python to BLAS): a log axis keeps every bar
            # visible, and each bar carries its value
            ax.set_xscale("log")
            _readable_log_ticks(ax.xaxis)
            ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values], fontsize=7, padding=2)
            ax.set_xlim(min(values) / 2, max(values) * 4)
            ax.invert_yaxis()
            ax.set_xlabel("GB/s (matrix, vector and result, once each; log scale)")
            ax.set_title("GEMV shapes (M = 1): a bandwidth problem" if gemm else heading, fontsize=10)
            ax.tick_params(axis="y", labelsize=7)
        fig.tight_layout()
        try:
            return files.save_figure(fig, path, dpi=120, bbox_inches="tight")
        finally:
            plt.close(fig)


def _readable_log_ticks(axis) -> None:
    """Plain numbers (0.1, 10, 1,000) on a log axis instead of 10^k, and no unlabelled minor ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def _finite_or_null(value):
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def ratio_text(ratio) -> str:
    """A speed ratio a person reads: 1.03x, 0.35x; below 0.1 as a fraction, 1/310x, so that the
    pure-Python rows say how far behind they are instead of all reading 0.00x."""
    if ratio is None or (isinstance(ratio, float) and not math.isfinite(ratio)) or ratio <= 0:
        return ""
    if ratio >= 0.1:
        return f"{ratio:.2f}x"
    return f"1/{1 / ratio:,.0f}x"


def _fmt(value, pattern: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)


NOISY_SPREAD = 0.25  # interquartile range over median beyond which a row is flagged


def _format_time(seconds) -> str:
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


def _time_cell(row: "Row") -> str:
    text = _format_time(row.median_s)
    if text and row.spread is not None and row.spread > NOISY_SPREAD:
        text += " !"
    return text


def _peak_cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.0f}%?" if value > 100 else f"{value:.0f}%" if value >= 10 else f"{value:.1f}%"


def _check_cell(row: "Row") -> str:
    """ok, ok* (a CPU stand-in: checked, not timed), FAILED or error (the reason below the table)."""
    if row.passed:
        return "ok" if row.mode == "native" else "ok*"
    return row.status.split(":", 1)[0]


def _short_shape(shape: str) -> str:
    m, n, k = shape.split("x")
    return f"{m}^3" if m == n == k else shape


def _short_dtype(name: str) -> str:
    return {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}.get(name, name)


def _general_reason(name: str, reason: str) -> str:
    """A refusal's reason without its problem's particulars (the shape, the dtype, what was
    got), so one line can stand for every problem it refused: its first clause, to act on."""
    import re

    if reason.startswith(name + " "):
        reason = reason[len(name) + 1:]
    reason = re.sub(r" at \d+x\d+x\d+ \(MxNxK\)| \(about [^)]*\)|,? got .*$| \(got [^)]*\)", "", reason)
    for separator in ("; ", ". ", ": the limit"):
        reason = reason.split(separator, 1)[0]
    return reason.rstrip(" .:")


def blas_limits(threads: int | None):
    """Pin the BLAS (and OpenMP) thread pools for the timed region."""
    if threads is None:
        return nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads)


def _with_baselines(chosen: list, include_baselines: bool) -> list:
    """``chosen`` plus, for each device among them, its baseline and the peers installed here
    (the libraries a user would pick instead: BLIS, torch's CPU matmul)."""
    if not include_baselines:
        return chosen
    devices = {impl.device for impl in chosen}
    extra = [impl for impl in REGISTRY.values()
             if impl.device in devices and impl not in chosen and (impl.baseline or (impl.peer and impl.available))]
    return chosen + extra


def describe(impl) -> str | None:
    """What the implementation runs on this machine when that varies (a peer library's version
    and kernel set), or None."""
    describer = getattr(impl.backend, "describe", None)
    if describer is None or not impl.available:
        return None
    try:
        return describer(impl)
    except Exception as error:  # a description is a courtesy: never a reason for a row to fail
        return f"({type(error).__name__}: {error})"


def compare(
    shapes: Iterable = (256,),
    impls: Sequence[str] | str | None = None,
    dtypes: Sequence[str] | str = ("float32",),
    *,
    threads: int | None = 1,
    min_time: float = 0.2,
    seed: int = 0,
    allow_slow: bool | None = None,
    baselines: bool = True,
    progress: bool = False,
    options: dict | None = None,
) -> Results:
    """Check and time ``impls`` (names or glob patterns) on every shape and dtype.

    ``threads`` pins the BLAS thread pool and is passed to implementations that take a thread
    count (None leaves both at their defaults). The library baseline of each device is added
    unless ``baselines=False``. ``options`` maps an implementation name to keyword options
    (``{"c.blocked": {"tile": 32}}``).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    if threads is not None:
        from .backends.c import default_threads

        cores = default_threads()
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= cores:
            raise ValueError(f"threads must be a whole number from 1 to {cores} (the cores this process may use), "
                             f"or None for each library's default; got {threads!r}")
    shapes = [parse_shape(s) for s in ([shapes] if isinstance(shapes, (str, int)) else shapes)]
    dtypes = [dtype_name(d) for d in ([dtypes] if isinstance(dtypes, str) else dtypes)]
    patterns = [impls] if isinstance(impls, str) else list(impls or [])
    chosen = _with_baselines(implementations(*patterns), baselines)
    options = options or {}

    tasks = [(shape, dtype, impl) for shape in shapes for dtype in dtypes for impl in chosen]
    rows: list[Row] = []
    bar = _progress_bar(len(tasks)) if progress else None
    with (bar or nullcontext()):
        task_id = bar.add_task("comparing", total=len(tasks)) if bar else None
        current: tuple[Shape, str] | None = None
        for shape, dtype, impl in tasks:
            if bar:
                bar.update(task_id, description=f"{impl.name} {shape} {dtype}")
            if current != (shape, dtype):
                # Inputs and reference once per shape and dtype (tasks are ordered so), made
                # when a row first needs them, and only the current ones held: at 8192^2 each
                # set is over a gigabyte, and a shape nothing can run needs neither.
                current = (shape, dtype)
                problem = _Problem(shape, dtype, seed, [impl.device for impl in chosen])
            rows.append(_measure(impl, problem, threads, min_time, allow_slow, options.get(impl.name, {})))
            if bar:
                bar.advance(task_id)
    _fill_speedups(rows)
    settings = {"threads": threads, "min_time_s": min_time, "seed": seed, "shape_order": "MxNxK"}
    info = machine.machine_info()
    described = {impl.name: describe(impl) for impl in chosen}
    info["implementations"] = {name: text for name, text in described.items() if text}
    if any(row.device == "gpu" and row.timed for row in rows):
        info["gpu"] = _gpu_info()
    return Results(rows, info, settings)


# Above this many FLOPs, and with a GPU among the implementations, the float64 reference is
# computed on the GPU: NumPy's float64 product of 8192^3 takes seconds on the host.
GPU_REFERENCE_MIN_FLOPS = 2 * 1024**3


def _reference_on_gpu(flops: float, devices) -> bool:
    from . import gpu

    return flops >= GPU_REFERENCE_MIN_FLOPS and "gpu" in devices and gpu.available()


def reference_for(a: np.ndarray, b: np.ndarray, devices) -> Reference:
    """The float64 reference of ``a @ b`` (``checking.Reference``): on the GPU when GPU implementations will be
    checked against it, a GPU is here and the problem is big; else NumPy's on the host."""
    from . import gpu

    if _reference_on_gpu(2 * a.shape[0] * a.shape[1] * b.shape[1], devices):
        return gpu.reference(a, b)
    return reference_data(a, b)


def _gpu_info() -> dict:
    """The device, and its memory roof measured now beside the datasheet's (GEMV rows are
    scored against both)."""
    from . import gpu

    info = gpu.device_info()
    info["copy_bandwidth_gbps"] = round(gpu.copy_bandwidth_gbps(), 1)
    return info


def _threads_used(impl, threads: int | None, run_options: dict) -> int:
    """The thread count a CPU row runs with (None: the library's or the kernel's default)."""
    if impl.threaded:
        chosen = run_options.get("threads")
        if chosen is None:
            from .backends.c import default_threads

            return default_threads()
        return int(chosen)
    if impl.baseline:
        if threads is not None:
            return threads
        from threadpoolctl import threadpool_info

        counts = [pool["num_threads"] for pool in threadpool_info() if pool.get("user_api") == "blas"]
        return max(counts, default=1)
    return 1


class _Problem:
    """One shape and dtype of a comparison: its inputs and float64 reference, made when the
    first row needs them.

    The inputs are made read-only and the reference is computed from them before any row
    runs. Each row gets read-only views (``row_inputs``) and, after it ran, ``written()`` says
    whether it wrote into them anyway; if it did, the inputs are made again (they are seeded,
    so bit for bit the same) and the next row sees the problem the reference was computed on.
    """

    def __init__(self, shape: Shape, dtype: str, seed: int, devices: list[str]):
        self.shape, self.dtype, self.seed, self.devices = shape, dtype, seed, devices
        self._inputs = self._reference = self._guard = None

    def _make_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        a, b = make_inputs(self.shape, self.dtype, self.seed)
        a.flags.writeable = False
        b.flags.writeable = False
        return a, b

    @property
    def inputs(self) -> tuple[np.ndarray, np.ndarray]:
        if self._inputs is None:
            self._inputs = self._make_inputs()
            # Before any row runs: no implementation can have touched what it is computed from.
            if _reference_on_gpu(self.shape.flops, self.devices):
                from .gpu import DeviceProblem

                self._reference = DeviceProblem(*self._inputs)
            else:
                self._reference = reference_data(*self._inputs)
        return self._inputs

    def row_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """Read-only views of the inputs for one row, watched for writes by ``written``."""
        self._guard = InputGuard(*self.inputs)
        return self._guard.a, self._guard.b

    def written(self) -> list[str]:
        """The inputs the current row wrote into ("A", "B"); they are made afresh for the next row."""
        written = self._guard.written() if self._guard else []
        if written:
            self._inputs = self._make_inputs()
            self._guard = InputGuard(*self._inputs)
        return written

    def check(self, result: np.ndarray):
        """The check of ``result`` against the float64 reference: on the GPU when GPU
        implementations are compared, a GPU is here and the problem is big (the host's float64
        product and element-wise check of 8192^2 take seconds per row), else on the host."""
        a, b = self.inputs
        if isinstance(self._reference, Reference):
            return check(result, a, b, self._reference)
        return self._reference.check(result)


def _measure(impl, problem: _Problem, threads, min_time, allow_slow, impl_options) -> Row:
    shape, dtype = problem.shape, problem.dtype
    row = Row(impl.name, impl.language, impl.device, str(shape), dtype, status="ok")
    try:
        check_problem(impl, shape, dtype, allow_slow)
    except MatmulInputError as error:
        row.status = f"skipped: {error}"
        return row
    reason, broken = impl.availability()
    if reason:
        # A build or load that failed is an error to fix; a machine without a GPU is not.
        row.status = f"{'error' if broken else 'unavailable'}: {reason}"
        return row
    run_options = dict(impl_options)
    if impl.threaded and threads is not None:
        run_options.setdefault("threads", threads)
    if impl.device == "cpu":
        row.threads = _threads_used(impl, threads, run_options)
    try:
        matmul = Matmul(impl, allow_slow=allow_slow, **run_options)
        with blas_limits(threads):
            a, b = problem.row_inputs()
            prepared = matmul.prepare(a, b)
            row.mode = prepared.mode
            row.loader = getattr(prepared, "loader", None)
            prepared.run()
            result = prepared.result()
            written = problem.written()
            if written:
                row.status = f"FAILED: {wrote_inputs_message(impl.name, written)}"
                return row
            outcome = problem.check(result)
            row.max_abs_error = outcome.max_abs_error
            if not outcome.passed:
                row.status = f"FAILED: {outcome.message}"
                return row
            if prepared.mode != "native":
                return row
            # GPU adapters time themselves (CUDA events, L2 flushed); the rest use perf_counter.
            own_timer = getattr(prepared, "time", None)
            timing = own_timer(min_time) if own_timer else time_cpu(prepared.run, min_time=min_time)
            written = problem.written()  # a write while timed changes what the next row multiplies
            if written:
                row.status = f"FAILED: {wrote_inputs_message(impl.name, written)} while it was timed"
                return row
    except Exception as error:  # one broken implementation must not end the comparison
        written = problem.written()
        if written:
            row.status = f"FAILED: {wrote_inputs_message(impl.name, written)}, then raised {type(error).__name__}"
        elif tried_to_write_inputs(error):
            row.status = f"FAILED: {impl.name} tried to write into its inputs, which are read-only ({error})"
        else:
            row.status = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return row
    row.median_s, row.min_s, row.spread, row.repeats = timing.median_s, timing.min_s, timing.spread, timing.repeats
    if timing.median_s <= 0 or shape.flops == 0:  # nothing computed: no rate to report
        return row
    row.gflops = shape.flops / timing.median_s / 1e9
    # The least traffic any implementation needs: read A and B once, write C once.
    itemsize = a.dtype.itemsize
    row.gbytes_per_s = (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n) * itemsize / timing.median_s / 1e9
    if impl.device == "cpu":
        peak = machine.cpu_peak_gflops(dtype, cores=row.threads or 1)
    else:
        peak_of = getattr(impl.backend, "peak_gflops", None)
        peak = peak_of(impl, dtype) if peak_of else None
    row.peak_pct = 100.0 * row.gflops / peak if peak else None
    return row


def _fill_speedups(rows: list[Row]) -> None:
    baseline_names = {impl.name for impl in REGISTRY.values() if impl.baseline}
    base = {(r.device, r.shape, r.dtype): r.median_s for r in rows if r.implementation in baseline_names and r.timed}
    for row in rows:
        base_time = base.get((row.device, row.shape, row.dtype))
        if row.timed and base_time:
            row.speedup = base_time / row.median_s


def _progress_bar(total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.console import Console

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    )
