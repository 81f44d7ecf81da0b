"""Registration, the one way in: every backend registers its own implementations, and a user's
implementation joins the same registry, the same checks and the same tables. And the peers
(BLIS, torch's CPU matmul) are rows of every CPU comparison where they are installed."""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness.backends import peers
from harness.model import registry


class _FunctionBackend(harness.Backend):
    def __init__(self, function):
        self.function = function

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        function = self.function

        class Prepared(harness.Prepared):
            def run(self):
                self.c = function(a, b)

            def result(self):
                return self.c

        return Prepared()


def _implementation(name, function, **fields):
    return harness.Implementation(
        name=name,
        language="python",
        device="cpu",
        dtypes=("float32",),
        summary="a test's own",
        backend=_FunctionBackend(function),
        **fields,
    )


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    import sys

    monkeypatch.setattr(sys.modules["harness.run.compare"], "REGISTRY", registry.REGISTRY)
    return registry.REGISTRY


def test_a_registered_implementation_is_checked_and_timed_beside_the_others(clean_registry):
    harness.register(_implementation("mine.numpy", lambda a, b: a @ b))
    harness.register(_implementation("mine.wrong", lambda a, b: np.zeros((a.shape[0], b.shape[1]), a.dtype)))
    assert [i.name for i in harness.implementations("mine.*")] == ["mine.numpy", "mine.wrong"]
    results = harness.compare([24], ["mine.*"], "float32", min_time=0.001)
    assert results.row("mine.numpy", 24).passed and results.row("mine.numpy", 24).gflops
    wrong = results.row("mine.wrong", 24)
    assert wrong.status.startswith("FAILED") and wrong.gflops is None  # checked before it is timed
    assert results.row("numpy.matmul", 24).passed  # the baseline joins, as for ours


def test_registration_refuses_what_it_cannot_take(clean_registry):
    harness.register(_implementation("mine.one", lambda a, b: a @ b))
    with pytest.raises(ValueError, match="already registered"):
        harness.register(_implementation("mine.one", lambda a, b: a @ b))
    replacement = harness.register(_implementation("mine.one", lambda a, b: (b.T @ a.T).T), replace=True)
    assert harness.lookup("mine.one") is replacement
    with pytest.raises(ValueError, match="<language>.<technique>"):
        harness.register(_implementation("nodot", lambda a, b: a @ b))
    with pytest.raises(TypeError, match="takes an Implementation"):
        harness.register("c.blocked")
    with pytest.raises(TypeError):  # fields are keyword-only: nothing is read in the wrong place
        harness.Implementation("mine.two", "python", "cpu", ("float32",), "positional", _FunctionBackend(None))


def test_every_backend_registers_in_reading_order():
    names = list(registry.REGISTRY)
    languages = [name.split(".")[0] for name in names]
    assert languages.index("python") < languages.index("c") < languages.index("numpy") < languages.index("cuda")
    assert names.index("numpy.matmul") < names.index("blis.gemm") < names.index("torch.cpu") < names.index("cuda.naive")


@pytest.mark.parametrize("name", ["blis.gemm", "torch.cpu"])
def test_the_peers_are_right_and_say_what_ran(name):
    impl = harness.lookup(name)
    if impl.unavailable_reason():
        pytest.skip(impl.unavailable_reason())
    assert impl.peer and impl.threaded
    for shape in ("1x7x5", "33x17x65", "64x1x9", "3x0x4"):
        for dtype in impl.dtypes:
            a, b = harness.make_inputs(shape, dtype)
            result = harness.get(name, threads=1)(a, b)
            assert harness.check(result, a, b).passed, (name, shape, dtype)
    from harness.model.registry import describe

    description = describe(impl)
    assert description and ("kernels" in description if name == "blis.gemm" else "PyTorch" in description)


def test_a_system_blis_without_kernels_for_this_cpu_says_it_runs_reference_code(monkeypatch):
    # Debian's BLIS 0.9 on a Zen 5 picks its generic kernels: the row must not pass for a tuned BLIS.
    monkeypatch.setattr(peers, "system_blis", lambda: (object(), "libblis.so.4"))
    monkeypatch.setattr(peers, "_describe_library", lambda library: "BLIS 0.9.0, generic kernels")
    peers.blis_description.cache_clear()
    try:
        description = peers.blis_description()
    finally:
        peers.blis_description.cache_clear()
    assert description.startswith("system BLIS 0.9.0, generic kernels (libblis.so.4)")
    assert "reference C" in description and "no kernel set for this CPU" in description


def test_blis_names_its_library_and_kernel_set():
    description = peers.blis_description()
    if description is None:
        pytest.skip("no BLIS here (system or the blis package)")
    library, _ = peers.system_blis()
    assert ("system BLIS" in description) == (library is not None)
    assert "kernels" in description
    if "generic kernels" in description:
        assert "reference C" in description  # the fallback that no user would pick says so
