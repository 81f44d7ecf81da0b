"""Where a kernel wants each of its arguments: the parameter layout recorded in its cubin.

A launch through a parameter *buffer* (PyCUDA's prepared_call passes one to cuLaunchKernel as
CU_LAUNCH_PARAM_BUFFER_POINTER) must place every argument at the offset the compiler chose, and
that is not always the packing a C struct of the same members would get. The parameter space
starts at an address of the constant bank that is not 128-byte aligned (0x210 on sm_90), and a
128-byte aligned CUtensorMap parameter is aligned in that bank, not in the buffer: cuda/wgmma.cu's
first tensor map sits 0x70 bytes into its parameters, not at 0. A buffer packed from 0 puts every
argument in the wrong place, and what the kernel then reads as M, N and K past the end of the
buffer is zero: it computes nothing and writes nothing, without any error. (Launches that pass
an array of argument pointers, as CuPy's do, are placed by the driver from this same record.)

The record is the cubin's ELF section ``.nv.info.<kernel>``: a list of attributes, each a format
byte, an attribute byte and a 16-bit value or size. EIATTR_KPARAM_INFO (0x17) holds, per
parameter: index (u32), ordinal (u16), offset (u16) and flags (u32) whose bits 18..31 are the
parameter's size in bytes. ``cuobjdump -elf`` prints the same record.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

KPARAM_INFO = 0x17
SIZED_VALUE = 0x04  # EIFMT_SVAL: a 16-bit size follows, then that many bytes
# The bytes each signature code of plans.Launch takes, and its struct format.
CODES = {"T": (128, "128s"), "P": (8, "Q"), "q": (8, "q"), "i": (4, "i"), "I": (4, "I"), "f": (4, "f")}


@dataclass(frozen=True)
class Parameter:
    ordinal: int  # its position in the kernel's parameter list
    offset: int  # bytes from the start of the parameter buffer
    size: int  # bytes


def _sections(data: bytes) -> dict[str, bytes]:
    """The named sections of a 64-bit little-endian ELF file (a cubin)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file (a cubin)")
    (table,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, table + i * entry_size) for i in range(count)]
    names_at = headers[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return data[start : data.index(b"\0", start)].decode()

    return {name(h[0]): data[h[4] : h[4] + h[5]] for h in headers}


def layout(cubin: bytes, kernel: str) -> list[Parameter]:
    """The parameters of ``kernel`` in ``cubin``, in their order. Raises ValueError when the
    cubin has no parameter record for that kernel."""
    section = _sections(cubin).get(f".nv.info.{kernel}")
    if section is None:
        raise ValueError(f"the cubin has no .nv.info.{kernel} section (no kernel {kernel!r} in it)")
    found, at = [], 0
    while at + 4 <= len(section):
        form, attribute, value = struct.unpack_from("<BBH", section, at)
        at += 4
        if form != SIZED_VALUE:
            continue
        if attribute == KPARAM_INFO:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", section, at)
            found.append(Parameter(ordinal, offset, flags >> 18))
        at += value
    return sorted(found, key=lambda p: p.ordinal)


def buffer_format(kernel: str, signature: str, layout: list[Parameter]) -> str:
    """The struct format of the parameter buffer of a kernel whose arguments have the plan's
    ``signature`` codes, each at its offset in ``layout``: explicit padding, in the native mode
    (the only one PyCUDA's struct packer knows; every offset is naturally aligned, so it adds no
    padding of its own, which is checked). Raises ValueError when the plan and the compiled
    kernel disagree on the arguments."""
    if len(signature) != len(layout):
        raise ValueError(
            f"{kernel}: the launch plan passes {len(signature)} arguments ({signature}), "
            f"the compiled kernel takes {len(layout)}"
        )
    fmt = ""
    for code, parameter in zip(signature, layout):
        if code not in CODES:
            raise ValueError(f"{kernel}: no parameter type for signature code {code!r}")
        size, piece = CODES[code]
        end = struct.calcsize(fmt) if fmt else 0
        if parameter.size != size or parameter.offset < end:
            raise ValueError(
                f"{kernel}: argument {parameter.ordinal} is {size} bytes ({code!r}) in the launch plan, "
                f"{parameter.size} bytes at offset {parameter.offset} in the compiled kernel"
            )
        if parameter.offset > end:
            fmt += f"{parameter.offset - end}x"
        fmt += piece
        if struct.calcsize(fmt) != parameter.offset + size:  # native alignment moved it
            raise ValueError(f"{kernel}: argument {parameter.ordinal} at offset {parameter.offset} is misaligned")
    return fmt
