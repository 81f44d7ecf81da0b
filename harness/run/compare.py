"""``harness.compare``: check and time implementations side by side (the run loop).

For every (shape, dtype, implementation): refuse what the implementation cannot take (the
row says why), prepare the inputs (not timed), run once and check the product against the
float64 reference, and only then time it. A product that fails its check is never timed.
Emulated and interpreted runs (CPU stand-ins for GPU code) are checked but not timed.

The rows and their files are results.py's; the table is render.py's, the plot plotting.py's.
"""

from __future__ import annotations

import itertools
import math
import time
from contextlib import closing, nullcontext
from typing import Iterable, Sequence

import numpy as np

from harness.backends import gpu
from harness.backends.external import add_external, external_recipe, is_external
from harness.backends.gpu import DeviceProblem
from harness.env.cores import usable_cores
from harness.model import quant
from harness.model.activation_error import INTEGER_ROUNDINGS
from harness.model.checking import Reference, check, reference_data
from harness.model.core import (
    InputGuard,
    Matmul,
    MatmulInputError,
    check_problem,
    tried_to_write_inputs,
    wrote_inputs_message,
)
from harness.model.inputs import Shape, dtype_name, make_inputs, parse_shape
from harness.model.registry import REGISTRY, describe, implementations
from harness.model.timing import SETTLE_SECONDS, Timing, round_order, time_cpu
from harness.run import machine
from harness.run.isolation import (
    ISOLATE_CHOICES,
    KernelCrashed,
    KernelFailed,
    KernelTimedOut,
    WorkerPool,
    automatic_limit_s,
    timing_allowance_s,
)
from harness.run.results import Results, Row, fill_speedups

__all__ = ["Results", "Row", "compare", "blas_limits", "reference_for"]

# Decode reads each weight matrix from DRAM once per token. Timing one W over and over reads it
# from cache wherever it fits (25 MB of q4_0 in a 32 MB L3 streamed at 70-80 GB/s on two cores,
# beyond what DRAM gives them), so a timed decode row rotates through enough copies of W that
# they add up to this much: four times the last-level cache, and no less than 256 MiB (the
# CPU's analogue of the GPU rows' L2 flush). The memory roof is read from 512 MiB the same way.
WEIGHTS_FROM = ("dram", "cache")
MIN_WEIGHT_ARENA_BYTES = 256 * 2**20
# More copies than this and W is too small for DRAM to matter (under 8 MiB at the minimum
# arena): such a row repeats one W, and says "cache".
MAX_WEIGHT_COPIES = 32


def weight_arena_bytes() -> int:
    return max(MIN_WEIGHT_ARENA_BYTES, 4 * machine.last_level_cache_bytes())


def weight_rotation(w_bytes: int) -> tuple[int, str]:
    """(copies, where W is read from) for a DRAM-timed row whose W has ``w_bytes``: enough
    copies to fill the arena ("dram"; one where W alone fills it), or one copy ("cache") when
    that would take more than MAX_WEIGHT_COPIES."""
    needed = max(1, math.ceil(weight_arena_bytes() / max(1, w_bytes)))
    return (needed, "dram") if needed <= MAX_WEIGHT_COPIES else (1, "cache")


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
    extra = [
        impl
        for impl in REGISTRY.values()
        if impl.device in devices and impl not in chosen and (impl.baseline or (impl.peer and impl.available))
    ]
    return chosen + extra


FLOAT_WEIGHTS = "float32"  # a decode problem's unquantized weights: the plain product X @ W^T


def _weight_formats(weights, baselines: bool) -> list[str]:
    """The decode problems' weight formats, validated ([] for a plain comparison)."""

    if weights is None:
        return []
    formats = [weights] if isinstance(weights, str) else list(weights)
    formats = [FLOAT_WEIGHTS if text == FLOAT_WEIGHTS else quant.format_of(text).name for text in formats]
    if baselines and FLOAT_WEIGHTS not in formats:
        formats.append(FLOAT_WEIGHTS)  # what the baseline and the peers run: the "vs base" of every row
    return list(dict.fromkeys(formats))


def _belongs(impl, fmt: str | None, explicit: bool) -> bool:
    """Whether ``impl`` gets a row in problems of weight format ``fmt`` (None: a plain matmul).
    Rows of implementations that cannot take the format are left out (a glob such as 'c.*'
    takes what fits), unless asked for by their exact name in a plain comparison (the row then
    says why it was skipped)."""
    if fmt is None:
        return explicit or not impl.weights
    if fmt == FLOAT_WEIGHTS:
        return not impl.weights
    return fmt in impl.weights


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
    weights: Sequence[str] | str | None = None,
    isolate: str = "user",
    timeout: float | None = None,
    weights_from: str = "dram",
    rounds: int = 1,
) -> Results:
    """Check and time ``impls`` (names, glob patterns, or your own as ``FILE:FUNCTION``) on every
    shape and dtype.

    ``threads`` pins the BLAS thread pool and is passed to implementations that take a thread
    count (None leaves both at their defaults). The library baseline of each device is added
    unless ``baselines=False``. ``options`` maps an implementation name to keyword options
    (``{"c.blocked": {"tile": 32}}``).

    ``weights`` (``["q4_0", "q8_0", "bf16", "float32"]``) makes every shape MxNxK a decode
    problem: float32 activations X [M, K] times weights W [N, K] stored in each format,
    quantized once per problem outside the timed region; "float32" is the plain product, which
    the baseline and the peers run (it is added when baselines are). Without ``impls``, the
    implementations are those that take quantized weights. ``weights_from``: "dram" (the
    default) times each CPU row of a decode problem over copies of W that add up to four times
    the last-level cache or more, so every call reads W from memory, as a model's decode does;
    "cache" repeats one W. Each row says which it got (``Row.weights_from``). After each round
    of a problem whose CPU rows read W from DRAM, the read roof is measured over as many bytes on
    the same threads, and those rows' ``memory_pct`` is against its median over the rounds
    (``Row.memory_roof``: "beside"; else the best this machine kept, "best kept").

    ``isolate``: "user" (the default) checks and times your own kernels (``FILE:FUNCTION``) in
    a worker process each (isolation.py), where a crash or a hang is a row, not the end of the
    run; "all" does so for every CPU implementation of a float problem. ``timeout`` (seconds)
    bounds each call of an isolated row; by default the bound grows with the problem's FLOPs
    (``isolation.automatic_limit_s``).

    ``rounds`` > 1 measures each problem's rows that many times in turn, each round in another
    order, and keeps each implementation's median round (a row that fails in any round keeps
    that failure; one that fails, is skipped or is never timed in the first round is not run
    again): on a shared machine a slow spell then falls on different rows, instead of deciding
    a ratio between two rows timed a minute apart.
    """
    if weights_from not in WEIGHTS_FROM:
        raise ValueError(f"weights_from must be one of {', '.join(WEIGHTS_FROM)}, got {weights_from!r}")
    if isolate not in ISOLATE_CHOICES:
        raise ValueError(f"isolate must be one of {', '.join(ISOLATE_CHOICES)}, got {isolate!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf
    ):
        raise ValueError(f"timeout must be a number of seconds > 0 (or None for the automatic limit), got {timeout!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"rounds must be a whole number >= 1, got {rounds!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    if (
        isinstance(min_time, bool)
        or not isinstance(min_time, (int, float, np.integer, np.floating))
        or not 0 < min_time < math.inf  # nan fails this too
    ):
        raise ValueError(f"min_time must be a finite number of seconds > 0, got {min_time!r}")
    if threads is not None:
        cores = usable_cores()
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= cores:
            raise ValueError(
                f"threads must be a whole number from 1 to {cores} (the cores this process may use), "
                f"or None for each library's default; got {threads!r}"
            )
    shapes = [parse_shape(s) for s in ([shapes] if isinstance(shapes, (str, int)) else shapes)]
    dtypes = [dtype_name(d) for d in ([dtypes] if isinstance(dtypes, str) else dtypes)]
    patterns = [impls] if isinstance(impls, str) else list(impls or [])
    patterns = [add_external(pattern) if is_external(pattern) else pattern for pattern in patterns]
    formats = _weight_formats(weights, baselines)
    chosen = implementations(*patterns)
    if formats and not patterns:
        chosen = [impl for impl in chosen if impl.weights]
    asked = set(patterns)  # named exactly: a decode kernel named in a plain comparison says why it has no row
    chosen = _with_baselines(chosen, baselines)
    options = options or {}

    problems = [(shape, dtype, fmt) for shape in shapes for dtype in dtypes for fmt in formats or [None]]
    tasks = [
        (shape, dtype, fmt, impl)
        for shape, dtype, fmt in problems
        for impl in chosen
        if _belongs(impl, fmt, explicit=impl.name in asked)
    ]
    rows: list[Row] = []
    bar = _progress_bar(len(tasks) * rounds) if progress else None
    workers = WorkerPool(allow_slow, threads)
    with bar or nullcontext(), closing(workers):
        task_id = bar.add_task("comparing", total=len(tasks) * rounds) if bar else None
        # Tasks are ordered by problem: its inputs and reference are made once, when a row first
        # needs them, and only the current ones are held (at 8192^2 each set is over a
        # gigabyte, and a shape nothing can run needs neither).
        for (shape, dtype, fmt), group in itertools.groupby(tasks, key=lambda task: task[:3]):
            impls_here = [task[3] for task in group]
            problem = _Problem(shape, dtype, seed, [impl.device for impl in chosen], weights=fmt)
            measured: list[list[Row]] = [[] for _ in impls_here]
            roofs_beside: list[float] = []
            for round_index in range(rounds):
                for index in round_order(len(impls_here), round_index):
                    if measured[index] and not (measured[index][0].passed and measured[index][0].timed):
                        continue  # a row that failed, was skipped or is never timed is done after one round
                    impl = impls_here[index]
                    if bar:
                        bar.update(task_id, description=f"{impl.name} {shape} {fmt or dtype}")
                    isolated = (
                        impl.device == "cpu" and not problem.quantized and (isolate == "all" or external_recipe(impl))
                    )
                    row = _measure(
                        impl,
                        problem,
                        threads,
                        min_time,
                        allow_slow,
                        options.get(impl.name, {}),
                        workers if isolated else None,
                        timeout,
                        weights_from,
                    )
                    measured[index].append(row)
                    if bar:
                        bar.advance(task_id)
                latest = [rows_of_impl[-1] for rows_of_impl in measured if rows_of_impl]
                roof = _read_roof_beside(latest, problem, threads)
                if roof:
                    roofs_beside.append(roof)
            rows_here = [_median_round(rounds_of_row) for rounds_of_row in measured]
            if roofs_beside:
                _score_against_roof_beside(rows_here, sorted(roofs_beside)[(len(roofs_beside) - 1) // 2], threads)
            rows += rows_here
    fill_speedups(rows)
    settings = {"threads": threads, "min_time_s": min_time, "seed": seed, "shape_order": "MxNxK", "isolate": isolate}
    if rounds > 1:
        settings["rounds"] = rounds
    if timeout is not None:
        settings["timeout_s"] = timeout
    if formats:
        settings.update(weights=formats, weights_from=weights_from, weight_arena_bytes=weight_arena_bytes())
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

    return flops >= GPU_REFERENCE_MIN_FLOPS and "gpu" in devices and gpu.available()


def reference_for(a: np.ndarray, b: np.ndarray, devices) -> Reference:
    """The float64 reference of ``a @ b`` (``checking.Reference``): on the GPU when GPU implementations will be
    checked against it, a GPU is here and the problem is big; else NumPy's on the host."""

    if _reference_on_gpu(2 * a.shape[0] * a.shape[1] * b.shape[1], devices):
        return gpu.reference(a, b)
    return reference_data(a, b)


def _gpu_info() -> dict:
    """The device, and its memory roof measured now beside the datasheet's (GEMV rows are
    scored against both)."""

    info = gpu.device_info()
    info["copy_bandwidth_gbps"] = round(gpu.copy_bandwidth_gbps(), 1)
    return info


def _threads_used(impl, threads: int | None, run_options: dict) -> int:
    """The thread count a CPU row runs with (None: the library's or the kernel's default)."""
    if impl.threaded:
        chosen = run_options.get("threads")
        if chosen is None:
            return usable_cores()
        return int(chosen)
    if impl.baseline:
        if threads is not None:
            return threads
        from threadpoolctl import threadpool_info

        counts = [pool["num_threads"] for pool in threadpool_info() if pool.get("user_api") == "blas"]
        return max(counts, default=1)
    return 1


class _Problem:
    """One problem of a comparison (shape, dtype and, for decode, weight format): its inputs and
    float64 reference, made when the first row needs them.

    The inputs are made read-only and the reference is computed from them before any row
    runs. Each row gets read-only views (``row_inputs``) and, after it ran, ``written()`` says
    whether it wrote into them anyway; if it did, the inputs are made again (they are seeded,
    so bit for bit the same) and the next row sees the problem the reference was computed on.

    A decode problem (``weights`` a quant format) is X [M, K] times W [N, K]: the seeded B is
    W^T, W is quantized once, here, and the reference is X times the weights the format holds
    (``dequantize()``, exact in float32), so the ordinary error model applies to weight-only
    kernels. "float32" weights are the plain product.
    """

    def __init__(self, shape: Shape, dtype: str, seed: int, devices: list[str], weights: str | None = None):
        self.shape, self.dtype, self.seed, self.devices = shape, dtype, seed, devices
        self.weights = weights
        self.quantized = weights not in (None, FLOAT_WEIGHTS)
        self._inputs = self._reference = self._guard = None
        self._float_b = None  # the float B [K, N] the reference multiplies (a decode problem's W^T)

    def _make_inputs(self):
        if self.quantized:
            # (raises MatmulInputError where K % 32 != 0: every row's error)
            x, w = quant.make_decode_inputs(self.shape, self.weights, self.seed, self.dtype)
            x.flags.writeable = False
            self._float_b = w.dequantize().T
            return x, w
        a, b = make_inputs(self.shape, self.dtype, self.seed)
        a.flags.writeable = False
        b.flags.writeable = False
        self._float_b = b
        return a, b

    @property
    def inputs(self):
        if self._inputs is None:
            self._inputs = self._make_inputs()
            # Before any row runs: no implementation can have touched what it is computed from.
            a, b = self._inputs[0], self._float_b
            if _reference_on_gpu(self.shape.flops, self.devices) and not self.quantized:
                self._reference = DeviceProblem(a, b)
            else:
                self._reference = reference_data(a, b)
        return self._inputs

    def bytes_read(self) -> int:
        """The least traffic of a row: read A (or X) and B (or the packed W) once, write C once."""
        a, b = self.inputs
        m, n, k = self.shape
        b_bytes = b.nbytes if self.quantized else k * n * a.dtype.itemsize
        return (m * k + m * n) * a.dtype.itemsize + b_bytes

    def row_inputs(self):
        """Read-only views of the inputs for one row, watched for writes by ``written``."""
        a, b = self.inputs
        self._guard = InputGuard(a, b.data if self.quantized else b)
        return self._guard.a, (b if self.quantized else self._guard.b)

    def written(self) -> list[str]:
        """The inputs the current row wrote into ("A", "B"); they are made afresh for the next row."""
        written = self._guard.written() if self._guard else []
        if written:
            self._inputs = self._make_inputs()
            a, b = self._inputs
            self._guard = InputGuard(a, b.data if self.quantized else b)
        return written

    def weight_copies(self, count: int) -> list:
        """``count`` more (X, W) pairs whose W is a copy of this problem's in memory of its own
        (bit for bit the same weights; X is shared: in a model it is small and in cache)."""
        a, b = self.inputs
        if self.quantized:
            return [(a, quant.QuantizedWeights(b.format, b.n, b.k, b.data.copy())) for _ in range(count)]
        copies = []
        for _ in range(count):
            copy = b.copy()
            copy.flags.writeable = False
            copies.append((a, copy))
        return copies

    def check(self, result: np.ndarray, activation_rounding: str | None = None):
        """The check of ``result`` against the float64 reference: on the GPU when GPU
        implementations are compared, a GPU is here and the problem is big (the host's float64
        product and element-wise check of 8192^2 take seconds per row), else on the host."""
        a = self.inputs[0]
        if isinstance(self._reference, Reference):
            return check(result, a, self._float_b, self._reference, activation_rounding=activation_rounding)
        return self._reference.check(result)


class _InProcess:
    """A row's implementation called in this process, as Worker (isolation.py) calls it in
    its own: prepare, one run to check, then the timing."""

    def __init__(self, impl, options: dict, allow_slow, problem: _Problem):
        self.matmul = Matmul(impl, allow_slow=allow_slow, **options)
        self.problem = problem
        self.prepared = self.loader = self.path = None

    def prepare(self, a, b, limit_s) -> str:
        self.prepared = self.matmul.prepare(a, b)
        self.loader, self.path = self.prepared.loader, self.prepared.path
        return self.prepared.mode

    def run(self, limit_s) -> np.ndarray:
        self.prepared.run()
        return self.prepared.result()

    def time(self, min_time: float, settle_s: float, limit_s, copies: int = 1) -> Timing:
        """The timing; with ``copies`` > 1, each call multiplies the next of that many copies
        of W (prepared here, untimed), so W is read from DRAM rather than cache."""
        # GPU adapters time themselves (CUDA events, L2 flushed); the rest use perf_counter.
        timing = self.prepared.time(min_time)
        if timing is not None:
            return timing
        rotation = [self.prepared] + [self.matmul.prepare(a, b) for a, b in self.problem.weight_copies(copies - 1)]
        calls = itertools.cycle([prepared.run for prepared in rotation])
        time.sleep(settle_s)
        return time_cpu(lambda: next(calls)(), min_time=min_time)

    def written(self) -> list[str]:
        return self.problem.written()


def _median_round(measured: list[Row]) -> Row:
    """One implementation's row from its rounds: the first that did not pass (a fault in any
    round is the row's), else the first untimed one (checked, never timed: a stand-in or an
    empty product), else the round with the median time (the lower middle of an even count)."""
    for row in measured:
        if not row.passed:
            return row
    for row in measured:
        if not row.timed:
            return row
    return sorted(measured, key=lambda row: row.median_s)[(len(measured) - 1) // 2]


def _read_roof_beside(round_rows: list[Row], problem: _Problem, threads: int | None) -> float | None:
    """After a round of a decode problem's rows: the read roof of its CPU rows' thread count,
    measured now over as many bytes as they rotated through (the same arena, so from DRAM as
    they were). None where no CPU row read W from DRAM in this round (nothing to score)."""
    from_dram = [row for row in round_rows if row.timed and row.device == "cpu" and row.weights_from == "dram"]
    if not from_dram:
        return None
    arena = from_dram[0].weight_copies * problem.inputs[1].nbytes
    return machine.read_gbps_now(arena, threads or usable_cores())


def _score_against_roof_beside(rows: list[Row], roof_gbps: float, threads: int | None) -> None:
    """Score the CPU rows that ran on the roof's thread count against the roof measured beside
    them (its median over the rounds) instead of the best this machine ever read: on a shared
    host the bandwidth DRAM gives moves by a third from minute to minute."""
    for row in rows:
        if row.gbytes_per_s and row.memory_pct is not None and row.threads == (threads or usable_cores()):
            row.memory_pct = 100.0 * row.gbytes_per_s / roof_gbps
            row.memory_roof_gbps, row.memory_roof = roof_gbps, "beside"


def _measure(
    impl, problem: _Problem, threads, min_time, allow_slow, impl_options, workers, timeout, weights_from="dram"
) -> Row:
    """One row: refuse what ``impl`` cannot take, check it, then time it; in a worker process
    (``workers``, a WorkerPool) or, when that is None, here."""
    shape, dtype = problem.shape, problem.dtype
    row = Row(impl.name, impl.language, impl.device, str(shape), dtype, status="ok", weights=problem.weights)
    try:
        if impl.weights and not problem.quantized:
            raise MatmulInputError(
                f"{impl.name} takes quantized weights ({', '.join(impl.weights)}): "
                f"compare them with weights=[...] (--weights)"
            )
        check_problem(impl, shape, dtype, allow_slow)
        if problem.quantized:
            problem.inputs  # noqa: B018 - quantizing refuses a K that is not a multiple of the block
    except MatmulInputError as error:
        row.status = f"skipped: {error}"
        return row
    except Exception as error:  # a backend's estimate or shape check that fails: its row says so
        row.status = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
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
    limit_s = timeout or automatic_limit_s(impl, shape)
    try:
        runner = workers.get(impl, run_options) if workers else _InProcess(impl, run_options, allow_slow, problem)
        with blas_limits(threads):
            a, b = problem.row_inputs()
            row.mode = runner.prepare(a, b, limit_s)
            row.loader = getattr(runner, "loader", None)
            row.path = getattr(runner, "path", None)
            started = time.perf_counter()
            result = runner.run(limit_s)
            one_call_s = time.perf_counter() - started
            written = runner.written()
            if written:
                row.status = f"FAILED: {wrote_inputs_message(impl.name, written)}"
                return row
            outcome = problem.check(result, impl.rounding_for(problem.weights))  # ggml's int8 activations: its model
            row.max_abs_error = outcome.max_abs_error
            if not outcome.passed:
                row.status = f"FAILED: {outcome.message}"
                return row
            if row.mode != "native" or 0 in shape:  # a stand-in, or an empty product: checked, never timed
                return row
            # without the pause, c.packed's 2-thread GEMV at 1x8192x28672, timed after
            # torch's int4 kernel, took 51-58 ms with a spread of 60% (21 ms on its own)
            settle_s = SETTLE_SECONDS if (row.threads or 1) > 1 else 0.0
            budget_s = limit_s + timing_allowance_s(min_time, one_call_s)
            if problem.weights and impl.device == "cpu" and not workers:
                rotation = weight_rotation(problem.inputs[1].nbytes) if weights_from == "dram" else (1, "cache")
                row.weight_copies, row.weights_from = rotation
                timing = runner.time(min_time, settle_s, budget_s, rotation[0])
            else:
                timing = runner.time(min_time, settle_s, budget_s)
            written = runner.written()  # a write while timed changes what the next row multiplies
            if written:
                row.status = f"FAILED: {wrote_inputs_message(impl.name, written)} while it was timed"
                return row
    except (KernelCrashed, KernelTimedOut) as error:  # the worker is gone; the run goes on
        row.status = str(error)
        if isinstance(error, KernelTimedOut):
            row.status += (
                " (the limit --timeout / timeout= set)"
                if timeout
                else " (the limit for its size; --timeout / timeout= sets another)"
            )
        return row
    except KernelFailed as error:
        if error.wrote_read_only:
            row.status = f"FAILED: {impl.name} tried to write into its inputs, which are read-only ({error})"
        else:
            row.status = f"error: {error}"
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
    # The least traffic any implementation needs: read A and B (the packed weights) once, write C once.
    row.gbytes_per_s = problem.bytes_read() / timing.median_s / 1e9
    if problem.weights and impl.device == "cpu":
        roof = machine.memory_roof_gbps(row.threads or 1)
        if roof:
            row.memory_pct = 100.0 * row.gbytes_per_s / roof
            row.memory_roof_gbps, row.memory_roof = roof, "best kept"
    peak_of = dtype
    if impl.device == "cpu" and problem.weights and impl.rounding_for(row.weights) in INTEGER_ROUNDINGS:
        peak_of = "int8"  # X rounded to bytes: the multiply-adds are int8 ones (one per weight per row)
        peak = machine.cpu_int8_peak_gops(cores=row.threads or 1)
    elif impl.device == "cpu":
        peak = machine.cpu_peak_gflops(dtype, cores=row.threads or 1)
    else:
        peak = impl.backend.peak_gflops(impl, dtype)
    row.peak_pct = 100.0 * row.gflops / peak if peak else None
    row.peak_of = peak_of if peak else None
    return row


def _progress_bar(total: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
