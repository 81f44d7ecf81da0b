"""Nothing passes that shouldn't, nothing is lost, nothing hangs: what users' mistakes and
machines' faults do. Each section is one class of fault, each test one way to meet it."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness
from harness.model import registry
from harness.model.core import Implementation

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


# ---- inputs no row can change --------------------------------------------------------------------
def writable_alias(x: np.ndarray) -> np.ndarray:
    """A writable array over ``x``'s memory, as C sees it: NumPy's read-only flag stops nothing there."""
    pointer = ctypes.cast(x.ctypes.data, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(pointer, shape=x.shape)


class _Writer(harness.Prepared):
    """A Prepared whose run() does what ``behaviour`` says to its inputs, and returns its product."""

    mode = "native"

    def __init__(self, a, b, behaviour):
        self.a, self.b, self.behaviour, self.calls, self.c = a, b, behaviour, 0, None

    def run(self):
        self.calls += 1
        self.c = self.behaviour(self)

    def result(self):
        return self.c


def zero_a_and_return_zeros(p):
    p.a[...] = 0  # a Python kernel that writes into A: NumPy refuses, the inputs are read-only
    return np.zeros((p.a.shape[0], p.b.shape[1]), np.float32)


def double_a_through_a_pointer(p):
    writable_alias(p.a)[...] *= 2  # what a C kernel could do: the product of the doubled A
    return np.matmul(p.a, p.b)


def zero_a_through_a_pointer_and_return_zeros(p):
    writable_alias(p.a)[...] = 0
    return np.zeros((p.a.shape[0], p.b.shape[1]), np.float32)


def double_a_on_the_second_call(p):
    product = np.matmul(p.a, p.b)
    if p.calls == 2:
        writable_alias(p.a)[...] *= 2
    return product


class _WriterBackend(harness.Backend):
    def __init__(self, behaviour):
        self.behaviour = behaviour

    def unavailable_reason(self, impl):
        return None

    def prepare(self, impl, a, b, options):
        return _Writer(a, b, self.behaviour)


def register_writer(monkeypatch, behaviour) -> str:
    name = "test.writer"
    impl = Implementation(
        name=name,
        language="python",
        device="cpu",
        dtypes=("float32",),
        summary="writes into its inputs",
        backend=_WriterBackend(behaviour),
    )
    monkeypatch.setitem(registry.REGISTRY, name, impl)
    return name


@pytest.mark.parametrize(
    "behaviour, said",
    [
        (zero_a_and_return_zeros, "tried to write into its inputs"),
        (double_a_through_a_pointer, "wrote into its input A"),
        (zero_a_through_a_pointer_and_return_zeros, "wrote into its input A"),
        (
            double_a_on_the_second_call,
            "wrote into its input A (inputs are read-only; a matmul must not change them) while it was timed",
        ),
    ],
)
def test_an_implementation_that_writes_into_its_inputs_fails_and_the_rows_after_it_do_not(monkeypatch, behaviour, said):
    name = register_writer(monkeypatch, behaviour)
    results = harness.compare(["16x8x12"], [name], ["float32"], min_time=0.001)
    writer, baseline = results.row(name, "16x8x12"), results.row("numpy.matmul", "16x8x12")
    assert writer.status.startswith("FAILED") and said in writer.status, writer.status
    assert writer.gflops is None  # never timed as a pass
    assert baseline.passed, baseline.status  # the next row multiplies the untouched inputs


def test_the_reference_is_computed_before_the_first_row_runs(monkeypatch):
    # A writer that returns the product of the inputs it doubled would pass against a reference
    # computed afterwards from those inputs; it must be checked against the untouched ones.
    name = register_writer(monkeypatch, double_a_through_a_pointer)
    compare_module = sys.modules["harness.run.compare"]  # (harness.compare is also the function)
    seen = []
    original = compare_module.reference_data
    monkeypatch.setattr(compare_module, "reference_data", lambda a, b: seen.append(a.copy()) or original(a, b))
    results = harness.compare(["8"], [name], ["float32"], baselines=False, min_time=0.001)
    assert not results.rows[0].passed
    (a_seen,) = seen
    np.testing.assert_array_equal(a_seen, harness.make_inputs("8", "float32")[0])


def test_an_experiment_reports_an_implementation_that_writes_into_its_inputs(monkeypatch):
    from harness.experiments import common

    name = register_writer(monkeypatch, double_a_through_a_pointer)
    a, b = common.inputs(harness.parse_shape("8"), "float32")
    entry = common.measure(name, a, b, min_time=0.001)
    assert "wrote into its input A" in entry["skipped"]
    fresh = common.inputs(harness.parse_shape("8"), "float32")[0]  # what it wrote into is forgotten
    np.testing.assert_array_equal(fresh, harness.make_inputs("8", "float32")[0])


# ---- one parser for switches ---------------------------------------------------------------------
SPELLINGS = [
    ("1", True),
    ("true", True),
    ("True", True),
    ("YES", True),
    ("on", True),
    (" On ", True),
    ("0", False),
    ("false", False),
    ("False", False),
    ("no", False),
    ("NO", False),
    ("off", False),
    ("Off", False),
]


@pytest.mark.parametrize("value, meaning", SPELLINGS)
def test_every_boolean_spelling_means_what_it_says(monkeypatch, value, meaning):
    from harness.backends.cuda import emulation
    from harness.env.switches import switch
    from harness.model.core import slow_allowed

    for name in ("MATMUL_ALLOW_SLOW", "MATMUL_CUDA_EMULATE", "MATMUL_REQUIRE_GPU"):
        monkeypatch.setenv(name, value)
        assert switch(name) is meaning
    assert slow_allowed(None) is meaning
    assert emulation.emulation_requested() is meaning


def test_allow_slow_false_refuses_what_it_would_allow(monkeypatch):
    from harness.model.core import check_problem

    monkeypatch.setenv("MATMUL_ALLOW_SLOW", "False")
    with pytest.raises(harness.MatmulInputError, match="too long"):
        check_problem(harness.lookup("python.ijk"), harness.parse_shape(1024), "float32")
    monkeypatch.setenv("MATMUL_ALLOW_SLOW", "yes")
    check_problem(harness.lookup("python.ijk"), harness.parse_shape(1024), "float32")


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_switch_is_its_default(monkeypatch, value):
    from harness.env.switches import switch

    monkeypatch.setenv("MATMUL_ALLOW_SLOW", value)
    assert switch("MATMUL_ALLOW_SLOW") is False and switch("MATMUL_ALLOW_SLOW", default=True) is True


@pytest.mark.parametrize("value", ["maybe", "2", "y", "enabled", "nope"])
def test_a_switch_that_is_neither_yes_nor_no_is_a_clear_error(monkeypatch, value):
    from harness.env.switches import SwitchError, switch

    monkeypatch.setenv("MATMUL_CUDA_EMULATE", value)
    with pytest.raises(SwitchError, match=f"MATMUL_CUDA_EMULATE='{value}' is neither yes nor no") as caught:
        switch("MATMUL_CUDA_EMULATE")
    assert "1/true/yes/on" in str(caught.value) and "0/false/no/off" in str(caught.value)


def test_the_command_line_refuses_an_unreadable_switch_before_it_starts():
    done = run_cli("compare", "--shapes", "8", "--impls", "numpy.matmul", env={"MATMUL_ALLOW_SLOW": "maybe"})
    assert done.returncode == 2 and "MATMUL_ALLOW_SLOW='maybe' is neither yes nor no" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "matmul" not in done.stdout  # nothing ran


# ---- errors a person reads, exit codes a script can trust -----------------------------------------
def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``python -m harness ARGS`` in this process: (exit code, stdout, stderr). A usage error
    exits through SystemExit; anything else escaping would be the traceback a user sees."""
    from harness.cli import main

    try:
        code = main(list(args))
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


BAD_COMPARISONS = {
    "empty": "",
    "cut short": '{"results": [{"implementation": "cuda.wmma", "sha',
    "not JSON": "<html>502 Bad Gateway</html>",
    "a list": "[]",
    "null": "null",
    "rows without names": '{"results": [{"status": "ok"}]}',
    "a speedup in words": '{"results": [{"implementation": "cuda.mma", "shape": "4096x4096x4096", '
    '"dtype": "bfloat16", "status": "ok", "median_s": 1.0, "speedup": "fast"}]}',
    "a machine that is a string": '{"results": [], "machine": "H200"}',
}


@pytest.mark.parametrize("kind", list(BAD_COMPARISONS))
def test_verdicts_on_a_file_that_is_not_a_comparison_is_one_line_and_exit_2(tmp_path, capsys, kind):
    path = tmp_path / "comparison.json"
    path.write_text(BAD_COMPARISONS[kind])
    code, out, err = cli(capsys, "verdicts", str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"verdicts: {path}") and len(err.strip().splitlines()) == 1, err


def test_verdicts_on_a_missing_file_says_so(tmp_path, capsys):
    code, _, err = cli(capsys, "verdicts", str(tmp_path / "nothing.json"))
    assert code == 2 and "cannot read" in err and "No such file" in err


def test_report_leaves_out_a_corrupt_json_names_it_and_exits_1(tmp_path, capsys):
    from harness.experiments import EXPERIMENTS

    EXPERIMENTS["loads"].run(tmp_path, size=32, tiles=(4, 8))
    (tmp_path / "association.json").write_text('{"experiment": "association", "rows": [')
    (tmp_path / "roofline.json").write_text('{"experiment": "roofline"}')  # valid JSON, not roofline's
    code, out, err = cli(capsys, "report", str(tmp_path))
    assert code == 1 and "wrote" in out
    assert "association.json is not valid JSON" in err and "roofline.json is not what" in err
    report = (tmp_path / "REPORT.md").read_text()
    assert "![loads](loads.png)" in report and "## Left out" in report and "association.json" in report


def test_report_with_only_corrupt_json_writes_nothing(tmp_path, capsys):
    (tmp_path / "loads.json").write_text("")
    code, _, err = cli(capsys, "report", str(tmp_path))
    assert code == 1 and "no readable experiment results" in err and "loads.json" in err
    assert not (tmp_path / "REPORT.md").exists()


@pytest.fixture(scope="module")
def foreign_library(tmp_path_factory) -> Path:
    """A shared library with the one function the loader probes first, and none of the matmuls."""
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a stand-in library")
    folder = tmp_path_factory.mktemp("foreign")
    (folder / "foreign.c").write_text(
        "#include <stdint.h>\nint64_t matmul_build_missing_isa(char *out, int64_t size) "
        "{ if (size) out[0] = 0; return 0; }\n"
    )
    library = folder / "libforeign.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(folder / "foreign.c")], check=True)
    return library


def test_a_c_library_without_our_functions_is_a_reported_fault_not_an_attribute_error(foreign_library, tmp_path):
    done = run_cli(
        "compare",
        "--shapes",
        "8",
        "--impls",
        "c.packed",
        "c.naive_ikj",
        "--no-progress",
        "--json",
        str(tmp_path / "r.json"),
        env={"MATMUL_C_LIBRARY": str(foreign_library)},
    )
    assert "Traceback" not in done.stderr and "AttributeError" not in done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {row["implementation"]: row["status"] for row in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert rows["numpy.matmul"] == "ok"
    for name in ("c.packed", "c.naive_ikj"):
        assert rows[name].startswith(f"error: MATMUL_C_LIBRARY={foreign_library} lacks"), rows[name]
        assert "not a build of this project's C sources" in rows[name]
    listing = run_cli("list", env={"MATMUL_C_LIBRARY": str(foreign_library)})
    assert listing.returncode == 0 and "no: MATMUL_C_LIBRARY" in listing.stdout


def test_compare_exits_1_when_a_named_implementation_errs_and_only_the_baseline_ran():
    done = run_cli(
        "compare",
        "--shapes",
        "8",
        "--impls",
        "c.naive_ikj",
        "--no-progress",
        env={"MATMUL_C_LIBRARY": "/nonexistent/libmatmul.so"},
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    words = " ".join(done.stdout.split())  # the message wraps at the terminal's width (COLUMNS)
    assert "numpy.matmul" in words and "error: cannot load the C library /nonexistent" in words


def test_an_implementation_this_machine_cannot_run_is_reported_not_failed(monkeypatch):
    monkeypatch.delenv("MATMUL_CUDA_EMULATE", raising=False)
    if harness.lookup("cuda.tiled").unavailable_reason() is None:
        pytest.skip("cuda.tiled runs here")
    done = run_cli(
        "compare",
        "--shapes",
        "8",
        "--impls",
        "c.naive_ikj",
        "cuda.tiled",
        "--no-progress",
        env={"MATMUL_CUDA_EMULATE": "0"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not run here" in done.stdout and "cuda.tiled" in done.stdout


def test_an_unusable_tmpdir_is_named_when_the_c_library_cannot_be_had(monkeypatch, tmp_path):
    from harness.backends.c import clib

    def build_fails():
        raise clib.CLibraryError("building the C library failed: cannot create temporary file\n(full log: x)")

    monkeypatch.setattr(clib, "load", build_fails)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "gone"))
    reason, broken = harness.lookup("c.blocked").availability()
    assert broken and f"TMPDIR={tmp_path / 'gone'} is not a writable folder" in reason


@pytest.mark.parametrize("seed", ["-1", "x", "1.5"])
def test_a_bad_seed_is_a_usage_error(capsys, seed):
    code, out, err = cli(capsys, "compare", "--shapes", "8", "--impls", "numpy.matmul", "--seed", seed)
    assert code == 2 and "invalid seed" in err and out == ""
    with pytest.raises(ValueError, match="seed must be a whole number >= 0"):
        harness.compare(["8"], "numpy.matmul", seed=-1)


def test_more_threads_than_cores_is_a_usage_error(capsys):
    from harness.env.cores import usable_cores

    too_many = str(usable_cores() + 1)
    code, out, err = cli(capsys, "compare", "--shapes", "8", "--impls", "numpy.matmul", "--threads", too_many)
    assert code == 2 and f"--threads {too_many}: this process may use {usable_cores()} core(s)" in err
    code, _, err = cli(capsys, "association", "--size", "8", "--threads", too_many)
    assert code == 2 and "--threads" in err
    code, _, err = cli(capsys, "compare", "--shapes", "8", "--impls", "numpy.matmul", "--threads", "-1")
    assert code == 2
    with pytest.raises(ValueError, match="threads must be a whole number from 1 to"):
        harness.compare(["8"], "numpy.matmul", threads=100000)


def test_check_compares_dtypes_by_value_whatever_their_byte_order():
    a = np.arange(12, dtype=">f4").reshape(3, 4)
    b = np.ones((4, 2), ">f4")
    assert harness.check(np.matmul(a, b).astype(np.float32), a, b).passed  # native result, big-endian problem
    assert harness.check(np.matmul(a, b), a, b).passed
    assert not harness.check(np.matmul(a, b).astype(np.float64), a, b).passed  # a different dtype still fails


# ---- outputs written whole or not at all ---------------------------------------------------------
def disk_full(monkeypatch, error=None):
    """A fake full disk: the flush to the disk at the end of every write fails, as a full disk does."""
    import errno

    from harness.env import files

    def full(descriptor):
        raise error or OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)


def leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name.endswith(".partial"))


@pytest.fixture(scope="module")
def small_results():
    return harness.compare(["8"], ["numpy.matmul"], ["float32"], min_time=0.001)


@pytest.mark.parametrize("writer", ["to_json", "to_csv", "plot"])
def test_a_full_disk_leaves_the_previous_file_whole_and_no_partial_one(monkeypatch, tmp_path, small_results, writer):
    path = tmp_path / f"out.{ {'to_json': 'json', 'to_csv': 'csv', 'plot': 'png'}[writer] }"
    getattr(small_results, writer)(path)
    before = path.read_bytes()
    disk_full(monkeypatch)
    with pytest.raises(OSError, match="No space left") as caught:
        getattr(small_results, writer)(path)
    assert caught.value.filename == str(path)
    assert path.read_bytes() == before and leftovers(tmp_path) == []


def test_a_write_cut_short_by_ctrl_c_leaves_no_file(monkeypatch, tmp_path, small_results):
    disk_full(monkeypatch, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        small_results.to_json(tmp_path / "out.json")
    assert list(tmp_path.iterdir()) == []


def test_compare_on_a_full_disk_says_so_without_a_traceback(monkeypatch, tmp_path, capsys):
    target = tmp_path / "r.json"
    target.write_text('{"kept": true}')
    disk_full(monkeypatch)
    code, out, err = cli(
        capsys, "compare", "--shapes", "8", "--impls", "numpy.matmul", "--no-progress", "--json", str(target)
    )
    assert code == 1 and f"cannot write {target}: No space left on device" in err
    assert target.read_text() == '{"kept": true}' and leftovers(tmp_path) == []


def test_experiment_files_and_reports_are_written_whole(monkeypatch, tmp_path):
    from harness.experiments import EXPERIMENTS
    from harness.tooling.report import write_report

    EXPERIMENTS["loads"].run(tmp_path, size=32, tiles=(4, 8))
    write_report(tmp_path)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    disk_full(monkeypatch)
    with pytest.raises(OSError):
        EXPERIMENTS["loads"].run(tmp_path, size=32, tiles=(4, 8))
    with pytest.raises(OSError):
        write_report(tmp_path)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_experiment_json_is_strict(tmp_path):
    from harness.experiments import common

    figure = common.pyplot().figure()
    data = common.write(
        tmp_path, "strict", {"roof": float("inf"), "ratio": np.float32("nan"), "n": np.int64(3)}, figure
    )
    text = (tmp_path / "strict.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    written = json.loads(text)
    assert written["roof"] is None and written["ratio"] is None and written["n"] == 3 and data["n"] == 3


def test_an_experiment_refuses_an_unwritable_out_before_it_measures(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for command in (["association", "--size", "8"], ["experiments", "--only", "loads"]):
        code, out, err = cli(capsys, *command, "--out", str(blocker / "results"))
        assert code == 2 and f"cannot write into {blocker / 'results'}" in err, err
        assert "==" not in out  # nothing was measured


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_folder_is_refused_before_anything_runs(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        done = run_cli("association", "--size", "8", "--out", str(folder))
        assert done.returncode == 2 and "cannot write into" in done.stderr and "==" not in done.stdout
        done = run_cli("compare", "--shapes", "8", "--impls", "numpy.matmul", "--json", str(folder / "r.json"))
        assert done.returncode == 2 and "cannot write" in done.stderr
    finally:
        folder.chmod(0o755)


# the roof cache: a per-user file every comparison reads
MEASURED = {
    "float32": {"best": 100.0, "median": 95.0},
    "float64": {"best": 50.0, "median": 48.0},
    "read_gbps": {"best": 20.0, "median": 19.0},
}
KEY = "a CPU | avx2 fma"


@pytest.fixture
def roof_cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "matmul-reference" / "cpu-roofs.json"


@pytest.mark.parametrize(
    "text",
    [
        "null",
        "[]",
        '"a string"',
        "{",
        "",
        "\x00\xff",
        json.dumps({KEY: None}),
        json.dumps({KEY: []}),
        json.dumps({KEY: {"float32": "fast"}}),
        json.dumps({KEY: {"float32": {"best": "1e9"}}}),
        json.dumps({KEY: {"float32": {"best": 1e30}}}),
        f'{{"{KEY}": {{"float32": {{"best": Infinity}}}}}}',
        f'{{"{KEY}": {{"float32": {{"best": NaN}}}}}}',
        json.dumps({KEY: {"float32": {"best": -5.0}}}),
        json.dumps({KEY: {"float32": {"best": True}}}),
        json.dumps({KEY: {"float32": {"best": 200.0, "median": "x"}}}),
    ],
)
def test_a_malformed_roof_cache_is_treated_as_absent_and_rewritten(roof_cache, text):
    from harness.run import machine

    roof_cache.parent.mkdir(parents=True)
    roof_cache.write_text(text, encoding="latin-1")
    assert machine.remember_roofs(KEY, MEASURED) == MEASURED
    assert json.loads(roof_cache.read_text()) == {KEY: MEASURED}  # strict JSON, only good values


def test_a_better_kept_roof_survives_and_other_machines_entries_are_kept(roof_cache):
    from harness.run import machine

    roof_cache.parent.mkdir(parents=True)
    other = {"another CPU | avx512f": {"float32": {"best": 250.0, "median": 240.0}}}
    roof_cache.write_text(json.dumps({**other, KEY: {"float32": {"best": 120.0, "median": 90.0}}}))
    kept = machine.remember_roofs(KEY, MEASURED)
    assert kept["float32"] == {"best": 120.0, "median": 90.0} and kept["float64"] == MEASURED["float64"]
    assert json.loads(roof_cache.read_text()) == {**other, KEY: kept}


CONCURRENT_WRITER = """
import sys
from harness.run import machine
me, rounds = int(sys.argv[1]), int(sys.argv[2])
for round in range(1, rounds + 1):
    machine.remember_roofs(f"writer {me}", {"float32": {"best": float(round), "median": 1.0}})
    machine.remember_roofs("shared", {"float32": {"best": float(100 * me + round), "median": 1.0}})
"""


def test_concurrent_writers_keep_every_entry_and_the_best_value(roof_cache):
    writers, rounds = 8, 15
    env = {**os.environ, "XDG_CACHE_HOME": str(roof_cache.parents[1])}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_WRITER, str(me), str(rounds)],
            cwd=ROOT,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in range(writers)
    ]
    for process in processes:
        assert process.wait(timeout=120) == 0, process.stderr.read()
    kept = json.loads(roof_cache.read_text())
    assert {f"writer {me}" for me in range(writers)} <= set(kept)  # no update lost
    assert all(kept[f"writer {me}"]["float32"]["best"] == rounds for me in range(writers))
    assert kept["shared"]["float32"]["best"] == 100 * (writers - 1) + rounds
    assert leftovers(roof_cache.parent) == []


# ---- read-only checkouts, and locks that never follow a symlink ----------------------------------
def test_an_emulated_kernel_already_built_runs_without_taking_the_build_lock(monkeypatch):
    from harness.backends.cuda import emulation

    if emulation.emulation_unavailable_reason():
        pytest.skip(emulation.emulation_unavailable_reason())
    monkeypatch.setenv("MATMUL_CUDA_EMULATE", "1")
    a, b = harness.make_inputs("17x9x5", "float32")
    harness.get("cuda.tiled")(a, b)  # built (or found built) once

    def read_only_checkout(*args):
        raise OSError(30, "Read-only file system", str(emulation.emu_build_dir() / ".build.lock"))

    monkeypatch.setattr(emulation, "interprocess_lock", read_only_checkout)
    assert harness.check(harness.get("cuda.tiled")(a, b), a, b).passed
    results = harness.compare(["17x9x5"], ["cuda.tiled"], ["float32"], baselines=False)
    assert results.rows[0].passed, results.rows[0].status


@pytest.mark.parametrize("dangling", [False, True])
def test_a_build_lock_never_follows_a_symlink(tmp_path, dangling):
    from harness.backends.c import clib

    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("precious")
    build = tmp_path / "build"
    build.mkdir()
    (build / ".build.lock").symlink_to(victim)
    with pytest.raises(OSError, match="symlink"):
        with clib.interprocess_lock(build):
            pytest.fail("locked through a symlink")
    assert victim.read_text() == "precious" if not dangling else not victim.exists()


def test_a_build_lock_is_taken_and_released(tmp_path):
    from harness.backends.c import clib

    with clib.interprocess_lock(tmp_path / "build"):
        assert (tmp_path / "build" / ".build.lock").is_file()
    with clib.interprocess_lock(tmp_path / "build"):  # released: it can be taken again
        pass


# ---- budgets in seconds --------------------------------------------------------------------------
def stand_in(name: str):
    from harness.model.core import run_mode

    impl = harness.lookup(name)
    reason = impl.unavailable_reason()
    if reason:
        pytest.skip(f"{name}: {reason}")
    if run_mode(impl) == "native":
        pytest.skip(f"{name} runs natively here")
    return impl


def test_a_stand_in_is_refused_by_its_time_not_its_flops(monkeypatch):
    from harness.model.core import check_problem

    monkeypatch.delenv("MATMUL_ALLOW_SLOW", raising=False)
    gemv, matmul = stand_in("triton.gemv"), stand_in("triton.matmul")
    wide = harness.parse_shape("1x1000000x1")  # 2e6 FLOPs, 62,500 interpreted programs
    assert wide.flops < harness.parse_shape(128).flops
    check_problem(matmul, harness.parse_shape(128), "float32")  # more FLOPs, a few programs: runs
    with pytest.raises(harness.MatmulInputError) as refused:
        check_problem(gemv, wide, "float32")
    message = str(refused.value)
    assert "runs interpreted" in message and "about 6 minutes" in message
    assert "allow_slow=True" in message and "--allow-slow" in message and "MATMUL_ALLOW_SLOW=1" in message
    check_problem(gemv, harness.parse_shape("1x64x64"), "float32")


def test_the_emulated_gemv_of_a_million_outputs_is_refused(monkeypatch):
    from harness.model.core import check_problem

    monkeypatch.setenv("MATMUL_CUDA_EMULATE", "1")
    monkeypatch.delenv("MATMUL_ALLOW_SLOW", raising=False)
    gemv = stand_in("cuda.gemv")
    with pytest.raises(harness.MatmulInputError, match=r"runs emulated .* \(about \d+ seconds\)"):
        check_problem(gemv, harness.parse_shape("1x1000000x1"), "float32")
    check_problem(gemv, harness.parse_shape("1x4096x4096"), "float32")  # 131,072 threads: a second or so


def test_the_overrides_still_lift_a_time_refusal(monkeypatch):
    from harness.model.core import check_problem

    gemv = stand_in("triton.gemv")
    wide = harness.parse_shape("1x1000000x1")
    monkeypatch.delenv("MATMUL_ALLOW_SLOW", raising=False)
    check_problem(gemv, wide, "float32", allow_slow=True)
    monkeypatch.setenv("MATMUL_ALLOW_SLOW", "on")
    check_problem(gemv, wide, "float32")


def test_compare_refuses_the_slow_interpreted_gemv_at_once_and_says_how_long():
    stand_in("triton.gemv")
    done = run_cli(
        "compare",
        "--shapes",
        "1x1000000x1",
        "--impls",
        "triton.gemv",
        "--no-progress",
        env={"MATMUL_ALLOW_SLOW": "0", "COLUMNS": "200"},
        timeout=60,
    )
    assert "Traceback" not in done.stderr
    assert "triton.gemv: runs interpreted on the CPU here and would take too long (about 6 minutes)" in done.stdout
    assert "--allow-slow" in done.stdout


# ---- Ctrl-C within a second or two ---------------------------------------------------------------
INTERRUPTED_CALL = """
import sys
import harness
a, b = harness.make_inputs(2048, "float32")
multiply = harness.get("c.naive_ijk")  # about a minute at 2048^3
print("calling", flush=True)
try:
    multiply(a, b)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print("finished", flush=True)
"""


def interrupt(process: subprocess.Popen, after_s: float) -> tuple[str, str]:
    import time

    time.sleep(after_s)
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=15)  # the C call alone would take far longer
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("still running 15 s after Ctrl-C: the C call was not interruptible")


def test_ctrl_c_interrupts_a_long_c_call_at_once():
    if harness.lookup("c.naive_ijk").unavailable_reason():
        pytest.skip(harness.lookup("c.naive_ijk").unavailable_reason())
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_CALL], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout.readline().strip() == "calling"
    out, err = interrupt(process, after_s=1.5)  # by then it is inside the C call
    assert out.strip() == "interrupted" and process.returncode == 130, err


def test_ctrl_c_during_compare_ends_as_sigint_with_a_message_and_writes_nothing(tmp_path):
    if harness.lookup("c.naive_ijk").unavailable_reason():
        pytest.skip(harness.lookup("c.naive_ijk").unavailable_reason())
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "compare",
            "--shapes",
            "2048",
            "--impls",
            "c.naive_ijk",
            "--no-baseline",
            "--no-progress",
            "--json",
            str(tmp_path / "r.json"),
            "--plot",
            str(tmp_path / "r.png"),
        ],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = interrupt(process, after_s=4)
    assert process.returncode == -signal.SIGINT, out + err  # a shell's $? says 130
    assert "interrupted (Ctrl-C)" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


# The command line's main, made to meet a Ctrl-C inside an exec() (as dataclasses and namedtuple
# run one while torch imports) or in plain code, and to handle it as main does.
CTRL_C_INSIDE = """
import os, runpy, signal, sys
import harness.cli

def main():
    try:  # the signal raises KeyboardInterrupt in the loop that follows it
        if sys.argv[1] == "exec":
            exec("os.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass")
        else:
            os.kill(os.getpid(), signal.SIGINT)
            while True:
                pass
    except KeyboardInterrupt:
        print("handled", flush=True)
        return harness.cli.INTERRUPTED

harness.cli.main = main
runpy.run_module("harness", run_name="__main__")
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("where", ["exec", "plain code"])
def test_a_handled_ctrl_c_ends_the_command_as_sigint_wherever_it_arrived(where, tmp_path):
    """CPython 3.11 ends a process whose KeyboardInterrupt passed through an exec() by SIGINT
    even when the program caught it; the command ends that way every time, so callers see one
    status (a shell's $? is 130 for it)."""
    (tmp_path / "ctrl_c_inside.py").write_text(CTRL_C_INSIDE)
    done = subprocess.run(  # run with -m, as python -m harness is: -c exits another way
        [sys.executable, "-m", "ctrl_c_inside", where], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "handled", done.stderr
    assert done.returncode == -signal.SIGINT, done.stderr
    assert "Traceback" not in done.stderr


def test_an_interruptible_call_returns_what_the_call_returns_and_raises_what_it_raises():
    from harness.backends.c import call_interruptibly

    assert call_interruptibly(lambda x, y: x * y, (6, 7)) == 42
    with pytest.raises(ZeroDivisionError):
        call_interruptibly(lambda x: 1 / x, (0,))


def test_long_c_calls_and_only_long_ones_take_the_interruptible_path(monkeypatch):
    from harness.backends import c

    calls = []
    original = c.call_interruptibly
    monkeypatch.setattr(
        c, "call_interruptibly", lambda function, args: calls.append(args[3:6]) or original(function, args)
    )
    backend = harness.lookup("c.naive_ikj").backend
    small = harness.make_inputs(16, "float32")
    harness.get("c.naive_ikj")(*small)
    assert calls == []
    monkeypatch.setattr(backend, "fastest_gflops", 1e-6)  # as if this kernel were slow enough for any call
    mm = harness.get("c.naive_ikj")
    np.testing.assert_array_equal(mm(*small), harness.get("c.naive_ikj")(*small))
    prepared = mm.prepare(*small)
    prepared.run()
    assert harness.check(prepared.result(), *small).passed
    assert calls and all(shape == (16, 16, 16) for shape in calls)
