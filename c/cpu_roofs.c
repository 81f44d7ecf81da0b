/* Measure the roofs: one core's FMA throughput with its widest SIMD unit, and the rate at which
 * one core, or several, stream memory in.
 *
 * "% of peak" used to be clock x lanes x 2 x an assumed two FMA units, with the clock from a
 * short add chain: on a busy virtual machine that clock came out low (1.7-2.0 GHz for a 3 GHz
 * core) and NumPy showed 124-136% of "peak". Here the roof is measured as the quantity it is:
 * twelve independent chains of vector FMAs (enough to cover the FMA latency on two pipes), run
 * for a few milliseconds, best of many trials, since noise only ever slows a trial down.
 * Returns GFLOP/s of one core (an FMA counts two), or 0 where no FMA SIMD unit is known.
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* posix_memalign and madvise under a strict -std=c11 */
#endif
#include <stdint.h>
#include <time.h>
#include "matmul.h"
#include "thread_pool.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f")))
#define AVX2   __attribute__((target("avx2,fma")))

enum { CHAINS = 12 };
static volatile double sink;

/* One trial: n rounds of CHAINS independent FMAs; returns FLOP/s. The four trials are the same
 * loop spelled out for each vector type: AVX-512 float32 (16 lanes), ... */
static AVX512 double trial_avx512_f32(int64_t n) {
    __m512 acc[CHAINS];
    const __m512 a = _mm512_set1_ps((float)0.999999), b = _mm512_set1_ps((float)1e-7);
    for (int j = 0; j < CHAINS; ++j) acc[j] = _mm512_set1_ps((float)(j + 1));
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i) /* the chains stay in registers: no barrier */
        for (int j = 0; j < CHAINS; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
    double t1 = now_seconds();
    __m512 total = acc[0];
    for (int j = 1; j < CHAINS; ++j) total = _mm512_add_ps(total, acc[j]);
    float lanes[16];
    __builtin_memcpy(lanes, &total, sizeof lanes);
    sink = (double)lanes[0];
    return 2.0 * 16 * CHAINS * (double)n / (t1 - t0);
}

/* ... AVX-512 float64 (8 lanes), ... */
static AVX512 double trial_avx512_f64(int64_t n) {
    __m512d acc[CHAINS];
    const __m512d a = _mm512_set1_pd(0.999999), b = _mm512_set1_pd(1e-7);
    for (int j = 0; j < CHAINS; ++j) acc[j] = _mm512_set1_pd((double)(j + 1));
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i) /* the chains stay in registers: no barrier */
        for (int j = 0; j < CHAINS; ++j) acc[j] = _mm512_fmadd_pd(acc[j], a, b);
    double t1 = now_seconds();
    __m512d total = acc[0];
    for (int j = 1; j < CHAINS; ++j) total = _mm512_add_pd(total, acc[j]);
    double lanes[8];
    __builtin_memcpy(lanes, &total, sizeof lanes);
    sink = (double)lanes[0];
    return 2.0 * 8 * CHAINS * (double)n / (t1 - t0);
}

/* ... AVX2 float32 (8 lanes), ... */
static AVX2 double trial_avx2_f32(int64_t n) {
    __m256 acc[CHAINS];
    const __m256 a = _mm256_set1_ps((float)0.999999), b = _mm256_set1_ps((float)1e-7);
    for (int j = 0; j < CHAINS; ++j) acc[j] = _mm256_set1_ps((float)(j + 1));
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i) /* the chains stay in registers: no barrier */
        for (int j = 0; j < CHAINS; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
    double t1 = now_seconds();
    __m256 total = acc[0];
    for (int j = 1; j < CHAINS; ++j) total = _mm256_add_ps(total, acc[j]);
    float lanes[8];
    __builtin_memcpy(lanes, &total, sizeof lanes);
    sink = (double)lanes[0];
    return 2.0 * 8 * CHAINS * (double)n / (t1 - t0);
}

/* ... and AVX2 float64 (4 lanes). */
static AVX2 double trial_avx2_f64(int64_t n) {
    __m256d acc[CHAINS];
    const __m256d a = _mm256_set1_pd(0.999999), b = _mm256_set1_pd(1e-7);
    for (int j = 0; j < CHAINS; ++j) acc[j] = _mm256_set1_pd((double)(j + 1));
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i) /* the chains stay in registers: no barrier */
        for (int j = 0; j < CHAINS; ++j) acc[j] = _mm256_fmadd_pd(acc[j], a, b);
    double t1 = now_seconds();
    __m256d total = acc[0];
    for (int j = 1; j < CHAINS; ++j) total = _mm256_add_pd(total, acc[j]);
    double lanes[4];
    __builtin_memcpy(lanes, &total, sizeof lanes);
    sink = (double)lanes[0];
    return 2.0 * 4 * CHAINS * (double)n / (t1 - t0);
}

/* Best of `trials` runs of `trial` (its rate per second), the median to *median when not NULL;
 * 0 where there is no trial. */
static double best_of(double (*trial)(int64_t), int64_t trials, double *median) {
    if (!trial || trials < 1) {
        if (median) *median = 0.0;
        return 0.0;
    }
    double rates[64];
    if (trials > 64) trials = 64;
    const int64_t n = 400 * 1000; /* about 2-5 ms per trial */
    trial(n / 10);                /* wake the vector unit (AVX-512 licence, frequency) */
    double best = 0;
    for (int64_t t = 0; t < trials; ++t) {
        rates[t] = trial(n);
        if (rates[t] > best) best = rates[t];
    }
    if (median) { /* insertion sort: a handful of values */
        for (int64_t i = 1; i < trials; ++i)
            for (int64_t j = i; j > 0 && rates[j] < rates[j - 1]; --j) {
                double swap = rates[j];
                rates[j] = rates[j - 1];
                rates[j - 1] = swap;
            }
        *median = rates[trials / 2] * 1e-9;
    }
    return best * 1e-9;
}

/* One core's FMA throughput in GFLOP/s for 4- or 8-byte floats, best of `trials` (the median
 * written to *median_gflops when not NULL); 0 where it cannot be measured. */
MATMUL_API double matmul_measure_fma_gflops(int64_t elem_size, int64_t trials, double *median_gflops) {
    double (*trial)(int64_t) = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        trial = elem_size == 4 ? trial_avx512_f32 : trial_avx512_f64;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        trial = elem_size == 4 ? trial_avx2_f32 : trial_avx2_f64;
    return best_of(trial, trials, median_gflops);
}

/* The int8 roof, for the kernels that multiply bytes (c.decode_int8, llama.cpp's): one core's
 * rate of int8 multiply-adds, in GOP/s (a multiply-add counts two, as for the FMA roof), with
 * the instruction the int8 kernels here use on it: AVX-512 VNNI's vpdpbusd (64 byte products
 * into int32 lanes), else AVX2's vpmaddubsw (32, summed in pairs into int16 lanes; a kernel
 * that needs exact int32 sums of signed bytes, as q8_0 does, spends a vpmaddwd per vpmaddubsw
 * beside it, so reaches at most half of this roof). CHAINS independent chains, each
 * instruction's result the next one's operand, so nothing can be hoisted out of the loop; the
 * values wrap or saturate, which changes nothing in the timing. */
#define VNNI512 __attribute__((target("avx512f,avx512bw,avx512vnni")))

static VNNI512 double trial_vnni_int8(int64_t n) {
    __m512i acc[CHAINS];
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
    for (int j = 0; j < CHAINS; ++j) acc[j] = _mm512_set1_epi32(j);
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i)
        for (int j = 0; j < CHAINS; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
    double t1 = now_seconds();
    __m512i total = acc[0];
    for (int j = 1; j < CHAINS; ++j) total = _mm512_add_epi32(total, acc[j]);
    uint32_t lanes[16]; /* summed unsigned: the chains wrap, and a signed sum would overflow (UB) */
    __builtin_memcpy(lanes, &total, sizeof lanes);
    uint32_t sum = 0;
    for (int j = 0; j < 16; ++j) sum += lanes[j];
    sink = (double)sum;
    return 2.0 * 64 * CHAINS * (double)n / (t1 - t0);
}

static AVX2 double trial_avx2_int8(int64_t n) {
    __m256i acc[CHAINS];
    const __m256i b = _mm256_set1_epi8(-5);
    for (int j = 0; j < CHAINS; ++j) acc[j] = _mm256_set1_epi8((char)(j + 1));
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i)
        for (int j = 0; j < CHAINS; ++j) acc[j] = _mm256_maddubs_epi16(acc[j], b);
    double t1 = now_seconds();
    __m256i total = acc[0];
    for (int j = 1; j < CHAINS; ++j) total = _mm256_add_epi16(total, acc[j]);
    short lanes[16];
    __builtin_memcpy(lanes, &total, sizeof lanes);
    sink = (double)lanes[0];
    return 2.0 * 32 * CHAINS * (double)n / (t1 - t0);
}

/* One core's int8 roof in GOP/s, best of `trials` (the median to *median_gops when not NULL);
 * 0 where neither instruction exists. */
MATMUL_API double matmul_measure_int8_gops(int64_t trials, double *median_gops) {
    double (*trial)(int64_t) = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        trial = trial_vnni_int8;
    else if (__builtin_cpu_supports("avx2"))
        trial = trial_avx2_int8;
    return best_of(trial, trials, median_gops);
}

/* The BF16 roof, for c.bf16 and torch's bfloat16 matmul: one core's rate of AVX512_BF16's
 * vdpbf16ps (16 float32 lanes, each adding the products of a pair of bfloat16s: 64 FLOPs an
 * instruction), BF16_CHAINS independent chains: its latency is longer than an FMA's (on a Zen 5,
 * 12 chains reached 510 GFLOP/s and 16 chains 549, twice the float32 FMA roof; 20 spill). Measured
 * only where c.bf16 runs that instruction (bf16.c's choice): on a CPU with AMX it runs the tile
 * unit, whose rate this does not give. */
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
enum { BF16_CHAINS = 16 };

static AVX512BF16 double trial_avx512_bf16(int64_t n) {
    __m512 acc[BF16_CHAINS];
    /* bfloat16 1.0 and about 1e-7: the sums grow by a little each round, never to inf */
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x33d7);
    for (int j = 0; j < BF16_CHAINS; ++j) acc[j] = _mm512_set1_ps((float)(j + 1));
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i)
        for (int j = 0; j < BF16_CHAINS; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    double t1 = now_seconds();
    __m512 total = acc[0];
    for (int j = 1; j < BF16_CHAINS; ++j) total = _mm512_add_ps(total, acc[j]);
    float lanes[16];
    __builtin_memcpy(lanes, &total, sizeof lanes);
    sink = (double)lanes[0];
    return 4.0 * 16 * BF16_CHAINS * (double)n / (t1 - t0);
}

enum { BF16_VARIANT_AVX512BF16 = 4 }; /* bf16.c's number for the variant */
int64_t matmul_bf16_resolve_variant(int64_t variant);

/* One core's BF16 roof in GFLOP/s, best of `trials` (the median to *median_gflops when not
 * NULL); 0 where c.bf16 does not run vdpbf16ps (no AVX512_BF16, or AMX instead). */
MATMUL_API double matmul_measure_bf16_gflops(int64_t trials, double *median_gflops) {
    const int runs = matmul_bf16_resolve_variant(0) == BF16_VARIANT_AVX512BF16;
    return best_of(runs ? trial_avx512_bf16 : 0, trials, median_gflops);
}
#else
MATMUL_API double matmul_measure_fma_gflops(int64_t elem_size, int64_t trials, double *median_gflops) {
    (void)elem_size;
    (void)trials;
    if (median_gflops) *median_gflops = 0.0;
    return 0.0; /* not measured here: the harness falls back to clock x lanes x FMA units */
}

MATMUL_API double matmul_measure_int8_gops(int64_t trials, double *median_gops) {
    (void)trials;
    if (median_gops) *median_gops = 0.0;
    return 0.0; /* not measured here: no int8 roof */
}

MATMUL_API double matmul_measure_bf16_gflops(int64_t trials, double *median_gflops) {
    (void)trials;
    if (median_gflops) *median_gflops = 0.0;
    return 0.0; /* not measured here: no BF16 roof */
}
#endif

/* The memory roof: one core summing a buffer far larger than the caches with 64-bit integer
 * adds (integer adds may be reordered, so the compiler vectorizes them; a float sum it may not). Bytes read per second, best of `trials` (median to *median_gbps).
 * Returns 0 if the buffer cannot be allocated. */
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

enum { STREAMS = 8, MAX_READ_THREADS = 64 };

/* The buffer the roof is read from, in pages as large as the operands' where the system allows
 * it: NumPy asks Linux for transparent huge pages for its large arrays, and with 4 KiB pages
 * the TLB misses alone held one core to 15 GB/s over 1 GiB (27 GB/s over 256 MiB) on this
 * project's Zen 4, below what a GEMV over a NumPy array read. NULL if it cannot be had. */
static uint64_t *roof_buffer(size_t bytes) {
    void *memory = NULL;
    if (posix_memalign(&memory, (size_t)2 << 20, bytes)) return NULL;
#if defined(MADV_HUGEPAGE)
    madvise(memory, bytes, MADV_HUGEPAGE); /* a hint: refused, the pages stay small */
#endif
    return memory;
}

/* STREAMS sequential streams at once, one per equal part of the slice: one stream alone is
 * held back by how far the prefetcher runs ahead, where several (as a GEMV walks several rows)
 * keep more memory requests in flight. Returns a sum of what it read, so none of it is skipped. */
static uint64_t stream_in(const uint64_t *data, int64_t count) {
    const int64_t part = count / STREAMS / 8 * 8;
    uint64_t lanes[STREAMS][8] = {{0}};
    for (int64_t i = 0; i < part; i += 8)
        for (int s = 0; s < STREAMS; ++s)
            for (int j = 0; j < 8; ++j) lanes[s][j] += data[s * part + i + j];
    uint64_t total = 0;
    for (int s = 0; s < STREAMS; ++s)
        for (int j = 0; j < 8; ++j) total += lanes[s][j];
    return total;
}

struct read_job {
    const uint64_t *data;
    int64_t per_thread; /* words, a multiple of 8 * STREAMS */
    uint64_t totals[MAX_READ_THREADS];
};

static void read_task(void *context, int64_t part) {
    struct read_job *job = context;
    job->totals[part] = stream_in(job->data + part * job->per_thread, job->per_thread);
}

/* `threads` cores of the persistent pool (thread_pool.c, as the kernels use it) streaming
 * `bytes` of memory in, each its own contiguous slice: GB/s, best of `trials` (median to
 * *median_gbps when not NULL); 0 if the buffer cannot be allocated. The memory roof that a
 * bandwidth-bound kernel on that many threads is measured against. */
MATMUL_API double matmul_measure_read_gbps_threads(int64_t bytes, int64_t trials, int64_t threads,
                                                   double *median_gbps) {
    if (threads < 1) threads = 1;
    if (threads > MAX_READ_THREADS) threads = MAX_READ_THREADS;
    const int64_t per_thread = bytes / 8 / threads / (8 * STREAMS) * (8 * STREAMS);
    if (per_thread < 8 * STREAMS || trials < 1) return 0.0;
    if (trials > 64) trials = 64;
    const int64_t count = per_thread * threads;
    uint64_t *data = roof_buffer((size_t)count * sizeof *data);
    if (!data) return 0.0;
    for (int64_t i = 0; i < count; ++i) data[i] = (uint64_t)i; /* touch every page before timing */
    struct read_job job = {data, per_thread, {0}};
    pool_run(threads, read_task, &job); /* wakes the workers up before the timed trials */
    double rates[64], best = 0;
    for (int64_t t = 0; t < trials; ++t) {
        double t0 = now_seconds();
        pool_run(threads, read_task, &job);
        double t1 = now_seconds();
        uint64_t total = 0;
        for (int64_t p = 0; p < threads; ++p) total += job.totals[p];
        __asm__ volatile("" : : "r"(total));
        rates[t] = 8.0 * (double)count / (t1 - t0);
        if (rates[t] > best) best = rates[t];
    }
    free(data);
    if (median_gbps) {
        for (int64_t i = 1; i < trials; ++i)
            for (int64_t j = i; j > 0 && rates[j] < rates[j - 1]; --j) {
                double swap = rates[j];
                rates[j] = rates[j - 1];
                rates[j - 1] = swap;
            }
        *median_gbps = rates[trials / 2] * 1e-9;
    }
    return best * 1e-9;
}

/* One core streaming `bytes` of memory in, GB/s, best of `trials` (median to *median_gbps when
 * not NULL); 0 if the buffer cannot be allocated. */
MATMUL_API double matmul_measure_read_gbps(int64_t bytes, int64_t trials, double *median_gbps) {
    return matmul_measure_read_gbps_threads(bytes, trials, 1, median_gbps);
}
