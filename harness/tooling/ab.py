"""``python -m harness ab``: a C implementation from two builds of the C library, before and
after a change, timed in turn in one process.

A change to ``c/`` is worth what it measures against the code it changes, on the same machine
in the same minutes. Two runs of ``compare``, one before the change and one after, each meet
their own minute of a shared machine; here both builds are loaded side by side and every round
takes one sample of each, in turn (the order alternating), so a drift of the machine's speed
hits both, and the ratio is taken within each round: its median is reported, with the range
over the rounds.

The "before" build is a git revision of this checkout (its ``c/`` and ``CMakeLists.txt``,
built once per revision and CPU into the user cache, as the checkout's own build is, native),
or a library file; the "after" build is the library this checkout runs (MATMUL_C_LIBRARY's if
set). Both are opened through cffi's dlopen with this checkout's declarations, and the
implementation is prepared from each by its own backend, as a comparison prepares it, with
``clib.load()`` giving that build (``clib.loaded_as``): c.packed's call, c.bf16's packing of B,
c.decode_int8's packing of W (each build packs with its own code). Each product is checked
against the float64 reference before anything is timed, and the two compared bit for bit.

One thread only: each build has its own thread pool, whose workers spin for a while after each
call, so on a machine with as many cores as threads each build's samples would pay for the
other's idle workers. For two threads, time each build in its own process
(``MATMUL_C_LIBRARY=<library> python -m harness blas-grid --threads 2``, in turn).
"""

from __future__ import annotations

import io
import json
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.backends.c import clib
from harness.env import cache, files, sources
from harness.model import quant
from harness.model.checking import check
from harness.model.inputs import make_inputs, parse_shape
from harness.model.registry import lookup
from harness.model.timing import interleaved_samples

DEFAULT_SHAPES = ("1024", "1x4096x4096", "4096x1x4096")
BUILT_FROM = ("c", "CMakeLists.txt")  # what a revision's library is built from (without the call glue)


class ABError(RuntimeError):
    """Why the before/after comparison cannot be made (said to the user as it is)."""


def _git(root: Path, *args: str, binary: bool = False):
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=not binary)
    except FileNotFoundError:
        raise ABError("--before REVISION needs git, which is not installed here; give a library file instead") from None
    if done.returncode != 0:
        message = done.stderr if not binary else done.stderr.decode(errors="replace")
        raise ABError(f"git {' '.join(args)}: {message.strip() or 'failed'}")
    return done.stdout


def build_revision(revision: str) -> Path:
    """The C library as git ``revision`` of this checkout builds it on this CPU: built once into
    the user cache (a minute or two), then reused."""
    root = sources.sources_root()
    if not sources.in_checkout():
        raise ABError("--before REVISION needs a git checkout of this project; give a library file instead")
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").strip()
    folder = cache.user_cache_root() / "ab" / f"{commit[:16]}-{clib.this_cpu()}"
    library = folder / "build" / clib.library_filename()
    if cache.intact(library):
        return library
    archive = _git(root, "archive", "--format=tar", commit, *BUILT_FROM, binary=True)
    folder.mkdir(parents=True, exist_ok=True)
    with files.locked(folder / "build.lock"):
        if cache.intact(library):  # another process built it meanwhile
            return library
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            source = Path(scratch) / "source"
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                # (the "data" filter where this Python has it: only plain files inside source)
                tar.extractall(source, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            cmake = clib.cmake_executable()
            build = folder / "build"
            shutil.rmtree(build, ignore_errors=True)  # a build left unfinished, configured for a source gone
            for command in (
                [cmake, "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DMATMUL_CALL_GLUE=OFF"],
                [cmake, "--build", str(build), "--parallel"],
            ):
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    raise ABError(
                        f"building {revision} ({commit[:12]}) failed: {clib.first_error(done.stdout + done.stderr)}"
                    )
        if not library.is_file():
            raise ABError(f"building {revision} ({commit[:12]}) left no {library.name}")
        cache.record(library)
    return library


def before_library(before: str) -> tuple[Path, str]:
    """(library file, how to name it) for ``--before``: a library file, or a git revision."""
    if Path(before).is_file():
        return Path(before).resolve(), "a library file"
    return build_revision(before), f"git {before}"


@dataclass
class Build:
    """One build, opened with dlopen."""

    label: str
    ffi: object
    lib: object


def _refuse_unless_c(impl) -> None:
    """ABError unless ``impl`` runs from the C library built from ``c/`` (a kernel of your own in
    C is loaded from its own file: the same code in both builds)."""
    if impl.language != "c" or impl.device != "cpu" or not str(impl.source or "").startswith("c/"):
        raise ABError(f"{impl.name} is not one of the C library's implementations (c.*): ab times those")


def _inputs(impl, shape, kind: str):
    """A and B as a comparison makes them; for a decode implementation (``kind`` a weight
    format) X [M, K] and W [N, K] quantized, the seeded B being W^T."""
    return quant.make_decode_inputs(shape, kind) if impl.weights else make_inputs(shape, kind)


def measure(impl_name: str, shape, kind: str, builds: tuple[Build, Build], rounds: int, sample_time: float):
    """One row: the implementation prepared from each build (its backend's own prepare, with
    load() giving that build), each product checked, then ``rounds`` interleaved rounds.
    ``kind``: a dtype, or for a decode implementation its weights' format."""
    impl, shape = lookup(impl_name), parse_shape(shape)
    _refuse_unless_c(impl)
    row = {"implementation": impl_name, "shape": str(shape), "dtype": kind}
    takes = impl.weights or impl.dtypes
    if kind not in takes:
        return {**row, "skipped": f"{impl_name} does not take {kind} (it takes {', '.join(takes)})"}
    reason, _ = impl.availability()  # judged on this checkout's build
    if reason:
        return {**row, "skipped": f"{impl_name} is unavailable here: {reason}"}
    a, b = _inputs(impl, shape, kind)
    options = {**impl.options, **({"threads": 1} if impl.threaded else {})}
    calls, products = [], []
    for build in builds:
        try:
            with clib.loaded_as(build.ffi, build.lib):
                prepared = impl.backend.prepare(impl, a, b, options)
            prepared.run()
        except Exception as error:  # a function the build lacks, a status it returns: that row, not the run
            return {**row, "skipped": f"the {build.label} build: {type(error).__name__}: {error}"}
        product = prepared.result()
        outcome = check(product, a, b, activation_rounding=impl.activation_rounding)
        if not outcome.passed:
            return {**row, "skipped": f"the {build.label} build FAILED its check: {outcome.message}"}
        calls.append(prepared.run)
        products.append(product)
    samples = interleaved_samples(dict(zip(("before", "after"), calls)), rounds, sample_time)
    speedups = [before / after for before, after in zip(samples["before"], samples["after"])]
    return {
        **row,
        "before_s": statistics.median(samples["before"]),
        "after_s": statistics.median(samples["after"]),
        "speedup": statistics.median(speedups),
        "speedup_range": [min(speedups), max(speedups)],
        "same_bits": bool(np.array_equal(products[0], products[1])),
        "max_abs_difference": float(np.max(np.abs(products[0].astype(np.float64) - products[1]), initial=0.0)),
    }


def _duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.3f} ms" if seconds < 10 else f"{seconds:.1f} s"


def table(data: dict) -> str:
    """The rows in 80 columns: the case, each build's median time, after's speed over before's
    (median and range over the rounds) and whether the two products have the same bits."""
    rows = data["rows"]
    width = max([len("implementation")] + [len(row["implementation"]) for row in rows]) + 2
    lines = [
        f"before: {data['before']}",
        f"after: {data['after']}",
        f"one thread, {data['rounds']} rounds, each a sample of each build in turn",
        f"{'implementation':<{width}}{'shape':<18}{'before':>11}{'after':>11} {'speed':<18} bits",
    ]
    for row in rows:
        start = f"{row['implementation']:<{width}}{row['shape'] + ' ' + row['dtype'].replace('float', 'f'):<18}"
        if "skipped" in row:
            lines.append(start + " " + row["skipped"])
            continue
        low, high = row["speedup_range"]
        bits = "same" if row["same_bits"] else f"differ {row['max_abs_difference']:.1e}"
        speed = f"{row['speedup']:.2f}x ({low:.2f}-{high:.2f})"
        lines.append(start + f"{_duration(row['before_s']):>11}{_duration(row['after_s']):>11} {speed:<18} {bits}")
    lines.append("speed: before's time / after's in each round, the median (and the range);")
    lines.append("       above 1, after is faster")
    lines.append("bits: the two builds' products the same bit for bit, or their largest difference")
    return "\n".join(lines)


def run(
    before: str, impls, shapes, dtypes, rounds: int, sample_time: float, json_path: str | None = None, weights=None
) -> dict:
    """Both builds opened, a row per implementation, shape and dtype it takes (for a decode
    implementation, per weight format: ``weights``, or every one it takes); an implementation
    that takes none of them, one row that says so."""
    for name in impls:  # refused before anything is built
        _refuse_unless_c(lookup(name))
    path, label = before_library(before)
    after_path = clib.library_path()
    builds = (Build("before", *clib.dlopen_file(path)), Build("after", *clib.dlopen_file(after_path)))
    rows = []
    for name in impls:
        impl = lookup(name)
        asked = (weights or impl.weights) if impl.weights else dtypes
        kinds = [kind for kind in asked if kind in (impl.weights or impl.dtypes)] or asked[:1]  # else: why not
        rows += [measure(name, shape, kind, builds, rounds, sample_time) for shape in shapes for kind in kinds]
    data = {
        "before": f"{label} ({path})",
        "after": f"this checkout's library ({after_path})",
        "rounds": rounds,
        "sample_time": sample_time,
        "rows": rows,
    }
    if json_path:
        files.write_text(json_path, json.dumps(data, indent=1) + "\n")
    return data
