/* The C matmuls, one signature for every version.
 *
 * Row-major C = A @ B with A [M, K], B [K, N], C [M, N]; every pointer is to a contiguous
 * row-major array. C is overwritten, never accumulated into. All of them may run on several
 * threads at once: the only state kept between calls is the packed matmul's thread pool and
 * per-thread pack buffers, which are built for that (packed.c, thread_pool.c).
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

/* goto.c: the five-loop Goto/BLIS algorithm with packing and one portable micro-kernel.
 * Returns 0, or -1 if its pack buffers cannot be allocated. */
int matmul_goto_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K);
int matmul_goto_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K);

/* packed.c: the Goto/BLIS packed SIMD matmul. threads <= 0 uses every online core; variant
 * 0 = auto (the best this CPU supports), 1 = portable C, 2 = AVX2+FMA, 3 = AVX-512. Returns 0
 * on success, 1 for a variant this CPU or build cannot run, 2 if the pack buffers cannot be
 * allocated, 3 for a negative dimension. The result is the same for every thread count. */
int matmul_packed_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K, int64_t threads, int64_t variant);
int matmul_packed_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K, int64_t threads, int64_t variant);
/* The same, through a chosen path (packed.c): 0 = by shape (what matmul_packed does), 1 = the
 * vector path (M = 1 or N = 1 only; else returns 4), 2 = direct (no packing), 3 = the packed
 * loop nest. For comparing the paths on one shape; every path gives a correct product. */
int matmul_packed_path_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K, int64_t threads, int64_t variant, int64_t path);
int matmul_packed_path_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K, int64_t threads, int64_t variant, int64_t path);
/* 1 if this CPU and build can run the variant, else 0. */
int matmul_packed_variant_supported(int64_t variant);
/* The variant that `variant` runs as (auto resolved), or -1 if it cannot run here. */
int64_t matmul_packed_resolve_variant(int64_t variant);
/* Fills sizes[0..7] with MR, NR, KC, MC, NC and the L1, L2, L3 sizes (bytes) they were derived
 * from, for a variant and an element size (4 or 8). Returns as matmul_packed_f32 does. */
int matmul_packed_blocking(int64_t variant, int64_t elem_size, int64_t *sizes);

/* cpu_clock.c: the core's clock in GHz, measured with a chain of dependent adds. */
double matmul_measure_clock_ghz(void);

/* cpu_roofs.c: one core's FMA throughput in GFLOP/s for 4- or 8-byte floats, best of `trials`
 * (the median written to *median_gflops when not NULL); 0 where it cannot be measured. */
double matmul_measure_fma_gflops(int64_t elem_size, int64_t trials, double *median_gflops);
/* cpu_roofs.c: one core streaming `bytes` of memory in, GB/s, best of `trials` (median to
 * *median_gbps when not NULL); 0 if the buffer cannot be allocated. */
double matmul_measure_read_gbps(int64_t bytes, int64_t trials, double *median_gbps);

/* build_isa.c: the instruction-set extensions (beyond plain x86-64) this build was compiled
 * for, space-separated into out[0:size]; and of those, the ones this CPU lacks. Both return
 * how many they wrote, or -1 if out is too small. Safe to call on any CPU. */
int64_t matmul_build_isa(char *out, int64_t size);
int64_t matmul_build_missing_isa(char *out, int64_t size);

#endif
