"""The GPU plumbing every GPU adapter and experiment shares, through PyTorch.

- whether a CUDA GPU is here, its name and datasheet peaks;
- NumPy <-> CUDA tensors (BF16 too);
- ``time_cuda``: CUDA events around a launch, with the L2 cache flushed before every repeat
  and the host's dispatch time kept outside the measured interval;
- ``copy_bandwidth_gbps``: a device-to-device copy measured now, the practical memory roof
  beside the datasheet's;
- ``reference``: the float64 product computed on the GPU, for shapes where NumPy's float64
  product on the host would take longer than the kernels being checked.

It lives outside ``backends`` so the CUDA, Triton and cuBLAS adapters and the experiments use
one timer without reaching into each other.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np

from harness.model.checking import CheckOutcome, Reference, compare_elements
from harness.model.inputs import bfloat16_dtype
from harness.model.timing import Timing

# Vendor datasheet figures (dense, no sparsity): FP32 SIMT and BF16/FP16 tensor-core GFLOP/s,
# and HBM bandwidth in GB/s. Matched against the device name, first match wins.
GPU_PEAKS = (
    ("H200", {"float32": 67_000.0, "bfloat16": 989_000.0, "float16": 989_000.0, "bandwidth": 4_800.0}),
    ("H100 PCIe", {"float32": 51_000.0, "bfloat16": 756_000.0, "float16": 756_000.0, "bandwidth": 2_000.0}),
    ("H100", {"float32": 67_000.0, "bfloat16": 989_000.0, "float16": 989_000.0, "bandwidth": 3_350.0}),
    ("A100-SXM4-80GB", {"float32": 19_500.0, "bfloat16": 312_000.0, "float16": 312_000.0, "bandwidth": 2_039.0}),
    ("A100", {"float32": 19_500.0, "bfloat16": 312_000.0, "float16": 312_000.0, "bandwidth": 1_555.0}),
)

# GPU cycles the stream is kept busy before each timed repeat (about 0.5 ms at 2 GHz): long
# enough for Python to enqueue the flush, the start event and the launch behind it, so the
# start event fires when the kernel can start rather than when Python got round to it.
HOST_LEAD_CYCLES = 1_000_000


@lru_cache(maxsize=None)
def cuda_unavailable_reason() -> str | None:
    """None when PyTorch sees a CUDA GPU, else why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (it allocates GPU memory, runs cuBLAS and times GPU work)"
    if not torch.cuda.is_available():
        built = torch.version.cuda
        return f"no CUDA GPU is visible to PyTorch {torch.__version__} " + (
            f"(built for CUDA {built})" if built else "(a CPU-only build)"
        )
    return None


def available() -> bool:
    return cuda_unavailable_reason() is None


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(torch.cuda.current_device())


def device_peaks() -> dict | None:
    """The datasheet peaks of the GPU at hand; None without a GPU or for one the table lacks."""
    if not available():
        return None
    name = device_name()
    for key, peaks in GPU_PEAKS:
        if key in name:
            return peaks
    return None


def peak_for(operation: str, dtype: str) -> float | None:
    """Peak GFLOP/s of the current GPU for ``dtype``. For a GEMV the roof is bandwidth, not
    arithmetic: 2 FLOPs per element of W read, so the peak is bandwidth * 2 / itemsize, and
    "% peak" reads as a percentage of the HBM bandwidth."""
    peaks = device_peaks()
    if not peaks:
        return None
    if operation == "gemv":
        itemsize = 4 if dtype == "float32" else 2
        return peaks["bandwidth"] * 2 / itemsize
    return peaks.get(dtype)


def device_info() -> dict:
    """What the JSON of a GPU run records about the device."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_mib": round((getattr(props, "L2_cache_size", 0) or 0) / 2**20, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "datasheet": device_peaks(),
    }


def to_device(array: np.ndarray):
    """A CUDA tensor holding ``array`` (BF16 through an int16 view: torch.from_numpy cannot take it)."""
    import torch

    array = np.ascontiguousarray(array)
    # A read-only array (the experiments share theirs) makes torch warn that writing to the
    # host tensor is undefined; it is only read, by the copy to the device.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        if array.dtype.name == "bfloat16":
            tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(array)
        return tensor.to("cuda", non_blocking=False)


def to_numpy(tensor) -> np.ndarray:
    import torch

    tensor = tensor.detach().to("cpu")
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(bfloat16_dtype()).copy()
    return tensor.numpy().copy()


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


class DeviceProblem:
    """A, B, their float64 product and the terms' norm (``checking.Reference``) on the GPU:
    the values the host computes, up to float64 rounding, in milliseconds instead of seconds
    at 8192^3, kept on the device to check results there."""

    def __init__(self, a: np.ndarray, b: np.ndarray):
        import torch

        self.k = a.shape[1]
        self.dtype = a.dtype
        a64 = to_device(a).to(torch.float64)
        b64 = to_device(b).to(torch.float64)
        self.product = torch.matmul(a64, b64)
        self.terms_norm = torch.sqrt(torch.matmul(a64 * a64, b64 * b64))

    def reference(self):

        return Reference(self.product.cpu().numpy(), self.terms_norm.cpu().numpy())

    def check(self, result: np.ndarray):
        """``checking.check``'s verdict on ``result``, computed on the GPU."""
        import torch

        result = np.asarray(result)
        expected = tuple(self.product.shape)
        if result.shape != expected:
            return CheckOutcome(False, float("inf"), f"result shape {result.shape}, expected {expected}")
        if result.dtype != self.dtype:
            return CheckOutcome(
                False, float("inf"), f"result dtype {result.dtype.name}, expected the problem's {self.dtype.name}"
            )
        if result.size == 0:
            return CheckOutcome(True, 0.0, "empty result")
        got = to_device(result).to(torch.float64)
        return compare_elements(torch, got, self.product, self.terms_norm, result.dtype, self.k)


def reference(a: np.ndarray, b: np.ndarray):
    """``checking.Reference`` of A @ B, computed on the GPU and returned to the host."""
    return DeviceProblem(a, b).reference()


@lru_cache(maxsize=None)
def _flush_buffer():
    """A buffer over twice the L2 size (at least 256 MiB): reading it evicts everything else."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 * 2**20
    return torch.ones(max(2 * l2, 256 * 2**20) // 4, dtype=torch.float32, device="cuda")


def flush_l2() -> None:
    """Evict the L2 cache by reading a buffer larger than it.

    A read leaves only clean lines behind; a write (``zero_()``) would leave up to an L2's
    worth of dirty lines whose write-back the next, timed kernel would pay for.
    """
    _flush_buffer().sum()


def _hold_stream() -> None:
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(HOST_LEAD_CYCLES)


def time_cuda(launch, min_time: float = 0.2, min_repeats: int = 5, max_repeats: int = 200, warmup: int = 2) -> Timing:
    """Time ``launch`` (which enqueues GPU work on the default stream and returns without
    synchronising) with CUDA events, every repeat reading from HBM.

    Per repeat the stream gets: a busy-wait (``torch.cuda._sleep``), the L2 flush, the start
    event, the launch, the end event. The busy-wait covers the host's time to enqueue the
    rest, so nothing the host does falls between the flush and the start event.
    """
    import torch

    _flush_buffer()
    for _ in range(warmup):
        launch()
    torch.cuda.synchronize()
    samples: list[float] = []
    total = 0.0
    while len(samples) < min_repeats or (total < min_time and len(samples) < max_repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        _hold_stream()
        flush_l2()
        start.record()
        launch()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        samples.append(seconds)
        total += seconds
    return Timing.from_samples(samples)


def copy_bandwidth_gbps(megabytes: int = 2048, repeats: int = 5) -> float:
    """Device-to-device copy bandwidth measured now, counting bytes read and written (best of
    ``repeats``): the memory roof a streaming kernel can actually reach on this card."""
    import torch

    source = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device="cuda")
    target = torch.empty_like(source)
    timing = time_cuda(lambda: target.copy_(source), min_time=0.0, min_repeats=repeats, max_repeats=repeats)
    return 2 * megabytes * 2**20 / timing.min_s / 1e9
