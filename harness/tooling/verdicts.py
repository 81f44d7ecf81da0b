"""The GPU speed targets, judged from a comparison's JSON: nothing is measured again.

``python -m harness verdicts gemm.json [more.json ...]`` prints one line per target: met,
missed, or not judged (the rows it needs are missing, failed or untimed). Exit status 0 only
when every target is met. Targets are ratios against cuBLAS measured in the same run, or shares of the
memory roof, so they hold on any Hopper GPU; they were set for an H200. GEMV rows are scored
against both the datasheet HBM bandwidth and the device-to-device copy measured in that run.
Decode rows (quantized weights) are told apart by their weight format; their targets are a
share of that measured copy and a ratio against a GPU peer's row at the same problem.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    implementation: str
    shape: str  # MxNxK, as rows record it
    dtype: str
    kind: str  # "vs_cublas": baseline time / this time; "hbm": share of datasheet bandwidth;
    # "copy": share of the measured device-to-device copy; "vs_peer": peer's time / this time
    at_least: float
    weights: str | None = None  # a decode row's weight format (q4_0, ...); None: a plain matmul
    peer: str | None = None  # "vs_peer": the implementation compared with, at the same problem

    def describe(self) -> str:
        what = {
            "vs_cublas": f"{self.at_least:.0%} of cuBLAS",
            "hbm": f"{self.at_least:.0%} of HBM bandwidth",
            "copy": f"{self.at_least:.0%} of the measured copy bandwidth",
            "vs_peer": f"{self.at_least:.2f}x {self.peer}",
        }[self.kind]
        weights = f" {self.weights} weights" if self.weights else ""
        return f"{self.implementation} {self.dtype} {self.shape}{weights}: at least {what}"


TARGETS = (
    Target("cuda.register_tiled", "4096x4096x4096", "float32", "vs_cublas", 0.50),
    Target("cuda.wmma", "4096x4096x4096", "bfloat16", "vs_cublas", 0.25),
    Target("cuda.wmma", "8192x8192x8192", "bfloat16", "vs_cublas", 0.25),
    Target("cuda.mma", "4096x4096x4096", "bfloat16", "vs_cublas", 0.50),
    Target("cuda.mma", "8192x8192x8192", "bfloat16", "vs_cublas", 0.50),
    *(Target("cuda.wgmma", f"{n}x{n}x{n}", "bfloat16", "vs_cublas", 0.80) for n in (4096, 8192)),
    Target("cuda.gemv", "1x16384x16384", "bfloat16", "hbm", 0.80),
    *(
        Target("triton.matmul", f"{n}x{n}x{n}", dtype, "vs_cublas", 0.90)
        for n in (4096, 8192)
        for dtype in ("float16", "bfloat16")
    ),
    *(Target("triton.matmul_tma", f"{n}x{n}x{n}", "bfloat16", "vs_cublas", 0.95) for n in (4096, 8192)),
    *(Target("triton.gemv", "1x16384x16384", dtype, "hbm", 0.80) for dtype in ("float16", "bfloat16")),
    # q4_0 decode GEMV at >= 100 MB of weights (151 and 132 MB): the bytes at 80% of what a copy
    # moves, and at least as fast as torch's int4 weight-only kernel on the same weights
    *(
        Target(name, shape, "float32", kind, at_least, weights="q4_0", peer=peer)
        for name in ("cuda.decode", "triton.decode")
        for shape in ("1x16384x16384", "1x28672x8192")
        for kind, at_least, peer in (("copy", 0.80, None), ("vs_peer", 1.0, "torch.int4_gpu"))
    ),
)


@dataclass(frozen=True)
class Verdict:
    target: Target
    outcome: str  # "met", "missed", "not judged"
    detail: str

    def line(self) -> str:
        return f"{self.outcome.upper():<10} {self.target.describe()}: {self.detail}"


def judge(documents: list[dict]) -> list[Verdict]:
    rows = {}
    copy_gbps = None
    datasheet_gbps = None
    for document in documents:
        for row in document.get("results", []):
            weights = row.get("weights")
            rows[(row["implementation"], row["shape"], row["dtype"], None if weights == "None" else weights)] = row
        gpu = document.get("machine", {}).get("gpu") or {}
        copy_gbps = gpu.get("copy_bandwidth_gbps", copy_gbps)
        datasheet_gbps = (gpu.get("datasheet") or {}).get("bandwidth", datasheet_gbps)
    return [_judge_one(target, rows, copy_gbps, datasheet_gbps) for target in TARGETS]


def _judge_one(target: Target, rows: dict, copy_gbps, datasheet_gbps) -> Verdict:
    row = rows.get((target.implementation, target.shape, target.dtype, target.weights))
    if row is None:
        return Verdict(target, "not judged", "no row in the comparison")
    if row.get("status") != "ok" or not row.get("median_s"):
        return Verdict(target, "not judged", f"row not timed: {row.get('status', '')[:120]}")
    if target.kind == "vs_peer":
        peer = rows.get((target.peer, target.shape, target.dtype, target.weights))
        if peer is None or peer.get("status") != "ok" or not peer.get("median_s"):
            why = "no row" if peer is None else f"its row not timed: {peer.get('status', '')[:100]}"
            return Verdict(target, "not judged", f"{target.peer}: {why}")
        ratio = peer["median_s"] / row["median_s"]
        detail = f"{ratio:.2f}x {target.peer} ({row['median_s'] * 1e6:.0f} us against {peer['median_s'] * 1e6:.0f} us)"
        return Verdict(target, "met" if ratio >= target.at_least else "missed", detail)
    if target.kind == "copy":
        gbps = row.get("gbytes_per_s")
        if gbps is None or not copy_gbps:
            return Verdict(target, "not judged", "no GB/s in the row" if gbps is None else "no measured copy bandwidth")
        share = gbps / copy_gbps
        detail = f"{gbps:.0f} GB/s = {share:.0%} of the {copy_gbps:.0f} GB/s measured copy"
        return Verdict(target, "met" if share >= target.at_least else "missed", detail)
    if target.kind == "vs_cublas":
        ratio = row.get("speedup")
        if ratio is None:
            return Verdict(target, "not judged", "no timed cuBLAS row at this shape")
        rate = f" ({row['gflops'] / 1e3:.1f} TFLOP/s)" if row.get("gflops") is not None else ""
        detail = f"{ratio:.2f}x cuBLAS{rate}"
        return Verdict(target, "met" if ratio >= target.at_least else "missed", detail)
    gbps = row.get("gbytes_per_s")
    if gbps is None:
        return Verdict(target, "not judged", "the row has no GB/s")
    if not datasheet_gbps:
        return Verdict(target, "not judged", f"{gbps:.0f} GB/s; no datasheet bandwidth for this GPU")
    share = gbps / datasheet_gbps
    detail = f"{gbps:.0f} GB/s = {share:.0%} of the {datasheet_gbps:.0f} GB/s datasheet"
    if copy_gbps:
        detail += f", {gbps / copy_gbps:.0%} of the {copy_gbps:.0f} GB/s measured copy"
    return Verdict(target, "met" if share >= target.at_least else "missed", detail)


def read_comparison(path) -> dict:
    """A comparison's JSON (``compare --json``), or ValueError saying in one line why ``path``
    is not one: unreadable, empty, cut short, or JSON of another shape."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not text, so not a comparison's JSON") from None
    if not text.strip():
        raise ValueError(f"{path} is empty")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}; "
            "a file cut short reads so)"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ValueError(f"{path} is not a comparison's JSON: it has no list of results")
    for index, row in enumerate(document["results"]):
        if not isinstance(row, dict) or not all(
            isinstance(row.get(key), str) for key in ("implementation", "shape", "dtype")
        ):
            raise ValueError(f"{path}: result {index} has no implementation, shape and dtype")
        if not isinstance(row.get("status", ""), str):
            raise ValueError(f"{path}: result {index} has a status that is not text: {row['status']!r}")
        for key in ("median_s", "speedup", "gflops", "gbytes_per_s"):
            if not _number_or_none(row.get(key)):
                raise ValueError(f"{path}: result {index} has a {key} that is not a number: {row[key]!r}")
    machine = document.get("machine", {})
    gpu = machine.get("gpu") or {} if isinstance(machine, dict) else None
    datasheet = gpu.get("datasheet") or {} if isinstance(gpu, dict) else None
    if (
        not isinstance(datasheet, dict)
        or not _number_or_none(gpu.get("copy_bandwidth_gbps"))
        or not _number_or_none(datasheet.get("bandwidth"))
    ):
        raise ValueError(f"{path}: its machine section is not what a comparison writes")
    return document


def _number_or_none(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def main(paths: list[str]) -> int:
    """0 when every target is met, 1 when one is missed or not judged, 2 when a file is not a
    comparison's JSON (named on stderr, nothing judged)."""
    try:
        documents = [read_comparison(path) for path in paths]
    except ValueError as error:
        sys.stderr.write(f"verdicts: {error}\n")
        return 2
    verdicts = judge(documents)
    for verdict in verdicts:
        print(verdict.line())
    return 0 if all(v.outcome == "met" for v in verdicts) else 1
