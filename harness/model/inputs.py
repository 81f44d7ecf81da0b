"""Shapes, dtypes and seeded inputs shared by every implementation.

Shape order, everywhere in this project: ``MxNxK``. C = A @ B is M x N; K is the inner
dimension that the sum runs over, so A is M x K and B is K x N. A single number ``N`` means
the square problem NxNxN.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

import numpy as np


@lru_cache(maxsize=1)
def bfloat16_dtype() -> np.dtype | None:
    """NumPy's bfloat16, from ml_dtypes (the JAX project's NumPy dtypes; NumPy has none), or
    None without it. Imported on first use: ml_dtypes takes most of a second to import, which
    every command and every worker process would otherwise pay."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency; this keeps imports working
        return None
    return np.dtype(ml_dtypes.bfloat16)


DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")


class Shape(NamedTuple):
    m: int
    n: int
    k: int

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations: 2*M*N*K."""
        return 2 * self.m * self.n * self.k


_SHAPE_PATTERN = re.compile(r"^\s*(\d+)\s*(?:[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*)?$")


def parse_shape(text) -> Shape:
    """``"256"`` -> 256x256x256; ``"512x512x1024"`` -> M=512, N=512, K=1024."""
    if isinstance(text, Shape):
        return text
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        text = str(int(text))
    if isinstance(text, (tuple, list)) and len(text) == 3:
        text = "x".join(str(v) for v in text)
    match = _SHAPE_PATTERN.match(str(text)) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"bad shape {text!r}: expected N (square) or MxNxK, e.g. 256 or 512x512x1024")
    if match.group(2) is None:
        size = int(match.group(1))
        return Shape(size, size, size)
    return Shape(int(match.group(1)), int(match.group(2)), int(match.group(3)))


def shape_argument(text: str) -> Shape:
    """``parse_shape`` for argparse: a bad shape is a usage error, not a traceback."""
    import argparse

    try:
        return parse_shape(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_NAMES_OF_DTYPES: dict = {}  # np.dtype -> name: dtype.name is computed in Python on every access


def dtype_name(dtype) -> str:
    """Canonical name of a dtype: float32, float64, float16 or bfloat16."""
    if isinstance(dtype, np.dtype):
        name = _NAMES_OF_DTYPES.get(dtype)
        if name is None:
            name = _NAMES_OF_DTYPES.setdefault(dtype, dtype.name)
        return name
    if isinstance(dtype, str) and dtype in ("bf16", "bfloat16"):
        return "bfloat16"
    aliases = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "half": "float16"}
    if isinstance(dtype, str) and dtype in aliases:
        return aliases[dtype]
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def numpy_dtype(name: str) -> np.dtype:
    name = dtype_name(name)
    if name == "bfloat16":
        bfloat16 = bfloat16_dtype()
        if bfloat16 is None:
            raise TypeError("bfloat16 arrays need the ml_dtypes package")
        return bfloat16
    if name not in DTYPE_NAMES:
        raise TypeError(f"unknown dtype {name!r}; choose from {', '.join(DTYPE_NAMES)}")
    return np.dtype(name)


def make_inputs(shape, dtype="float32", seed: int = 0):
    """Seeded A [M, K] and B [K, N], uniform in [-1, 1), rounded once to ``dtype``.

    The same (shape, dtype, seed) always gives the same arrays, so every implementation in a
    comparison multiplies exactly the same numbers.
    """
    shape = parse_shape(shape)
    rng = np.random.default_rng([seed, shape.m, shape.n, shape.k])
    target = numpy_dtype(dtype)
    a = rng.uniform(-1.0, 1.0, size=(shape.m, shape.k)).astype(target)
    b = rng.uniform(-1.0, 1.0, size=(shape.k, shape.n)).astype(target)
    return a, b
