"""The per-user cache folder, and artefacts in it that are checked before they are used.

``user_cache_root()`` follows the XDG Base Directory specification: ``$XDG_CACHE_HOME`` when it
is set to an absolute path, else ``~/.cache`` (a relative or empty value must be ignored, the
spec says, so a cache never lands in whatever folder a command was started from).

A built artefact (a compiled kernel library, say) is recorded when its build finishes: a
sidecar ``<name>.sha256`` holds its size and SHA-256. ``intact(path)`` is true only when the
file is there and still matches its record, so a file emptied, truncated or overwritten since
(by a full disk, a killed copy, a user) is rebuilt rather than loaded: loading a truncated
shared library can kill the process with SIGBUS, which no ``try`` catches.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from harness.env import files

CACHE_NAME = "matmul-reference"


def user_cache_root() -> Path:
    """``$XDG_CACHE_HOME/matmul-reference`` when that is an absolute path, else
    ``~/.cache/matmul-reference``."""
    configured = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(configured) if configured and os.path.isabs(configured) else Path.home() / ".cache"
    return base / CACHE_NAME


def _record_path(artefact: Path) -> Path:
    return artefact.with_name(artefact.name + ".sha256")


def fingerprint(artefact) -> str:
    """``"<size> <sha256>"`` of the file ``artefact`` (OSError when it cannot be read)."""
    digest = hashlib.sha256()
    with open(artefact, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return f"{size} {digest.hexdigest()}"


def _fingerprint(artefact: Path) -> str:
    return fingerprint(artefact) + "\n"


def record(artefact) -> None:
    """Note ``artefact``'s size and hash, once its build has finished (last, and whole)."""
    artefact = Path(artefact)
    files.write_text(_record_path(artefact), _fingerprint(artefact))


def intact(artefact) -> bool:
    """True when ``artefact`` exists and is byte for byte what ``record`` saw."""
    artefact = Path(artefact)
    try:
        return _record_path(artefact).read_text() == _fingerprint(artefact)
    except OSError:  # no artefact, no record, or unreadable: build it again
        return False


def forget(artefact) -> None:
    """Remove ``artefact`` and its record (a damaged one, before it is built again)."""
    artefact = Path(artefact)
    for path in (artefact, _record_path(artefact)):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
