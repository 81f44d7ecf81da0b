"""Files written whole or not at all, destinations checked before anything is measured, and
locks that never follow a symlink.

Every file the harness writes (JSON, CSV, PNG, reports, caches) goes through ``replacing``:
the bytes go to a temporary file in the destination's folder, are flushed to the disk, and
only then is the file renamed over the destination, which the OS does in one step. A full
disk, an error or Ctrl-C half-way leaves the previous file as it was and no partial one.

A destination that exists and is not a regular file (/dev/null, /dev/full, a FIFO a reader
waits on) is written in place, as a shell's ``>`` would: renaming a file over it would turn a
device every process shares into a plain file. Missing folders are made only along the path
as given, never on the far side of a symlink.
"""

from __future__ import annotations

import errno
import os
import stat
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
    written through, to its target, as ``open`` would. A device or FIFO at ``path`` is written
    in place (module docstring)."""
    target = _destination(path)
    if _is_special(target):
        with _writing_in_place(target, binary, newline) as handle:
            yield handle
        return
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
        _name_the_file(error, target)
        raise


def _destination(path) -> Path:
    """Where a write to ``path`` lands (symlinks resolved), its folder made if missing, but
    only along ``path`` as given: a dangling symlink's target folder is never created."""
    problem = _folder_problem(path)
    if problem:
        raise FileNotFoundError(errno.ENOENT, problem, str(path))
    return Path(os.path.realpath(path))


def _folder_problem(path) -> str | None:
    """Make the missing folders above ``path`` (as given; none beyond a symlink) and say why
    its target's folder is still missing, or None."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file on the way, or a symlink to a folder that does not exist
        pass
    except OSError as error:
        return error.strerror or str(error)
    target = Path(os.path.realpath(path))
    if target.parent.is_dir():
        return None
    standing = next(folder for folder in target.parents if os.path.lexists(folder))
    if not standing.is_dir():
        return f"{standing} is a file, not a folder"
    return (
        f"it leads through a symlink to {target}, whose folder {target.parent} does not exist "
        "(folders are never made on the far side of a symlink)"
    )


def _is_special(target: Path) -> bool:
    """Whether ``target`` exists and is neither a regular file nor a folder: a character or
    block device, a FIFO, a socket."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def _writing_in_place(target: Path, binary: bool, newline: str | None):
    """Open ``target`` (a device or FIFO) for writing and write into it, never renaming over
    it. No O_CREAT: if it vanished since it was looked at, nothing is made in its place."""
    try:
        descriptor = os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        mode = "wb" if binary else "w"
        with os.fdopen(descriptor, mode, newline=newline, encoding=None if binary else "utf-8") as handle:
            yield handle
            handle.flush()  # /dev/full says "No space left on device" here (fsync: devices take none)
    except BaseException as error:
        _name_the_file(error, target)
        raise


def _name_the_file(error: BaseException, target: Path) -> None:
    if isinstance(error, OSError) and error.filename is None:
        error.filename = str(target)  # fsync's and write's errors name no file


def write_text(path, text: str) -> Path:
    with replacing(path) as handle:
        handle.write(text)
    return Path(path)


def save_figure(figure, path, **options) -> Path:
    """``figure.savefig`` into ``path`` whole (the format from its suffix, PNG by default)."""
    path = Path(path)
    problem = plot_format_problem(path)
    if problem:  # before anything is opened: no empty file, no temporary one
        raise ValueError(problem)
    with replacing(path, binary=True) as handle:
        figure.savefig(handle, format=plot_format(path), **options)
    return path


def plot_format(path) -> str:
    """The image format a plot at ``path`` is written in: its suffix's, PNG without one."""
    return Path(path).suffix.lstrip(".").lower() or "png"


def plot_formats() -> list[str]:
    """The formats matplotlib writes (imported only when asked: it takes a while to load)."""
    from matplotlib.figure import Figure

    return sorted(Figure().canvas.get_supported_filetypes())


def plot_format_problem(path) -> str | None:
    """Why no plot can be written at ``path`` (a suffix matplotlib cannot write), or None."""
    fmt = plot_format(path)
    formats = plot_formats()
    if fmt in formats:
        return None
    supported = ", ".join(f".{name}" for name in formats)
    return f"cannot draw a plot as {path}: matplotlib writes no .{fmt} files; name it with one of {supported}"


def unwritable_reason(path) -> str | None:
    """Why ``path`` cannot be written (as ``replacing`` writes it), or None; checked before a
    command measures anything, so a run of minutes is not lost to a typo or a read-only folder.
    Creates the missing folders above it, as the write would (along ``path`` as given only)."""
    problem = _folder_problem(path)
    if problem:
        return problem
    target = Path(os.path.realpath(path))
    if target.is_dir():
        return "it is a folder"
    if target.exists() and not os.access(target, os.W_OK):
        return "it is read-only"
    if _is_special(target):  # written in place: its folder (/dev) gets no temporary file
        return "it is a socket" if stat.S_ISSOCK(os.stat(target).st_mode) else None
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
