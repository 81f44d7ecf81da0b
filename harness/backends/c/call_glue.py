"""The C library's declarations, gathered from its sources, and the compiled call glue built from them.

Every function the harness calls is marked where it is defined, in its ``c/*.c`` file, with
``MATMUL_API`` (a macro of c/matmul.h) just before its return type::

    MATMUL_API int TYPED(matmul_blocked)(const real *A, ..., int64_t tile) {

The declarations for cffi are gathered from those definitions (``exported_functions``): the
text from after ``MATMUL_API`` to the end of the parameter list, with ``restrict`` dropped.
In a file that includes ``real.h`` (compiled once per element type, CMakeLists.txt) each one
is declared twice, ``TYPED(name)`` becoming ``name_f32`` over ``float`` and ``name_f64`` over
``double``. So a new C file needs no header edit: its marked functions are found because the
file is there. A name marked in two files is refused with both files named (the linker would
refuse them too, less clearly); one file may define a name more than once with the same
declaration (alternatives under ``#if``).

cffi can call the library two ways. ``ffi.dlopen`` ("ABI mode") needs nothing but the shared
library, but every call goes through libffi's generic argument marshalling. A module that cffi
generates as C source and that is compiled with the declarations ("API mode") calls each function
directly, with a fraction of the overhead per call and per ``ffi.from_buffer``: at 64^3 that
overhead is as long as the kernel (``pytest --benchmark-only -k call_overhead`` measures it).

CMakeLists.txt runs this file as a script to write the module's C source (it imports nothing
from the harness, so it runs before the package is installed), compiles it against the library
and puts it beside it; harness/backends/c/clib.py imports it when it is there and falls back to
``ffi.dlopen`` when it is not (no Python headers or no cffi at build time).

    python harness/backends/c/call_glue.py c build/_matmul_glue.c
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

MODULE_NAME = "_matmul_glue"  # the extension's name: its file is _matmul_glue<EXT_SUFFIX>
MARK = "MATMUL_API"
TYPES = {"f32": "float", "f64": "double"}  # what real.h's TYPED suffixes mean


class DeclarationError(ValueError):
    """A MATMUL_API mark that cannot be turned into a declaration, or one name marked twice."""


@dataclass(frozen=True)
class Export:
    name: str
    declaration: str  # a C prototype, ending in ";"
    file: str  # the source it is defined in, as c/<file>.c


def source_files(folder: Path) -> list[Path]:
    """The C sources whose marked functions the library exports (CMakeLists.txt compiles the same)."""
    return sorted(Path(folder).glob("*.c"))


def _code(text: str) -> str:
    """``text`` without comments and preprocessor lines (which may hold the mark's own #define)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: " " + "\n" * m[0].count("\n"), text, flags=re.S)
    return "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())


def _declarations_in(path: Path) -> list[Export]:
    text = path.read_text()
    where = f"c/{path.name}"
    typed = re.search(r'^#include "real\.h"', text, flags=re.M) is not None
    code = _code(text)  # line for line the same as text
    found = []
    for mark in re.finditer(rf"\b{MARK}\b", code):
        end = re.search(r"[{;]", code[mark.end() :])
        head = " ".join(code[mark.end() : mark.end() + end.start()].split()) if end else ""
        if not re.fullmatch(r"[\w\s*]+?(?:\w+|TYPED\(\w+\))\s*\(.*\)", head):
            line = code.count("\n", 0, mark.start()) + 1
            raise DeclarationError(
                f"{where}:{line}: {MARK} must be followed by a function's return type, name and "
                f"parameters, as in `{MARK} int matmul_x_f32(const float *A, ...) {{`; found `{head[:80]}`"
            )
        head = re.sub(r"\brestrict\b\s*", "", head)
        if "TYPED(" in head and not typed:
            raise DeclarationError(
                f"{where}: uses TYPED(...) in a {MARK} declaration but does not "
                '#include "real.h", so it is compiled once, with no element type'
            )
        variants = (
            [
                re.sub(r"\breal\b", ctype, re.sub(r"TYPED\((\w+)\)", rf"\1_{suffix}", head))
                for suffix, ctype in TYPES.items()
            ]
            if "TYPED(" in head
            else [head]
        )
        for declaration in variants:
            name = re.search(r"(\w+)\s*\(", declaration)[1]
            found.append(Export(name, declaration + ";", where))
    return found


def exported_functions(folder: Path) -> dict[str, Export]:
    """Every MATMUL_API function of the C sources in ``folder``, by name, in file order."""
    exports: dict[str, Export] = {}
    for path in source_files(folder):
        for export in _declarations_in(path):
            earlier = exports.get(export.name)
            if earlier is None:
                exports[export.name] = export
            elif earlier.file != export.file:
                raise DeclarationError(
                    f"{export.name} is marked {MARK} in both {earlier.file} and {export.file}: a function "
                    "of the library is defined in one file; rename one of them"
                )
            elif earlier.declaration != export.declaration:
                raise DeclarationError(
                    f"{export.file} defines {export.name} twice with different parameters: "
                    f"`{earlier.declaration}` and `{export.declaration}`"
                )
    return exports


def cdef_from_sources(folder: Path) -> str:
    """The declarations for cffi: one prototype a line, plain C (no macros, no comments)."""
    return "\n".join(export.declaration for export in exported_functions(folder).values()) + "\n"


def write_module_source(folder: Path, out: Path) -> None:
    import cffi

    cdef = cdef_from_sources(folder)
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(MODULE_NAME, "#include <stdint.h>\n" + cdef)  # the same prototypes, compiled
    ffi.emit_c_code(str(out))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python harness/backends/c/call_glue.py c OUT.c")
    try:
        write_module_source(Path(sys.argv[1]), Path(sys.argv[2]))
    except DeclarationError as error:
        sys.exit(f"error: {error}")
