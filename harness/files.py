"""Files written whole or not at all, destinations checked before anything is measured, and
locks that never follow a symlink.

Every file the harness writes (JSON, CSV, PNG, reports, caches) goes through ``replacing``:
the bytes go to a temporary file in the destination's folder, are flushed to the disk, and
only then is the file renamed over the destination, which the OS does in one step. A full
disk, an error or Ctrl-C half-way leaves the previous file as it was and no partial one.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path


def _umask() -> int:
    """The process's umask (read back from the OS: Python can only read it by setting it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def replacing(path, binary: bool = False, newline: str | None = None):
    """``with replacing(path) as handle: handle.write(...)``: ``path`` holds all of what was
    written once the block ends, or is untouched if it raises. A symlink at ``path`` is
    written through, to its target, as ``open`` would."""
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        mode = "wb" if binary else "w"
        with os.fdopen(descriptor, mode, newline=newline, encoding=None if binary else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())  # a full disk may only say so here
        try:  # mkstemp makes it private; give it the mode open() would have
            keep = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            keep = 0o666 & ~_umask()
        os.chmod(temporary, keep)
        os.replace(temporary, target)
    except BaseException as error:
        with suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.filename is None:
            error.filename = str(target)  # fsync's and write's errors name no file
        raise


def write_text(path, text: str) -> Path:
    with replacing(path) as handle:
        handle.write(text)
    return Path(path)


def save_figure(figure, path, **options) -> Path:
    """``figure.savefig`` into ``path`` whole (the format from its suffix, PNG by default)."""
    path = Path(path)
    with replacing(path, binary=True) as handle:
        figure.savefig(handle, format=path.suffix.lstrip(".") or "png", **options)
    return path


def unwritable_reason(path) -> str | None:
    """Why ``path`` cannot be written (as ``replacing`` writes it), or None; checked before a
    command measures anything, so a run of minutes is not lost to a typo or a read-only folder.
    Creates the missing folders above it, as the write would."""
    target = Path(os.path.realpath(path))
    if target.is_dir():
        return "it is a folder"
    if target.exists() and not os.access(target, os.W_OK):
        return "it is read-only"
    return unwritable_folder_reason(target.parent)


def unwritable_folder_reason(folder) -> str | None:
    """Why no file can be written into ``folder`` (made if missing), or None."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(dir=folder, prefix=".write-check.", suffix=".partial")
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        return error.strerror or str(error)
    return None


@contextmanager
def locked(path):
    """Hold an exclusive lock on the file ``path`` (created if missing) across processes.

    Opened with O_NOFOLLOW and never truncated: a symlink planted at ``path`` is refused
    (OSError) rather than followed to whatever file it names. Where there is no flock
    (Windows), nothing is locked across processes."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as error:
        if os.path.islink(path):
            raise OSError(
                error.errno, f"refusing to lock {path}: it is a symlink, and a lock never follows one"
            ) from None
        raise
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock
