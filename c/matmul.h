/* The C matmuls, one signature for every version.
 *
 * Row-major C = A @ B with A [M, K], B [K, N], C [M, N]; every pointer is to a contiguous
 * row-major array. C is overwritten, never accumulated into. No function keeps state between
 * calls (no static buffers), so all of them may run on several threads at once.
 *
 * The harness reads this header to declare the functions to cffi: keep it to plain
 * declarations (no macros other than the include guard).
 */
#ifndef MATMUL_H
#define MATMUL_H

#include <stdint.h>

/* naive.c: the textbook loop orders, no blocking. */
void matmul_naive_ijk_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K);
void matmul_naive_ijk_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K);
void matmul_naive_ikj_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K);
void matmul_naive_ikj_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K);

/* blocked.c: the ikj loop run tile by tile, tile edge `tile` (>= 1) in all three dimensions.
 * Returns 0, or -1 if its tile buffer cannot be allocated. */
int matmul_blocked_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K, int64_t tile);
int matmul_blocked_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K, int64_t tile);

/* cpu_clock.c: the core's clock in GHz, measured with a chain of dependent adds. */
double matmul_measure_clock_ghz(void);

#endif
