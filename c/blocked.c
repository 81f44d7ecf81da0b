/* Cache-blocked matmul: the ikj loop of naive.c, run one tile at a time.
 *
 * What blocking buys: naive ikj streams all of B (K x N) once per row of A. Once B outgrows
 * the L2 cache (1024 x 1024 float32 is 4 MiB), every row of A re-reads B from L3 or memory.
 * Here the loops over i, p and j are cut into tiles of edge `tile`, and the p-j tile of B
 * (tile x tile elements: 64 x 64 float32 = 16 KiB) is reused by every row of the i tile
 * while it still sits in L1/L2. The rows of C being updated (tile elements each) stay in L1
 * across the p loop.
 *
 * Loop order (jj, pp, ii, i, p, j): the B tile chosen by (pp, jj) is the one reused; ii walks
 * every row of A past it. The innermost loop is still the unit-stride, restrict-qualified
 * j loop of ikj, so the compiler vectorizes it exactly as before; blocking only changes which
 * level of the memory hierarchy feeds it.
 *
 * What it does not do (that is packed SIMD's job, the next step): keep C in registers, pack
 * A and B into contiguous panels, or pick a different block size per cache level.
 *
 * Shapes: A [M, K], B [K, N], C [M, N], row-major; tile >= 1 (the harness checks).
 */
#include <string.h>
#include "matmul.h"

static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

#define DEFINE_BLOCKED(T, SUFFIX)                                                             \
    void matmul_blocked_##SUFFIX(const T *restrict A, const T *restrict B, T *restrict C,    \
                                 int64_t M, int64_t N, int64_t K, int64_t tile) {             \
        if (tile < 1) tile = 1;                                                               \
        if (M > 0 && N > 0) memset(C, 0, (size_t)M * (size_t)N * sizeof(T));                 \
        for (int64_t jj = 0; jj < N; jj += tile) {                                            \
            const int64_t j_end = min_i64(jj + tile, N);                                      \
            for (int64_t pp = 0; pp < K; pp += tile) {                                        \
                const int64_t p_end = min_i64(pp + tile, K);                                  \
                for (int64_t ii = 0; ii < M; ii += tile) {                                    \
                    const int64_t i_end = min_i64(ii + tile, M);                              \
                    for (int64_t i = ii; i < i_end; ++i) {                                    \
                        T *restrict c_row = C + i * N;                                        \
                        for (int64_t p = pp; p < p_end; ++p) {                                \
                            const T a_ip = A[i * K + p];                                      \
                            const T *restrict b_row = B + p * N;                              \
                            for (int64_t j = jj; j < j_end; ++j) c_row[j] += a_ip * b_row[j]; \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }

DEFINE_BLOCKED(float, f32)
DEFINE_BLOCKED(double, f64)
