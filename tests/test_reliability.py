"""Nothing passes that shouldn't, nothing is lost, nothing hangs: what users' mistakes and
machines' faults do. Each section is one class of fault, each test one way to meet it."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness
from harness.core import Implementation

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=timeout)


# ---- inputs no row can change --------------------------------------------------------------------
def writable_alias(x: np.ndarray) -> np.ndarray:
    """A writable array over ``x``'s memory, as C sees it: NumPy's read-only flag stops nothing there."""
    pointer = ctypes.cast(x.ctypes.data, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(pointer, shape=x.shape)


class _Writer:
    """A Prepared whose run() does what ``behaviour`` says to its inputs, and returns its product."""
    mode = "native"

    def __init__(self, a, b, behaviour):
        self.a, self.b, self.behaviour, self.calls, self.c = a, b, behaviour, 0, None

    def run(self):
        self.calls += 1
        self.c = self.behaviour(self)

    def result(self):
        return self.c


def zero_a_and_return_zeros(p):
    p.a[...] = 0  # a Python kernel that writes into A: NumPy refuses, the inputs are read-only
    return np.zeros((p.a.shape[0], p.b.shape[1]), np.float32)


def double_a_through_a_pointer(p):
    writable_alias(p.a)[...] *= 2  # what a C kernel could do: the product of the doubled A
    return np.matmul(p.a, p.b)


def zero_a_through_a_pointer_and_return_zeros(p):
    writable_alias(p.a)[...] = 0
    return np.zeros((p.a.shape[0], p.b.shape[1]), np.float32)


def double_a_on_the_second_call(p):
    product = np.matmul(p.a, p.b)
    if p.calls == 2:
        writable_alias(p.a)[...] *= 2
    return product


class _WriterBackend:
    def __init__(self, behaviour):
        self.behaviour = behaviour

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        return _Writer(a, b, self.behaviour)


def register_writer(monkeypatch, behaviour) -> str:
    name = "test.writer"
    impl = Implementation(name, "python", "cpu", ("float32",), "writes into its inputs", _WriterBackend(behaviour))
    monkeypatch.setitem(harness.REGISTRY, name, impl)
    return name


@pytest.mark.parametrize("behaviour, said", [
    (zero_a_and_return_zeros, "tried to write into its inputs"),
    (double_a_through_a_pointer, "wrote into its input A"),
    (zero_a_through_a_pointer_and_return_zeros, "wrote into its input A"),
    (double_a_on_the_second_call, "wrote into its input A (inputs are read-only; a matmul must not change them) "
                                       "while it was timed"),
])
def test_an_implementation_that_writes_into_its_inputs_fails_and_the_rows_after_it_do_not(monkeypatch, behaviour, said):
    name = register_writer(monkeypatch, behaviour)
    results = harness.compare(["16x8x12"], [name], ["float32"], min_time=0.001)
    writer, baseline = results.row(name, "16x8x12"), results.row("numpy.matmul", "16x8x12")
    assert writer.status.startswith("FAILED") and said in writer.status, writer.status
    assert writer.gflops is None  # never timed as a pass
    assert baseline.passed, baseline.status  # the next row multiplies the untouched inputs


def test_the_reference_is_computed_before_the_first_row_runs(monkeypatch):
    # A writer that returns the product of the inputs it doubled would pass against a reference
    # computed afterwards from those inputs; it must be checked against the untouched ones.
    name = register_writer(monkeypatch, double_a_through_a_pointer)
    compare_module = sys.modules["harness.compare"]  # (harness.compare is also the function)
    seen = []
    original = compare_module.reference_data
    monkeypatch.setattr(compare_module, "reference_data", lambda a, b: seen.append(a.copy()) or original(a, b))
    results = harness.compare(["8"], [name], ["float32"], baselines=False, min_time=0.001)
    assert not results.rows[0].passed
    (a_seen,) = seen
    np.testing.assert_array_equal(a_seen, harness.make_inputs("8", "float32")[0])


def test_an_experiment_reports_an_implementation_that_writes_into_its_inputs(monkeypatch):
    from harness.experiments import common

    name = register_writer(monkeypatch, double_a_through_a_pointer)
    a, b = common.inputs(harness.parse_shape("8"), "float32")
    entry = common.measure(name, a, b, min_time=0.001)
    assert "wrote into its input A" in entry["skipped"]
    fresh = common.inputs(harness.parse_shape("8"), "float32")[0]  # what it wrote into is forgotten
    np.testing.assert_array_equal(fresh, harness.make_inputs("8", "float32")[0])


# ---- one parser for switches ---------------------------------------------------------------------
SPELLINGS = [("1", True), ("true", True), ("True", True), ("YES", True), ("on", True), (" On ", True),
             ("0", False), ("false", False), ("False", False), ("no", False), ("NO", False), ("off", False),
             ("Off", False)]


@pytest.mark.parametrize("value, meaning", SPELLINGS)
def test_every_boolean_spelling_means_what_it_says(monkeypatch, value, meaning):
    from harness.backends.cuda import emulation
    from harness.core import slow_allowed
    from harness.switches import switch

    for name in ("MATMUL_ALLOW_SLOW", "MATMUL_CUDA_EMULATE", "MATMUL_REQUIRE_GPU"):
        monkeypatch.setenv(name, value)
        assert switch(name) is meaning
    assert slow_allowed(None) is meaning
    assert emulation.emulation_requested() is meaning


def test_allow_slow_false_refuses_what_it_would_allow(monkeypatch):
    from harness.core import check_problem

    monkeypatch.setenv("MATMUL_ALLOW_SLOW", "False")
    with pytest.raises(harness.MatmulInputError, match="too long"):
        check_problem(harness.lookup("python.ijk"), harness.parse_shape(1024), "float32")
    monkeypatch.setenv("MATMUL_ALLOW_SLOW", "yes")
    check_problem(harness.lookup("python.ijk"), harness.parse_shape(1024), "float32")


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_switch_is_its_default(monkeypatch, value):
    from harness.switches import switch

    monkeypatch.setenv("MATMUL_ALLOW_SLOW", value)
    assert switch("MATMUL_ALLOW_SLOW") is False and switch("MATMUL_ALLOW_SLOW", default=True) is True


@pytest.mark.parametrize("value", ["maybe", "2", "y", "enabled", "nope"])
def test_a_switch_that_is_neither_yes_nor_no_is_a_clear_error(monkeypatch, value):
    from harness.switches import SwitchError, switch

    monkeypatch.setenv("MATMUL_CUDA_EMULATE", value)
    with pytest.raises(SwitchError, match=f"MATMUL_CUDA_EMULATE='{value}' is neither yes nor no") as caught:
        switch("MATMUL_CUDA_EMULATE")
    assert "1/true/yes/on" in str(caught.value) and "0/false/no/off" in str(caught.value)


def test_the_command_line_refuses_an_unreadable_switch_before_it_starts():
    done = run_cli("compare", "--shapes", "8", "--impls", "numpy.matmul", env={"MATMUL_ALLOW_SLOW": "maybe"})
    assert done.returncode == 2 and "MATMUL_ALLOW_SLOW='maybe' is neither yes nor no" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "matmul" not in done.stdout  # nothing ran
