"""The chapter-12 CPU model of the tiled kernel: its product and its load count."""

from __future__ import annotations

import math

import numpy as np
import pytest

import harness
from harness.env.sources import load_python_source

tiling = load_python_source("python/tiling.py")


@pytest.mark.parametrize("tile", [4, 8, 16, 32])
@pytest.mark.parametrize("size", [64, 256])
def test_loads_are_naive_over_tile_when_tile_divides(size, tile):
    a, b = harness.make_inputs(size, "float32")
    c, loads = tiling.tiled_matmul(a, b, tile)
    assert loads == 2 * size**3 // tile == tiling.naive_loads(size, size, size) // tile
    assert harness.check(c, a, b).passed


@pytest.mark.parametrize("m, n, k, tile", [(100, 130, 70, 16), (17, 5, 33, 8), (1, 64, 63, 32), (31, 31, 31, 32)])
def test_loads_are_exact_on_ragged_edges(m, n, k, tile):
    a, b = harness.make_inputs(f"{m}x{n}x{k}", "float32")
    c, loads = tiling.tiled_matmul(a, b, tile)
    # Each output-tile column re-reads all of A's rows it needs, each output-tile row all of B.
    expected = math.ceil(n / tile) * m * k + math.ceil(m / tile) * k * n
    assert loads == expected
    assert harness.check(c, a, b).passed


def test_counts_by_hand_for_one_tile():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    c, loads = tiling.tiled_matmul(a, b, tile=4)
    assert loads == a.size + b.size  # one block, one phase: everything loaded once
    np.testing.assert_array_equal(c, a @ b)


@pytest.mark.parametrize("tile", [0, -1, 2.5])
def test_bad_tile(tile):
    with pytest.raises(ValueError, match="tile"):
        tiling.tiled_matmul(np.ones((2, 2)), np.ones((2, 2)), tile)


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 2\)"):
        tiling.tiled_matmul(np.ones((2, 3)), np.ones((2, 2)))


def test_registered_model_passes_tile_option():
    a, b = harness.make_inputs(40, "float32")
    result = harness.get("python.tiled_model", tile=8)(a, b)
    assert harness.check(result, a, b).passed
