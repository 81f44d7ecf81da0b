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
    assert (
        main(["tile-sweep", "--shape", "64", "--tiles", "8", "32", "--min-time", "0.01", "--out", str(tmp_path)]) == 0
    )
    out = capsys.readouterr().out
    assert "tile    8" in out and "numpy.matmul" in out and "best tile" in out
    assert (tmp_path / "tile-sweep.json").is_file() and (tmp_path / "tile-sweep.png").is_file()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocked_is_right_at_every_tile_from_1_to_70(dtype):
    # Ragged on every side: no dimension a multiple of a vector or of the widest register
    # chunk, so every tile exercises the wide, halved and zero-padded last chunks.
    a, b = harness.make_inputs(harness.Shape(37, 75, 53), dtype)
    expected = harness.reference(a, b)
    for tile in range(1, 71):
        outcome = harness.check(harness.get("c.blocked", tile=tile)(a, b), a, b, expected)
        assert outcome.passed, (tile, outcome.message)


def test_cache_sizes_are_read_per_level(tmp_path):
    for index, (level, kind, size) in enumerate(
        [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"), (3, "Unified", "105M")]
    ):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        (entry / "level").write_text(f"{level}\n")
        (entry / "type").write_text(f"{kind}\n")
        (entry / "size").write_text(f"{size}\n")
    assert tile_sweep.cache_sizes(tmp_path) == {"l1": 48 * 2**10, "l2": 2 * 2**20, "l3": 105 * 2**20}
    assert tile_sweep.cache_sizes(tmp_path / "missing") == {}


def test_b_tile_is_never_narrower_than_the_register_chunk():
    shape = harness.Shape(1024, 1024, 1024)
    assert tile_sweep.b_tile_bytes(64, shape, 4) == 64 * 64 * 4
    assert tile_sweep.b_tile_bytes(8, shape, 4) == 8 * 64 * 4  # 64 float32 = 256 bytes wide
    assert tile_sweep.b_tile_bytes(8, shape, 8) == 8 * 32 * 8
    assert tile_sweep.b_tile_bytes(1024, harness.Shape(1024, 100, 50), 4) == 50 * 100 * 4


def _sweep_data(caches):
    shape = harness.Shape(1024, 1024, 1024)
    gflops = {8: 20.0, 64: 23.0, 256: 25.0, 1024: 5.0}
    return {
        "shape": str(shape),
        "dtype": "float32",
        "threads": 1,
        "best_tile": 256,
        "caches": caches,
        "sweep": [
            {
                "tile": t,
                "status": "ok",
                "gflops": g,
                "shape": str(shape),
                "b_tile_bytes": tile_sweep.b_tile_bytes(t, shape, 4),
            }
            for t, g in gflops.items()
        ],
        "lines": [{"implementation": "c.naive_ikj", "status": "ok", "gflops": 10.0, "shape": str(shape)}],
    }


def test_findings_name_the_best_tile_the_caches_and_the_fall_past_l2():
    data = _sweep_data({"l1": 48 * 2**10, "l2": 2 * 2**20, "l3": 105 * 2**20})
    text = " ".join(tile_sweep.findings(data))
    assert "best tile 256 (25.0 GFLOP/s, its B tile 256 KiB in L2)" in text
    assert "L1 48 KiB" in text and "L2 2 MiB" in text
    assert "tile 1024's B tile (4 MiB) no longer fits" in text and "at tile 256" in text
    assert "Smallest tile 8: 20.0 GFLOP/s against naive ikj's 10.0" in text
    summary = tile_sweep.summarize(data)
    assert "| `c.blocked` tile 256 | 1024x1024x1024 | 25 |" in summary and "best tile 256" in summary


def test_findings_without_cache_sizes_still_name_the_best_tile():
    text = " ".join(tile_sweep.findings(_sweep_data({})))
    assert "best tile 256 (25.0 GFLOP/s, its B tile 256 KiB)" in text and "L2" not in text
