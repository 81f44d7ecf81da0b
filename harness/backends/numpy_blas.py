"""NumPy's matmul: the BLAS NumPy links (usually OpenBLAS), the CPU baseline.

Its description (``describe``: under every table, and in the JSON's machine section) names
that BLAS, its version and the kernels it picked (threadpoolctl's ``threadpool_info``), and
warns when an environment variable forces kernels other than those the library picks on this
CPU: OPENBLAS_CORETYPE=Haswell on an AVX-512 machine halves NumPy's speed, and with it every
row's "vs base". What the library would pick is asked of a fresh Python with the variable
removed, only when one is set.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from harness.model.core import Backend, Implementation, Prepared
from harness.model.registry import register


class _NumpyPrepared(Prepared):
    def __init__(self, a, b):
        self.a, self.b = a, b
        self.c = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)

    def run(self) -> None:
        np.matmul(self.a, self.b, out=self.c)

    def result(self) -> np.ndarray:
        return self.c.copy()


# Environment variables that make a BLAS run kernels other than those it picks for the CPU.
FORCING_VARIABLES = {
    "openblas": ("OPENBLAS_CORETYPE",),  # read by OpenBLAS built with DYNAMIC_ARCH, as NumPy's wheels are
    "blis": ("BLIS_ARCH_TYPE",),  # read by BLIS's run-time selection (bli_arch.c)
    # the first is Intel's documented cap on the instruction set; the second an older, undocumented
    # switch (MKL before 2020.1) that set the code path on AMD CPUs
    "mkl": ("MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE"),
}
LIBRARY_NAMES = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS", "flexiblas": "FlexiBLAS"}
PROBE_TIMEOUT_S = 60

# Run by a fresh Python: the kernels of every BLAS that NumPy loads there (and MKL's verbose
# line, under MKL_VERBOSE=1).
_PROBE = """
import json
import numpy
from threadpoolctl import threadpool_info
numpy.ones((2, 2)) @ numpy.ones((2, 2))
print(json.dumps({pool.get("filepath"): pool.get("architecture") for pool in threadpool_info()}))
"""


def _built_with() -> str | None:
    """The BLAS NumPy was built against, as threadpoolctl's internal_api names it, or None."""
    config = getattr(getattr(np, "__config__", None), "CONFIG", None) or {}
    name = str(config.get("Build Dependencies", {}).get("blas", {}).get("name", "")).lower()
    return next((api for api in LIBRARY_NAMES if api in name), None)


def _inside_numpy(filepath: str) -> bool:
    """Whether a loaded library is one NumPy's wheel carries (numpy.libs, numpy/.dylibs)."""
    here = Path(np.__file__).resolve().parent
    path = Path(filepath).resolve()
    return path.is_relative_to(here) or path.is_relative_to(here.parent / f"{here.name}.libs")


def numpy_blas() -> dict | None:
    """threadpoolctl's entry for the BLAS NumPy calls (torch or BLIS may have loaded others),
    or None where it finds none it knows (Accelerate, say)."""
    from threadpoolctl import threadpool_info

    pools = [pool for pool in threadpool_info() if pool.get("user_api") == "blas"]
    built = _built_with()
    if built:
        pools = [pool for pool in pools if pool.get("internal_api") == built] or pools
    own = [pool for pool in pools if _inside_numpy(pool.get("filepath") or "")]
    return (own or pools or [None])[0]


def describe_blas() -> str:
    """e.g. "OpenBLAS 0.3.31 (libscipy_openblas), Haswell kernels", then a line starting "! "
    where an environment variable forces other kernels than the library's own choice."""
    pool = numpy_blas()
    if pool is None:
        return f"NumPy {np.__version__}: threadpoolctl finds no BLAS it knows loaded (Accelerate, or a static build)"
    library = LIBRARY_NAMES.get(pool.get("internal_api"), str(pool.get("internal_api")))
    text = f"{library} {pool.get('version') or '(version unknown)'} ({pool.get('prefix')})"
    if pool.get("architecture"):
        text += f", {pool['architecture']} kernels"
    warning = forced_kernels_warning(pool)
    return text + (f"\n! {warning}" if warning else "")


def forced_kernels_warning(pool: dict) -> str | None:
    """What a kernel-forcing variable set in the environment does to ``pool`` (threadpoolctl's
    entry of a BLAS), or None where none is set or it forces what the library picks anyway."""
    api = pool.get("internal_api")
    forcing = tuple((name, os.environ[name]) for name in FORCING_VARIABLES.get(api, ()) if os.environ.get(name))
    if not forcing:
        return None
    library = LIBRARY_NAMES.get(api, str(api))
    settings = " and ".join(f"{name}={value}" for name, value in forcing)
    try:
        default = _kernels_in_a_fresh_python(api, pool.get("filepath"), forcing, keep_forcing=False)
        # threadpoolctl reports no kernels for MKL: its verbose line, under these variables, does
        kernels = pool.get("architecture") or _kernels_in_a_fresh_python(api, None, forcing, keep_forcing=True)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as error:
        default, kernels, why = None, None, f"asking a Python without it failed: {type(error).__name__}"
    else:
        why = "a Python without it did not say which kernels it picks"
    if default and kernels and default == kernels:
        return None
    if default and kernels:
        return (
            f"{settings} is set: NumPy's {library} runs its {kernels} kernels, where on this CPU it picks "
            f"{default} without it; numpy.matmul, and every row's vs base, is not what NumPy runs by "
            "default (unset it to time that)"
        )
    return (
        f"{settings} is set and may make NumPy's {library} run other kernels than it picks on this CPU "
        f"({why}); unset it to time what NumPy runs by default"
    )


@lru_cache(maxsize=8)
def _kernels_in_a_fresh_python(api: str, filepath: str | None, forcing: tuple, keep_forcing: bool) -> str | None:
    """The kernels a fresh Python's NumPy runs in the library at ``filepath`` (MKL: the
    instruction sets its verbose line names, e.g. "Advanced Vector Extensions 2 (AVX2)"), with
    or without the ``forcing`` variables."""
    environment = {k: v for k, v in os.environ.items() if keep_forcing or k not in dict(forcing)}
    if api == "mkl":
        environment["MKL_VERBOSE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=environment,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=True,
    )
    if api != "mkl":
        return json.loads(done.stdout.strip().splitlines()[-1]).get(filepath)
    # e.g. "... for Intel(R) 64 architecture Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2)
    # enabled processors, Lnx ..."
    match = re.search(r"architecture (.*?) enabled processors", done.stdout)
    return match.group(1).replace("Intel(R) ", "") if match else None


class NumpyBackend(Backend):
    def unavailable_reason(self, impl):
        return None

    def describe(self, impl) -> str:
        return describe_blas()

    def prepare(self, impl, a, b, options):
        return _NumpyPrepared(a, b)


register(
    Implementation(
        name="numpy.matmul",
        language="numpy",
        device="cpu",
        dtypes=("float32", "float64"),
        summary="NumPy's matmul, i.e. its BLAS sgemm/dgemm (the CPU baseline)",
        backend=NumpyBackend(),
        baseline=True,
    )
)
