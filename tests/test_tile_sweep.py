"""Exercise C as a command: the tile sweep writes its numbers and its plot, from Python and the CLI."""
from __future__ import annotations

import json

import pytest

import harness
from harness.cli import main
from harness.experiments import tile_sweep

_reason = harness.lookup("c.blocked").unavailable_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"the C library is unavailable: {_reason}")


def test_run_writes_json_and_png(tmp_path):
    data = tile_sweep.run(tmp_path, shape=96, tiles=(4, 16, 64), dtype="float64", min_time=0.01)
    assert [row["tile"] for row in data["sweep"]] == [4, 16, 64]
    assert all(row["status"] == "ok" and row["gflops"] > 0 for row in data["sweep"])
    lines = {line["implementation"]: line for line in data["lines"]}
    assert set(lines) == {"c.naive_ikj", "c.naive_ijk", "c.packed", "numpy.matmul"}
    assert all(line["status"] == "ok" for line in lines.values())
    assert data["best_tile"] in (4, 16, 64)
    written = json.loads((tmp_path / "tile-sweep.json").read_text())
    assert written["shape"] == "96x96x96" and "cpu_model" in written["machine"]
    assert (tmp_path / "tile-sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_naive_ijk_runs_smaller_when_the_shape_is_large(tmp_path, monkeypatch):
    monkeypatch.setattr(tile_sweep, "NAIVE_IJK_MAX", 32)
    data = tile_sweep.run(tmp_path, shape="40x48x56", tiles=(8,), min_time=0.01)
    lines = {line["implementation"]: line for line in data["lines"]}
    assert lines["c.naive_ijk"]["shape"] == "32x32x32"
    assert lines["c.naive_ikj"]["shape"] == "40x48x56"


def test_bad_tiles_are_refused(tmp_path):
    with pytest.raises(ValueError, match="tile sizes must be >= 1"):
        tile_sweep.run(tmp_path, shape=16, tiles=(0, 8))


def test_cli_command(tmp_path, capsys):
    assert main(["tile-sweep", "--shape", "64", "--tiles", "8", "32", "--min-time", "0.01", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tile    8" in out and "numpy.matmul" in out and "best tile" in out
    assert (tmp_path / "tile-sweep.json").is_file() and (tmp_path / "tile-sweep.png").is_file()
