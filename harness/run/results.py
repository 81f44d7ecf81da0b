"""The results of a comparison: one ``Row`` per (implementation, shape, dtype), and the
``Results`` that hold them with the machine they ran on, written to and read from JSON and CSV.

Printing (render.py) and plotting (plotting.py) read these, and name them only for type
checkers, so that this module imports them and not the other way round; the run loop
(compare.py) fills them.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from harness.env import files
from harness.model import registry
from harness.model.inputs import dtype_name, parse_shape
from harness.run import plotting, render

FAULTS = ("FAILED", "error", "crashed", "timed out")  # statuses that make a command exit 1


@dataclass
class Row:
    implementation: str
    language: str
    device: str
    shape: str  # MxNxK
    dtype: str  # of the inputs (a decode problem's activations)
    status: str  # "ok", "FAILED: ...", "skipped: ...", "unavailable: ...", "error: ...", "crashed: ...",
    # "timed out: ..." (the last two: a kernel run in a worker process, isolation.py)
    mode: str = "native"  # native, emulated, interpreted
    loader: str | None = None  # what loaded a compiled GPU kernel (pycuda, cupy, emulation)
    median_s: float | None = None
    min_s: float | None = None
    spread: float | None = None
    repeats: int | None = None
    gflops: float | None = None
    gbytes_per_s: float | None = None  # (M*K + K*N + M*N) * itemsize / time: the least traffic
    peak_pct: float | None = None
    peak_of: str | None = None  # the roof peak_pct is against: a dtype's FMA peak, or "int8" (X rounded to bytes)
    speedup: float | None = None  # baseline time / this time, same shape, dtype and device
    max_abs_error: float | None = None
    threads: int | None = None
    weights: str | None = None  # a decode problem's weight format (q8_0, q4_0, bf16, float32); None: a matmul
    memory_pct: float | None = None  # GB/s against memory_roof_gbps, the read roof of its thread count (decode rows)
    memory_roof_gbps: float | None = None
    memory_roof: str | None = None  # "beside": streamed over the row's arena after each round of its problem
    # (the median of rounds), or "best kept": the best this machine read, kept across runs (machine.py)
    weights_from: str | None = None  # where a timed decode row's weights were read from: "dram" (it rotated
    # through weight_copies copies of W, WEIGHT_ARENA_BYTES or more in all) or "cache" (one W, repeated)
    weight_copies: int | None = None
    path: str | None = None  # the kernel path a library picked ("q4_0_8x8 repack", "tinyBLAS"), where it says

    @property
    def passed(self) -> bool:
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        """A wrong product, or an implementation that raised, crashed or hung: a fault to fix
        (unlike a row skipped or unavailable here)."""
        return self.status.startswith(FAULTS)

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

    def row(self, implementation: str, shape, dtype: str = "float32", weights: str | None = None) -> Row:
        shape = str(parse_shape(shape))
        for row in self.rows:
            if (
                row.implementation == implementation
                and row.shape == shape
                and row.dtype == dtype_name(dtype)
                and row.weights == weights
            ):
                return row
        raise KeyError(
            f"no result for {implementation} at {shape} {dtype}" + (f" with {weights} weights" if weights else "")
        )

    @property
    def decode(self) -> bool:
        """Whether these are decode problems (quantized weights), whose tables show bandwidth."""
        return any(row.weights for row in self.rows)

    # --- output -----------------------------------------------------------------------
    def ran(self) -> list[Row]:
        """Rows that ran (checked, passed or not), per shape the timed ones first."""
        problems = list(dict.fromkeys((row.shape, row.dtype, row.weights) for row in self.rows))
        ran = [row for row in self.rows if not row.status.startswith(("skipped", "unavailable"))]
        return sorted(ran, key=lambda row: (problems.index((row.shape, row.dtype, row.weights)), not row.timed))

    # --- output: the table (render.py), the plot (plotting.py), JSON and CSV ------------------
    def table(self, width: int = 100):
        """The rows that ran as a rich Table sized for ``width`` columns."""
        return render.table(self, width)

    def not_run(self) -> list[str]:
        """One line per implementation that did not run somewhere: why, and how often."""
        return render.not_run(self)

    def render(self, width: int | None = None) -> str:
        """The table and, below it, what did not run here and why: what ``print`` shows."""
        return render.render(self, width)

    def __str__(self) -> str:
        return self.render()

    def plot(self, path, title: str | None = None) -> Path:
        """GFLOP/s against problem size (PNG); GEMV shapes get a panel of GB/s of their own."""
        return plotting.plot(self, path, title)

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
        return files.write_text(
            path, json.dumps(finite_or_null(self.to_dict()), indent=2, default=str, allow_nan=False) + "\n"
        )

    def to_csv(self, path) -> Path:
        names = list(Row.__dataclass_fields__)
        with files.replacing(path, newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=names)
            writer.writeheader()
            for row in self.rows:
                writer.writerow(asdict(row))
        return Path(path)


def finite_or_null(value):
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def fill_speedups(rows: list[Row]) -> None:
    """Each timed row's speed against its device's baseline at the same shape and dtype (for a
    decode row: against the baseline's float32 product at that shape, what quantizing buys)."""
    baseline_names = {impl.name for impl in registry.REGISTRY.values() if impl.baseline}
    base = {(r.device, r.shape, r.dtype): r.median_s for r in rows if r.implementation in baseline_names and r.timed}
    for row in rows:
        base_time = base.get((row.device, row.shape, row.dtype))
        if row.timed and base_time:
            row.speedup = base_time / row.median_s
