#!/usr/bin/env bash
# Fill a folder with everything scripts/gpu_check.sh needs to install PyCUDA on a GPU machine that
# has no network: the PyCUDA source distribution (PyCUDA publishes no wheels; it is built there,
# against that machine's CUDA and NumPy) and wheels of its pure-Python dependencies for that
# machine's Python.
#
#   scripts/prepare_gpu_wheels.sh [DEST]        # default DEST: gpu-wheels/ beside the repository
#
# Environment: GPU_PYTHON (default 3.12), PYCUDA_VERSION (default 2026.1), PYTHON (default python3).
# Run it on any machine with network; copy DEST next to the repository on the GPU machine (or pass
# it to gpu_check.sh as its second argument).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/../gpu-wheels}"
GPU_PYTHON="${GPU_PYTHON:-3.12}"
PYCUDA_VERSION="${PYCUDA_VERSION:-2026.1}"
PYTHON="${PYTHON:-python3}"
ABI="cp${GPU_PYTHON/./}"

mkdir -p "$DEST"
# The sdist. --no-build-isolation: pip only reads its metadata, with this machine's setuptools,
# instead of installing a build environment first.
"$PYTHON" -m pip download --no-deps --no-binary :all: --no-build-isolation -d "$DEST" "pycuda==$PYCUDA_VERSION"

# PyCUDA's requirements (pytools, platformdirs, mako) and theirs (recent pytools needs siphash24
# and typing-extensions; mako needs markupsafe), as wheels for the GPU machine's Python, plus
# `wheel` (setuptools older than 70.1 needs it to build without build isolation), and cffi (the
# harness's C kernels; the GPU image lacks it). Packages already installed there are not used.
"$PYTHON" -m pip download --only-binary :all: --python-version "$GPU_PYTHON" --implementation cp --abi "$ABI" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" pytools platformdirs mako markupsafe siphash24 typing-extensions wheel cffi pycparser

echo "ready: $DEST"
ls -1 "$DEST"
