"""torch.int4_gpu (harness/backends/torch_int4.py), torch's int4 weight-only CUDA kernel as a
peer of the q4_0 decode rows: its conversion of q4_0 and the error model it is checked with run
anywhere; the kernel itself runs in the GPU script (tests/test_cuda_gpu.py's loaders not needed)."""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness.backends.torch_int4 import int4_operands
from harness.model import quant
from harness.model.checking import check


def test_q4_0_is_int4_with_its_scales_and_zero_points_zero():
    w = quant.quantize(np.random.default_rng(0).standard_normal((16, 128)).astype(np.float32), "q4_0")
    q, scales = int4_operands(w)
    assert q.dtype == np.uint8 and q.max() <= 15 and scales.shape == (16, 4)
    np.testing.assert_array_equal(np.repeat(scales, 32, axis=1) * (q.astype(np.float32) - 8), w.dequantize())


def test_its_roundings_pass_the_bf16_model_and_not_the_float32_one():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    w = quant.quantize(rng.standard_normal((16, 4096)).astype(np.float32), "q4_0")
    x = rng.standard_normal((3, 4096)).astype(np.float32)
    q, scales = int4_operands(w)
    bf16 = lambda a: torch.tensor(a).bfloat16().float().numpy()  # noqa: E731
    y = bf16(bf16(x) @ (np.repeat(bf16(scales), 32, axis=1) * (q.astype(np.float32) - 8)).T)  # what the kernel does
    assert check(y, x, w.dequantize().T, activation_rounding="bf16").passed
    assert not check(y, x, w.dequantize().T).passed
    wrong = y.copy()
    wrong[0, 0] = -wrong[0, 0] + 1.0  # a sign error is far outside even that model
    assert not check(wrong, x, w.dequantize().T, activation_rounding="bf16").passed
    # a kernel that skips one block of 32 weights of each row is outside it too
    skipped = w.dequantize().copy()
    skipped[:, 64:96] = 0
    dropped = bf16(bf16(x) @ skipped.T)
    assert not check(dropped, x, w.dequantize().T, activation_rounding="bf16").passed


def test_it_is_a_gpu_peer_of_q4_0_only_and_refuses_what_its_layout_cannot_hold():
    impl = harness.lookup("torch.int4_gpu")
    assert impl.peer and impl.device == "gpu" and impl.weights == ("q4_0",) and impl.activation_rounding == "bf16"
    from harness.model.inputs import Shape

    assert impl.backend.shape_problem(impl, Shape(1, 12, 64))
    assert impl.backend.shape_problem(impl, Shape(1, 16, 96))
    assert impl.backend.shape_problem(impl, Shape(1, 4096, 4096)) is None
