"""Chapter-12 stretch exercise 1: global-memory loads against tile size, and the shared
memory a tile pair needs.

The tiled kernel loads 2*M*N*K / T elements where the naive one loads 2*M*N*K: the 1/T law.
The CPU model in python/tiling.py counts its loads, so this needs no GPU. A T x T tile of A
plus one of B occupy 2 * T^2 * itemsize bytes of shared memory per block, which must fit the
device's per-block limit.
"""

from __future__ import annotations

from harness.env.sources import load_python_source
from harness.experiments.arguments import count_at_least
from harness.experiments.common import gpu_present, pyplot, write
from harness.model.checking import check
from harness.model.inputs import make_inputs

NAME = "loads"
TITLE = "Loads against tile size (the 1/T law) and shared memory per tile pair"
DURATION = "a few seconds"  # on a 2-core machine, said before it starts

# Documented limits of the H100 and H200 (compute capability 9.0), used when no GPU is at hand:
# 48 KiB of static shared memory per block, up to 227 KiB per block with the opt-in attribute,
# 228 KiB per SM.
HOPPER_SHARED_MEMORY = {
    "device": "H100/H200 (sm_90, documented)",
    "per_block_default": 48 * 1024,
    "per_block_optin": 227 * 1024,
    "per_multiprocessor": 228 * 1024,
}
SHARED_TILES = (16, 32, 64, 128)
DTYPE_BYTES = {"float32": 4, "bfloat16/float16": 2, "float64": 8}


def shared_memory_limits() -> dict:
    if gpu_present():
        import torch

        props = torch.cuda.get_device_properties(0)
        limits = {"device": f"{props.name} (from the device)"}
        for key, attribute in (
            ("per_block_default", "shared_memory_per_block"),
            ("per_block_optin", "shared_memory_per_block_optin"),
            ("per_multiprocessor", "shared_memory_per_multiprocessor"),
        ):
            value = getattr(props, attribute, None)
            limits[key] = int(value) if value else HOPPER_SHARED_MEMORY[key]
        return limits
    return dict(HOPPER_SHARED_MEMORY)


def add_arguments(parser) -> None:

    parser.add_argument("--size", type=count_at_least(1), default=256, help="square size (default 256)")
    parser.add_argument("--tiles", type=count_at_least(1), nargs="+", default=[4, 8, 16, 32])


def run(out_dir, size: int = 256, tiles=(4, 8, 16, 32)) -> dict:
    tiling = load_python_source("python/tiling.py")
    a, b = make_inputs(size, "float32")
    naive = tiling.naive_loads(size, size, size)
    rows = []
    for tile in tiles:
        c, loads = tiling.tiled_matmul(a, b, tile)
        outcome = check(c, a, b)
        if not outcome.passed:
            raise AssertionError(f"tiled_matmul with tile {tile} is wrong: {outcome.message}")
        rows.append(
            {
                "tile": tile,
                "elements_loaded": loads,
                "naive_elements_loaded": naive,
                "naive_over_tiled": naive / loads,
                "law_2MNK_over_T": 2 * size**3 // tile,
                "fp32_intensity_flop_per_byte": tile / 4,
            }
        )
    limits = shared_memory_limits()
    shared = []
    for tile in SHARED_TILES:
        for dtype, itemsize in DTYPE_BYTES.items():
            need = 2 * tile * tile * itemsize
            shared.append(
                {
                    "tile": tile,
                    "dtype": dtype,
                    "bytes": need,
                    "fits_default_per_block": need <= limits["per_block_default"],
                    "fits_optin_per_block": need <= limits["per_block_optin"],
                }
            )

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    left.plot(tiles, [r["elements_loaded"] for r in rows], "o-", label="tiled (counted)")
    left.plot(tiles, [r["law_2MNK_over_T"] for r in rows], "k:", label="2MNK / T")
    left.axhline(naive, color="red", label="naive 2MNK")
    left.set_xscale("log", base=2)
    left.set_yscale("log", base=2)
    left.set_xlabel("tile size T")
    left.set_ylabel("elements loaded from global memory")
    left.set_title(f"{size}x{size}x{size}: loads fall as 1/T")
    left.legend()
    width = 0.25
    for offset, (dtype, _) in enumerate(DTYPE_BYTES.items()):
        values = [s["bytes"] / 1024 for s in shared if s["dtype"] == dtype]
        right.bar([i + (offset - 1) * width for i in range(len(SHARED_TILES))], values, width, label=dtype)
    right.axhline(limits["per_block_default"] / 1024, color="orange", linestyle="--", label="per block (default)")
    right.axhline(limits["per_block_optin"] / 1024, color="red", linestyle="--", label="per block (opt-in)")
    right.set_xticks(range(len(SHARED_TILES)), [f"{t}x{t}" for t in SHARED_TILES])
    right.set_yscale("log", base=2)
    right.set_ylabel("KiB of shared memory for one A tile + one B tile")
    right.set_title(f"shared memory per tile pair vs {limits['device']}", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    return write(out_dir, NAME, {"size": size, "tiles": rows, "shared_memory": shared, "limits": limits}, fig)


def summarize(data: dict) -> str:
    lines = ["| tile | elements loaded | naive / tiled | FP32 intensity (FLOP/byte) |", "|---:|---:|---:|---:|"]
    for r in data["tiles"]:
        lines.append(
            f"| {r['tile']} | {r['elements_loaded']:,} | {r['naive_over_tiled']:.0f}x | "
            f"{r['fp32_intensity_flop_per_byte']:g} |"
        )
    pair = next(s for s in data["shared_memory"] if s["tile"] == 64 and s["dtype"] == "float32")
    limits = data["limits"]
    lines.append("")
    lines.append(
        f"A 64x64 FP32 tile pair needs {pair['bytes'] // 1024} KiB of shared memory: "
        f"{'within' if pair['fits_default_per_block'] else 'over'} the {limits['per_block_default'] // 1024} KiB "
        f"a block gets by default on {limits['device']}, and "
        f"{'within' if pair['fits_optin_per_block'] else 'over'} the {limits['per_block_optin'] // 1024} KiB "
        "opt-in limit."
    )
    return "\n".join(lines)


def findings(data: dict) -> list[str]:
    tiles = ", ".join(f"T={r['tile']}: {r['naive_over_tiled']:.0f}x fewer" for r in data["tiles"])
    exact = all(r["elements_loaded"] == r["law_2MNK_over_T"] for r in data["tiles"])
    return [
        f"loads against the naive kernel at {data['size']}^3: {tiles}",
        "the count is exactly 2MNK/T for every tile" if exact else "the count departs from 2MNK/T (see the JSON)",
    ]
