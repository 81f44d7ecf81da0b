"""What machine a result came from, and its peak FLOP rate where it can be worked out."""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from harness.backends.c import clib
from harness.env import files
from harness.env.cache import user_cache_root

SIMD_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx_vnni",  # the int8 dot products c.decode_int8 and llama.cpp use (vpdpbusd)
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",  # c.bf16's AMX tiles
    "neon",
    "asimd",
    "sve",
)
PACKAGES = ("numpy", "cffi", "threadpoolctl", "torch", "triton", "pycuda", "ml_dtypes", "matplotlib")


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if ":" in line:
                    key, value = (part.strip() for part in line.split(":", 1))
                    info.setdefault(key, value)
    except OSError:
        pass
    return info


@lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU's name, with its x86 family and model where the name alone does not tell one
    generation from the next (a virtual machine may say only "AMD EPYC" for Zen 2 to Zen 5)."""
    info = _cpuinfo()
    name = info.get("model name") or info.get("Hardware") or platform.processor() or platform.machine()
    if info.get("cpu family") and info.get("model"):
        name += f" (family {info['cpu family']}, model {info['model']})"
    return name


@lru_cache(maxsize=None)
def simd_flags() -> tuple[str, ...]:
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    if platform.machine() in ("arm64", "aarch64"):
        flags.add("neon")
    return tuple(f for f in SIMD_FLAGS if f in flags)


def blas_info() -> list[dict]:
    """The BLAS libraries loaded, with the OpenBLAS kernel in use (its 'architecture')."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    # what identifies the library, not where this machine installed it (no absolute paths in results)
    keep = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads", "threading_layer")
    return [
        {k: entry.get(k) for k in keep if k in entry} for entry in threadpool_info() if entry.get("user_api") == "blas"
    ]


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


@lru_cache(maxsize=None)
def measured_clock_ghz() -> float | None:
    """The core clock measured by the C library (None if the library cannot be loaded)."""
    try:
        _, lib = clib.load()
        return float(lib.matmul_measure_clock_ghz())
    except Exception:
        return None


def simd_bits() -> int:
    flags = simd_flags()
    if "avx512f" in flags:
        return 512
    if "avx2" in flags or "avx" in flags:
        return 256
    return 128


# Two FMA pipes per core is right for every x86-64 core since Haswell/Zen 2 and for the big
# ARM cores; it is an assumption, stated in every peak figure's description.
FMA_UNITS_PER_CORE = 2


ROOF_TRIALS = 25
READ_BYTES, READ_TRIALS = 512 * 2**20, 7  # far beyond any cache; about 0.3 s in all


@lru_cache(maxsize=None)
def measured_fma_roofs() -> dict | None:
    """One core's measured roofs: FMA throughput per dtype, {"float32": {"best": GFLOP/s,
    "median": ...}, "float64": ..., "read_gbps": {"best": GB/s streamed in, "median": ...}},
    or None where they cannot be measured (no known FMA SIMD unit, no C library).

    Measured once per machine and kept in the user's cache: a later measurement replaces the
    kept one only if it is higher (noise only slows a measurement down), so one busy moment
    cannot lower the roof for good (``remember_roofs``); a kept one above what this machine's
    clock and SIMD width allow (``roof_bound``) is dropped for the one measured now.
    """
    try:
        ffi, lib = clib.load()
        # looked up here: a library that is not ours (MATMUL_C_LIBRARY) loads, and lacks them
        measure_fma, measure_read = lib.matmul_measure_fma_gflops, lib.matmul_measure_read_gbps
    except Exception:
        return None
    measured = {}
    for dtype, size in (("float32", 4), ("float64", 8)):
        median = ffi.new("double *")
        entry = {"best": round(float(measure_fma(size, ROOF_TRIALS, median)), 2), "median": round(float(median[0]), 2)}
        if not _plausible_roof(dtype, entry):
            return None
        measured[dtype] = entry
    median = ffi.new("double *")
    entry = {
        "best": round(float(measure_read(READ_BYTES, READ_TRIALS, median)), 2),
        "median": round(float(median[0]), 2),
    }
    if _plausible_roof("read_gbps", entry):
        measured["read_gbps"] = entry
    return remember_roofs(_machine_key(), measured, {kind: roof_bound(kind) for kind in measured})


def _machine_key() -> str:
    return f"{cpu_model()} | {' '.join(simd_flags())}"


# What no single core reaches, by far (the widest today: about 300 FP32 GFLOP/s, 50 GB/s
# streamed): a kept roof beyond it is a damaged cache, not a measurement, and would make
# every "% peak" read 0%.
ROOF_LIMITS = {
    "float32": 10_000.0,
    "float64": 10_000.0,
    "bfloat16": 20_000.0,
    "int8_gops": 40_000.0,
    "read_gbps": 1_000.0,
}


# A kept roof must also be one this machine can reach: an FMA roof of one core is at most its
# clock x SIMD lanes x 2 FLOPs x FMA units, and a core streams memory in no faster than its
# load ports take it in: at most LOADS_PER_CYCLE loads a cycle (Golden Cove and Zen 4 do three),
# none wider than a SIMD register. That is L1 bandwidth, which no stream from memory comes near
# (about 320 GB/s at 3.3 GHz with AVX2, where one core streams 20-50 GB/s), times the threads
# reading. BOUND_MARGIN covers a clock measured a little low (the boost varies). A roof kept beyond that is a damaged or
# foreign cache, not a measurement (9,000 GFLOP/s kept where 260 is real read every "% peak" as
# 2.3% instead of 83%): it is dropped, and this run's measurement kept instead.
BOUND_MARGIN = 1.25
LOADS_PER_CYCLE = 3


def _max_clock_ghz() -> float | None:
    """The fastest this core runs: the clock measured now, or the OS's maximum if that is higher
    (a busy machine measures its clock low)."""
    clocks = [measured_clock_ghz() or 0.0]
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as handle:
            clocks.append(int(handle.read()) / 1e6)  # kHz
    except (OSError, ValueError):  # not Linux, or a virtual machine that does not say
        pass
    best = max(clocks)
    return best if best > 0 else None


def roof_bound(kind: str) -> float | None:
    """The most this machine's clock and instruction set allow for a kind of roof (float32,
    float64: one core's GFLOP/s; int8_gops: one core's GOP/s; read_gbps, read_gbps_<N>_threads:
    GB/s), or None when the clock is not known."""
    clock = _max_clock_ghz()
    threads = _read_threads(kind)
    if clock is None or (kind not in ("float32", "float64", "bfloat16", "int8_gops") and threads is None):
        return None
    if kind == "int8_gops":  # a byte product per SIMD byte, a multiply-add two ops, on as many pipes as FMAs
        return BOUND_MARGIN * clock * (simd_bits() // 8) * 2 * FMA_UNITS_PER_CORE
    if kind == "bfloat16":  # a pair of products per 32-bit lane, a multiply-add two FLOPs
        return BOUND_MARGIN * clock * (simd_bits() // 32) * 4 * FMA_UNITS_PER_CORE
    if threads is None:
        lanes = simd_bits() // (32 if kind == "float32" else 64)
        return BOUND_MARGIN * clock * lanes * 2 * FMA_UNITS_PER_CORE
    return BOUND_MARGIN * clock * LOADS_PER_CYCLE * (simd_bits() // 8) * threads


def _read_threads(kind: str) -> int | None:
    """How many cores a read roof was measured with (1 for read_gbps), None if not a read roof."""
    if kind == "read_gbps":
        return 1
    if kind.startswith("read_gbps_") and kind.endswith("_threads") and kind[10:-8].isdigit():
        return int(kind[10:-8])
    return None


def _roof_limit(kind: str) -> float | None:
    """The limit of a kind of roof (several cores' reads: read_gbps_<N>_threads), None if unknown."""
    threads = _read_threads(kind)
    return ROOF_LIMITS["read_gbps"] * threads if threads else ROOF_LIMITS.get(kind)


def _plausible_roof(kind: str, entry) -> bool:
    limit = _roof_limit(kind)

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= (limit or 0)

    return isinstance(entry, dict) and number(entry.get("best")) and ("median" not in entry or number(entry["median"]))


def _read_roof_cache(cache) -> dict:
    """The roof cache's entries that are well formed: {machine key: {kind: {"best", "median"}}}.
    Anything else in it (not JSON, null, a list, a string, "best": "1e9", 1e30, Infinity) is
    treated as absent, and replaced at the next write."""
    import json

    if cache.is_symlink():  # not the harness's file: never read (nor written) through
        return {}
    try:
        kept = json.loads(cache.read_text())
    except (OSError, ValueError):  # missing, unreadable, not JSON (ValueError covers bad UTF-8)
        return {}
    if not isinstance(kept, dict):
        return {}
    valid = {}
    for key, roofs in kept.items():
        if isinstance(roofs, dict):
            good = {kind: entry for kind, entry in roofs.items() if _roof_limit(kind) and _plausible_roof(kind, entry)}
            if good:
                valid[key] = good
    return valid


def _keep_best(previous: dict, measured: dict) -> dict:
    return {
        kind: previous[kind] if kind in previous and previous[kind]["best"] > entry["best"] else entry
        for kind, entry in measured.items()
    }


def _within(kept: dict, bounds: dict) -> dict:
    """The kept roofs no higher than their bound (those without a known bound stay)."""
    return {
        kind: entry
        for kind, entry in kept.items()
        if bounds.get(kind) is None or max(entry["best"], entry.get("median", 0)) <= bounds[kind]
    }


def remember_roofs(key: str, measured: dict, bounds: dict | None = None) -> dict:
    """``measured`` with each roof raised to the best kept for ``key`` in the user's cache,
    which is updated to match. Read, merged and written under a lock, so processes measuring
    at once each keep the best of everyone's; the file is replaced whole (files.py).

    ``bounds`` ({kind: the most this machine allows}, ``roof_bound``): a kept roof above its
    bound is dropped, and replaced in the cache by the one measured now.

    A symlink at the cache's path is not used at all: the harness never made it, and writing
    through it would replace whatever file it names, or create the folders its target lacks
    (a dangling link to /nonexistent/... made /nonexistent). Replacing the link instead would
    silently undo a user's own arrangement; the roofs measured now serve this process."""
    import json

    cache = _roof_cache_path()
    bounds = bounds or {}
    if cache.is_symlink():
        return dict(measured)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with files.locked(cache.with_name(cache.name + ".lock")):
            if cache.is_symlink():  # planted while this process waited for the lock
                return dict(measured)
            kept = _read_roof_cache(cache)
            best = _keep_best(_within(kept.get(key, {}), bounds), measured)
            # the kinds not measured now are kept as they were (checked when they are measured)
            kept[key] = {**kept.get(key, {}), **best}
            files.write_text(cache, json.dumps(kept, indent=2, allow_nan=False) + "\n")
    except OSError:  # a read-only home: the best known still serves this process
        best = _keep_best(_within(_read_roof_cache(cache).get(key, {}), bounds), measured)
    return best


# Where the system does not say (not Linux, no sysfs): a last-level cache as large as any
# current server CPU's per-die L3, so that a DRAM-timed row errs towards more copies of W.
FALLBACK_LAST_LEVEL_CACHE_BYTES = 96 * 2**20


@lru_cache(maxsize=None)
def last_level_cache_bytes() -> int:
    """The size of the last-level (highest) cache of CPU 0, in bytes, from sysfs."""
    best_level, best_size = -1, 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit() and level > best_level:
            best_level, best_size = level, int(digits) * scale
    return best_size or FALLBACK_LAST_LEVEL_CACHE_BYTES


def memory_read_gbps() -> float | None:
    """One core's measured streaming-read bandwidth (the best kept per machine), or None."""
    roofs = measured_fma_roofs()
    return roofs["read_gbps"]["best"] if roofs and "read_gbps" in roofs else None


# A read roof measured beside timed rows (compare's decode problems): trials of one pass each
# over the rows' own arena, the best kept; a few tenths of a second with the page touching.
BESIDE_TRIALS = 5


def read_gbps_now(nbytes: int, threads: int = 1) -> float | None:
    """The streaming-read bandwidth of ``threads`` cores over ``nbytes`` of memory, measured
    now (best of BESIDE_TRIALS passes) and neither cached nor kept: the roof a row timed in
    the same minute is scored against, where the host's bandwidth moves from minute to
    minute. None where it cannot be measured."""
    try:
        ffi, lib = clib.load()
        measure = lib.matmul_measure_read_gbps_threads
    except Exception:
        return None
    gbps = float(measure(int(nbytes), BESIDE_TRIALS, int(threads), ffi.NULL))
    return gbps if _plausible_roof(f"read_gbps_{max(1, threads)}_threads", {"best": gbps}) else None


@lru_cache(maxsize=None)
def memory_roof_gbps(threads: int = 1) -> float | None:
    """The memory roof of ``threads`` cores: the streaming-read bandwidth they measured together
    through the kernels' thread pool (the best kept per machine and thread count), or None
    where it cannot be measured. What a bandwidth-bound kernel (a decode GEMV) is scored
    against: one core alone does not saturate memory, so a 2-thread row needs a 2-thread roof."""
    if threads <= 1:
        return memory_read_gbps()
    try:
        ffi, lib = clib.load()
        measure = lib.matmul_measure_read_gbps_threads
    except Exception:
        return None
    median = ffi.new("double *")
    entry = {
        "best": round(float(measure(READ_BYTES, READ_TRIALS, threads, median)), 2),
        "median": round(float(median[0]), 2),
    }
    kind = f"read_gbps_{threads}_threads"
    if not _plausible_roof(kind, entry):
        return None
    return remember_roofs(_machine_key(), {kind: entry}, {kind: roof_bound(kind)})[kind]["best"]


@lru_cache(maxsize=None)
def measured_int8_roof() -> dict | None:
    """One core's int8 roof, {"best": GOP/s, "median": ...}: int8 multiply-adds (two ops each)
    with the instruction the int8 kernels use on it (AVX-512 VNNI's vpdpbusd, else AVX2's
    vpmaddubsw; c/cpu_roofs.c), kept per machine as the FMA roofs are; None where it cannot be
    measured. What the kernels that multiply bytes (c.decode_int8, llama.cpp) are scored
    against at prefill sizes, where the multiply-adds, not W's bytes, set the time."""
    return _measured_core_roof("int8_gops", "matmul_measure_int8_gops")


@lru_cache(maxsize=None)
def measured_bf16_roof() -> dict | None:
    """One core's BF16 roof, {"best": GFLOP/s, "median": ...}: AVX512_BF16's vdpbf16ps
    (c/cpu_roofs.c), kept per machine as the FMA roofs are; None where c.bf16 does not run
    that instruction (no AVX512_BF16; or AMX, whose rate is not measured). What the bfloat16
    rows (c.bf16, torch's bfloat16 matmul) are scored against."""
    return _measured_core_roof("bfloat16", "matmul_measure_bf16_gflops")


def _measured_core_roof(kind: str, function: str) -> dict | None:
    """One core's roof of ``kind``, measured by the C library's ``function`` (trials, *median),
    kept per machine (``remember_roofs``); None where the library lacks it or measures 0."""
    try:
        ffi, lib = clib.load()
        measure = getattr(lib, function)
    except Exception:
        return None
    median = ffi.new("double *")
    entry = {"best": round(float(measure(ROOF_TRIALS, median)), 2), "median": round(float(median[0]), 2)}
    if not _plausible_roof(kind, entry):
        return None
    return remember_roofs(_machine_key(), {kind: entry}, {kind: roof_bound(kind)})[kind]


def cpu_int8_peak_gops(cores: int = 1) -> float | None:
    """The int8 roof of ``cores`` cores (one core's, measured, times ``cores``), or None."""
    roof = measured_int8_roof()
    return roof["best"] * cores if roof else None


def _roof_cache_path():

    return user_cache_root() / "cpu-roofs.json"


def cpu_peak_gflops(dtype: str, cores: int = 1) -> float | None:
    """Peak FLOP rate of ``cores`` cores: one core's measured FMA throughput (best of many
    trials) times ``cores``; where that cannot be measured, clock x SIMD lanes x 2 (an FMA is
    two FLOPs) x FMA units. bfloat16: the measured vdpbf16ps roof where c.bf16 runs it, else None."""
    if dtype == "bfloat16":
        roof = measured_bf16_roof()
        return roof["best"] * cores if roof else None
    bytes_per_element = {"float32": 4, "float64": 8}.get(dtype)
    if bytes_per_element is None:
        return None
    roofs = measured_fma_roofs()
    if roofs:
        return roofs[dtype]["best"] * cores
    clock = measured_clock_ghz()
    if clock is None:
        return None
    lanes = simd_bits() // (8 * bytes_per_element)
    return clock * lanes * 2 * FMA_UNITS_PER_CORE * cores


def _gpu_present() -> bool:
    """A cheap look for an NVIDIA driver, so CPU-only runs never import torch for this."""
    import shutil

    return (
        os.path.exists("/proc/driver/nvidia")
        or os.path.exists("/dev/nvidia0")
        or shutil.which("nvidia-smi") is not None
    )


def gpu_info() -> dict | None:
    """The CUDA GPU, driver and library versions, or None where there is no GPU."""
    if not _gpu_present():
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info = {
            "name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "l2_cache_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1) or None,
            "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        }
    except Exception as error:  # machine info must never break a comparison
        return {"error": f"{type(error).__name__}: {error}"}
    try:
        import subprocess

        query = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                "--format=csv,noheader",
                f"--id={index}",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if query.returncode == 0 and query.stdout.strip():
            driver, sm_clock, mem_clock = (part.strip() for part in query.stdout.strip().splitlines()[0].split(","))
            info.update(driver=driver, max_sm_clock=sm_clock, max_memory_clock=mem_clock)
    except Exception:
        pass
    try:
        import subprocess

        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=10)
        info["nvcc"] = nvcc.stdout.strip().splitlines()[-1] if nvcc.returncode == 0 else None
    except Exception:
        info["nvcc"] = None
    return info


def machine_info(measure_clock: bool = True) -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "simd": list(simd_flags()),
        "blas": blas_info(),
        "openblas_env": {
            k: os.environ[k]
            for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
            if k in os.environ
        },
        "versions": versions(),
    }
    gpu = gpu_info()
    if gpu:
        info["gpu"] = gpu
    if measure_clock:
        clock = measured_clock_ghz()
        info["cpu_clock_ghz_measured"] = round(clock, 3) if clock else None
        info["cpu_peak_gflops_per_core"] = {dtype: cpu_peak_gflops(dtype) for dtype in ("float32", "float64")}
        roofs = measured_fma_roofs()
        if roofs:
            info["cpu_fma_roofs_gflops_per_core"] = roofs
            info["cpu_peak_basis"] = (
                f"one core's FMA throughput measured with {simd_bits()}-bit SIMD, best of "
                f"{ROOF_TRIALS} trials (median beside it), kept per machine; read_gbps: "
                f"one core streaming {READ_BYTES >> 20} MiB in, best of {READ_TRIALS}"
            )
        else:
            info["cpu_peak_basis"] = (
                f"measured clock x {simd_bits()}-bit SIMD x FMA (2 FLOPs) x {FMA_UNITS_PER_CORE} FMA units"
            )
        bf16 = measured_bf16_roof()
        if bf16:
            info["cpu_bf16_roof_gflops_per_core"] = bf16
            info["cpu_bf16_roof_basis"] = (
                f"one core's vdpbf16ps (AVX512_BF16: 64 FLOPs each), best of {ROOF_TRIALS} trials (median beside "
                "it), kept per machine: the peak of the bfloat16 rows"
            )
        int8 = measured_int8_roof()
        if int8:
            info["cpu_int8_roof_gops_per_core"] = int8
            info["cpu_int8_roof_basis"] = (
                "one core's int8 multiply-adds (2 ops each) with vpdpbusd (AVX-512 VNNI) or vpmaddubsw (AVX2), best "
                f"of {ROOF_TRIALS} trials (median beside it), kept per machine: the peak of the rows that round X to "
                "8 bits"
            )
    return info
