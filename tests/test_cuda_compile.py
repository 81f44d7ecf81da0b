"""Every CUDA kernel compiles with nvcc for sm_80 and sm_90 (wgmma.cu: sm_90a only), without
spilling registers.

No GPU is needed: nvcc with ``--ptxas-options=-v`` runs the whole device compilation and reports
registers per thread, shared memory per block, stack frame and spills per kernel, which is what
``python -m harness cuda-info`` prints. Results are cached under build/cuda-ptxas/ on the
source text, so an edited kernel is recompiled.
"""

from __future__ import annotations

import re

import pytest
from cuda_launches import planned_launches

import harness
from harness.backends.cuda import emulation, plans, resources, toolkit
from harness.env import sources
from harness.env.sources import source_path

pytestmark = pytest.mark.skipif(toolkit.nvcc() is None, reason="nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda)")

STATIC_SHARED_LIMIT = 48 * 1024  # beyond this a kernel would need dynamic shared memory and an opt-in


@pytest.mark.parametrize("source, arch", [(s, a) for s in toolkit.cuda_sources() for a in toolkit.archs_for(s)])
def test_compiles_without_spills(source, arch):
    kernels, log = resources.compile_with_ptxas(source, arch)
    expected = emulation.kernel_names(source_path(source).read_text())
    assert sorted(k.kernel for k in kernels) == sorted(expected), log
    for k in kernels:
        assert not k.spills, (
            f"{k.kernel} spills registers on {arch}: {k.spill_stores} B stored, {k.spill_loads} B loaded\n{log}"
        )
        assert 0 < k.registers <= 255, log
        assert k.shared_bytes <= STATIC_SHARED_LIMIT, log


def test_wgmma_is_for_sm_90a_only():
    """wgmma, TMA and setmaxnreg exist only in the architecture-specific sm_90a target: plain
    sm_90 refuses them, and a GPU other than sm_90 is told so instead of getting a broken build."""
    assert toolkit.archs_for("cuda/wgmma.cu") == ("sm_90a",)
    with pytest.raises(RuntimeError, match="sm_90a|wgmma|setmaxnreg"):
        resources.compile_with_ptxas("cuda/wgmma.cu", "sm_90")
    from harness.backends.cuda.toolkit import native_arch

    assert native_arch("cuda/wgmma.cu", "sm_90") == "sm_90a"
    assert native_arch("cuda/mma.cu", "sm_90") == "sm_90"
    with pytest.raises(RuntimeError, match="runs on sm_90 only"):
        native_arch("cuda/wgmma.cu", "sm_100")


def test_wgmma_fits_the_register_split_and_dynamic_shared_memory():
    """384 threads at launch get 65536 / 384 -> 168 registers; setmaxnreg then moves them from the
    producer (40) to the consumers (232). The ring lives in dynamic shared memory."""
    kernels, log = resources.compile_with_ptxas("cuda/wgmma.cu", "sm_90a")
    for k in kernels:
        assert k.registers <= 168 and not k.spills, log
        assert k.shared_bytes == 0, log
    launch = plans.plan("wgmma", "bfloat16", 4096, 4096, 4096, sms=132)
    assert launch.grid == (132, 1, 1) and launch.block == (384, 1, 1)
    assert 192 * 1024 < launch.shared_bytes <= 227 * 1024  # H100/H200: at most 227 KiB per block


def test_every_planned_kernel_exists():
    """The launches the harness plans name kernels that the sources define."""
    for impl in harness.implementations("cuda.*"):
        names = emulation.kernel_names(source_path(impl.source).read_text())
        for _, launch in planned_launches(impl):
            assert launch.kernel in names, f"{impl.name} plans {launch.kernel}, not in {impl.source}"
            assert len(launch.signature) == len(launch.args)


def test_compile_error_is_reported(tmp_path, monkeypatch):
    broken = tmp_path / "cuda" / "broken.cu"
    broken.parent.mkdir()
    broken.write_text('extern "C" __global__ void broken(float* x) { x[0] = undeclared; }\n')
    monkeypatch.setattr(sources, "sources_root", lambda: tmp_path)
    with pytest.raises(RuntimeError, match="undeclared"):
        resources.compile_with_ptxas("cuda/broken.cu", "sm_90")


def test_parse_ptxas():
    log = """ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem
"""
    (k,) = resources.parse_ptxas(log, "cuda/x.cu", "sm_90")
    assert (k.registers, k.shared_bytes, k.stack_bytes, k.spills) == (40, 4096, 8, True)


def test_cuda_info_command(capsys):
    from harness.cli import main

    assert main(["cuda-info", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    for source in toolkit.cuda_sources():
        for name in emulation.kernel_names(source_path(source).read_text()):
            assert name in out
    assert "regs/thread" in out and "smem/block" in out


# Static shared memory per block, as each file's `@launch ... static_shared` states it, from the
# file's own tile constants: a lost padding row or a dropped stage (a performance bug, invisible
# to any check of the results) changes what ptxas reports, not what the header says.
@pytest.mark.parametrize("source, arch", [(s, a) for s in toolkit.cuda_sources() for a in toolkit.archs_for(s)])
def test_static_shared_memory_is_what_each_header_states(source, arch):
    kernels, log = resources.compile_with_ptxas(source, arch)
    declared = {spec.technique: spec for spec in plans.launch_specs().values() if spec.source == source}
    for k in kernels:
        (technique,) = [t for t in declared if k.kernel.rsplit("_", 1)[0] == t] or [None]
        assert technique, f"{k.kernel}: {source} declares no `@launch` for it"
        stated = plans.static_shared_bytes(technique)
        assert stated is not None, f"{source}: add `static_shared <bytes>` to `@launch {technique}`"
        assert k.shared_bytes == stated, (
            f"{k.kernel} on {arch} uses {k.shared_bytes} B of static shared memory, its header says {stated}\n{log}"
        )


def _sass_or_skip(source: str, arch: str) -> dict:
    from harness.tooling import sass

    if sass.unavailable_reason() is not None:
        pytest.skip(str(sass.unavailable_reason()))
    return sass.cuda_sass(source, arch)


@pytest.mark.parametrize("kernel", ["mma_bf16", "mma_f16"])
def test_mma_keeps_one_tile_in_flight_while_it_computes(kernel):
    """cp.async.wait_group STAGES - 2 = 1 in the loop: SASS DEPBAR.LE SB0, 0x1. Draining the ring
    (wait_group 0) computes the same and loses the overlap the 3 stages are for."""
    instructions = _sass_or_skip("cuda/mma.cu", "sm_90")[kernel]
    assert any(re.search(r"\bDEPBAR\.LE\s+SB0,\s*0x1\b", i) for i in instructions), [
        i for i in instructions if "DEPBAR" in i
    ]


@pytest.mark.parametrize("kernel", ["wgmma_bf16", "wgmma_f16"])
def test_wgmma_keeps_one_group_in_flight_while_it_issues_the_next(kernel):
    """wgmma.wait_group 1 in the K loop: SASS WARPGROUP.DEPBAR.LE gsb0, 0x1."""
    instructions = _sass_or_skip("cuda/wgmma.cu", "sm_90a")[kernel]
    assert any(re.search(r"\bWARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x1\b", i) for i in instructions), [
        i for i in instructions if "DEPBAR" in i
    ]
