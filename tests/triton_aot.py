"""The Triton kernels compiled ahead of time for Hopper (sm_90) and Ampere (sm_80), without a GPU.

Triton's wheel carries ptxas, so the kernels compile for any architecture on any machine. The
compiling happens in a child process: in the tests' own process the harness has put Triton in
interpreter mode (TRITON_INTERPRET=1, before Triton was imported), where ``@triton.jit`` gives
no compilable kernel. Used by test_triton.py and test_sass.py; Triton's on-disk cache makes a
kernel compiled by one of them cheap for the other.

A request names a kernel, a dtype, an architecture and which configs:

    ("matmul", "fp32", 80, "every")   every config the autotuner's pruning keeps for that dtype
                                      on that architecture (shared memory: SHARED_MEMORY)
    ("matmul", "bf16", 90, "first")   the first of those
    ("matmul", "bf16", 90, 2)         the architecture's list's config 2, kept or not
    ("gemv", "bf16", 90, 2)           CONFIGS[2]
    ("gemv", "bf16", 90, 0, 4)        CONFIGS[0] with num_stages = 4
    ("decode", "q4_0", 90, "first")   triton/decode.py's decode_kernel (M = 1), CONFIGS["q4_0"][0]
    ("decode", "q8_0/m16", 90, 2)     its decode_rows_kernel, ROWS_CONFIGS[2], 16 rows of X
    ("matmul_tma", "bf16", 90, "every")  every Hopper config of triton/matmul_tma.py that fits
                                      SHARED_MEMORY; an index picks one of HOPPER_CONFIGS
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Shared memory per block the autotuner's pruning sees: H100/H200 227 KiB, A100 163 KiB.
SHARED_MEMORY = {90: 232448, 80: 166912}

_SCRIPT = r"""
import base64, importlib.util, json, os, sys
import torch, triton
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
except ImportError as error:
    print(json.dumps({"skip": f"this Triton has no ahead-of-time compile API ({error})"}))
    sys.exit(0)

root, requests, shared_memory = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])

def load(relative):
    path = os.path.join(root, relative)
    spec = importlib.util.spec_from_file_location("_aot_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

mm, gv, tma = load("triton/matmul.py"), load("triton/gemv.py"), load("triton/matmul_tma.py")
dc = load("triton/decode.py")
assert not mm.INTERPRETED and not gv.INTERPRETED and not tma.INTERPRETED and not dc.INTERPRETED
TORCH = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
KERNELS = {
    # kernel, pointer arguments, arguments divisible by 16, constants of a row-major call
    "matmul": (mm.matmul_kernel, ["a_ptr", "b_ptr", "c_ptr"], ["M", "N", "K", "stride_am", "stride_bk", "stride_cm"],
               {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, "UPCAST": False}),
    "gemv": (gv.gemv_kernel, ["w_ptr", "x_ptr", "y_ptr"], ["N", "K", "stride_wn"],
             {"stride_wk": 1, "stride_x": 1, "stride_y": 1}),
    # tensor descriptors instead of pointers; 132 programs: an H100 SXM's (and H200's) SMs
    "matmul_tma": (tma.matmul_tma_kernel, [], ["M", "N", "K"], {"NUM_PROGRAMS": 132, "UPCAST": False}),
    # dtype: the weight format, optionally with the rows of X, "q4_0/m16"; pointers typed in build()
    "decode": (dc.decode_kernel, ["x_ptr", "s_ptr", "q_ptr", "y_ptr"], ["K"], {}),
    "decode_rows": (dc.decode_rows_kernel, ["x_ptr", "s_ptr", "q_ptr", "y_ptr"], ["K"], {}),
}
DECODE_POINTERS = {"q4_0": ("*fp16", "*u8"), "q8_0": ("*fp16", "*i8"), "bf16": ("*bf16", "*bf16"),
                   "q4_K": ("*fp16", "*u8")}

def descriptor_types(dtype, kw):  # the descriptor arguments' types, spelled as Triton's launcher does
    c_n = kw["BLOCK_N"] // 2 if kw["EPILOGUE_SUBTILE"] else kw["BLOCK_N"]
    return {"a_desc": f"tensordesc<{dtype}[{kw['BLOCK_M']}, {kw['BLOCK_K']}]>",
            "b_desc": f"tensordesc<{dtype}[{kw['BLOCK_K']}, {kw['BLOCK_N']}]>",
            "c_desc": f"tensordesc<{dtype}[{kw['BLOCK_M']}, {c_n}]>"}

def configs(kernel, dtype, sm, which):
    if kernel == "gemv":
        kept = gv.CONFIGS
    elif kernel == "decode":
        fmt, _, rows = dtype.partition("/m")
        kept = dc.ROWS_CONFIGS if rows else dc.CONFIGS[fmt]
        if isinstance(which, int):
            return [kept[which]]
    elif kernel == "matmul_tma":
        if isinstance(which, int):
            return [tma.HOPPER_CONFIGS[which]]
        kept = tma.prune_configs(tma.HOPPER_CONFIGS, shared_memory[str(sm)])
    else:  # what the autotuner would try on this architecture, for this dtype
        listed = mm.HOPPER_CONFIGS if sm >= 90 else mm.AMPERE_CONFIGS
        if isinstance(which, int):
            return [listed[which]]
        mm._shared_memory_limit = lambda index: shared_memory[str(sm)]
        precision = "ieee" if dtype == "fp32" else "tf32"
        kept = mm._prune_configs(listed, {"a_ptr": torch.empty(0, dtype=TORCH[dtype])}, INPUT_PRECISION=precision)
    return kept if which == "every" else [kept[0 if which == "first" else which]]

def build(kernel, dtype, sm, config, stages):
    fn, pointers, divisible, constants = KERNELS["decode_rows" if kernel == "decode" and "/m" in dtype else kernel]
    constants = dict(constants, **config.kwargs)
    if kernel == "matmul":
        constants["INPUT_PRECISION"] = "ieee" if dtype == "fp32" else "tf32"
    signature = {arg: "i32" for arg in fn.arg_names}
    signature.update({arg: "*" + dtype for arg in pointers})
    if kernel == "decode":
        fmt, _, rows = dtype.partition("/m")
        constants.update(FORMAT=dc._FORMAT_CODE[fmt], **({"BLOCK_M": int(rows)} if rows else {}))
        scales, quants = DECODE_POINTERS[fmt]
        signature.update(x_ptr="*fp32", s_ptr=scales, q_ptr=quants, y_ptr="*fp32")
    if kernel == "matmul_tma":
        signature.update(descriptor_types(dtype, config.kwargs))
    signature.update({arg: "constexpr" for arg in constants})
    attrs = {(fn.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in pointers + divisible}
    stages = config.num_stages if stages is None else stages
    try:
        source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
        target = GPUTarget("cuda", sm, 32)
        options = make_backend(target).parse_options({"num_warps": config.num_warps, "num_stages": stages})
    except (TypeError, AttributeError) as error:
        print(json.dumps({"skip": f"this Triton's ahead-of-time compile API differs ({error})"}))
        sys.exit(0)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    kw = config.kwargs
    tile = "x".join(str(value) for key, value in kw.items() if key.startswith("BLOCK_"))  # MxNxK or NxK
    tile += " subtiled" if kw.get("EPILOGUE_SUBTILE") else ""
    tile += " unflattened" if kw.get("FLATTEN") is False else ""
    tile += f" STAGES={kw['STAGES']}" if "STAGES" in kw else ""  # decode_kernel's own pipeline depth
    return {"name": f"{kernel} {dtype} {tile} warps={config.num_warps} stages={stages}", "kernel": kernel,
            "dtype": dtype, "sm": sm, "config": kw, "warps": config.num_warps, "stages": stages,
            "shared": compiled.metadata.shared, "ptx": compiled.asm["ptx"], "ttgir": compiled.asm["ttgir"],
            "cubin": base64.b64encode(compiled.asm["cubin"]).decode()}

results = []
for kernel, dtype, sm, which, *stages in requests:
    for config in configs(kernel, dtype, sm, which):
        results.append(build(kernel, dtype, sm, config, stages[0] if stages else None))
print(json.dumps({"results": results}))
"""


@dataclass(frozen=True)
class Compiled:
    name: str  # "matmul bf16 128x256x64 warps=8 stages=3"
    kernel: str  # "matmul", "gemv", "matmul_tma" or "decode"
    dtype: str  # Triton's spelling: fp32, fp16, bf16 (decode: the weight format, "q4_0/m16")
    sm: int  # 90 or 80
    config: dict
    warps: int
    stages: int
    shared: int  # bytes of shared memory the compiled kernel uses
    ptx: str
    ttgir: str  # Triton's GPU dialect, layouts and all (where a layout conversion shows)
    cubin: bytes

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}"


def compile_kernels(*requests: tuple) -> list[Compiled]:
    """Compile the requested kernels (see the module docstring); raises ``Skip`` when this
    Triton cannot compile ahead of time."""
    return list(_compile(tuple(requests)))


class Skip(Exception):
    """This Triton has no (or a different) ahead-of-time compile API."""


@lru_cache(maxsize=None)
def _compile(requests: tuple) -> tuple[Compiled, ...]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the default either way; silences a notice
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(ROOT), json.dumps(requests), json.dumps(SHARED_MEMORY)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"compiling the Triton kernels ahead of time failed:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in report:
        raise Skip(report["skip"])
    return tuple(Compiled(**{**r, "cubin": base64.b64decode(r["cubin"])}) for r in report["results"])
