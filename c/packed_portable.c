/* Portable micro-kernel of the packed matmul: plain C, for any CPU (ARM, RISC-V, an x86-64
 * without AVX2, or a build whose SIMD kernels are unusable). Written once over `real` and
 * compiled for float32 and float64 (real.h).
 *
 * Technique: the same register-blocked MR x NR tile as the SIMD kernels, written as loops over
 * a small local array with compile-time bounds. The compiler keeps the array in registers and
 * vectorizes the j loop with whatever SIMD the build targets (SSE2 on a plain x86-64 build,
 * NEON on arm64, AVX2 under -march=native), so it is far faster than the blocked kernel even
 * without intrinsics, though slower than the hand-written ones: no control over register
 * allocation or instruction choice.
 *
 * Tile size: 4 x 32 bytes (4 x 8 float32, 4 x 4 float64) is 8 accumulators of 128 bits, which
 * fits the 16 registers of SSE2 with room for the B row and the broadcast A value; larger
 * tiles spill there. NEON's 32 registers could take more, but this kernel aims at "correct
 * and decent everywhere", not at the best on any one CPU. It computes all MR rows whatever m
 * is (the padding rows are zeros): simple, and this kernel is not the fast path anywhere.
 *
 * Caveat: with -ffp-contract=fast (GCC's default in GNU C mode) the compiler may fuse the
 * multiply-add or not, so results can differ from the SIMD kernels in the last bit; they are
 * still the same for every thread count, since every element runs the same code.
 */
#include "packed.h"
#include "real.h"

enum { MR = 4, NR = 32 / sizeof(real) };

void TYPED(packed_store_edge)(const real *tile, int64_t nr, real *C, int64_t ldc, int64_t m, int64_t n,
                              int accumulate) {
    for (int64_t i = 0; i < m; ++i) {
        real *row = C + i * ldc;
        const real *values = tile + i * nr;
        if (accumulate)
            for (int64_t j = 0; j < n; ++j) row[j] += values[j];
        else
            for (int64_t j = 0; j < n; ++j) row[j] = values[j];
    }
}

static void kernel(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
                   int accumulate) {
    const real *restrict a = Ap;
    const real *restrict b = Bp;
    real c[MR][NR] = {{0}};
    for (int64_t p = 0; p < kc; ++p) {
        for (int i = 0; i < MR; ++i)
            for (int j = 0; j < NR; ++j) c[i][j] += a[i] * b[j];
        a += MR;
        b += NR;
    }
    TYPED(packed_store_edge)(&c[0][0], NR, C, ldc, m, n, accumulate);
}

/* The direct kernel: the same tile, with each step's MR values of A and NR values of B
 * gathered from the matrices into zero-padded local rows, so the arithmetic is the packed
 * kernel's and nothing outside the m x k and k x n blocks is read. */
static void direct(int64_t k, const void *A_, int64_t lda, const void *B_, int64_t ldb, void *C, int64_t ldc, int64_t m,
                   int64_t n) {
    const real *A = A_, *B = B_;
    real c[MR][NR] = {{0}};
    for (int64_t p = 0; p < k; ++p) {
        real a[MR] = {0}, b[NR] = {0};
        for (int64_t i = 0; i < m; ++i) a[i] = A[i * lda + p];
        for (int64_t j = 0; j < n; ++j) b[j] = B[p * ldb + j];
        for (int i = 0; i < MR; ++i)
            for (int j = 0; j < NR; ++j) c[i][j] += a[i] * b[j];
    }
    TYPED(packed_store_edge)(&c[0][0], NR, C, ldc, m, n, 0);
}

const struct packed_kernel TYPED(packed_portable) = {MR, NR, kernel, direct, NULL};
