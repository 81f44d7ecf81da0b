"""Edited sources take effect: Python sources reload, a stale C library is rebuilt."""

from __future__ import annotations

import os
import time

import pytest

from harness.backends.c import clib
from harness.env import sources


def test_python_source_reloads_after_an_edit(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "sources_root", lambda: tmp_path)
    (tmp_path / "python").mkdir()
    path = tmp_path / "python" / "edited.py"
    path.write_text("VALUE = 1\n")
    assert sources.load_python_source("python/edited.py").VALUE == 1
    path.write_text("VALUE = 2\n")
    later = time.time() + 5
    os.utime(path, (later, later))  # a distinct mtime even on coarse-grained filesystems
    assert sources.load_python_source("python/edited.py").VALUE == 2


def _fake_checkout(root):
    (root / "c").mkdir()
    (root / clib.CALL_GLUE_SOURCE).parent.mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("")
    (root / clib.CALL_GLUE_SOURCE).write_text("")  # generates the call glue the build compiles
    (root / clib.FAST_CALL_SOURCE).write_text("")  # compiled beside it
    (root / "c" / "kernel.c").write_text("int kernel;\n")
    return root / "libmatmul.so"


def test_c_library_is_stale_when_a_source_changes(tmp_path):
    library = _fake_checkout(tmp_path)
    assert clib._is_stale(library, tmp_path)  # missing
    library.write_bytes(b"a library")
    assert clib._is_stale(library, tmp_path)  # no stamp: a build that never finished
    clib.write_stamp(library, tmp_path)
    assert not clib._is_stale(library, tmp_path)
    inputs = ("c/kernel.c", clib.CALL_GLUE_SOURCE, clib.FAST_CALL_SOURCE, "CMakeLists.txt")
    for edited in (tmp_path / name for name in inputs):
        before = edited.read_text()
        edited.write_text(before + "/* edited */\n")
        assert clib._is_stale(library, tmp_path), edited
        edited.write_text(before)  # the same contents again: current, whatever the file's time
        assert not clib._is_stale(library, tmp_path)
    (tmp_path / "c" / "new.h").write_text("")  # a new header is a new input
    assert clib._is_stale(library, tmp_path)


def test_c_library_staleness_reads_contents_not_times(tmp_path):
    library = _fake_checkout(tmp_path)
    library.write_bytes(b"a library")
    clib.write_stamp(library, tmp_path)
    future = time.time() + 100
    for path in (tmp_path / "c" / "kernel.c", tmp_path / "CMakeLists.txt", library):
        os.utime(path, (future, future))  # what `cp -r` does to every file, in some order
    assert not clib._is_stale(library, tmp_path)
    library.write_bytes(b"a librar")  # truncated since its build: same time, other bytes
    os.utime(library, (future, future))
    assert clib._is_stale(library, tmp_path)


def test_c_library_built_on_another_cpu_is_stale(tmp_path, monkeypatch):
    # The checkout's build uses -march=native: a checkout moved to another CPU (a shared home
    # folder, a copied tree) must be rebuilt there, not loaded.
    library = _fake_checkout(tmp_path)
    library.write_bytes(b"a library")
    clib.write_stamp(library, tmp_path)
    assert not clib._is_stale(library, tmp_path)
    monkeypatch.setattr(clib, "this_cpu", lambda: "another cpu")
    assert clib._stale_reason(library, tmp_path) == clib.BUILT_ON_ANOTHER_CPU


def test_a_library_compiled_for_instructions_this_cpu_lacks_is_refused_by_name():
    import cffi

    ffi = cffi.FFI()

    class BuiltForAvx512:  # what build_isa.c answers on an AVX2-only CPU for an AVX-512 build
        @staticmethod
        def matmul_build_missing_isa(out, size):
            ffi.memmove(out, b"avx512f avx512bw\0", 17)
            return 2

    with pytest.raises(clib.CLibraryBuiltForAnotherCPU, match=r"lacks \(avx512f, avx512bw\).*MATMUL_NATIVE=OFF"):
        clib._refuse_if_built_for_another_cpu("libmatmul.so", ffi, BuiltForAvx512())

    class NotOurs:  # dlopen'ed a library without the symbol
        pass

    with pytest.raises(clib.CLibraryError, match=r"no matmul_build_missing_isa\(\)"):
        clib._refuse_if_built_for_another_cpu("libother.so", ffi, NotOurs())


def test_checkout_uses_checkout_sources():
    assert sources.in_checkout()
    assert (sources.sources_root() / "c" / "matmul.h").is_file()
    assert "matmul_blocked_f32" in clib.cdef_text() and "#" not in clib.cdef_text()


def test_every_registered_c_kernel_is_declared_by_its_own_source():
    # The declarations come from the MATMUL_API definitions of c/*.c: each C implementation's
    # functions are found in the file it names as its source.
    from harness import implementations

    exports = clib.exported_functions()
    for impl in implementations():
        if impl.language == "c" and impl.source and impl.source.startswith("c/"):
            # a backend that calls other functions than matmul_<kernel>_f32 / _f64 names them
            functions = getattr(impl.backend, "functions", None) or [
                f"matmul_{impl.backend.kernel}_{suffix}" for suffix in ("f32", "f64")
            ]
            for function in functions:
                assert exports[function].file == impl.source, impl.name
    assert "matmul_build_missing_isa" in exports and "matmul_packed_blocking" in exports


def _c_folder(tmp_path, files: dict[str, str]):
    folder = tmp_path / "c"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_a_file_that_includes_real_h_exports_each_marked_function_once_per_type(tmp_path):
    from harness.backends.c import call_glue

    folder = _c_folder(
        tmp_path,
        {
            "mine.c": (
                '#include "matmul.h"\n#include "real.h"\n'
                "static void helper(void) {}\n"
                "/* MATMUL_API in a comment is not a mark */\n"
                "MATMUL_API int TYPED(matmul_mine)(const real *restrict A, const real *B, real *C,\n"
                "                                  int64_t M, int64_t N, int64_t K, int64_t tile) { return 0; }\n"
                "#if X\nMATMUL_API double matmul_mine_clock(void) { return 1; }\n"
                "#else\nMATMUL_API double matmul_mine_clock(void) { return 2; }\n#endif\n"
            )
        },
    )
    assert call_glue.cdef_from_sources(folder).splitlines() == [
        "int matmul_mine_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K, int64_t tile);",
        "int matmul_mine_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K, int64_t "
        "tile);",
        "double matmul_mine_clock(void);",
    ]
    import cffi

    cffi.FFI().cdef(call_glue.cdef_from_sources(folder))  # what cffi is given parses


def test_a_function_marked_in_two_files_is_a_clear_error(tmp_path, monkeypatch):
    from harness.backends.c import call_glue

    folder = _c_folder(
        tmp_path,
        {
            "first.c": '#include "real.h"\nMATMUL_API void TYPED(matmul_twice)(const real *A) {}\n',
            "second.c": "MATMUL_API void matmul_twice_f32(const float *A) {}\n",
        },
    )
    with pytest.raises(
        call_glue.DeclarationError, match=r"matmul_twice_f32 is marked MATMUL_API in both c/first.c and c/second.c"
    ):
        call_glue.exported_functions(folder)
    monkeypatch.setattr(sources, "source_path", lambda relative: tmp_path / relative)
    with pytest.raises(clib.CLibraryError, match=r"c/first.c and c/second.c"):
        clib.cdef_text()


def test_a_mark_that_is_not_a_plain_declaration_is_refused_with_its_line(tmp_path):
    from harness.backends.c import call_glue

    folder = _c_folder(tmp_path, {"odd.c": "\n\nMATMUL_API static inline NOT A DECLARATION;\n"})
    with pytest.raises(call_glue.DeclarationError, match=r"c/odd.c:3: MATMUL_API must be followed"):
        call_glue.exported_functions(folder)
    folder = _c_folder(tmp_path / "untyped", {"untyped.c": "MATMUL_API void TYPED(matmul_u)(const real *A) {}\n"})
    with pytest.raises(call_glue.DeclarationError, match=r'does not #include "real.h"'):
        call_glue.exported_functions(folder)
