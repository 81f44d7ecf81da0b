"""q4_K (GGUF's block_q4_K, harness/model/quant.py): quantize byte for byte against llama.cpp's own
quantize_row_q4_K_ref (through harness.backends.llama_cpp.quantize_reference; skipped where
llama.cpp is not built, but a digest of its bytes for one fixed W is checked everywhere),
dequantize bit for bit against the gguf package's, the refusals, the names in any case, and
python.decode on q4_K weights against the float64 product of the weights the format holds."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import harness
from harness.model import quant
from harness.model.checking import check
from harness.model.errors import MatmulInputError, UnavailableError


def _llama_cpp_bytes(w: np.ndarray) -> np.ndarray:
    from harness.backends import llama_cpp

    try:
        return llama_cpp.quantize_reference(w, "q4_K")
    except UnavailableError as error:
        pytest.skip(str(error))


def _gguf_dequantize(data: np.ndarray, n: int) -> np.ndarray:
    gguf = pytest.importorskip("gguf")
    return gguf.quants.dequantize(data.reshape(n, -1), gguf.GGMLQuantizationType.Q4_K)


# Powers of ten as literals (exact to parse, where 10.0 ** e is libm's business).
_MAGNITUDES = np.array([1e-40, 1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 1e2, 1e3, 1e4, 1e5], np.float64)


def _fixed_weights(n: int, k: int) -> np.ndarray:
    """W [N, K] from integer arithmetic alone (no random generator, whose streams may change
    between NumPy versions): a Weyl sequence in [-0.5, 0.5), every other super-block at one
    magnitude of 1e-40 .. 1e5 and the others with each 32-weight sub-block at its own (so that
    within one super-block they differ by up to 1e45), every third sub-block shifted to all
    negative and every fifth to all positive."""
    i = np.arange(n * k, dtype=np.uint64)
    u = ((i * np.uint64(2654435761)) % np.uint64(1 << 32)).astype(np.float64) / float(1 << 32) - 0.5
    sub, block, count = i // np.uint64(32), i // np.uint64(256), np.uint64(_MAGNITUDES.size)
    magnitude = np.where(block % np.uint64(2) == 0, (block * np.uint64(5)) % count, (sub * np.uint64(7)) % count)
    scale = _MAGNITUDES[magnitude.astype(np.intp)]
    shift = np.where(sub % np.uint64(3) == 0, -1.0, np.where(sub % np.uint64(5) == 0, 1.0, 0.0))
    return ((u + shift) * scale).astype(np.float32).reshape(n, k)


def _edge_weights() -> np.ndarray:
    """One super-block (256 weights) per row, each a case of its own."""
    rng = np.random.default_rng(12)
    normal = lambda scale=1.0: (rng.standard_normal(256) * scale).astype(np.float32)  # noqa: E731
    sub_scales = np.repeat(np.array([1e3, 1e-3, 1, 1e-1, 10, 1e-4, 1e2, 1e-2], np.float32), 32)
    rows = {
        "zeros": np.zeros(256, np.float32),
        "signed zeros": np.where(np.arange(256) % 3 == 0, -0.0, 0.0).astype(np.float32),
        "constant positive": np.full(256, 0.75, np.float32),
        "constant negative": np.full(256, -2.5, np.float32),
        "constant sub-blocks": np.repeat(np.array([0, 1, -1, 3.5, -0.01, 7, 0, -100], np.float32), 32),
        "all positive": np.abs(normal()) + np.float32(0.5),
        "all negative": -np.abs(normal()) - np.float32(0.5),
        "ties on a grid": (rng.integers(-8, 8, 256) * 0.25).astype(np.float32),
        "small integers": rng.integers(0, 16, 256).astype(np.float32),
        "one nonzero": np.eye(1, 256, 77, dtype=np.float32)[0] * np.float32(-3),
        "d a float16 subnormal": normal(1e-3),
        "d below float16": normal(1e-6),
        "float32 subnormals": normal(1e-40),
        "the smallest float32": (rng.integers(-3, 4, 256) * np.float32(1.4e-45)).astype(np.float32),
        # sub-blocks whose 6-bit scale rounds to 0: their quants stay those of the search
        "sub-blocks 1e7 apart": normal() * sub_scales,
        # a min of 0 and a small scale: (w + dmin * m) / d far beyond nearest_int's exact range
        "quotients past 2^22": np.concatenate(
            [np.float32(-1e6) + np.float32(0.5) * np.abs(normal()[:32])]
            + [np.float32(-rng.uniform(2000, 7900)) + np.float32(0.02) * np.abs(normal()[:32]) for _ in range(7)]
        ),
        "as large as it goes": np.abs(normal()) * np.float32(1.5e7),
        "as negative as it goes": -np.abs(normal()) * np.float32(1e6),
        "large mixed": normal(1e5),
        "one outlier": np.where(np.arange(256) == 200, np.float32(500), normal(0.01)),
        "cauchy": np.clip(rng.standard_cauchy(256), -1e4, 1e4).astype(np.float32),
    }
    return np.stack(list(rows.values())), list(rows)


# ---- llama.cpp's bytes -----------------------------------------------------------------------

FIXED_SHAPE = (24, 1024)
# sha256 of llama.cpp's quantize_row_q4_K_ref bytes of _fixed_weights(24, 1024) (96 super-blocks),
# recorded from quantize_reference (llama.cpp 0c1e570, ggml 0.25.3) when this test was written;
# test_quantize_gives_llama_cpps_bytes compares the bytes themselves wherever llama.cpp is built.
FIXED_SHA256 = "ef3d2e8eeba6023cfa145346b11e4a0848a0b59dfc56aa6a25c8f6372b2bd238"


def test_quantize_gives_llama_cpps_bytes_for_a_fixed_w_everywhere():
    data = quant.quantize(_fixed_weights(*FIXED_SHAPE), "q4_K").data
    assert hashlib.sha256(data.tobytes()).hexdigest() == FIXED_SHA256, (
        "q4_K's bytes changed: compare them with llama.cpp's (test_quantize_gives_llama_cpps_bytes)"
    )


def test_quantize_gives_llama_cpps_bytes():
    rng = np.random.default_rng(3)
    edge, names = _edge_weights()
    normal = rng.standard_normal((64, 512)).astype(np.float32)
    normal *= np.float32(10.0) ** rng.integers(-4, 4, size=(64, 1)).astype(np.float32)
    cases = {"fixed": _fixed_weights(*FIXED_SHAPE), "normal rows": normal, **{n: r[None] for n, r in zip(names, edge)}}
    for name, w in cases.items():
        before = w.copy()
        ours = quant.quantize(w, "q4_K")
        theirs = _llama_cpp_bytes(w)
        assert ours.data.dtype == np.uint8 and ours.data.ndim == 1 and not ours.data.flags.writeable
        differ = (ours.data != theirs).reshape(-1, 144).any(axis=-1)
        assert not differ.any(), f"{name}: {int(differ.sum())} of {differ.size} super-blocks differ from llama.cpp's"
        np.testing.assert_array_equal(ours.dequantize(), _gguf_dequantize(theirs, w.shape[0]), err_msg=name)
        np.testing.assert_array_equal(w, before)  # W is never modified


def test_the_edge_cases_reach_the_paths_they_name():
    edge, names = _edge_weights()
    blocks = quant.quantize(edge, "q4_K").data.reshape(-1, 144)
    d = blocks[:, 0:2].copy().view("<f2")[:, 0]
    sc, _ = quant._q4_k_scales_and_mins(blocks)
    row = dict(zip(names, range(len(names))))
    assert 0 < d[row["d a float16 subnormal"]] < np.finfo(np.float16).tiny
    assert d[row["d below float16"]] == 0 and d[row["zeros"]] == 0
    qs = blocks[:, 16:].reshape(-1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=-2).reshape(-1, 8, 32)
    j = row["sub-blocks 1e7 apart"]
    assert ((sc[j] == 0) & (q[j] != 0).any(axis=-1)).any()  # quants kept from the search
    w = quant.quantize(edge, "q4_K").dequantize()
    assert np.isfinite(w).all() and abs(w[row["as large as it goes"]]).max() > 1e7


def test_rows_are_quantized_in_chunks_with_the_same_bytes(monkeypatch):
    w = _fixed_weights(9, 512)
    whole = quant.quantize(w, "q4_K").data
    monkeypatch.setattr(quant, "_CHUNK_WEIGHTS", 1024)  # two rows at a time
    np.testing.assert_array_equal(quant.quantize(w, "q4_K").data, whole)
    w[7, 300] = 1e8  # in the fourth chunk: the row is W's, not the chunk's
    with pytest.raises(MatmulInputError, match=r"W row 7, block 1 \(K 256..511\) needs a scale beyond float16"):
        quant.quantize(w, "q4_K")


# ---- dequantize ------------------------------------------------------------------------------


def test_dequantize_matches_ggufs_on_random_bytes():
    rng = np.random.default_rng(4)
    n, per_row = 64, 8
    data = rng.integers(0, 256, size=(n * per_row, 144), dtype=np.uint8)
    scales = rng.integers(0, 1 << 16, size=(n * per_row, 2), dtype=np.uint16)  # d and dmin: any float16 ...
    scales[(scales & 0x7C00) == 0x7C00] ^= 0x0400  # ... but an infinity or NaN (exponent 31), made 30
    data[:, 0:4] = scales.astype("<u2").view(np.uint8)
    w = quant.QuantizedWeights("q4_K", n, 256 * per_row, data.reshape(-1))
    np.testing.assert_array_equal(w.dequantize(), _gguf_dequantize(w.data, n))


def test_dequantize_follows_the_layout():
    block = np.zeros(144, np.uint8)
    block[0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)  # d
    block[2:4] = np.frombuffer(np.float16(0.25).tobytes(), np.uint8)  # dmin
    sc = np.array([1, 2, 3, 63, 17, 32, 48, 5], np.uint8)
    m = np.array([0, 63, 7, 8, 33, 16, 1, 62], np.uint8)
    block[4:8] = sc[:4] | (sc[4:] >> 4) << 6
    block[8:12] = m[:4] | (m[4:] >> 4) << 6
    block[12:16] = (sc[4:] & 15) | (m[4:] & 15) << 4
    q = (np.arange(256) * 7 % 16).astype(np.uint8).reshape(8, 32)
    block[16:] = (q[0::2] | q[1::2] << 4).reshape(-1)  # chunk c: sub-block 2c low, 2c + 1 high
    w = quant.QuantizedWeights("q4_K", 1, 256, block).dequantize().reshape(8, 32)
    np.testing.assert_array_equal(w, 0.5 * sc[:, None].astype(np.float64) * q - 0.25 * m[:, None])


# ---- names, sizes, refusals -----------------------------------------------------------------


def test_names_are_case_insensitive_and_q4_k_is_ggml_type_12():
    for name in ("q4_K", "Q4_K", "q4_k"):
        assert quant.format_of(name).name == "q4_K"
        assert quant.quantize(np.ones((1, 256), np.float32), name).format == "q4_K"
    assert [quant.format_of(name).name for name in ("Q8_0", "q4_0", "BF16")] == ["q8_0", "q4_0", "bf16"]
    info = quant.FORMATS["q4_K"]
    assert (info.block_size, info.bytes_per_block, info.ggml_type, info.bits_per_weight) == (256, 144, 12, 4.5)
    w = quant.quantize(_fixed_weights(3, 512), "Q4_K")
    assert w.nbytes == 3 * 2 * 144 and w.shape == (3, 512) and w.dequantize().dtype == np.float32
    with pytest.raises(ValueError, match="no single scale per block"):
        w.scales()
    assert quant.quantize(np.zeros((0, 256), np.float32), "q4_K").nbytes == 0
    assert quant.quantize(np.zeros((2, 0), np.float32), "q4_K").dequantize().shape == (2, 0)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: quant.quantize(np.ones((2, 300), np.float32), "q4_K"),
            "K = 300 is not a multiple of the block size 256",
        ),
        (
            lambda: quant.quantize(np.ones((2, 32), np.float32), "Q4_K"),
            "K = 32 is not a multiple of the block size 256",
        ),
        (lambda: quant.QuantizedWeights("q4_K", 2, 512, np.zeros(575, np.uint8)), "575 bytes, expected 576"),
        (lambda: quant.quantize(np.array([[1.0] * 255 + [np.nan]], np.float32), "q4_K"), r"NaN values .*\[0, 255\]"),
        (lambda: quant.quantize(np.array([[0.0] * 3 + [-np.inf] * 253], np.float32), "q4_K"), r"NaN .*\[0, 3\]"),
        (lambda: quant.quantize(np.full((1, 512), 7e7, np.float32), "q4_K"), r"W row 0, block 0 .*beyond float16"),
        (lambda: quant.quantize(np.full((1, 256), -5e6, np.float32), "q4_K"), r"W row 0, block 0 .*beyond float16"),
        (lambda: quant.quantize(np.ones((1, 256), np.float32), "q4_k_m"), "unknown weight format 'q4_k_m'"),
    ],
)
def test_bad_q4_k_weights_are_refused_by_name(make, match):
    with pytest.raises(MatmulInputError, match=match):
        make()


@pytest.mark.parametrize(
    "byte, value, what",
    [
        (144 + 1, 0x7C, r"1 block scale\(s\) \(d or dmin\) are infinite or NaN, the first at row 0, block 1 \(K 256"),
        (2 * 144 + 3, 0x7E, r"infinite or NaN, the first at row 1, block 0 \(K 0..255\)"),  # row 1's dmin: NaN
    ],
)
def test_infinite_or_nan_scales_are_refused_where_they_are(byte, value, what):
    data = quant.quantize(_fixed_weights(2, 512), "q4_K").data.copy()
    data[byte - 1], data[byte] = 0x00, value
    with pytest.raises(MatmulInputError, match=what):
        quant.QuantizedWeights("q4_K", 2, 512, data)


# ---- python.decode --------------------------------------------------------------------------


def test_python_decode_takes_q4_k_and_c_decode_does_not():
    assert "q4_K" in harness.lookup("python.decode").weights
    assert "q4_K" not in harness.lookup("c.decode").weights  # c.decode_int8 takes it: tests/test_decode_int8_q4k.py


def test_python_decode_on_q4_k():
    impl = harness.lookup("python.decode")
    for n, k in ((1, 256), (7, 512), (33, 4352)):
        w = quant.quantize(_fixed_weights(n, k) if n == 7 else np.random.default_rng(n).standard_normal((n, k)), "q4_K")
        x_all = np.random.default_rng(k).standard_normal((17, k)).astype(np.float32)
        for m in (1, 2, 17):
            x = x_all[:m]
            prepared = impl.backend.prepare(impl, x, w, dict(impl.options))
            prepared.run()
            y = prepared.result()
            assert y.shape == (m, n) and y.dtype == np.float32
            outcome = check(y, x, w.dequantize().T)
            assert outcome.passed, f"python.decode q4_K {m}x{n}x{k}: {outcome.message}"


def test_the_models_dequantized_blocks_are_quants():
    from harness.env.sources import load_python_source

    model = load_python_source(harness.lookup("python.decode").source)
    w = quant.quantize(_fixed_weights(4, 1024), "q4_K")
    blocks = w.data.reshape(-1, 144)
    ours = np.stack([model.dequantize_block_q4_K(block) for block in blocks])
    np.testing.assert_array_equal(ours, w.dequantize().reshape(-1, 256))


def test_compare_runs_python_decode_on_q4_k():
    results = harness.compare(["4x40x512"], ["python.decode"], weights=["Q4_K"], min_time=0.01, baselines=False)
    row = results.row("python.decode", "4x40x512", weights="q4_K")
    assert row.passed, row.status
