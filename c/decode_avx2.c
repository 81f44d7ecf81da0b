/* AVX2+FMA kernels of the decode GEMV (decode.c): Haswell and later Intel, Zen and later AMD.
 *
 * What changes from the AVX-512 kernel (decode_avx512.c): half the lanes (8 float32 per ymm)
 * and half the registers (16), so a block is dequantized a quarter at a time (weights 0..7,
 * 8..15, 16..23, 24..31: for q4_0 the low nibbles of bytes 0..7 and 8..15, then their high
 * nibbles), each quarter FMA'd into every activation row's accumulator before the next is
 * made. Rows of W per tile: 4 up to M = 2, 2 up to M = 4, then 1, so at most 8 accumulators
 * live beside the scale, one weight vector, one activation vector and the constants. Past
 * M = 8 the activation rows take turns, 8 at a time, on each piece of W while it is in L1
 * (rows_mb): W is still read from memory once, but each block is dequantized twice.
 *
 * Lanes: accumulator lane l takes weights l, l + 8, l + 16, l + 24 of each block, in that
 * order (as the portable kernel's); summed once at the end in a fixed tree.
 *
 * Compiled with __attribute__((target("avx2,fma"))) on these functions only; decode.c calls
 * them only when cpuid says the CPU has AVX2 and FMA.
 */
#include "decode.h"

#if DECODE_HAVE_X86
#include <immintrin.h>

#define AVX2   __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

/* A block's float16 scale in every lane, exactly, without F16C: the half's exponent and
 * mantissa moved into a float32's fields, rescaled by 2^112 (which also turns a half
 * subnormal into the right float32), and its sign put back. (Infinite and NaN scales are
 * refused before any kernel runs.) */
AVX2 INLINE __m256 scale_of(const uint8_t *p) {
    uint16_t half;
    memcpy(&half, p, sizeof half);
    const __m256i h = _mm256_set1_epi32(half);
    const __m256i body = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x7fff)), 13);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
    const __m256 magnitude = _mm256_mul_ps(_mm256_castsi256_ps(body), _mm256_set1_ps(0x1p112f));
    return _mm256_or_ps(magnitude, _mm256_castsi256_ps(sign));
}

/* Quarter s (weights 8s .. 8s+7) of one step; d is the block's scale (unused for bf16). */
AVX2 INLINE __m256 dequantize_quarter(const int format, const uint8_t *p, const int s, const __m256 d) {
    if (format == DECODE_BF16) {
        const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * s)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
    }
    if (format == DECODE_Q8_0) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + 8 * s)));
        return _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    }
    /* q4_0: quarters 0 and 1 are the low nibbles of bytes 0..7 and 8..15, 2 and 3 the high */
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + 8 * (s & 1))));
    const __m256i q = s < 2 ? _mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)) : _mm256_srli_epi32(bytes, 4);
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))));
}

/* At most 8 accumulators (R x mb, ROWS_FOR below) and 4 rows of W: with the scale, one
 * weight vector, one activation vector and the constants, within the 16 registers. Flat
 * arrays of fixed, small size, indexed by constants once the loops unroll, so they live in
 * registers. */
enum { MAX_R = 4, MAX_ACC = 8, MAX_MB = 8 };

/* One step (32 weights along K) of R rows of W (at p, stride bytes apart) for mb rows of X:
 * each row's block dequantized once, a quarter at a time, each quarter FMA'd into every
 * activation row (reloaded from L1 for each row of W). */
AVX2 INLINE void step(const int format, const int R, const int mb, const uint8_t *p, int64_t stride, const float *x,
                      int64_t ldx, __m256 acc[MAX_ACC]) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
        const __m256 d = format == DECODE_BF16 ? _mm256_setzero_ps() : scale_of(p + r * stride);
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
            const __m256 w = dequantize_quarter(format, p + r * stride, s, d);
#pragma GCC unroll 8
            for (int i = 0; i < mb; ++i)
                acc[r * mb + i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i * ldx + 8 * s), acc[r * mb + i]);
        }
    }
}

AVX2 INLINE float sum_lanes(const __m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l + (l+4) */
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));                         /* + (l+2) */
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));                            /* + (l+1) */
}

/* Steps b0 .. b1 of Y[0..mb)[j..j+R) for R rows of W starting at row j; X's packed steps
 * are xstep floats apart. As decode_avx512.c's tile: from zero or `saved`, into Y or back. */
AVX2 INLINE void tile(const int format, const int R, const int mb, const float *X, int64_t xstep, const uint8_t *W,
                      int64_t row_bytes, int64_t K, int64_t j, int64_t b0, int64_t b1, __m256 *saved, float *Y,
                      int64_t ldy) {
    const int64_t steps = K / DECODE_BLOCK, tail = K % DECODE_BLOCK, step_bytes = decode_step_bytes(format);
    __m256 acc[MAX_ACC];
#pragma GCC unroll 8
    for (int a = 0; a < R * mb; ++a) acc[a] = b0 == 0 ? _mm256_setzero_ps() : saved[a];
    const uint8_t *row = W + j * row_bytes;
    for (int64_t b = b0; b < b1; ++b)
        step(format, R, mb, row + b * step_bytes, row_bytes, X + b * xstep, DECODE_BLOCK, acc);
    if (b1 < steps) {
#pragma GCC unroll 8
        for (int a = 0; a < R * mb; ++a) saved[a] = acc[a];
        return;
    }
    if (tail) { /* bf16 only: the last weights, zero-padded to a whole step (X is already) */
        uint8_t w[MAX_R][2 * DECODE_BLOCK] = {{0}};
        for (int r = 0; r < R; ++r) memcpy(w[r], row + r * row_bytes + steps * step_bytes, (size_t)(2 * tail));
        step(format, R, mb, &w[0][0], 2 * DECODE_BLOCK, X + steps * xstep, DECODE_BLOCK, acc);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int i = 0; i < mb; ++i) Y[i * ldy + j + r] = sum_lanes(acc[r * mb + i]);
}

#define ROWS_FOR(mb) ((mb) <= 2 ? 4 : (mb) <= 4 ? 2 : 1)

/* Rows c0 .. c1 of W, steps b0 .. b1, for mb <= 8 activation rows. */
AVX2 INLINE void piece(const int format, const int mb, const float *X, int64_t xstep, const uint8_t *W,
                       int64_t row_bytes, int64_t K, int64_t c0, int64_t c1, int64_t b0, int64_t b1, __m256 *saved,
                       float *Y, int64_t ldy) {
    const int R = ROWS_FOR(mb);
    int64_t j = c0;
    for (; j + R <= c1; j += R)
        tile(format, R, mb, X, xstep, W, row_bytes, K, j, b0, b1, saved ? saved + (j - c0) * mb : NULL, Y, ldy);
    for (; j < c1; ++j)
        tile(format, 1, mb, X, xstep, W, row_bytes, K, j, b0, b1, saved ? saved + (j - c0) * mb : NULL, Y, ldy);
}

/* As in decode_avx512.c: K in pieces when X would not stay in L2. And more than 8 activation
 * rows do not fit the 16 registers beside the weights: rows 0..7 and the rest take turns on
 * each piece of CHUNK_ROWS rows of W, so W is still read from memory once, and each block is
 * dequantized twice, the second time from L1. */
enum { X_RESIDENT_BYTES = 256 * 1024, K_PIECE = 32, CHUNK_ROWS = 16 };

AVX2 INLINE void rows_mb(const int format, const int mb, const float *X, const uint8_t *W, int64_t row_bytes, float *Y,
                         int64_t ldy, int64_t K, int64_t j0, int64_t j1) {
    const int lo = mb < MAX_MB ? mb : MAX_MB, hi = mb - lo;
    const int64_t steps = K / DECODE_BLOCK, xstep = (int64_t)mb * DECODE_BLOCK;
    if (!hi && ((int64_t)mb * K * (int64_t)sizeof(float) <= X_RESIDENT_BYTES || steps <= K_PIECE)) {
        piece(format, lo, X, xstep, W, row_bytes, K, j0, j1, 0, steps, NULL, Y, ldy);
        return;
    }
    __m256 saved[2][CHUNK_ROWS * MAX_MB];
    for (int64_t c0 = j0; c0 < j1; c0 += CHUNK_ROWS) {
        const int64_t c1 = c0 + CHUNK_ROWS < j1 ? c0 + CHUNK_ROWS : j1;
        for (int64_t b0 = 0; b0 < steps || b0 == 0; b0 += K_PIECE) {
            const int64_t b1 = b0 + K_PIECE < steps ? b0 + K_PIECE : steps;
            piece(format, lo, X, xstep, W, row_bytes, K, c0, c1, b0, b1, saved[0], Y, ldy);
            if (hi)
                piece(format, hi, X + lo * DECODE_BLOCK, xstep, W, row_bytes, K, c0, c1, b0, b1, saved[1], Y + lo * ldy,
                      ldy);
        }
    }
}

AVX2 INLINE void rows(const int format, const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y,
                      int64_t ldy, int64_t K, int64_t j0, int64_t j1) {
    switch (mb) { /* mb as a constant: each case's loops unroll and its accumulators live in registers */
    case 1: rows_mb(format, 1, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 2: rows_mb(format, 2, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 3: rows_mb(format, 3, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 4: rows_mb(format, 4, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 5: rows_mb(format, 5, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 6: rows_mb(format, 6, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 7: rows_mb(format, 7, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 8: rows_mb(format, 8, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 9: rows_mb(format, 9, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 10: rows_mb(format, 10, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 11: rows_mb(format, 11, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 12: rows_mb(format, 12, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 13: rows_mb(format, 13, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 14: rows_mb(format, 14, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 15: rows_mb(format, 15, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    case 16: rows_mb(format, 16, X, W, row_bytes, Y, ldy, K, j0, j1); break;
    default: break;
    }
}

AVX2 static void rows_q8_0(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy,
                           int64_t K, int64_t j0, int64_t j1) {
    rows(DECODE_Q8_0, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}
AVX2 static void rows_q4_0(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy,
                           int64_t K, int64_t j0, int64_t j1) {
    rows(DECODE_Q4_0, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}
AVX2 static void rows_bf16(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy,
                           int64_t K, int64_t j0, int64_t j1) {
    rows(DECODE_BF16, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}

const struct decode_kernels decode_avx2 = {rows_q8_0, rows_q4_0, rows_bf16};

#endif
