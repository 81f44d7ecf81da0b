/* A 16 x 16 transpose of 32-bit words in AVX-512 registers. packed_avx512.c packs float32 rows
 * of A with it, and bf16.c pairs of bfloat16 (one 32-bit word each), into the micro-panels their
 * kernels broadcast from: the values of one column side by side. Element by element, with a
 * row of A's stride between the loads, that packing was 4-10% of a product's time.
 *
 * Four stages of two-source shuffles, 64 in all for 256 words: the first two transpose each
 * 4 x 4 block within the 128-bit lanes (unpacklo/hi, then shuffle_ps), the last two move the
 * lanes into place (shuffle_f32x4, transpose_lanes). Compiled only where x86 intrinsics are;
 * each function is for AVX-512F, so it runs only behind the caller's CPUID check. */
#ifndef MATMUL_TRANSPOSE_AVX512_H
#define MATMUL_TRANSPOSE_AVX512_H

#include <immintrin.h>

#define TRANSPOSE_AVX512 static inline __attribute__((target("avx512f"), always_inline))

/* The last two stages: u0..u3 each hold four 128-bit lanes, lane L of each a piece of the
 * columns numbered from L (u0's from the first group of rows, u3's from the last). out[L]
 * gets lane L of u0, u1, u2 and u3, in that order: its columns' pieces in row order. */
TRANSPOSE_AVX512 void transpose_lanes(__m512 u0, __m512 u1, __m512 u2, __m512 u3, __m512 out[4]) {
    const __m512 x_even = _mm512_shuffle_f32x4(u0, u1, 0x88), x_odd = _mm512_shuffle_f32x4(u0, u1, 0xdd);
    const __m512 y_even = _mm512_shuffle_f32x4(u2, u3, 0x88), y_odd = _mm512_shuffle_f32x4(u2, u3, 0xdd);
    out[0] = _mm512_shuffle_f32x4(x_even, y_even, 0x88);
    out[1] = _mm512_shuffle_f32x4(x_odd, y_odd, 0x88);
    out[2] = _mm512_shuffle_f32x4(x_even, y_even, 0xdd);
    out[3] = _mm512_shuffle_f32x4(x_odd, y_odd, 0xdd);
}

/* rows[i] holds word c of row i in lane c; columns[c] gets word c of rows 0..15, in row order. */
TRANSPOSE_AVX512 void transpose_16x16_words(const __m512 rows[16], __m512 columns[16]) {
    __m512 t[16], u[16]; /* lane L of u[4g + j]: word 4L + j of rows 4g .. 4g + 3 */
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
        t[2 * g] = _mm512_unpacklo_ps(rows[2 * g], rows[2 * g + 1]);
        t[2 * g + 1] = _mm512_unpackhi_ps(rows[2 * g], rows[2 * g + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
        u[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        __m512 four[4]; /* words j, 4 + j, 8 + j, 12 + j */
        transpose_lanes(u[j], u[4 + j], u[8 + j], u[12 + j], four);
#pragma GCC unroll 4
        for (int L = 0; L < 4; ++L) columns[4 * L + j] = four[L];
    }
}

#endif
