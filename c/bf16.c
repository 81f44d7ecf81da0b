/* BF16 GEMM on the CPU: C = A @ B with A [M, K] and B [K, N] in bfloat16 (their bit patterns,
 * uint16_t), every product summed in float32, C written as float32 or rounded once, to nearest
 * even, to bfloat16. The step after packed.c for CPUs that multiply bfloat16 in hardware.
 *
 * Why it is faster than float32: a bfloat16 is the top half of a float32, so a 512-bit
 * register holds 32 of them instead of 16, and the hardware multiplies them in pairs, adding
 * both products to one float32 lane:
 *
 *   - AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later): vdpbf16ps takes 16 lanes,
 *     each a pair (a0, a1) times a pair (b0, b1), and adds a0 b0 + a1 b1 to a float32 lane:
 *     twice the multiply-adds of a float32 FMA per instruction, so twice the rate where it
 *     issues as often as an FMA (Zen 4). (The AMX Xeon this was written on issues it at half the
 *     rate, so there it only matches float32: a loop of independent ones, 106 GFLOP/s a core.)
 *   - AMX-BF16 (Sapphire Rapids and later Xeons): eight tile registers of up to 16 rows x 64
 *     bytes; TDPBF16PS multiplies a 16 x 32 bfloat16 tile of A by a 32 x 16 tile of B into a
 *     16 x 16 float32 tile of C, 8192 multiply-adds in one instruction (about 16 cycles:
 *     512 a cycle, a loop of them about 3 TFLOP/s a core, 13x that core's float32 FMAs).
 *
 * The pair layout. Both instructions want B with pairs of consecutive k side by side: the
 * 32-bit lane for column n holds (B[2r][n], B[2r+1][n]). B is packed so ("VNNI layout"): a
 * strip of 16 columns is kp / 2 rows of 64 bytes, row r holding those 16 pairs, which is at
 * once one zmm register for vdpbf16ps and one row of an AMX B tile. A needs no reordering for
 * AMX (a tile row is 32 consecutive k of one row of A); for vdpbf16ps a pair of A is one
 * 32-bit word, broadcast to the 16 lanes.
 *
 * The loop nest is packed.c's (Goto/BLIS) with the K sum cut into equal pieces of at most KC
 * (fit_blocks), reordered so that nothing is packed twice:
 *
 *   pack all of this thread's B, panel by panel (NC columns), piece by piece (KC k)
 *   for ic in M step MC            A block MC x K packed once, piece by piece
 *    for jc in N step NC
 *     for pc in K step KC          (partial sums of the MC x NC block in a scratch, in L2)
 *      for ir in MC step MR        A micro-panel MR x KC: stays in L1 while ...
 *       for jr in NC step 32       ... the B piece (KC x NC) streams past it from L2
 *        micro-kernel: MR x 32 of C over the KC piece
 *
 * K tails are zero in both packings (AMX steps by 32 k at a time, vdpbf16ps by 2), so a padded
 * product adds zeros. N edges (and AMX's M edges) compute the whole padded tile and write only
 * the part inside C. Between KC pieces the float32 partial sums wait in a per-thread scratch
 * block (padded, so no edge cases there), which is what lets C be bfloat16: C itself is written
 * once, after the last piece, through a 64-byte-aligned tile on the stack for bfloat16 or for
 * edge tiles (masked stores: nothing outside C is touched), directly for whole float32 tiles.
 *
 * The AMX micro-kernel holds a 32 x 32 block of C in four 16 x 16 float32 tiles (tmm0..3), two
 * A tiles (tmm4, tmm5: rows 0-15 and 16-31, 32 k each) and two B tiles (tmm6, tmm7: columns
 * 0-15 and 16-31): four tile loads feed four TDPBF16PS, the eight tile registers all used. The
 * AVX512_BF16 micro-kernel is packed_avx512.c's 14 x 32 register tile (28 accumulators, two B
 * vectors, one broadcast), one vdpbf16ps where that kernel has one FMA, over pairs of k; like
 * it, it computes only the rows that exist (an edge panel of 4 rows pays for 4, not 14).
 *
 * Threads: the thread pool (thread_pool.c); C is cut along M (in rows for AVX512_BF16, whole
 * 32-row panels for AMX) or along N (in 32-column slivers), whichever has more micro-tiles,
 * each part running the nest on its block with its own pack buffers for A. Cut along M, every
 * part reads all of B: the parts pack it once, together, into one buffer they share
 * (pack_shared_b; on a Zen 4 only a B of over 2 MiB, dp_zen4_kernel); cut along N, each packs
 * its own columns. The K sum is never split, so the bits are the same for every thread count.
 * Tile configuration is per thread: each part loads it before its first tile instruction and
 * releases it at the end.
 *
 * Every instruction beyond x86-64 sits in functions with a target attribute and runs only after
 * CPUID (and, for AMX, the OS) says it may, so the library loads and runs everywhere; on a CPU
 * without either extension every variant reports 1 (cannot run).
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* syscall under a strict -std=c11 */
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "packed.h" /* packed_is_zen4: where dp_zen4_kernel's blocks were measured */
#include "thread_pool.h"

/* The variant numbers (the harness's VARIANTS; 1-3 are c.packed's portable, avx2, avx512). */
enum { BF16_AUTO = 0, BF16_AVX512BF16 = 4, BF16_AMX = 5 };
/* Return codes, as c.packed's. */
enum { BF16_OK = 0, BF16_ERR_VARIANT = 1, BF16_ERR_MEMORY = 2, BF16_ERR_ARGUMENT = 3 };

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BF16_HAVE_X86 1
#include <cpuid.h>
#include <immintrin.h>

#include "transpose_avx512.h"
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define BF16_HAVE_X86 0
#endif

#if BF16_HAVE_X86

/* ---- what this CPU and OS allow ------------------------------------------------------------ */

/* XCR0: which register states the OS saves on a context switch (a feature whose state it does
 * not save cannot be used). Read only after CPUID says XGETBV exists. */
__attribute__((target("xsave"))) static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

enum {
    XCR0_AVX512 = 0xe6, /* SSE, AVX, opmask, upper ZMM0-15, ZMM16-31 */
    XCR0_AMX = 3 << 17, /* XTILECFG, XTILEDATA */
    ARCH_REQ_XCOMP_PERM = 0x1023,
    XFEATURE_XTILEDATA = 18,
};

static int have_avx512bf16, have_amx;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

static void detect(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return; /* OSXSAVE: XGETBV exists */
    const uint64_t saved = xcr0();
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx512 = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)) && /* F, BW, VL */
                       (saved & XCR0_AVX512) == XCR0_AVX512;
    const int amx_hw = (d & (1u << 24)) && (d & (1u << 22)); /* AMX-TILE, AMX-BF16 */
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    have_avx512bf16 = avx512 && (a1 & (1u << 5)); /* AVX512_BF16 */
    /* The AMX state is 8 KiB, so Linux (5.16 on) leaves it out of a thread's signal frame and
     * context until the process asks for it; the first tile instruction without that permission
     * dies of SIGILL. The permission is per process, so asking once covers every thread. */
#if defined(__linux__) && defined(SYS_arch_prctl)
    have_amx = have_avx512bf16 && amx_hw && (saved & XCR0_AMX) == XCR0_AMX &&
               syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    (void)amx_hw;
#endif
}

static int variant_runs(int64_t variant) {
    pthread_once(&detect_once, detect);
    switch (variant) {
    case BF16_AVX512BF16: return have_avx512bf16;
    case BF16_AMX: return have_amx;
    default: return 0;
    }
}

#else
static int variant_runs(int64_t variant) {
    (void)variant;
    return 0;
}
#endif

/* 1 if this CPU, OS and build can run the variant (the numbers above; auto: either), else 0. */
MATMUL_API int matmul_bf16_variant_supported(int64_t variant) {
    if (variant == BF16_AUTO) return variant_runs(BF16_AMX) || variant_runs(BF16_AVX512BF16);
    return variant_runs(variant);
}

/* The variant that `variant` runs as (auto: AMX, else AVX512_BF16), or -1 if it cannot run. */
MATMUL_API int64_t matmul_bf16_resolve_variant(int64_t variant) {
    if (variant == BF16_AUTO) {
        if (variant_runs(BF16_AMX)) return BF16_AMX;
        if (variant_runs(BF16_AVX512BF16)) return BF16_AVX512BF16;
        return -1;
    }
    return variant_runs(variant) ? variant : -1;
}

static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

#if BF16_HAVE_X86

#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define AMX        __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define INLINE     static inline __attribute__((always_inline))

enum { NR = 32 }; /* both micro-kernels: 32 columns of C, two 16-column strips of packed B */

/* A micro-kernel: the MR x 32 tile of C over kp (padded) k, from the packed micro-panel of A
 * and the packed sliver of B, starting from src (float32, row stride ldsrc) or from zero where
 * src is NULL, stored to dst (row stride lddst): its first `rows` rows at least (the rows of
 * the panel inside A; a kernel may compute and store all MR). */
typedef void (*bf16_tile_fn)(int64_t kp, const uint16_t *a, const uint16_t *b, const float *src, int64_t ldsrc,
                             float *dst, int64_t lddst, int64_t rows);

struct bf16_kernel {
    int mr;             /* rows of the micro-kernel's tile */
    int k_step;         /* kp is a multiple of this (AMX: 32 k a tile; vdpbf16ps: a pair) */
    int64_t kc, mc, nc; /* cache blocks */
    int tiles;          /* 1: configure AMX tiles around the work of a part */
    int rows_exact;     /* 1: the tile computes only the rows asked for (else all MR) */
    int64_t own_b_max;  /* bytes of B up to which parts cut along M each pack their own */
    bf16_tile_fn tile;
    void (*pack_a)(const uint16_t *A, int64_t K, int64_t i0, int64_t mc, int64_t mcp, int64_t kc_block, int64_t piece,
                   uint16_t *out); /* a bf16_pack_a_fn (below) */
};

/* ---- packing ---------------------------------------------------------------------------- */

/* A part's B (k in [0, K), columns [n0, n1)) into panels of nc_block columns, each in pieces
 * of kc_block k, piece q of panel t at out + (t * pieces + q) * piece: strips of 16 columns,
 * each kp / 2 rows of 16 pairs (B[2r][n], B[2r+1][n]), the pair layout. Two rows' 32 columns
 * are interleaved by one two-source permute per strip. B is read along its rows (read panel
 * by panel, every row was 512 bytes, too short for the prefetcher: the loads waited on
 * memory), PACK_B_PAIRS pairs of rows together, 32 columns of each in turn, so that each strip
 * gets that many consecutive 64-byte lines at a time. (A pair of rows at a time wrote its 32
 * columns' lines to strips 16 KiB apart, all in the same few sets of L1: one thread of a Zen 5,
 * 512^3 4-5% faster whole, 1024^3 1-3.5%, and on two threads, 512^3 to 4096^3, 3-9%.) Past
 * the matrix everything is zero. Only the rows of pairs [pair0, pair1) are packed, counted
 * across the pieces (piece q's row r is pair q * kc_block / 2 + r), so that parts sharing one
 * packed B can each pack a share of it. */
enum { PACK_B_PAIRS = 8 };

AVX512BF16 static void pack_b(const uint16_t *B, int64_t N, int64_t K, int64_t n0, int64_t n1, int64_t kc_block,
                              int64_t nc_block, int64_t k_step, int64_t pieces, int64_t piece, int64_t pair0,
                              int64_t pair1, uint16_t *out) {
    /* lane 2c takes the first row's column c, lane 2c + 1 the second row's (index 32 + c) */
    uint16_t lo_index[32], hi_index[32];
    for (int c = 0; c < 16; ++c) {
        lo_index[2 * c] = (uint16_t)c, lo_index[2 * c + 1] = (uint16_t)(32 + c);
        hi_index[2 * c] = (uint16_t)(16 + c), hi_index[2 * c + 1] = (uint16_t)(48 + c);
    }
    const __m512i lo = _mm512_loadu_si512(lo_index), hi = _mm512_loadu_si512(hi_index);
    const int64_t width = n1 - n0;
    for (int64_t p0 = 0, q = 0; p0 < K; p0 += kc_block, ++q) {
        const int64_t kc = min_i64(kc_block, K - p0), kp = round_up(kc, k_step);
        const int64_t strip = kp * 16; /* elements of one 16-column strip */
        const int64_t r0 = pair0 - p0 / 2, r1 = min_i64(kp / 2, pair1 - p0 / 2);
        for (int64_t rb = r0 > 0 ? r0 : 0; rb < r1; rb += PACK_B_PAIRS) {
            const int64_t rb1 = min_i64(r1, rb + PACK_B_PAIRS);
            /* panel by panel: a division per 32 columns to find the panel took 40% of the time */
            for (int64_t j0 = 0, panel = 0; j0 < width; j0 += nc_block, ++panel) {
                uint16_t *strips = out + (panel * pieces + q) * piece;
                for (int64_t j = j0; j < min_i64(width, j0 + nc_block); j += 32) {
                    const int64_t cols = min_i64(32, width - j);
                    const __mmask32 mask = cols == 32 ? ~(__mmask32)0 : (((__mmask32)1 << cols) - 1);
                    uint16_t *s0 = strips + (j - j0) / 16 * strip;
                    for (int64_t r = rb; r < rb1; ++r) {
                        const int64_t k = 2 * r;
                        const int have0 = k < kc, have1 = k + 1 < kc; /* past kc: the zero padding */
                        const uint16_t *row0 = have0 ? B + (p0 + k) * N + n0 : B, *row1 = have1 ? row0 + N : B;
                        const __m512i x0 = have0 ? _mm512_maskz_loadu_epi16(mask, row0 + j) : _mm512_setzero_si512();
                        const __m512i x1 = have1 ? _mm512_maskz_loadu_epi16(mask, row1 + j) : _mm512_setzero_si512();
                        _mm512_store_si512(s0 + r * 32, _mm512_permutex2var_epi16(x0, lo, x1));
                        _mm512_store_si512(s0 + strip + r * 32, _mm512_permutex2var_epi16(x0, hi, x1));
                    }
                }
            }
        }
    }
}

/* Rows [i0, i0 + mc) of A, all of K, piece by piece (kc_block k; piece q at out + q * piece),
 * each piece as the micro-kernel reads it (mcp rows, zero padded). */
typedef void (*bf16_pack_a_fn)(const uint16_t *A, int64_t K, int64_t i0, int64_t mc, int64_t mcp, int64_t kc_block,
                               int64_t piece, uint16_t *out);

/* A for AMX: in each piece, groups of 16 rows, each kp / 32 tiles of 16 rows x 32 k (1 KiB,
 * contiguous, so a tile load reads 16 consecutive cache lines), rows of A as they are, zero past
 * the matrix. Each row is read whole, across the pieces, as one stream. */
AVX512BF16 static void pack_a_tiles(const uint16_t *A, int64_t K, int64_t i0, int64_t mc, int64_t mcp, int64_t kc_block,
                                    int64_t piece, uint16_t *out) {
    for (int64_t i = 0; i < mcp; ++i) {
        const uint16_t *row = i < mc ? A + (i0 + i) * K : A; /* padding rows read nothing */
        for (int64_t p0 = 0, q = 0; p0 < K; p0 += kc_block, ++q) {
            const int64_t kc = min_i64(kc_block, K - p0), steps = round_up(kc, 32) / 32;
            uint16_t *row_out = out + q * piece + (i / 16) * steps * 512 + (i % 16) * 32;
            for (int64_t s = 0; s < steps; ++s) {
                const int64_t k = 32 * s, left = i < mc ? kc - k : 0;
                const __mmask32 mask = left >= 32 ? ~(__mmask32)0 : left <= 0 ? 0 : (((__mmask32)1 << left) - 1);
                _mm512_store_si512(row_out + s * 512, _mm512_maskz_loadu_epi16(mask, row + p0 + k));
            }
        }
    }
}

enum { DP_MR = 14 };

/* A for vdpbf16ps: in each piece, micro-panels of 14 rows, for each pair of k the 14 pairs (one
 * 32-bit word each, the word broadcast to every lane) side by side. 16 pairs of each row at a
 * time: one load a row (masked past the whole pairs, and read ahead by hand: the 14 rows are
 * 14 streams K apart), a transpose of the words in registers (transpose_avx512.h), one masked
 * store of 14 words per pair. An odd K's last pair (k, zero) is written after. (Element by
 * element, two bfloat16 at a time with the edge tests, this packing took 10% of the time at
 * 1024^3 on one thread of a Zen 5.) */
enum { PAIRS_AHEAD = 512 }; /* bytes ahead along each row of A */

AVX512BF16 static void pack_a_pairs(const uint16_t *A, int64_t K, int64_t i0, int64_t mc, int64_t mcp, int64_t kc_block,
                                    int64_t piece, uint16_t *out) {
    typedef uint32_t __attribute__((may_alias)) pair_word;
    for (int64_t p0 = 0, q = 0; p0 < K; p0 += kc_block, ++q) {
        const int64_t kc = min_i64(kc_block, K - p0), pairs = round_up(kc, 2) / 2, whole = kc / 2;
        for (int64_t g = 0; g < mcp; g += DP_MR) {
            pair_word *panel = (pair_word *)(void *)(out + q * piece + g * 2 * pairs);
            const int64_t rows = min_i64(DP_MR, mc - g); /* the rest are zero */
            const uint16_t *first = A + (i0 + g) * K + p0;
            for (int64_t p = 0; p < pairs; p += 16) {
                const int64_t cols = min_i64(16, whole - p); /* whole pairs in this block (<= 0: none) */
                const __mmask16 mask = cols >= 16 ? 0xffff : cols > 0 ? (__mmask16)((1u << cols) - 1) : 0;
                __m512 r[16], column[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; ++i) {
                    if (i < rows) _mm_prefetch((const char *)(first + i * K + 2 * p) + PAIRS_AHEAD, _MM_HINT_T0);
                    r[i] = i < rows ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(mask, first + i * K + 2 * p))
                                    : _mm512_setzero_ps();
                }
                transpose_16x16_words(r, column);
                for (int64_t c = 0; c < min_i64(16, pairs - p); ++c)
                    _mm512_mask_storeu_epi32(panel + (p + c) * DP_MR, (1u << DP_MR) - 1,
                                             _mm512_castps_si512(column[c]));
            }
            if (kc % 2) /* the last pair: (A's last k, 0); its word was stored as zero above */
                for (int64_t r = 0; r < rows; ++r) panel[whole * DP_MR + r] = first[r * K + kc - 1];
        }
    }
}

/* ---- the AMX micro-kernel -------------------------------------------------------------- */

/* Palette 1; all eight tiles 16 rows x 64 bytes (C: 16 float32 a row; A: 32 bfloat16; B: 16
 * pairs). The layout of the 64-byte operand of LDTILECFG. */
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* A constant in memory, not a local filled in before LDTILECFG: GCC 12's _tile_loadconfig tells
 * the compiler it reads only 8 bytes of its operand, so the stores filling in the rest of a
 * local could be dropped as dead (they were, in the x86-64-v3 build: SIGILL at the first tile
 * instruction). */
static const struct tile_config tile_config
    __attribute__((aligned(64))) = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

AMX static void amx_begin(void) { _tile_loadconfig(&tile_config); }

AMX static void amx_end(void) { _tile_release(); }

AMX static void amx_tile(int64_t kp, const uint16_t *a, const uint16_t *b, const float *src, int64_t ldsrc, float *dst,
                         int64_t lddst, int64_t rows) {
    /* all 32 rows, whatever `rows` says: the tiles are configured once per part */
    (void)rows;
    const int64_t steps = kp / 32, group = steps * 512; /* one group of 16 rows (or strip of 16 columns) */
    const uint16_t *a0 = a, *a1 = a + group, *b0 = b, *b1 = b + group;
    if (src) {
        const int64_t stride = ldsrc * (int64_t)sizeof(float);
        _tile_loadd(0, src, stride);
        _tile_loadd(1, src + 16, stride);
        _tile_loadd(2, src + 16 * ldsrc, stride);
        _tile_loadd(3, src + 16 * ldsrc + 16, stride);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t s = 0; s < steps; ++s) {
        _tile_loadd(4, a0 + s * 512, 64);
        _tile_loadd(6, b0 + s * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + s * 512, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + s * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    const int64_t stride = lddst * (int64_t)sizeof(float);
    _tile_stored(0, dst, stride);
    _tile_stored(1, dst + 16, stride);
    _tile_stored(2, dst + 16 * lddst, stride);
    _tile_stored(3, dst + 16 * lddst + 16, stride);
}

/* ---- the AVX512_BF16 micro-kernel ------------------------------------------------------- */

/* The first `rows` rows of the tile (a constant in each instance: dp_tile's switch), so an
 * edge panel of 4 rows pays for 4, not 14. */
AVX512BF16 INLINE void dp_tile_rows(int64_t kp, const uint16_t *a, const uint16_t *b, const float *src, int64_t ldsrc,
                                    float *dst, int64_t lddst, const int rows) {
    const uint16_t *b0 = b, *b1 = b + kp * 16;
    typedef uint32_t __attribute__((may_alias)) pair_word; /* two bfloat16, read as one word */
    const pair_word *pairs = (const pair_word *)(const void *)a;
    __m512 c[DP_MR][2];
#pragma GCC unroll 14
    for (int i = 0; i < rows; ++i) {
        c[i][0] = src ? _mm512_loadu_ps(src + i * ldsrc) : _mm512_setzero_ps();
        c[i][1] = src ? _mm512_loadu_ps(src + i * ldsrc + 16) : _mm512_setzero_ps();
    }
#pragma GCC unroll 2
    for (int64_t p = 0; p < kp / 2; ++p) {
        const __m512bh v0 = (__m512bh)_mm512_load_si512(b0 + p * 32), v1 = (__m512bh)_mm512_load_si512(b1 + p * 32);
#pragma GCC unroll 14
        for (int i = 0; i < rows; ++i) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)pairs[p * DP_MR + i]);
            c[i][0] = _mm512_dpbf16_ps(c[i][0], ai, v0);
            c[i][1] = _mm512_dpbf16_ps(c[i][1], ai, v1);
        }
    }
#pragma GCC unroll 14
    for (int i = 0; i < rows; ++i) {
        _mm512_storeu_ps(dst + i * lddst, c[i][0]);
        _mm512_storeu_ps(dst + i * lddst + 16, c[i][1]);
    }
}

AVX512BF16 static void dp_tile(int64_t kp, const uint16_t *a, const uint16_t *b, const float *src, int64_t ldsrc,
                               float *dst, int64_t lddst, int64_t rows) {
    switch (rows) {
    case 1: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 1); break;
    case 2: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 2); break;
    case 3: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 3); break;
    case 4: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 4); break;
    case 5: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 5); break;
    case 6: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 6); break;
    case 7: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 7); break;
    case 8: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 8); break;
    case 9: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 9); break;
    case 10: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 10); break;
    case 11: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 11); break;
    case 12: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 12); break;
    case 13: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, 13); break;
    default: dp_tile_rows(kp, a, b, src, ldsrc, dst, lddst, DP_MR); break;
    }
}

/* Block sizes. AMX: KC = 256 k, so the A micro-panel (32 rows x 256 k, 16 KiB) stays in L1
 * while the B piece (256 columns x 256 k, 128 KiB) streams past it from L2, beside the A piece
 * (MC = 512 rows, 256 KiB) and the partial sums (512 x 256 float32, 544 KiB with the padding),
 * all in a 2 MiB L2. Each A block reads all of the part's B once, from L3 or memory, so a tall
 * block reads it fewer times. (One thread, best of several calls, 1024^3 and 4096^3: KC = 512
 * or 128 5-10% slower, MC x NC = 256 x 512 within 4%, 1024 x 128 8-15% slower.) AVX512_BF16:
 * packed_avx512.c's float32 blocks, in bytes (a bfloat16 pair is 4 bytes, as a float32 is). */
static const struct bf16_kernel amx_kernel = {32, 32, 256, 512, 256, 1, 0, 0, amx_tile, pack_a_tiles};
static const struct bf16_kernel dp_kernel = {DP_MR, 2, 512, 14 * 12, 1024, 0, 1, 0, dp_tile, pack_a_pairs};
/* AVX512_BF16 on a Zen 4 (measured there only; a Zen 5 may gain as c.packed did):
 *  - a deeper KC: a 64 KiB sliver of B (32 columns x 1024 k) streaming from L2, as c.packed's
 *    deep KC does there (packed_setup.c), and MC halved so the A block keeps its 168 KiB. One
 *    thread, medians of 9 interleaved runs against the blocks above: 512^3 1.01x, 1024^3
 *    1.05x, 2048^3 1.03-1.04x, 4096^3 1.02x, 128 x 4096 x 4096 and 512 x 4096 x 4096
 *    1.03-1.04x, 4096 x 4096 x 1024 1.05x; two threads 1.00-1.07x. MC = 126 or 168 did as well
 *    within 2%.
 *  - a B of up to 2 MiB (twice L2) packed by each part for itself: sharing it, each part
 *    reads the half the other packed from the other core's L2. Two threads, against sharing:
 *    512^3, 768^3, 512 x 1024 x 512 1.03x, 1024^3 1.02x; from 4 MiB sharing wins (1536^3
 *    1.01x, 2048^3 1.04x, 4 MiB at 1024 x 2048 x 1024 even). */
static const struct bf16_kernel dp_zen4_kernel = {DP_MR, 2, 1024, 14 * 6, 1024, 0, 1, 2 << 20, dp_tile, pack_a_pairs};

/* The kernel and blocks a resolved variant runs on this CPU. */
static const struct bf16_kernel *kernel_for(int64_t resolved) {
    if (resolved == BF16_AMX) return &amx_kernel;
    return packed_is_zen4() ? &dp_zen4_kernel : &dp_kernel;
}

/* The kernel with its KC fitted to K: K in equal pieces (multiples of 32 k, none longer than
 * KC), so a last piece of a few k does not cost a pass over the partial sums (K = 1027 with
 * KC = 1024: 544 + 483, not 1024 + 3). The bits do not depend on it: between pieces the
 * float32 sums wait in memory unchanged, and a piece starts on an even k, so the pairs are
 * the same. */
static struct bf16_kernel fit_blocks(const struct bf16_kernel *kernel, int64_t K) {
    struct bf16_kernel fitted = *kernel;
    const int64_t pieces = (K + kernel->kc - 1) / kernel->kc;
    fitted.kc = round_up((K + pieces - 1) / pieces, 32);
    return fitted;
}

/* ---- writing C -------------------------------------------------------------------------- */

/* The rows x cols corner of a tile (row stride NR floats, 64-byte aligned) into C: float32 as
 * it is, or rounded to nearest even to bfloat16 (vcvtneps2bf16), masked past cols. */
AVX512BF16 static void write_c(const float *tile, int64_t rows, int64_t cols, void *C, int64_t ldc, int out_bf16) {
    const __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    const __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    const __mmask32 m = cols >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << cols) - 1);
    for (int64_t i = 0; i < rows; ++i) {
        const __m512 v0 = _mm512_load_ps(tile + i * NR), v1 = _mm512_load_ps(tile + i * NR + 16);
        if (out_bf16) {
            /* both halves in one register, so a whole row of the tile is one 64-byte store,
             * not two masked 32-byte ones into the same line */
            const __m512i row = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
            uint16_t *out = (uint16_t *)C + i * ldc;
            if (cols == NR)
                _mm512_storeu_si512(out, row);
            else
                _mm512_mask_storeu_epi16(out, m, row);
        } else {
            float *row = (float *)C + i * ldc;
            _mm512_mask_storeu_ps(row, m0, v0);
            _mm512_mask_storeu_ps(row + 16, m1, v1);
        }
    }
}

/* ---- the loop nest ---------------------------------------------------------------------- */

/* The packed buffers of one part, in elements: a KC piece of an A block (a_piece) or of a
 * B panel (b_piece), every piece sized as a full one. */
struct bf16_sizes {
    int64_t pieces, panels, a_piece, b_piece, lds;
};

struct bf16_job {
    const uint16_t *A, *B;
    void *C;
    int64_t M, N, K;
    int out_bf16;
    struct bf16_kernel kernel; /* the micro-kernel, its blocks fitted to this K (fit_blocks) */
    int64_t parts, split_m;    /* C cut into `parts` along M (split_m) or N ... */
    int64_t units, unit;       /* ... in `units` of `unit` rows or columns */
    struct bf16_sizes sizes;   /* those of the largest part, which every part's buffers take */
    char *buffers;             /* the shared B (shared_bytes, 0 if none), then each part's */
    size_t shared_bytes, part_bytes;
    int64_t b_chunks;                /* the shared B's chunks of B_CHUNK_PAIRS rows of pairs */
    int64_t next_chunk, chunks_done; /* atomic: the next chunk to claim, the chunks packed */
};

static struct bf16_sizes sizes_for(const struct bf16_kernel *kern, int64_t K, int64_t rows, int64_t cols) {
    struct bf16_sizes z;
    const int64_t kcp = round_up(min_i64(kern->kc, K), 32), ncp = round_up(min_i64(kern->nc, cols), NR);
    z.pieces = (K + kern->kc - 1) / kern->kc;
    z.panels = (cols + kern->nc - 1) / kern->nc;
    z.a_piece = round_up(min_i64(kern->mc, rows), kern->mr) * kcp;
    z.b_piece = kcp * ncp;
    /* The partial sums' rows a cache line more than a power of two apart: 16 rows of a tile
     * 2 or 4 KiB apart would all fall in one set of L1. */
    z.lds = ncp + 16;
    return z;
}

static size_t a_pack_bytes(const struct bf16_sizes *z) { return (size_t)(z->pieces * z->a_piece) * 2; }
static size_t b_pack_bytes(const struct bf16_sizes *z) { return (size_t)(z->panels * z->pieces * z->b_piece) * 2; }

/* Rows of pairs of B a part claims at a time when the parts share one packed B: 32 rows of B,
 * small enough for two parts to end their shares together, long enough that claiming costs
 * nothing beside packing. */
enum { B_CHUNK_PAIRS = 16 };

/* B shared by the parts, when C is cut along M and every part reads all of it: packed once,
 * each part claiming chunks in turn until none is left, then waiting until every chunk is in.
 * (Each part packing all of B for itself cost products of 512^3-2048^3 on two threads 7-12%
 * of their time on a Zen 5; on a Zen 4 it pays for a B of up to 2 MiB: dp_zen4_kernel.)
 * A part never waits while a chunk it claimed is unpacked, so parts that the pool runs one
 * after another, on one thread, end too: the first packs everything. */
AVX512BF16 static void pack_shared_b(struct bf16_job *job, uint16_t *b_pack) {
    const struct bf16_kernel *kern = &job->kernel;
    for (;;) {
        const int64_t chunk = __atomic_fetch_add(&job->next_chunk, 1, __ATOMIC_RELAXED);
        if (chunk >= job->b_chunks) break;
        pack_b(job->B, job->N, job->K, 0, job->N, kern->kc, kern->nc, kern->k_step, job->sizes.pieces,
               job->sizes.b_piece, chunk * B_CHUNK_PAIRS, (chunk + 1) * B_CHUNK_PAIRS, b_pack);
        __atomic_fetch_add(&job->chunks_done, 1, __ATOMIC_RELEASE);
    }
    pool_wait_at_least(&job->chunks_done, job->b_chunks);
}

/* One part's block of C. All of its B is packed first, once (each A block then reads it from
 * L2 or L3), and each A block once over the whole K, so neither is packed again for another
 * panel (packing A per panel of B was 13% of the time at 2048^3). For each panel of B the K
 * pieces run in turn, their partial sums kept in an MC x NC scratch that stays in L2. */
static void run_block(struct bf16_job *job, int64_t m0, int64_t m1, int64_t n0, int64_t n1, uint16_t *a_pack,
                      uint16_t *b_pack, float *scratch) {
    const struct bf16_kernel *kern = &job->kernel;
    const struct bf16_sizes *z = &job->sizes;
    const int64_t mr = kern->mr, N = job->N, K = job->K, lds = z->lds;
    float spill[32 * NR] __attribute__((aligned(64)));
    if (job->shared_bytes)
        pack_shared_b(job, b_pack);
    else
        pack_b(job->B, N, K, n0, n1, kern->kc, kern->nc, kern->k_step, z->pieces, z->b_piece, 0, INT64_MAX, b_pack);
    for (int64_t ic = m0; ic < m1; ic += kern->mc) {
        const int64_t mc = min_i64(kern->mc, m1 - ic), mcp = round_up(mc, mr);
        kern->pack_a(job->A, K, ic, mc, mcp, kern->kc, z->a_piece, a_pack);
        for (int64_t jc = n0, panel = 0; jc < n1; jc += kern->nc, ++panel) {
            const int64_t nc = min_i64(kern->nc, n1 - jc), ncp = round_up(nc, NR);
            for (int64_t pc = 0, piece = 0; pc < K; pc += kern->kc, ++piece) {
                const int64_t kc = min_i64(kern->kc, K - pc), kp = round_up(kc, kern->k_step);
                const int first = pc == 0, last = pc + kc == K;
                const uint16_t *a_block = a_pack + piece * z->a_piece;
                const uint16_t *b_panel = b_pack + (panel * z->pieces + piece) * z->b_piece;
                /* A micro-panel (32 x KC: 16 KiB) in L1, the B piece streaming past from L2,
                 * C written along its rows */
                for (int64_t ir = 0; ir < mcp; ir += mr) {
                    for (int64_t jr = 0; jr < ncp; jr += NR) {
                        const int64_t cols = min_i64(NR, nc - jr);
                        float *partial = scratch + ir * lds + jr;
                        const float *src = first ? NULL : partial;
                        const uint16_t *a = a_block + ir * kp, *b = b_panel + jr * kp;
                        const int64_t rows = min_i64(mr, mc - ir);
                        if (!last) {
                            kern->tile(kp, a, b, src, lds, partial, lds, rows);
                            continue;
                        }
                        if (!job->out_bf16 && rows == mr && cols == NR) {
                            float *c = (float *)job->C + (ic + ir) * N + jc + jr;
                            kern->tile(kp, a, b, src, lds, c, N, rows);
                        } else {
                            kern->tile(kp, a, b, src, lds, spill, NR, rows);
                            const int64_t offset = (ic + ir) * N + jc + jr;
                            void *c = job->out_bf16 ? (void *)((uint16_t *)job->C + offset)
                                                    : (void *)((float *)job->C + offset);
                            write_c(spill, rows, cols, c, N, job->out_bf16);
                        }
                    }
                }
            }
        }
    }
}

static void bf16_task(void *context, int64_t part) {
    struct bf16_job *job = context;
    const struct bf16_kernel *kern = &job->kernel;
    const int64_t unit = job->unit;
    const int64_t extent = job->split_m ? job->M : job->N;
    const int64_t first = min_i64(extent, job->units * part / job->parts * unit);
    const int64_t last = min_i64(extent, job->units * (part + 1) / job->parts * unit);
    if (first >= last) return;
    const int64_t m0 = job->split_m ? first : 0, m1 = job->split_m ? last : job->M;
    const int64_t n0 = job->split_m ? 0 : first, n1 = job->split_m ? job->N : last;

    char *own = job->buffers + job->shared_bytes + (size_t)part * job->part_bytes;
    const size_t a_bytes = a_pack_bytes(&job->sizes);
    const size_t b_bytes = job->shared_bytes ? 0 : b_pack_bytes(&job->sizes);
    uint16_t *b_pack = job->shared_bytes ? (uint16_t *)job->buffers : (uint16_t *)(own + a_bytes);
    if (kern->tiles) amx_begin();
    run_block(job, m0, m1, n0, n1, (uint16_t *)own, b_pack, (float *)(own + a_bytes + b_bytes));
    if (kern->tiles) amx_end();
}

/* Cuts C into parts, sizes their buffers and takes them from the calling thread's scratch, all
 * in one piece: the pool may run every part on the calling thread, one after another, so no
 * part may take that scratch for itself. Returns 0 if it cannot be had. */
static int plan_job(struct bf16_job *job, int64_t threads) {
    const struct bf16_kernel *kern = &job->kernel;
    const int64_t units_m = (job->M + kern->mr - 1) / kern->mr, units_n = (job->N + NR - 1) / NR;
    job->split_m = units_m >= units_n;
    job->units = job->split_m ? units_m : units_n;
    job->parts = pool_threads_for(threads, (double)job->M * (double)job->N * (double)job->K, job->units);
    job->unit = job->split_m ? kern->mr : NR;
    /* Along M, a kernel that computes only the rows asked for is cut by rows, not panels: 512
     * rows on two threads are 256 each (18 panels of 14 and one of 4), not 19 and 18 panels
     * (266 rows' work against 252). Two threads of a Zen 4, 512^3, a tight loop: 3.7% faster. */
    if (job->split_m && kern->rows_exact) job->unit = 1, job->units = job->M;
    const int64_t largest = (job->units + job->parts - 1) / job->parts; /* units in the largest part */
    const int64_t rows = job->split_m ? min_i64(job->M, largest * job->unit) : job->M;
    const int64_t cols = job->split_m ? job->N : min_i64(job->N, largest * NR);
    job->sizes = sizes_for(kern, job->K, rows, cols);
    const int shared = job->split_m && job->parts > 1 && job->K * job->N * 2 > kern->own_b_max;
    const size_t a_bytes = a_pack_bytes(&job->sizes), b_bytes = b_pack_bytes(&job->sizes);
    /* partial sums are kept only when the K sum has more than one piece */
    const size_t s_bytes =
        job->sizes.pieces > 1
            ? (size_t)(job->sizes.a_piece / round_up(min_i64(kern->kc, job->K), 32) * job->sizes.lds) * 4
            : 0;
    job->shared_bytes = shared ? b_bytes : 0;
    job->part_bytes = (size_t)round_up((int64_t)(a_bytes + (shared ? 0 : b_bytes) + s_bytes), 64);
    /* rows of pairs: every piece but the last is kc / 2 of them, the last its padded k / 2 */
    const int64_t last_kp = round_up(job->K - (job->sizes.pieces - 1) * kern->kc, kern->k_step);
    const int64_t pairs = (job->sizes.pieces - 1) * kern->kc / 2 + last_kp / 2;
    job->b_chunks = shared ? (pairs + B_CHUNK_PAIRS - 1) / B_CHUNK_PAIRS : 0;
    job->next_chunk = job->chunks_done = 0;
    job->buffers = pool_thread_buffer(job->shared_bytes + (size_t)job->parts * job->part_bytes);
    return job->buffers != NULL;
}

#endif /* BF16_HAVE_X86 */

/* Fills sizes[0..4] with the MR, KC (the longest K piece), MC and NC a variant takes on this
 * CPU, and the bytes of B up to which parts cut along M each pack their own (0: they always
 * share it). Returns 0, or 1 for a variant this CPU, OS or build cannot run. */
MATMUL_API int matmul_bf16_blocking(int64_t variant, int64_t *sizes) {
    const int64_t resolved = matmul_bf16_resolve_variant(variant);
    if (resolved < 0) return BF16_ERR_VARIANT;
#if BF16_HAVE_X86
    const struct bf16_kernel *k = kernel_for(resolved);
    const int64_t values[5] = {k->mr, k->kc, k->mc, k->nc, k->own_b_max};
    memcpy(sizes, values, sizeof values);
    return BF16_OK;
#else
    (void)sizes;
    return BF16_ERR_VARIANT;
#endif
}

/* C = A @ B, bfloat16 inputs (bit patterns), float32 sums. C is float32 (out_bf16 = 0) or
 * bfloat16 rounded to nearest even (out_bf16 = 1). threads <= 0: every online core; variant
 * 0 = auto (AMX, else AVX512_BF16), 4 = AVX512_BF16, 5 = AMX. Returns 0, 1 for a variant this
 * CPU, OS or build cannot run, 2 if the buffers cannot be allocated, 3 for a negative
 * dimension. The result is the same for every thread count. */
MATMUL_API int matmul_bf16(const uint16_t *A, const uint16_t *B, void *C, int64_t M, int64_t N, int64_t K,
                           int64_t threads, int64_t variant, int64_t out_bf16) {
    if (M < 0 || N < 0 || K < 0) return BF16_ERR_ARGUMENT;
    const int64_t resolved = matmul_bf16_resolve_variant(variant);
    if (resolved < 0) return BF16_ERR_VARIANT;
    if (M == 0 || N == 0) return BF16_OK;
    const size_t out_size = out_bf16 ? sizeof(uint16_t) : sizeof(float);
    if (K == 0) { /* an empty sum: C = 0 (+0.0 has the same bits in both formats) */
        memset(C, 0, (size_t)M * (size_t)N * out_size);
        return BF16_OK;
    }
#if BF16_HAVE_X86
    struct bf16_job job = {.A = A,
                           .B = B,
                           .C = C,
                           .M = M,
                           .N = N,
                           .K = K,
                           .out_bf16 = out_bf16 != 0,
                           .kernel = fit_blocks(kernel_for(resolved), K)};
    if (!plan_job(&job, threads)) return BF16_ERR_MEMORY;
    pool_run(job.parts, bf16_task, &job);
    return BF16_OK;
#else
    (void)A, (void)B, (void)threads;
    return BF16_ERR_VARIANT;
#endif
}
