"""Every argument of every planned CUDA launch lands where the compiled kernel reads it.

PyCUDA launches with one parameter buffer, laid out by a struct format; the kernel reads each
parameter at the offset its cubin records. The first H200 run of cuda/wgmma.cu packed its two
128-byte tensor maps from offset 0, while the cubin wants the first at 0x70: the kernel read
M = N = K = 0 past the end of the buffer and returned without computing or writing anything.
No GPU is needed to see that: nvcc writes the layout into the cubin.
"""

from __future__ import annotations

import struct

import pytest
from cuda_launches import planned_launches

import harness
from harness.backends.cuda import loaders, parameters, toolkit

pytestmark = pytest.mark.skipif(toolkit.nvcc() is None, reason="nvcc not found (PATH, $CUDA_HOME, /usr/local/cuda)")


def launches_on_every_arch():
    """(source, arch, launch) for every kernel the harness plans, on every architecture it is built for."""
    found = {}
    for impl in harness.implementations("cuda.*"):
        for _, launch in planned_launches(impl):
            for arch in toolkit.archs_for(impl.source):
                found[(impl.source, arch, launch.kernel)] = launch
    return [(source, arch, launch) for (source, arch, _), launch in sorted(found.items())]


class FakeFunction:
    def prepare(self, format):
        self.format = format


class FakeDriver:
    """Just enough of pycuda.driver for PyCudaLoader.load to prepare a function."""

    class function_attribute:
        MAX_DYNAMIC_SHARED_SIZE_BYTES = "max dynamic shared"

    def module_from_buffer(self, image):
        function = FakeFunction()
        function.set_attribute = lambda *_: None
        return type("Module", (), {"get_function": lambda _self, name: function})()


def distinct_values(signature: str) -> list:
    """One recognisable value per argument: a tensor map's bytes, a pointer, an int."""
    values = []
    for i, code in enumerate(signature):
        if code == "T":
            values.append(bytes([i + 1]) * 128)
        elif code == "P":
            values.append(0x1000_0000_0000 + i)
        else:
            values.append(1000 + i)
    return values


@pytest.mark.parametrize("source, arch, launch", launches_on_every_arch(), ids=lambda v: getattr(v, "kernel", v))
def test_the_loaders_parameter_buffer_puts_each_argument_where_the_cubin_reads_it(source, arch, launch):
    cubin, _ = toolkit.compile_cubin(source, arch)
    layout = parameters.layout(cubin.read_bytes(), launch.kernel)
    loader = object.__new__(loaders.PyCudaLoader)  # without PyCUDA or a GPU
    loader.driver = FakeDriver()
    launcher = loader.load(cubin, launch.kernel, launch.signature, launch.shared_bytes)
    fmt = launcher.module.get_function(launch.kernel).format
    values = distinct_values(launch.signature)
    buffer = struct.pack(fmt, *values)
    assert len(buffer) == layout[-1].offset + layout[-1].size
    for code, value, parameter in zip(launch.signature, values, layout):
        size, piece = parameters.CODES[code]
        (read,) = struct.unpack_from(piece, buffer, parameter.offset)
        assert read == value, f"{launch.kernel}: argument {parameter.ordinal} is not at offset {parameter.offset}"


def test_a_plan_that_disagrees_with_the_compiled_kernel_is_refused():
    cubin, _ = toolkit.compile_cubin("cuda/wgmma.cu", "sm_90a")
    layout = parameters.layout(cubin.read_bytes(), "wgmma_bf16")
    with pytest.raises(ValueError, match="wgmma_bf16: the launch plan passes 5 arguments"):
        parameters.buffer_format("wgmma_bf16", "TTPii", layout)
    with pytest.raises(ValueError, match="argument 0 is 8 bytes .'P'. in the launch plan, 128 bytes"):
        parameters.buffer_format("wgmma_bf16", "PTPiii", layout)
    with pytest.raises(ValueError, match="no .nv.info.nothing_here section"):
        parameters.layout(cubin.read_bytes(), "nothing_here")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        parameters.layout(b"not a cubin at all", "wgmma_bf16")
