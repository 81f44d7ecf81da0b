"""The command line and the compare API: tables, JSON, CSV and plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness.cli import implementation_table

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd)


def test_list_shows_every_implementation_and_availability():
    done = subprocess.run(
        [sys.executable, "-m", "harness", "list"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ | {"COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80  # an 80-column terminal, reasons wrapped
    for impl in harness.implementations():
        first = next(i for i, line in enumerate(lines) if line.split()[:1] == [impl.name])
        assert impl.device in lines[first].split()
        assert lines[first + 1].lstrip().startswith(("yes", "no: ")), lines[first + 1]  # whether it runs here
    assert any(line.strip() == "yes" for line in lines)


def test_every_commands_help_fits_an_80_column_terminal(monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.setenv("COLUMNS", "80")  # what argparse wraps to

    def help_of(*command):
        with pytest.raises(SystemExit) as done:
            main([*command, "--help"])
        assert done.value.code == 0
        return capsys.readouterr().out

    top = help_of()
    listed = top.split("  COMMAND\n", 1)[1].split("\n\n")[0]  # the commands, one per line, under "COMMAND"
    commands = [line.split()[0] for line in listed.splitlines() if line.startswith("    ") and line[4] != " "]
    assert {"list", "compare", "prefill", "blas-grid", "ab", "report"} <= set(commands)
    for text, command in [(top, "")] + [(help_of(command), command) for command in commands]:
        wide = [line for line in text.splitlines() if len(line) > 80]
        assert not wide, (command, wide)


def test_list_markdown_matches_the_function():
    done = run_cli("list", "--markdown")
    assert done.returncode == 0
    assert done.stdout == implementation_table(markdown=True)


def test_compare_writes_table_json_csv_and_plot(tmp_path):
    out = tmp_path / "out"
    done = run_cli(
        "compare",
        "--shapes",
        "32",
        "16x24x8",
        "--impls",
        "c.*",
        "python.ikj",
        "--dtype",
        "float32",
        "float64",
        "--min-time",
        "0.01",
        "--json",
        str(out / "r.json"),
        "--csv",
        str(out / "r.csv"),
        "--plot",
        str(out / "r.png"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GFLOP/s" in done.stdout and "c.blocked" in done.stdout and "numpy.matmul" in done.stdout
    data = json.loads((out / "r.json").read_text())
    assert data["machine"]["cpu_model"] and "blas" in data["machine"]
    rows = data["results"]
    assert {r["dtype"] for r in rows} == {"float32", "float64"}
    bfloat16_only = [r for r in rows if r["implementation"] == "c.bf16"]  # c.* names it: said, not run
    assert all(r["status"].startswith("skipped") and "bfloat16" in r["status"] for r in bfloat16_only)
    assert all(r["status"] == "ok" and r["gflops"] > 0 for r in rows if r not in bfloat16_only)
    assert (out / "r.csv").read_text().startswith("implementation,")
    assert (out / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_api_rows_and_speedups():
    results = harness.compare([24], ["c.naive_ikj"], "float32", min_time=0.01)
    names = [r.implementation for r in results]
    # the baseline is added, and the peers installed here (BLIS, torch's CPU matmul)
    peers = [
        impl.name
        for impl in harness.implementations()
        if impl.peer and impl.device == "cpu" and impl.available and not impl.weights  # decode peers: decode problems
    ]
    assert names == ["c.naive_ikj", "numpy.matmul", *peers]
    for peer in peers:
        assert peer in results.machine["implementations"] and peer + ": " in str(results)  # which library ran
    row = results.row("c.naive_ikj", 24)
    assert row.passed and row.gflops > 0 and row.speedup > 0 and row.threads == 1
    assert results.row("numpy.matmul", 24).speedup == pytest.approx(1.0)
    assert "c.naive_ikj" in str(results)


def test_compare_reports_refusals_instead_of_failing():
    results = harness.compare(["4096x4096x4096"], ["python.ijk"], "float32", baselines=False)
    (row,) = results.rows
    assert row.status.startswith("skipped:") and "allow_slow" in row.status
    results = harness.compare([8], ["python.tiled_model"], "float64", baselines=False)
    assert results.rows[0].status.startswith("skipped:") and "float64" in results.rows[0].status


def test_compare_marks_a_broken_implementation_failed(monkeypatch):
    from harness.backends import numpy_blas

    class Broken(numpy_blas._NumpyPrepared):
        def run(self):
            super().run()
            self.c[0, 0] += 1.0

    monkeypatch.setattr(numpy_blas, "_NumpyPrepared", Broken)
    results = harness.compare([16], ["numpy.matmul"], "float32", min_time=0.01)
    row = results.rows[0]
    assert row.status.startswith("FAILED") and row.gflops is None  # a wrong product is never timed


def test_unknown_impl_pattern_is_a_one_line_error():
    done = run_cli("compare", "--impls", "nothing-like-this")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
