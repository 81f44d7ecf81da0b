/* AVX2 + FMA micro-kernels of the packed matmul (x86-64 since Haswell / Zen). Written once over
 * `real` and compiled for float32 and float64 (real.h).
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
 * One text for both types: the kernels use a ymm register of reals, `vec` (VEC_LANES of them:
 * 8 float32 or 4 float64), through the handful of wrappers below, each one intrinsic (its _ps
 * or _pd form) and always inlined, so the compiled kernels are those the intrinsics written
 * out would give. The tile is two vectors wide in either type, so it has the same shape in
 * registers; only its width in elements, NR, follows the type.
 *
 * Compiled with __attribute__((target("avx2,fma"))) on these functions only, so the rest of
 * the library keeps the build's baseline ISA; packed.c calls them only when cpuid says the
 * CPU has AVX2 and FMA (and the OS saves the ymm state).
 */
#include "packed.h"
#include "real.h"

#if PACKED_HAVE_X86
#include <immintrin.h>

#define AVX2   __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

/* ---- a ymm register of reals ---------------------------------------------------------------- */

/* What the two types differ in: the register type, its lane count, and the suffix of the AVX
 * intrinsics, which VEC pastes on as real.h's TYPED does on public names (VEC(fmadd) is
 * _mm256_fmadd_ps for float32, _mm256_fmadd_pd for float64). */
#if defined(MATMUL_REAL_DOUBLE)
typedef __m256d vec;
enum { VEC_LANES = 4 };
#define VEC(op) _mm256_##op##_pd
AVX2 INLINE vec vec_broadcast(const real *p) { return _mm256_broadcast_sd(p); }
#else
typedef __m256 vec;
enum { VEC_LANES = 8 };
#define VEC(op) _mm256_##op##_ps
AVX2 INLINE vec vec_broadcast(const real *p) { return _mm256_broadcast_ss(p); }
#endif

/* Which lanes a masked load or store touches: those whose integer, as wide as a real, is
 * negative (all ones). */
typedef __m256i vec_mask;

AVX2 INLINE vec vec_zero(void) { return VEC(setzero)(); }
AVX2 INLINE vec vec_load(const real *p) { return VEC(load)(p); } /* p 32-byte aligned */
AVX2 INLINE vec vec_loadu(const real *p) { return VEC(loadu)(p); }
AVX2 INLINE vec vec_loadu_masked(const real *p, vec_mask mask) { return VEC(maskload)(p, mask); }
AVX2 INLINE vec vec_fma(vec a, vec b, vec c) { return VEC(fmadd)(a, b, c); } /* a b + c, rounded once */
AVX2 INLINE vec vec_add(vec a, vec b) { return VEC(add)(a, b); }
AVX2 INLINE void vec_store(real *p, vec v) { VEC(store)(p, v); } /* p 32-byte aligned */
AVX2 INLINE void vec_storeu(real *p, vec v) { VEC(storeu)(p, v); }
AVX2 INLINE void vec_storeu_masked(real *p, vec_mask mask, vec v) { VEC(maskstore)(p, mask, v); }

/* The lanes of a vector that starts at column `first` of a row and lie inside its n columns:
 * lane l if first + l < n, compared in integers as wide as a real. */
AVX2 INLINE vec_mask vec_mask_inside(int64_t n, const int first) {
#if defined(MATMUL_REAL_DOUBLE)
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n - first), _mm256_setr_epi64x(0, 1, 2, 3));
#else
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n - first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#endif
}

enum { MR = 6, NV = 2, NR = NV * VEC_LANES }; /* the tile: float32 6 x 16, float64 6 x 8 */

/* ---- the packed micro-kernel ----------------------------------------------------------------- */

/* One tile of `rows` x NR, of which the first nv vectors' columns are computed. Always inlined
 * into kernel with `rows` and `nv` constants, so every loop over the accumulators unrolls fully
 * and the array lives in registers. */
AVX2 INLINE void tile(const int rows, const int nv, int64_t kc, const void *Ap, const void *Bp, void *C_, int64_t ldc,
                      int64_t n, int accumulate) {
    const real *restrict a = Ap;
    const real *restrict b = Bp;
    real *C = C_;
    /* The C tile is touched only after the K loop, in rows ldc apart that are likely out of
     * L1 and L2 by now: start fetching them so the write-back does not wait on memory. */
    if (accumulate)
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + n - 1), _MM_HINT_T0);
        }
    vec c[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) c[i][v] = vec_zero();

#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; ++p) {
        const vec b0 = vec_load(b), b1 = nv > 1 ? vec_load(b + VEC_LANES) : vec_zero();
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const vec ai = vec_broadcast(a + i);
            c[i][0] = vec_fma(ai, b0, c[i][0]);
            if (nv > 1) c[i][1] = vec_fma(ai, b1, c[i][1]);
        }
        a += MR;
        b += NR;
    }

    if (n == NR) {
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            real *row = C + i * ldc;
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                vec value = c[i][v];
                if (accumulate) value = vec_add(vec_loadu(row + VEC_LANES * v), value);
                vec_storeu(row + VEC_LANES * v, value);
            }
        }
        return;
    }
    /* Edge tile in N: spill the registers to the stack and copy only the part inside C, so no
     * byte outside the matrix is read or written. */
    real spilled[MR][NR] __attribute__((aligned(32)));
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) vec_store(&spilled[i][VEC_LANES * v], c[i][v]);
    TYPED(packed_store_edge)(&spilled[0][0], NR, C, ldc, rows, n, accumulate);
}

/* The tiles of one width, one instance per row count, so a tile with m < MR rows (the last rows
 * of C, or all of a small-M problem) costs m rows of FMAs, not MR. */
AVX2 INLINE void tile_rows(const int nv, int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m,
                           int64_t n, int accumulate) {
    switch (m) {
    case 6: tile(6, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 5: tile(5, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 4: tile(4, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 3: tile(3, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 2: tile(2, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 1: tile(1, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    }
}

/* The micro-kernel. An edge sliver of B no wider than one vector (n <= 8 float32 / 4 float64
 * columns) costs one vector of FMAs a row, not two. */
AVX2 static void kernel(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
                        int accumulate) {
    if (n <= VEC_LANES)
        tile_rows(1, kc, Ap, Bp, C, ldc, m, n, accumulate);
    else
        tile_rows(NV, kc, Ap, Bp, C, ldc, m, n, accumulate);
}

/* ---- the direct kernel: A and B where they lie ---------------------------------------------- */

/* The direct tile: the same register tile, reading A and B where they lie instead of from
 * packed panels, for problems too small for packing to pay (packed.c: direct_nest). A's
 * values are broadcast from its rows (row stride lda), B's rows are loaded with stride ldb.
 * A full-width tile uses plain loads and stores; an edge tile (`full` 0) masks the columns
 * past n off in every load and store, so no byte outside the matrices is touched; one no
 * wider than a vector (`nv` 1) computes that vector alone. C = the
 * tile (never accumulated: the direct path takes K whole). */
AVX2 INLINE void direct_tile(const int rows, const int full, const int nv, int64_t k, const real *A, int64_t lda,
                             const real *B, int64_t ldb, real *C, int64_t ldc, int64_t n) {
    const vec_mask mask0 = vec_mask_inside(n, 0), mask1 = vec_mask_inside(n, VEC_LANES);
    vec c[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) c[i][v] = vec_zero();

#pragma GCC unroll 2
    for (int64_t p = 0; p < k; ++p) {
        const real *b = B + p * ldb;
        const vec b0 = full ? vec_loadu(b) : vec_loadu_masked(b, mask0);
        const vec b1 = nv < 2 ? vec_zero() : full ? vec_loadu(b + VEC_LANES) : vec_loadu_masked(b + VEC_LANES, mask1);
#pragma GCC unroll 16
        for (int i = 0; i < rows; ++i) {
            const vec ai = vec_broadcast(A + i * lda + p);
            c[i][0] = vec_fma(ai, b0, c[i][0]);
            if (nv > 1) c[i][1] = vec_fma(ai, b1, c[i][1]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        if (full) {
            vec_storeu(C + i * ldc, c[i][0]);
            vec_storeu(C + i * ldc + VEC_LANES, c[i][1]);
        } else {
            vec_storeu_masked(C + i * ldc, mask0, c[i][0]);
            if (nv > 1) vec_storeu_masked(C + i * ldc + VEC_LANES, mask1, c[i][1]);
        }
    }
}

AVX2 INLINE void direct_rows(const int full, const int nv, int64_t k, const void *A, int64_t lda, const void *B,
                             int64_t ldb, void *C, int64_t ldc, int64_t m, int64_t n) {
    switch (m) {
    case 6: direct_tile(6, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 5: direct_tile(5, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 4: direct_tile(4, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 3: direct_tile(3, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 2: direct_tile(2, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 1: direct_tile(1, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    }
}

/* The direct kernel: one instance per row count and per full, edge or one-vector width. */
AVX2 static void direct(int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc,
                        int64_t m, int64_t n) {
    if (n == NR)
        direct_rows(1, NV, k, A, lda, B, ldb, C, ldc, m, n);
    else if (n <= VEC_LANES) /* as kernel: one vector of FMAs a row */
        direct_rows(0, 1, k, A, lda, B, ldb, C, ldc, m, n);
    else
        direct_rows(0, NV, k, A, lda, B, ldb, C, ldc, m, n);
}

/* ---- packing A ---------------------------------------------------------------------------- */

/* A[i0 : i0+mc, p0 : p0+kc] into MR x kc micro-panels, p-major, rows past the matrix zero:
 * packed.c's pack_a, a block of VEC_LANES columns of the 6 rows at a time: each row's piece is
 * one load, read ahead by hand (the rows are 6 streams K apart); the block is transposed in
 * registers; each column goes out as two stores, 4 + 2 values. Columns past the last whole
 * block, and a last micro-panel of fewer than 6 rows, go element by element. (packed_avx512.c
 * does the same for its 14 rows; element by element this packing was 4-5% of a 512^3 product.) */
enum { PACK_A_AHEAD = 512 }; /* bytes ahead along each row of A */
_Static_assert(MR == 6, "pack_a transposes blocks of 6 rows");

AVX2 static void pack_a(const void *A_, int64_t K, int64_t i0, int64_t mc, int64_t p0, int64_t kc, void *out_) {
    const real *A = A_;
    real *out = out_;
    for (int64_t ir = 0; ir < mc; ir += MR, out += MR * kc) {
        const int64_t rows = mc - ir < MR ? mc - ir : MR;
        const real *src = A + (i0 + ir) * K + p0;
        int64_t p = 0;
        for (; rows == MR && p + VEC_LANES <= kc; p += VEC_LANES) {
            vec r[MR];
#pragma GCC unroll 6
            for (int i = 0; i < MR; ++i) {
                _mm_prefetch((const char *)(src + i * K + p) + PACK_A_AHEAD, _MM_HINT_T0);
                r[i] = vec_loadu(src + i * K + p);
            }
            real *to = out + p * MR;
#if defined(MATMUL_REAL_DOUBLE)
            /* t[2g]: rows 2g and 2g + 1 of columns 0 and 2 (a 128-bit half each), t[2g + 1] of 1 and 3 */
            __m256d t[MR];
#pragma GCC unroll 3
            for (int g = 0; g < 3; ++g) {
                t[2 * g] = _mm256_unpacklo_pd(r[2 * g], r[2 * g + 1]);
                t[2 * g + 1] = _mm256_unpackhi_pd(r[2 * g], r[2 * g + 1]);
            }
#pragma GCC unroll 4
            for (int c = 0; c < 4; ++c, to += MR) {
                const int j = c & 1, high = c >> 1; /* column c: pair j of 128-bit half `high` */
                /* rows 0-3 (the immediate written out: unoptimized builds do not fold `high` into it) */
                _mm256_storeu_pd(to, high ? _mm256_permute2f128_pd(t[j], t[2 + j], 0x31)
                                          : _mm256_permute2f128_pd(t[j], t[2 + j], 0x20));
                _mm_storeu_pd(to + 4, high ? _mm256_extractf128_pd(t[4 + j], 1) : _mm256_castpd256_pd128(t[4 + j]));
            }
#else
            /* unpack: t[2g] = rows 2g, 2g + 1 interleaved over columns 0, 1 | 4, 5; t[2g + 1] over 2, 3 | 6, 7 */
            __m256 t[MR];
#pragma GCC unroll 3
            for (int g = 0; g < 3; ++g) {
                t[2 * g] = _mm256_unpacklo_ps(r[2 * g], r[2 * g + 1]);
                t[2 * g + 1] = _mm256_unpackhi_ps(r[2 * g], r[2 * g + 1]);
            }
            /* u[c % 4]: rows 0-3 of column c in 128-bit half c / 4 */
            const __m256 u[4] = {_mm256_shuffle_ps(t[0], t[2], 0x44), _mm256_shuffle_ps(t[0], t[2], 0xee),
                                 _mm256_shuffle_ps(t[1], t[3], 0x44), _mm256_shuffle_ps(t[1], t[3], 0xee)};
#pragma GCC unroll 8
            for (int c = 0; c < 8; ++c, to += MR) {
                const int high = c >= 4, q = c & 3; /* rows 4-5: 64-bit piece q & 1 of t[4 + q / 2]'s half */
                const __m128 upper = high ? _mm256_extractf128_ps(u[q], 1) : _mm256_castps256_ps128(u[q]);
                const __m256 pair = t[4 + q / 2];
                const __m128 lower = high ? _mm256_extractf128_ps(pair, 1) : _mm256_castps256_ps128(pair);
                _mm_storeu_ps(to, upper);
                if (q & 1)
                    _mm_storeh_pi((__m64 *)(void *)(to + 4), lower);
                else
                    _mm_storel_pi((__m64 *)(void *)(to + 4), lower);
            }
#endif
        }
        for (; p < kc; ++p)
            for (int64_t i = 0; i < MR; ++i) out[p * MR + i] = i < rows ? src[i * K + p] : 0;
    }
}

const struct packed_kernel TYPED(packed_avx2) = {MR, NR, kernel, direct, pack_a};

#endif
