/* The integer core of the int8 decode kernels' tiles (decode_int8.c's tile_gang_vnni for q8_0
 * and q4_0, decode_int8_q4k.c's tile_vnni for q4_K): R rows of W, whose 8 slots of 64 bytes
 * each were unpacked into a buffer, times `gang` rows of X, slot by slot, each load of X's slot
 * feeding R vpdpbusd (and R loads of W's slot feeding `gang` of them). Each kernel sets the
 * accumulators' starting values before and applies its format's scales after.
 *
 * Two things the compiler would not do on its own: it folded X's load into each of the R
 * vpdpbusd (R loads of the same 64 bytes), and held W's slots in registers across the gangs,
 * where they spilled and were copied from stack to stack; the inline asm keeps X's slot in a
 * register once loaded and loads W's afresh for each gang. Compiled only where x86 intrinsics
 * are; each function is for AVX-512 VNNI, so it runs only behind the caller's CPUID check. */
#ifndef MATMUL_GANG_VNNI_H
#define MATMUL_GANG_VNNI_H

#include <immintrin.h>
#include <stdint.h>

enum {
    GANG = 4,        /* rows of X taken at once */
    GANG_W_ROWS = 4, /* rows of W at most: with GANG, 16 accumulators */
};

#define GANG_VNNI static inline __attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline))

/* dot[r][i] += the 8 vpdpbusd of W's row r (slots[r][s]) and X's row i (64 bytes at x + i *
 * x_stride + 64 * s) for r < R, i < gang. x_unsigned: X's bytes are vpdpbusd's unsigned
 * operand and W's its signed one (q8_0: x + 128 times w), else the other way round (4-bit
 * weights times signed x). */
GANG_VNNI void gang_dots_vnni(const int R, const int gang, const uint8_t *x, int64_t x_stride, const __m512i slots[][8],
                              const int x_unsigned, __m512i dot[][GANG]) {
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
        __m512i wv[GANG_W_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) __asm__ volatile("vmovdqa64 %1, %0" : "=v"(wv[r]) : "m"(slots[r][s]));
#pragma GCC unroll 4
        for (int i = 0; i < gang; ++i) {
            __m512i xv = _mm512_load_si512((const void *)(x + i * x_stride + 64 * s));
            __asm__("" : "+v"(xv));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r)
                dot[r][i] = x_unsigned ? _mm512_dpbusd_epi32(dot[r][i], xv, wv[r])  /* x + 128, w */
                                       : _mm512_dpbusd_epi32(dot[r][i], wv[r], xv); /* nibbles, x */
        }
    }
}

#endif
