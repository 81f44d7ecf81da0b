"""Where the implementations' source files are, and loading the Python ones by path.

In a checkout (an editable install, or a repository whose root is on PYTHONPATH or is the
working folder, with no harness installed) the sources are read from the checkout itself, so an
edited ``.py``, ``.cu`` or Triton file takes effect on the next run. A regular wheel carries
copies under ``harness/_sources`` and uses those.

An editable install's finder comes before PYTHONPATH, so a second clone named there is not the
one imported: ``warn_if_shadowed`` says so at import, naming both, rather than let a run
silently measure the other clone's code.

``python/`` and ``triton/`` are deliberately not packages: a folder named ``triton`` with an
``__init__.py`` would shadow the installed Triton for anyone running from the repository
root. Their files are loaded by path under private module names instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # harness/ (this file is harness/env/sources.py)
_CHECKOUT_ROOT = PACKAGE_DIR.parent
_INSTALLED_SOURCES = PACKAGE_DIR / "_sources"


def in_checkout() -> bool:
    """True when running from the repository (its CMakeLists.txt sits beside harness/)."""
    return (_CHECKOUT_ROOT / "CMakeLists.txt").is_file() and (_CHECKOUT_ROOT / "c").is_dir()


def sources_root() -> Path:
    """The folder that holds python/, c/, cuda/ and triton/."""
    return _CHECKOUT_ROOT if in_checkout() else _INSTALLED_SOURCES


def source_path(relative: str) -> Path:
    """Absolute path of a source file given relative to the repository root (``c/naive.c``)."""
    return sources_root() / relative


def load_python_source(relative: str):
    """Import a Python source file by path, under a private module name.

    Reloaded when the file changed since it was last loaded, so an edit takes effect
    without restarting the interpreter.
    """
    path = source_path(relative)
    if not path.is_file():
        raise FileNotFoundError(f"source file {relative} not found under {sources_root()}")
    module_name = "_matmul_source_" + relative.replace("/", "_").replace(".", "_")
    mtime = path.stat().st_mtime_ns
    cached = sys.modules.get(module_name)
    if cached is not None and getattr(cached, "__source_mtime__", None) == mtime:
        return cached
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before exec: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    module.__source_mtime__ = mtime
    return module


def warn_if_shadowed() -> None:
    """Warn when PYTHONPATH names a folder holding another harness than this one (see above)."""
    import os
    import warnings

    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if not entry:
            continue
        candidate = Path(entry) / "harness" / "__init__.py"
        try:
            other = candidate.resolve(strict=True).parent
        except OSError:
            continue
        if other != PACKAGE_DIR:
            warnings.warn(
                f"PYTHONPATH names {other}, but the harness imported is {PACKAGE_DIR} (an installed or editable "
                f"harness comes before PYTHONPATH); run `pip install -e {other.parent}` to use that clone",
                stacklevel=3,
            )
            return
