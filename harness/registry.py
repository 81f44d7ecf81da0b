"""The registry: every implementation, in reading order (simplest first)."""
from __future__ import annotations

import fnmatch

from .backends import c, cuda, numpy_blas, python_loops, torch_gpu, triton_kernels
from .core import Implementation

REGISTRY: dict[str, Implementation] = {
    impl.name: impl
    for impl in [
        *python_loops.IMPLEMENTATIONS,
        *c.IMPLEMENTATIONS,
        *numpy_blas.IMPLEMENTATIONS,
        *cuda.IMPLEMENTATIONS,
        *torch_gpu.IMPLEMENTATIONS,
        *triton_kernels.IMPLEMENTATIONS,
    ]
}


def implementations(*patterns: str) -> list[Implementation]:
    """Implementations whose names match any of the glob ``patterns`` (all if none), in
    registry order. A pattern that matches nothing is an error, so a typo is not silent."""
    patterns = [p for p in patterns if p is not None]
    if not patterns:
        return list(REGISTRY.values())
    chosen = set()
    for pattern in patterns:
        matched = {name for name in REGISTRY if fnmatch.fnmatchcase(name, pattern) or name.split(".")[0] == pattern}
        if not matched:
            raise KeyError(f"no implementation matches {pattern!r}; known: {', '.join(REGISTRY)}")
        chosen |= matched
    return [impl for name, impl in REGISTRY.items() if name in chosen]


def lookup(name: str) -> Implementation:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(REGISTRY)}") from None
