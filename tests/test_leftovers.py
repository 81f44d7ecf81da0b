"""tests/leftovers.py: a process a test starts is found after the test, wherever it hid."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from leftovers import left_running, marked_processes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_in_a_session_of_its_own_whose_parent_died_is_still_found():
    # The parent starts the sleeper in a new session and exits at once: the sleeper is
    # reparented, out of reach of any killpg of ours, and still carries the run's mark.
    parent = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen(['sleep', '60'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = int(parent.stdout)
    try:
        assert orphan in marked_processes()
        assert orphan in left_running(grace_s=0.2, kill=True)
        deadline = time.monotonic() + 5
        while orphan in marked_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphan not in marked_processes(), "killed"
    finally:
        subprocess.run(["kill", "-9", str(orphan)], capture_output=True)
