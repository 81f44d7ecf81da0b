/* AVX-512 micro-kernels of the packed matmul (Skylake-X and later Intel, Zen 4 and later AMD).
 * Written once over `real` and compiled for float32 and float64 (real.h).
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
 * One text for both types, as in packed_avx2.c: a zmm register of reals, `vec` (VEC_LANES of
 * them), through the wrappers below, each one intrinsic and always inlined. Masks are bit
 * masks here, one bit a lane (__mmask16 for float32, __mmask8 for float64).
 *
 * Compiled with __attribute__((target("avx512f"))) on these functions only; packed.c calls
 * them only when cpuid says the CPU has AVX-512F and the OS saves the zmm state. On a CPU
 * whose AVX-512 runs at half rate (two 256-bit halves, Zen 4) it still wins through the
 * doubled register file.
 */
#include "packed.h"
#include "real.h"

#if PACKED_HAVE_X86
#include <immintrin.h>

#include "transpose_avx512.h"

#define AVX512 __attribute__((target("avx512f")))
#define INLINE static inline __attribute__((always_inline))

/* ---- a zmm register of reals ---------------------------------------------------------------- */

/* What the two types differ in: the register type, its lane count (and so the width of a mask,
 * a bit a lane), and the suffix of the AVX-512 intrinsics, which VEC pastes on as real.h's
 * TYPED does on public names (VEC(fmadd) is _mm512_fmadd_ps for float32, _mm512_fmadd_pd for
 * float64). */
#if defined(MATMUL_REAL_DOUBLE)
typedef __m512d vec;
typedef __mmask8 vec_mask;
enum { VEC_LANES = 8 };
#define VEC(op) _mm512_##op##_pd
#else
typedef __m512 vec;
typedef __mmask16 vec_mask;
enum { VEC_LANES = 16 };
#define VEC(op) _mm512_##op##_ps
#endif

AVX512 INLINE vec vec_zero(void) { return VEC(setzero)(); }
AVX512 INLINE vec vec_load(const real *p) { return VEC(load)(p); } /* p 64-byte aligned */
AVX512 INLINE vec vec_loadu(const real *p) { return VEC(loadu)(p); }
AVX512 INLINE vec vec_loadu_masked(const real *p, vec_mask mask) { return VEC(maskz_loadu)(mask, p); } /* others 0 */
AVX512 INLINE vec vec_broadcast(const real *p) { return VEC(set1)(*p); }
AVX512 INLINE vec vec_fma(vec a, vec b, vec c) { return VEC(fmadd)(a, b, c); } /* a b + c, rounded once */
AVX512 INLINE vec vec_add(vec a, vec b) { return VEC(add)(a, b); }
AVX512 INLINE void vec_store(real *p, vec v) { VEC(store)(p, v); } /* p 64-byte aligned */
AVX512 INLINE void vec_storeu(real *p, vec v) { VEC(storeu)(p, v); }
AVX512 INLINE void vec_storeu_masked(real *p, vec_mask mask, vec v) { VEC(mask_storeu)(p, mask, v); }

enum { MR = 14, NV = 2, NR = NV * VEC_LANES }; /* the tile: float32 14 x 32, float64 14 x 16 */

/* ---- the packed micro-kernel ----------------------------------------------------------------- */

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

INLINE void fetch_c_line(const char *C, int64_t ldc_bytes, int64_t row_bytes, int64_t step) {
    const int64_t piece = step % C_LINES_PER_ROW, last = row_bytes - 1;
    const int64_t offset = piece == 0 ? 0 : piece == 1 ? (last < 64 ? last : 64) : last;
    __builtin_prefetch(C + step / C_LINES_PER_ROW * ldc_bytes + offset, 1, 3);
}

/* One step of the K sum: the tile's accumulators += column p of the A micro-panel
 * (broadcast) x row p of the B sliver (its first nv vectors). */
AVX512 INLINE void step(const int rows, const int nv, const real *restrict a, const real *restrict b, vec c[MR][NV]) {
    const vec b0 = vec_load(b), b1 = nv > 1 ? vec_load(b + VEC_LANES) : vec_zero();
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i) {
        const vec ai = vec_broadcast(a + i);
        c[i][0] = vec_fma(ai, b0, c[i][0]);
        if (nv > 1) c[i][1] = vec_fma(ai, b1, c[i][1]);
    }
}

/* One tile of `rows` x NR, of which the first nv vectors' columns are computed. Always inlined
 * into kernel with `rows` and `nv` constants, so every loop over the accumulators unrolls fully
 * and the array lives in registers. */
AVX512 INLINE void tile(const int rows, const int nv, int64_t kc, const void *Ap, const void *Bp, void *C_, int64_t ldc,
                        int64_t n, int accumulate) {
    const real *restrict a = Ap;
    const real *restrict b = Bp;
    real *C = C_;
    vec c[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) c[i][v] = vec_zero();

    int64_t p = 0; /* the first steps also fetch the C tile, a line per step (fetch_c_line) */
    const int64_t fetch_steps = C_LINES_PER_ROW * rows < kc ? C_LINES_PER_ROW * rows : kc;
    for (; p < fetch_steps; ++p, a += MR, b += NR) {
        fetch_c_line((const char *)C, ldc * (int64_t)sizeof(real), n * (int64_t)sizeof(real), p);
        step(rows, nv, a, b, c);
    }
#pragma GCC unroll 4
    for (; p < kc; ++p, a += MR, b += NR) step(rows, nv, a, b, c);

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
    real spilled[MR][NR] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int i = 0; i < rows; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) vec_store(&spilled[i][VEC_LANES * v], c[i][v]);
    TYPED(packed_store_edge)(&spilled[0][0], NR, C, ldc, rows, n, accumulate);
}

/* The tiles of one width, one instance per row count, so a tile with m < MR rows (the last rows
 * of C, or all of a small-M problem) costs m rows of FMAs, not MR. */
AVX512 INLINE void tile_rows(const int nv, int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m,
                             int64_t n, int accumulate) {
    switch (m) {
    case 14: tile(14, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 13: tile(13, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 12: tile(12, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 11: tile(11, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 10: tile(10, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 9: tile(9, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 8: tile(8, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 7: tile(7, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 6: tile(6, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 5: tile(5, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 4: tile(4, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 3: tile(3, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 2: tile(2, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    case 1: tile(1, nv, kc, Ap, Bp, C, ldc, n, accumulate); break;
    }
}

/* The micro-kernel. An edge sliver of B no wider than one vector (n <= 16 float32 / 8 float64
 * columns: 1025 = 32 x 32 + 1) costs one vector of FMAs a row, not two. */
AVX512 static void kernel(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
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
 * wider than a vector (`nv` 1) computes that vector alone. (Masked
 * loads on full tiles, which the mask makes correct too, cost more: 64^3, one thread, two
 * runs of medians of 21 interleaved, 3-4% slower in float32 and 3-8% in float64.) C = the
 * tile (never accumulated: the direct path takes K whole). */
AVX512 INLINE void direct_tile(const int rows, const int full, const int nv, int64_t k, const real *A, int64_t lda,
                               const real *B, int64_t ldb, real *C, int64_t ldc, int64_t n) {
    /* The lanes of each of the two vectors that lie in the tile's n columns (n >= 1), a bit a
     * lane: integer arithmetic, the same text for both types. */
    const vec_mask all = (vec_mask)((1u << VEC_LANES) - 1);
    const vec_mask mask0 = n >= VEC_LANES ? all : (vec_mask)((1u << n) - 1);
    const vec_mask mask1 = n >= 2 * VEC_LANES ? all : n <= VEC_LANES ? 0 : (vec_mask)((1u << (n - VEC_LANES)) - 1);
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
            const vec ai = vec_broadcast(&A[i * lda + p]);
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

AVX512 INLINE void direct_rows(const int full, const int nv, int64_t k, const void *A, int64_t lda, const void *B,
                               int64_t ldb, void *C, int64_t ldc, int64_t m, int64_t n) {
    switch (m) {
    case 14: direct_tile(14, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 13: direct_tile(13, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 12: direct_tile(12, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 11: direct_tile(11, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 10: direct_tile(10, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 9: direct_tile(9, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 8: direct_tile(8, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 7: direct_tile(7, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 6: direct_tile(6, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 5: direct_tile(5, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 4: direct_tile(4, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 3: direct_tile(3, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 2: direct_tile(2, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    case 1: direct_tile(1, full, nv, k, A, lda, B, ldb, C, ldc, n); break;
    }
}

/* The direct kernel: one instance per row count and per full, edge or one-vector width. */
AVX512 static void direct(int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C, int64_t ldc,
                          int64_t m, int64_t n) {
    if (n == NR)
        direct_rows(1, NV, k, A, lda, B, ldb, C, ldc, m, n);
    else if (n <= VEC_LANES) /* as kernel: one vector of FMAs a row */
        direct_rows(0, 1, k, A, lda, B, ldb, C, ldc, m, n);
    else
        direct_rows(0, NV, k, A, lda, B, ldb, C, ldc, m, n);
}

/* ---- packing A: a transpose in registers ---------------------------------------------------- */

#if defined(MATMUL_REAL_DOUBLE)
/* The float64 transpose's last two stages: transpose_avx512.h's transpose_lanes, which moves
 * whole 128-bit lanes (here two doubles each) whatever they hold. */
AVX512 INLINE void transpose_lanes_f64(const vec u0, const vec u1, const vec u2, const vec u3, vec out[4]) {
    __m512 lanes[4];
    transpose_lanes(_mm512_castpd_ps(u0), _mm512_castpd_ps(u1), _mm512_castpd_ps(u2), _mm512_castpd_ps(u3), lanes);
    for (int L = 0; L < 4; ++L) out[L] = _mm512_castps_pd(lanes[L]);
}
#endif

/* A[i0 : i0+mc, p0 : p0+kc] into MR x kc micro-panels, p-major, rows past the matrix zero:
 * packed.c's pack_a, a block of VEC_LANES columns at a time: each row's piece is one load
 * (masked past kc), read ahead by hand (the MR rows are MR streams K apart, too many for the
 * prefetcher to follow); the block is transposed in registers; each column goes out as one
 * masked store of MR values. Element by element, with a row of A's
 * stride between the loads, this packing took 4-5% of the time at 512^3 in float32 on one
 * thread of a Zen 5, about 2% now; whole products at 384^3 to 2048^3, float32 and float64,
 * ran 3-7% faster (medians of 11 interleaved). */
enum { PACK_A_AHEAD = 512 }; /* bytes ahead along each row of A: its rows are MR streams a row of A apart */

AVX512 static void pack_a(const void *A_, int64_t K, int64_t i0, int64_t mc, int64_t p0, int64_t kc, void *out_) {
    const real *A = A_;
    real *out = out_;
    enum { ROWS = 16 }; /* MR rounded up to the transpose's 16 rows (float32) or two blocks of 8 (float64) */
    _Static_assert((int)MR <= (int)ROWS, "the transpose takes up to 16 rows");
    for (int64_t ir = 0; ir < mc; ir += MR, out += MR * kc) {
        const int64_t rows = mc - ir < MR ? mc - ir : MR;
        const real *src = A + (i0 + ir) * K + p0;
        for (int64_t p = 0; p < kc; p += VEC_LANES) {
            const int64_t cols = kc - p < VEC_LANES ? kc - p : VEC_LANES;
            const vec_mask mask = (vec_mask)(cols == VEC_LANES ? (1u << VEC_LANES) - 1 : (1u << cols) - 1);
            vec r[ROWS];
#pragma GCC unroll 16
            for (int i = 0; i < ROWS; ++i) {
                if (i < rows) _mm_prefetch((const char *)(src + i * K + p) + PACK_A_AHEAD, _MM_HINT_T0);
                r[i] = i < rows ? vec_loadu_masked(src + i * K + p, mask) : vec_zero();
            }
            vec column[ROWS]; /* column[c]: rows 0..15 of column p + c (float64: rows 0..7, then 8..15 at 8 + c) */
#if defined(MATMUL_REAL_DOUBLE)
            for (int half = 0; half < 2; ++half) { /* rows 8 half .. 8 half + 7: an 8 x 8 transpose */
                const vec *h = r + 8 * half;
                vec t[8]; /* lane L of t[2g + j]: column 2L + j, rows 2g and 2g + 1 */
#pragma GCC unroll 4
                for (int g = 0; g < 4; ++g) {
                    t[2 * g] = _mm512_unpacklo_pd(h[2 * g], h[2 * g + 1]);
                    t[2 * g + 1] = _mm512_unpackhi_pd(h[2 * g], h[2 * g + 1]);
                }
                for (int j = 0; j < 2; ++j) {
                    vec four[4]; /* columns j, 2 + j, 4 + j, 6 + j */
                    transpose_lanes_f64(t[j], t[2 + j], t[4 + j], t[6 + j], four);
                    for (int L = 0; L < 4; ++L) column[8 * half + 2 * L + j] = four[L];
                }
            }
#else
            transpose_16x16_words(r, column);
#endif
            real *to = out + p * MR;
            for (int64_t c = 0; c < cols; ++c, to += MR) {
#if defined(MATMUL_REAL_DOUBLE)
                vec_storeu(to, column[c]);                                                  /* rows 0..7 */
                vec_storeu_masked(to + 8, (vec_mask)((1u << (MR - 8)) - 1), column[8 + c]); /* rows 8..MR-1 */
#else
                vec_storeu_masked(to, (vec_mask)((1u << MR) - 1), column[c]);
#endif
            }
        }
    }
}

const struct packed_kernel TYPED(packed_avx512) = {MR, NR, kernel, direct, pack_a};

#endif
