"""Mutation testing kept in the repository (scripts/mutants.py): the list still applies to the
sources, and a small, fast subset of realistic kernel bugs is caught by the CPU tests."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from harness.backends.cuda import emulation

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "mutants.py"


def _mutants_module():
    spec = importlib.util.spec_from_file_location("_matmul_mutants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


mutants = _mutants_module()


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=[m.name for m in mutants.MUTANTS])
def test_every_mutant_still_applies_and_names_existing_tests(mutant):
    assert mutants.stale(mutant, ROOT) is None, f"{mutants.stale(mutant, ROOT)}: update scripts/mutants.py"
    assert mutant.new != mutant.old and mutant.kind in mutants.CLASSES
    for argument in mutant.tests:
        if argument.startswith("tests/"):
            path = argument.split("::")[0]
            assert (ROOT / path).is_file(), f"{mutant.name} names {path}, which does not exist"
    if mutant.kind == "performance":
        assert mutant.why, "a performance mutant says what it costs"


def test_names_are_unique_and_the_fast_subset_covers_several_classes():
    names = [m.name for m in mutants.MUTANTS]
    assert len(names) == len(set(names))
    fast = [m for m in mutants.MUTANTS if m.fast]
    assert 3 <= len(fast) <= 6 and len({m.kind for m in fast}) >= 2


@pytest.mark.slow
@pytest.mark.skipif(
    emulation.emulation_unavailable_reason() is not None, reason=str(emulation.emulation_unavailable_reason())
)
def test_the_fast_subset_is_caught():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--fast"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for mutant in mutants.MUTANTS:
        if mutant.fast:
            assert f"{mutant.name}: caught by tests/" in done.stdout, done.stdout[-4000:]
