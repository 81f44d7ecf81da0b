/* Naive matmuls: the same triple loop in two orders.
 *
 * ijk is the definition: C[i][j] is the dot product of row i of A with column j of B. Its
 * inner loop walks B down a column, N elements apart, so every multiply touches a new cache
 * line, and the running sum is one serial chain of adds the compiler may not reorder (that
 * would change the rounding), so it cannot vectorize.
 *
 * ikj (the i, p, j order) computes the same sums as rank-1 updates of one row of C:
 * C[i][:] += A[i][p] * B[p][:]. Its inner loop reads B and C with unit stride and its
 * iterations are independent, so the compiler vectorizes it. Same FLOPs, many times faster:
 * loop order alone decides how well the caches and SIMD units are used.
 *
 * Exactly the arithmetic written here: this file is compiled with -ffp-contract=off
 * (CMakeLists.txt), so each `a * b` is rounded before it is added, never fused into one FMA.
 * Both orders then sum every C[i][j] with the same operations in the same order (p rising,
 * from zero), and give the same bits as each other and as blocked.c, on every CPU and vector
 * width. (c.packed fuses, as every fast kernel does; it agrees with these within the error
 * model, not bit for bit.)
 *
 * Written once over `real` and compiled for float32 and float64 (real.h).
 * Shapes: A [M, K], B [K, N], C [M, N], row-major.
 */
#include <string.h>
#include "matmul.h"
#include "real.h"

MATMUL_API void TYPED(matmul_naive_ijk)(const real *A, const real *B, real *C, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            real sum = 0;
            for (int64_t p = 0; p < K; ++p) sum += A[i * K + p] * B[p * N + j];
            C[i * N + j] = sum;
        }
}

MATMUL_API void TYPED(matmul_naive_ikj)(const real *restrict A, const real *restrict B, real *restrict C, int64_t M,
                                        int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; ++i) {
        real *restrict c_row = C + i * N;
        memset(c_row, 0, (size_t)N * sizeof(real));
        for (int64_t p = 0; p < K; ++p) {
            const real a_ip = A[i * K + p];
            const real *restrict b_row = B + p * N;
            for (int64_t j = 0; j < N; ++j) c_row[j] += a_ip * b_row[j];
        }
    }
}
