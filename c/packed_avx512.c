/* AVX-512 micro-kernels of the packed matmul (Skylake-X and later Intel, Zen 4 and later AMD).
 *
 * Technique: the AVX2 kernel's (packed_avx2.c) register tile, twice as wide and more than
 * twice as tall, because AVX-512 doubles both the vector width (16 float32 / 8 float64 lanes)
 * and the register count (32 zmm).
 *
 * Tile shape, float32 14 x 32 (float64 14 x 16): 14 x 2 = 28 accumulators + 2 B vectors + 1
 * broadcast = 31 of the 32 registers. A taller tile means each B vector loaded from L1 feeds
 * more FMAs (14 per load instead of 6), which matters because each zmm load moves 64 bytes;
 * the broadcasts of A come straight from memory as FMA operands ({1toN} embedded broadcast).
 *
 * Compiled with __attribute__((target("avx512f"))) on these functions only; packed.c calls
 * them only when cpuid says the CPU has AVX-512F and the OS saves the zmm state. On a CPU
 * whose AVX-512 runs at half rate (two 256-bit halves, Zen 4) it still wins through the
 * doubled register file.
 */
#include "packed.h"

#if PACKED_HAVE_X86
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f")))

enum { MR_S = 14, NV_S = 2, NR_S = NV_S * 16 }; /* float32: 14 x 32 */
enum { MR_D = 14, NV_D = 2, NR_D = NV_D * 8 };  /* float64: 14 x 16 */

/* The C tile is touched only after the K loop, in rows ldc apart that are likely in L3 or
 * memory by then. A row of a tile is 128 bytes: two cache lines when it starts on one, three
 * when it does not (an odd N, or an array that starts past a line). Fetched all at once,
 * 14 x 3 lines would exceed the core's dozen or so outstanding misses and stall the K loop
 * until the first ones arrive; so the kernel fetches one line per step over its first steps
 * (step s: row s / 3, at its first byte, 64 bytes on, and its last byte), with write intent
 * (the tile is written, whether or not it is read), and the write-back finds C in cache.
 * One thread, medians of 9-15 interleaved: 2048^3 float64 4% faster than fetching two lines
 * a row all at once first; 1023 x 1025 x 1027 5-7% faster than two lines a row. */
enum { C_LINES_PER_ROW = 3 };

static inline __attribute__((always_inline)) void fetch_c_line(const char *C, int64_t ldc_bytes, int64_t row_bytes,
                                                               int64_t step) {
    const int64_t piece = step % C_LINES_PER_ROW, last = row_bytes - 1;
    const int64_t offset = piece == 0 ? 0 : piece == 1 ? (last < 64 ? last : 64) : last;
    __builtin_prefetch(C + step / C_LINES_PER_ROW * ldc_bytes + offset, 1, 3);
}

/* One step of the K sum (float): the tile's accumulators += column p of the A micro-panel
 * (broadcast) x row p of the B sliver (two vectors). */
AVX512 static inline __attribute__((always_inline)) void step_f32(const int rows, const float *restrict a,
                                                                  const float *restrict b, __m512 c[MR_S][NV_S]) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        const __m512 ai = _mm512_set1_ps(a[i]);
        c[i][0] = _mm512_fmadd_ps(ai, b0, c[i][0]);
        c[i][1] = _mm512_fmadd_ps(ai, b1, c[i][1]);
    }
}

/* One tile of `rows` x NR_S (float). Always inlined into kernel_f32 with `rows` a constant, so
 * every loop over the accumulators unrolls fully and the array lives in registers. */
AVX512 static inline __attribute__((always_inline)) void
tile_f32(const int rows, int64_t kc, const void *Ap, const void *Bp, void *C_, int64_t ldc, int64_t n, int accumulate) {
    const float *restrict a = Ap;
    const float *restrict b = Bp;
    float *C = C_;
    __m512 c[MR_S][NV_S];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_S; ++v) c[i][v] = _mm512_setzero_ps();

    int64_t p = 0; /* the first steps also fetch the C tile, a line per step (fetch_c_line) */
    const int64_t fetch_steps = C_LINES_PER_ROW * rows < kc ? C_LINES_PER_ROW * rows : kc;
    for (; p < fetch_steps; ++p, a += MR_S, b += NR_S) {
        fetch_c_line((const char *)C, ldc * (int64_t)sizeof(float), n * (int64_t)sizeof(float), p);
        step_f32(rows, a, b, c);
    }
#pragma GCC unroll 4
    for (; p < kc; ++p, a += MR_S, b += NR_S) step_f32(rows, a, b, c);

    if (n == NR_S) {
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            float *row = C + i * ldc;
#pragma GCC unroll 4
            for (int v = 0; v < NV_S; ++v) {
                __m512 value = c[i][v];
                if (accumulate) value = _mm512_add_ps(_mm512_loadu_ps(row + 16 * v), value);
                _mm512_storeu_ps(row + 16 * v, value);
            }
        }
        return;
    }
    /* Edge tile in N: spill the registers to the stack and copy only the part inside C, so no
     * byte outside the matrix is read or written. */
    float tile[MR_S][NR_S] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_S; ++v) _mm512_store_ps(&tile[i][16 * v], c[i][v]);
    packed_store_edge_f32(&tile[0][0], NR_S, C, ldc, rows, n, accumulate);
}

/* The micro-kernel: one instance of the tile per row count, so a tile with m < MR rows (the
 * last rows of C, or all of a small-M problem) costs m rows of FMAs, not MR. */
AVX512 static void kernel_f32(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
                              int accumulate) {
    switch (m) {
    case 14: tile_f32(14, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 13: tile_f32(13, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 12: tile_f32(12, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 11: tile_f32(11, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 10: tile_f32(10, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 9: tile_f32(9, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 8: tile_f32(8, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 7: tile_f32(7, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 6: tile_f32(6, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 5: tile_f32(5, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 4: tile_f32(4, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 3: tile_f32(3, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 2: tile_f32(2, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 1: tile_f32(1, kc, Ap, Bp, C, ldc, n, accumulate); break;
    }
}

/* The direct tile (float): the same register tile, reading A and B where they lie instead of
 * from packed panels, for problems too small for packing to pay (packed.c: direct_nest). A's
 * values are broadcast from its rows (row stride lda), B's rows are loaded with stride ldb.
 * A full-width tile uses plain loads and stores; an edge tile (`full` 0) masks the columns
 * past n off in every load and store, so no byte outside the matrices is touched. (Masked
 * loads on full tiles, which the mask makes correct too, cost more: 64^3, one thread, two
 * runs of medians of 21 interleaved, 3-4% slower in float32 and 3-8% in float64.) C = the
 * tile (never accumulated: the direct path takes K whole). */
AVX512 static inline __attribute__((always_inline)) void direct_tile_f32(const int rows, const int full, int64_t k,
                                                                         const float *A, int64_t lda, const float *B,
                                                                         int64_t ldb, float *C, int64_t ldc,
                                                                         int64_t n) {
    const __mmask16 mask0 = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
    const __mmask16 mask1 = n >= 32 ? 0xFFFF : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
    __m512 c[MR_S][NV_S];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_S; ++v) c[i][v] = _mm512_setzero_ps();

#pragma GCC unroll 2
    for (int64_t p = 0; p < k; ++p) {
        const float *b = B + p * ldb;
        const __m512 b0 = full ? _mm512_loadu_ps(b) : _mm512_maskz_loadu_ps(mask0, b);
        const __m512 b1 = full ? _mm512_loadu_ps(b + 16) : _mm512_maskz_loadu_ps(mask1, b + 16);
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const __m512 ai = _mm512_set1_ps(A[i * lda + p]);
            c[i][0] = _mm512_fmadd_ps(ai, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_ps(ai, b1, c[i][1]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        if (full) {
            _mm512_storeu_ps(C + i * ldc, c[i][0]);
            _mm512_storeu_ps(C + i * ldc + 16, c[i][1]);
        } else {
            _mm512_mask_storeu_ps(C + i * ldc, mask0, c[i][0]);
            _mm512_mask_storeu_ps(C + i * ldc + 16, mask1, c[i][1]);
        }
    }
}

AVX512 static inline __attribute__((always_inline)) void direct_rows_f32(const int full, int64_t k, const void *A,
                                                                         int64_t lda, const void *B, int64_t ldb,
                                                                         void *C, int64_t ldc, int64_t m, int64_t n) {
    switch (m) {
    case 14: direct_tile_f32(14, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 13: direct_tile_f32(13, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 12: direct_tile_f32(12, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 11: direct_tile_f32(11, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 10: direct_tile_f32(10, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 9: direct_tile_f32(9, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 8: direct_tile_f32(8, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 7: direct_tile_f32(7, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 6: direct_tile_f32(6, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 5: direct_tile_f32(5, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 4: direct_tile_f32(4, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 3: direct_tile_f32(3, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 2: direct_tile_f32(2, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 1: direct_tile_f32(1, full, k, A, lda, B, ldb, C, ldc, n); break;
    }
}

/* The direct kernel: one instance per row count and per full or edge width. */
AVX512 static void direct_f32(int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc,
                              int64_t m, int64_t n) {
    if (n == NR_S)
        direct_rows_f32(1, k, A, lda, B, ldb, C, ldc, m, n);
    else
        direct_rows_f32(0, k, A, lda, B, ldb, C, ldc, m, n);
}

/* One step of the K sum (double): the tile's accumulators += column p of the A micro-panel
 * (broadcast) x row p of the B sliver (two vectors). */
AVX512 static inline __attribute__((always_inline)) void step_f64(const int rows, const double *restrict a,
                                                                  const double *restrict b, __m512d c[MR_D][NV_D]) {
    const __m512d b0 = _mm512_load_pd(b), b1 = _mm512_load_pd(b + 8);
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        const __m512d ai = _mm512_set1_pd(a[i]);
        c[i][0] = _mm512_fmadd_pd(ai, b0, c[i][0]);
        c[i][1] = _mm512_fmadd_pd(ai, b1, c[i][1]);
    }
}

/* One tile of `rows` x NR_D (double). Always inlined into kernel_f64 with `rows` a constant, so
 * every loop over the accumulators unrolls fully and the array lives in registers. */
AVX512 static inline __attribute__((always_inline)) void
tile_f64(const int rows, int64_t kc, const void *Ap, const void *Bp, void *C_, int64_t ldc, int64_t n, int accumulate) {
    const double *restrict a = Ap;
    const double *restrict b = Bp;
    double *C = C_;
    __m512d c[MR_D][NV_D];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_D; ++v) c[i][v] = _mm512_setzero_pd();

    int64_t p = 0; /* the first steps also fetch the C tile, a line per step (fetch_c_line) */
    const int64_t fetch_steps = C_LINES_PER_ROW * rows < kc ? C_LINES_PER_ROW * rows : kc;
    for (; p < fetch_steps; ++p, a += MR_D, b += NR_D) {
        fetch_c_line((const char *)C, ldc * (int64_t)sizeof(double), n * (int64_t)sizeof(double), p);
        step_f64(rows, a, b, c);
    }
#pragma GCC unroll 4
    for (; p < kc; ++p, a += MR_D, b += NR_D) step_f64(rows, a, b, c);

    if (n == NR_D) {
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            double *row = C + i * ldc;
#pragma GCC unroll 4
            for (int v = 0; v < NV_D; ++v) {
                __m512d value = c[i][v];
                if (accumulate) value = _mm512_add_pd(_mm512_loadu_pd(row + 8 * v), value);
                _mm512_storeu_pd(row + 8 * v, value);
            }
        }
        return;
    }
    /* Edge tile in N: spill the registers to the stack and copy only the part inside C, so no
     * byte outside the matrix is read or written. */
    double tile[MR_D][NR_D] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_D; ++v) _mm512_store_pd(&tile[i][8 * v], c[i][v]);
    packed_store_edge_f64(&tile[0][0], NR_D, C, ldc, rows, n, accumulate);
}

/* The micro-kernel: one instance of the tile per row count, so a tile with m < MR rows (the
 * last rows of C, or all of a small-M problem) costs m rows of FMAs, not MR. */
AVX512 static void kernel_f64(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
                              int accumulate) {
    switch (m) {
    case 14: tile_f64(14, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 13: tile_f64(13, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 12: tile_f64(12, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 11: tile_f64(11, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 10: tile_f64(10, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 9: tile_f64(9, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 8: tile_f64(8, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 7: tile_f64(7, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 6: tile_f64(6, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 5: tile_f64(5, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 4: tile_f64(4, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 3: tile_f64(3, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 2: tile_f64(2, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 1: tile_f64(1, kc, Ap, Bp, C, ldc, n, accumulate); break;
    }
}

/* The direct tile (double): the same register tile, reading A and B where they lie instead of
 * from packed panels, for problems too small for packing to pay (packed.c: direct_nest). A's
 * values are broadcast from its rows (row stride lda), B's rows are loaded with stride ldb.
 * A full-width tile uses plain loads and stores; an edge tile (`full` 0) masks the columns
 * past n off in every load and store, so no byte outside the matrices is touched. (Masked
 * loads on full tiles, which the mask makes correct too, cost more: 64^3, one thread, two
 * runs of medians of 21 interleaved, 3-4% slower in float32 and 3-8% in float64.) C = the
 * tile (never accumulated: the direct path takes K whole). */
AVX512 static inline __attribute__((always_inline)) void direct_tile_f64(const int rows, const int full, int64_t k,
                                                                         const double *A, int64_t lda, const double *B,
                                                                         int64_t ldb, double *C, int64_t ldc,
                                                                         int64_t n) {
    const __mmask8 mask0 = n >= 8 ? 0xFF : (__mmask8)((1u << n) - 1);
    const __mmask8 mask1 = n >= 16 ? 0xFF : n <= 8 ? 0 : (__mmask8)((1u << (n - 8)) - 1);
    __m512d c[MR_D][NV_D];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_D; ++v) c[i][v] = _mm512_setzero_pd();

#pragma GCC unroll 2
    for (int64_t p = 0; p < k; ++p) {
        const double *b = B + p * ldb;
        const __m512d b0 = full ? _mm512_loadu_pd(b) : _mm512_maskz_loadu_pd(mask0, b);
        const __m512d b1 = full ? _mm512_loadu_pd(b + 8) : _mm512_maskz_loadu_pd(mask1, b + 8);
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const __m512d ai = _mm512_set1_pd(A[i * lda + p]);
            c[i][0] = _mm512_fmadd_pd(ai, b0, c[i][0]);
            c[i][1] = _mm512_fmadd_pd(ai, b1, c[i][1]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        if (full) {
            _mm512_storeu_pd(C + i * ldc, c[i][0]);
            _mm512_storeu_pd(C + i * ldc + 8, c[i][1]);
        } else {
            _mm512_mask_storeu_pd(C + i * ldc, mask0, c[i][0]);
            _mm512_mask_storeu_pd(C + i * ldc + 8, mask1, c[i][1]);
        }
    }
}

AVX512 static inline __attribute__((always_inline)) void direct_rows_f64(const int full, int64_t k, const void *A,
                                                                         int64_t lda, const void *B, int64_t ldb,
                                                                         void *C, int64_t ldc, int64_t m, int64_t n) {
    switch (m) {
    case 14: direct_tile_f64(14, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 13: direct_tile_f64(13, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 12: direct_tile_f64(12, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 11: direct_tile_f64(11, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 10: direct_tile_f64(10, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 9: direct_tile_f64(9, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 8: direct_tile_f64(8, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 7: direct_tile_f64(7, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 6: direct_tile_f64(6, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 5: direct_tile_f64(5, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 4: direct_tile_f64(4, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 3: direct_tile_f64(3, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 2: direct_tile_f64(2, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 1: direct_tile_f64(1, full, k, A, lda, B, ldb, C, ldc, n); break;
    }
}

/* The direct kernel: one instance per row count and per full or edge width. */
AVX512 static void direct_f64(int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc,
                              int64_t m, int64_t n) {
    if (n == NR_D)
        direct_rows_f64(1, k, A, lda, B, ldb, C, ldc, m, n);
    else
        direct_rows_f64(0, k, A, lda, B, ldb, C, ldc, m, n);
}

const struct packed_kernel packed_avx512_f32 = {MR_S, NR_S, kernel_f32, direct_f32};
const struct packed_kernel packed_avx512_f64 = {MR_D, NR_D, kernel_f64, direct_f64};

#endif
