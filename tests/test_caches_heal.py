"""Caches that heal: a damaged build is built again, never loaded; a moved or read-only copy of
the checkout runs what it has built; MATMUL_C_LIBRARY loads exactly the file it names or says
why not; a kept roof the machine cannot reach is measured again; and no cache lands in the
folder a command was started from.

Copies of the checkout run in a subprocess whose harness is the copy's own (the editable
install's finder is taken off ``sys.meta_path``, as scripts/mutants.py does). As root, a
read-only folder stops nothing, so those runs go through a user namespace (``unshare -U``),
where root's files are only as writable as their modes say.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.backends.c import clib
from harness.backends.cuda import emulation, toolkit
from harness.env import cache, sources
from harness.run import machine
from harness.tooling import sass

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("harness", "c", "cuda", "python", "triton")
C_ROW = ("compare", "--shapes", "16", "--impls", "c.naive_ikj", "--no-baseline", "--no-progress")

pytestmark = pytest.mark.skipif(not sources.in_checkout(), reason="copies a checkout and its build")

# The copy's own harness, run as `python -m harness` would run it.
IN_COPY = (
    "import os, runpy, sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith('_editable_')]\n"
    "sys.path.insert(0, os.getcwd())\n"
    "import harness\n"
    "assert os.path.realpath(harness.__file__).startswith(os.path.realpath(os.getcwd()) + os.sep), harness.__file__\n"
    "runpy.run_module('harness', run_name='__main__', alter_sys=True)\n"
)


def _environment(tmp_path: Path, **settings: str) -> dict:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "200", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for name in ("MATMUL_C_LIBRARY", "MATMUL_CUDA_EMULATE"):
        env.pop(name, None)
    return {**env, **settings}


def run_cli(*args: str, env: dict, cwd: Path = ROOT, prefix: tuple = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def run_in_copy(copy: Path, *args: str, env: dict, prefix: tuple = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, sys.executable, "-c", IN_COPY, *args], capture_output=True, text=True, cwd=copy, env=env, timeout=300
    )


def statuses(json_path: Path) -> dict[str, str]:
    return {row["implementation"]: row["status"] for row in json.loads(json_path.read_text())["results"]}


def built_library() -> Path:
    clib.load()  # built (or found current) in the checkout
    return clib.checkout_build_dir() / clib.library_filename()


def copy_checkout(destination: Path, copy_function=shutil.copy, emulated: tuple[Path, ...] = ()) -> Path:
    """The sources and the C library's build (library, stamp, call glue), copied as ``cp -r``
    copies (``shutil.copy``: times reset) or ``cp -a`` does (``shutil.copy2``)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_lib", "_sources")
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, destination / folder, ignore=ignore, copy_function=copy_function)
    copy_function(ROOT / "CMakeLists.txt", destination / "CMakeLists.txt")
    library = built_library()
    build = destination / "build" / "harness-c"
    build.mkdir(parents=True)
    for name in clib._recorded_artefacts(library):  # the library and its glue
        copy_function(library.parent / name, build / name)
    copy_function(clib._stamp(library), build / clib._stamp(library).name)
    if emulated:
        (destination / "build" / "cuda-emu").mkdir()
    for artefact in emulated:
        for path in (artefact, artefact.with_name(artefact.name + ".sha256")):
            copy_function(path, destination / "build" / "cuda-emu" / path.name)
    return destination


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): cache.fingerprint(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@contextmanager
def read_only(folder: Path):
    paths = [folder, *folder.rglob("*")]
    for path in paths:
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
    try:
        yield
    finally:
        for path in paths:
            path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)  # so the folder can be removed


def unprivileged() -> tuple:
    """What to run a command under so that a read-only folder is read-only to it."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return ()
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-U", "true"], capture_output=True).returncode == 0:
        return (unshare, "-U")
    pytest.skip("root writes into read-only folders, and no user namespace can be made here to stop that")


# ---- 1. a damaged emulated kernel is built again, never loaded ----------------------------------------
@pytest.mark.skipif(emulation.emulation_unavailable_reason() is not None, reason="no C++20 compiler")
def test_an_emulated_kernel_emptied_or_truncated_is_built_again_never_loaded(tmp_path):
    built = emulation.build_emulation("cuda/naive.cu")
    assert cache.intact(built)
    copy = copy_checkout(tmp_path / "copy", emulated=(built,))
    emulated = copy / "build" / "cuda-emu" / built.name
    env = _environment(tmp_path, MATMUL_CUDA_EMULATE="1")
    row = ("compare", "--shapes", "17x9x5", "--impls", "cuda.naive", "--no-baseline", "--no-progress")
    # Moved and with its times reset, the copy finds its build under the same key, and runs it
    # without writing anything (read-only).
    before = snapshot(copy)
    with read_only(copy):
        done = run_in_copy(copy, *row, "--json", str(tmp_path / "r.json"), env=env, prefix=unprivileged())
    assert done.returncode == 0, done.stdout + done.stderr
    assert statuses(tmp_path / "r.json") == {"cuda.naive": "ok"}
    assert snapshot(copy) == before
    whole = emulated.read_bytes()
    for damaged in (b"", whole[: len(whole) // 2]):  # "file too short" for good; a Bus error
        emulated.write_bytes(damaged)
        done = run_in_copy(copy, *row, "--json", str(tmp_path / "r.json"), env=env)
        assert done.returncode == 0, (done.returncode, done.stdout + done.stderr)
        assert statuses(tmp_path / "r.json") == {"cuda.naive": "ok"}
        assert cache.intact(emulated) and emulated.stat().st_size == len(whole)


# ---- 2. a moved or read-only copy runs the C library it has built ----------------------------------
@pytest.mark.parametrize("copy_function", [shutil.copy, shutil.copy2], ids=["cp -r", "cp -a"])
def test_a_read_only_copy_of_the_checkout_runs_the_c_library_it_has_built(tmp_path, copy_function):
    copy = copy_checkout(tmp_path / "copy", copy_function)
    before = snapshot(copy)
    with read_only(copy):
        done = run_in_copy(
            copy, *C_ROW, "--json", str(tmp_path / "r.json"), env=_environment(tmp_path), prefix=unprivileged()
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert statuses(tmp_path / "r.json") == {"c.naive_ikj": "ok"}
    assert snapshot(copy) == before  # nothing rebuilt, nothing written


def test_a_read_only_copy_that_must_rebuild_is_an_error_not_unavailable(tmp_path):
    copy = copy_checkout(tmp_path / "copy")
    naive = copy / "c" / "naive.c"
    naive.write_text(naive.read_text() + "/* edited in the copy */\n")
    with read_only(copy):
        done = run_in_copy(
            copy, *C_ROW, "--json", str(tmp_path / "r.json"), env=_environment(tmp_path), prefix=unprivileged()
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    status = statuses(tmp_path / "r.json")["c.naive_ikj"]
    assert status.startswith("error: the C library") and "must be built again" in status, status
    assert "its sources changed" in status and "cannot be written" in status, status


def test_the_stamp_vouches_for_contents_and_an_emptied_library_is_rebuilt(tmp_path):
    copy = copy_checkout(tmp_path / "copy")
    library = copy / "build" / "harness-c" / clib.library_filename()
    assert clib._stale_reason(library, copy) is None  # copied, times reset: still current
    library.write_bytes(b"")  # emptied since its build (a full disk, a killed copy)
    assert "not what its build produced" in clib._stale_reason(library, copy)


# ---- 3. MATMUL_C_LIBRARY loads exactly that file, or says why not ----------------------------------
@pytest.fixture
def library_beside_its_glue(tmp_path) -> Path:
    """A folder holding a copy of the built library, its stamp and its compiled call glue."""
    library = built_library()
    folder = tmp_path / "lib"
    folder.mkdir()
    for name in (*clib._recorded_artefacts(library), clib._stamp(library).name):
        shutil.copy2(library.parent / name, folder / name)
    return folder


@pytest.mark.parametrize("damage", ["an empty file", "the library cut in half"])
def test_a_truncated_matmul_c_library_is_a_clear_error_not_a_bus_error(tmp_path, library_beside_its_glue, damage):
    folder = library_beside_its_glue
    if damage == "an empty file":  # beside the glue, which used to be loaded instead
        named = folder / "empty.so"
        named.write_bytes(b"")
    else:
        named = folder / clib.library_filename()
        whole = named.read_bytes()
        named.write_bytes(whole[: len(whole) // 2])
    env = _environment(tmp_path, MATMUL_C_LIBRARY=str(named))
    done = run_cli(*C_ROW, "--json", str(tmp_path / "r.json"), env=env)
    assert done.returncode == 1, (done.returncode, done.stdout + done.stderr)  # not 135, not -7 (SIGBUS)
    status = statuses(tmp_path / "r.json")["c.naive_ikj"]
    assert status.startswith(f"error: MATMUL_C_LIBRARY={named} is truncated"), status


LOADED_FILES = """
import json, os
from harness.backends.c import clib
clib.load()
with open("/proc/self/maps") as maps:
    mapped = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
print(json.dumps({"mode": clib.call_mode(), "mapped": sorted(p for p in mapped if "matmul" in os.path.basename(p))}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads which files are mapped from /proc")
def test_matmul_c_library_loads_exactly_the_file_it_names(tmp_path, library_beside_its_glue):
    named = library_beside_its_glue / "renamed-libmatmul.so"
    shutil.copy2(library_beside_its_glue / clib.library_filename(), named)
    env = _environment(tmp_path, MATMUL_C_LIBRARY=str(named))
    done = subprocess.run([sys.executable, "-c", LOADED_FILES], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    # that file through dlopen: not the glue beside it, nor the library the glue would have pulled in
    assert loaded == {"mode": "dlopen", "mapped": [os.path.realpath(named)]}, loaded


# ---- 4. kept roofs are bounded by what the machine can do; a symlinked cache is not followed --------
@pytest.fixture
def roof_cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    machine.measured_fma_roofs.cache_clear()
    machine.memory_roof_gbps.cache_clear()
    yield tmp_path / "cache" / "matmul-reference" / "cpu-roofs.json"
    machine.measured_fma_roofs.cache_clear()
    machine.memory_roof_gbps.cache_clear()


def this_machine() -> str:
    return f"{machine.cpu_model()} | {' '.join(machine.simd_flags())}"


def test_a_kept_roof_beyond_what_the_clock_and_simd_allow_is_measured_again(roof_cache):
    if machine.roof_bound("float32") is None:
        pytest.skip("the clock cannot be measured here")
    impossible = {
        "float32": {"best": 9000.0, "median": 8000.0},  # within the old 10,000 limit: kept for good
        "float64": {"best": 4500.0, "median": 4000.0},
        "read_gbps_2_threads": {"best": 1999.0, "median": 1900.0},
    }
    roof_cache.parent.mkdir(parents=True)
    roof_cache.write_text(json.dumps({this_machine(): impossible}))
    roofs = machine.measured_fma_roofs()
    if roofs is None:
        pytest.skip("no FMA SIMD unit to measure on this CPU")
    for dtype in ("float32", "float64"):
        assert machine.roof_bound(dtype) < impossible[dtype]["best"]
        assert roofs[dtype]["best"] < impossible[dtype]["best"]  # measured again, not the kept one
        assert machine.cpu_peak_gflops(dtype) == roofs[dtype]["best"]  # "% peak" is against this
    kept = json.loads(roof_cache.read_text())[this_machine()]
    assert kept["float32"] == roofs["float32"]  # the cache healed
    if machine.roof_bound("read_gbps_2_threads") < impossible["read_gbps_2_threads"]["best"]:
        assert machine.memory_roof_gbps(2) < impossible["read_gbps_2_threads"]["best"]


def test_the_roof_bounds_follow_the_clock_and_the_simd_width(roof_cache, monkeypatch):
    monkeypatch.setattr(machine, "_max_clock_ghz", lambda: 3.0)
    monkeypatch.setattr(machine, "simd_bits", lambda: 256)
    # 3 GHz x 8 lanes x 2 FLOPs x 2 FMA units, and 3 loads of 32 bytes a cycle, with 25% to spare
    assert machine.roof_bound("float32") == pytest.approx(1.25 * 96)
    assert machine.roof_bound("float64") == pytest.approx(1.25 * 48)
    assert machine.roof_bound("int8_gops") == pytest.approx(1.25 * 384)  # 32 bytes, 2 ops, 2 units
    assert machine.roof_bound("bfloat16") == pytest.approx(1.25 * 192)  # 8 lanes, 2 pairs, 2 FLOPs, 2 units
    assert machine.roof_bound("read_gbps") == pytest.approx(1.25 * 288)
    assert machine.roof_bound("read_gbps_4_threads") == pytest.approx(4 * 1.25 * 288)
    roof_cache.parent.mkdir(parents=True)
    kept = {"float32": {"best": 110.0, "median": 100.0}, "float64": {"best": 900.0, "median": 1.0}}
    roof_cache.write_text(json.dumps({"a CPU": kept}))
    measured = {"float32": {"best": 90.0, "median": 85.0}, "float64": {"best": 40.0, "median": 39.0}}
    best = machine.remember_roofs("a CPU", measured, {kind: machine.roof_bound(kind) for kind in measured})
    # a better roof within the bound is kept; one beyond it gives way to this run's
    assert best == {"float32": kept["float32"], "float64": measured["float64"]}
    assert json.loads(roof_cache.read_text()) == {"a CPU": best}


@pytest.mark.parametrize("target", ["a dangling link", "a link to a file"])
def test_a_symlink_at_the_roof_cache_is_neither_followed_nor_written_through(roof_cache, tmp_path, target):
    measured = {"float32": {"best": 100.0, "median": 95.0}}
    roof_cache.parent.mkdir(parents=True)
    if target == "a dangling link":
        pointed = tmp_path / "nonexistent" / "folder" / "roofs.json"
    else:
        pointed = tmp_path / "someone-elses.json"
        pointed.write_text(json.dumps({"a CPU": {"float32": {"best": 200.0, "median": 190.0}}}))
    roof_cache.symlink_to(pointed)
    before = pointed.read_text() if pointed.exists() else None
    assert machine.remember_roofs("a CPU", measured) == measured  # this run's own measurement
    assert not (tmp_path / "nonexistent").exists()  # no folder made for the link's target
    assert (pointed.read_text() if pointed.exists() else None) == before
    assert roof_cache.is_symlink() and os.readlink(roof_cache) == str(pointed)


# ---- 5. XDG_CACHE_HOME relative or empty: the per-user cache, never the working folder ------------
@pytest.mark.parametrize("setting", ["", "relative/cache"])
def test_a_relative_or_empty_xdg_cache_home_puts_nothing_in_the_working_folder(tmp_path, monkeypatch, setting):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {**_environment(tmp_path, XDG_CACHE_HOME=setting), "HOME": str(home)}
    done = run_cli(*C_ROW, env=env, cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(work.iterdir()) == []
    flags = set(machine.simd_flags())
    if "avx512f" in flags or {"avx2", "fma"} <= flags:  # the roofs were measured, and kept in the home cache
        assert (home / ".cache" / "matmul-reference" / "cpu-roofs.json").is_file()
    # every per-user cache path, as an installed wheel (no checkout) builds it
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", setting)
    monkeypatch.setattr(sources, "in_checkout", lambda: False)
    user_cache = home / ".cache" / "matmul-reference"
    assert cache.user_cache_root() == user_cache
    assert toolkit.cache_root() == user_cache and sass.cache_dir() == user_cache / "cuda-sass"
    assert machine._roof_cache_path() == user_cache / "cpu-roofs.json"


# ---- cubins: keyed on contents, checked before use ------------------------------------------------
FAKE_NVCC = """#!/bin/sh
# stands in for nvcc: counts its compilations, writes a "cubin" to the file after -o
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 0.0 (a stand-in)"; exit 0; fi
echo compiled >> "$(dirname "$0")/compilations"
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then printf 'a cubin' > "$2"; fi
  shift
done
echo "ptxas info    : Used 8 registers" >&2
"""


@pytest.mark.parametrize("compiler", ["toolkit", "sass"])
def test_a_cubin_is_keyed_on_contents_and_an_emptied_one_is_compiled_again(tmp_path, monkeypatch, compiler):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    module = toolkit if compiler == "toolkit" else sass
    monkeypatch.setattr(module, "nvcc", lambda: str(nvcc))
    if compiler == "toolkit":
        toolkit.nvcc_version.cache_clear()
        monkeypatch.setattr(toolkit, "cache_root", lambda: tmp_path / "cache")
        compile_one = lambda: toolkit.compile_cubin("cuda/naive.cu", "sm_80")[0]  # noqa: E731
    else:
        monkeypatch.setattr(sass, "cache_dir", lambda: tmp_path / "cache" / "cuda-sass")
        compile_one = lambda: sass.compile_cubin("cuda/naive.cu", "sm_80")  # noqa: E731
    compilations = nvcc.parent / "compilations"
    cubins = []
    for checkout in ("here", "moved"):  # the same sources in two places: one key, one compilation
        shutil.copytree(ROOT / "cuda", tmp_path / checkout / "cuda", copy_function=shutil.copy)
        monkeypatch.setattr(sources, "sources_root", lambda checkout=checkout: tmp_path / checkout)
        cubins.append(compile_one())
    assert cubins[0] == cubins[1] and len(compilations.read_text().splitlines()) == 1
    cubins[0].write_bytes(b"")  # emptied since: compiled again, not handed to a loader
    assert compile_one() == cubins[0] and cubins[0].read_bytes() == b"a cubin"
    assert len(compilations.read_text().splitlines()) == 2
    if compiler == "toolkit":
        toolkit.nvcc_version.cache_clear()
