"""torch's int4 weight-only GEMM on a CUDA GPU, as a peer of the q4_0 decode rows (torch.int4_gpu;
torch.int4, backends/peers.py, is the CPU kernel of the same family).

``torch.ops.aten._weight_int4pack_mm(x, packed, 32, scales_and_zeros)`` is the kernel PyTorch
(and torchao's int4 weight-only quantization, gpt-fast) runs for int4 weights: X in bfloat16,
W as 4-bit integers q in 0..15 in the layout ``_convert_weight_to_int4pack`` makes, one
bfloat16 (scale, zero) per group of 32 weights along K, weight = (q - 8) * scale + zero, the
products summed in FP32 and Y returned in bfloat16.

Its format is not one of quant.py's, so prepare (not timed) converts: q4_0's nibbles are the
same 4-bit integers (weight = d * (nibble - 8)), so q = nibble, scale = d and zero = 0 give
the q4_0 weights, except that the scale is rounded from float16 to bfloat16. X is rounded to
bfloat16 and so is Y: the row is checked with those roundings allowed on top of the float32
model (``activation_rounding="bf16"``, harness/model/activation_error.py), a worst-case bound of
about 3 * 2^-8 of sum |x w| per output. The bytes it reads per weight are those of q4_0 less
the scales' share plus the zeros' (4 bytes per 32 weights, 4.5 bits a weight as q4_0's).

Needs a CUDA GPU and a torch with these two operators (2.2 and later); K a multiple of 64 and
N of 8 (the packed layout's tiles), else the row is refused by name.
"""

from __future__ import annotations

import numpy as np

from harness.backends import gpu
from harness.backends.decode import decode_inputs
from harness.model.core import Backend, Implementation, MatmulInputError, Prepared
from harness.model.quant import int4_operands
from harness.model.registry import register
from harness.model.timing import Timing

GROUP = 32
INNER_K_TILES = 2  # K must be a multiple of 32 * INNER_K_TILES


class _Prepared(Prepared):
    def __init__(self, x: np.ndarray, weights):
        import torch

        q, scales = int4_operands(weights)
        device_q = torch.from_numpy(q.astype(np.int32)).to("cuda")
        # _convert_weight_to_int4pack takes [N, K / 2] uint8, two weights a byte, even k in the high nibble
        pairs = (device_q[:, ::2] << 4 | device_q[:, 1::2]).to(torch.uint8)
        self.packed = torch._convert_weight_to_int4pack(pairs, INNER_K_TILES)
        s = torch.from_numpy(scales).to("cuda").to(torch.bfloat16)  # [N, K/32]
        # [K/32, N, 2]: each group's (scale, zero) contiguous, groups along K outermost
        self.scales_and_zeros = torch.stack([s, torch.zeros_like(s)], dim=2).transpose(0, 1).contiguous()
        self.x = gpu.to_device(x).to(torch.bfloat16)
        self.y = None
        torch.cuda.synchronize()

    def launch(self) -> None:
        import torch

        self.y = torch.ops.aten._weight_int4pack_mm(self.x, self.packed, GROUP, self.scales_and_zeros)

    def run(self) -> None:
        import torch

        self.launch()
        torch.cuda.synchronize()

    def time(self, min_time: float) -> Timing:
        return gpu.time_cuda(self.launch, min_time)

    def result(self) -> np.ndarray:
        return gpu.to_numpy(self.y.float())


class TorchInt4Backend(Backend):
    def unavailable_reason(self, impl):
        reason = gpu.cuda_unavailable_reason()
        if reason:
            return reason
        import torch

        missing = [op for op in ("_convert_weight_to_int4pack", "_weight_int4pack_mm") if not hasattr(torch, op)]
        return f"this torch ({torch.__version__}) lacks torch.{', torch.'.join(missing)}" if missing else None

    def shape_problem(self, impl, shape) -> str | None:
        if shape.k % (GROUP * INNER_K_TILES) or shape.n % 8:
            return f"needs K a multiple of {GROUP * INNER_K_TILES} and N of 8 (its packed layout's tiles)"
        return None

    def prepare(self, impl, a, b, options):

        x, w = decode_inputs(impl, a, b)
        if w.k % (GROUP * INNER_K_TILES) or w.n % 8:
            raise MatmulInputError(
                f"{impl.name} needs K a multiple of {GROUP * INNER_K_TILES} and N of 8 (its packed layout's tiles), "
                f"got N = {w.n}, K = {w.k}"
            )
        return _Prepared(x, w)

    def peak_gflops(self, impl, dtype):
        return gpu.peak_for(impl.operation, dtype)


register(
    Implementation(
        name="torch.int4_gpu",
        language="torch",
        device="gpu",
        dtypes=("float32",),
        weights=("q4_0",),
        summary="torch's int4 weight-only GEMM (_weight_int4pack_mm): q4_0's nibbles, bf16 scale and zero per 32, "
        "bf16 X and Y (a peer)",
        backend=TorchInt4Backend(),
        requires=("gpu", "torch"),
        peer=True,
        activation_rounding="bf16",
    )
)
