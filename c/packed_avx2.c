/* AVX2 + FMA micro-kernels of the packed matmul (x86-64 since Haswell / Zen).
 *
 * Technique: an MR x NR tile of C lives in vector registers for the whole K loop. Each step p
 * loads one packed row of B (NR values, NR/W vectors of W lanes), broadcasts each of the MR
 * values of A's packed column in turn, and issues MR * NR/W fused multiply-adds. Nothing but
 * the two packed panels is read inside the loop, and C is touched once, at the end.
 *
 * Tile shape, float32 6 x 16 (float64 6 x 8): 6 x 2 = 12 accumulators + 2 B vectors + 1
 * broadcast = 15 of the 16 ymm registers. 12 independent FMA chains cover the 2 FMA pipes x
 * 4-5 cycles of FMA latency (at least 8-10 in flight), and each step's 2 loads + 6
 * broadcasts stay under the 2-3 loads per cycle the cores can issue: the loop is bound by
 * FMA throughput, not by loads. (8 x 8 would need 8 broadcasts per 8 FMAs; 4 x 24 leaves
 * too few chains to hide latency on some cores.)
 *
 * Compiled with __attribute__((target("avx2,fma"))) on these functions only, so the rest of
 * the library keeps the build's baseline ISA; packed.c calls them only when cpuid says the
 * CPU has AVX2 and FMA (and the OS saves the ymm state).
 */
#include "packed.h"

#if PACKED_HAVE_X86
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

enum { MR_S = 6, NV_S = 2, NR_S = NV_S * 8 }; /* float32: 6 x 16 */
enum { MR_D = 6, NV_D = 2, NR_D = NV_D * 4 }; /* float64: 6 x 8 */

/* One tile of `rows` x NR_S (float). Always inlined into kernel_f32 with `rows` a constant, so
 * every loop over the accumulators unrolls fully and the array lives in registers. */
AVX2 static inline __attribute__((always_inline)) void
tile_f32(const int rows, int64_t kc, const void *Ap, const void *Bp, void *C_, int64_t ldc, int64_t n, int accumulate) {
    const float *restrict a = Ap;
    const float *restrict b = Bp;
    float *C = C_;
    /* The C tile is touched only after the K loop, in rows ldc apart that are likely out of
     * L1 and L2 by now: start fetching them so the write-back does not wait on memory. */
    if (accumulate)
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + n - 1), _MM_HINT_T0);
        }
    __m256 c[MR_S][NV_S];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_S; ++v) c[i][v] = _mm256_setzero_ps();

#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const __m256 ai = _mm256_broadcast_ss(a + i);
            c[i][0] = _mm256_fmadd_ps(ai, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(ai, b1, c[i][1]);
        }
        a += MR_S;
        b += NR_S;
    }

    if (n == NR_S) {
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            float *row = C + i * ldc;
#pragma GCC unroll 4
            for (int v = 0; v < NV_S; ++v) {
                __m256 value = c[i][v];
                if (accumulate) value = _mm256_add_ps(_mm256_loadu_ps(row + 8 * v), value);
                _mm256_storeu_ps(row + 8 * v, value);
            }
        }
        return;
    }
    /* Edge tile in N: spill the registers to the stack and copy only the part inside C, so no
     * byte outside the matrix is read or written. */
    float tile[MR_S][NR_S] __attribute__((aligned(32)));
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_S; ++v) _mm256_store_ps(&tile[i][8 * v], c[i][v]);
    packed_store_edge_f32(&tile[0][0], NR_S, C, ldc, rows, n, accumulate);
}

/* The micro-kernel: one instance of the tile per row count, so a tile with m < MR rows (the
 * last rows of C, or all of a small-M problem) costs m rows of FMAs, not MR. */
AVX2 static void kernel_f32(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
                            int accumulate) {
    switch (m) {
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
 * past n off in every load and store, so no byte outside the matrices is touched. C = the
 * tile (never accumulated: the direct path takes K whole). */
AVX2 static inline __attribute__((always_inline)) void direct_tile_f32(const int rows, const int full, int64_t k,
                                                                       const float *A, int64_t lda, const float *B,
                                                                       int64_t ldb, float *C, int64_t ldc, int64_t n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), lane);
    const __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n - 8), lane);
    __m256 c[MR_S][NV_S];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_S; ++v) c[i][v] = _mm256_setzero_ps();

#pragma GCC unroll 2
    for (int64_t p = 0; p < k; ++p) {
        const float *b = B + p * ldb;
        const __m256 b0 = full ? _mm256_loadu_ps(b) : _mm256_maskload_ps(b, mask0);
        const __m256 b1 = full ? _mm256_loadu_ps(b + 8) : _mm256_maskload_ps(b + 8, mask1);
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const __m256 ai = _mm256_broadcast_ss(A + i * lda + p);
            c[i][0] = _mm256_fmadd_ps(ai, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(ai, b1, c[i][1]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        if (full) {
            _mm256_storeu_ps(C + i * ldc, c[i][0]);
            _mm256_storeu_ps(C + i * ldc + 8, c[i][1]);
        } else {
            _mm256_maskstore_ps(C + i * ldc, mask0, c[i][0]);
            _mm256_maskstore_ps(C + i * ldc + 8, mask1, c[i][1]);
        }
    }
}

AVX2 static inline __attribute__((always_inline)) void direct_rows_f32(const int full, int64_t k, const void *A,
                                                                       int64_t lda, const void *B, int64_t ldb, void *C,
                                                                       int64_t ldc, int64_t m, int64_t n) {
    switch (m) {
    case 6: direct_tile_f32(6, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 5: direct_tile_f32(5, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 4: direct_tile_f32(4, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 3: direct_tile_f32(3, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 2: direct_tile_f32(2, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 1: direct_tile_f32(1, full, k, A, lda, B, ldb, C, ldc, n); break;
    }
}

/* The direct kernel: one instance per row count and per full or edge width. */
AVX2 static void direct_f32(int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc,
                            int64_t m, int64_t n) {
    if (n == NR_S)
        direct_rows_f32(1, k, A, lda, B, ldb, C, ldc, m, n);
    else
        direct_rows_f32(0, k, A, lda, B, ldb, C, ldc, m, n);
}

/* One tile of `rows` x NR_D (double). Always inlined into kernel_f64 with `rows` a constant, so
 * every loop over the accumulators unrolls fully and the array lives in registers. */
AVX2 static inline __attribute__((always_inline)) void
tile_f64(const int rows, int64_t kc, const void *Ap, const void *Bp, void *C_, int64_t ldc, int64_t n, int accumulate) {
    const double *restrict a = Ap;
    const double *restrict b = Bp;
    double *C = C_;
    /* The C tile is touched only after the K loop, in rows ldc apart that are likely out of
     * L1 and L2 by now: start fetching them so the write-back does not wait on memory. */
    if (accumulate)
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + n - 1), _MM_HINT_T0);
        }
    __m256d c[MR_D][NV_D];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_D; ++v) c[i][v] = _mm256_setzero_pd();

#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
        const __m256d b0 = _mm256_load_pd(b), b1 = _mm256_load_pd(b + 4);
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const __m256d ai = _mm256_broadcast_sd(a + i);
            c[i][0] = _mm256_fmadd_pd(ai, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_pd(ai, b1, c[i][1]);
        }
        a += MR_D;
        b += NR_D;
    }

    if (n == NR_D) {
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            double *row = C + i * ldc;
#pragma GCC unroll 4
            for (int v = 0; v < NV_D; ++v) {
                __m256d value = c[i][v];
                if (accumulate) value = _mm256_add_pd(_mm256_loadu_pd(row + 4 * v), value);
                _mm256_storeu_pd(row + 4 * v, value);
            }
        }
        return;
    }
    /* Edge tile in N: spill the registers to the stack and copy only the part inside C, so no
     * byte outside the matrix is read or written. */
    double tile[MR_D][NR_D] __attribute__((aligned(32)));
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_D; ++v) _mm256_store_pd(&tile[i][4 * v], c[i][v]);
    packed_store_edge_f64(&tile[0][0], NR_D, C, ldc, rows, n, accumulate);
}

/* The micro-kernel: one instance of the tile per row count, so a tile with m < MR rows (the
 * last rows of C, or all of a small-M problem) costs m rows of FMAs, not MR. */
AVX2 static void kernel_f64(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
                            int accumulate) {
    switch (m) {
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
 * past n off in every load and store, so no byte outside the matrices is touched. C = the
 * tile (never accumulated: the direct path takes K whole). */
AVX2 static inline __attribute__((always_inline)) void direct_tile_f64(const int rows, const int full, int64_t k,
                                                                       const double *A, int64_t lda, const double *B,
                                                                       int64_t ldb, double *C, int64_t ldc, int64_t n) {
    const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
    const __m256i mask0 = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), lane);
    const __m256i mask1 = _mm256_cmpgt_epi64(_mm256_set1_epi64x(n - 4), lane);
    __m256d c[MR_D][NV_D];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV_D; ++v) c[i][v] = _mm256_setzero_pd();

#pragma GCC unroll 2
    for (int64_t p = 0; p < k; ++p) {
        const double *b = B + p * ldb;
        const __m256d b0 = full ? _mm256_loadu_pd(b) : _mm256_maskload_pd(b, mask0);
        const __m256d b1 = full ? _mm256_loadu_pd(b + 4) : _mm256_maskload_pd(b + 4, mask1);
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const __m256d ai = _mm256_broadcast_sd(A + i * lda + p);
            c[i][0] = _mm256_fmadd_pd(ai, b0, c[i][0]);
            c[i][1] = _mm256_fmadd_pd(ai, b1, c[i][1]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        if (full) {
            _mm256_storeu_pd(C + i * ldc, c[i][0]);
            _mm256_storeu_pd(C + i * ldc + 4, c[i][1]);
        } else {
            _mm256_maskstore_pd(C + i * ldc, mask0, c[i][0]);
            _mm256_maskstore_pd(C + i * ldc + 4, mask1, c[i][1]);
        }
    }
}

AVX2 static inline __attribute__((always_inline)) void direct_rows_f64(const int full, int64_t k, const void *A,
                                                                       int64_t lda, const void *B, int64_t ldb, void *C,
                                                                       int64_t ldc, int64_t m, int64_t n) {
    switch (m) {
    case 6: direct_tile_f64(6, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 5: direct_tile_f64(5, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 4: direct_tile_f64(4, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 3: direct_tile_f64(3, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 2: direct_tile_f64(2, full, k, A, lda, B, ldb, C, ldc, n); break;
    case 1: direct_tile_f64(1, full, k, A, lda, B, ldb, C, ldc, n); break;
    }
}

/* The direct kernel: one instance per row count and per full or edge width. */
AVX2 static void direct_f64(int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc,
                            int64_t m, int64_t n) {
    if (n == NR_D)
        direct_rows_f64(1, k, A, lda, B, ldb, C, ldc, m, n);
    else
        direct_rows_f64(0, k, A, lda, B, ldb, C, ldc, m, n);
}

const struct packed_kernel packed_avx2_f32 = {MR_S, NR_S, kernel_f32, direct_f32};
const struct packed_kernel packed_avx2_f64 = {MR_D, NR_D, kernel_f64, direct_f64};

#endif
