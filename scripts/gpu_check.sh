#!/usr/bin/env bash
# Every GPU check of the project, as one command with a hard deadline, on a GPU machine that
# may have no network and no PyCUDA:
#
#   scripts/gpu_check.sh OUT_DIR
#
# Steps, in order of value (what has never been measured first); each gets what is left of the
# deadline, up to its own cap:
#   environment  nvidia-smi, Python packages, the CUDA toolkit found, compute-sanitizer
#   loaders      PyCUDA (and cffi) from the prebuilt wheels of build/gpu-wheels, if the run
#                carried them; else the kernels run through CuPy (PyCUDA is never compiled on
#                the GPU machine: its build would take minutes of the loan, and CuPy loads the
#                same cubins)
#   compile      every kernel compiled for this GPU, with registers and spills (cuda-info)
#   smoke        each kernel never run on a GPU before, at one shape, alone in a process under
#                its own timeout: ok, WRONG, FAULT or HUNG (the phase it reached; a pipelined
#                kernel that hung is tried again, built to report its producer's and consumers'
#                k-steps: cuda/progress.h)
#   decode       the decode rows every decode verdict needs: q4_0 at 1x16384x16384 and
#                1x28672x8192 through cuda.decode, triton.decode and torch.int4_gpu, beside
#                cuBLAS's FP32 product at the same shapes
#   comparison   GEMM 4096 and 8192 in bfloat16: cuBLAS, then the never-run kernels
#   correctness  every CUDA and Triton kernel at the edge shapes, outputs pre-filled with NaN,
#                through the loader the comparison used (tests/test_cuda_gpu.py,
#                test_triton_gpu.py), the never-run and decode kernels first, a timeout per
#                test, one config per autotuned kernel
#   sanitizer    compute-sanitizer memcheck and racecheck of every CUDA kernel at ragged shapes
#   rest         the rest of the comparison, as time allows: decode in q8_0 and bf16, batched
#                decode, cuBLAS's BF16 GEMV at the decode shapes, decode in q4_K (never run on
#                a GPU) at 1x28672x8192, the GEMV and GEMM kernels an H200 has measured before
#                (scripts/gpu_steps.py, default_groups)
#   verdicts     the speed targets, read from every comparison row (nothing re-measured); the
#                steps before it always leave it its few seconds
#   experiments  the GPU half of the experiments, with whatever time is left
#
# The comparison steps run groups of one process each (a kernel the smoke step condemned is
# skipped); each row is written as soon as it is measured; a row past its time limit is a hang,
# and one that raises or crashes ends its process: either way the group goes on in a new one
# without that kernel. comparison.json is rewritten after every group.
# Every process a step starts dies with it, whatever session it moved to: the step's
# environment carries a mark, and what still carries it when the step ends is killed.
#
# OUT_DIR receives three files, written as the run goes, so a run cut short still returns what
# finished: summary.txt (one line per step: ok, failed with its last lines, killed at its time
# limit, or skipped for time; under the smoke, comparison and correctness steps a line per
# kernel, group or failed test), results.tar (each step's files, appended when the step ends)
# and log.txt (everything printed). scripts/gpu_steps.py runs the smoke, comparison and
# correctness steps.
#
# Environment: MATMUL_GPU_DEADLINE (seconds for the whole run, default 480: one 10-minute
# command; in a 15-minute loan whose machine takes 2-4 minutes to start, that leaves at most
# about 150 s for a follow-up command, not a second run), MATMUL_GPU_WHEELS (default
# build/gpu-wheels, made by scripts/prepare_gpu_wheels.sh on a machine with network and carried
# with the repository), PYTHON (default python3), MATMUL_GPU_TIME_SCALE (multiplies every step's
# budget and timeout; the dry-run test shrinks them).
# GPU_CHECK_STUB_<STEP> replaces a step's commands with a shell snippet (the dry-run test).
# Exit status: 0 when every step that ran passed.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SELF="$ROOT/scripts/gpu_check.sh"
PYTHON="${PYTHON:-python3}"

# Name, seconds it needs at least to be worth starting, seconds it may take at most, and seconds
# it is expected to take on an H200: measured there (the runs of 2026-11-30 and 2026-12-04,
# results/gpu/: environment 7, loaders 3-4 with the prebuilt wheel, compile 9, smoke 21,
# sanitizer 13-15, 332-428 correctness tests 102-112) or estimated; "plan" for a comparison step: its groups'
# DEVICE_SECONDS in scripts/gpu_steps.py plus their host-side setup, which
# tests/test_gpu_check_dry_run.py measures where it runs, to check that the plan fits the
# deadline with the decode rows written within its first 200 s.
STEPS=(
    "environment 5 15 7"
    "loaders 5 20 4"
    "compile 10 30 12"
    "smoke 15 75 30"
    "decode 30 140 plan"
    "comparison 30 90 plan"
    "correctness 30 150 100"
    "sanitizer 15 45 15"
    "rest 30 185 plan"
    "verdicts 5 20 4"
    "experiments 30 300 0"
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
import importlib, os, sys
print("python", sys.version.split()[0], os.path.basename(sys.executable))  # no path: results are committed
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
    if [ -d "$wheels" ]; then
        for name in cffi pycparser pytools platformdirs mako markupsafe siphash24; do
            "$PYTHON" -c "import $name" 2>/dev/null || missing+=("$name")
        done
        if [ ${#missing[@]} -gt 0 ]; then
            echo "installing into $SITE: ${missing[*]}"
            "$PYTHON" -m pip install --quiet --no-index --no-deps --find-links "$wheels" --target "$SITE" \
                "${missing[@]}" || echo "could not install some of: ${missing[*]}"
        fi
        if "$PYTHON" -c "import pycuda.driver" 2>/dev/null; then
            echo "pycuda already importable"
        elif "$PYTHON" -m pip install --quiet --no-index --no-deps --only-binary pycuda \
                --find-links "$wheels" --target "$SITE" pycuda && "$PYTHON" -c "import pycuda.driver"; then
            echo "pycuda installed from a prebuilt wheel"
        else
            rm -rf "$SITE"/pycuda "$SITE"/pycuda-*
            echo "no PyCUDA wheel in $wheels works with $("$PYTHON" -V 2>&1)"
        fi
    else
        echo "no $wheels (scripts/prepare_gpu_wheels.sh makes it, and the run carries it)"
    fi
    # No PyCUDA source build here: it would take minutes of the loan, and CuPy loads the same cubins.
    "$PYTHON" -c "import pycuda.driver as d; d.init(); print('pycuda', d.get_version(), 'driver', d.get_driver_version(), d.Device(0).name())" \
        && return 0
    "$PYTHON" -c "import cupy; print('cupy', cupy.__version__)" \
        || { echo "neither PyCUDA nor CuPy can load the CUDA kernels"; return 1; }
    echo "the CUDA kernels run through CuPy"
}

step_compile() {
    cd "$ROOT" || return 1
    # (not `harness list` as well: on a fresh machine it builds the C library, which took the
    # step past its cap in the H200 run of 2026-12-04)
    "$PYTHON" -m harness cuda-info --arch sm_90 | tee "$STEP_DIR/cuda-info.txt"
}

step_smoke() {
    cd "$ROOT" || return 1
    "$PYTHON" scripts/gpu_steps.py smoke --out "$STEP_DIR" --timeout "$(scaled 25)"
}

# A comparison step: its part of the plan (default_groups in scripts/gpu_steps.py), the rows of
# the steps before it merged into its JSON (the speedups need the baseline's rows, and a row
# measured there is not measured again).
compare_part() {
    local part="$1" task_timeout="$2" prior=() earlier
    shift 2
    for earlier in "$@"; do prior+=("$WORK/$earlier/rows.jsonl"); done
    cd "$ROOT" || return 1
    "$PYTHON" scripts/gpu_steps.py compare --part "$part" --out "$STEP_DIR" --budget $((STEP_BUDGET - 3)) \
        --smoke "$WORK/smoke/smoke.json" --min-time 0.1 --task-timeout "$(scaled "$task_timeout")" \
        --prior ${prior[@]+"${prior[@]}"}
}

# seconds a row may take (its compile and autotuning included) before it counts as hung
step_decode() { compare_part decode 45; }
step_comparison() { compare_part comparison 60 decode; }
step_rest() { compare_part rest 60 decode comparison; }

step_correctness() {
    cd "$ROOT" || return 1
    MATMUL_TRITON_CHECK_MODE=1 "$PYTHON" scripts/gpu_steps.py tests --out "$STEP_DIR" \
        --budget $((STEP_BUDGET - 3)) --test-timeout "$(scaled 60)" --loader auto \
        --first cuda.wgmma cuda.mma matmul_tma decode -- tests/test_cuda_gpu.py tests/test_triton_gpu.py
}

step_verdicts() {
    local rows=("$WORK/decode/rows.jsonl" "$WORK/comparison/rows.jsonl" "$WORK/rest/rows.jsonl") status
    cd "$ROOT" || return 1
    # every row the comparison steps wrote, whichever of them were cut short
    "$PYTHON" scripts/gpu_steps.py merge --out "$STEP_DIR" "${rows[@]}" || return 1
    "$PYTHON" -m harness verdicts "$STEP_DIR/comparison.json" | tee "$STEP_DIR/verdicts.txt"
    status=${PIPESTATUS[0]}
    # the plot last: a cut there loses only the plot
    "$PYTHON" scripts/gpu_steps.py merge --plot --out "$STEP_DIR" "${rows[@]}" > /dev/null
    return "$status"
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
if [ "${1:-}" = "--steps" ]; then  # the plan: name, least, most, expected
    printf '%s\n' "${STEPS[@]}"
    exit 0
fi

# ---- the run -------------------------------------------------------------------------------
if [ $# -ne 1 ]; then
    echo "usage: $0 OUT_DIR   (or --list-steps, or --steps: the plan)" >&2
    exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT  # each step's files are in results.tar by then (a dry run left one a run)
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

# The processes a step started, whatever session or process group they moved to (a kernel's
# compile server, a group's process whose parent was killed): their environment carries the
# step's mark. None may outlive its step and hold the GPU through the next ones. Linux (/proc).
leftovers() {
    local pid
    for pid in $(grep -lsxzF "GPU_CHECK_STEP=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
        [ "$pid" != "$$" ] && echo "$pid"
    done
}
kill_leftovers() {
    local mark="$1" pids count=0 try
    for try in 1 2 3; do  # (one may start another while the first is being killed)
        pids="$(leftovers "$mark")"
        [ -n "$pids" ] || break
        count=$((count + $(wc -w <<< "$pids")))
        kill -9 $pids 2>/dev/null
        sleep 0.2
    done
    [ "$count" -eq 0 ] || echo "$count"
}

# The sources' own hash: a copied tree may carry no .git, or a stale one.
sources_hash="$(cd "$ROOT" && find harness cuda triton scripts tests -type f \( -name '*.py' -o -name '*.cu' -o -name '*.h' -o -name '*.sh' \) \
    | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)"
summary "gpu_check: deadline ${DEADLINE}s, started $(date -u +%Y-%m-%dT%H:%M:%SZ), sources $sources_hash"
verdicts_keep="$(scaled 5)"  # the verdicts step's least: the steps before it leave it that
for step in "${STEPS[@]}"; do
    read -r name least most _ <<< "$step"
    least="$(scaled "$least")"
    most="$(scaled "$most")"
    left=$((END - $(date +%s) - RESERVE))
    [ "$name" = verdicts ] && verdicts_keep=0
    left=$((left - verdicts_keep))
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
    # The step's output goes through a FIFO to a tee of this shell's (never to a pipe it waits
    # on: a process the step left behind could hold that open, and the run with it).
    mark="$name-$$-$began"
    fifo="$WORK/.output-$name"
    mkfifo "$fifo"
    tee "$STEP_DIR/output.txt" < "$fifo" &
    teeing=$!
    env STEP_DIR="$STEP_DIR" STEP_BUDGET="$budget" GPU_CHECK_STEP="$mark" \
        timeout --kill-after=2 "$budget" "$SELF" --step "$name" > "$fifo" 2>&1
    rc=$?
    took=$(( $(date +%s) - began ))
    killed="$(kill_leftovers "$mark")"
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$teeing" 2>/dev/null || break; sleep 0.2; done
    kill "$teeing" 2>/dev/null
    wait "$teeing" 2>/dev/null
    rm -f "$fifo"
    case $rc in
        0) outcome="ok" ;;
        124|137) outcome="killed at its ${budget}s limit"; STATUS=1 ;;
        *) outcome="failed (exit $rc)"; STATUS=1 ;;
    esac
    [ -z "$killed" ] || outcome="$outcome, $killed process(es) it left running killed"
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
