"""Long C calls that Ctrl-C can still stop waiting for.

Python delivers a signal to the main thread between bytecodes, so while the main thread is
inside a C call (c.naive_ijk at 2048^3: about a minute) Ctrl-C waits for it. A long call
therefore runs on a worker thread while the main thread waits in short slices, where
KeyboardInterrupt arrives at once. C cannot be stopped half-way: the abandoned call finishes
on its own (its buffers are kept alive for it) and its result is dropped. Used by the C
backends (backends/c.py), the CUDA emulation and users' C kernels called in this process.
"""

from __future__ import annotations

import ctypes
import threading

WAIT_SLICE_S = 0.05  # how often the waiting main thread lets a Ctrl-C in


def call_interruptibly(function, args: tuple):
    """``function(*args)``, made on a worker thread and waited for in slices, so Ctrl-C raises
    KeyboardInterrupt here within WAIT_SLICE_S (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        return function(*args)  # only the main thread receives signals: nothing to gain
    outcome: list = []

    def work():
        try:
            outcome.append((True, function(*args)))
        except BaseException as error:  # handed to the waiting thread
            outcome.append((False, error))

    # A daemon: a process that ends after a Ctrl-C does not wait for the abandoned call.
    worker = threading.Thread(target=work, name="matmul C call", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(WAIT_SLICE_S)
    except KeyboardInterrupt:
        # C still writes through these buffers: one reference more than anything will ever
        # release, so neither this frame's end nor the interpreter's shutdown frees them.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(args))
        raise
    done, value = outcome[0]
    if done:
        return value
    raise value
