"""The cores this process may run on: the default thread count of every threaded kernel, and
the most a --threads or threads= may ask for."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
