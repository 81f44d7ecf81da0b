#!/usr/bin/env bash
# Every GPU check of the project, as one command with a hard deadline, on a GPU machine that
# may have no network and no PyCUDA:
#
#   scripts/gpu_check.sh OUT_DIR
#
# Steps, in order of value; each gets what is left of the deadline, up to its own cap:
#   environment  nvidia-smi, Python packages, the CUDA toolkit found, compute-sanitizer
#   loaders      PyCUDA from build/gpu-wheels (a prebuilt wheel, else its sdist compiled here);
#                if that fails the kernels still run, through the CuPy fallback loader
#   compile      every kernel compiled for this GPU, with registers and spills (cuda-info)
#   smoke        each kernel never run on a GPU before, at one shape, alone in a process under
#                its own timeout: ok, WRONG, FAULT or HUNG (the phase it reached; a pipelined
#                kernel that hung is tried again, built to report its producer's and consumers'
#                k-steps: cuda/progress.h)
#   comparison   GEMM 4096 and 8192 in float32, bfloat16 and float16 and GEMV 1x16384x16384
#                against cuBLAS, then decode (1x16384x16384 and 1x28672x8192 with q4_0, q8_0 and
#                bf16 weights, beside cuBLAS's FP32 and BF16 GEMV and torch's int4 kernel, then
#                M = 2..16 in q4_0), in groups of one process each (cuBLAS first, a kernel the
#                smoke test condemned skipped); the JSON is rewritten after every group
#   correctness  every CUDA and Triton kernel at the edge shapes, outputs pre-filled with NaN,
#                through every installed loader (tests/test_cuda_gpu.py, test_triton_gpu.py),
#                the never-run kernels first, a timeout per test, one config per autotuned kernel
#   verdicts     the speed targets, read from that JSON (nothing re-measured)
#   sanitizer    compute-sanitizer memcheck and racecheck of every CUDA kernel at ragged shapes
#   experiments  the GPU half of the experiments, with whatever time is left
#
# OUT_DIR receives three files, written as the run goes, so a run cut short still returns what
# finished: summary.txt (one line per step: ok, failed with its last lines, killed at its time
# limit, or skipped for time; under the smoke, comparison and correctness steps a line per
# kernel, group or failed test), results.tar (each step's files, appended when the step ends)
# and log.txt (everything printed). scripts/gpu_steps.py runs the smoke, comparison and
# correctness steps.
#
# Environment: MATMUL_GPU_DEADLINE (seconds for the whole run, default 480: one 10-minute
# command, with room left for a second try in a 15-minute loan), MATMUL_GPU_WHEELS
# (default build/gpu-wheels, made by scripts/prepare_gpu_wheels.sh), PYTHON (default python3),
# MATMUL_GPU_TIME_SCALE (multiplies every step's budget; the dry-run test shrinks them).
# GPU_CHECK_STUB_<STEP> replaces a step's commands with a shell snippet (the dry-run test).
# Exit status: 0 when every step that ran passed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SELF="$ROOT/scripts/gpu_check.sh"
PYTHON="${PYTHON:-python3}"

# name, seconds it needs at least to be worth starting, seconds it may take at most
STEPS=(
    "environment 5 30"
    "loaders 10 120"
    "compile 10 60"
    "smoke 15 100"
    "comparison 40 200"
    "correctness 30 150"
    "verdicts 2 15"
    "sanitizer 20 90"
    "experiments 30 300"
)

SCALE="${MATMUL_GPU_TIME_SCALE:-1}"
scaled() { awk -v s="$1" -v k="$SCALE" 'BEGIN { v = int(s * k + 0.5); print (v < 1 ? 1 : v) }'; }

# ---- the steps (each runs in its own process, in STEP_DIR, under `timeout`) ------------------
step_environment() {
    local status=0
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
        | tee "$STEP_DIR/gpu.txt" || status=1
    nvidia-smi > "$STEP_DIR/nvidia-smi.txt" 2>&1
    "$PYTHON" - <<'EOF' 2>&1 | tee "$STEP_DIR/packages.txt"
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for name in ("numpy", "torch", "triton", "cupy", "pycuda", "cffi", "cuda.core"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "(no version)"))
    except Exception as error:
        print(name, "missing:", type(error).__name__, error)
import torch
print("torch sees", torch.cuda.device_count(), "GPU(s):", torch.cuda.is_available() and torch.cuda.get_device_name(0))
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    (cd "$ROOT" && "$PYTHON" -c 'from harness.backends.cuda import toolkit; print("CUDA root", toolkit.cuda_root(), "nvcc", toolkit.nvcc())') \
        | tee -a "$STEP_DIR/packages.txt"
    command -v compute-sanitizer | tee -a "$STEP_DIR/packages.txt" || echo "compute-sanitizer: not on PATH"
    return $status
}

step_loaders() {
    local wheels="${MATMUL_GPU_WHEELS:-$ROOT/build/gpu-wheels}" missing=() name
    mkdir -p "$SITE"
    for name in cffi pycparser pytools platformdirs mako markupsafe siphash24; do
        "$PYTHON" -c "import $name" 2>/dev/null || missing+=("$name")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing into $SITE: ${missing[*]}"
        "$PYTHON" -m pip install --quiet --no-index --no-deps --find-links "$wheels" --target "$SITE" "${missing[@]}" \
            || echo "could not install some of: ${missing[*]}"
    fi
    if "$PYTHON" -c "import pycuda.driver" 2>/dev/null; then
        echo "pycuda already importable"
    elif "$PYTHON" -m pip install --no-index --no-deps --only-binary pycuda --find-links "$wheels" --target "$SITE" pycuda \
        && "$PYTHON" -c "import pycuda.driver"; then
        echo "pycuda installed from a prebuilt wheel"
    else
        rm -rf "$SITE"/pycuda "$SITE"/pycuda-*
        build_pycuda_sdist "$wheels" || true
    fi
    "$PYTHON" -c "import pycuda.driver as d; d.init(); print('pycuda', d.get_version(), 'driver', d.get_driver_version(), d.Device(0).name())" \
        && return 0
    echo "PyCUDA is unusable here: the CUDA kernels run through the CuPy fallback loader"
    "$PYTHON" -c "import cupy; print('cupy', cupy.__version__)"
    return 1  # a failure to report, though later steps go on with CuPy
}

build_pycuda_sdist() {
    local wheels="$1" sdist cuda_root work src libcuda
    sdist="$(ls "$wheels"/pycuda-*.tar.gz 2>/dev/null | sort | tail -n 1)"
    [ -n "$sdist" ] || { echo "no pycuda wheel or sdist in $wheels (run scripts/prepare_gpu_wheels.sh)"; return 1; }
    cuda_root="$(cd "$ROOT" && "$PYTHON" -c 'from harness.backends.cuda import toolkit; print(toolkit.cuda_root() or "")')"
    [ -n "$cuda_root" ] || { echo "no CUDA toolkit with include/cuda.h found"; return 1; }
    export PATH="$cuda_root/bin:$PATH"
    work="$(mktemp -d)"
    tar xzf "$sdist" -C "$work"
    src="$(ls -d "$work"/pycuda-*/ | head -n 1)"
    libcuda="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
    for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
        [ -z "$libcuda" ] && [ -e "$d/libcuda.so.1" ] && libcuda="$d/libcuda.so.1"
    done
    [ -n "$libcuda" ] || { echo "no libcuda.so.1 found"; return 1; }
    mkdir -p "$work/libcuda" && ln -s "$libcuda" "$work/libcuda/libcuda.so"
    printf "CUDA_ROOT = '%s'\nCUDA_ENABLE_CURAND = False\nCUDADRV_LIB_DIR = ['%s']\nCUDART_LIB_DIR = ['%s/lib64']\n" \
        "$cuda_root" "$work/libcuda" "$cuda_root" > "$src/siteconf.py"
    echo "building PyCUDA from $sdist against $cuda_root"
    (cd "$src" && "$PYTHON" setup.py build_ext -j "$(nproc)" > "$STEP_DIR/pycuda-build.txt" 2>&1) || { tail -n 20 "$STEP_DIR/pycuda-build.txt"; return 1; }
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-build-isolation --target "$SITE" "$src"
}

step_compile() {
    cd "$ROOT" || return 1
    "$PYTHON" -m harness cuda-info --arch sm_90 | tee "$STEP_DIR/cuda-info.txt" || return 1
    "$PYTHON" -m harness list | tee "$STEP_DIR/list.txt"
}

step_smoke() {
    cd "$ROOT" || return 1
    "$PYTHON" scripts/gpu_steps.py smoke --out "$STEP_DIR" --timeout "$(scaled 40)"
}

step_comparison() {
    cd "$ROOT" || return 1
    # The plan (groups, shapes, dtypes) is default_groups() in scripts/gpu_steps.py.
    "$PYTHON" scripts/gpu_steps.py compare --out "$STEP_DIR" --budget $((STEP_BUDGET - 5)) \
        --smoke "$WORK/smoke/smoke.json" --min-time 0.1
}

step_correctness() {
    cd "$ROOT" || return 1
    MATMUL_TRITON_CHECK_MODE=1 "$PYTHON" scripts/gpu_steps.py tests --out "$STEP_DIR" \
        --budget $((STEP_BUDGET - 3)) --test-timeout "$(scaled 60)" \
        --first cuda.wgmma cuda.mma matmul_tma -- tests/test_cuda_gpu.py tests/test_triton_gpu.py
}

step_verdicts() {
    local comparison="$WORK/comparison/comparison.json"
    [ -f "$comparison" ] || { echo "no comparison.json: the comparison step did not finish"; return 1; }
    cd "$ROOT" && "$PYTHON" -m harness verdicts "$comparison" | tee "$STEP_DIR/verdicts.txt"
    return "${PIPESTATUS[0]}"
}

step_sanitizer() {
    local tool status=0
    command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer is not on PATH"; return 1; }
    cd "$ROOT" || return 1
    for tool in memcheck racecheck; do
        echo "== compute-sanitizer --tool $tool"
        compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
            "$PYTHON" scripts/cuda_ragged_run.py 2>&1 | tee "$STEP_DIR/$tool.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
    return $status
}

step_experiments() {
    cd "$ROOT" || return 1
    MATMUL_EXPERIMENT_DEVICES=gpu "$PYTHON" -m harness experiments --out "$STEP_DIR" \
        --only loads tile-quantization association roofline gemv-bandwidth
}

# ---- one step, in its own process ----------------------------------------------------------
if [ "${1:-}" = "--step" ]; then
    stub_var="GPU_CHECK_STUB_$2"
    if [ -n "${!stub_var:-}" ]; then
        exec bash -c "${!stub_var}"
    fi
    "step_$2"
    exit $?
fi
if [ "${1:-}" = "--list-steps" ]; then
    for step in "${STEPS[@]}"; do echo "${step%% *}"; done
    exit 0
fi

# ---- the run -------------------------------------------------------------------------------
if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR   (or --list-steps)" >&2
    exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
WORK="$(mktemp -d)"
SITE="$WORK/site"  # packages the loaders step installs (the image's own environment stays untouched)
export WORK SITE PYTHON ROOT
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MATMUL_REQUIRE_GPU=1
unset MATMUL_CUDA_EMULATE
DEADLINE="${MATMUL_GPU_DEADLINE:-480}"
START=$(date +%s)
END=$((START + DEADLINE))
RESERVE=3  # seconds kept back for packing the last step's files
STATUS=0
rm -f "$OUT/summary.txt" "$OUT/results.tar" "$OUT/log.txt"
exec > >(tee -a "$OUT/log.txt") 2>&1

log() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*"; }
summary() { echo "$*" >> "$OUT/summary.txt"; }

# The sources' own hash: a copied tree may carry no .git, or a stale one.
sources_hash="$(cd "$ROOT" && find harness cuda triton scripts tests -type f \( -name '*.py' -o -name '*.cu' -o -name '*.h' -o -name '*.sh' \) \
    | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)"
summary "gpu_check: deadline ${DEADLINE}s, started $(date -u +%Y-%m-%dT%H:%M:%SZ), sources $sources_hash"
for step in "${STEPS[@]}"; do
    read -r name least most <<< "$step"
    least="$(scaled "$least")"
    most="$(scaled "$most")"
    left=$((END - $(date +%s) - RESERVE))
    if [ "$left" -lt "$least" ]; then
        log "$name: skipped for time (needs ${least}s, ${left}s left)"
        summary "$(printf '%-12s skipped for time (needs %ss, %ss left)' "$name" "$least" "$left")"
        continue
    fi
    budget=$(( left < most ? left : most ))
    STEP_DIR="$WORK/$name"
    mkdir -p "$STEP_DIR"
    log "$name: start (up to ${budget}s)"
    began=$(date +%s)
    STEP_DIR="$STEP_DIR" STEP_BUDGET="$budget" timeout --kill-after=2 "$budget" "$SELF" --step "$name" 2>&1 \
        | tee "$STEP_DIR/output.txt"
    rc=${PIPESTATUS[0]}
    took=$(( $(date +%s) - began ))
    case $rc in
        0) outcome="ok" ;;
        124|137) outcome="killed at its ${budget}s limit"; STATUS=1 ;;
        *) outcome="failed (exit $rc)"; STATUS=1 ;;
    esac
    log "$name: $outcome after ${took}s"
    summary "$(printf '%-12s %s after %ss' "$name" "$outcome" "$took")"
    # A line per kernel, group or failed test where the step keeps them; else a failure's last lines.
    details=""
    for file in smoke.txt groups.txt tests-summary.txt; do
        [ -s "$STEP_DIR/$file" ] && details="$STEP_DIR/$file"
    done
    if [ -n "$details" ]; then
        head -n 40 "$details" | sed 's/^/               | /' >> "$OUT/summary.txt"
    elif [ "$rc" -ne 0 ]; then
        tail -n 6 "$STEP_DIR/output.txt" | sed 's/^/               | /' >> "$OUT/summary.txt"
    fi
    tar -rf "$OUT/results.tar" -C "$WORK" "$name"
done
summary "gpu_check: status $STATUS after $(( $(date +%s) - START ))s"
log "done, status $STATUS: $OUT/summary.txt, $OUT/results.tar, $OUT/log.txt"
exit $STATUS
