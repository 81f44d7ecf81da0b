/* c.decode_int8 for GGUF's q4_K weights: Y [M, N] = X [M, K] @ W^T, X quantized to q8_0 (as
 * decode_int8.c does for q4_0 and q8_0; its entry points hand format 12 here), integer dot
 * products per 32-weight sub-block.
 *
 * q4_K (harness/model/quant.py): super-blocks of 256 weights in 144 bytes, a float16 d, a
 * float16 dmin, 12 bytes of eight 6-bit scales sc_j and eight 6-bit mins m_j (ggml's
 * get_scale_min_k4), 128 bytes of 4-bit quants q (0..15); weight = d * sc_j * q - dmin * m_j
 * for sub-block j (weights 32j .. 32j + 31). X comes in q8_0 blocks of 32 (d_x float16, q_x
 * int8: ggml's bytes, from decode_int8.c's quantizer), one per sub-block, so
 *
 *     Y[i][r] = sum over sub-blocks of (d sc_j) d_x (sum_k q_k q_x,k) - (dmin m_j) (d_x sum_k q_x,k)
 *
 * where both sums are exact integers and d_x sum_k q_x,k is exact in float32 (an 11-bit
 * float16 times an integer below 2^12); the rest is float32. Per sub-block lane, in this order:
 * acc = fma(float(dot), (d sc_j) * d_x, acc), then acc = fma(-(dmin m_j), d_x sum q_x, acc)
 * (d sc_j and dmin m_j are exact). A row's 8 lanes are summed once at its end, as
 * decode_int8.c's AVX2 kernel does (sum8). The portable C (through fmaf) and AVX2 do exactly
 * these operations, so they give the same bits, for every thread count and every M (tested).
 *
 * W repacked (decode_int8_q4k_pack, once, outside the timed product), the same 144 bytes a
 * super-block, moved:
 *
 *   - One sub-block per int32 lane. A super-block's 128 bytes of quants are 4 vectors of 32
 *     bytes; in vector v, bytes 4j .. 4j + 3 hold weights 4v .. 4v + 3 of sub-block j in their
 *     low nibbles and weights 16 + 4v .. 16 + 4v + 3 in their high nibbles. So one load, an
 *     AND and a shift-and-AND give two "slots", and slot s (weights 4s .. 4s + 3 of each of the
 *     8 sub-blocks) meets X's slot s (the same weights' q_x, laid out so once per call) in one
 *     vpmaddubsw: unsigned quants times signed q_x, pairs at most 2 * 15 * 127, so it cannot
 *     saturate, and the 8 slots' int16 sums (16 products, at most 30480) add in int16 exactly.
 *     One vpmaddwd by ones then gives each lane its sub-block's whole dot product: no
 *     horizontal sums per sub-block, and the lanes' scales are vectors (d sc_j for the 8
 *     sub-blocks, times X's 8 d_x).
 *   - The 16 bytes of d, dmin and the scales stay as ggml packs them, decoded per super-block
 *     and row with two byte shuffles and a few masks and shifts (SIMD), shared by every row of X.
 *   - Rows in blocks of BLOCK_ROWS, K in slices of SLICE super-blocks (1024 weights); a block
 *     holds its slices one after another, each slice its rows one after another, each row's
 *     slice its quants, then its 16-byte headers: the order the kernel reads, so each thread
 *     reads one sequential stream. The slices keep the share of X that a slice needs (at
 *     M = 16, 20 KiB) in L1 while W streams past; each row's lanes wait between slices exactly.
 *
 * Variants: portable C, AVX2 (vpmaddubsw, F16C, FMA) and AVX-512 VNNI (row_vnni, and
 * tile_vnni from 9 rows of X: the same layout of W, two super-blocks a 512-bit register, one
 * vpdpbusd per slot). The portable C and AVX2 give the same bits; the VNNI kernel sums each
 * lane over every other super-block, so its bits are its own (within the same error model),
 * again the same for every thread count and M.
 *
 * Rows of X go 16 per pass over W; the number in a pass is a compile-time constant for every
 * M = 1..16 (a switch over inlined copies), so the loops over them unroll. Threads take
 * blocks of rows of W (thread_pool.h); every Y element is the same sequence of operations
 * whichever thread, pass or slice computes it.
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* posix_memalign under a strict -std=c11 */
#endif
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
    SUPER = DECODE_Q4_K_BLOCK,       /* weights per super-block */
    SUPER_BYTES = DECODE_Q4_K_BYTES, /* bytes per super-block, packed or not */
    SUBS = 8,                        /* sub-blocks of 32 per super-block: one per int32 lane of 256 bits */
    QUANT_BYTES = 128,               /* a super-block's 4-bit quants */
    HEADER_BYTES = 16,               /* d, dmin (float16), then the 12 bytes of scales and mins */
    Q8_BYTES = 34,                   /* one q8_0 block of X: a float16 scale, 32 int8 */
    ROWS = DECODE_MAX_ROWS,          /* rows of X per pass over W */
    BLOCK_ROWS = 16,                 /* rows of W per block: a slice of K runs over them before the next */
    SLICE = 4,                       /* super-blocks per slice of K */
    PREFETCH = 2048,                 /* bytes ahead in W's stream (row_avx2, row_vnni) */
    PREFETCH_L2 = 8192,              /* ...and into L2 first, from this far ahead (row_vnni) */
    TILE_ROWS = GANG_W_ROWS,         /* rows of W tile_vnni takes at once (gang_vnni.h) */
    TILE_MIN_M = 9,                  /* rows of X from which tile_vnni runs */
};

/* ---- W repacked (the header) ---------------------------------------------------------------- */

static int check_shape(int64_t N, int64_t K) {
    if (N < 0 || K < 0) return DECODE_ERR_ARGUMENT;
    if (K % SUPER) return DECODE_ERR_BLOCK;
    return DECODE_OK;
}

/* Where the slice of row j that starts at super-block g0 lies: blocks of BLOCK_ROWS rows, in a
 * block its slices in turn, in a slice its rows in turn (each in_slice super-blocks long). */
static inline int64_t slice_offset(int64_t N, int64_t supers, int64_t j, int64_t g0) {
    const int64_t block = j / BLOCK_ROWS, rows_in_block = min_i64(BLOCK_ROWS, N - block * BLOCK_ROWS);
    const int64_t in_slice = min_i64(SLICE, supers - g0);
    return (block * BLOCK_ROWS * supers + rows_in_block * g0 + (j - block * BLOCK_ROWS) * in_slice) * SUPER_BYTES;
}

int64_t decode_int8_q4k_packed_bytes(int64_t N, int64_t K) {
    const int status = check_shape(N, K);
    return status ? -status : N * (K / SUPER) * SUPER_BYTES;
}

/* W [N, K] in ggml's q4_K bytes to the layout above, in out (decode_int8_q4k_packed_bytes long). */
int decode_int8_q4k_pack(const uint8_t *W, int64_t N, int64_t K, uint8_t *out) {
    const int status = check_shape(N, K);
    if (status) return status;
    const int64_t supers = K / SUPER;
    for (int64_t j = 0; j < N; ++j)
        for (int64_t b = 0; b < supers; ++b) {
            const uint8_t *src = W + (j * supers + b) * SUPER_BYTES;
            const int64_t g0 = b / SLICE * SLICE, u = b - g0, in_slice = min_i64(SLICE, supers - g0);
            uint8_t *at = out + slice_offset(N, supers, j, g0), *quants = at + u * QUANT_BYTES;
            memcpy(at + in_slice * QUANT_BYTES + u * HEADER_BYTES, src, HEADER_BYTES);
            memset(quants, 0, QUANT_BYTES);
            for (int l = 0; l < SUBS; ++l) /* sub-block l: chunk l / 2, low nibbles for even l */
                for (int k = 0; k < 32; ++k) {
                    const uint8_t q = (uint8_t)(src[HEADER_BYTES + 32 * (l / 2) + k] >> (4 * (l % 2)) & 0x0f);
                    const int slot = k / 4;
                    quants[32 * (slot % 4) + 4 * l + k % 4] |= (uint8_t)(slot < 4 ? q : q << 4);
                }
        }
    return DECODE_OK;
}

/* ---- X, quantized once per call ----------------------------------------------------------- */

/* One activation row's share of a super-block: its 8 q8_0 blocks, in the lanes of W's. */
struct q4k_x {
    int8_t q[SUBS * 32]; /* slot s (32 bytes): q_x of elements 4s .. 4s + 3 of each block, lane by lane */
    float d[SUBS];       /* each block's d_x */
    float sum[SUBS];     /* d_x times the sum of the block's q_x (exact) */
};

/* The VNNI kernel's: one row's share of a pair of super-blocks 2P, 2P + 1, in the 16 lanes of
 * a 512-bit register (2P's 8 blocks in lanes 0..7, 2P + 1's in 8..15; zeros past K's last). */
struct q4k_x2 {
    int8_t q[SUBS * 64]; /* slot s (64 bytes): 2P's slot s, then 2P + 1's */
    float d[2 * SUBS];
    float sum[2 * SUBS];
};

/* For each pass of up to ROWS rows, each entry (a super-block, or a pair when wide), the pass's
 * rows in turn: entry e of row i0 + m of the pass at i0 is at x + (i0 * entries + e * mb + m) *
 * stride bytes, with each entry's slots 32 * width bytes long and its scales and sums after
 * them (struct q4k_x for width 1, q4k_x2 for width 2). */
static int quantize_activations(const float *X, int64_t M, int64_t K, int64_t variant, int width, uint8_t *row,
                                uint8_t *x) {
    const int64_t entries = (K / SUPER + width - 1) / width;
    const size_t stride = width == 1 ? sizeof(struct q4k_x) : sizeof(struct q4k_x2), slot = 32 * (size_t)width;
    memset(x, 0, (size_t)(M * entries) * stride); /* a pair's missing half: zero weights' lanes */
    for (int64_t i0 = 0; i0 < M; i0 += ROWS) {
        const int64_t mb = min_i64(ROWS, M - i0);
        for (int64_t m = 0; m < mb; ++m) {
            const int status = matmul_quantize_q8_0(X + (i0 + m) * K, K, row, variant);
            if (status) return status;
            for (int64_t b = 0; b < K / DECODE_BLOCK; ++b) {
                const uint8_t *block = row + b * Q8_BYTES;
                const int64_t super = b / SUBS;
                uint8_t *entry = x + (size_t)(i0 * entries + super / width * mb + m) * stride;
                float *d = (float *)(entry + SUBS * slot), *sums = d + SUBS * width;
                const int lane = (int)(super % width * SUBS + b % SUBS);
                int32_t sum = 0;
                for (int k = 0; k < 32; ++k) sum += (int8_t)block[2 + k];
                for (int s = 0; s < 8; ++s) memcpy(entry + slot * s + 4 * lane, block + 2 + 4 * s, 4);
                d[lane] = decode_half(block);
                sums[lane] = d[lane] * (float)sum;
            }
        }
    }
    return DECODE_OK;
}

/* ---- the kernels: Y[0..mb)[rows of blocks b0..b1), X's super-blocks for the pass at x -------- */

typedef void (*q4k_rows_fn)(const void *x, int64_t mb, const uint8_t *W, int64_t N, int64_t K, float *Y, int64_t ldy,
                            int64_t b0, int64_t b1);

/* A super-block's 8 scales and 8 mins (get_scale_min_k4), from its 12 bytes. */
static void scales_and_mins(const uint8_t *b, uint8_t sc[SUBS], uint8_t m[SUBS]) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = b[j] & 63;
        m[j] = b[j + 4] & 63;
        sc[j + 4] = (uint8_t)((b[j + 8] & 15) | (b[j] >> 6) << 4);
        m[j + 4] = (uint8_t)((b[j + 8] >> 4) | (b[j + 4] >> 6) << 4);
    }
}

/* The lanes' sum in sum8's order (decode_int8.c's AVX2 kernel): lanes l and l + 4, then those
 * two apart, then the last two. */
static float sum_lanes(const float acc[SUBS]) {
    const float four[4] = {acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]};
    return (four[0] + four[2]) + (four[1] + four[3]);
}

static void rows_portable(const void *xs, int64_t mb, const uint8_t *W, int64_t N, int64_t K, float *Y, int64_t ldy,
                          int64_t b0, int64_t b1) {
    const struct q4k_x *x = xs;
    const int64_t supers = K / SUPER;
    for (int64_t j = b0 * BLOCK_ROWS; j < min_i64(b1 * BLOCK_ROWS, N); ++j)
        for (int64_t i = 0; i < mb; ++i) {
            float acc[SUBS] = {0};
            for (int64_t g0 = 0; g0 < supers; g0 += SLICE) {
                const uint8_t *at = W + slice_offset(N, supers, j, g0);
                const int64_t in_slice = min_i64(SLICE, supers - g0);
                for (int64_t u = 0; u < in_slice; ++u) {
                    const uint8_t *quants = at + u * QUANT_BYTES,
                                  *header = at + in_slice * QUANT_BYTES + u * HEADER_BYTES;
                    const struct q4k_x *entry = x + (g0 + u) * mb + i;
                    const float d = decode_half(header), dmin = decode_half(header + 2);
                    uint8_t sc[SUBS], m[SUBS];
                    scales_and_mins(header + 4, sc, m);
                    for (int l = 0; l < SUBS; ++l) {
                        /* int16 operands, as decode_int8.c's portable kernel has them (GCC's
                         * vectorizer and products of chars) */
                        int16_t w[32], xs[32];
                        for (int k = 0; k < 32; ++k) {
                            const uint8_t byte = quants[32 * (k / 4 % 4) + 4 * l + k % 4];
                            w[k] = (int16_t)(k < 16 ? byte & 0x0f : byte >> 4);
                            xs[k] = entry->q[32 * (k / 4) + 4 * l + k % 4];
                        }
                        int32_t dot = 0;
                        for (int k = 0; k < 32; ++k) dot += (int32_t)w[k] * xs[k];
                        acc[l] = fmaf((float)dot, (d * (float)sc[l]) * entry->d[l], acc[l]);
                        acc[l] = fmaf(-(dmin * (float)m[l]), entry->sum[l], acc[l]);
                    }
                }
            }
            Y[i * ldy + j] = sum_lanes(acc);
        }
}

#if DECODE_HAVE_X86
#define INLINE static inline __attribute__((always_inline))
#define AVX2   __attribute__((target("avx2,fma,f16c")))

AVX2 INLINE float sum8(__m256 v) {
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

/* A super-block's d sc_j and dmin m_j, lane j, from its 16 header bytes h: h[4 .. 15] are the
 * 12 bytes b of scales_and_mins. One shuffle puts, per lane of the result, the byte holding
 * its low bits (sc: b[0..3], b[8..11]; m: b[4..7], b[8..11]), another the byte holding its top
 * two bits where it has them (sc_4..7: b[0..3] >> 6; m_4..7: b[4..7] >> 6). */
AVX2 INLINE void scales_avx2(const uint8_t *h, __m256 *dsc, __m256 *dminm) {
    const __m128i v = _mm_loadu_si128((const __m128i *)h);
    const __m128i lowbits =
        _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i topbits =
        _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    /* sc_0..3 and m_0..3: & 63; sc_4..7: & 15; m_4..7: >> 4 (the 16-bit shift's carried-in bits
     * masked away) */
    const __m128i low = _mm_or_si128(
        _mm_and_si128(lowbits, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
        _mm_and_si128(_mm_srli_epi16(lowbits, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
    /* (b >> 6) << 4 is (b >> 2) & 0x30 */
    const __m128i both = _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(topbits, 2), _mm_set1_epi8(0x30)));
    int halves;
    memcpy(&halves, h, sizeof halves);
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(halves)); /* d, dmin */
    *dsc = _mm256_mul_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(both)));
    *dminm = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)),
                           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(both, 8))));
}

/* One row of W's slice (in_slice super-blocks at w: quants, then headers) for mb rows of X
 * (x: the slice's first super-block, mb entries a super-block), its lanes from and to
 * partial between slices, its sums to y at the last. */
AVX2 INLINE void row_avx2(const int mb, const struct q4k_x *x, const uint8_t *w, int64_t in_slice, int first, int last,
                          float *partial, float *y, int64_t ldy) {
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS];
#pragma GCC unroll 16
    for (int i = 0; i < mb; ++i) acc[i] = first ? _mm256_setzero_ps() : _mm256_load_ps(partial + 8 * i);
    for (int64_t u = 0; u < in_slice; ++u) {
        const uint8_t *quants = w + u * QUANT_BYTES;
        /* ahead by hand, the 3 lines a super-block may touch: at M = 1 this reads 1.4-1.7x as
         * fast from memory as the hardware prefetcher alone (one thread, the shared Zen 2) */
        for (int line = 0; line < 3; ++line)
            _mm_prefetch((const char *)(w + PREFETCH + SUPER_BYTES * u + 64 * line), _MM_HINT_T0);
        __m256i slot[8];
        for (int v = 0; v < 4; ++v) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(quants + 32 * v));
            slot[v] = _mm256_and_si256(raw, low);
            slot[v + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        }
        __m256 dsc, dminm;
        scales_avx2(w + in_slice * QUANT_BYTES + u * HEADER_BYTES, &dsc, &dminm);
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) {
            const struct q4k_x *entry = x + u * mb + i;
            __m256i p[8];
            for (int s = 0; s < 8; ++s)
                p[s] = _mm256_maddubs_epi16(slot[s], _mm256_load_si256((const __m256i *)(entry->q + 32 * s)));
            const __m256i sum16 =
                _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                                 _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
            const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16, ones));
            acc[i] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dsc, _mm256_load_ps(entry->d)), acc[i]);
            acc[i] = _mm256_fnmadd_ps(dminm, _mm256_load_ps(entry->sum), acc[i]);
        }
    }
    if (!last)
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) _mm256_store_ps(partial + 8 * i, acc[i]);
    else
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) y[i * ldy] = sum8(acc[i]);
}

/* Blocks b0..b1 of rows, slice by slice, each slice over the block's rows in turn. */
AVX2 INLINE void blocks_avx2(const int mb, const struct q4k_x *x, const uint8_t *W, int64_t N, int64_t K, float *Y,
                             int64_t ldy, int64_t b0, int64_t b1) {
    _Alignas(32) float partial[BLOCK_ROWS * ROWS * 8]; /* each row's lanes between slices */
    const int64_t supers = K / SUPER;
    for (int64_t block = b0; block < b1; ++block) {
        const int64_t j0 = block * BLOCK_ROWS, rows = min_i64(BLOCK_ROWS, N - j0);
        for (int64_t g0 = 0; g0 < supers; g0 += SLICE) {
            const int64_t in_slice = min_i64(SLICE, supers - g0);
            const uint8_t *at = W + slice_offset(N, supers, j0, g0);
            for (int64_t r = 0; r < rows; ++r)
                row_avx2(mb, x + g0 * mb, at + r * in_slice * SUPER_BYTES, in_slice, g0 == 0, g0 + in_slice == supers,
                         partial + r * mb * 8, Y + j0 + r, ldy);
        }
    }
}

AVX2 static void rows_avx2(const void *x, int64_t mb, const uint8_t *W, int64_t N, int64_t K, float *Y, int64_t ldy,
                           int64_t b0, int64_t b1) {
    switch (mb) {
    case 1: blocks_avx2(1, x, W, N, K, Y, ldy, b0, b1); break;
    case 2: blocks_avx2(2, x, W, N, K, Y, ldy, b0, b1); break;
    case 3: blocks_avx2(3, x, W, N, K, Y, ldy, b0, b1); break;
    case 4: blocks_avx2(4, x, W, N, K, Y, ldy, b0, b1); break;
    case 5: blocks_avx2(5, x, W, N, K, Y, ldy, b0, b1); break;
    case 6: blocks_avx2(6, x, W, N, K, Y, ldy, b0, b1); break;
    case 7: blocks_avx2(7, x, W, N, K, Y, ldy, b0, b1); break;
    case 8: blocks_avx2(8, x, W, N, K, Y, ldy, b0, b1); break;
    case 9: blocks_avx2(9, x, W, N, K, Y, ldy, b0, b1); break;
    case 10: blocks_avx2(10, x, W, N, K, Y, ldy, b0, b1); break;
    case 11: blocks_avx2(11, x, W, N, K, Y, ldy, b0, b1); break;
    case 12: blocks_avx2(12, x, W, N, K, Y, ldy, b0, b1); break;
    case 13: blocks_avx2(13, x, W, N, K, Y, ldy, b0, b1); break;
    case 14: blocks_avx2(14, x, W, N, K, Y, ldy, b0, b1); break;
    case 15: blocks_avx2(15, x, W, N, K, Y, ldy, b0, b1); break;
    case 16: blocks_avx2(16, x, W, N, K, Y, ldy, b0, b1); break;
    default: break; /* the driver passes at most ROWS */
    }
}

/* AVX-512 VNNI: two super-blocks per 512-bit register, super-block u in lanes 0..7 and u + 1 in
 * 8..15, and one vpdpbusd per slot (unsigned nibbles times signed q_x, four products a lane)
 * where AVX2 takes vpmaddubsw, an int16 add and, per 8 slots, a vpmaddwd: the same exact
 * integer dot per sub-block, in half the instructions for twice the lanes. Each lane then does
 * the AVX2 lane's two FMAs, so lane l accumulates sub-block l of a slice's even super-blocks
 * and lane 8 + l its odd ones; the 16 lanes are summed at the row's end (halves, then sum8):
 * other bits than AVX2's, the same for every thread count and M. 32 registers hold the 8
 * slots and up to 16 rows' accumulators.
 *
 * Up to 8 rows of X (decode), row_vnni takes a row of W at a time, its 8 slots in registers,
 * and each vpdpbusd loads its 64 bytes of X. Its dot products go GANG rows of X at a time,
 * slot by slot across them, so that consecutive vpdpbusd do not wait on one another (four
 * chains in flight; each row's two chains, even and odd slots, before): the same integers, the
 * same bits; on a Zen 4, one thread, W 4096 x 4096 in cache, medians of 21 interleaved rounds,
 * M = 4 1.05x faster, M = 1, 8 and 16 1.02-1.03x.
 *
 * From 9 rows (prefill), the loads of X set the pace: about 0.52 ns a vpdpbusd there, where
 * the instruction alone can issue one a cycle (0.27 ns), and taking the float work away
 * (timing only) left 0.48 ns. So tile_vnni takes TILE_ROWS = 4 rows of W at once: their slots
 * unpacked once a pair into a buffer on the stack, then for each gang of 4 rows of X and each
 * slot, 4 loads of W and 4 of X feed 16 vpdpbusd (half a load each), into 16 accumulators;
 * the float lanes wait in `partial` between pairs. Each lane's float sequence is row_vnni's:
 * the same bits. Zen 4, one thread, against row_vnni's gangs, medians of 15 interleaved
 * rounds: M = 12 to 512 1.05-1.09x faster (M = 8 0.99x, 9 1.03x); about 0.49 ns a vpdpbusd,
 * 0.39 without the float work. */
#define VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))

VNNI INLINE float sum16(__m512 v) {
    return sum8(
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

VNNI INLINE __m512 join_ps(__m256 low, __m256 high) {
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(low)), _mm256_castps_pd(high), 1));
}

/* One row of W's slice for mb rows of X (x: the slice's first pair, mb entries a pair), as row_avx2. */
VNNI INLINE void row_vnni(const int mb, const struct q4k_x2 *x, const uint8_t *w, int64_t in_slice, int first, int last,
                          float *partial, float *y, int64_t ldy) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[ROWS];
#pragma GCC unroll 16
    for (int i = 0; i < mb; ++i) acc[i] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial + 16 * i);
    for (int64_t u = 0; u < in_slice; u += 2) {
        const int pair = u + 1 < in_slice; /* else u is K's last super-block, and lanes 8..15 stay zero */
        const uint8_t *quants = w + u * QUANT_BYTES, *headers = w + in_slice * QUANT_BYTES + u * HEADER_BYTES;
        /* as row_avx2, 3 lines a super-block; and into L2 from further ahead first, as tile_vnni
         * does (Zen 5, W from DRAM, interleaved on the same copies of W: 1 x 4096 x 4096 2-13%
         * faster, 4 x 4096 x 4096 15-31%, on one thread and two; 16 rows unchanged) */
        for (int line = 0; line < 6; ++line) {
            const int64_t offset = SUPER_BYTES * (u + line / 3) + 64 * (line % 3);
            _mm_prefetch((const char *)(w + PREFETCH + offset), _MM_HINT_T0);
            _mm_prefetch((const char *)(w + PREFETCH_L2 + offset), _MM_HINT_T1);
        }
        __m512i slot[8];
        for (int v = 0; v < 4; ++v) {
            const __m256i next =
                pair ? _mm256_loadu_si256((const __m256i *)(quants + QUANT_BYTES + 32 * v)) : _mm256_setzero_si256();
            const __m512i raw = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(quants + 32 * v))), next, 1);
            slot[v] = _mm512_and_si512(raw, low);
            slot[v + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        }
        __m256 dsc0, dminm0, dsc1 = _mm256_setzero_ps(), dminm1 = _mm256_setzero_ps();
        scales_avx2(headers, &dsc0, &dminm0);
        if (pair) scales_avx2(headers + HEADER_BYTES, &dsc1, &dminm1);
        const __m512 dsc = join_ps(dsc0, dsc1), dminm = join_ps(dminm0, dminm1);
        const struct q4k_x2 *pair_x = x + u / 2 * mb; /* the pair's mb entries */
#pragma GCC unroll 16
        for (int g = 0; g < mb; g += GANG) {
            const int gang = mb - g < GANG ? mb - g : GANG;
            __m512i dot[GANG];
#pragma GCC unroll 4
            for (int i = 0; i < gang; ++i) dot[i] = _mm512_setzero_si512();
            if (mb == 1) { /* one row: its even and odd slots in two chains, not one eight deep */
                __m512i odd = _mm512_setzero_si512();
                for (int s = 0; s < 8; s += 2) {
                    dot[0] =
                        _mm512_dpbusd_epi32(dot[0], slot[s], _mm512_load_si512((const void *)(pair_x->q + 64 * s)));
                    odd = _mm512_dpbusd_epi32(odd, slot[s + 1],
                                              _mm512_load_si512((const void *)(pair_x->q + 64 * s + 64)));
                }
                dot[0] = _mm512_add_epi32(dot[0], odd);
            } else
#pragma GCC unroll 8
                for (int s = 0; s < 8; ++s)
#pragma GCC unroll 4
                    for (int i = 0; i < gang; ++i)
                        dot[i] = _mm512_dpbusd_epi32(dot[i], slot[s],
                                                     _mm512_load_si512((const void *)(pair_x[g + i].q + 64 * s)));
#pragma GCC unroll 4
            for (int i = 0; i < gang; ++i) {
                const struct q4k_x2 *entry = pair_x + g + i;
                acc[g + i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), _mm512_mul_ps(dsc, _mm512_load_ps(entry->d)),
                                             acc[g + i]);
                acc[g + i] = _mm512_fnmadd_ps(dminm, _mm512_load_ps(entry->sum), acc[g + i]);
            }
        }
    }
    if (!last)
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) _mm512_store_ps(partial + 16 * i, acc[i]);
    else
#pragma GCC unroll 16
        for (int i = 0; i < mb; ++i) y[i * ldy] = sum16(acc[i]);
}

/* tile_vnni's gang: `gang` rows of X (x: their entries of the pair) times the R rows of W whose
 * slots are in slots (gang_vnni.h), into their lanes (row r's, X's row i at lanes + 16 * (r *
 * mb + i)) or, at K's last pair, their sums (y[i * ldy + r]). */
VNNI INLINE void gang_vnni(const int R, const int gang, const struct q4k_x2 *x, const __m512i slots[][8],
                           const __m512 *dsc, const __m512 *dminm, int start, int end, float *lanes, int64_t mb,
                           float *y, int64_t ldy) {
    __m512i dot[TILE_ROWS][GANG];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int i = 0; i < gang; ++i) dot[r][i] = _mm512_setzero_si512();
    gang_dots_vnni(R, gang, (const uint8_t *)x->q, sizeof *x, slots, 0, dot);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int i = 0; i < gang; ++i) {
            float *at = lanes + 16 * (r * mb + i);
            __m512 acc = start ? _mm512_setzero_ps() : _mm512_load_ps(at);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][i]), _mm512_mul_ps(dsc[r], _mm512_load_ps(x[i].d)), acc);
            acc = _mm512_fnmadd_ps(dminm[r], _mm512_load_ps(x[i].sum), acc);
            if (end)
                y[i * ldy + r] = sum16(acc);
            else
                _mm512_store_ps(at, acc);
        }
}

/* R rows of W's slice (row r at w + r * in_slice * SUPER_BYTES, its lanes at partial + r * mb *
 * 16, its sums to y + r) for mb rows of X, pair by pair: the R rows' slots unpacked onto the
 * stack, then gang_vnni for each GANG rows of X. */
VNNI INLINE void tile_vnni(const int R, const int mb, const struct q4k_x2 *x, const uint8_t *w, int64_t in_slice,
                           int first, int last, float *partial, float *y, int64_t ldy) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    const int64_t row_bytes = in_slice * SUPER_BYTES, pairs = (in_slice + 1) / 2;
    _Alignas(64) __m512i slots[TILE_ROWS][8];
    __m512 dsc[TILE_ROWS], dminm[TILE_ROWS];
    for (int64_t p = 0; p < pairs; ++p) {
        const int64_t u = 2 * p;
        const int pair = u + 1 < in_slice; /* else u is K's last super-block, and lanes 8..15 stay zero */
        for (int r = 0; r < R; ++r) {
            const uint8_t *wr = w + r * row_bytes, *quants = wr + u * QUANT_BYTES;
            const uint8_t *headers = wr + in_slice * QUANT_BYTES + u * HEADER_BYTES;
            for (int line = 0; line < 6; ++line) {
                const int64_t offset = SUPER_BYTES * (u + line / 3) + 64 * (line % 3);
                _mm_prefetch((const char *)(wr + PREFETCH + offset), _MM_HINT_T0);
                _mm_prefetch((const char *)(wr + PREFETCH_L2 + offset), _MM_HINT_T1);
            }
            for (int v = 0; v < 4; ++v) {
                const __m256i next = pair ? _mm256_loadu_si256((const __m256i *)(quants + QUANT_BYTES + 32 * v))
                                          : _mm256_setzero_si256();
                const __m512i raw = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(quants + 32 * v))), next, 1);
                slots[r][v] = _mm512_and_si512(raw, low);
                slots[r][v + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            }
            __m256 dsc0, dminm0, dsc1 = _mm256_setzero_ps(), dminm1 = _mm256_setzero_ps();
            scales_avx2(headers, &dsc0, &dminm0);
            if (pair) scales_avx2(headers + HEADER_BYTES, &dsc1, &dminm1);
            dsc[r] = join_ps(dsc0, dsc1);
            dminm[r] = join_ps(dminm0, dminm1);
        }
        const struct q4k_x2 *pair_x = x + p * mb; /* the pair's mb entries */
        const int start = first && p == 0, end = last && p == pairs - 1;
        int g = 0;
#pragma GCC unroll 1
        for (; g + GANG <= mb; g += GANG) /* a loop, not unrolled: unrolled, decode_int8.c's gangs spilled */
            gang_vnni(R, GANG, pair_x + g, slots, dsc, dminm, start, end, partial + 16 * g, mb, y + g * ldy, ldy);
        if (mb % GANG)
            gang_vnni(R, mb % GANG, pair_x + g, slots, dsc, dminm, start, end, partial + 16 * g, mb, y + g * ldy, ldy);
    }
}

VNNI INLINE void blocks_vnni(const int mb, const struct q4k_x2 *x, const uint8_t *W, int64_t N, int64_t K, float *Y,
                             int64_t ldy, int64_t b0, int64_t b1) {
    _Alignas(64) float partial[BLOCK_ROWS * ROWS * 16]; /* each row's lanes between slices */
    const int64_t supers = K / SUPER;
    for (int64_t block = b0; block < b1; ++block) {
        const int64_t j0 = block * BLOCK_ROWS, rows = min_i64(BLOCK_ROWS, N - j0);
        for (int64_t g0 = 0; g0 < supers; g0 += SLICE) { /* SLICE is even: a slice's pairs are K's */
            const int64_t in_slice = min_i64(SLICE, supers - g0);
            const uint8_t *at = W + slice_offset(N, supers, j0, g0);
            const int first = g0 == 0, last = g0 + in_slice == supers;
            int64_t r = 0;
            if (mb >= TILE_MIN_M)
                for (; r + TILE_ROWS <= rows; r += TILE_ROWS)
                    tile_vnni(TILE_ROWS, mb, x + g0 / 2 * mb, at + r * in_slice * SUPER_BYTES, in_slice, first, last,
                              partial + r * mb * 16, Y + j0 + r, ldy);
            for (; r < rows; ++r)
                row_vnni(mb, x + g0 / 2 * mb, at + r * in_slice * SUPER_BYTES, in_slice, first, last,
                         partial + r * mb * 16, Y + j0 + r, ldy);
        }
    }
}

/* The rows that take a row of W at a time and those that take tiles, in two functions, each
 * with its own stack frame: in one function (one frame for every M, tile_vnni's slots in it
 * too) the row-at-a-time code, unchanged, made M = 4 take 1.2x as long, M = 1 and 2 1.05x
 * (one thread, interleaved; a 4 KiB-aligned `partial` did not change the tiles' time). */
VNNI __attribute__((noinline)) static void rows_vnni_by_row(const void *x, int64_t mb, const uint8_t *W, int64_t N,
                                                            int64_t K, float *Y, int64_t ldy, int64_t b0, int64_t b1) {
    switch (mb) {
    case 1: blocks_vnni(1, x, W, N, K, Y, ldy, b0, b1); break;
    case 2: blocks_vnni(2, x, W, N, K, Y, ldy, b0, b1); break;
    case 3: blocks_vnni(3, x, W, N, K, Y, ldy, b0, b1); break;
    case 4: blocks_vnni(4, x, W, N, K, Y, ldy, b0, b1); break;
    case 5: blocks_vnni(5, x, W, N, K, Y, ldy, b0, b1); break;
    case 6: blocks_vnni(6, x, W, N, K, Y, ldy, b0, b1); break;
    case 7: blocks_vnni(7, x, W, N, K, Y, ldy, b0, b1); break;
    case 8: blocks_vnni(8, x, W, N, K, Y, ldy, b0, b1); break;
    default: break; /* rows_vnni passes 1 .. TILE_MIN_M - 1 */
    }
}

VNNI __attribute__((noinline)) static void rows_vnni_by_tile(const void *x, int64_t mb, const uint8_t *W, int64_t N,
                                                             int64_t K, float *Y, int64_t ldy, int64_t b0, int64_t b1) {
    switch (mb) {
    case 9: blocks_vnni(9, x, W, N, K, Y, ldy, b0, b1); break;
    case 10: blocks_vnni(10, x, W, N, K, Y, ldy, b0, b1); break;
    case 11: blocks_vnni(11, x, W, N, K, Y, ldy, b0, b1); break;
    case 12: blocks_vnni(12, x, W, N, K, Y, ldy, b0, b1); break;
    case 13: blocks_vnni(13, x, W, N, K, Y, ldy, b0, b1); break;
    case 14: blocks_vnni(14, x, W, N, K, Y, ldy, b0, b1); break;
    case 15: blocks_vnni(15, x, W, N, K, Y, ldy, b0, b1); break;
    case 16: blocks_vnni(16, x, W, N, K, Y, ldy, b0, b1); break;
    default: break; /* rows_vnni passes TILE_MIN_M .. ROWS */
    }
}

VNNI static void rows_vnni(const void *x, int64_t mb, const uint8_t *W, int64_t N, int64_t K, float *Y, int64_t ldy,
                           int64_t b0, int64_t b1) {
    if (mb < TILE_MIN_M)
        rows_vnni_by_row(x, mb, W, N, K, Y, ldy, b0, b1);
    else
        rows_vnni_by_tile(x, mb, W, N, K, Y, ldy, b0, b1);
}
#endif

/* ---- the call ----------------------------------------------------------------------------- */

struct q4k_job {
    const uint8_t *x; /* X as quantize_activations leaves it */
    const uint8_t *W; /* packed */
    float *Y;
    int64_t M, N, K, x_row_bytes, blocks, parts; /* x_row_bytes: one row of X in x's layout */
    q4k_rows_fn rows;
};

/* A thread's blocks b0..b1 of W times all of X, ROWS rows of X per pass; past one pass (prefill),
 * two blocks of W (32 rows) run every pass before the next two, so they are read from memory
 * once and from cache by the other passes (as decode_int8.c's int8_task). The same bits. */
static void q4k_task(void *context, int64_t part) {
    const struct q4k_job *job = context;
    const int64_t b0 = job->blocks * part / job->parts, b1 = job->blocks * (part + 1) / job->parts;
    const int64_t panel = job->M > ROWS ? 2 : b1 - b0;
    for (int64_t p0 = b0; p0 < b1; p0 += panel)
        for (int64_t i0 = 0; i0 < job->M; i0 += ROWS)
            job->rows(job->x + i0 * job->x_row_bytes, min_i64(ROWS, job->M - i0), job->W, job->N, job->K,
                      job->Y + i0 * job->N, job->N, p0, min_i64(p0 + panel, b1));
}

/* matmul_decode_int8_f32 for format 12 (q4_K), W as decode_int8_q4k_pack made it. */
int decode_int8_q4k_f32(const float *X, const uint8_t *W_packed, float *Y, int64_t M, int64_t N, int64_t K,
                        int64_t threads, int64_t variant) {
    if (M < 0) return DECODE_ERR_ARGUMENT;
    const int status = check_shape(N, K);
    if (status) return status;
    const int64_t resolved = matmul_decode_int8_resolve_variant(variant);
    if (resolved < 0) return DECODE_ERR_VARIANT;
    if (M == 0 || N == 0) return DECODE_OK;
    if (K == 0) {
        memset(Y, 0, (size_t)(M * N) * sizeof(float));
        return DECODE_OK;
    }
    const int64_t supers = K / SUPER;
    int width = 1; /* super-blocks per entry of X's layout */
    struct q4k_job job = {NULL, W_packed, Y, M, N, K, 0, (N + BLOCK_ROWS - 1) / BLOCK_ROWS, 1, rows_portable};
#if DECODE_HAVE_X86
    if (resolved == DECODE_AVX2) job.rows = rows_avx2;
    if (resolved == DECODE_AVX512) {
        job.rows = rows_vnni;
        width = 2;
    }
#endif
    job.x_row_bytes =
        width == 1 ? supers * (int64_t)sizeof(struct q4k_x) : (supers + 1) / 2 * (int64_t)sizeof(struct q4k_x2);
    void *memory = NULL;
    const size_t entries = (size_t)(M * job.x_row_bytes), row = (size_t)(K / DECODE_BLOCK * Q8_BYTES);
    if (posix_memalign(&memory, 64, entries + row)) return DECODE_ERR_MEMORY;
    const int quantized = quantize_activations(X, M, K, resolved, width, (uint8_t *)memory + entries, memory);
    if (quantized) {
        free(memory);
        return quantized;
    }
    job.x = memory;
    job.parts = pool_threads_for(threads, (double)M * (double)N * (double)K, job.blocks);
    pool_run(job.parts, q4k_task, &job);
    free(memory);
    return DECODE_OK;
}
