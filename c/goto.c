/* The Goto/BLIS algorithm, plain: five loops around a micro-kernel, with packing.
 *
 * What it changes from blocked.c: blocked.c reuses a tile of B from cache but still walks A and
 * C in place, one row of C in registers at a time. Here every operand is arranged for the level
 * of the memory hierarchy that serves it:
 *   loop 5 (jc): a panel of NC columns of B and C;
 *   loop 4 (pc): KC of the K sum; the KC x NC block of B is packed into Bp, in slivers of NR
 *                columns stored row after row, so the micro-kernel reads it with unit stride.
 *                Bp is sized for the L3 cache, one sliver (KC x NR) for L1;
 *   loop 3 (ic): MC rows of A; the MC x KC block of A is packed into Ap, in slivers of MR rows
 *                stored column after column. Ap is sized for the L2 cache;
 *   loop 2 (jr), loop 1 (ir): one MR x NR tile of C, computed by the micro-kernel.
 * The micro-kernel keeps the whole MR x NR tile of C in registers (an outer product of a column
 * of Ap's sliver and a row of Bp's per k): MR + NR loads for MR * NR multiply-adds, where
 * blocked.c's row chunk needs one load of B per multiply-add. Edge tiles are packed with zeros
 * up to MR and NR, so the micro-kernel has one shape, and only the real part of C is written.
 *
 * What packed.c adds to this (the next rung): micro-kernels written with AVX2 and AVX-512
 * intrinsics and chosen at run time, block sizes derived from the cache sizes the OS reports,
 * threads, and separate paths for GEMV, small problems and small K.
 *
 * Written once over `real` and compiled for float32 and float64 (real.h). Portable C: the
 * compiler vectorizes the micro-kernel's fixed-size loops for whatever CPU the build targets.
 * Shapes: A [M, K], B [K, N], C [M, N], row-major. Returns 0, or -1 when the pack buffers
 * cannot be allocated.
 */
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "real.h"

/* The register tile: 4 x 16 floats (8 AVX2 / 4 AVX-512 accumulators) or 4 x 8 doubles. */
enum { MR = 4, NR = 64 / sizeof(real) };
/* Cache blocks: Ap (MC x KC) is 128 KiB of floats, for a 256 KiB-2 MiB L2; one sliver of Bp
 * (KC x NR) 16 KiB of floats, in L1; Bp (KC x NC) 4 MiB, in L3. */
enum { KC = 256, MC = 128, NC = 4096 };

/* aligned_alloc takes a whole number of alignments */
static inline size_t round_up_64(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* Ap: for each sliver of MR rows, its kc columns one after another (MR values each); rows past
 * mc are zeros. */
static void pack_a(const real *A, int64_t lda, int64_t mc, int64_t kc, real *restrict Ap) {
    for (int64_t i0 = 0; i0 < mc; i0 += MR)
        for (int64_t p = 0; p < kc; ++p)
            for (int64_t i = 0; i < MR; ++i) *Ap++ = i0 + i < mc ? A[(i0 + i) * lda + p] : 0;
}

/* Bp: for each sliver of NR columns, its kc rows one after another (NR values each); columns
 * past nc are zeros. */
static void pack_b(const real *B, int64_t ldb, int64_t kc, int64_t nc, real *restrict Bp) {
    for (int64_t j0 = 0; j0 < nc; j0 += NR)
        for (int64_t p = 0; p < kc; ++p)
            for (int64_t j = 0; j < NR; ++j) *Bp++ = j0 + j < nc ? B[p * ldb + j0 + j] : 0;
}

/* C[0:mr, 0:nr] += Ap_sliver @ Bp_sliver over kc: the MR x NR tile accumulated in registers. */
static void micro_kernel(int64_t kc, const real *restrict a, const real *restrict b, real *restrict C, int64_t ldc,
                         int64_t mr, int64_t nr) {
    real acc[MR][NR] = {{0}};
    for (int64_t p = 0; p < kc; ++p) {
        const real *restrict b_row = b + p * NR;
        /* Fully unrolled: MR x NR accumulators, each row of them one or two vectors (the j
         * loop), named at compile time so that they live in registers across the p loop. */
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
            const real a_ip = a[p * MR + i]; /* one broadcast */
#pragma omp simd
            for (int j = 0; j < NR; ++j) acc[i][j] += a_ip * b_row[j];
        }
    }
    for (int64_t i = 0; i < mr; ++i)
        for (int64_t j = 0; j < nr; ++j) C[i * ldc + j] += acc[i][j];
}

/* Returns 0, or -1 if its pack buffers cannot be allocated. */
MATMUL_API int TYPED(matmul_goto)(const real *restrict A, const real *restrict B, real *restrict C, int64_t M,
                                  int64_t N, int64_t K) {
    if (M > 0 && N > 0) memset(C, 0, (size_t)M * (size_t)N * sizeof(real));
    if (M == 0 || N == 0 || K == 0) return 0;
    const int64_t kc_max = min_i64(KC, K);
    const int64_t mc_max = (min_i64(MC, M) + MR - 1) / MR * MR;
    const int64_t nc_max = (min_i64(NC, N) + NR - 1) / NR * NR;
    /* Allocated per call, so that concurrent calls share nothing; 64-byte aligned for the
     * vector loads of the micro-kernel. */
    real *Ap = aligned_alloc(64, round_up_64((size_t)(mc_max * kc_max) * sizeof(real)));
    real *Bp = aligned_alloc(64, round_up_64((size_t)(kc_max * nc_max) * sizeof(real)));
    if (!Ap || !Bp) {
        free(Ap);
        free(Bp);
        return -1;
    }
    for (int64_t jc = 0; jc < N; jc += NC) { /* loop 5 */
        const int64_t nc = min_i64(NC, N - jc);
        for (int64_t pc = 0; pc < K; pc += KC) { /* loop 4 */
            const int64_t kc = min_i64(KC, K - pc);
            pack_b(B + pc * N + jc, N, kc, nc, Bp);
            for (int64_t ic = 0; ic < M; ic += MC) { /* loop 3 */
                const int64_t mc = min_i64(MC, M - ic);
                pack_a(A + ic * K + pc, K, mc, kc, Ap);
                for (int64_t jr = 0; jr < nc; jr += NR)     /* loop 2 */
                    for (int64_t ir = 0; ir < mc; ir += MR) /* loop 1 */
                        micro_kernel(kc, Ap + ir * kc, Bp + jr * kc, C + (ic + ir) * N + jc + jr, N,
                                     min_i64(MR, mc - ir), min_i64(NR, nc - jr));
            }
        }
    }
    free(Ap);
    free(Bp);
    return 0;
}
