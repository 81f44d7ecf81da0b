"""ARCHITECTURE.md kept true: the files it names exist, the layer and cycle contracts hold (and
fail on a deliberate back-edge), the backend contract is the one declared in core.py, the
public API is what the docs use, and a shadowed clone on PYTHONPATH is said, not ignored."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "ARCHITECTURE.md"
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", GUIDE, *ROOT.glob("*/README.md")]

pytest.importorskip("importlinter", reason="import-linter checks the layers (pip install -e '.[lint]')")

# import-linter, run on the harness found first on sys.path (the editable install's finder
# taken off, so that a scratch copy's harness is the one analysed).
LINT = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith('_editable_')]\n"
    "sys.path.insert(0, '.')\n"
    "from importlinter.cli import lint_imports\n"
    "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))\n"
)


def test_every_path_the_architecture_names_exists():
    text = GUIDE.read_text()
    paths = set(re.findall(r"`((?:harness|tests|scripts|python|c|cuda|triton|results)/[\w/.]*)`", text))
    paths |= {f"harness/{m}" for m in re.findall(r"`harness/([\w/]+\.py)`", text)}
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"
    # every module of the package is in the code map, by its file or its folder
    for module in (ROOT / "harness").rglob("*.py"):
        relative = module.relative_to(ROOT)
        if module.name == "__init__.py" or "_sources" in relative.parts:
            continue
        named = module.stem in text or f"{relative.parent.as_posix()}/" in text
        assert named, f"ARCHITECTURE.md's code map does not place {relative}"


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", LINT], cwd=root, capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )


def test_the_layer_and_cycle_contracts_hold():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "module, back_edge, broken",
    [
        ("harness/model/inputs.py", "import harness.run.compare", "the harness's layers import downwards only"),
        ("harness/env/files.py", "import harness.model.core", "the harness's layers import downwards only"),
        ("harness/run/render.py", "import harness.run.results", "no import cycles between the modules"),
    ],
)
def test_a_deliberate_back_edge_breaks_a_contract(tmp_path, module, back_edge, broken):
    copy = tmp_path / "repository"
    shutil.copytree(
        ROOT / "harness", copy / "harness", ignore=shutil.ignore_patterns("__pycache__", "_lib", "_sources")
    )
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    with open(copy / module, "a") as handle:
        handle.write(f"\n{back_edge}  # noqa\n")
    done = _lint(copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{broken}" in done.stdout and "BROKEN" in done.stdout, done.stdout


class _OnlyTheRequiredHooks(harness.Backend):
    """A backend that defines the two required hooks and nothing else: every other hook the
    harness calls must have its default (core.Backend), never an AttributeError."""

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        class Product(harness.Prepared):
            def run(self):
                self.c = a @ b

            def result(self):
                return self.c

        return Product()


def test_a_backend_with_only_the_required_hooks_runs_everywhere(monkeypatch):
    from harness.model import registry

    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    impl = harness.Implementation(
        name="test.minimal", language="python", device="cpu", dtypes=("float32",), summary="a @ b",
        backend=_OnlyTheRequiredHooks(),
    )  # fmt: skip
    harness.register(impl)
    a, b = harness.make_inputs(12, "float32")
    assert harness.check(harness.get("test.minimal")(a, b), a, b).passed
    results = harness.compare([12], ["test.minimal"], baselines=False, min_time=0.01)
    (row,) = results.rows
    assert row.passed and row.median_s > 0 and row.peak_pct is not None  # CPU: % of the measured roof
    assert harness.implementations("test.minimal")[0].backend.describe(impl) is None


def test_a_backend_that_is_not_a_harness_backend_is_refused_by_name():
    class DuckTyped:
        def unavailable_reason(self, impl):
            return None

        def prepare(self, impl, a, b, options):
            return None

    with pytest.raises(TypeError, match="backend must be a harness.Backend"):
        harness.Implementation(name="test.duck", language="python", device="cpu", dtypes=("float32",),
                               summary="", backend=DuckTyped())  # fmt: skip

    class Half(harness.Backend):
        def unavailable_reason(self, impl):
            return None

    with pytest.raises(TypeError, match="prepare"):
        Half()  # the abstract hook it lacks is named


def test_a_prepare_that_returns_no_prepared_is_a_clear_error(monkeypatch):
    from harness.model import registry

    class Loose(_OnlyTheRequiredHooks):
        def prepare(self, impl, a, b, options):
            return object()

    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    harness.register(
        harness.Implementation(
            name="test.loose", language="python", device="cpu", dtypes=("float32",), summary="", backend=Loose()
        )  # fmt: skip
    )
    with pytest.raises(TypeError, match="must return a harness.Prepared"):
        harness.get("test.loose")(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))


def test_the_public_api_is_what_the_docs_use():
    """Every harness.<name> the docs call is public (in __all__, or the quant module), and the
    mutable registry and internals are not."""
    used = set()
    for doc in DOCS:
        used |= set(re.findall(r"\bharness\.([A-Za-z_]\w*)\b(?!/)", doc.read_text()))
    used -= {"py"}  # harness.py-style file names in prose
    public = set(harness.__all__) | {"quant", "__all__"}
    assert used <= public, f"the docs use harness.{sorted(used - public)}, which is not public"
    assert {"REGISTRY", "tolerance", "Matmul"}.isdisjoint(harness.__all__)
    assert all(hasattr(harness, name) for name in harness.__all__)


def test_a_clone_on_pythonpath_shadowed_by_the_installed_harness_is_said(tmp_path):
    other = tmp_path / "other-clone"
    (other / "harness").mkdir(parents=True)
    (other / "harness" / "__init__.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-c", "import harness"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(other)},
        timeout=120,
    )
    if str(other) in sys.path or Path(harness.__file__).resolve().parent == (other / "harness").resolve():
        pytest.skip("no installed harness here to shadow the clone")
    assert done.returncode == 0
    said = " ".join(done.stderr.split())
    assert f"PYTHONPATH names {other / 'harness'}" in said and "pip install -e" in said, done.stderr
    quiet = subprocess.run(
        [sys.executable, "-c", "import harness"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert "PYTHONPATH" not in quiet.stderr
