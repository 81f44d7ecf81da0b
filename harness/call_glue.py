"""The compiled call glue: cffi's "API mode" module for the C library, generated from c/matmul.h.

cffi can call the library two ways. ``ffi.dlopen`` ("ABI mode") needs nothing but the shared
library, but every call goes through libffi's generic argument marshalling. A module that cffi
generates as C source and that is compiled against the header ("API mode") calls each function
directly; on a 2-core Xeon a call of matmul_packed_path_f32 took 0.8 us instead of 1.8, and each
``ffi.from_buffer`` 0.5 instead of 0.8: about 2 us of the 3 a 64^3 product's call used to cost
on top of its 4 us kernel.

CMakeLists.txt runs this file as a script to write the module's C source (it imports nothing
from the harness, so it runs before the package is installed), compiles it against the library
and puts it beside it; harness/clib.py imports it when it is there and falls back to
``ffi.dlopen`` when it is not (no Python headers or no cffi at build time).

    python harness/call_glue.py c/matmul.h build/_matmul_glue.c
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

MODULE_NAME = "_matmul_glue"  # the extension's name: its file is _matmul_glue<EXT_SUFFIX>


def cdef_from_header(header_text: str) -> str:
    """The declarations of c/matmul.h for cffi: comments and preprocessor lines removed."""
    header = re.sub(r"/\*.*?\*/", "", header_text, flags=re.S)
    return "\n".join(line for line in header.splitlines() if not line.lstrip().startswith("#"))


def write_module_source(header: Path, out: Path) -> None:
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(cdef_from_header(header.read_text()))
    ffi.set_source(MODULE_NAME, '#include "matmul.h"')
    ffi.emit_c_code(str(out))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python harness/call_glue.py c/matmul.h OUT.c")
    write_module_source(Path(sys.argv[1]), Path(sys.argv[2]))
