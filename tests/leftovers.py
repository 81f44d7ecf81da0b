"""No process outlives its test.

Every process a test starts inherits RUN_MARK in its environment (tests/conftest.py sets it
once per pytest process), whatever session or process group it moves to and whoever becomes its
parent once its own parent is killed. After each test, a live process still carrying the mark
is an error, and is killed. Linux only (/proc); elsewhere nothing is checked.
"""

from __future__ import annotations

import os
import signal
import time

RUN_MARK = "MATMUL_TEST_RUN"
GRACE_S = 3.0  # for processes that are exiting as the test ends


def marked_processes(mark: str | None = None) -> dict[int, str]:
    """{pid: command line} of the live processes (this one aside) whose environment carries the mark.
    A process inside its exec reads an empty environment for that moment and is not listed then."""
    mark = mark or os.environ.get(RUN_MARK)
    found: dict[int, str] = {}
    if not mark or not os.path.isdir("/proc"):
        return found
    token = f"{RUN_MARK}={mark}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                if token not in environ.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                found[int(name)] = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or a zombie: nothing left running
            continue
    return found


def left_running(grace_s: float = GRACE_S, kill: bool = False, mark: str | None = None) -> dict[int, str]:
    """The marked processes still alive after up to ``grace_s``; with ``kill``, SIGKILLed too."""
    deadline = time.monotonic() + grace_s
    left = marked_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes(mark)
    if kill:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return left
