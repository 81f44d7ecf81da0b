/* Decode with integer dot products, llama.cpp's way: Y [M, N] = X [M, K] @ W^T with W in q8_0
 * or q4_0, and X itself quantized to q8_0 first.
 *
 * What changes from decode.c (weight-only): there, each block of W is dequantized to float32
 * and FMA'd with the float32 activations, so only the float32 sum rounds. Here each 32-wide
 * block of each activation row is quantized as ggml quantizes q8_0 (d_x = max|x| / 127 rounded
 * to float16, q_x = round(x / d_x)), once per call, and each block's dot product is taken in
 * integers: 32 products of int8 weights (q4_0: nibble - 8) and int8 activations, summed exactly
 * in int32, then scaled once by d_w * d_x and added to a float32 sum. That is 32 multiply-adds
 * in one or two instructions (AVX2: vpmaddubsw + vpmaddwd; AVX-512 VNNI: vpdpbusd), instead of
 * converting 32 weights to float, scaling them and 32 FMAs.
 *
 * The price is the activations' rounding: each x moves by up to d_x / 2, half a step of its
 * block's 8-bit grid, so each output moves by up to sum over blocks of d_x / 2 * sum |w| on top
 * of the float32 error (tests/test_decode.py checks both: the ordinary float32 error model
 * against the float64 product of the quantized X and W, and that bound against the exact one).
 *
 * Both integer instructions multiply unsigned by signed bytes, so a block's weights w are
 * applied as |w| (unsigned) times x with w's sign moved onto it (vpsignb), as llama.cpp does;
 * no pair sum can saturate (2 x 128 x 127 < 2^15).
 *
 * Variants: portable C, AVX2 (maddubs) and AVX-512 VNNI (vpdpbusd on 256-bit registers, which
 * needs AVX512_VNNI and AVX512VL), chosen at run time. Each Y element is the same float32
 * sequence over its blocks whatever thread computes it: the same bits for every thread count.
 * Activation rows are taken 16 at a time, each block of W unpacked once for all of them; up to
 * four rows of W at a time for up to four rows of X (a simpler kernel than decode.c's: from
 * five rows of X one row of W at a time, and K is never cut). The number of X rows is a
 * compile-time constant for every M = 1..16 (a switch over inlined copies), so the loops over
 * them unroll and their accumulators are registers instead of a run-time-indexed array; the
 * operations, and the bits, are the same.
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* posix_memalign under a strict -std=c11 */
#endif
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "decode.h"
#include "matmul.h"
#include "thread_pool.h"

#if DECODE_HAVE_X86
#include <immintrin.h>
#endif

enum { Q8_BYTES = 34, ROWS = 16 };

static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* float32 -> float16 bits, rounded to nearest even (ggml's conversion), for finite input. */
static uint16_t half_of(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: infinity */
    if (x < 0x38800000u) {                                   /* below 2^-14: a half subnormal */
        if (x < 0x33000000u) return (uint16_t)sign;          /* below half of 2^-24: zero */
        const uint32_t exponent = x >> 23, mantissa = (x & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - exponent; /* 14 .. 24 */
        uint32_t half = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (half & 1))) ++half;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((x >> 13) - (112u << 10)); /* rebias the exponent */
    const uint32_t rest = x & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) ++half; /* a carry moves up the exponent */
    return (uint16_t)(sign | half);
}

/* ggml's quantize_row_q8_0 (reference version): n (a multiple of 32) floats to n / 32 blocks
 * of 34 bytes, d = max|x| / 127 as float16, then 32 int8 round(x / d). */
static void quantize_block(const float *x, uint8_t *out) {
    float amax = 0;
    for (int l = 0; l < DECODE_BLOCK; ++l) amax = fmaxf(amax, fabsf(x[l]));
    const float d = amax / 127.0f, inverse = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t h = half_of(d);
    out[0] = (uint8_t)(h & 0xff);
    out[1] = (uint8_t)(h >> 8);
    for (int l = 0; l < DECODE_BLOCK; ++l) out[2 + l] = (uint8_t)(int8_t)roundf(x[l] * inverse);
}

/* x [n] to q8_0 blocks (n a multiple of 32); what tests/test_decode.py checks against gguf. */
MATMUL_API void matmul_quantize_q8_0(const float *x, int64_t n, uint8_t *out) {
    for (int64_t b = 0; b < n / DECODE_BLOCK; ++b) quantize_block(x + b * DECODE_BLOCK, out + b * Q8_BYTES);
}

/* ---- the kernels: Y[0..mb)[j0..j1) from X's q8_0 blocks, for each step b the mb rows' blocks
 * one after another (Xq + (b * mb + i) * 34) ------------------------------------------------ */

typedef void (*int8_rows_fn)(int format, const uint8_t *Xq, const float *xd, int64_t mb, const uint8_t *W,
                             int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j0, int64_t j1);

/* A block's float16 scale as float32, exactly and without branches (finite scales only: the
 * harness refuses the others): the half's fields moved into a float32's, rescaled by 2^112. */
static inline float scale_of(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t body = (h & 0x7fffu) << 13, sign = (h & 0x8000u) << 16;
    float f;
    memcpy(&f, &body, sizeof f);
    f *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* A block's 32 weights as int8: q8_0's bytes, or q4_0's nibbles minus 8 (weights 0..15 low). */
static inline void weights_portable(int format, const uint8_t *p, int8_t w[DECODE_BLOCK]) {
    if (format == DECODE_Q8_0) {
        memcpy(w, p + 2, DECODE_BLOCK);
        return;
    }
    for (int l = 0; l < 16; ++l) {
        w[l] = (int8_t)((p[2 + l] & 0x0f) - 8);
        w[l + 16] = (int8_t)((p[2 + l] >> 4) - 8);
    }
}

static void rows_portable(int format, const uint8_t *Xq, const float *xd, int64_t mb, const uint8_t *W,
                          int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j0, int64_t j1) {
    const int64_t step_bytes = decode_step_bytes(format);
    for (int64_t j = j0; j < j1; ++j) {
        float acc[ROWS] = {0};
        for (int64_t b = 0; b < steps; ++b) {
            const uint8_t *p = W + j * row_bytes + b * step_bytes;
            int8_t w8[DECODE_BLOCK];
            weights_portable(format, p, w8);
            /* int16 operands: GCC 12 at -O3 with AVX512_VNNI vectorizes a sum of products of two
             * signed char arrays with vpdpbusd, which reads one of them as unsigned (wrong
             * results); products of shorts go to vpdpwssd, signed times signed. */
            int16_t w[DECODE_BLOCK], xs[DECODE_BLOCK];
            for (int l = 0; l < DECODE_BLOCK; ++l) w[l] = w8[l];
            const float dw = decode_half(p);
            for (int64_t i = 0; i < mb; ++i) {
                const uint8_t *x = Xq + (b * mb + i) * Q8_BYTES;
                for (int l = 0; l < DECODE_BLOCK; ++l) xs[l] = (int8_t)x[2 + l];
                int32_t dot = 0;
                for (int l = 0; l < DECODE_BLOCK; ++l) dot += (int32_t)w[l] * xs[l];
                acc[i] += (float)dot * (dw * xd[b * mb + i]);
            }
        }
        for (int64_t i = 0; i < mb; ++i) Y[i * ldy + j] = acc[i];
    }
}

#if DECODE_HAVE_X86
#define INLINE static inline __attribute__((always_inline))
#define AVX2   __attribute__((target("avx2,fma")))
#define VNNI   __attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni")))

/* 32 int8 weights of a block in a ymm (q4_0: low nibbles are weights 0..15, in the low lane). */
AVX2 INLINE __m256i weights_avx2(int format, const uint8_t *p) {
    if (format == DECODE_Q8_0) return _mm256_loadu_si256((const __m256i *)(p + 2));
    const __m128i bytes = _mm_loadu_si128((const __m128i *)(p + 2));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
}

AVX2 INLINE float sum8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

/* The int32 x 8 partial sums of a block's dot product: |w| (unsigned) times x with w's sign. */
AVX2 INLINE __m256i dot_avx2(__m256i abs_w, __m256i w, const uint8_t *x) {
    const __m256i signed_x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x + 2)), w);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, signed_x), _mm256_set1_epi16(1));
}

VNNI INLINE __m256i dot_vnni(__m256i abs_w, __m256i w, const uint8_t *x) {
    const __m256i signed_x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x + 2)), w);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), abs_w, signed_x);
}

/* R rows of W from row j for mb rows of X (constants where rows_avx2 calls it). */
AVX2 INLINE void tile_avx2(int format, const int R, const int mb, const uint8_t *Xq, const float *xd, const uint8_t *W,
                           int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j) {
    const int64_t step_bytes = decode_step_bytes(format);
    __m256 acc[ROWS];
#pragma GCC unroll 16
    for (int a = 0; a < R * mb; ++a) acc[a] = _mm256_setzero_ps();
    for (int64_t b = 0; b < steps; ++b) {
        for (int r = 0; r < R; ++r) {
            const uint8_t *p = W + (j + r) * row_bytes + b * step_bytes;
            const __m256i w = weights_avx2(format, p), abs_w = _mm256_sign_epi8(w, w);
            const float dw = scale_of(p);
#pragma GCC unroll 16
            for (int i = 0; i < mb; ++i) {
                const __m256 scale = _mm256_set1_ps(dw * xd[b * mb + i]);
                const __m256i dot = dot_avx2(abs_w, w, Xq + (b * mb + i) * Q8_BYTES);
                acc[r * mb + i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r * mb + i]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) Y[i * ldy + j + r] = sum8(acc[r * mb + i]);
}

/* Rows of W at a time: four independent chains of FMAs for one or two rows of X, two for three
 * or four, then one (R x mb accumulators of at most 8). */
AVX2 INLINE void rows_mb_avx2(int format, const int R, const int mb, const uint8_t *Xq, const float *xd,
                              const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j0,
                              int64_t j1) {
    int64_t j = j0;
    for (; j + R <= j1; j += R) tile_avx2(format, R, mb, Xq, xd, W, row_bytes, Y, ldy, steps, j);
    for (; j < j1; ++j) tile_avx2(format, 1, mb, Xq, xd, W, row_bytes, Y, ldy, steps, j);
}

AVX2 static void rows_avx2(int format, const uint8_t *Xq, const float *xd, int64_t mb, const uint8_t *W,
                           int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j0, int64_t j1) {
    // clang-format off: one case per line, as a table
    switch (mb) { /* mb as a constant: its loops unroll and its accumulators live in registers */
    case 1: rows_mb_avx2(format, 4, 1, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
    case 2: rows_mb_avx2(format, 4, 2, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
    case 3: rows_mb_avx2(format, 2, 3, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
    case 4: rows_mb_avx2(format, 2, 4, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
#define ONE_ROW(m) \
    case m: rows_mb_avx2(format, 1, m, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
        ONE_ROW(5) ONE_ROW(6) ONE_ROW(7) ONE_ROW(8) ONE_ROW(9) ONE_ROW(10) ONE_ROW(11) ONE_ROW(12)
        ONE_ROW(13) ONE_ROW(14) ONE_ROW(15) ONE_ROW(16)
#undef ONE_ROW
    default: break; /* the driver passes at most ROWS */
    }
    // clang-format on
}

/* R rows of W from row j for mb rows of X (constants where rows_vnni calls it). */
VNNI INLINE void tile_vnni(int format, const int R, const int mb, const uint8_t *Xq, const float *xd, const uint8_t *W,
                           int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j) {
    const int64_t step_bytes = decode_step_bytes(format);
    __m256 acc[ROWS];
#pragma GCC unroll 16
    for (int a = 0; a < R * mb; ++a) acc[a] = _mm256_setzero_ps();
    for (int64_t b = 0; b < steps; ++b) {
        for (int r = 0; r < R; ++r) {
            const uint8_t *p = W + (j + r) * row_bytes + b * step_bytes;
            const __m256i w = weights_avx2(format, p), abs_w = _mm256_sign_epi8(w, w);
            const float dw = scale_of(p);
#pragma GCC unroll 16
            for (int i = 0; i < mb; ++i) {
                const __m256 scale = _mm256_set1_ps(dw * xd[b * mb + i]);
                const __m256i dot = dot_vnni(abs_w, w, Xq + (b * mb + i) * Q8_BYTES);
                acc[r * mb + i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r * mb + i]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) Y[i * ldy + j + r] = sum8(acc[r * mb + i]);
}

/* Rows of W at a time: four independent chains of FMAs for one or two rows of X, two for three
 * or four, then one (R x mb accumulators of at most 8). */
VNNI INLINE void rows_mb_vnni(int format, const int R, const int mb, const uint8_t *Xq, const float *xd,
                              const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j0,
                              int64_t j1) {
    int64_t j = j0;
    for (; j + R <= j1; j += R) tile_vnni(format, R, mb, Xq, xd, W, row_bytes, Y, ldy, steps, j);
    for (; j < j1; ++j) tile_vnni(format, 1, mb, Xq, xd, W, row_bytes, Y, ldy, steps, j);
}

VNNI static void rows_vnni(int format, const uint8_t *Xq, const float *xd, int64_t mb, const uint8_t *W,
                           int64_t row_bytes, float *Y, int64_t ldy, int64_t steps, int64_t j0, int64_t j1) {
    // clang-format off: one case per line, as a table
    switch (mb) { /* mb as a constant: its loops unroll and its accumulators live in registers */
    case 1: rows_mb_vnni(format, 4, 1, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
    case 2: rows_mb_vnni(format, 4, 2, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
    case 3: rows_mb_vnni(format, 2, 3, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
    case 4: rows_mb_vnni(format, 2, 4, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
#define ONE_ROW(m) \
    case m: rows_mb_vnni(format, 1, m, Xq, xd, W, row_bytes, Y, ldy, steps, j0, j1); break;
        ONE_ROW(5) ONE_ROW(6) ONE_ROW(7) ONE_ROW(8) ONE_ROW(9) ONE_ROW(10) ONE_ROW(11) ONE_ROW(12)
        ONE_ROW(13) ONE_ROW(14) ONE_ROW(15) ONE_ROW(16)
#undef ONE_ROW
    default: break; /* the driver passes at most ROWS */
    }
    // clang-format on
}

#endif

/* ---- variants and the public call --------------------------------------------------------- */

MATMUL_API int matmul_decode_int8_variant_supported(int64_t variant) {
    switch (variant) {
    case DECODE_AUTO:
    case DECODE_PORTABLE: return 1;
#if DECODE_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
    case DECODE_AVX2: __builtin_cpu_init(); return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case DECODE_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512vnni");
#endif
    default: return 0;
    }
}

MATMUL_API int64_t matmul_decode_int8_resolve_variant(int64_t variant) {
    if (variant == DECODE_AUTO) {
        if (matmul_decode_int8_variant_supported(DECODE_AVX512)) return DECODE_AVX512;
        if (matmul_decode_int8_variant_supported(DECODE_AVX2)) return DECODE_AVX2;
        return DECODE_PORTABLE;
    }
    return matmul_decode_int8_variant_supported(variant) ? variant : -1;
}

static const double MIN_FMAS_PER_THREAD = 1 << 19;

struct int8_job {
    const uint8_t *Xq, *W;
    const float *xd; /* X's block scales as float32, in Xq's order */
    float *Y;
    int64_t M, N, steps, row_bytes, parts;
    int format;
    int8_rows_fn rows;
};

static void int8_task(void *context, int64_t part) {
    const struct int8_job *job = context;
    const int64_t j0 = job->N * part / job->parts, j1 = job->N * (part + 1) / job->parts;
    for (int64_t i0 = 0; j0 < j1 && i0 < job->M; i0 += ROWS)
        job->rows(job->format, job->Xq + i0 * job->steps * Q8_BYTES, job->xd + i0 * job->steps,
                  min_i64(ROWS, job->M - i0), job->W, job->row_bytes, job->Y + i0 * job->N, job->N, job->steps, j0, j1);
}

/* Y [M, N] = q8_0(X) [M, K] @ W^T for W [N, K] in ggml `format` (2 = q4_0, 8 = q8_0). threads
 * and variant as matmul_decode_f32 (3 = AVX-512 VNNI). Returns decode.h's codes (3 for bf16 or
 * any other format). */
MATMUL_API int matmul_decode_int8_f32(const float *X, const uint8_t *W, float *Y, int64_t M, int64_t N, int64_t K,
                                      int64_t format, int64_t threads, int64_t variant) {
    if (M < 0 || N < 0 || K < 0) return DECODE_ERR_ARGUMENT;
    if (format != DECODE_Q8_0 && format != DECODE_Q4_0) return DECODE_ERR_FORMAT;
    if (K % DECODE_BLOCK) return DECODE_ERR_BLOCK;
    const int64_t resolved = matmul_decode_int8_resolve_variant(variant);
    if (resolved < 0) return DECODE_ERR_VARIANT;
    if (M == 0 || N == 0) return DECODE_OK;
    if (K == 0) {
        memset(Y, 0, (size_t)(M * N) * sizeof(float));
        return DECODE_OK;
    }
    struct int8_job job = {NULL, W, NULL, Y, M, N, K / DECODE_BLOCK, 0, 1, (int)format, rows_portable};
    job.row_bytes = job.steps * decode_step_bytes((int)format);
#if DECODE_HAVE_X86
    if (resolved == DECODE_AVX2) job.rows = rows_avx2;
    if (resolved == DECODE_AVX512) job.rows = rows_vnni;
#endif
    /* X quantized once: for each pass of 16 rows, each step, the rows' q8_0 blocks in turn */
    const size_t blocks = (size_t)(M * job.steps);
    void *memory = NULL;
    if (posix_memalign(&memory, 64, blocks * (Q8_BYTES + sizeof(float)))) return DECODE_ERR_MEMORY;
    float *xd = memory;
    uint8_t *Xq = (uint8_t *)(xd + blocks);
    for (int64_t i0 = 0; i0 < M; i0 += ROWS) {
        const int64_t mb = min_i64(ROWS, M - i0);
        for (int64_t b = 0; b < job.steps; ++b)
            for (int64_t i = 0; i < mb; ++i) {
                const int64_t at = i0 * job.steps + b * mb + i;
                quantize_block(X + (i0 + i) * K + b * DECODE_BLOCK, Xq + at * Q8_BYTES);
                xd[at] = decode_half(Xq + at * Q8_BYTES);
            }
    }
    job.Xq = Xq;
    job.xd = xd;
    if (threads <= 0) {
        const long online = sysconf(_SC_NPROCESSORS_ONLN);
        threads = online > 0 ? online : 1;
    }
    const double by_work = (double)M * (double)N * (double)K / MIN_FMAS_PER_THREAD;
    if (by_work < (double)threads) threads = by_work < 1 ? 1 : (int64_t)by_work;
    job.parts = min_i64(min_i64(threads, N), 1024);
    pool_run(job.parts, int8_task, &job);
    free(memory);
    return DECODE_OK;
}
