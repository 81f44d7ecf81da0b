#!/usr/bin/env bash
# Every GPU check of the project on a GPU machine, offline: install PyCUDA (and cffi) from files
# carried beside the repository, run the CUDA and Triton GPU tests, run the GPU comparisons and
# the GPU half of the experiments, writing JSON, plots and a report to OUT_DIR.
#
#   scripts/gpu_check.sh OUT_DIR [WHEELS_DIR]
#
# WHEELS_DIR (what scripts/prepare_gpu_wheels.sh made) defaults to $MATMUL_GPU_WHEELS, else
# gpu-wheels/ beside the repository, else build/gpu-wheels/ inside it. PyCUDA is only installed
# when `import pycuda` fails. Needs nvcc (PyCUDA compiles the kernels with it at run time), a
# C++ compiler, and a Python with torch, numpy, setuptools and pytest.
#
# Writes to OUT_DIR: gpu.txt (nvidia-smi), cuda-info.txt (registers, shared memory, spills),
# pytest-gpu.txt (tests and speed targets), gemm.json/.png and gemv.json/.png (comparisons: CUDA,
# Triton and cuBLAS), the experiments' JSON and plots with REPORT.md, and log.txt (everything).
# Exit status: 0 when the install, the tests, the comparisons and the experiments pass.
set -uo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR [WHEELS_DIR]" >&2
    exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
unset MATMUL_CUDA_EMULATE
START=$(date +%s)
STATUS=0
exec > >(tee -a "$OUT/log.txt") 2>&1
log() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*"; }

log "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt" || log "nvidia-smi failed"
"$PYTHON" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"

find_wheels() {
    for dir in "${1:-}" "${MATMUL_GPU_WHEELS:-}" "$ROOT/../gpu-wheels" "$ROOT/build/gpu-wheels"; do
        if [ -n "$dir" ] && ls "$dir"/pycuda-*.tar.gz >/dev/null 2>&1; then
            (cd "$dir" && pwd)
            return 0
        fi
    done
    return 1
}

install_pycuda() {
    local wheels sdist cuda_root work src libdirs=() curand=False d found
    wheels="$(find_wheels "${1:-}")" || { log "no pycuda-*.tar.gz found (run scripts/prepare_gpu_wheels.sh)"; return 1; }
    sdist="$(ls "$wheels"/pycuda-*.tar.gz | sort | tail -n 1)"
    log "installing PyCUDA from $sdist"
    # Its pure-Python requirements first (from the folder, or already installed), and `wheel`,
    # which setuptools < 70.1 needs to build without build isolation.
    "$PYTHON" -m pip install --no-index --find-links "$wheels" pytools platformdirs mako wheel || return 1

    cuda_root="${CUDA_ROOT:-${CUDA_HOME:-}}"
    if [ -z "$cuda_root" ]; then
        command -v nvcc >/dev/null || { log "nvcc not found: set CUDA_ROOT"; return 1; }
        cuda_root="$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)"
    fi
    work="$(mktemp -d)"
    tar xzf "$sdist" -C "$work"
    src="$(ls -d "$work"/pycuda-*/ | head -n 1)"

    # Linking needs libcuda.so (the driver API): a toolkit stub, or the driver's own library.
    for d in "$cuda_root/lib64/stubs" "$cuda_root/lib/stubs" "$cuda_root/targets/x86_64-linux/lib/stubs" \
             /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib; do
        [ -e "$d/libcuda.so" ] && { libdirs+=("$d"); break; }
    done
    if [ ${#libdirs[@]} -eq 0 ]; then
        found="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
        for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
            [ -z "$found" ] && [ -e "$d/libcuda.so.1" ] && found="$d/libcuda.so.1"
        done
        [ -n "$found" ] || { log "no libcuda.so or libcuda.so.1 found"; return 1; }
        mkdir -p "$work/libcuda" && ln -s "$found" "$work/libcuda/libcuda.so"
        libdirs+=("$work/libcuda")
    fi
    # curand is optional for this project: enabled only when the toolkit has it.
    if [ -f "$cuda_root/include/curand.h" ] && ls "$cuda_root"/lib64/libcurand.so* >/dev/null 2>&1; then curand=True; fi
    log "CUDA_ROOT=$cuda_root libcuda in ${libdirs[*]} curand=$curand"
    {
        echo "CUDA_ROOT = '$cuda_root'"
        echo "CUDA_ENABLE_CURAND = $curand"
        echo "CUDADRV_LIB_DIR = ['${libdirs[0]}']"
        echo "CUDART_LIB_DIR = ['$cuda_root/lib64', '$cuda_root/lib']"
        echo "CURAND_LIB_DIR = ['$cuda_root/lib64', '$cuda_root/lib']"
    } > "$src/siteconf.py"
    # Compile in parallel first (pip alone builds serially), then install what was built.
    (cd "$src" && "$PYTHON" setup.py build_ext -j "$(nproc)" >"$OUT/pycuda-build.txt" 2>&1) \
        || log "parallel pre-build failed (see pycuda-build.txt); pip will build serially"
    "$PYTHON" -m pip install --no-index --find-links "$wheels" --no-build-isolation "$src" || return 1
    "$PYTHON" -c "import pycuda.driver as d; d.init(); print('pycuda', d.get_version(), 'driver', d.get_driver_version(), d.Device(0).name())"
}

if ! "$PYTHON" -c "import cffi" 2>/dev/null; then
    wheels="$(find_wheels "${2:-}")" && "$PYTHON" -m pip install --no-index --find-links "$wheels" cffi \
        || log "cffi could not be installed: the C kernels will be listed as unavailable"
fi
if "$PYTHON" -c "import pycuda.driver" 2>/dev/null; then
    log "pycuda already installed"
else
    install_pycuda "${2:-}" || { log "PyCUDA could not be installed"; STATUS=1; }
fi

log "registers and shared memory (ptxas)"
"$PYTHON" -m harness cuda-info | tee "$OUT/cuda-info.txt" || STATUS=1
"$PYTHON" -m harness list || STATUS=1

log "GPU tests"
timeout 240 "$PYTHON" -m pytest -q -rs -s -p no:cacheprovider tests/test_cuda_gpu.py tests/test_triton_gpu.py 2>&1 | tee "$OUT/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || STATUS=1

log "GEMM comparison"
timeout 300 "$PYTHON" -m harness compare --no-progress --threads 0 --min-time 0.2 \
    --shapes 1024 2048 4096 8192 --impls 'cuda.*' 'triton.*' torch.cublas --dtype float32 bfloat16 float16 \
    --json "$OUT/gemm.json" --plot "$OUT/gemm.png" || STATUS=1

log "GEMV comparison"
timeout 120 "$PYTHON" -m harness compare --no-progress --threads 0 --min-time 0.2 \
    --shapes 1x8192x8192 1x16384x16384 --impls cuda.gemv triton.gemv torch.cublas --dtype bfloat16 float32 \
    --json "$OUT/gemv.json" --plot "$OUT/gemv.png" || STATUS=1

log "experiments (GPU half): loads, tile quantization, association, roofline, GEMV bandwidth"
MATMUL_EXPERIMENT_DEVICES=gpu timeout 150 "$PYTHON" -m harness experiments --out "$OUT" \
    --only loads tile-quantization association roofline gemv-bandwidth || STATUS=1

log "done, status $STATUS; results in $OUT"
exit $STATUS
