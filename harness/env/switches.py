"""Yes/no switches from the environment, read one way everywhere.

``MATMUL_ALLOW_SLOW=off`` must never allow what ``MATMUL_ALLOW_SLOW=1`` allows: every boolean
``MATMUL_*`` variable goes through ``switch``, which takes 1/0, true/false, yes/no and on/off
in any case, treats an unset or empty variable as its default, and refuses anything else with
a message that names the variable and the spellings it takes.
"""

from __future__ import annotations

import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")

# Every boolean switch the harness and its tests read, and what it turns on.
SWITCHES = {
    "MATMUL_ALLOW_SLOW": "run problems that would take too long (pure Python, CPU stand-ins for GPU code)",
    "MATMUL_CUDA_EMULATE": "run the CUDA kernels on the CPU emulation",
    "MATMUL_REQUIRE_GPU": "make a GPU test that would skip fail instead",
    "MATMUL_CUDA_PROGRESS": "build the pipelined CUDA kernels to report how far they got (the smoke test's diagnosis)",
    "MATMUL_TRITON_CHECK_MODE": "autotuned Triton kernels keep one config (the GPU script's correctness step)",
}


class SwitchError(ValueError):
    """A boolean environment variable set to something that is not yes or no."""


def switch(name: str, default: bool = False) -> bool:
    """The value of the yes/no environment variable ``name``; ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise SwitchError(
        f"{name}={raw!r} is neither yes nor no: set it to one of "
        f"{'/'.join(TRUE)} or {'/'.join(FALSE)} (any case), or unset it"
    )


def switch_problems() -> list[str]:
    """The message of every known switch that is set to something unreadable (the command line
    checks them all before it starts, so a typo is a usage error, not a surprise mid-run)."""
    problems = []
    for name in SWITCHES:
        try:
            switch(name)
        except SwitchError as error:
            problems.append(str(error))
    return problems
