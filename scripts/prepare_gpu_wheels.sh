#!/usr/bin/env bash
# Fill build/gpu-wheels/ (ignored by git, inside the repository so it can travel with it) with
# what scripts/gpu_check.sh installs on a GPU machine that has no network. Run it here, on a
# machine with network, then name build/gpu-wheels among the paths the GPU run carries:
#
# - a PyCUDA wheel built here for the GPU machine's Python (PyCUDA publishes no wheels), when
#   this machine has that Python (GPU_PYTHON_BIN, else python3.12 on PATH or under pyenv) and a
#   CUDA toolkit: the GPU machine installs it in a second. Without it the GPU run loads the
#   kernels through CuPy (it never compiles PyCUDA: that would take minutes of the loan);
# - wheels of PyCUDA's pure-Python requirements and of cffi (the C kernels; the GPU image may
#   lack it), for that Python.
#
#   scripts/prepare_gpu_wheels.sh [DEST]        # default DEST: build/gpu-wheels
#
# Environment: GPU_PYTHON (default 3.12), GPU_PYTHON_BIN, PYCUDA_VERSION (default 2026.1),
# PYTHON (default python3), CUDA_HOME (default: found as harness/backends/cuda/toolkit.py does).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/build/gpu-wheels}"
GPU_PYTHON="${GPU_PYTHON:-3.12}"
PYCUDA_VERSION="${PYCUDA_VERSION:-2026.1}"
PYTHON="${PYTHON:-python3}"
ABI="cp${GPU_PYTHON/./}"

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# PyCUDA's requirements (pytools, platformdirs, mako) and theirs (recent pytools needs siphash24
# and typing-extensions; mako needs markupsafe), plus `wheel` (setuptools older than 70.1 needs
# it to build without build isolation), and cffi. Packages already installed there are not used.
"$PYTHON" -m pip download --only-binary :all: --python-version "$GPU_PYTHON" --implementation cp --abi "$ABI" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" pytools platformdirs mako markupsafe siphash24 typing-extensions wheel cffi pycparser

# The PyCUDA wheel, if this machine has the GPU machine's Python and a CUDA toolkit.
find_python() {
    local candidate
    for candidate in "${GPU_PYTHON_BIN:-}" "$(command -v "python$GPU_PYTHON" || true)" \
                     "$HOME"/.pyenv/versions/"$GPU_PYTHON"*/bin/python; do
        # (a version manager's shim is executable but may refuse to run: try it)
        if [ -n "$candidate" ] && "$candidate" -c 'import sys' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}
cuda_root="$(cd "$ROOT" && "$PYTHON" -c 'from harness.backends.cuda import toolkit; print(toolkit.cuda_root() or "")' 2>/dev/null || true)"
if ! gpu_python="$(find_python)"; then
    echo "no python$GPU_PYTHON here: no PyCUDA wheel (the GPU run will use CuPy)"
elif [ -z "$cuda_root" ]; then
    echo "no CUDA toolkit here (include/cuda.h): no PyCUDA wheel (the GPU run will use CuPy)"
else
    # The sdist, only to build the wheel from (PyCUDA's build requirements are not needed to download it).
    "$PYTHON" -m pip download --no-deps --no-binary pycuda -d "$work" "pycuda==$PYCUDA_VERSION"
    "$gpu_python" -m venv "$work/venv"
    "$work/venv/bin/python" -m pip install --quiet numpy setuptools wheel pytools platformdirs mako
    # Linking needs a libcuda.so; the driver is on the GPU machine only, so link against an
    # empty stub that carries the real library's soname: the symbols resolve there, at load time.
    mkdir -p "$work/stub"
    echo "" | gcc -shared -x c - -o "$work/stub/libcuda.so" -Wl,-soname,libcuda.so.1
    tar xzf "$work/pycuda-$PYCUDA_VERSION.tar.gz" -C "$work"
    src="$work/pycuda-$PYCUDA_VERSION"
    cat > "$src/siteconf.py" <<SITECONF
CUDA_ROOT = '$cuda_root'
CUDA_ENABLE_CURAND = False
CUDADRV_LIB_DIR = ['$work/stub']
CUDART_LIB_DIR = ['$cuda_root/lib64']
SITECONF
    # --no-as-needed before -lcuda: the stub defines nothing, and the dependency must stay.
    (cd "$src" && LDFLAGS="-Wl,--no-as-needed" "$work/venv/bin/python" setup.py build_ext -j "$(nproc)" >"$work/build.log" 2>&1 \
        && LDFLAGS="-Wl,--no-as-needed" "$work/venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DEST" .) \
        || { tail -n 30 "$work/build.log"; echo "building the PyCUDA wheel failed (the GPU run will use CuPy)"; }
fi
rm -f "$DEST"/pycuda-*.tar.gz  # an earlier version's sdist: the GPU run no longer builds one

echo "ready: $DEST ($(du -sh "$DEST" | cut -f1); name build/gpu-wheels among the paths the GPU run carries)"
ls -1 "$DEST"
