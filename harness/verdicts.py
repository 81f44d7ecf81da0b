"""The GPU speed targets, judged from a comparison's JSON: nothing is measured again.

``python -m harness verdicts gemm.json [more.json ...]`` prints one line per target: met,
missed, or not judged (the rows it needs are missing, failed or untimed). Exit status 0 only
when every target is met. Targets are ratios against cuBLAS measured in the same run, or shares of the
memory roof, so they hold on any Hopper GPU; they were set for an H200. GEMV rows are scored
against both the datasheet HBM bandwidth and the device-to-device copy measured in that run.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    implementation: str
    shape: str          # MxNxK, as rows record it
    dtype: str
    kind: str           # "vs_cublas": baseline time / this time; "hbm": share of datasheet bandwidth
    at_least: float

    def describe(self) -> str:
        what = f"{self.at_least:.0%} of cuBLAS" if self.kind == "vs_cublas" else f"{self.at_least:.0%} of HBM bandwidth"
        return f"{self.implementation} {self.dtype} {self.shape}: at least {what}"


TARGETS = (
    Target("cuda.register_tiled", "4096x4096x4096", "float32", "vs_cublas", 0.50),
    Target("cuda.wmma", "4096x4096x4096", "bfloat16", "vs_cublas", 0.25),
    Target("cuda.wmma", "8192x8192x8192", "bfloat16", "vs_cublas", 0.25),
    Target("cuda.mma", "4096x4096x4096", "bfloat16", "vs_cublas", 0.50),
    Target("cuda.mma", "8192x8192x8192", "bfloat16", "vs_cublas", 0.50),
    *(Target("cuda.wgmma", f"{n}x{n}x{n}", "bfloat16", "vs_cublas", 0.80) for n in (4096, 8192)),
    Target("cuda.gemv", "1x16384x16384", "bfloat16", "hbm", 0.80),
    *(Target("triton.matmul", f"{n}x{n}x{n}", dtype, "vs_cublas", 0.90)
      for n in (4096, 8192) for dtype in ("float16", "bfloat16")),
    *(Target("triton.matmul_tma", f"{n}x{n}x{n}", "bfloat16", "vs_cublas", 0.95) for n in (4096, 8192)),
    *(Target("triton.gemv", "1x16384x16384", dtype, "hbm", 0.80) for dtype in ("float16", "bfloat16")),
)


@dataclass(frozen=True)
class Verdict:
    target: Target
    outcome: str        # "met", "missed", "not judged"
    detail: str

    def line(self) -> str:
        return f"{self.outcome.upper():<10} {self.target.describe()}: {self.detail}"


def judge(documents: list[dict]) -> list[Verdict]:
    rows = {}
    copy_gbps = None
    datasheet_gbps = None
    for document in documents:
        for row in document.get("results", []):
            rows[(row["implementation"], row["shape"], row["dtype"])] = row
        gpu = document.get("machine", {}).get("gpu") or {}
        copy_gbps = gpu.get("copy_bandwidth_gbps", copy_gbps)
        datasheet_gbps = (gpu.get("datasheet") or {}).get("bandwidth", datasheet_gbps)
    return [_judge_one(target, rows, copy_gbps, datasheet_gbps) for target in TARGETS]


def _judge_one(target: Target, rows: dict, copy_gbps, datasheet_gbps) -> Verdict:
    row = rows.get((target.implementation, target.shape, target.dtype))
    if row is None:
        return Verdict(target, "not judged", "no row in the comparison")
    if row.get("status") != "ok" or not row.get("median_s"):
        return Verdict(target, "not judged", f"row not timed: {row.get('status', '')[:120]}")
    if target.kind == "vs_cublas":
        ratio = row.get("speedup")
        if ratio is None:
            return Verdict(target, "not judged", "no timed cuBLAS row at this shape")
        detail = f"{ratio:.2f}x cuBLAS ({row['gflops'] / 1e3:.1f} TFLOP/s)"
        return Verdict(target, "met" if ratio >= target.at_least else "missed", detail)
    gbps = row["gbytes_per_s"]
    if not datasheet_gbps:
        return Verdict(target, "not judged", f"{gbps:.0f} GB/s; no datasheet bandwidth for this GPU")
    share = gbps / datasheet_gbps
    detail = f"{gbps:.0f} GB/s = {share:.0%} of the {datasheet_gbps:.0f} GB/s datasheet"
    if copy_gbps:
        detail += f", {gbps / copy_gbps:.0%} of the {copy_gbps:.0f} GB/s measured copy"
    return Verdict(target, "met" if share >= target.at_least else "missed", detail)


def main(paths: list[str]) -> int:
    documents = [json.loads(Path(p).read_text()) for p in paths]
    verdicts = judge(documents)
    for verdict in verdicts:
        print(verdict.line())
    return 0 if all(v.outcome == "met" for v in verdicts) else 1
