/* Decode GEMV with quantized weights: Y [M, N] = X [M, K] @ W^T, W [N, K] stored as ggml
 * stores it (q8_0, q4_0, bf16: harness/model/quant.py gives the byte layouts), X and Y float32. The
 * kernels are in decode_portable.c, decode_avx2.c and decode_avx512.c; python/decode.py is
 * the readable model of what they compute.
 *
 * What changes from the float GEMV (packed.c's vector path, c.packed at M = 1): the same
 * problem, a stream of weights each used once per activation row, so memory-bound; but W is
 * stored in 4.5, 8.5 or 16 bits a weight instead of 32, so the same memory traffic carries
 * 7x, 3.8x or 2x the weights. Three things follow:
 *
 *   - W is read along its rows (W [N, K], as models store it; the float GEMV reads B [K, N]
 *     across), because a block's scale covers 32 consecutive weights of one row along K. Each
 *     output Y[i][j] is a dot product of X's row i with W's row j, summed in SIMD lanes and
 *     reduced once at the end.
 *   - Weight-only quantization: each block is dequantized in registers to float32 (an exact
 *     conversion: a float16 scale times an integer of at most 8 bits fits a float32) and
 *     FMA'd with the float32 activations. Nothing but the float32 sum rounds, so the
 *     ordinary float32 error model applies, against the float64 product of X and the
 *     dequantized W. (llama.cpp instead quantizes X to 8 bits as well and sums integer
 *     products, which is faster and adds X's rounding: a different rung.)
 *   - Batched decode (M = 2..16: several sequences, or speculative drafts): each block of W
 *     is read and dequantized once and applied to every activation row while it is in
 *     registers, so M rows cost one pass over W, not M. A larger M is done in passes of 16.
 *     From about M = 8 the kernel is bound by its arithmetic and by reading X (from L2),
 *     no longer by W's memory traffic.
 *
 * Threads: the rows of W (N) are cut into contiguous ranges, one per thread of the persistent
 * pool (thread_pool.c); every Y element is computed by the same operations whichever thread
 * computes it (decode.h), so the result is bitwise identical for every thread count.
 *
 * Variants: portable C (any target), AVX2+FMA and AVX-512 (F and BW), each compiled with
 * per-function target attributes and chosen at run time from cpuid, so one build runs on any
 * x86-64 and never executes an instruction the CPU lacks. Variants differ from each other in
 * the last bits (their lanes split each block's sum differently), never from themselves.
 *
 * Shapes: X [M, K] row-major float32; W the packed bytes of N rows; Y [M, N], overwritten.
 * K must be a multiple of 32 for q8_0 and q4_0, anything for bf16.
 * Returns 0 or a DECODE_ERR_* code (decode.h); the harness maps them to messages.
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* posix_memalign under a strict -std=c11 */
#endif
#include <stdlib.h>

#include "decode.h"
#include "matmul.h"
#include "thread_pool.h"

/* ---- which variants this CPU can run ------------------------------------------------------ */

/* 1 if this CPU and build can run the variant (decode.h's numbers), else 0. */
MATMUL_API int matmul_decode_variant_supported(int64_t variant) {
    switch (variant) {
    case DECODE_AUTO:
    case DECODE_PORTABLE: return 1;
#if DECODE_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
    case DECODE_AVX2: __builtin_cpu_init(); return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case DECODE_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#endif
    default: return 0;
    }
}

/* The variant that `variant` runs as (auto resolved: the widest this CPU has), or -1. */
MATMUL_API int64_t matmul_decode_resolve_variant(int64_t variant) {
    if (variant == DECODE_AUTO) {
        if (matmul_decode_variant_supported(DECODE_AVX512)) return DECODE_AVX512;
        if (matmul_decode_variant_supported(DECODE_AVX2)) return DECODE_AVX2;
        return DECODE_PORTABLE;
    }
    return matmul_decode_variant_supported(variant) ? variant : -1;
}

static const struct decode_kernels *kernels_for(int64_t variant) {
    switch (matmul_decode_resolve_variant(variant)) {
    case DECODE_PORTABLE: return &decode_portable;
#if DECODE_HAVE_X86
    case DECODE_AVX2: return &decode_avx2;
    case DECODE_AVX512: return &decode_avx512;
#endif
    default: return NULL;
    }
}

/* ---- the activations, packed step by step (decode.h) ----------------------------------------- */

/* Each pass of up to DECODE_MAX_ROWS rows, one after another: for each step of 32 along K, the
 * pass's rows' 32 values, the last step zero-padded. M x K floats, rounded up to whole steps:
 * a copy of X made once per call (a 900 KiB X takes some 50 us; the product, milliseconds). */
static void pack_activations(const float *X, int64_t M, int64_t K, float *Xp) {
    const int64_t steps = (K + DECODE_BLOCK - 1) / DECODE_BLOCK;
    for (int64_t i0 = 0; i0 < M; i0 += DECODE_MAX_ROWS) {
        const int64_t mb = min_i64(DECODE_MAX_ROWS, M - i0);
        for (int64_t b = 0; b < steps; ++b) {
            const int64_t n = min_i64(DECODE_BLOCK, K - b * DECODE_BLOCK);
            for (int64_t i = 0; i < mb; ++i) {
                float *out = Xp + (i0 * steps + b * mb + i) * DECODE_BLOCK;
                memcpy(out, X + (i0 + i) * K + b * DECODE_BLOCK, (size_t)n * sizeof(float));
                if (n < DECODE_BLOCK) memset(out + n, 0, (size_t)(DECODE_BLOCK - n) * sizeof(float));
            }
        }
    }
}

struct decode_job {
    const float *X; /* packed */
    const uint8_t *W;
    float *Y;
    int64_t M, N, K, row_bytes, parts;
    decode_rows_fn rows;
};

static void decode_task(void *context, int64_t part) {
    const struct decode_job *job = context;
    const int64_t j0 = job->N * part / job->parts, j1 = job->N * (part + 1) / job->parts;
    if (j0 == j1) return;
    const int64_t steps = (job->K + DECODE_BLOCK - 1) / DECODE_BLOCK;
    for (int64_t i0 = 0; i0 < job->M; i0 += DECODE_MAX_ROWS)
        job->rows(job->X + i0 * steps * DECODE_BLOCK, min_i64(DECODE_MAX_ROWS, job->M - i0), job->W, job->row_bytes,
                  job->Y + i0 * job->N, job->N, job->K, j0, j1);
}

/* ---- the public call ------------------------------------------------------------------------ */

/* Y [M, N] = X [M, K] @ W^T for W [N, K] in ggml `format` (2 = q4_0, 8 = q8_0, 30 = bf16).
 * threads <= 0 uses every online core; variant 0 = auto, 1 = portable C, 2 = AVX2+FMA,
 * 3 = AVX-512. Returns 0, or 1 (variant), 2 (negative dimension), 3 (format), 4 (K not a
 * multiple of the block). The result is the same for every thread count. */
MATMUL_API int matmul_decode_f32(const float *X, const uint8_t *W, float *Y, int64_t M, int64_t N, int64_t K,
                                 int64_t format, int64_t threads, int64_t variant) {
    if (M < 0 || N < 0 || K < 0) return DECODE_ERR_ARGUMENT;
    if (format != DECODE_Q8_0 && format != DECODE_Q4_0 && format != DECODE_BF16) return DECODE_ERR_FORMAT;
    if (format != DECODE_BF16 && K % DECODE_BLOCK) return DECODE_ERR_BLOCK;
    const struct decode_kernels *kernels = kernels_for(variant);
    if (!kernels) return DECODE_ERR_VARIANT;
    if (M == 0 || N == 0) return DECODE_OK;
    if (K == 0) {
        memset(Y, 0, (size_t)(M * N) * sizeof(float));
        return DECODE_OK;
    }
    struct decode_job job = {X, W, Y, M, N, K, 0, 1, NULL};
    job.row_bytes = format == DECODE_BF16 ? 2 * K : K / DECODE_BLOCK * decode_step_bytes((int)format);
    job.rows = format == DECODE_Q8_0 ? kernels->q8_0 : format == DECODE_Q4_0 ? kernels->q4_0 : kernels->bf16;
    job.parts = pool_threads_for(threads, (double)M * (double)N * (double)K, N);
    float *packed = NULL;
    if (M > 1 || K % DECODE_BLOCK) { /* one row of whole steps is its own packed form */
        const size_t bytes = (size_t)(M * ((K + DECODE_BLOCK - 1) / DECODE_BLOCK) * DECODE_BLOCK) * sizeof(float);
        void *memory = NULL;
        if (posix_memalign(&memory, 64, bytes)) return DECODE_ERR_MEMORY;
        packed = memory;
        pack_activations(X, M, K, packed);
        job.X = packed;
    }
    pool_run(job.parts, decode_task, &job);
    free(packed);
    return DECODE_OK;
}
