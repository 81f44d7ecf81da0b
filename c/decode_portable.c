/* Portable C kernels of the decode GEMV (decode.c): compile for any target (ARM, macOS).
 *
 * What changes from the SIMD kernels: nothing in the algorithm, only how it is written. Each
 * block of a row of W is dequantized into 32 floats on the stack, then multiplied into every
 * activation row's eight running sums (lane l takes weights l, l + 8, l + 16, l + 24 of each
 * block, in that order, as the AVX2 kernel's lanes do), loops the compiler vectorizes. One row
 * of W at a time.
 */
#include "decode.h"

/* 32 weights of one step of a row, as float32. */
static inline void dequantize_step(const int format, const uint8_t *p, float w[DECODE_BLOCK]) {
    if (format == DECODE_BF16) {
        for (int l = 0; l < DECODE_BLOCK; ++l) {
            const uint32_t bits = ((uint32_t)p[2 * l] | (uint32_t)p[2 * l + 1] << 8) << 16;
            memcpy(&w[l], &bits, sizeof(float));
        }
        return;
    }
    const float d = decode_half(p);
    if (format == DECODE_Q8_0) {
        for (int l = 0; l < DECODE_BLOCK; ++l) w[l] = d * (float)(int8_t)p[2 + l];
    } else { /* q4_0: byte l holds weight l (low nibble) and weight l + 16 (high nibble) */
        for (int l = 0; l < DECODE_BLOCK / 2; ++l) {
            w[l] = d * (float)((p[2 + l] & 0x0f) - 8);
            w[l + 16] = d * (float)((p[2 + l] >> 4) - 8);
        }
    }
}

enum { LANES = 8 };

/* One step: x is the step's packed activations, mb rows of 32. */
static inline void step(const int format, const uint8_t *p, const float *x, int64_t mb,
                        float acc[DECODE_MAX_ROWS][LANES]) {
    float w[DECODE_BLOCK];
    dequantize_step(format, p, w);   /* once per block ... */
    for (int64_t i = 0; i < mb; ++i) /* ... for every activation row */
        for (int s = 0; s < DECODE_BLOCK; s += LANES)
            for (int l = 0; l < LANES; ++l) acc[i][l] += w[s + l] * x[i * DECODE_BLOCK + s + l];
}

static inline void rows(const int format, const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y,
                        int64_t ldy, int64_t K, int64_t j0, int64_t j1) {
    const int64_t steps = K / DECODE_BLOCK, tail = K % DECODE_BLOCK, step_bytes = decode_step_bytes(format);
    for (int64_t j = j0; j < j1; ++j) {
        const uint8_t *row = W + j * row_bytes;
        float acc[DECODE_MAX_ROWS][LANES] = {{0}};
        for (int64_t b = 0; b < steps; ++b) step(format, row + b * step_bytes, X + b * mb * DECODE_BLOCK, mb, acc);
        if (tail) { /* bf16 only: the last weights, zero-padded to a whole step (X is already) */
            uint8_t w[2 * DECODE_BLOCK] = {0};
            memcpy(w, row + steps * step_bytes, (size_t)(2 * tail));
            step(format, w, X + steps * mb * DECODE_BLOCK, mb, acc);
        }
        for (int64_t i = 0; i < mb; ++i) /* the eight lanes summed in one fixed tree */
            Y[i * ldy + j] = ((acc[i][0] + acc[i][4]) + (acc[i][2] + acc[i][6])) +
                             ((acc[i][1] + acc[i][5]) + (acc[i][3] + acc[i][7]));
    }
}

static void rows_q8_0(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy, int64_t K,
                      int64_t j0, int64_t j1) {
    rows(DECODE_Q8_0, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}
static void rows_q4_0(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy, int64_t K,
                      int64_t j0, int64_t j1) {
    rows(DECODE_Q4_0, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}
static void rows_bf16(const float *X, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy, int64_t K,
                      int64_t j0, int64_t j1) {
    rows(DECODE_BF16, X, mb, W, row_bytes, Y, ldy, K, j0, j1);
}

const struct decode_kernels decode_portable = {rows_q8_0, rows_q4_0, rows_bf16};
