/* AVX-512 kernels of the decode GEMV (decode.c): Skylake-X and later Intel, Zen 4 and later AMD.
 *
 * What changes from the portable kernel (decode_portable.c): the block is dequantized
 * straight into two zmm registers (16 float32 lanes each) from its bytes: q8_0 and q4_0 by
 * widening 16 bytes to 16 int32 (vpmovsxbd / vpmovzxbd); q8_0 then converts to float and
 * scales by the block's d; bf16 widens 16 uint16 to int32 and shifts them into the top half.
 * q4_0 looks its weights up: the block's 16 possible values d * (n - 8), n = 0..15, are one
 * vector (one multiply of d by the constants -8..7, each product exact: an 11-bit scale times
 * a 4-bit integer), and vpermps, which reads only the low 4 bits of each 32-bit index, picks
 * weights 0..15 with the widened bytes as indices (no mask) and weights 16..31 with them
 * shifted right by 4. That is 9 vector instructions a block (at M = 1, counted in the
 * compiled loop: scale broadcast and conversion 2, table 1, widen 1, shift 1, lookups 2,
 * FMAs 2) where converting each nibble to float and scaling it took 12 (mask, two
 * conversions, -8d, two FMAs in place of the lookups); the weights, and so every bit of the
 * result, are the same. Then each activation row's accumulator takes two FMAs. Several rows of W are done at once (8 when M = 1, 4, 2, then 1 as M grows, so the
 * accumulators, R x M zmm, fit the 32 registers): more independent FMA chains, and R streams
 * from memory in flight, which is what keeps one core's memory traffic up at M = 1.
 *
 * Lanes: accumulator lane l takes weights l and l + 16 of each block, in that order; the
 * lanes are summed once at the end (_mm512_reduce_add_ps, a fixed tree). Nothing depends on
 * how many rows of W or X are done at once, so every thread count gives the same bits.
 *
 * Compiled with __attribute__((target(...))) on these functions only; decode.c calls them
 * only when cpuid says the CPU has AVX-512F and BW (and the OS saves the zmm state).
 */
#include "decode.h"

#if DECODE_HAVE_X86
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

/* The 32 weights of one step as two vectors: weights 0..15 and 16..31. */
AVX512 INLINE void dequantize(const int format, const uint8_t *p, __m512 w[2]) {
    if (format == DECODE_BF16) {
        for (int h = 0; h < 2; ++h) {
            const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 32 * h)));
            w[h] = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
        }
        return;
    }
    uint16_t half;
    memcpy(&half, p, sizeof half);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)half)); /* the scale, in every lane */
    if (format == DECODE_Q8_0) {
        for (int h = 0; h < 2; ++h) {
            const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 2 + 16 * h)));
            w[h] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(q));
        }
    } else { /* q4_0: a table of the 16 values d * (n - 8), looked up by each nibble n */
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)));
        const __m512 table = _mm512_mul_ps(d, _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
        w[0] = _mm512_permutexvar_ps(bytes, table); /* vpermps reads only bits 0..3 of each index */
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
    }
}

/* At most 24 accumulators (R x mb, ROWS_FOR below), 8 rows of W. Flat arrays of fixed,
 * small size, indexed by constants once the loops unroll, so they live in registers. */
enum { MAX_R = 8, MAX_ACC = 24 };

/* One step (32 weights along K) of R rows of W (at p, stride bytes apart) for mb rows of X
 * (ldx apart): each row's block dequantized once, then two FMAs for each activation row. The
 * activations are reloaded for each row of W (from L1), so that only two weight vectors are
 * live at a time and R x mb accumulators fit beside them. */
AVX512 INLINE void step(const int format, const int R, const int mb, const uint8_t *p, int64_t stride, const float *x,
                        int64_t ldx, __m512 acc[MAX_ACC]) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
        __m512 w[2];
        dequantize(format, p + r * stride, w);
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) {
            acc[r * mb + i] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x + i * ldx), acc[r * mb + i]);
            acc[r * mb + i] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x + i * ldx + 16), acc[r * mb + i]);
        }
    }
}

/* Steps b0 .. b1 of Y[0..mb)[j..j+R) for R rows of W starting at row j. The accumulators
 * start from zero at step 0, else from `saved`; after the last step (and bf16's tail) they
 * are summed into Y, else stored back to `saved`. Storing and reloading a vector changes no
 * bit, so the result does not depend on how K is cut. */
AVX512 INLINE void tile(const int format, const int R, const int mb, const float *X, const uint8_t *W,
                        int64_t row_bytes, int64_t K, int64_t j, int64_t b0, int64_t b1, __m512 *saved, float *Y,
                        int64_t ldy) {
    const int64_t steps = K / DECODE_BLOCK, tail = K % DECODE_BLOCK, step_bytes = decode_step_bytes(format);
    __m512 acc[MAX_ACC];
#pragma GCC unroll 24
    for (int a = 0; a < R * mb; ++a) acc[a] = b0 == 0 ? _mm512_setzero_ps() : saved[a];
    const uint8_t *row = W + j * row_bytes;
    for (int64_t b = b0; b < b1; ++b)
        step(format, R, mb, row + b * step_bytes, row_bytes, X + b * mb * DECODE_BLOCK, DECODE_BLOCK, acc);
    if (b1 < steps) {
#pragma GCC unroll 24
        for (int a = 0; a < R * mb; ++a) saved[a] = acc[a];
        return;
    }
    if (tail) { /* bf16 only: the last weights, zero-padded to a whole step (X is already) */
        uint8_t w[MAX_R][2 * DECODE_BLOCK] = {{0}};
        for (int r = 0; r < R; ++r) memcpy(w[r], row + r * row_bytes + steps * step_bytes, (size_t)(2 * tail));
        step(format, R, mb, &w[0][0], 2 * DECODE_BLOCK, X + steps * mb * DECODE_BLOCK, DECODE_BLOCK, acc);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) Y[i * ldy + j + r] = _mm512_reduce_add_ps(acc[r * mb + i]);
}

/* Rows of W per tile for mb rows of X: R x mb accumulators + 2 weights + 2 activations
 * within the 32 registers. */
#define ROWS_FOR(mb) ((mb) == 1 ? 8 : (mb) <= 4 ? 4 : (mb) <= 12 ? 2 : 1)

/* While X's mb rows fit in L2 beside the stream of W (X_RESIDENT_BYTES), each tile runs
 * along the whole of K. A larger X (M = 16 rows of K = 14336 is 900 KiB) would be read back
 * from L3 for every tile, so then K is cut into pieces of K_PIECE steps (mb x 4 KiB of X, in
 * L2), and CHUNK_ROWS rows of W go through each piece before the next, their accumulators
 * parked in `saved` between pieces. */
enum { X_RESIDENT_BYTES = 256 * 1024, K_PIECE = 32, CHUNK_ROWS = 16 };

AVX512 INLINE void rows_mb(const int format, const int mb, const float *X, const uint8_t *W, int64_t row_bytes,
                           float *Y, int64_t ldy, int64_t K, int64_t j0, int64_t j1) {
    const int R = ROWS_FOR(mb);
    const int64_t steps = K / DECODE_BLOCK;
    if ((int64_t)mb * K * (int64_t)sizeof(float) <= X_RESIDENT_BYTES || steps <= K_PIECE) {
        int64_t j = j0;
        for (; j + R <= j1; j += R) tile(format, R, mb, X, W, row_bytes, K, j, 0, steps, NULL, Y, ldy);
        for (; j < j1; ++j) tile(format, 1, mb, X, W, row_bytes, K, j, 0, steps, NULL, Y, ldy);
        return;
    }
    __m512 saved[CHUNK_ROWS * DECODE_MAX_ROWS];
    for (int64_t c0 = j0; c0 < j1; c0 += CHUNK_ROWS) {
        const int64_t c1 = c0 + CHUNK_ROWS < j1 ? c0 + CHUNK_ROWS : j1;
        for (int64_t b0 = 0; b0 < steps || b0 == 0; b0 += K_PIECE) {
            const int64_t b1 = b0 + K_PIECE < steps ? b0 + K_PIECE : steps;
            int64_t j = c0;
            for (; j + R <= c1; j += R)
                tile(format, R, mb, X, W, row_bytes, K, j, b0, b1, saved + (j - c0) * mb, Y, ldy);
            for (; j < c1; ++j) tile(format, 1, mb, X, W, row_bytes, K, j, b0, b1, saved + (j - c0) * mb, Y, ldy);
        }
    }
}

AVX512 INLINE void rows(const int format, const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y,
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

AVX512 static void rows_q8_0(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy,
                             int64_t K, int64_t j0, int64_t j1) {
    rows(DECODE_Q8_0, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}
AVX512 static void rows_q4_0(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy,
                             int64_t K, int64_t j0, int64_t j1) {
    rows(DECODE_Q4_0, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}
AVX512 static void rows_bf16(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy,
                             int64_t K, int64_t j0, int64_t j1) {
    rows(DECODE_BF16, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}

const struct decode_kernels decode_avx512 = {rows_q8_0, rows_q4_0, rows_bf16};

#endif
