/* Decode with integer dot products, llama.cpp's way: Y [M, N] = X [M, K] @ W^T with W in q8_0
 * or q4_0, and X itself quantized to q8_0 first.
 *
 * What changes from decode.c (weight-only): there, each block of W is dequantized to float32
 * and FMA'd with the float32 activations, so only the float32 sum rounds. Here each 32-wide
 * block of each activation row is quantized as ggml quantizes q8_0 (d_x = max|x| / 127 rounded
 * to float16, q_x = round(x / d_x)), once per call, and each block's dot product is taken in
 * integers: 32 products of int8 weights (q4_0: nibble - 8) and int8 activations, summed exactly
 * in int32, then scaled once by d_w * d_x and added to a float32 sum. That is 64 multiply-adds
 * in one instruction (AVX-512 VNNI's vpdpbusd; AVX2: vpmaddubsw + vpmaddwd for 32), instead of
 * converting 32 weights to float, scaling them and 32 FMAs.
 *
 * The price is the activations' rounding: each x moves by up to d_x / 2, half a step of its
 * block's 8-bit grid, so each output moves by up to sum over blocks of d_x / 2 * sum |w| on top
 * of the float32 error (tests/test_decode.py checks both: the ordinary float32 error model
 * against the float64 product of the quantized X and W, and that bound against the exact one).
 *
 * W is repacked once, outside the timed product, as ggml's CPU backend repacks q4_0 on load
 * (matmul_decode_int8_pack: the same bytes, moved; the harness does it in prepare()):
 *
 *   - One block per int32 lane. A group of 16 blocks (512 weights along K) of a row is 8
 *     slots of 64 bytes; slot s holds weights 4s..4s+3 of each of the 16 blocks, lane by lane.
 *     One vpdpbusd per slot then adds 4 products to each block's own lane, and after 8 slots
 *     each lane is one whole block's dot product: no horizontal sums, and one vcvtph2ps turns
 *     the group's 16 float16 scales into the 16 lanes' scales. q4_0 keeps slots 4..7 in the
 *     high nibbles of slots 0..3: one 64-byte load, an AND and a shift-and-AND give two slots.
 *   - Rows in tiles of 4, blocks of 8 tiles, and the bytes in the order the kernel reads them
 *     (group_offset): each thread reads one sequential stream. (Read in ggml's order, four
 *     rows at a time are four streams of a few KiB each, one row of 1 x 14336 x 4096 being
 *     2,304 bytes, and each new stream costs the hardware prefetcher its warm-up.)
 *   - A row's K is padded to whole groups with zero scales and zero weights.
 *
 * vpdpbusd multiplies unsigned by signed bytes, so one side of each product goes in shifted to
 * be unsigned and the shift comes back out exactly. q4_0 takes W's nibbles as they are,
 * n = w + 8 (unsigned), times x (signed, vpdpbusd's memory operand straight from X's copy),
 * and each block's lane starts from -8 times the sum of its activations (once per call, with
 * X's quantization). q8_0's weights are signed, so there the activations go in as x + 128
 * (stored so by the quantizer) and each lane starts from -128 times the sum of its weights
 * (one vpdpbusd per group of W, shared by every row of X). Both end at exactly sum (w * x).
 * (q4_0 took q8_0's roles until the nibbles were made the unsigned side, which spares the
 * weights' sums and an add per row of X: on one thread of a Zen 5, M x 4096 x 4096 with W in
 * cache, about 12% faster at M = 4 and 16.) AVX2's vpmaddubsw (unsigned times signed bytes,
 * pairs summed in int16) takes X as it is, signed: for q4_0 the unsigned nibbles times x, with
 * the same -8 offset, cannot saturate; for q8_0, x + 128 times w would, so it takes the
 * weights as |w| with w's sign moved onto x (vpsignb), as llama.cpp does.
 *
 * Variants: portable C, AVX2 and AVX-512 VNNI (512-bit; AVX512_VNNI and AVX512BW), chosen at
 * run time. Each Y element is one fixed float32 sequence over its blocks whatever thread,
 * tile or slice of K computes it: the same bits for every thread count and every M.
 * Activation rows are taken 16 at a time, each group of W unpacked once for all of them; four
 * rows of W at a time for up to four rows of X, then one, and from 9 rows (AVX-512 VNNI) four
 * again, four rows of X at a time (tile_gang_vnni). The number of X rows is a
 * compile-time constant for every M = 1..16 (a switch over inlined copies), so the loops over
 * them unroll and their accumulators are registers instead of a run-time-indexed array; the
 * operations, and the bits, are the same.
 *
 * What bounds it (this project's Zen 4, 2 cores): at M = 1, q8_0 reads W at the memory's
 * speed and q4_0 close to it; each further row of X costs 8 vpdpbusd per group, and this
 * core retires about 1.6 of them per ns, so from M = 4 or so the instructions, not W's bytes,
 * set the time.
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* posix_memalign under a strict -std=c11 */
#endif
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "decode.h"
#include "matmul.h"
#include "thread_pool.h"

#if DECODE_HAVE_X86
#include <immintrin.h>

#include "gang_vnni.h"
#endif

enum {
    Q8_BYTES = 34,      /* one q8_0 block: a float16 scale, 32 int8 */
    ROWS = 16,          /* rows of X per pass over W */
    TILE = 4,           /* rows of W interleaved in the packed layout */
    GROUP = 16,         /* blocks per group: one per int32 lane of a 512-bit register */
    SLOTS = 8,          /* 4-weight slots per block */
    BLOCK_TILES = 8,    /* tiles per block: the rows a slice of K runs over before the next */
    SLICE = 2,          /* groups per slice of K (TILES) */
    PREFETCH = 4096,    /* bytes ahead in W's stream (tile_avx2; tile_vnni at M = 2..4) */
    PREFETCH_L1 = 2048, /* tile_vnni's two steps (read_ahead_vnni): into L1 from this far ahead, */
    PREFETCH_L2 = 8192, /* into L2 from this far */
    TILE_MIN_M = 9,     /* rows of X from which tile_gang_vnni runs */
};

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

/* ---- W repacked (the header): tiles of TILE rows, groups of GROUP blocks ------------------- */

/* Weight bytes of one row's group (its 16 float16 scales, 32 bytes, follow the tile's weights). */
static inline int64_t group_weight_bytes(int format) { return format == DECODE_Q4_0 ? 256 : 512; }

static inline int64_t groups_of(int64_t K) { return (K / DECODE_BLOCK + GROUP - 1) / GROUP; }

/* Bytes of one packed row: every tile but the last holds TILE of them. */
static inline int64_t packed_row_bytes(int format, int64_t K) {
    return groups_of(K) * (group_weight_bytes(format) + 2 * GROUP);
}

/* Where weight k (0..31) of block l (0..15) of a group sits among a row's group bytes: in slot
 * k / 4 (64 bytes: 4 weights of each of the 16 blocks), byte 4 l + k % 4. q4_0 keeps slots 4..7
 * in the high nibbles of slots 0..3. */
static inline int64_t slot_byte(int format, int l, int k, int *high_nibble) {
    const int slot = k / 4;
    *high_nibble = format == DECODE_Q4_0 && slot >= 4;
    return (format == DECODE_Q4_0 ? slot % 4 : slot) * 64 + 4 * l + k % 4;
}

/* Where the group g of tile t starts. The order: blocks of BLOCK_TILES tiles (32 rows), in each
 * block slices of SLICE groups along K, in each slice the block's tiles, in each tile the
 * slice's groups, in each group the tile's rows' weights then their scales: the order the
 * kernels read in (TILES), so that each thread reads one sequential stream. */
static inline int64_t group_offset(int format, int64_t N, int64_t groups, int64_t t, int64_t g) {
    const int64_t row_group = group_weight_bytes(format) + 2 * GROUP, block_rows = BLOCK_TILES * TILE;
    const int64_t block = t / BLOCK_TILES, rows_in_block = min_i64(block_rows, N - block * block_rows);
    const int64_t g0 = g / SLICE * SLICE, in_slice = min_i64(SLICE, groups - g0), rows_in = min_i64(TILE, N - t * TILE);
    return (block * block_rows * groups + rows_in_block * g0 + (t - block * BLOCK_TILES) * TILE * in_slice +
            (g - g0) * rows_in) *
           row_group;
}

static int check_shape(int64_t N, int64_t K, int64_t format) {
    if (N < 0 || K < 0) return DECODE_ERR_ARGUMENT;
    if (format != DECODE_Q8_0 && format != DECODE_Q4_0) return DECODE_ERR_FORMAT;
    if (K % DECODE_BLOCK) return DECODE_ERR_BLOCK;
    return DECODE_OK;
}

/* The size of matmul_decode_int8_pack's output for W [N, K] in `format`, or minus a decode.h
 * code (-2 negative dimension, -3 format, -4 K not a multiple of 32). */
MATMUL_API int64_t matmul_decode_int8_packed_bytes(int64_t N, int64_t K, int64_t format) {
    if (format == DECODE_Q4_K) return decode_int8_q4k_packed_bytes(N, K); /* decode_int8_q4k.c (-4: K % 256) */
    const int status = check_shape(N, K, format);
    return status ? -status : N * packed_row_bytes((int)format, K);
}

/* W [N, K] in ggml's bytes (N rows of K / 32 blocks) to the layout the kernels read, in `out`
 * (matmul_decode_int8_packed_bytes long); q4_0's nibbles stay unsigned. Returns decode.h's
 * codes. */
MATMUL_API int matmul_decode_int8_pack(const uint8_t *W, int64_t N, int64_t K, int64_t format, uint8_t *out) {
    if (format == DECODE_Q4_K) return decode_int8_q4k_pack(W, N, K, out); /* decode_int8_q4k.c */
    const int status = check_shape(N, K, format);
    if (status) return status;
    const int64_t blocks = K / DECODE_BLOCK, groups = groups_of(K), step = decode_step_bytes((int)format);
    const int64_t weight_bytes = group_weight_bytes((int)format);
    const uint8_t pad = format == DECODE_Q4_0 ? 8 : 0; /* weight 0 (q4_0: nibble 8), scale 0 */
    for (int64_t j = 0; j < N; ++j) {
        const int64_t tile = j / TILE, r = j % TILE, rows_in = min_i64(TILE, N - tile * TILE);
        for (int64_t g = 0; g < groups; ++g) {
            uint8_t *at = out + group_offset((int)format, N, groups, tile, g);
            uint8_t *weights = at + r * weight_bytes, *scales = at + rows_in * weight_bytes + r * 2 * GROUP;
            for (int l = 0; l < GROUP; ++l) {
                const int64_t b = g * GROUP + l;
                const uint8_t *block = W + (j * blocks + b) * step;
                scales[2 * l] = b < blocks ? block[0] : 0;
                scales[2 * l + 1] = b < blocks ? block[1] : 0;
                for (int k = 0; k < DECODE_BLOCK; ++k) {
                    uint8_t value = pad;
                    if (b < blocks && format == DECODE_Q8_0)
                        value = block[2 + k];
                    else if (b < blocks)
                        value = k < 16 ? block[2 + k] & 0x0f : block[2 + k - 16] >> 4;
                    int high;
                    uint8_t *byte = weights + slot_byte((int)format, l, k, &high);
                    if (format == DECODE_Q8_0)
                        *byte = value;
                    else
                        *byte = high ? (uint8_t)((*byte & 0x0f) | value << 4) : (uint8_t)((*byte & 0xf0) | value);
                }
            }
        }
    }
    return DECODE_OK;
}

/* ---- X, quantized once per call ----------------------------------------------------------- */

/* One activation row's share of a group (16 blocks, 512 values along K), in the layout of W's:
 * what one vpdpbusd per slot multiplies by W's slot. */
struct x_group {
    /* x + 128 (q8_0 on AVX-512, and the portable kernel) or x (the header), slot by slot as
     * slot_byte places W */
    uint8_t q[SLOTS * 64];
    int32_t offset[GROUP]; /* for q4_0: -8 times the sum of each block's 32 x (the header) */
    float d[GROUP];        /* each block's float16 scale, as float32 */
};

/* One block of X into lane l of its group entry, from its q8_0 bytes (quantize_block): stored
 * as x + 128 (bias 0x80: vpdpbusd's unsigned operand) or as x (bias 0: vpdpbusd's or
 * vpmaddubsw's signed one) in W's slot order (slot_byte), with its offset and scale. */
static void put_block(const uint8_t block[Q8_BYTES], struct x_group *entry, int l, uint8_t bias) {
    int32_t sum = 0;
    for (int s = 0; s < SLOTS; ++s) {
        uint8_t four[4];
        for (int t = 0; t < 4; ++t) {
            four[t] = (uint8_t)(block[2 + 4 * s + t] ^ bias);
            sum += (int8_t)block[2 + 4 * s + t];
        }
        memcpy(entry->q + 64 * s + 4 * l, four, 4);
    }
    entry->offset[l] = -8 * sum;
    entry->d[l] = decode_half(block);
}

typedef void (*quantize_fn)(const float *x, uint8_t *out);

/* For each pass of up to ROWS rows, each group, the pass's rows in turn: group g of row i0 + m
 * of the pass at i0 is x[i0 * groups + g * mb + m]. The padding blocks are x = 0. */
static void quantize_activations(const float *X, int64_t M, int64_t K, quantize_fn quantize, uint8_t bias,
                                 struct x_group *x) {
    const int64_t blocks = K / DECODE_BLOCK, groups = groups_of(K);
    for (int64_t e = 0; e < M * groups; ++e) {
        memset(x[e].q, bias, sizeof x[e].q); /* x = 0 */
        memset(x[e].offset, 0, sizeof x[e].offset);
        memset(x[e].d, 0, sizeof x[e].d);
    }
    for (int64_t i0 = 0; i0 < M; i0 += ROWS) {
        const int64_t mb = min_i64(ROWS, M - i0);
        for (int64_t b = 0; b < blocks; ++b)
            for (int64_t m = 0; m < mb; ++m) {
                uint8_t block[Q8_BYTES];
                quantize(X + (i0 + m) * K + b * DECODE_BLOCK, block);
                put_block(block, x + i0 * groups + b / GROUP * mb + m, (int)(b % GROUP), bias);
            }
    }
}

/* ---- the kernels: Y[0..mb)[rows of blocks b0..b1), X's groups for the pass at x ------------- */

typedef void (*int8_rows_fn)(int format, const struct x_group *x, int64_t mb, const uint8_t *W, int64_t N, int64_t K,
                             float *Y, int64_t ldy, int64_t b0, int64_t b1);

static void rows_portable(int format, const struct x_group *x, int64_t mb, const uint8_t *W, int64_t N, int64_t K,
                          float *Y, int64_t ldy, int64_t b0, int64_t b1) {
    const int64_t groups = groups_of(K), weight_bytes = group_weight_bytes(format);
    for (int64_t j = b0 * BLOCK_TILES * TILE; j < min_i64(b1 * BLOCK_TILES * TILE, N); ++j) {
        const int64_t tile = j / TILE, r = j % TILE, rows_in = min_i64(TILE, N - tile * TILE);
        float acc[ROWS] = {0};
        for (int64_t g = 0; g < groups; ++g) {
            const uint8_t *at = W + group_offset(format, N, groups, tile, g);
            const uint8_t *weights = at + r * weight_bytes, *scales = at + rows_in * weight_bytes + r * 2 * GROUP;
            for (int l = 0; l < GROUP; ++l) {
                /* int16 operands: GCC 12 at -O3 with AVX512_VNNI vectorizes a sum of products of
                 * two signed char arrays with vpdpbusd, which reads one of them as unsigned
                 * (wrong results); products of shorts go to vpdpwssd, signed times signed. */
                int16_t w[DECODE_BLOCK], xs[DECODE_BLOCK];
                for (int k = 0; k < DECODE_BLOCK; ++k) {
                    int high;
                    const uint8_t byte = weights[slot_byte(format, l, k, &high)];
                    w[k] = (int16_t)(format == DECODE_Q8_0 ? (int8_t)byte : (high ? byte >> 4 : byte & 0x0f) - 8);
                }
                const float dw = decode_half(scales + 2 * l);
                for (int64_t i = 0; i < mb; ++i) {
                    const struct x_group *entry = x + g * mb + i;
                    for (int k = 0; k < DECODE_BLOCK; ++k) {
                        int high;
                        xs[k] = (int16_t)(entry->q[slot_byte(DECODE_Q8_0, l, k, &high)] - 128);
                    }
                    int32_t dot = 0;
                    for (int k = 0; k < DECODE_BLOCK; ++k) dot += (int32_t)w[k] * xs[k];
                    acc[i] += (float)dot * (dw * entry->d[l]);
                }
            }
        }
        for (int64_t i = 0; i < mb; ++i) Y[i * ldy + j] = acc[i];
    }
}

#if DECODE_HAVE_X86
#define INLINE static inline __attribute__((always_inline))
#define AVX2   __attribute__((target("avx2,fma,f16c")))
#define VNNI   __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))

AVX2 INLINE float sum8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

/* An empty asm that says it changes v: the sums then follow the slots in order. Without it,
 * GCC reassociates the integer sums and computes every product of the half-group first,
 * spilling them (a quarter of the instructions, loads and stores, at M = 4). */
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))

/* Rows of X per pass over one half-group of W in tile_avx2: their integer sums stay in
 * registers (16 of them) beside W's slot and X's operands, instead of spilling. */
enum { AVX2_CHUNK_Q8 = 8, AVX2_CHUNK_Q4 = 6, AVX2_CHUNK_MAX = 8 };
_Static_assert(AVX2_CHUNK_Q8 <= AVX2_CHUNK_MAX && AVX2_CHUNK_Q4 <= AVX2_CHUNK_MAX, "a chunk larger than its arrays");

/* One half-group of one row of W (8 blocks, at w; their scales dw) times `rows` rows of X
 * (their groups at xg), added to acc[0..rows): each slot of W loaded once for all the rows,
 * whose block sums stay in registers. `rows` is a constant wherever this is inlined, so its
 * loops unroll and the arrays become registers.
 *
 * q4_0 takes the nibbles as they are, unsigned 0..15, times x signed: vpmaddubsw cannot
 * saturate there (a pair is at most 2 * 15 * 127), so the 8 slots' pairs are summed in int16
 * (at most 30480) and widened once, and the -8 comes back as the block's offset, -8 times the
 * sum of its x (the header). q8_0's weights are signed, so it takes |w| times x with w's sign
 * (vpmaddubsw saturates past 2^15 otherwise, the header), widened slot by slot. Both give each
 * block's dot product exactly. */
AVX2 INLINE void half_group_avx2(const int format, const int rows, const struct x_group *xg, const uint8_t *w,
                                 const __m256 dw, const int half, __m256 *acc) {
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256i dot[AVX2_CHUNK_MAX];
    if (format == DECODE_Q4_0) {
        __m256i pairs[AVX2_CHUNK_MAX];
#pragma GCC unroll 8
        for (int s = 0; s < 4; ++s) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 64 * s));
            const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
#pragma GCC unroll 8
            for (int i = 0; i < rows; ++i) {
                const uint8_t *q = xg[i].q + 32 * half;
                const __m256i x_lo = _mm256_load_si256((const __m256i *)(q + 64 * s));
                const __m256i x_hi = _mm256_load_si256((const __m256i *)(q + 64 * (s + 4)));
                const __m256i sum = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_lo), _mm256_maddubs_epi16(hi, x_hi));
                pairs[i] = s ? _mm256_add_epi16(pairs[i], sum) : sum;
                KEEP_IN_REGISTER(pairs[i]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < rows; ++i)
            dot[i] = _mm256_add_epi32(_mm256_madd_epi16(pairs[i], ones),
                                      _mm256_load_si256((const __m256i *)(xg[i].offset + 8 * half)));
    } else {
#pragma GCC unroll 8
        for (int s = 0; s < SLOTS; ++s) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(w + 64 * s)), magnitude = _mm256_sign_epi8(v, v);
#pragma GCC unroll 8
            for (int i = 0; i < rows; ++i) {
                const __m256i xs = _mm256_load_si256((const __m256i *)(xg[i].q + 64 * s + 32 * half));
                const __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xs, v)), ones);
                dot[i] = s ? _mm256_add_epi32(dot[i], sum) : sum;
                KEEP_IN_REGISTER(dot[i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < rows; ++i)
        acc[i] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]), _mm256_mul_ps(dw, _mm256_load_ps(xg[i].d + 8 * half)), acc[i]);
}

/* R rows of a tile (rows_in rows), from its row r0, for mb rows of X: 8 blocks (each slot's
 * 256-bit half) at a time, in chunks of rows of X (half_group_avx2: AVX2 has 16 registers, and
 * holding all 8 slots and every row's accumulators, as tile_vnni does in its 32, spilled). The
 * float32 operations per element, and so the bits, are those of one fixed order over K. */
AVX2 INLINE void tile_avx2(const int format, const int R, const int mb, const struct x_group *x, const uint8_t *tile,
                           int64_t rows_in, int64_t r0, int64_t groups, int64_t g0, int64_t g1, float *partial,
                           float *Y, int64_t ldy) {
    const int64_t weight_bytes = group_weight_bytes(format), group_bytes = rows_in * (weight_bytes + 2 * GROUP);
    const int chunk = format == DECODE_Q4_0 ? AVX2_CHUNK_Q4 : AVX2_CHUNK_Q8, whole = mb / chunk * chunk;
    __m256 acc[ROWS];
#pragma GCC unroll 16
    for (int a = 0; a < R * mb; ++a) acc[a] = g0 ? _mm256_load_ps(partial + 16 * (r0 * mb + a)) : _mm256_setzero_ps();
    for (int64_t g = g0; g < g1; ++g) {
        const uint8_t *at = tile + (g - g0) * group_bytes;
        const struct x_group *xg = x + g * mb;
        for (int r = 0; r < R; ++r) {
            /* W read ahead by hand keeps more of its lines in flight, one step from 4 KiB (on Zen 2,
             * 4x4096x14336 q8_0 on 1 thread 14.3 -> 8.2 ms, W from DRAM; tile_vnni's two steps
             * were slower here: read_ahead_vnni) */
            for (int64_t line = 0; line < weight_bytes + 2 * GROUP; line += 64)
                _mm_prefetch((const char *)(at + (r0 + r) * weight_bytes + PREFETCH + line), _MM_HINT_T0);
            for (int half = 0; half < 2; ++half) { /* blocks 0..7, then 8..15 */
                const uint8_t *w = at + (r0 + r) * weight_bytes + 32 * half;
                const __m256 dw = _mm256_cvtph_ps(
                    _mm_loadu_si128((const __m128i *)(at + rows_in * weight_bytes + (r0 + r) * 2 * GROUP + 16 * half)));
                for (int i0 = 0; i0 < whole; i0 += chunk)
                    half_group_avx2(format, chunk, xg + i0, w, dw, half, acc + r * mb + i0);
                if (mb > whole) half_group_avx2(format, mb - whole, xg + whole, w, dw, half, acc + r * mb + whole);
            }
        }
    }
    if (g1 < groups)
#pragma GCC unroll 16
        for (int a = 0; a < R * mb; ++a) _mm256_store_ps(partial + 16 * (r0 * mb + a), acc[a]);
    else
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
            for (int i = 0; i < mb; ++i) Y[i * ldy + r0 + r] = sum8(acc[r * mb + i]);
}

/* W read ahead by hand for tile_vnni's row `row` of the tile group at `at`: the hardware
 * prefetcher alone keeps too few of W's lines in flight from memory. At M = 1 the kernel runs
 * through W fastest, and at M = 5..16 it takes the tile's rows one at a time (R = 1), hopping
 * between them; there W is brought ahead in two steps: into L2 from 8 KiB ahead, into L1 from
 * 2 KiB ahead, each row of the tile a share of the group's bytes so that together they cover
 * the whole stream (Zen 5,
 * W from DRAM, medians of interleaved runs on the same copies of W: q8_0 1 x 4096 x 4096 on
 * two threads 7-30% faster, 8 x 4096 x 4096 28-61%; q4_0 8 x 4096 x 4096 7-22%). At M = 2..4
 * one step from 4 KiB ahead, row by row, stays the faster (two steps: 5-9% slower at M = 4
 * in q8_0), as it was everywhere before: on an AVX-512 VNNI Xeon, 14336 x 8192, one thread,
 * M = 4 went from 15.4 to 11.8 ms and M = 16 from 33.9 to 16.4 ms with it. tile_avx2 keeps
 * the one step: on the same Zen 5 its M = 1 in q8_0 was 6-9% slower with two. */
VNNI INLINE void read_ahead_vnni(const int mb, const uint8_t *at, int64_t row, int64_t weight_bytes) {
    if (mb >= 2 && mb <= 4) {
        for (int64_t line = 0; line < weight_bytes + 2 * GROUP; line += 64)
            _mm_prefetch((const char *)(at + row * weight_bytes + PREFETCH + line), _MM_HINT_T0);
        return;
    }
    const uint8_t *share = at + row * (weight_bytes + 2 * GROUP);
    for (int64_t line = 0; line < weight_bytes + 2 * GROUP; line += 64) {
        _mm_prefetch((const char *)(share + PREFETCH_L1 + line), _MM_HINT_T0);
        _mm_prefetch((const char *)(share + PREFETCH_L2 + line), _MM_HINT_T1);
    }
}

/* R rows of a tile (rows_in rows), from its row r0, for mb rows of X: 16 blocks at a time, one
 * block per int32 lane, x + 128 times w through vpdpbusd (the header). */
VNNI INLINE void tile_vnni(const int format, const int R, const int mb, const struct x_group *x, const uint8_t *tile,
                           int64_t rows_in, int64_t r0, int64_t groups, int64_t g0, int64_t g1, float *partial,
                           float *Y, int64_t ldy) {
    const int64_t weight_bytes = group_weight_bytes(format), group_bytes = rows_in * (weight_bytes + 2 * GROUP);
    const __m512i low = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
    const __m512i minus_128 = _mm512_set1_epi8((char)0x80); /* as a signed byte -128, unsigned 128 */
    __m512 acc[ROWS];
#pragma GCC unroll 16
    for (int a = 0; a < R * mb; ++a) acc[a] = g0 ? _mm512_load_ps(partial + 16 * (r0 * mb + a)) : _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; ++g) {
        const uint8_t *at = tile + (g - g0) * group_bytes;
        for (int r = 0; r < R; ++r) {
            const uint8_t *w = at + (r0 + r) * weight_bytes;
            read_ahead_vnni(mb, at, r0 + r, weight_bytes);
            const __m512 dw = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(at + rows_in * weight_bytes + (r0 + r) * 2 * GROUP)));
            __m512i slot[SLOTS], from = zero; /* the weights (q4_0: nibbles); where q8_0's lanes start */
            if (format == DECODE_Q4_0) {
                for (int s = 0; s < 4; ++s) {
                    const __m512i v = _mm512_loadu_si512(w + 64 * s);
                    slot[s] = _mm512_and_si512(v, low);
                    slot[s + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                }
            } else {
                __m512i sums = zero;
                for (int s = 0; s < SLOTS; ++s) {
                    slot[s] = _mm512_loadu_si512(w + 64 * s);
                    sums = _mm512_dpbusd_epi32(sums, minus_128, slot[s]); /* 128 times each block's weights */
                }
                from = _mm512_sub_epi32(zero, sums);
            }
#pragma GCC unroll 16
            for (int i = 0; i < mb; ++i) {
                const struct x_group *entry = x + g * mb + i;
                /* two chains of 4 vpdpbusd each, for the latency */
                __m512i even, odd = zero;
                if (format == DECODE_Q4_0) { /* the nibbles (unsigned) times x (signed, from memory) */
                    even = _mm512_load_si512(entry->offset);
                    for (int s = 0; s < SLOTS; s += 2) {
                        even = _mm512_dpbusd_epi32(even, slot[s], _mm512_load_si512(entry->q + 64 * s));
                        odd = _mm512_dpbusd_epi32(odd, slot[s + 1], _mm512_load_si512(entry->q + 64 * (s + 1)));
                    }
                } else { /* x + 128 (unsigned) times w (signed) */
                    even = from;
                    for (int s = 0; s < SLOTS; s += 2) {
                        even = _mm512_dpbusd_epi32(even, _mm512_load_si512(entry->q + 64 * s), slot[s]);
                        odd = _mm512_dpbusd_epi32(odd, _mm512_load_si512(entry->q + 64 * (s + 1)), slot[s + 1]);
                    }
                }
                const __m512 scale = _mm512_mul_ps(dw, _mm512_load_ps(entry->d));
                acc[r * mb + i] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even, odd)), scale, acc[r * mb + i]);
            }
        }
    }
    if (g1 < groups)
#pragma GCC unroll 16
        for (int a = 0; a < R * mb; ++a) _mm512_store_ps(partial + 16 * (r0 * mb + a), acc[a]);
    else
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
            for (int i = 0; i < mb; ++i) Y[i * ldy + r0 + r] = _mm512_reduce_add_ps(acc[r * mb + i]);
}

_Static_assert(TILE <= GANG_W_ROWS, "tile_gang_vnni takes a tile's rows of W at once (gang_vnni.h)");

/* tile_gang_vnni's gang: `gang` rows of X (x) times the R rows of W whose slots are in slots
 * (gang_vnni.h), into their lanes (row r's, X's row i at lanes + 16 * (r * mb + i)) or, at
 * the last group, their sums (y[i * ldy + r]). */
VNNI INLINE void gang_vnni(const int format, const int R, const int gang, const struct x_group *x,
                           const __m512i slots[][SLOTS], const __m512i *from, const __m512 *dw, int start, int end,
                           float *lanes, int64_t mb, float *y, int64_t ldy) {
    __m512i dot[TILE][GANG];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int i = 0; i < gang; ++i) dot[r][i] = format == DECODE_Q4_0 ? _mm512_load_si512(x[i].offset) : from[r];
    gang_dots_vnni(R, gang, x->q, sizeof *x, slots, format == DECODE_Q8_0, dot);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int i = 0; i < gang; ++i) {
            float *at = lanes + 16 * (r * mb + i);
            __m512 acc = start ? _mm512_setzero_ps() : _mm512_load_ps(at);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][i]), _mm512_mul_ps(dw[r], _mm512_load_ps(x[i].d)), acc);
            if (end)
                y[i * ldy + r] = _mm512_reduce_add_ps(acc);
            else
                _mm512_store_ps(at, acc);
        }
}

/* tile_vnni for 9 rows of X or more: the tile's R rows of W at once, so that each load of X
 * feeds R vpdpbusd (tile_vnni's vpdpbusd each load their X, one a vpdpbusd, and from M = 16 on
 * that set the pace: about 0.52 ns each on this project's Zen 4, which issues one a cycle,
 * 0.27 ns). Each group's slots of the R rows go to a buffer on the stack, then gang_vnni takes
 * GANG rows of X at a time; each lane's float32 accumulator waits in `partial` between groups.
 * The integers and each lane's float sequence are tile_vnni's: the same bits. Zen 4, one
 * thread, W 4096 x 4096 in cache, medians of 15 interleaved rounds against tile_vnni: M = 12,
 * 16, 128 and 512 q8_0 1.06-1.08x faster, q4_0 1.14-1.16x; M = 9 0.99x and 1.07x. */
VNNI INLINE void tile_gang_vnni(const int format, const int R, const int mb, const struct x_group *x,
                                const uint8_t *tile, int64_t rows_in, int64_t r0, int64_t groups, int64_t g0,
                                int64_t g1, float *partial, float *Y, int64_t ldy) {
    const int64_t weight_bytes = group_weight_bytes(format), group_bytes = rows_in * (weight_bytes + 2 * GROUP);
    const __m512i low = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
    const __m512i minus_128 = _mm512_set1_epi8((char)0x80); /* as a signed byte -128, unsigned 128 */
    _Alignas(64) __m512i slots[TILE][SLOTS], from[TILE];
    __m512 dw[TILE];
    for (int64_t g = g0; g < g1; ++g) {
        const uint8_t *at = tile + (g - g0) * group_bytes;
        for (int r = 0; r < R; ++r) {
            const uint8_t *w = at + (r0 + r) * weight_bytes;
            read_ahead_vnni(mb, at, r0 + r, weight_bytes);
            dw[r] = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(at + rows_in * weight_bytes + (r0 + r) * 2 * GROUP)));
            if (format == DECODE_Q4_0) {
                for (int s = 0; s < 4; ++s) {
                    const __m512i v = _mm512_loadu_si512(w + 64 * s);
                    slots[r][s] = _mm512_and_si512(v, low);
                    slots[r][s + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                }
            } else {
                __m512i sums = zero;
                for (int s = 0; s < SLOTS; ++s) {
                    slots[r][s] = _mm512_loadu_si512(w + 64 * s);
                    sums = _mm512_dpbusd_epi32(sums, minus_128, slots[r][s]); /* 128 times each block's weights */
                }
                from[r] = _mm512_sub_epi32(zero, sums);
            }
        }
        const struct x_group *group_x = x + g * mb; /* the group's mb entries */
        int i0 = 0;
#pragma GCC unroll 1
        for (; i0 + GANG <= mb; i0 += GANG) /* a loop, not unrolled: unrolled, the gangs spilled */
            gang_vnni(format, R, GANG, group_x + i0, slots, from, dw, g == 0, g == groups - 1,
                      partial + 16 * (r0 * mb + i0), mb, Y + i0 * ldy + r0, ldy);
        if (mb % GANG)
            gang_vnni(format, R, mb % GANG, group_x + i0, slots, from, dw, g == 0, g == groups - 1,
                      partial + 16 * (r0 * mb + i0), mb, Y + i0 * ldy + r0, ldy);
    }
}

/* 8 floats, already multiplied by 1 / d, rounded as quantize_block rounds them (roundf, half
 * away from zero: the truncation, plus the sign where the rest is at least a half; both
 * exact), as int32. */
AVX2 INLINE __m256i round_to_ints(__m256 v) {
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 whole = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 rest = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(v, whole));
    const __m256 away =
        _mm256_and_ps(_mm256_cmp_ps(rest, _mm256_set1_ps(0.5f), _CMP_GE_OQ), _mm256_or_ps(sign, _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_add_ps(whole, away));
}

/* quantize_block, the same bytes, in 256-bit registers (a block with an infinity or a NaN, or
 * a scale too small to invert, goes to quantize_block itself). */
AVX2 static void quantize_block_avx2(const float *x, uint8_t *out) {
    __m256 v[4], amax = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[i]));
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, amax);
    float biggest = 0;
    for (int l = 0; l < 8; ++l) biggest = fmaxf(biggest, lanes[l]);
    const float d = biggest / 127.0f, inverse = d != 0 ? 1.0f / d : 0.0f;
    if (_mm256_movemask_ps(unordered) || !(biggest <= FLT_MAX) || !(inverse <= FLT_MAX)) {
        quantize_block(x, out);
        return;
    }
    const uint16_t h = half_of(d);
    out[0] = (uint8_t)(h & 0xff);
    out[1] = (uint8_t)(h >> 8);
    const __m256 scale = _mm256_set1_ps(inverse);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = round_to_ints(_mm256_mul_ps(v[i], scale));
    /* to bytes: the packs work within 128-bit lanes, the permute puts the 32 back in order */
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)(out + 2),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* 16 floats, already multiplied by 1 / d, to int8 as quantize_block rounds them: roundf,
 * half away from zero (the truncation, plus the sign where the rest is at least a half; both
 * exact). */
VNNI INLINE __m128i round_to_bytes(__m512 v) {
    const __m512 whole = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 away = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, whole)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u));
    const __m512 one = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(_mm512_mask_add_ps(whole, away, whole, one)));
}

/* quantize_block, the same bytes, in 512-bit registers (a block with an infinity or a NaN, or
 * a scale too small to invert, goes to quantize_block itself). */
VNNI static void quantize_block_avx512(const float *x, uint8_t *out) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float d = amax / 127.0f, inverse = d != 0 ? 1.0f / d : 0.0f;
    if (_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) || !(amax <= FLT_MAX) || !(inverse <= FLT_MAX)) {
        quantize_block(x, out);
        return;
    }
    const uint16_t h = half_of(d);
    out[0] = (uint8_t)(h & 0xff);
    out[1] = (uint8_t)(h >> 8);
    const __m512 scale = _mm512_set1_ps(inverse);
    _mm_storeu_si128((__m128i *)(out + 2), round_to_bytes(_mm512_mul_ps(a, scale)));
    _mm_storeu_si128((__m128i *)(out + 18), round_to_bytes(_mm512_mul_ps(b, scale)));
}

/* Blocks b0..b1 of BLOCK_TILES tiles of W, R rows of each tile at a time (the last tile may
 * hold fewer than TILE rows: what R does not divide goes one row at a time, with the same
 * operations per row).
 *
 * K in slices of SLICE groups, so that the share of X a slice needs stays in L1 beside the
 * stream of W: every row of W is multiplied by all of X, which at M x K x 1.25 bytes is in L2
 * from about 8 x 2048, and reading it from there, not W's memory traffic, set the time
 * (8 x 4096 x 14336 took 1.5-2x as long with whole rows on this project's Zen 4). Each slice
 * runs over all of the block's rows in turn; between slices each row's accumulators wait in
 * `partial`, exactly, so the float32 sums and the bits are those of whole rows.
 *
 * A statement macro, one text for both instruction sets, because a function cannot take the
 * tile kernel without costing speed: as an always-inlined function given tile_avx2 or
 * tile_vnni by pointer (which GCC inlines too) the kernels compiled differently, and
 * 4 x 4096 x 4096 q8_0 ran 5% slower on AVX2 (one thread, medians of 9 interleaved). */
#define TILES(KERNEL, FORMAT, R, MB)                                                                                   \
    do {                                                                                                               \
        const int64_t groups = groups_of(K), tiles = (N + TILE - 1) / TILE;                                            \
        for (int64_t block = b0; block < b1; ++block)                                                                  \
            for (int64_t g0 = 0; g0 < groups; g0 += SLICE)                                                             \
                for (int64_t t = block * BLOCK_TILES; t < min_i64((block + 1) * BLOCK_TILES, tiles); ++t) {            \
                    const int64_t rows_in = min_i64(TILE, N - t * TILE), g1 = min_i64(g0 + SLICE, groups);             \
                    const uint8_t *at = W + group_offset(FORMAT, N, groups, t, g0);                                    \
                    float *y = Y + t * TILE, *part = partial + (t - block * BLOCK_TILES) * TILE * ROWS * 16;           \
                    int64_t r = 0;                                                                                     \
                    for (; r + (R) <= rows_in; r += (R))                                                               \
                        KERNEL(FORMAT, R, MB, x, at, rows_in, r, groups, g0, g1, part, y, ldy);                        \
                    for (; r < rows_in; ++r) KERNEL(FORMAT, 1, MB, x, at, rows_in, r, groups, g0, g1, part, y, ldy);   \
                }                                                                                                      \
    } while (0)

/* mb as a constant: its loops unroll and its accumulators live in registers. AVX2 has 16
 * registers: up to 8 accumulators (R x mb), then one row of W at a time. */
AVX2 INLINE void rows_avx2_format(const int format, const struct x_group *x, int64_t mb, const uint8_t *W, int64_t N,
                                  int64_t K, float *Y, int64_t ldy, int64_t b0, int64_t b1) {
    /* each row's accumulators between slices of K (TILES), for a block of tiles */
    _Alignas(64) float partial[BLOCK_TILES * TILE * ROWS * 16];
    switch (mb) {
    case 1: TILES(tile_avx2, format, 4, 1); break;
    case 2: TILES(tile_avx2, format, 4, 2); break;
    case 3: TILES(tile_avx2, format, 2, 3); break;
    case 4: TILES(tile_avx2, format, 2, 4); break;
    case 5: TILES(tile_avx2, format, 1, 5); break;
    case 6: TILES(tile_avx2, format, 1, 6); break;
    case 7: TILES(tile_avx2, format, 1, 7); break;
    case 8: TILES(tile_avx2, format, 1, 8); break;
    case 9: TILES(tile_avx2, format, 1, 9); break;
    case 10: TILES(tile_avx2, format, 1, 10); break;
    case 11: TILES(tile_avx2, format, 1, 11); break;
    case 12: TILES(tile_avx2, format, 1, 12); break;
    case 13: TILES(tile_avx2, format, 1, 13); break;
    case 14: TILES(tile_avx2, format, 1, 14); break;
    case 15: TILES(tile_avx2, format, 1, 15); break;
    case 16: TILES(tile_avx2, format, 1, 16); break;
    default: break; /* the driver passes at most ROWS */
    }
}

AVX2 static void rows_avx2(int format, const struct x_group *x, int64_t mb, const uint8_t *W, int64_t N, int64_t K,
                           float *Y, int64_t ldy, int64_t b0, int64_t b1) {
    if (format == DECODE_Q4_0)
        rows_avx2_format(DECODE_Q4_0, x, mb, W, N, K, Y, ldy, b0, b1);
    else
        rows_avx2_format(DECODE_Q8_0, x, mb, W, N, K, Y, ldy, b0, b1);
}

/* TILES with the format a constant in each branch, so that each kernel compiles for one format. */
#define BY_FORMAT(KERNEL, R, MB)                                                                                       \
    do {                                                                                                               \
        if (format == DECODE_Q4_0)                                                                                     \
            TILES(KERNEL, DECODE_Q4_0, R, MB);                                                                         \
        else                                                                                                           \
            TILES(KERNEL, DECODE_Q8_0, R, MB);                                                                         \
    } while (0)

/* AVX-512 has 32 registers: up to 16 accumulators beside a row's 8 slots, then one row of W at
 * a time (two rows at M = 5..8 would need about all 32); from 9 rows of X, tile_gang_vnni. Two
 * functions, each with its own stack frame, as in decode_int8_q4k.c (where one function for
 * both made M = 4 take 1.2x as long). */
VNNI __attribute__((noinline)) static void rows_vnni_by_row(const int format, const struct x_group *x, int64_t mb,
                                                            const uint8_t *W, int64_t N, int64_t K, float *Y,
                                                            int64_t ldy, int64_t b0, int64_t b1) {
    /* each row's accumulators between slices of K (TILES), for a block of tiles */
    _Alignas(64) float partial[BLOCK_TILES * TILE * ROWS * 16];
    switch (mb) {
    case 1: BY_FORMAT(tile_vnni, 4, 1); break;
    case 2: BY_FORMAT(tile_vnni, 4, 2); break;
    case 3: BY_FORMAT(tile_vnni, 4, 3); break;
    case 4: BY_FORMAT(tile_vnni, 4, 4); break;
    case 5: BY_FORMAT(tile_vnni, 1, 5); break;
    case 6: BY_FORMAT(tile_vnni, 1, 6); break;
    case 7: BY_FORMAT(tile_vnni, 1, 7); break;
    case 8: BY_FORMAT(tile_vnni, 1, 8); break;
    default: break; /* rows_vnni passes 1 .. TILE_MIN_M - 1 */
    }
}

VNNI __attribute__((noinline)) static void rows_vnni_by_tile(const int format, const struct x_group *x, int64_t mb,
                                                             const uint8_t *W, int64_t N, int64_t K, float *Y,
                                                             int64_t ldy, int64_t b0, int64_t b1) {
    _Alignas(64) float partial[BLOCK_TILES * TILE * ROWS * 16];
    switch (mb) {
    case 9: BY_FORMAT(tile_gang_vnni, 4, 9); break;
    case 10: BY_FORMAT(tile_gang_vnni, 4, 10); break;
    case 11: BY_FORMAT(tile_gang_vnni, 4, 11); break;
    case 12: BY_FORMAT(tile_gang_vnni, 4, 12); break;
    case 13: BY_FORMAT(tile_gang_vnni, 4, 13); break;
    case 14: BY_FORMAT(tile_gang_vnni, 4, 14); break;
    case 15: BY_FORMAT(tile_gang_vnni, 4, 15); break;
    case 16: BY_FORMAT(tile_gang_vnni, 4, 16); break;
    default: break; /* rows_vnni passes TILE_MIN_M .. ROWS */
    }
#undef BY_FORMAT
}

VNNI static void rows_vnni(int format, const struct x_group *x, int64_t mb, const uint8_t *W, int64_t N, int64_t K,
                           float *Y, int64_t ldy, int64_t b0, int64_t b1) {
    if (mb < TILE_MIN_M)
        rows_vnni_by_row(format, x, mb, W, N, K, Y, ldy, b0, b1);
    else
        rows_vnni_by_tile(format, x, mb, W, N, K, Y, ldy, b0, b1);
}

#endif

/* ---- variants and the public call --------------------------------------------------------- */

MATMUL_API int matmul_decode_int8_variant_supported(int64_t variant) {
    switch (variant) {
    case DECODE_AUTO:
    case DECODE_PORTABLE: return 1;
#if DECODE_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
    case DECODE_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case DECODE_AVX512:
        __builtin_cpu_init();
        return matmul_decode_int8_variant_supported(DECODE_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
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

static quantize_fn quantizer_for(int64_t resolved) {
#if DECODE_HAVE_X86
    if (resolved == DECODE_AVX512) return quantize_block_avx512;
    if (resolved == DECODE_AVX2) return quantize_block_avx2;
#endif
    (void)resolved;
    return quantize_block;
}

/* x [n] to q8_0 blocks (n a multiple of 32) with the quantizer `variant` uses (AVX2 and
 * AVX-512 have their own): what tests/test_decode.py checks against gguf. Returns decode.h's codes. */
MATMUL_API int matmul_quantize_q8_0(const float *x, int64_t n, uint8_t *out, int64_t variant) {
    if (n < 0) return DECODE_ERR_ARGUMENT;
    if (n % DECODE_BLOCK) return DECODE_ERR_BLOCK;
    const int64_t resolved = matmul_decode_int8_resolve_variant(variant);
    if (resolved < 0) return DECODE_ERR_VARIANT;
    const quantize_fn quantize = quantizer_for(resolved);
    for (int64_t b = 0; b < n / DECODE_BLOCK; ++b) quantize(x + b * DECODE_BLOCK, out + b * Q8_BYTES);
    return DECODE_OK;
}

struct int8_job {
    const struct x_group *x; /* X as quantize_activations leaves it */
    const uint8_t *W;        /* packed */
    float *Y;
    int64_t M, N, K, groups, blocks, parts;
    int format;
    int8_rows_fn rows;
};

/* A thread's share of W (blocks b0..b1 of BLOCK_TILES tiles) times all of X, ROWS rows of X per
 * pass. With more rows than one pass takes (prefill: M = 32..1024), each block of W runs all the
 * passes before the next block: the block (32 rows of W, 139 KB at K = 4096 in q8_0) is read
 * from memory once and from cache by the other passes, where pass by pass over all of W read it
 * from memory M / ROWS times. Each Y element is computed as before: the same bits. */
static void int8_task(void *context, int64_t part) {
    const struct int8_job *job = context;
    const int64_t b0 = job->blocks * part / job->parts, b1 = job->blocks * (part + 1) / job->parts;
    const int64_t panel = job->M > ROWS ? 1 : b1 - b0;
    for (int64_t p0 = b0; p0 < b1; p0 += panel)
        for (int64_t i0 = 0; i0 < job->M; i0 += ROWS)
            job->rows(job->format, job->x + i0 * job->groups, min_i64(ROWS, job->M - i0), job->W, job->N, job->K,
                      job->Y + i0 * job->N, job->N, p0, min_i64(p0 + panel, b1));
}

/* Y [M, N] = q8_0(X) [M, K] @ W^T for W [N, K] in ggml `format` (2 = q4_0, 8 = q8_0), given as
 * matmul_decode_int8_pack made it. threads and variant as matmul_decode_f32 (3 = AVX-512
 * VNNI). Returns decode.h's codes (3 for bf16 or any other format). */
MATMUL_API int matmul_decode_int8_f32(const float *X, const uint8_t *W_packed, float *Y, int64_t M, int64_t N,
                                      int64_t K, int64_t format, int64_t threads, int64_t variant) {
    if (format == DECODE_Q4_K) return decode_int8_q4k_f32(X, W_packed, Y, M, N, K, threads, variant); /* 12: q4_K */
    if (M < 0) return DECODE_ERR_ARGUMENT;
    const int status = check_shape(N, K, format);
    if (status) return status;
    const int64_t resolved = matmul_decode_int8_resolve_variant(variant);
    if (resolved < 0) return DECODE_ERR_VARIANT;
    if (M == 0 || N == 0) return DECODE_OK;
    if (K == 0) {
        memset(Y, 0, (size_t)(M * N) * sizeof(float));
        return DECODE_OK;
    }
    struct int8_job job = {
        NULL,        W_packed,     Y, M, N, K, groups_of(K), (N + BLOCK_TILES * TILE - 1) / (BLOCK_TILES * TILE), 1,
        (int)format, rows_portable};
#if DECODE_HAVE_X86
    if (resolved == DECODE_AVX2) job.rows = rows_avx2;
    if (resolved == DECODE_AVX512) job.rows = rows_vnni;
#endif
    void *memory = NULL;
    if (posix_memalign(&memory, 64, (size_t)(M * job.groups) * sizeof(struct x_group))) return DECODE_ERR_MEMORY;
    /* X signed (bias 0) where the kernel takes it as vpmaddubsw's or vpdpbusd's signed operand */
    const int signed_x = resolved == DECODE_AVX2 || (resolved == DECODE_AVX512 && format == DECODE_Q4_0);
    quantize_activations(X, M, K, quantizer_for(resolved), signed_x ? 0 : 0x80, memory);
    job.x = memory;
    job.parts = pool_threads_for(threads, (double)M * (double)N * (double)K, job.blocks);
    pool_run(job.parts, int8_task, &job);
    free(memory);
    return DECODE_OK;
}
