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

from . import quant as quant  # decode weight formats: harness.quant.quantize(w, "q4_0")
from . import sources  # noqa: I001 - (only for the check below)
from .checking import check, reference
from .compare import Results, Row, compare
from .core import Backend, BrokenError, Implementation, Matmul, MatmulInputError, Prepared, UnavailableError
from .external import add_external
from .inputs import Shape, make_inputs, parse_shape
from .registry import implementations, lookup, register

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
