"""Edited sources take effect: Python sources reload, a stale C library is rebuilt."""
from __future__ import annotations

import os
import time

import pytest

from harness import clib, sources


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


def test_c_library_is_stale_when_a_source_is_newer(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "harness").mkdir()
    (tmp_path / "CMakeLists.txt").write_text("")
    source = tmp_path / "c" / "kernel.c"
    source.write_text("")
    glue = tmp_path / "harness" / "call_glue.py"  # generates the call glue the build compiles
    glue.write_text("")
    library = tmp_path / "libmatmul.so"
    assert clib._is_stale(library, tmp_path)  # missing
    library.write_text("")
    past = time.time() - 100
    for path in (source, glue, tmp_path / "CMakeLists.txt"):
        os.utime(path, (past, past))
    assert clib._is_stale(library, tmp_path)  # no stamp: a build that never finished
    clib._stamp(library).write_text(clib._fingerprint(library))
    assert not clib._is_stale(library, tmp_path)
    future = time.time() + 100
    for newer in (source, glue):
        os.utime(newer, (future, future))
        assert clib._is_stale(library, tmp_path)
        os.utime(newer, (past, past))


def test_c_library_built_on_another_cpu_is_stale(tmp_path, monkeypatch):
    # The checkout's build uses -march=native: a checkout moved to another CPU (a shared home
    # folder, a copied tree) must be rebuilt there, not loaded.
    (tmp_path / "c").mkdir()
    (tmp_path / "harness").mkdir()
    for path in (tmp_path / "CMakeLists.txt", tmp_path / "harness" / "call_glue.py"):
        path.write_text("")
        os.utime(path, (time.time() - 100,) * 2)
    library = tmp_path / "libmatmul.so"
    library.write_text("")
    clib._stamp(library).write_text(clib._fingerprint(library))
    assert not clib._is_stale(library, tmp_path)
    monkeypatch.setattr(clib, "this_cpu", lambda: "another cpu")
    assert clib._is_stale(library, tmp_path)


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
