"""Launch geometry: one description of every kernel launch, for every way of running it.

``plan()`` turns a technique and a shape into a ``Launch``: the kernel's name, grid, block and
argument list (buffers named "A", "B", "C", then the sizes). The GPU loaders (PyCUDA, CuPy)
and the CPU emulation all launch exactly that, so the emulator runs the kernels the GPU runs,
with the geometry the GPU gets. The geometry is written once, next to the kernel: each .cu
file declares its launches (``@launch``, below) over its own tile constants.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from harness.backends.cuda import toolkit
from harness.env import sources


@dataclass(frozen=True)
class TensorMapArg:
    """A kernel argument that is a CUtensorMap (128 bytes, by value) of buffer ``buffer``: a
    [rows, cols] row-major matrix of 16-bit elements, read in boxes of box_rows x box_cols with
    the 128-byte swizzle. The row pitch is the buffer's (see ``pitched``)."""

    buffer: str
    rows: int
    cols: int
    box_rows: int
    box_cols: int


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple  # "A", "B", "C" name a buffer; ints are passed as C ints; TensorMapArg
    signature: str  # one letter per argument: P pointer, i int, T tensor map
    shared_bytes: int = 0  # dynamic shared memory (a launch over 48 KiB opts in to it)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_SUFFIX = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}

# The persistent kernel's grid in the emulation, where no GPU says how many SMs there are: small,
# so that a block walks several tiles (and its barriers' phases carry on across tiles).
EMULATED_SMS = 3


# ---- the launch declarations of cuda/*.cu -----------------------------------------------------
#
# Each kernel's launch is declared once, in its .cu file's header comment, in terms of that
# file's own #defines, so the tile constants the kernel is compiled with are the ones its grid
# is computed from:
#
#     // @launch tiled grid (cdiv(N, TILE), cdiv(M, TILE)) block (TILE, TILE) args (A, B, C, M, N, K)
#     //         static_shared 2 * TILE * TILE * 4
#
# ``@launch <technique>`` then, on that line or on comment lines that start with one of them:
# ``grid``, ``block`` (a tuple or one number; missing dimensions are 1), ``args`` (A, B, C name
# buffers; anything else is an int, or ``tensor_map(buffer, rows, cols, box_rows, box_cols)``),
# optionally ``shared`` (dynamic shared memory, bytes) and ``static_shared`` (what ptxas must
# report for each of its kernels, checked by tests/test_cuda_compile.py). The kernels are
# ``<technique>_<f32|bf16|f16>``. Expressions are integer arithmetic (+ - * /, where / divides
# down as C's does) over M, N, K, SMS (the GPU's multiprocessors), the file's #defines and
# cdiv, min, max. A family of kernels made from one X-macro list (``#define TABLE(X) X(a, 1)
# X(b, 4) ...``, as decode.cu's formats x rows) is declared once, ``@launch name_{0}_m{1} for
# each TABLE grid (... ROWS_{0} ...)``: once per entry, with {0}, {1} its arguments.

FIELDS = ("grid", "block", "args", "shared", "static_shared")
BUFFERS = ("A", "B", "C")


class LaunchDeclarationError(ValueError):
    """A ``@launch`` line that cannot be read, or a technique declared twice."""


@dataclass(frozen=True)
class LaunchSpec:
    technique: str
    source: str  # cuda/<file>.cu
    fields: dict  # field name -> expression text
    defines: dict  # the file's #define name -> expression text

    def evaluate(self, field: str, names: dict):
        return _evaluate(self.fields[field], names, self.defines, f"{self.source}: @launch {self.technique} {field}")


def _dims(value) -> tuple[int, int, int]:
    values = tuple(value) if isinstance(value, tuple) else (value,)
    if not 1 <= len(values) <= 3 or not all(isinstance(v, int) for v in values):
        raise LaunchDeclarationError(f"a grid or block is 1 to 3 integers, got {value!r}")
    return (*values, *(1,) * (3 - len(values)))


_FUNCTIONS = {
    "cdiv": lambda a, b: cdiv(a, b),
    "min": min,
    "max": max,
    "tensor_map": lambda buffer, rows, cols, box_rows, box_cols: TensorMapArg(buffer, rows, cols, box_rows, box_cols),
}


def _evaluate(text: str, names: dict, defines: dict, where: str, depth: int = 0):
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Tuple):
            return tuple(value(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Name):
            if node.id in names:
                return names[node.id]
            if node.id in BUFFERS:
                return node.id
            if node.id in defines and depth < 20:
                return _evaluate(defines[node.id], names, defines, where, depth + 1)
            raise LaunchDeclarationError(f"{where}: {node.id} is not M, N, K, SMS, A, B, C or a #define of the file")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
        ):
            return _FUNCTIONS[node.func.id](*(value(a) for a in node.args))
        raise LaunchDeclarationError(
            f"{where}: cannot evaluate {ast.unparse(node)!r} (integer arithmetic, cdiv, min, max, tensor_map)"
        )

    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise LaunchDeclarationError(f"{where}: {text.strip()!r} is not an expression") from None
    return value(tree.body)


# C's integer arithmetic (both / and // divide toward zero, as C's / does on ints).
def _c_divide(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: _c_divide,
    ast.FloorDiv: _c_divide,
}


def _defines(text: str) -> dict:
    found = {}
    for name, body in re.findall(r"^\s*#define\s+(\w+)[ \t]+([^\n]*)", text, flags=re.M):
        found.setdefault(name, re.sub(r"//.*|/\*.*?\*/", "", body).strip())
    return found


def launch_declarations(relative: str, text: str) -> list[LaunchSpec]:
    """The ``@launch`` declarations of one .cu file's text."""
    lines = [line.strip()[2:].strip() for line in text.splitlines() if line.strip().startswith("//")]
    defines = _defines(text)
    found, current = [], None
    for line in lines:
        head = line.split(None, 1)[0] if line else ""
        if head == "@launch":
            current = [line[len("@launch") :].strip()]
            found.append(current)
        elif current is not None and head in FIELDS:
            current.append(line)
        else:
            current = None
    specs = []
    declarations = [each for parts in found for each in _for_each(relative, " ".join(parts), text)]
    for declaration in declarations:
        technique, _, rest = declaration.partition(" ")
        pieces = re.split(rf"(?:^|\s+)({'|'.join(FIELDS)})\s+", " " + rest)
        fields = dict(zip(pieces[1::2], pieces[2::2]))
        if not re.fullmatch(r"\w+", technique) or pieces[0].strip() or not {"grid", "block", "args"} <= set(fields):
            raise LaunchDeclarationError(
                f"{relative}: `@launch {technique} ...` needs the technique's name, then "
                "grid, block and args (and optionally shared, static_shared)"
            )
        specs.append(LaunchSpec(technique, relative, fields, defines))
    return specs


def kernel_tables(text: str) -> dict[str, list[tuple[str, ...]]]:
    """The X-macro lists of a .cu file: ``#define NAME(X) X(a, 1) X(b, 4) ...`` gives
    {NAME: [("a", "1"), ("b", "4"), ...]}, one entry per kernel the file makes from it."""
    joined = text.replace("\\\n", " ")  # a #define continued over several lines is one line
    tables = {}
    for name, body in re.findall(r"^\s*#define\s+(\w+)\(X\)\s+([^\n]*)", joined, flags=re.M):
        tables[name] = [tuple(arg.strip() for arg in args.split(",")) for args in re.findall(r"\bX\(([^)]*)\)", body)]
    return tables


def _for_each(relative: str, declaration: str, text: str) -> list[str]:
    """``NAME_{0}_{1} for each TABLE rest``: the declaration once per entry of the file's X-macro
    list TABLE, its {0}, {1}, ... the entry's arguments (decode.cu's formats x rows); any other
    declaration as it is."""
    found = re.match(r"(\S+)\s+for\s+each\s+(\w+)\s+(.*)", declaration, flags=re.S)
    if not found:
        return [declaration]
    pattern, table, rest = found.groups()
    entries = kernel_tables(text).get(table)
    if not entries:
        raise LaunchDeclarationError(f"{relative}: `@launch {pattern} for each {table}`: no `#define {table}(X) ...`")
    return [f"{pattern} {rest}".format(*entry) for entry in entries]


@lru_cache(maxsize=64)
def _declarations_of(relative: str, text: str) -> tuple[LaunchSpec, ...]:
    return tuple(launch_declarations(relative, text))


def launch_specs() -> dict[str, LaunchSpec]:
    """Every technique's launch declaration, from the .cu files of cuda/ (read on every call:
    an edited file takes effect)."""
    specs: dict[str, LaunchSpec] = {}
    for relative in toolkit.cuda_sources():
        for spec in _declarations_of(relative, sources.source_path(relative).read_text()):
            if spec.technique in specs:
                raise LaunchDeclarationError(
                    f"@launch {spec.technique} is declared in both {specs[spec.technique].source} and {relative}"
                )
            specs[spec.technique] = spec
    return specs


def plan(technique: str, dtype: str, m: int, n: int, k: int, sms: int | None = None) -> Launch:
    """The launch of ``technique`` for C [m, n] = A [m, k] @ B [k, n] (a GEMV: y [n] = W [n, k] x [k]),
    as its ``.cu`` file declares it (``@launch``). ``sms``: the GPU's multiprocessor count, which
    sizes a persistent grid (``EMULATED_SMS`` when None).
    """
    spec = launch_specs().get(technique)
    if spec is None:
        raise ValueError(f"unknown CUDA technique {technique!r}: no cuda/*.cu declares `@launch {technique}`")
    names = {"M": m, "N": n, "K": k, "SMS": sms or EMULATED_SMS}
    args = spec.evaluate("args", names)
    args = args if isinstance(args, tuple) else (args,)
    signature = "".join("T" if isinstance(a, TensorMapArg) else "P" if a in BUFFERS else "i" for a in args)
    shared = spec.evaluate("shared", names) if "shared" in spec.fields else 0
    return Launch(
        f"{technique}_{_SUFFIX[dtype]}",
        _dims(spec.evaluate("grid", names)),
        _dims(spec.evaluate("block", names)),
        args,
        signature,
        shared,
    )


def static_shared_bytes(technique: str) -> int | None:
    """The static shared memory a technique's .cu says each of its kernels uses, if it says."""
    spec = launch_specs()[technique]
    return spec.evaluate("static_shared", {}) if "static_shared" in spec.fields else None


def pitched(array: np.ndarray) -> np.ndarray:
    """``array`` itself when its rows are a multiple of 16 bytes long (what TMA requires of a
    tensor's row pitch), else a zero-padded copy whose rows are. The tensor map keeps the true
    column count, so the padding is never read."""
    row_bytes = array.shape[1] * array.itemsize
    if row_bytes % 16 == 0:
        return array
    padded = np.zeros((array.shape[0], cdiv(row_bytes, 16) * 16 // array.itemsize), dtype=array.dtype)
    padded[:, : array.shape[1]] = array
    return padded


def kernel_buffers(operation: str, a: np.ndarray, b: np.ndarray, technique: str = ""):
    """The kernel's input buffers and the shape of its output, from the harness's A and B.

    A GEMV kernel wants W [N, K] row-major and x [K]; the harness gives x as A [1, K] and W as
    B = W^T [K, N], so W is made contiguous here, in prepare (not timed).
    """
    if operation == "gemv":
        return {"A": np.ascontiguousarray(b.T), "B": np.ascontiguousarray(a.reshape(-1))}, (b.shape[1],)
    inputs = {"A": a, "B": b}
    if technique:  # an operand read through a tensor map (TMA): row pitches in multiples of 16 bytes
        spec = launch_specs().get(technique)
        args = (
            spec.evaluate("args", {"M": a.shape[0], "N": b.shape[1], "K": a.shape[1], "SMS": EMULATED_SMS})
            if spec
            else ()
        )
        for arg in args if isinstance(args, tuple) else (args,):
            if isinstance(arg, TensorMapArg) and arg.buffer in inputs:
                inputs[arg.buffer] = pitched(inputs[arg.buffer])
    return inputs, (a.shape[0], b.shape[1])


# ---- decode (cuda/decode.cu): the weights as the GPU kernel reads them --------------------------

# The rows of X each decode kernel holds accumulators for (its @launch techniques end in _m<tile>).
DECODE_M_TILES = (1, 4, 16)


def decode_technique(fmt: str, m: int) -> str:
    """The cuda/decode.cu technique for ``fmt`` weights and M rows of X: the smallest tile of rows
    that holds M (registers sized for 16 rows cost a GEMV occupancy), else 16 rows per pass."""
    tile = next((t for t in DECODE_M_TILES if m <= t), DECODE_M_TILES[-1])
    return f"decode_{fmt}_m{tile}"


def decode_weight_bytes(weights) -> np.ndarray:
    """``weights`` (quant.QuantizedWeights) repacked as cuda/decode.cu reads them: the same
    bytes, in another order (see the file's header). q4_0 / q8_0: every block's fp16 scale,
    [N, K/32], then from the next multiple of 16 bytes every block's quants, [N, K/32, 16 or
    32]; bf16: ggml's own [N, K] uint16, rows padded with zero weights to a multiple of 32;
    q4_K: ggml's own bytes, unchanged (a 144-byte super-block is 9 aligned 16-byte loads)."""
    fmt, n, k = weights.format, weights.n, weights.k
    if fmt == "q4_K":
        return weights.data
    if fmt == "bf16":
        padded = cdiv(k, 32) * 32
        rows = np.zeros((n, padded), np.uint16)
        rows[:, :k] = weights.data.view("<u2").reshape(n, k)
        return rows.view(np.uint8).reshape(-1)
    per_block = weights.fmt.bytes_per_block
    blocks = weights.data.reshape(n, k // 32, per_block)
    scales = blocks[..., :2].reshape(-1)
    quants_at = cdiv(scales.size, 16) * 16
    out = np.zeros(quants_at + n * (k // 32) * (per_block - 2), np.uint8)
    out[: scales.size] = scales
    out[quants_at:] = blocks[..., 2:].reshape(-1)
    return out


def decode_buffers(x: np.ndarray, weights) -> tuple[dict, tuple[int, int], int]:
    """The buffers of a decode launch (A = the repacked weights, B = X [M, K'] float32), the
    output's shape [M, N], and K' (K, or for bf16 K padded to a multiple of 32 with zero columns
    of X to match the zero weights)."""
    k = weights.k
    padded = cdiv(k, 32) * 32
    if padded != k:
        wide = np.zeros((x.shape[0], padded), np.float32)
        wide[:, :k] = x
        x = wide
    buffers = {"A": decode_weight_bytes(weights), "B": np.ascontiguousarray(x, np.float32)}
    return buffers, (x.shape[0], weights.n), padded
