"""tests/leftovers.py: a process a test starts is found after the test, wherever it hid."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from leftovers import RUN_MARK, left_running, marked_processes


def _what_became_of(pid: int) -> str:
    """Why a process was not found: gone, or alive without the mark (its state, command and marks)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            marks = [v for v in environ.read().split(b"\0") if v.startswith(RUN_MARK.encode())]
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0].decode()
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError as error:
        return f"process {pid} is gone or unreadable ({error.strerror})"
    return f"process {pid} is alive (state {state}, command {command!r}) with marks {marks}"


def _found_within(pid: int, mark: str, seconds: float) -> bool:
    """Whether ``pid`` is listed under ``mark`` within ``seconds``. A process still inside its
    exec reads an empty environment (the kernel fills it in after the close-on-exec pipe that
    let Popen return has closed), so a busy machine can list it a moment late."""
    deadline = time.monotonic() + seconds
    while pid not in marked_processes(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_in_a_session_of_its_own_whose_parent_died_is_still_found():
    # The parent starts the sleeper in a new session and exits at once: the sleeper is
    # reparented, out of reach of any killpg of ours, and still carries the mark it was given.
    # The mark is this test's own, so no other test's clean-up (another xdist worker's
    # included) can see or kill the sleeper, whatever this process's own mark is by now.
    mark = uuid.uuid4().hex
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen(['sleep', '60'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)",
        ],
        env={**os.environ, RUN_MARK: mark},
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(parent.stdout)
    try:
        assert _found_within(orphan, mark, seconds=5), _what_became_of(orphan)
        assert orphan not in marked_processes(uuid.uuid4().hex), "found under a mark it does not carry"
        assert orphan in left_running(grace_s=0.2, kill=True, mark=mark)
        deadline = time.monotonic() + 5
        while orphan in marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphan not in marked_processes(mark), "killed"
    finally:
        subprocess.run(["kill", "-9", str(orphan)], capture_output=True)
