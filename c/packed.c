/* Packed SIMD matmul (Goto / BLIS): the step after blocked.c. Written once over `real` and
 * compiled for float32 and float64 (real.h); the choices that do not depend on the type
 * (micro-kernel, cache sizes, block sizes) are in packed_setup.c, the threads in
 * thread_pool.c, the micro-kernels in packed_avx512.c, packed_avx2.c and packed_portable.c.
 *
 * What changes from blocked.c: the blocked kernel reuses tiles from cache but still lets the
 * compiler's vectorized j loop load and store a row of C for every multiply-add, and it reads
 * A and B in place, with strides. Here (Goto & van de Geijn, "Anatomy of High-Performance
 * Matrix Multiplication", 2008; the BLIS loop nest):
 *
 *   - a micro-kernel keeps an MR x NR tile of C in vector registers for a whole KC-long
 *     stretch of the K sum, so the inner loop is nothing but loads of B, broadcasts of A and
 *     FMAs;
 *   - A and B are copied ("packed") into contiguous, aligned, zero-padded panels laid out in
 *     exactly the order the micro-kernel reads them, so every load is unit stride, every
 *     cache line fetched is used whole, and edge tiles need no special case inside the loop;
 *   - three cache-block sizes, one per cache level, derived from the cache sizes:
 *
 *       loop 5  for jc in N step NC     B panel  KC x NC  packed once, lives in L3
 *       loop 4   for pc in K step KC    (the K sum, cut into KC-long pieces)
 *       loop 3    for ic in M step MC   A block  MC x KC  packed once, lives in L2
 *       loop 2     for jr in NC step NR B sliver KC x NR  reused by every ir, lives in L1
 *       loop 1      for ir in MC step MR A micro-panel MR x KC streams in from L2
 *                    micro-kernel: C[ic+ir.., jc+jr..] (+)= A micro-panel x B sliver
 *
 * Which path each shape takes (matmul_packed_path_*, at the bottom), and why; the path can
 * also be forced (matmul_packed_path_*, or path="vector" | "direct" | "nest" from Python), to
 * compare them on one shape:
 *
 *   M = 1 (GEMV, y = a B)   vector path, row_times_matrix: each element of B is used once, so
 *                           packing it would read it, write a copy and read the copy for one
 *                           FMA. B is streamed once, eight rows at a time into a chunk of y
 *                           that stays in L1, SIMD along N; threads split N. One thread
 *                           streaming a B past half of L3 reads its rows ahead by hand.
 *   N = 1 (y = A b)         vector path, matrix_times_column: a dot product per row of A,
 *                           SIMD along K, eight rows at a time (b is loaded once for eight
 *                           rows); threads split M.
 *   2 <= N <= 8, K long     vector path, matrix_times_columns: the same dot products against
 *                           each of B's few columns (copied into rows first), several rows of
 *                           A at a time; packing A would copy it to use each value n times
 *                           (dots_pay: how long K must be).
 *   B fits in half of L2,   direct path (direct_nest): the same register tile, reading A and
 *   and K <= 32 or          B where they lie. Packing earns its copy by making B's reuse come
 *   M N K <= 256^3          from L1 in unit stride; a B this small is already in L2 after its
 *                           first pass, and packing it (and A) costs more than it saves. Rows
 *                           of C are finished strip by strip, left to right, so C is written
 *                           contiguously: for small K, where writing C is most of the work,
 *                           this is several times faster than the loop nest's usual block
 *                           order. Past a few dozen rows of B over many tiles the nest's
 *                           packed sliver wins (DIRECT_MAX_K gives the crossovers); past half
 *                           of L2 the direct path loses everywhere. `harness.get("c.packed",
 *                           path="direct" | "nest")` measures either on any shape.
 *   everything else         the loop nest above. When M fits in one A block (M <= MC) no B
 *                           panel is reused by a second A block, so the panel is sized for L2
 *                           instead of L3 (NC from L2): packed, it is read back from L2, not
 *                           from L3 (not on a Zen 4, where long rows of B won: packed_setup.c).
 *                           Small M: the micro-kernels compute only the rows that exist, so
 *                           an M = 8 problem pays for 8 rows, not MR = 14. Small K (K <= KC /
 *                           2): loops 1 and 2 swap, so C is written along its rows as in the
 *                           direct path (loop_nest says why).
 *
 * Threads: a persistent pool (thread_pool.c), created once and parked between calls, so a
 * call pays a wake-up rather than thread creation. The direct path and the loop nest cut C
 * into a grid of disjoint blocks (along M and N, in whole MR x NR tiles, toward the
 * dimension with the most tiles), one per thread, each running its path on its block (the
 * nest with its own pack buffers). The K sum is never split, and each C element is computed
 * by the same FMA chain whichever thread computes it, so the result is bitwise identical for
 * every thread count; the GEMV paths cut at multiples of their SIMD groups for the same
 * reason. Which path a shape takes never depends on the thread count.
 *
 * Pack buffers: one per thread, kept between calls and grown when a call needs more (a fresh
 * allocation of megabytes costs a page fault per 4 KiB on every call), freed when the thread
 * exits.
 *
 * Caveats: each thread packs the part of A its block needs; where the grid cuts M, the
 * threads of a column of blocks pack each B panel once, together, into buffers they share
 * (shared_panel), when the pool can run them all at once, and each packs its own otherwise.
 * Where it cuts N, the rows of A are packed once per column of blocks. Results may differ in
 * the last bits from other variants, other paths and other machines (different tile shapes,
 * different KC), never across thread counts.
 *
 * Shapes: A [M, K], B [K, N], C [M, N], row-major, contiguous. C is overwritten.
 * Returns 0, or a PACKED_ERR_* code (packed.h).
 */
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "matmul.h"
#include "packed.h"
#include "real.h"
#include "thread_pool.h"

_Static_assert(PACK_ALIGNMENT <= 64, "pool_thread_buffer aligns to 64 bytes");

static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* The direct path takes a B that fits in half of L2 when K is at most DIRECT_MAX_K or the
 * product at most DIRECT_MAX_FMAS multiply-adds: each of its tiles reads a short piece of
 * each of K rows of B, and past a few dozen rows over many tiles the loop nest's packed,
 * contiguous sliver wins. One thread, medians of 7 (nest time / direct time): 4096^2 x 16
 * 1.07, 4096^2 x 48 0.90, 2048^2 x 64 0.83, 1024^2 x 64 float64 0.82, 256^3 1.01,
 * 384 x 384 x 256 0.94, 128^3 1.15, 1024 x 64 x 64 1.54. */
enum { DIRECT_MAX_K = 32 };
static const double DIRECT_MAX_FMAS = 256.0 * 256.0 * 256.0;

/* Up to this many rows of A, the loop nest packs B in whole rows (see loop_nest). */
enum { STREAM_B_MAX_M = 16 };

/* ... and there KC is shortened as if the whole-row panel were to fit in half of L2, but no
 * further than this (nor past the usual KC): below it each C tile is read and written back
 * after too few FMAs. At 16 x 4096 x 4096, where a whole row of B in float64 allowed only
 * KC = 16, a floor of 128 took one thread from 0.74-0.86x to 0.92-1.01x NumPy's speed on an
 * AMD EPYC Zen 5 (float32 at 4 x 14336 x 4096: 1.50x to 1.65x). */
enum { STREAM_B_MIN_KC = 128 };

/* ---- M = 1: y = a B, streaming B ----------------------------------------------------------- */

/* y holds a chunk of this many bytes, updated by every row of B: it stays in L1 or close to it,
 * and each row of B is read in pieces this long, long enough for the prefetcher to run ahead
 * (8 KiB pieces were 10-20% slower at 1 x 4096 x 14336 than NumPy, 32 KiB ones level with it). */
enum { GEMV_CHUNK = 32768 / sizeof(real), GEMV_ROWS = 8 };

/* Streaming B from memory, a GEMV also reads each of the eight rows ahead by hand, this many
 * bytes past the cache line in use: the hardware prefetcher follows a stream only within a
 * 4 KiB page, so each of the eight streams stalls at every page it enters. Only where B is past
 * half of L3 (where B stays in L3 the prefetches cost issue slots for lines already near:
 * 1 x 1024 x 1024 float64 5% slower on a Zen 5; on a Zen 4 that and 1 x 1024 x 1024 and
 * 1 x 512 x 4096 float32 took 1.07-1.2x as long), and into which cache depends on the CPU
 * (gemv_read_ahead):
 * - AMD EPYC Zen 5, into L1 (prefetcht0), one thread: medians of 25 interleaved calls against
 *   NumPy's OpenBLAS on one thread, reading ahead forced on, 1 x 4096 x 4096 float64 from
 *   0.93-0.96x to 0.97-1.01x, 1 x 8192 x 8192 float64 from 0.94-0.97x to 1.02-1.03x, float32
 *   4-8% faster (1024 and 1536 bytes alike; 512 gained half as much; a second step into L2
 *   from 2-4 KiB ahead lost 5-15%). Two threads streaming together already keep the memory
 *   system busy there (1 x 8192 x 8192, both dtypes, 5% slower). L3 is the core's as Linux
 *   lists it in sysfs (32 MiB, as lscpu listed it): glibc's sysconf gave that virtual
 *   machine's host's 384 MiB, under which only a B past 192 MiB was read ahead (1 x 8192 x
 *   8192 float64, not 1 x 4096 x 4096).
 * - AMD EPYC Zen 4, into L2 (prefetcht1), one and two threads: one thread, medians of 21
 *   interleaved calls, 1 x 4096 x 4096, 1 x 8192 x 8192 and 1 x 2048 x 16384 in both dtypes
 *   1.08-1.12x faster than not reading ahead (1 x 2048 x 2048 and 1 x 3072 x 3072 1.07-1.13x),
 *   two threads (3 calls a sample, 11 samples) 1.00-1.05x. Into L1 it took 1.18-1.30x as long
 *   as not reading ahead, prefetchnta 1.28-1.34x; prefetcht2 was level with prefetcht1, and
 *   512 or 2048 bytes ahead no better than 1024.
 * Other CPUs do not read ahead (not measured). */
enum { GEMV_AHEAD = 1024, GEMV_LINE = 64 / sizeof(real) };
enum gemv_ahead { GEMV_AHEAD_NONE, GEMV_AHEAD_INTO_L1, GEMV_AHEAD_INTO_L2 };

/* Reads the line GEMV_AHEAD bytes past column j of each of the eight rows b0 .. b7 (the locality
 * is the instruction's: 3 is prefetcht0, into L1; 2 is prefetcht1, into L2); from GEMV_AHEAD
 * before the chunk's end c1, the line as far into the next eight rows' chunk (to_next_group is
 * the step from a column of these rows to the same place in the next eight's chunk): the lines
 * read next, where past c1 lie the next row's start, already being read by this pass, or the
 * row's next chunk, not read until every row has passed. On a Zen 4 (into L2), one thread,
 * medians of 21-41 interleaved calls against reading past c1: 1 x 2048 x 16384 float32 (rows of
 * 8 KiB, where the next rows' first KiB is 1/8 of B) 1.04-1.08x faster in three runs, float64
 * 0.98-1.05x, 1 x 4096 x 4096 and 1 x 8192 x 8192 0.98-1.04x. */
#define GEMV_READ_EIGHT_AHEAD(j, c1, to_next_group, locality)                                                          \
    do {                                                                                                               \
        int64_t ahead = (j) + GEMV_AHEAD / (int64_t)sizeof(real);                                                      \
        if (ahead >= (c1)) ahead += (to_next_group);                                                                   \
        __builtin_prefetch(b0 + ahead, 0, locality), __builtin_prefetch(b1 + ahead, 0, locality);                      \
        __builtin_prefetch(b2 + ahead, 0, locality), __builtin_prefetch(b3 + ahead, 0, locality);                      \
        __builtin_prefetch(b4 + ahead, 0, locality), __builtin_prefetch(b5 + ahead, 0, locality);                      \
        __builtin_prefetch(b6 + ahead, 0, locality), __builtin_prefetch(b7 + ahead, 0, locality);                      \
    } while (0)

/* How `parts` threads running a GEMV over `b_bytes` of B read it ahead (GEMV_AHEAD's comment
 * says what was measured); forced, a CPU with no measured choice reads into L1. */
static enum gemv_ahead gemv_read_ahead(int64_t parts, double b_bytes, int forced) {
    const int zen4 = packed_is_zen4();
    if (forced) return zen4 ? GEMV_AHEAD_INTO_L2 : GEMV_AHEAD_INTO_L1;
    if (b_bytes <= packed_cache_sizes().l3 / 2) return GEMV_AHEAD_NONE;
    if (zen4) return GEMV_AHEAD_INTO_L2;
    return parts == 1 && packed_is_zen5_or_later() ? GEMV_AHEAD_INTO_L1 : GEMV_AHEAD_NONE;
}

/* y[l] for l in [from, to) gains rows p .. p+7 of B: its FMA chain in order over p. */
#define GEMV_ADD_EIGHT_ROWS(from, to)                                                                                  \
    _Pragma("omp simd") for (int64_t l = (from); l < (to); ++l) y[l] =                                                 \
        (((((((y[l] + a0 * b0[l]) + a1 * b1[l]) + a2 * b2[l]) + a3 * b3[l]) + a4 * b4[l]) + a5 * b5[l]) +              \
         a6 * b6[l]) +                                                                                                 \
        a7 * b7[l]

/* y[j0:j1] = a @ B[:, j0:j1]. Eight rows of B per pass over the chunk: y is loaded and stored
 * once per eight FMAs, and the eight rows (N apart, so eight separate streams from memory)
 * are in flight at once, which is what keeps a single core's memory traffic up (1 x 8192 x
 * 8192 float32, one thread, medians of 11 interleaved: 17% faster than four rows; float64
 * 1 x 4096 x 4096: 13%). Each y[j] is the FMA chain over p in order whatever the chunk, the
 * thread or the reading ahead, so the result does not depend on how N is cut. */
static void row_times_matrix(const real *restrict a, const real *restrict B, real *restrict y, int64_t N, int64_t K,
                             int64_t j0, int64_t j1, enum gemv_ahead read_ahead) {
    for (int64_t c0 = j0; c0 < j1; c0 += GEMV_CHUNK) {
        const int64_t c1 = min_i64(c0 + GEMV_CHUNK, j1);
        /* past the chunk's end, read the next eight rows' start ahead instead */
        const int64_t to_next_group = GEMV_ROWS * N - (c1 - c0);
        for (int64_t j = c0; j < c1; ++j) y[j] = 0;
        int64_t p = 0;
        for (; p + GEMV_ROWS <= K; p += GEMV_ROWS) {
            const real a0 = a[p], a1 = a[p + 1], a2 = a[p + 2], a3 = a[p + 3];
            const real a4 = a[p + 4], a5 = a[p + 5], a6 = a[p + 6], a7 = a[p + 7];
            const real *restrict b0 = B + p * N, *restrict b1 = b0 + N, *restrict b2 = b1 + N, *restrict b3 = b2 + N;
            const real *restrict b4 = b3 + N, *restrict b5 = b4 + N, *restrict b6 = b5 + N, *restrict b7 = b6 + N;
            int64_t j = c0;
            /* a line of each row at a time, each row read ahead once per line */
            if (read_ahead == GEMV_AHEAD_INTO_L1)
                for (; j + GEMV_LINE <= c1; j += GEMV_LINE) {
                    GEMV_READ_EIGHT_AHEAD(j, c1, to_next_group, 3);
                    GEMV_ADD_EIGHT_ROWS(j, j + GEMV_LINE);
                }
            else if (read_ahead == GEMV_AHEAD_INTO_L2)
                for (; j + GEMV_LINE <= c1; j += GEMV_LINE) {
                    GEMV_READ_EIGHT_AHEAD(j, c1, to_next_group, 2);
                    GEMV_ADD_EIGHT_ROWS(j, j + GEMV_LINE);
                }
            GEMV_ADD_EIGHT_ROWS(j, c1);
        }
        for (; p < K; ++p) {
            const real ap = a[p];
            const real *restrict bp = B + p * N;
#pragma omp simd
            for (int64_t j = c0; j < c1; ++j) y[j] = y[j] + ap * bp[j];
        }
    }
}
#undef GEMV_ADD_EIGHT_ROWS
#undef GEMV_READ_EIGHT_AHEAD

/* ---- N = 1: y = A b, a dot product per row ------------------------------------------------ */

/* The SIMD width this file is compiled for: the dot products below keep one vector of partial
 * sums per row, eight rows, so a vector wider than the registers would only spill. */
#if defined(__AVX512F__)
#define DOT_VEC_BYTES 64
#elif defined(__AVX__)
#define DOT_VEC_BYTES 32
#else
#define DOT_VEC_BYTES 16
#endif
typedef real dot_vec __attribute__((vector_size(DOT_VEC_BYTES), aligned(sizeof(real)), may_alias));
enum { DOT_ROWS = 8, DOT_VEC = DOT_VEC_BYTES / sizeof(real), DOT_LINE = 64 / sizeof(real), DOT_AHEAD = 1024 };

/* y[0:8] = rows[0:8] @ b, the eight rows K apart from `r0`, one 64-byte line of each row per
 * step. Each row's sum is DOT_VEC partial sums, one per lane, over the whole lines of K, then
 * those lanes in order, then the last K % DOT_LINE products: an order fixed by the code (and
 * the SIMD width), whatever the thread or the reading ahead. With `read_ahead` (a constant in
 * each inlined copy) each row's line DOT_AHEAD bytes on is read into L2 (prefetcht1): a row is
 * 8 pages of 4 KiB at K = 4096 float64, and the hardware's prefetcher starts again cold at
 * every page, in all eight rows at once. */
static inline __attribute__((always_inline)) void eight_dots(const real *restrict r0, int64_t K, const real *restrict b,
                                                             real *restrict y, const int read_ahead) {
    const real *restrict r1 = r0 + K, *restrict r2 = r1 + K, *restrict r3 = r2 + K, *restrict r4 = r3 + K;
    const real *restrict r5 = r4 + K, *restrict r6 = r5 + K, *restrict r7 = r6 + K;
    const int64_t ahead = DOT_AHEAD / (int64_t)sizeof(real);
    dot_vec v0 = {0}, v1 = {0}, v2 = {0}, v3 = {0}, v4 = {0}, v5 = {0}, v6 = {0}, v7 = {0};
    int64_t p = 0;
    for (; p + DOT_LINE <= K; p += DOT_LINE) {
        if (read_ahead) {
            /* past the row's end, the next eight rows' start (7 K on: row r + 8, not r + 1,
             * which this step already reads): on a Zen 4, one thread, medians of 21
             * interleaved calls, 16384 x 1 x 2048 float32 (rows of 8 KiB) 1.13x faster than
             * reading past the row's end, 4096 x 1 x 4096 1.08x, float64 and 8192 x 1 x 8192
             * 1.03-1.05x */
            const int64_t at = p + ahead < K ? p + ahead : p + ahead + 7 * K;
            __builtin_prefetch(r0 + at, 0, 2), __builtin_prefetch(r1 + at, 0, 2);
            __builtin_prefetch(r2 + at, 0, 2), __builtin_prefetch(r3 + at, 0, 2);
            __builtin_prefetch(r4 + at, 0, 2), __builtin_prefetch(r5 + at, 0, 2);
            __builtin_prefetch(r6 + at, 0, 2), __builtin_prefetch(r7 + at, 0, 2);
        }
        for (int64_t q = p; q < p + DOT_LINE; q += DOT_VEC) {
            const dot_vec bq = *(const dot_vec *)(b + q);
            v0 += *(const dot_vec *)(r0 + q) * bq, v1 += *(const dot_vec *)(r1 + q) * bq;
            v2 += *(const dot_vec *)(r2 + q) * bq, v3 += *(const dot_vec *)(r3 + q) * bq;
            v4 += *(const dot_vec *)(r4 + q) * bq, v5 += *(const dot_vec *)(r5 + q) * bq;
            v6 += *(const dot_vec *)(r6 + q) * bq, v7 += *(const dot_vec *)(r7 + q) * bq;
        }
    }
    real s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (int l = 0; l < DOT_VEC; ++l) {
        s0 += v0[l], s1 += v1[l], s2 += v2[l], s3 += v3[l];
        s4 += v4[l], s5 += v5[l], s6 += v6[l], s7 += v7[l];
    }
    for (; p < K; ++p) {
        const real bp = b[p];
        s0 += r0[p] * bp, s1 += r1[p] * bp, s2 += r2[p] * bp, s3 += r3[p] * bp;
        s4 += r4[p] * bp, s5 += r5[p] * bp, s6 += r6[p] * bp, s7 += r7[p] * bp;
    }
    y[0] = s0, y[1] = s1, y[2] = s2, y[3] = s3, y[4] = s4, y[5] = s5, y[6] = s6, y[7] = s7;
}

/* Whether the N = 1 path reads A ahead (into L2): on a Zen 4, where A is past half of L3, on
 * one thread or two. One thread, medians of 15 interleaved calls against the loop before (an
 * `omp simd` reduction, not reading ahead): 4096 x 1 x 4096 and 8192 x 1 x 8192 1.07-1.16x
 * faster, float32 and float64, 2048 x 1 x 2048 float64 (32 MiB) 1.10-1.14x; in L2 or L3
 * reading ahead cost 1.07-1.15x, and into L1 1.25-1.32x; not reading ahead, these lines were
 * 0.97-1.05x that loop. Two threads: three blas-grid runs each way moved with the host's
 * memory, no worse. Forced (the vector_read_ahead path), on any CPU. Other CPUs do not (not
 * measured). */
static int dot_read_ahead(double a_bytes, int forced) {
    return forced || (packed_is_zen4() && a_bytes > (double)packed_cache_sizes().l3 / 2);
}

/* y[i0:i1] = A[i0:i1, :] @ b, a dot product per row: eight rows at a time, eight streams from
 * memory in flight as in row_times_matrix (4096 x 1 x 4096, one thread, medians of 21
 * interleaved: 9% faster than four rows, float64 10%). Every group of eight starts at a
 * multiple of eight, so a row is summed by the same code whichever thread takes it; the rows
 * past the last eight are summed as a lone row would be. */
static void matrix_times_column(const real *restrict A, const real *restrict b, real *restrict y, int64_t K, int64_t i0,
                                int64_t i1, int read_ahead) {
    int64_t i = i0;
    if (read_ahead)
        for (; i + DOT_ROWS <= i1; i += DOT_ROWS) eight_dots(A + i * K, K, b, y + i, 1);
    else
        for (; i + DOT_ROWS <= i1; i += DOT_ROWS) eight_dots(A + i * K, K, b, y + i, 0);
    for (; i < i1; ++i) {
        const real *restrict row = A + i * K;
        real s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t p = 0; p < K; ++p) s += row[p] * b[p];
        y[i] = s;
    }
}

/* ---- 2 <= N <= 8: dot products against B's few columns ------------------------------------ */

/* Up to DOTS_MAX_N columns of B, C = A B can take a dot product per element, SIMD along K as
 * the N = 1 path does, against B's columns copied into rows first (n x K, small). The loop nest
 * packs all of A to use each value of it n times, and runs tiles 16 or 32 columns wide for n
 * of them; the direct path the same tiles, unpacked, a vector of n <= 16 columns wasting the
 * rest of its lanes (dots_pay says when the dot products win). */
enum { DOTS_MAX_N = 8, DOTS_MIN_K_PER_COLUMN = 8 };
/* The accumulators the dot products keep in registers, rows x n vectors: 24 of AVX-512's 32,
 * 12 of AVX2's 16 (the rest hold a vector of each row of A and one of B). */
enum { DOTS_ACCUMULATORS = DOT_VEC_BYTES == 64 ? 24 : 12, DOTS_MAX_ROWS = 8 };

/* The sum of a vector's lanes as a tree, halves first (lane l + lane l + DOT_VEC / 2, ...): a
 * few vector operations where lane after lane took DOT_VEC - 1 dependent additions, the last
 * step of every dot product below (at K = 256, about as long as the products themselves). */
static inline __attribute__((always_inline)) real lanes_sum(dot_vec v) {
#if defined(__AVX512F__) && defined(MATMUL_REAL_DOUBLE)
    return _mm512_reduce_add_pd((__m512d)v);
#elif defined(__AVX512F__)
    return _mm512_reduce_add_ps((__m512)v);
#else
    real t[DOT_VEC];
    memcpy(t, &v, sizeof t);
    for (int w = DOT_VEC / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; ++l) t[l] += t[l + w];
    return t[0];
#endif
}

/* c[r * ldc + j] = row r of a (rows rows, K apart) . row j of bt (n rows, K apart), for r < rows
 * and j < n: each sum DOT_VEC partial sums over the whole vectors of K, then those lanes'
 * sum (lanes_sum), then the last K % DOT_VEC products, whatever `rows` (so a row's bits are its
 * own, however the rows are grouped or cut between threads). `rows` and `n` are constants wherever
 * this is inlined, so the loops unroll and the accumulators are registers. */
static inline __attribute__((always_inline)) void rows_dot_columns(const int rows, const int n, const real *restrict a,
                                                                   int64_t K, const real *restrict bt, real *restrict c,
                                                                   int64_t ldc) {
    dot_vec acc[DOTS_MAX_ROWS][DOTS_MAX_N];
#pragma GCC unroll 8
    for (int r = 0; r < rows; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < n; ++j) acc[r][j] = (dot_vec){0};
    int64_t p = 0;
    for (; p + DOT_VEC <= K; p += DOT_VEC) {
        dot_vec ar[DOTS_MAX_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < rows; ++r) ar[r] = *(const dot_vec *)(a + r * K + p);
#pragma GCC unroll 8
        for (int j = 0; j < n; ++j) {
            const dot_vec bj = *(const dot_vec *)(bt + j * K + p);
#pragma GCC unroll 8
            for (int r = 0; r < rows; ++r) acc[r][j] += ar[r] * bj;
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < n; ++j) {
            real s = lanes_sum(acc[r][j]);
            for (int64_t q = p; q < K; ++q) s += a[r * K + q] * bt[j * K + q];
            c[r * ldc + j] = s;
        }
}

/* C[i0:i1, :] = A[i0:i1, :] @ B for n columns (B's columns as the rows of bt): as many rows at
 * a time as the accumulators allow, then the rest one by one. */
static inline __attribute__((always_inline)) void dots_rows(const int n, const real *restrict A,
                                                            const real *restrict bt, real *restrict C, int64_t K,
                                                            int64_t i0, int64_t i1) {
    const int rows = DOTS_ACCUMULATORS / n < DOTS_MAX_ROWS ? DOTS_ACCUMULATORS / n : DOTS_MAX_ROWS;
    int64_t i = i0;
    for (; i + rows <= i1; i += rows) rows_dot_columns(rows, n, A + i * K, K, bt, C + i * n, n);
    for (; i < i1; ++i) rows_dot_columns(1, n, A + i * K, K, bt, C + i * n, n);
}

static void matrix_times_columns(const real *restrict A, const real *restrict bt, real *restrict C, int64_t N,
                                 int64_t K, int64_t i0, int64_t i1) {
    switch (N) { /* a constant n in each copy */
    case 2: dots_rows(2, A, bt, C, K, i0, i1); break;
    case 3: dots_rows(3, A, bt, C, K, i0, i1); break;
    case 4: dots_rows(4, A, bt, C, K, i0, i1); break;
    case 5: dots_rows(5, A, bt, C, K, i0, i1); break;
    case 6: dots_rows(6, A, bt, C, K, i0, i1); break;
    case 7: dots_rows(7, A, bt, C, K, i0, i1); break;
    case 8: dots_rows(8, A, bt, C, K, i0, i1); break;
    }
}

/* Whether 2 <= N <= DOTS_MAX_N takes the dot products (matrix_times_columns) rather than the
 * tiles of `kernel` (the direct path's where `direct`, else the loop nest's). Only where this
 * file's vectors are as wide as the tiles' (a build for plain x86-64 would run them 16 bytes
 * wide beside AVX-512 tiles), and where K repays each dot product's final sum of lanes: against
 * the loop nest, which also packs A, from K = 8 n; against the direct tiles, which use n of a
 * vector's V lanes, from K (V - n) = 8 n V (never at n = V). One thread on a Zen 4, medians of
 * 7 calls against the direct tiles, M = 300 and 4096, n = 2, 4, 8, K = 32 .. 256: where this
 * holds, 0.99-5.4x as fast (the least float64 n = 4 at K = 64); left to the tiles, float64
 * n = 8 (0.66-0.90x), float32 n = 8 at K = 32 (0.94-0.96x) and at K = 64 (1.2x), float32 n = 4 at
 * K = 32 (1.5x). Against the loop nest, n = 8 at K = 32: 1.2-1.3x. */
static int dots_pay(const struct packed_kernel *kernel, int64_t N, int64_t K, int direct) {
    if (N < 2 || N > DOTS_MAX_N || 2 * DOT_VEC_BYTES < kernel->nr * (int64_t)sizeof(real)) return 0;
    if (!direct) return K >= DOTS_MIN_K_PER_COLUMN * N;
    return N < DOT_VEC && K * (DOT_VEC - N) >= DOTS_MIN_K_PER_COLUMN * N * DOT_VEC;
}

struct vector_job {
    const real *A, *B;
    real *C;
    const real *bt;                /* 2 <= N <= DOTS_MAX_N: B's columns as rows (matrix_times_columns) */
    int64_t M, N, K, parts, group; /* parts cut the output at multiples of `group` elements */
    enum gemv_ahead read_ahead;    /* M = 1: how B is read ahead by hand (row_times_matrix) */
    int dot_read_ahead;            /* N = 1: whether A is read ahead (matrix_times_column) */
};

static void vector_task(void *context, int64_t part) {
    const struct vector_job *job = context;
    const int64_t length = job->M == 1 ? job->N : job->M;
    const int64_t groups = (length + job->group - 1) / job->group;
    const int64_t first = min_i64(length, groups * part / job->parts * job->group);
    const int64_t last = min_i64(length, groups * (part + 1) / job->parts * job->group);
    if (job->M == 1)
        row_times_matrix(job->A, job->B, job->C, job->N, job->K, first, last, job->read_ahead);
    else if (job->N == 1)
        matrix_times_column(job->A, job->B, job->C, job->K, first, last, job->dot_read_ahead);
    else
        matrix_times_columns(job->A, job->bt, job->C, job->N, job->K, first, last);
}

/* ---- packing ------------------------------------------------------------------------------- */

/* A[i0 : i0+mc, p0 : p0+kc] into ceil(mc / MR) micro-panels of MR x kc, each p-major (the
 * MR values of one column together, the order the kernel broadcasts them), rows past the
 * matrix's edge zero. Element by element; a kernel may bring its own (packed_kernel.pack_a:
 * packed_avx512.c transposes blocks in registers). */
static void pack_a(const real *A, int64_t K, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int64_t mr,
                   real *restrict out) {
    for (int64_t ir = 0; ir < mc; ir += mr) {
        const int64_t rows = min_i64(mr, mc - ir);
        const real *src = A + (i0 + ir) * K + p0;
        for (int64_t p = 0; p < kc; ++p) {
            int64_t i = 0;
            for (; i < rows; ++i) out[i] = src[i * K + p];
            for (; i < mr; ++i) out[i] = 0;
            out += mr;
        }
    }
}

/* B[p0 : p0+kc, j0 : j0+nc] into ceil(nc / NR) slivers of kc x NR, each p-major (one row of
 * NR values after another, the order the kernel loads them), columns past the edge zero.
 * Along the rows of B, so B is read with unit stride (a sliver-by-sliver walk would read one
 * short piece per row, each on a new page); each row segment is scattered over the slivers.
 * Eight rows at a time, piece by piece: the rows are N apart, so each is its own stream from
 * memory, and with one row at a time every row waits for its first lines to arrive; eight
 * in flight keep the memory system busy. 64 x 4096 x 4096 float64, one thread, medians of 11
 * interleaved: 13% faster than one row at a time, 16 x 4096 x 4096 26% (16 rows: no better).
 * Each row is also read ahead by hand, PACK_B_AHEAD bytes past the sliver being copied: the
 * hardware's prefetcher follows a stream only within a 4 KiB page, and a row piece of a panel
 * is a page or less, so each one started cold (on a Zen 5, one thread, interleaved: 64 x 4096
 * x 4096 1.02x faster in float64 and 1.04x in float32, 2048^3 float32 1.01x; 256 to 1024
 * bytes ahead alike; the small-M panels below gain more). On a Zen 4 reading into L2
 * (prefetcht1) rather than L1 won, as it did for the GEMV (GEMV_AHEAD), from 1 KiB ahead:
 * medians of 11 interleaved calls against reading into L1 from 512 bytes (two or three runs),
 * one thread: 8 x 4096 x 4096 1.11-1.19x faster, 16 x 4096 x 4096 1.04-1.09x, 64 x 4096 x 4096
 * 1.02-1.06x, 1023 x 1025 x 1027, 256^3, 2048^3 and 4096 x 4096 x 64 0.99-1.02x; two threads:
 * 8 x 4096 x 4096 1.06-1.33x, 16 x 4096 x 4096 1.05-1.22x, 64 x 4096 x 4096 1.02-1.07x, 2048^3
 * 1.00-1.03x. 512 bytes ahead into L2 did about as well. */
enum { PACK_B_ROWS = 8, PACK_B_AHEAD = 512, PACK_B_AHEAD_INTO_L2 = 1024 };

static inline __attribute__((always_inline)) void pack_b_row_group(const real *src, int64_t N, int64_t nc, int64_t kc,
                                                                   const int64_t nr, const int rows, const int into_l2,
                                                                   real *restrict dst) {
    int64_t jr = 0;
    for (; jr + nr <= nc; jr += nr, src += nr, dst += kc * nr)
        for (int r = 0; r < rows; ++r) {
            const char *row = (const char *)(src + r * N);
            for (int64_t byte = 0; byte < nr * (int64_t)sizeof(real); byte += 64)
                if (into_l2)
                    __builtin_prefetch(row + PACK_B_AHEAD_INTO_L2 + byte, 0, 2);
                else
                    __builtin_prefetch(row + PACK_B_AHEAD + byte, 0, 3);
            memcpy(dst + r * nr, src + r * N, (size_t)nr * sizeof(real));
        }
    if (jr < nc) {
        const int64_t used = nc - jr;
        for (int r = 0; r < rows; ++r) {
            memcpy(dst + r * nr, src + r * N, (size_t)used * sizeof(real));
            for (int64_t j = used; j < nr; ++j) dst[r * nr + j] = 0;
        }
    }
}

static inline __attribute__((always_inline)) void pack_b_rows(const real *B, int64_t N, int64_t j0, int64_t nc,
                                                              int64_t p0, int64_t kc, const int64_t nr,
                                                              const int into_l2, real *restrict out) {
    int64_t p = 0;
    for (; p + PACK_B_ROWS <= kc; p += PACK_B_ROWS)
        pack_b_row_group(B + (p0 + p) * N + j0, N, nc, kc, nr, PACK_B_ROWS, into_l2, out + p * nr);
    for (; p < kc; ++p) pack_b_row_group(B + (p0 + p) * N + j0, N, nc, kc, nr, 1, into_l2, out + p * nr);
}

/* NR is one of a few sizes (the kernels' widths): with it a constant, each sliver row's copy
 * is a couple of vector moves, not a call to memcpy; a small-M problem spends most of its
 * time here, streaming B. */
static inline __attribute__((always_inline)) void pack_b_width(const real *B, int64_t N, int64_t j0, int64_t nc,
                                                               int64_t p0, int64_t kc, int64_t nr, const int into_l2,
                                                               real *restrict out) {
    switch (nr * (int64_t)sizeof(real)) {
    case 128: pack_b_rows(B, N, j0, nc, p0, kc, 128 / sizeof(real), into_l2, out); break;
    case 64: pack_b_rows(B, N, j0, nc, p0, kc, 64 / sizeof(real), into_l2, out); break;
    case 32: pack_b_rows(B, N, j0, nc, p0, kc, 32 / sizeof(real), into_l2, out); break;
    default: pack_b_rows(B, N, j0, nc, p0, kc, nr, into_l2, out);
    }
}

/* Where the rows are read ahead into is a constant in each copy of the loops (a branch on it
 * per line cost 2-4% at 8 x 4096 x 4096). */
static void pack_b(const real *B, int64_t N, int64_t j0, int64_t nc, int64_t p0, int64_t kc, int64_t nr,
                   real *restrict out) {
    if (packed_is_zen4())
        pack_b_width(B, N, j0, nc, p0, kc, nr, 1, out);
    else
        pack_b_width(B, N, j0, nc, p0, kc, nr, 0, out);
}

/* ---- cutting C into one block per thread -------------------------------------------------- */

/* C as a grid of tm x tn blocks, cut at whole MR x NR micro-tiles, one block per part. */
struct tile_grid {
    int64_t M, N, mr, nr;
    int64_t units_m, units_n; /* micro-tiles along M and N */
    int64_t tm, tn;           /* blocks along M and N */
};

/* Choose tm x tn blocks (tm * tn <= threads): fewest tiles on the busiest thread first (load
 * balance), then the squarest blocks, which pack the least: a thread packs (its rows + its
 * columns) x K. */
static struct tile_grid make_grid(int64_t M, int64_t N, int64_t mr, int64_t nr, int64_t threads, double fmas) {
    struct tile_grid g = {M, N, mr, nr, (M + mr - 1) / mr, (N + nr - 1) / nr, 1, 1};
    threads = pool_threads_for(threads, fmas, g.units_m * g.units_n);
    int64_t best_load = g.units_m * g.units_n, best_edge = g.units_m * mr + g.units_n * nr;
    for (int64_t tm = 1; tm <= threads && tm <= g.units_m; ++tm) {
        const int64_t tn = min_i64(threads / tm, g.units_n);
        const int64_t rows = (g.units_m + tm - 1) / tm, cols = (g.units_n + tn - 1) / tn;
        const int64_t load = rows * cols, edge = rows * mr + cols * nr;
        if (load < best_load || (load == best_load && edge < best_edge)) {
            g.tm = tm, g.tn = tn, best_load = load, best_edge = edge;
        }
    }
    return g;
}

/* The rows [m0, m1) and columns [n0, n1) of C that block `part` covers: only the last block
 * of a row or column of blocks has edge tiles. */
static void grid_block(const struct tile_grid *g, int64_t part, int64_t *m0, int64_t *m1, int64_t *n0, int64_t *n1) {
    const int64_t bm = part / g->tn, bn = part % g->tn;
    *m0 = min_i64(g->M, g->units_m * bm / g->tm * g->mr);
    *m1 = min_i64(g->M, g->units_m * (bm + 1) / g->tm * g->mr);
    *n0 = min_i64(g->N, g->units_n * bn / g->tn * g->nr);
    *n1 = min_i64(g->N, g->units_n * (bn + 1) / g->tn * g->nr);
}

/* ---- small B: the direct nest, no packing ------------------------------------------------- */

struct direct_job {
    const real *A, *B;
    real *C;
    int64_t K;
    const struct packed_kernel *kernel;
    struct tile_grid grid;
};

/* One block of C, row strip by row strip, each strip left to right: the MR rows of A being
 * used stay in L1, B (small enough, by the path's condition) stays in L2, and C is written
 * row-contiguously, a whole strip at a time, which is what makes small-K problems (where
 * writing C is most of the work) fast. */
static void direct_task(void *context, int64_t part) {
    const struct direct_job *job = context;
    const struct packed_kernel *kernel = job->kernel;
    const int64_t N = job->grid.N, K = job->K;
    int64_t m0, m1, n0, n1;
    grid_block(&job->grid, part, &m0, &m1, &n0, &n1);
    for (int64_t ir = m0; ir < m1; ir += kernel->mr)
        for (int64_t jr = n0; jr < n1; jr += kernel->nr)
            kernel->direct(K, job->A + ir * K, K, job->B + jr, N, job->C + ir * N + jr, N, min_i64(kernel->mr, m1 - ir),
                           min_i64(kernel->nr, n1 - jr));
}

static int direct_nest(const real *A, const real *B, real *C, int64_t M, int64_t N, int64_t K, int64_t threads,
                       const struct packed_kernel *kernel) {
    struct direct_job job = {
        A, B, C, K, kernel, make_grid(M, N, kernel->mr, kernel->nr, threads, (double)M * (double)N * (double)K)};
    pool_run(job.grid.tm * job.grid.tn, direct_task, &job);
    return PACKED_OK;
}

/* ---- the loop nest, on one block of C ------------------------------------------------------ */

/* The B panels of one column of the grid's blocks, packed together by its tm parts (below). */
struct shared_panels {
    real *buffer[2];           /* panel s is packed into buffer[s % 2] */
    int64_t *claimed, *packed; /* per panel: its chunks claimed, and packed, so far */
    int64_t released[2];       /* per buffer: parts done with a panel in it, over all its panels */
};

struct nest_job {
    const real *A, *B;
    real *C;
    int64_t M, N, K;
    const struct packed_kernel *kernel;
    struct blocking blk;
    struct tile_grid grid;
    int rows_first;          /* small K: finish C row strip by row strip (see loop_nest) */
    size_t a_bytes, b_bytes; /* pack buffer sizes of one part */
    int failed;              /* set by a part whose buffers could not be allocated */
    /* Set when the parts run together and share B's panels: one per column of blocks, and
     * each part's A buffer (a_step bytes apart), all in the calling thread's scratch. */
    struct shared_panels *shared;
    char *a_buffers;
    size_t a_step;
};

/* Where the grid cuts C along M (tm > 1), the tm parts of a column of blocks need the same B
 * panels in the same order: rather than each packing all of them, they pack each panel once,
 * together (two threads of a Zen 5, against each packing its own, paired runs: float32
 * 1.04x at 1023 x 1025 x 1027, 1.02x at 2048^3, 1.00x at 512^3 and 1024^3, float64 1.00-1.02x),
 * each claiming chunks of SHARED_CHUNK_SLIVERS slivers until none is left, into one of two
 * buffers. A part uses panel s once it is whole, and packs into its buffer only once every
 * part of the column is done with panel s - 2, the buffer's previous panel. So a part may wait
 * for another: the parts must run at once, which pool_run_together promises. */
enum { SHARED_CHUNK_SLIVERS = 4 };

static const real *shared_panel(const struct nest_job *job, struct shared_panels *shared, int64_t s, int64_t jc,
                                int64_t nc, int64_t pc, int64_t kc) {
    const int64_t nr = job->blk.nr, chunk_cols = SHARED_CHUNK_SLIVERS * nr;
    const int64_t chunks = (nc + chunk_cols - 1) / chunk_cols;
    real *panel = shared->buffer[s % 2];
    pool_wait_at_least(&shared->released[s % 2], job->grid.tm * (s / 2));
    for (;;) {
        const int64_t chunk = __atomic_fetch_add(&shared->claimed[s], 1, __ATOMIC_RELAXED);
        if (chunk >= chunks) break;
        const int64_t j = chunk * chunk_cols; /* sliver j / nr starts at panel + j * kc */
        pack_b(job->B, job->N, jc + j, min_i64(chunk_cols, nc - j), pc, kc, nr, panel + j * kc);
        __atomic_fetch_add(&shared->packed[s], 1, __ATOMIC_RELEASE);
    }
    pool_wait_at_least(&shared->packed[s], chunks);
    return panel;
}

static void run_block(const struct nest_job *job, struct shared_panels *shared, int64_t m0, int64_t m1, int64_t n0,
                      int64_t n1, real *a_pack, real *own_b_pack) {
    const struct blocking b = job->blk;
    int64_t s = 0; /* the panel's number, in the order every part of the column takes them */
    for (int64_t jc = n0; jc < n1; jc += b.nc) {
        const int64_t nc = min_i64(b.nc, n1 - jc);
        for (int64_t pc = 0; pc < job->K; pc += b.kc, ++s) {
            const int64_t kc = min_i64(b.kc, job->K - pc);
            /* The first KC piece writes C, the rest add to it: C is never read uninitialised
             * and never needs zeroing. */
            const int accumulate = pc > 0;
            const real *b_pack = own_b_pack;
            if (shared)
                b_pack = shared_panel(job, shared, s, jc, nc, pc, kc);
            else
                pack_b(job->B, job->N, jc, nc, pc, kc, b.nr, own_b_pack);
            for (int64_t ic = m0; ic < m1; ic += b.mc) {
                const int64_t mc = min_i64(b.mc, m1 - ic);
                if (job->kernel->pack_a)
                    job->kernel->pack_a(job->A, job->K, ic, mc, pc, kc, a_pack);
                else
                    pack_a(job->A, job->K, ic, mc, pc, kc, b.mr, a_pack);
                if (job->rows_first) {
                    for (int64_t ir = 0; ir < mc; ir += b.mr)
                        for (int64_t jr = 0; jr < nc; jr += b.nr)
                            job->kernel->run(kc, a_pack + ir * kc, b_pack + jr * kc,
                                             job->C + (ic + ir) * job->N + jc + jr, job->N, min_i64(b.mr, mc - ir),
                                             min_i64(b.nr, nc - jr), accumulate);
                    continue;
                }
                for (int64_t jr = 0; jr < nc; jr += b.nr) {
                    const real *sliver = b_pack + jr * kc;
                    const int64_t n = min_i64(b.nr, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += b.mr) {
                        real *c_tile = job->C + (ic + ir) * job->N + jc + jr;
                        job->kernel->run(kc, a_pack + ir * kc, sliver, c_tile, job->N, min_i64(b.mr, mc - ir), n,
                                         accumulate);
                    }
                }
            }
            if (shared) __atomic_fetch_add(&shared->released[s % 2], 1, __ATOMIC_RELEASE);
        }
    }
}

static void nest_task(void *context, int64_t part) {
    struct nest_job *job = context;
    int64_t m0, m1, n0, n1;
    grid_block(&job->grid, part, &m0, &m1, &n0, &n1);
    if (job->shared) {
        run_block(job, &job->shared[part % job->grid.tn], m0, m1, n0, n1,
                  (real *)(job->a_buffers + (size_t)part * job->a_step), NULL);
        return;
    }
    char *buffers = pool_thread_buffer(job->a_step + job->b_bytes);
    if (!buffers) {
        __atomic_store_n(&job->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    run_block(job, NULL, m0, m1, n0, n1, (real *)buffers, (real *)(buffers + job->a_step));
}

/* Lays out, in the calling thread's scratch, what the parts need to share B's panels: per
 * column of blocks, two panel buffers and each panel's counters; then every part's A buffer
 * (a part must not take the scratch of the thread it runs on: the caller's holds all this).
 * Returns 0 if the scratch cannot be had. */
static int share_panels(struct nest_job *job, int64_t block_n) {
    const struct tile_grid *g = &job->grid;
    const int64_t parts = g->tm * g->tn;
    const int64_t panels = (block_n + job->blk.nc - 1) / job->blk.nc * ((job->K + job->blk.kc - 1) / job->blk.kc);
    const size_t column_bytes = (size_t)round_up((int64_t)sizeof(struct shared_panels), PACK_ALIGNMENT) +
                                (size_t)round_up(2 * panels * (int64_t)sizeof(int64_t), PACK_ALIGNMENT) +
                                2 * (size_t)round_up((int64_t)job->b_bytes, PACK_ALIGNMENT);
    char *scratch = pool_thread_buffer((size_t)g->tn * column_bytes + (size_t)parts * job->a_step);
    if (!scratch) return 0;
    job->shared = (struct shared_panels *)scratch;
    char *next = scratch + round_up(g->tn * (int64_t)sizeof(struct shared_panels), PACK_ALIGNMENT);
    for (int64_t column = 0; column < g->tn; ++column) {
        struct shared_panels *shared = &job->shared[column];
        shared->claimed = (int64_t *)next;
        shared->packed = shared->claimed + panels;
        memset(shared->claimed, 0, 2 * (size_t)panels * sizeof(int64_t));
        next += round_up(2 * panels * (int64_t)sizeof(int64_t), PACK_ALIGNMENT);
        for (int i = 0; i < 2; ++i) {
            shared->buffer[i] = (real *)next;
            shared->released[i] = 0;
            next += round_up((int64_t)job->b_bytes, PACK_ALIGNMENT);
        }
    }
    job->a_buffers = next;
    return 1;
}

static int loop_nest(const real *A, const real *B, real *C, int64_t M, int64_t N, int64_t K, int64_t threads,
                     const struct packed_kernel *kernel) {
    struct nest_job job = {.A = A,
                           .B = B,
                           .C = C,
                           .M = M,
                           .N = N,
                           .K = K,
                           .kernel = kernel,
                           .blk = packed_blocking_for(kernel, sizeof(real)),
                           .grid = make_grid(M, N, kernel->mr, kernel->nr, threads, (double)M * (double)N * (double)K)};
    const struct tile_grid *g = &job.grid;
    const int64_t usual_nc = job.blk.nc; /* before the narrowing below */
    const int64_t block_m = (g->units_m + g->tm - 1) / g->tm * g->mr;
    const int64_t block_n = (g->units_n + g->tn - 1) / g->tn * g->nr;
    /* Small K: a C tile is written after only K steps of FMAs, so writing C is a large part
     * of the work. Then run each A block row strip by row strip (loops 1 and 2 swapped), so
     * that C is written contiguously along its rows, and size the B panel to stay in L2,
     * where every strip reads it back (python -m harness blas-grid measures the small-K shapes). */
    job.rows_first = K <= job.blk.kc / 2;
    /* Rows first, or one A block per thread (each B panel is used by that block alone): the
     * panel can be sized to stay in L2 (half of it, beside the A block) rather than L3. For one
     * A block some CPUs do better with panels of long rows (packed_setup.c's one_block_nc). */
    if (job.rows_first)
        job.blk.nc = job.blk.l2_nc;
    else if (block_m <= job.blk.mc)
        job.blk.nc = job.blk.one_block_nc;
    /* A longer KC where the CPU gains from it (packed_setup.c): by the shape alone, never the
     * thread count, for KC fixes the rounding. */
    if (K > job.blk.kc && M > job.blk.mc && !job.rows_first) job.blk.kc = job.blk.deep_kc;
    if (M <= STREAM_B_MAX_M) {
        /* A few rows of A: each element of B is used by so few FMAs that the pass over B is
         * the work. Pack B in panels of whole rows, up to the usual NC (each row of B read in
         * one long stream rather than in L2-sized pieces, each a new stream for the
         * prefetcher), with KC shortened to what would keep a whole-row panel in half of L2
         * (down to STREAM_B_MIN_KC). The panel then lives in L3 when the rows are long, and
         * still that wins. On a Zen 5, float64, this with B read ahead (pack_b_row_group) took
         * 2, 4, 8 and 16 x 4096 x 4096 from 0.90-0.97x NumPy's speed to 1.06-1.16x on one
         * thread (0.99-1.15x to 1.11-1.25x on two); KC = 64 or 256 did no better, 384 worse.
         * It wins up to STREAM_B_MAX_M rows and loses beyond (the small-M shapes of blas-grid).
         * KC depends on the shape here, never on the thread count. */
        const int64_t es = (int64_t)sizeof(real), half_l2 = packed_cache_sizes().l2 / 2;
        const int64_t floor_kc = min_i64(job.blk.kc, STREAM_B_MIN_KC);
        job.blk.kc = max_i64(floor_kc, min_i64(job.blk.kc, half_l2 / (N * es) / 8 * 8));
        job.blk.nc = min_i64(round_up(N, job.blk.nr), usual_nc);
    }
    /* K in equal KC pieces (a multiple of 8 each, no longer than KC): a last piece of a few k
     * would cost a whole pass over C (K = 1027 with KC = 512: 512 + 512 + 3). */
    const int64_t pieces = (K + job.blk.kc - 1) / job.blk.kc;
    job.blk.kc = round_up((K + pieces - 1) / pieces, 8);
    job.a_bytes = (size_t)(round_up(min_i64(job.blk.mc, block_m), job.blk.mr) * job.blk.kc) * sizeof(real);
    job.b_bytes = (size_t)(round_up(min_i64(job.blk.nc, block_n), job.blk.nr) * job.blk.kc) * sizeof(real);
    job.a_step = (size_t)round_up((int64_t)job.a_bytes, PACK_ALIGNMENT);
    /* Rows first (small K), B is small next to C, and the parts, which would wait for each
     * other at every panel, are better left to run apart (4096 x 4096 x 64 float64 on two
     * threads: 0.7x NumPy's speed sharing, with the fresh C's page faults in between). */
    if (g->tm > 1 && !job.rows_first) {
        if (!share_panels(&job, block_n)) return PACKED_ERR_MEMORY;
        if (pool_run_together(g->tm * g->tn, nest_task, &job)) return PACKED_OK;
        job.shared = NULL; /* the pool is busy or short of workers: each part packs its own B */
    }
    pool_run(g->tm * g->tn, nest_task, &job);
    return job.failed ? PACKED_ERR_MEMORY : PACKED_OK;
}

/* ---- the public call: choose the path ------------------------------------------------------ */

/* matmul_packed through a chosen path: 0 = by shape (what matmul_packed does), 1 = the vector
 * path (M = 1 or N <= 8 only; else returns 4), 2 = direct (no packing), 3 = the packed loop nest,
 * 4 = the vector path reading ahead by hand (B for M = 1, A for N = 1; not the dot products
 * of N = 2..8) whatever the CPU, the size or the threads (1 reads ahead only where that was
 * measured to pay). For comparing the paths
 * on one shape; every path gives a correct product, and both vector paths the same bits. */
MATMUL_API int TYPED(matmul_packed_path)(const real *A, const real *B, real *C, int64_t M, int64_t N, int64_t K,
                                         int64_t threads, int64_t variant, int64_t path) {
    if (M < 0 || N < 0 || K < 0 || path < PACKED_PATH_AUTO || path > PACKED_PATH_VECTOR_READ_AHEAD)
        return PACKED_ERR_ARGUMENT;
    const struct packed_kernel *kernel = packed_kernel_for(variant, sizeof(real));
    if (!kernel) return PACKED_ERR_VARIANT;
    const int vector_shape = M == 1 || N <= DOTS_MAX_N;
    if ((path == PACKED_PATH_VECTOR || path == PACKED_PATH_VECTOR_READ_AHEAD) && !vector_shape) return PACKED_ERR_PATH;
    if (M == 0 || N == 0) return PACKED_OK;
    if (K == 0) { /* an empty sum: C = 0, as NumPy gives */
        memset(C, 0, (size_t)M * (size_t)N * sizeof(real));
        return PACKED_OK;
    }
    if (path == PACKED_PATH_AUTO) {
        const int direct = K * N * (int64_t)sizeof(real) <= packed_cache_sizes().l2 / 2 &&
                           (K <= DIRECT_MAX_K || (double)M * (double)N * (double)K <= DIRECT_MAX_FMAS);
        if (M == 1 || N == 1 || dots_pay(kernel, N, K, direct))
            path = PACKED_PATH_VECTOR;
        else if (direct)
            path = PACKED_PATH_DIRECT; /* B stays in L2: packing it would only add a copy */
        else
            path = PACKED_PATH_NEST;
    }
    switch (path) {
    case PACKED_PATH_VECTOR:
    case PACKED_PATH_VECTOR_READ_AHEAD: {
        /* GEMV: one vector and one matrix (for M = N = 1, a dot product: the N = 1 path); or
         * up to DOTS_MAX_N columns of B, each a vector against A. */
        struct vector_job job = {.A = A, .B = B, .C = C, .M = M, .N = N, .K = K, .parts = 1, .group = 1};
        const int64_t length = M == 1 ? N : M;
        job.group = M == 1 ? 64 / (int64_t)sizeof(real) : DOT_ROWS; /* cache lines of y; DOT_ROWS rows */
        if (M > 1 && N > 1) { /* B's columns into rows, in the calling thread's buffer */
            real *bt = pool_thread_buffer((size_t)N * (size_t)K * sizeof(real));
            if (!bt) return PACKED_ERR_MEMORY;
            for (int64_t p = 0; p < K; ++p)
                for (int64_t j = 0; j < N; ++j) bt[j * K + p] = B[p * N + j];
            job.bt = bt;
        }
        job.parts = pool_threads_for(threads, (double)length * (double)K * (double)(M == 1 ? 1 : N),
                                     (length + job.group - 1) / job.group);
        job.read_ahead =
            gemv_read_ahead(job.parts, (double)K * (double)N * sizeof(real), path == PACKED_PATH_VECTOR_READ_AHEAD);
        job.dot_read_ahead =
            dot_read_ahead((double)M * (double)K * sizeof(real), path == PACKED_PATH_VECTOR_READ_AHEAD);
        pool_run(job.parts, vector_task, &job);
        return PACKED_OK;
    }
    case PACKED_PATH_DIRECT: return direct_nest(A, B, C, M, N, K, threads, kernel);
    default: return loop_nest(A, B, C, M, N, K, threads, kernel);
    }
}

/* The Goto/BLIS packed SIMD matmul. threads <= 0 uses every online core; variant 0 = auto (the
 * best this CPU supports), 1 = portable C, 2 = AVX2+FMA, 3 = AVX-512. Returns 0 on success, 1
 * for a variant this CPU or build cannot run, 2 if the pack buffers cannot be allocated, 3 for
 * a negative dimension. The result is the same for every thread count. */
MATMUL_API int TYPED(matmul_packed)(const real *A, const real *B, real *C, int64_t M, int64_t N, int64_t K,
                                    int64_t threads, int64_t variant) {
    return TYPED(matmul_packed_path)(A, B, C, M, N, K, threads, variant, PACKED_PATH_AUTO);
}
