import os
import signal
import sys

from harness.cli import INTERRUPTED, main

status = main()
if status == INTERRUPTED and os.name == "posix":
    # Ctrl-C handled (a message said so, nothing was left half-written): end the way a program
    # stopped by SIGINT does, so a calling shell loop stops too and every caller sees the same
    # status. Python's own exit after a caught KeyboardInterrupt is not that reliable: one that
    # arrived inside an exec() (dataclasses and namedtuple run one while torch imports) makes
    # CPython 3.11 die of SIGINT anyway, the caught one elsewhere exits 130.
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
sys.exit(status)
