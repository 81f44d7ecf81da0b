"""An implementation run in a worker process of its own, so that it cannot take the run down.

A user's kernel (``FILE:FUNCTION``, external.py) may write through a null pointer, loop for
ever or call ``exit``; in the comparison's own process any of these would end the run and lose
every row measured so far. ``compare`` therefore checks and times such a kernel in a worker:

    worker = Worker(impl, options)              # a process that loads the kernel once
    mode = worker.prepare(a, b, limit_s)        # inputs shared with it, not copied per call
    result = worker.run(limit_s)                # one call, its product copied back to be checked
    timing = worker.time(min_time, 0, limit_s)  # timed inside the worker: no IPC is timed
    worker.close()

A worker that dies is ``KernelCrashed`` (with the signal that killed it, say SIGSEGV); one
that does not answer within the limit is killed and ``KernelTimedOut``. The caller turns
either into a row and goes on. Ctrl-C reaches only this process (the worker runs in a session
of its own), which waits in short slices and kills the worker on its way out, so it takes
effect at once, whatever the kernel is doing; the worker also dies with this process, even
when this one is killed.

The worker is a plain ``python`` started by ``subprocess`` and spoken to through
``multiprocessing.connection`` over a socket pair; A, B and the product are memory-mapped
files (in /dev/shm where there is one) that both processes map, written once per problem.
(``multiprocessing``'s own processes would also start its resource-tracker process, which
outlives the comparison.) The parent digests A and B before and after, so a kernel that writes
into its inputs is caught as in-process rows are (core.InputGuard).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from harness.backends.external import external_recipe, implementation_from_recipe, spec_text
from harness.env.interrupts import WAIT_SLICE_S  # how often the waiting parent lets a Ctrl-C in
from harness.model import registry
from harness.model.core import Implementation, InputGuard, Matmul, check_result, tried_to_write_inputs
from harness.model.timing import Timing, time_cpu

START_LIMIT_S = 60.0  # starting Python, importing the harness and loading the kernel


class KernelCrashed(RuntimeError):
    """The worker died: the kernel crashed the process (a signal) or ended it (exit)."""


class KernelTimedOut(RuntimeError):
    """The worker did not answer in time; it has been killed."""


class KernelFailed(RuntimeError):
    """The kernel raised in the worker; the message is the worker's ``Type: message``."""

    def __init__(self, message: str, wrote_read_only: bool):
        super().__init__(message)
        self.wrote_read_only = wrote_read_only  # NumPy refused a write into a read-only input


def death_text(exitcode: int | None) -> str:
    """How a process ended, as a person reads it: 'SIGSEGV', 'exit status 3'."""
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def _shared_folder() -> str | None:
    """Where the shared files go: memory (/dev/shm), else the temporary folder."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


class _Shared:
    """An array in a memory-mapped file this process owns (makes and removes)."""

    def __init__(self, shape, dtype, source: np.ndarray | None = None):
        dtype = np.dtype(dtype)
        descriptor, path = tempfile.mkstemp(prefix="matmul-worker-", suffix=".bin", dir=_shared_folder())
        os.close(descriptor)
        self.path = path
        size = int(np.prod(shape))
        # np.memmap cannot map 0 bytes: an empty problem never reaches a worker, but stay safe
        self.array = np.memmap(path, dtype=dtype, mode="w+", shape=tuple(shape)) if size else np.empty(shape, dtype)
        if source is not None:
            self.array[...] = source
        self.description = (path, tuple(shape), dtype.str)

    def release(self) -> None:
        self.array = None
        with suppress(FileNotFoundError):
            os.unlink(self.path)


def _attach(description) -> np.ndarray:
    """The parent's shared array, mapped into this process."""
    path, shape, dtype = description
    if not int(np.prod(shape)):
        return np.empty(shape, np.dtype(dtype))
    return np.memmap(path, dtype=np.dtype(dtype), mode="r+", shape=tuple(shape))


class Worker:
    """One implementation loaded in a worker process, reused for every problem of a run."""

    def __init__(
        self, impl: Implementation, options: dict, allow_slow: bool | None = None, blas_threads: int | None = None
    ):

        self.name = spec_text(impl) if external_recipe(impl) else impl.name  # as the user named it
        self._recipe = recipe(impl)
        self._options, self._allow_slow, self._blas_threads = dict(options), allow_slow, blas_threads
        self._process = self._connection = None
        self._shared: list[_Shared] = []
        self._guard: InputGuard | None = None
        self._result: _Shared | None = None

    # ---- the process ---------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        package_parent = str(Path(__file__).resolve().parents[2])  # this harness, whatever the cwd holds
        command = (
            f"import sys; sys.path.insert(0, {package_parent!r}); "
            f"from harness.run.isolation import serve; serve({theirs.fileno()})"
        )
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", command],
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # Ctrl-C at the terminal is this process's to handle
            )
        finally:
            theirs.close()
        self._process, self._connection = process, Connection(ours.detach())
        self._connection.send((self._recipe, self._options, self._allow_slow, self._blas_threads))
        self._answer(START_LIMIT_S, "to start and load it")

    def close(self) -> None:
        """End the worker (killed: it may be inside a kernel that never returns) and remove
        the shared files. Safe to call twice."""
        self._release()
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _release(self) -> None:
        for shared in self._shared:
            shared.release()
        self._shared, self._result, self._guard = [], None, None

    def _answer(self, limit_s: float, doing: str):
        """The worker's next message, waited for in slices; raises what went wrong."""
        deadline = time.monotonic() + limit_s
        try:
            while not self._connection.poll(WAIT_SLICE_S):
                if self._process.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    raise KernelTimedOut(f"timed out: {self.name} took longer than {limit_s:.3g} s {doing}")
            message = self._connection.recv()
        except (EOFError, OSError):
            try:
                code = self._process.wait(5)
            except subprocess.TimeoutExpired:  # it closed its end but lives on: a fault all the same
                code = None
            self.close()
            raise KernelCrashed(f"crashed: {death_text(code)} in {self.name}") from None
        except BaseException:  # a timeout, Ctrl-C: the kernel may never return
            self.close()
            raise
        kind, *details = message
        if kind == "error":
            text, wrote_read_only = details
            raise KernelFailed(text, wrote_read_only)
        return details

    # ---- one problem -----------------------------------------------------------------------
    def prepare(self, a: np.ndarray, b: np.ndarray, limit_s: float) -> str:
        """Share ``a`` and ``b`` with the worker and have it prepare the call (not timed); its
        run mode."""
        if not self.alive:
            self._start()
        self._release()
        shared_a, shared_b = _Shared(a.shape, a.dtype, a), _Shared(b.shape, b.dtype, b)
        self._result = _Shared((a.shape[0], b.shape[1]), a.dtype)
        self._shared = [shared_a, shared_b, self._result]
        self._guard = InputGuard(shared_a.array, shared_b.array)
        self._connection.send(("prepare", shared_a.description, shared_b.description, self._result.description))
        (mode,) = self._answer(limit_s, "to prepare")
        return mode

    def run(self, limit_s: float) -> np.ndarray:
        """One call in the worker; a copy of its product."""
        self._connection.send(("run",))
        self._answer(limit_s, "on one call")
        return self._result.array.copy()

    def time(self, min_time: float, settle_s: float, limit_s: float) -> Timing:
        self._connection.send(("time", min_time, settle_s))
        (timing,) = self._answer(limit_s, "while it was timed")
        return Timing(**timing)

    def written(self) -> list[str]:
        """The inputs ("A", "B") the worker's kernel wrote into (core.InputGuard)."""
        return self._guard.written() if self._guard else []


# ---- the worker's side ---------------------------------------------------------------------
def recipe(impl: Implementation) -> tuple:
    """What a worker needs to make ``impl`` again: a user's file and function, or a name."""

    return external_recipe(impl) or ("registered", impl.name)


def _implementation(recipe: tuple) -> Implementation:

    if recipe[0] == "registered":
        return registry.REGISTRY[recipe[1]]
    return implementation_from_recipe(recipe)


def _die_with_parent() -> None:
    """Linux: the kernel sends this process SIGKILL when its parent ends, even by SIGKILL, so
    a worker inside a kernel that never returns does not outlive the run."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent ended before prctl took effect
        os._exit(1)


def serve(descriptor: int) -> None:
    """The worker's side (its process runs only this): load the implementation the parent
    names, then answer prepare / run / time until the parent closes the connection."""
    _die_with_parent()
    connection = Connection(descriptor)
    recipe, options, allow_slow, blas_threads = connection.recv()
    if blas_threads is not None:  # what compare's blas_limits does for in-process rows
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=blas_threads)

    def fail(error: BaseException) -> None:
        text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        connection.send(("error", text, tried_to_write_inputs(error)))

    try:
        impl = _implementation(recipe)
        matmul = Matmul(impl, allow_slow=allow_slow, **options)
    except Exception as error:
        fail(error)
        return
    connection.send(("ready",))
    prepared = None
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        try:
            if kind == "prepare":
                prepared = None
                a, b, c = (_attach(description) for description in message[1:])
                a.flags.writeable = b.flags.writeable = False
                prepared = matmul.prepare(a, b)
                connection.send(("prepared", prepared.mode))
            elif kind == "run":
                prepared.run()
                c[...] = check_result(impl, prepared.result(), a, b)
                connection.send(("ran",))
            elif kind == "time":
                _, min_time, settle_s = message
                timing = prepared.time(min_time)  # GPU adapters time themselves
                if timing is None:
                    time.sleep(settle_s)
                    timing = time_cpu(prepared.run, min_time=min_time)
                connection.send(("timed", timing.as_dict()))
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception as error:  # the kernel's fault: the parent makes it the row's status
            fail(error)


class WorkerPool:
    """The workers of one comparison: one per implementation and options, started when its
    first row needs it, started again after a crash or a timeout, all ended by ``close``."""

    def __init__(self, allow_slow: bool | None, blas_threads: int | None):
        self._allow_slow, self._blas_threads = allow_slow, blas_threads
        self._workers: dict[tuple, Worker] = {}

    def get(self, impl: Implementation, options: dict) -> Worker:
        key = (impl.name, repr(sorted(options.items())))
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = Worker(impl, options, self._allow_slow, self._blas_threads)
        return worker

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()


ISOLATE_CHOICES = ("user", "all")

# An isolated row's calls are bounded: a kernel that has not answered by then is taken to hang.
# The bound is the time the problem takes at a rate below any working kernel of its language
# (a pure-Python triple loop does a few million FLOP/s, a naive C loop about a billion), and
# never less than MIN_LIMIT_S, so a slow but sound kernel is never cut short.
MIN_LIMIT_S = 30.0
SLOWEST_FLOPS_PER_S = {"python": 1e6, "c": 1e8}


def automatic_limit_s(impl: Implementation, shape) -> float:
    """How long one call of ``impl`` on ``shape`` may take before it counts as hung."""
    return max(MIN_LIMIT_S, shape.flops / SLOWEST_FLOPS_PER_S.get(impl.language, 1e8))


def timing_allowance_s(min_time: float, one_call_s: float) -> float:
    """What timing adds to a call's limit: the timer runs a warm-up and at least three calls,
    and calls until ``min_time`` has passed (timing.time_cpu)."""
    return 5 * (min_time + 4 * one_call_s)
