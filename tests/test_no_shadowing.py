"""Our triton/ and cuda/ folders must never shadow the real Triton and cuda-python.

A folder with an ``__init__.py`` in the working directory wins over an installed package of
the same name, so ``python`` started in the repository root would import our folder as
"triton" and every kernel would fail in a baffling way. The folders are therefore plain
folders of source files, and the harness loads them by path. These tests run ``import``
in a fresh interpreter from the repository root, and again from an unrelated folder with
the repository off sys.path (what is installed), and check that both find the same package.

A folder without ``__init__.py`` can still become a *namespace* package when nothing else
of that name is installed (``import cuda`` from the root then gives an empty module); and
when the installed package is itself a namespace package (recent cuda-python's ``cuda``),
our folder joins its ``__path__``. Neither shadows anything as long as our folder holds no
module with the name of one of theirs, which is what the cuda test checks.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import importlib, json, os, sys
name, hide = sys.argv[1], sys.argv[2:]
# An editable install may put the repository root on sys.path (a .pth file): hide it to see
# what is installed, independent of this checkout.
sys.path = [p for p in sys.path if os.path.realpath(p or os.getcwd()) not in hide]
try:
    module = importlib.import_module(name)
except ImportError as error:
    print(json.dumps({"error": str(error)}))
else:
    print(json.dumps({
        "file": getattr(module, "__file__", None),
        "path": [str(p) for p in getattr(module, "__path__", [])],
        "jit": hasattr(module, "jit"),
    }))
"""


def probe(name: str, cwd: Path, hide_root: bool = False) -> dict:
    """Import ``name`` in a fresh interpreter started in ``cwd``; with ``hide_root``, with the
    repository root taken off sys.path, i.e. what is installed."""
    hide = [os.path.realpath(ROOT)] if hide_root else []
    done = subprocess.run(
        [sys.executable, "-c", PROBE, name, *hide], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def inside(path, folder: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(folder.resolve())


@pytest.mark.parametrize("folder", ["triton", "cuda"])
def test_folders_are_not_packages(folder):
    assert (ROOT / folder).is_dir()
    assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/__init__.py would shadow the installed {folder}"


def test_import_triton_from_repository_root_gets_installed_triton(tmp_path):
    elsewhere = probe("triton", tmp_path, hide_root=True)
    if "error" in elsewhere:
        pytest.skip(f"Triton is not installed here ({elsewhere['error']})")
    at_root = probe("triton", ROOT)
    assert at_root.get("file") == elsewhere["file"], at_root
    assert not inside(at_root["file"], ROOT / "triton")
    assert at_root["jit"], "the module found has no triton.jit: not the real Triton"


def test_import_cuda_from_repository_root_is_not_shadowed(tmp_path):
    elsewhere = probe("cuda", tmp_path, hide_root=True)
    at_root = probe("cuda", ROOT)
    ours = ROOT / "cuda"
    if "error" in elsewhere:
        # Nothing to shadow: at most our folder becomes an empty namespace package.
        assert "error" in at_root or all(inside(p, ours) for p in at_root["path"]), at_root
        assert not list(ours.glob("*.py")), "a .py file in cuda/ would be importable as cuda.<name>"
        pytest.skip(
            f"cuda-python is not installed here ({elsewhere['error']}); checked only that cuda/ holds no modules"
        )
    if elsewhere["file"]:  # a regular package: it must win outright
        assert at_root.get("file") == elsewhere["file"], at_root
        return
    # A namespace package: every installed portion is still on its path, and none of their
    # submodules has a namesake in our folder that would be found first.
    assert set(elsewhere["path"]) <= set(at_root["path"]), at_root
    theirs = {entry.name.split(".")[0] for portion in elsewhere["path"] for entry in Path(portion).iterdir()}
    clashes = sorted(name for name in theirs if (ours / name).exists() or (ours / f"{name}.py").exists())
    assert not clashes, f"cuda/ holds {clashes}, which would shadow cuda-python's own"
