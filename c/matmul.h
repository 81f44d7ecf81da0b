/* The C matmuls, one signature for every version.
 *
 * Row-major C = A @ B with A [M, K], B [K, N], C [M, N]; every pointer is to a contiguous
 * row-major array. C is overwritten, never accumulated into. All of them may run on several
 * threads at once: the only state kept between calls is the packed matmul's thread pool and
 * per-thread pack buffers, which are built for that (packed.c, thread_pool.c).
 *
 *     MATMUL_API void TYPED(matmul_<technique>)(const real *A, const real *B, real *C,
 *                                               int64_t M, int64_t N, int64_t K, ...options) {
 *
 * Each function the harness calls is declared where it is defined, not here: MATMUL_API marks
 * its definition in its c/<file>.c, just before the return type, and the harness gathers the
 * marked definitions of every c/<file>.c into the declarations it gives cffi (harness/backends/c/call_glue.py).
 * Everything from the mark to the end of the parameter list must be plain C: no other macro
 * but TYPED (real.h), no attributes (put those before the mark). A file that includes real.h
 * exports each marked function twice, as name_f32 and name_f64. A name is marked in one file
 * only; unmarked functions are the library's own business and may change freely.
 */
#ifndef MATMUL_H
#define MATMUL_H

#include <stdint.h>

#define MATMUL_API __attribute__((visibility("default")))

/* The smaller and the larger of two sizes (every dimension, index and count here is an int64_t). */
static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

#endif
