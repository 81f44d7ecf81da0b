/* Private header of the decode GEMV (decode.c): what the driver shares with the kernels of
 * each instruction set (decode_portable.c, decode_avx2.c, decode_avx512.c). Not read by cffi.
 *
 * A row kernel computes Y[i][j] = sum_p X[i][p] * W[j][p] for i < mb (1 <= mb <= DECODE_MAX_ROWS
 * activation rows) and j0 <= j < j1 (rows of W, each row_bytes long in the packed format),
 * Y's rows ldy apart. Each block of W is dequantized once, to float32 in registers, and
 * multiplied into all mb rows before the next block is read.
 *
 * The activations Xp come packed step by step (decode.c, pack_activations): for each step b
 * of 32 weights along K, the mb rows' 32 values X[i][32b .. 32b+31], one row after another,
 * the last step zero-padded past K; so the rows a step needs are 128 mb contiguous bytes.
 * (Read in place, rows K floats apart, they fall in one L1 set whenever 4 K is a multiple of
 * 4096, as model widths are: 16 rows in an 8-way cache, which made M = 16 several times
 * slower per row than M = 12 on this project's Zen 4.)
 *
 * Determinism: each Y[i][j] is one fixed sequence of float32 operations over the blocks of
 * row j in order (its lanes, then one fixed horizontal sum), whatever mb, j0, j1 or the
 * number of W rows a kernel handles at once. So how the driver cuts N between threads, or M
 * into passes, never changes a bit of the result.
 */
#ifndef MATMUL_DECODE_H
#define MATMUL_DECODE_H

#include <stdint.h>
#include <string.h>

/* The formats, by ggml's type numbers (GGMLQuantizationType), which the harness passes. */
enum decode_format {
    DECODE_Q4_0 = 2,
    DECODE_Q8_0 = 8,
    DECODE_Q4_K = 12, /* c.decode_int8 only (decode_int8_q4k.c); c.decode refuses it */
    DECODE_BF16 = 30,
};

/* The variants, as c.packed numbers them: 0 chooses at run time. */
enum decode_variant {
    DECODE_AUTO = 0,
    DECODE_PORTABLE = 1,
    DECODE_AVX2 = 2,
    DECODE_AVX512 = 3,
};

/* The return codes of matmul_decode_f32. */
enum decode_status {
    DECODE_OK = 0,
    DECODE_ERR_VARIANT = 1,  /* unknown variant, or one this CPU (or build) cannot run */
    DECODE_ERR_ARGUMENT = 2, /* a negative dimension */
    DECODE_ERR_FORMAT = 3,   /* not one of enum decode_format, or not one the kernel takes */
    DECODE_ERR_BLOCK = 4,    /* K is not a multiple of the format's block (32 for q8_0, q4_0; 256 for q4_K) */
    DECODE_ERR_MEMORY = 5,   /* the packed copy of X could not be allocated */
};

/* Activation rows per pass over W: one block's 32 weights, dequantized once, feed this many. */
enum { DECODE_MAX_ROWS = 16 };

/* Weights per block, and what the kernels read as one step: 32 weights along K (for bf16,
 * 64 bytes: it has no blocks, and a K that is not a multiple of 32 ends in a zero-padded
 * step). */
enum { DECODE_BLOCK = 32 };

typedef void (*decode_rows_fn)(const float *Xp, int64_t mb, const uint8_t *W, int64_t row_bytes, float *Y, int64_t ldy,
                               int64_t K, int64_t j0, int64_t j1);

struct decode_kernels {
    decode_rows_fn q8_0, q4_0, bf16;
};

extern const struct decode_kernels decode_portable;
#if defined(__x86_64__) || defined(__i386__)
#define DECODE_HAVE_X86 1
extern const struct decode_kernels decode_avx2, decode_avx512;
#endif

/* q4_K's super-block: 256 weights in 144 bytes (float16 d and dmin, 12 bytes of eight 6-bit
 * scales and eight 6-bit mins, 128 bytes of 4-bit quants), 8 sub-blocks of 32. */
enum { DECODE_Q4_K_BLOCK = 256, DECODE_Q4_K_BYTES = 144 };

/* Weights per block of a format along K (bf16: 1), and bytes per block. */
static inline int64_t decode_block_weights(int format) {
    return format == DECODE_Q4_K ? DECODE_Q4_K_BLOCK : format == DECODE_BF16 ? 1 : DECODE_BLOCK;
}
static inline int64_t decode_block_bytes(int format) {
    return format == DECODE_Q4_K ? DECODE_Q4_K_BYTES : format == DECODE_Q8_0 ? 34 : format == DECODE_Q4_0 ? 18 : 2;
}

/* c.decode_int8's q4_K path (decode_int8_q4k.c), to which decode_int8.c's entry points hand
 * format DECODE_Q4_K: the arguments (less the format) and return values of
 * matmul_decode_int8_packed_bytes, matmul_decode_int8_pack and matmul_decode_int8_f32. */
int64_t decode_int8_q4k_packed_bytes(int64_t N, int64_t K);
int decode_int8_q4k_pack(const uint8_t *W, int64_t N, int64_t K, uint8_t *out);
int decode_int8_q4k_f32(const float *X, const uint8_t *W_packed, float *Y, int64_t M, int64_t N, int64_t K,
                        int64_t threads, int64_t variant);
/* ...and what it borrows from decode_int8.c: the variants, and X's q8_0 quantizer. */
int64_t matmul_decode_int8_resolve_variant(int64_t variant);
int matmul_quantize_q8_0(const float *x, int64_t n, uint8_t *out, int64_t variant);

/* Bytes per step of 32 weights. */
static inline int64_t decode_step_bytes(int format) {
    return format == DECODE_Q8_0 ? 34 : format == DECODE_Q4_0 ? 18 : 64;
}

/* A float16 (ggml's block scale) as float32, exactly, without F16C: the half's exponent and
 * mantissa moved into a float32's fields and rescaled by 2^112 (which also turns a half
 * subnormal into the right float32). Infinities and NaNs are refused by the harness before
 * any kernel runs; they come out as infinities and NaNs all the same. */
static inline float decode_half(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8; /* little-endian, as ggml stores it */
    const uint32_t sign = (h & 0x8000u) << 16, body = h & 0x7fffu;
    uint32_t bits = body << 13;
    float f;
    if (body >= 0x7c00u) {
        bits = 0x7f800000u | bits;
        memcpy(&f, &bits, sizeof f);
    } else {
        memcpy(&f, &bits, sizeof f);
        f *= 0x1p112f;
    }
    uint32_t out;
    memcpy(&out, &f, sizeof out);
    out |= sign;
    memcpy(&f, &out, sizeof f);
    return f;
}

#endif
