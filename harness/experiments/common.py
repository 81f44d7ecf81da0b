"""What every experiment shares: checked-then-timed measurements and writing JSON + PNG."""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.backends import gpu
from harness.env import files
from harness.model.checking import check
from harness.model.core import (
    InputGuard,
    Matmul,
    MatmulInputError,
    UnavailableError,
    check_problem,
    tried_to_write_inputs,
    wrote_inputs_message,
)
from harness.model.inputs import make_inputs, parse_shape
from harness.model.registry import lookup
from harness.model.timing import time_cpu
from harness.run import machine
from harness.run.compare import blas_limits, reference_for
from harness.run.results import finite_or_null


@lru_cache(maxsize=2)
def inputs(shape, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``make_inputs``, remembered: the experiments measure several implementations on one
    shape, and generating 16384^2 inputs takes seconds. Read-only, so no one can alter them."""
    a, b = make_inputs(shape, dtype, seed)
    a.flags.writeable = False
    b.flags.writeable = False
    return a, b


_references: dict = {}


def _reference(a: np.ndarray, b: np.ndarray, device: str) -> np.ndarray:
    """The float64 reference of (a, b), remembered for the last two pairs (kept alive with
    their arrays, so the ids that key them cannot be reused)."""
    key = (id(a), id(b), device)
    if key not in _references:
        while len(_references) >= 2:
            _references.pop(next(iter(_references)))
        _references[key] = (a, b, reference_for(a, b, [device]))
    return _references[key][2]


def measure(name: str, a: np.ndarray, b: np.ndarray, min_time: float = 0.2, threads: int | None = 1, **options) -> dict:
    """Check ``name`` on (a, b), then time it. Returns a dict with seconds and GFLOP/s, or
    with ``skipped`` saying why it could not run (unavailable, refused, failed its check)."""
    impl = lookup(name)
    shape = parse_shape((a.shape[0], b.shape[1], a.shape[1]))
    entry = {"implementation": name, "shape": str(shape), "dtype": a.dtype.name}
    try:
        check_problem(impl, shape, a.dtype)
    except MatmulInputError as error:
        return {**entry, "skipped": str(error)}
    reason = impl.unavailable_reason()
    if reason:
        return {**entry, "skipped": f"unavailable: {reason}"}
    if impl.threaded and threads is not None:
        options.setdefault("threads", threads)
    # The reference first, from inputs nothing has run on yet; the row gets read-only views.
    reference = _reference(a, b, impl.device)
    guard = InputGuard(a, b)
    try:
        with blas_limits(threads):
            prepared = Matmul(impl, **options).prepare(guard.a, guard.b)
            prepared.run()
            result = prepared.result()
            if guard.written():
                return _wrote_inputs(entry, name, guard.written())
            # one reference per input pair (on the GPU for big GPU problems), not one per call
            outcome = check(result, a, b, reference)
            if not outcome.passed:
                return {**entry, "skipped": f"FAILED its check: {outcome.message}"}
            if prepared.mode != "native":
                return {**entry, "skipped": f"runs {prepared.mode} here (correct, not timed)"}
            timing = prepared.time(min_time) or time_cpu(prepared.run, min_time=min_time)
            if guard.written():
                return _wrote_inputs(entry, name, guard.written())
    except (UnavailableError, MatmulInputError) as error:
        return {**entry, "skipped": str(error)}
    except ValueError as error:
        if tried_to_write_inputs(error):
            return {**entry, "skipped": f"FAILED: {name} tried to write into its inputs, which are read-only ({error})"}
        raise
    seconds = timing.median_s
    return {
        **entry,
        "device": impl.device,
        "seconds": seconds,
        "spread": timing.spread,
        "repeats": timing.repeats,
        "gflops": shape.flops / seconds / 1e9,
        "gbytes_per_s": (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n) * a.dtype.itemsize / seconds / 1e9,
        "threads": options.get("threads", threads),
    }


def _wrote_inputs(entry: dict, name: str, written: list[str]) -> dict:
    # The remembered inputs and references may be the ones it wrote into: forget them all.
    inputs.cache_clear()
    _references.clear()
    return {**entry, "skipped": f"FAILED: {wrote_inputs_message(name, written)}"}


def timed_once(function) -> tuple[float, object]:
    start = time.perf_counter()
    value = function()
    return time.perf_counter() - start, value


def write(out_dir, name: str, data: dict, figure) -> dict:
    """Write ``<name>.json`` (with machine info) and ``<name>.png``; return the JSON's contents."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"experiment": name, "machine": machine.machine_info(), **data}
    import matplotlib.pyplot as plt

    try:
        # strict JSON, as compare writes: a number that is not finite becomes null
        text = json.dumps(finite_or_null(data), indent=2, default=_jsonable, allow_nan=False)
        files.write_text(out_dir / f"{name}.json", text + "\n")
        files.save_figure(figure, out_dir / f"{name}.png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(figure)
    return data


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


DEVICES_ENV = "MATMUL_EXPERIMENT_DEVICES"


def wanted(device: str) -> bool:
    """Whether experiments should measure on ``device`` ("cpu" or "gpu"). All by default;
    MATMUL_EXPERIMENT_DEVICES=gpu makes a GPU run skip the CPU half (the GPU script does)."""
    import os

    chosen = os.environ.get(DEVICES_ENV, "cpu,gpu").replace(" ", ",").split(",")
    if device == "gpu" and not gpu_present():
        return False
    return device in chosen


def require_a_device() -> None:
    if not (wanted("cpu") or wanted("gpu")):
        import os

        raise ValueError(
            f"nothing to measure: {DEVICES_ENV}={os.environ.get(DEVICES_ENV)!r} leaves out the CPU "
            "and no GPU is visible"
        )


def gpu_present() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def say(message: str) -> None:
    print(message, flush=True)


@lru_cache(maxsize=None)
def cpu_bandwidth_gbps(megabytes: int = 256, repeats: int = 7) -> float:
    """Memory bandwidth one core sustains: its measured streaming read (machine.py, the best
    kept per machine), else copying a buffer far larger than the caches (bytes read plus bytes
    written, best of ``repeats``). One figure per process, so the roofline and the GEMV
    experiment score against the same roof."""
    measured = machine.memory_read_gbps()
    if measured:
        return measured
    source = np.ones(megabytes * 1024 * 1024 // 8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        seconds, _ = timed_once(lambda: np.copyto(target, source))
        best = min(best, seconds)
    return 2 * source.nbytes / best / 1e9


def gpu_peaks() -> dict | None:
    """GFLOP/s per dtype and GB/s of the GPU at hand (the datasheet table the GPU adapters
    use); None without a GPU or for a GPU the table does not know."""
    if not gpu_present():
        return None

    peaks = gpu.device_peaks()
    if not peaks:
        return None
    return {
        "device": gpu.device_name(),
        "bandwidth_gbps": peaks["bandwidth"],
        **{dtype: peaks[dtype] for dtype in ("float32", "bfloat16", "float16")},
    }
