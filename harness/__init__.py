"""One harness for every matmul in this repository.

    import harness
    harness.implementations("c.*")          # the registry, in reading order
    harness.lookup("c.blocked")             # one implementation's metadata (an Implementation)
    mm = harness.get("c.blocked")           # callable on two NumPy arrays (a Matmul)
    c = mm(a, b)
    results = harness.compare([256, "512x512x1024"], ["c.*", "numpy"], ["float32"])
    print(results); results.to_json("out.json"); results.plot("out.png")

Shapes are ``N`` (square) or ``MxNxK``: C = A @ B is M x N and K is the inner dimension.
"""

import harness.backends  # noqa: F401 - registers every implementation, in reading order
from harness.backends.external import add_external
from harness.env import sources
from harness.model import quant as quant  # decode weight formats: harness.quant.quantize(w, "q4_0")
from harness.model.checking import check, reference
from harness.model.core import (
    Backend,
    BrokenError,
    Implementation,
    Matmul,
    MatmulInputError,
    Prepared,
    UnavailableError,
)
from harness.model.inputs import Shape, make_inputs, parse_shape
from harness.model.registry import implementations, lookup, register
from harness.run.compare import Results, Row, compare

sources.warn_if_shadowed()


def get(name: str, **options) -> Matmul:
    """The implementation called ``name``, as a callable ``(a, b) -> numpy array``."""
    return Matmul(lookup(name), **options)


__all__ = [
    "Backend",
    "BrokenError",
    "add_external",
    "Implementation",
    "MatmulInputError",
    "Prepared",
    "Results",
    "Row",
    "Shape",
    "UnavailableError",
    "check",
    "compare",
    "get",
    "implementations",
    "lookup",
    "make_inputs",
    "parse_shape",
    "reference",
    "register",
]
