/* Measure one core's arithmetic roof: the FMA throughput its widest SIMD unit sustains.
 *
 * "% of peak" used to be clock x lanes x 2 x an assumed two FMA units, with the clock from a
 * short add chain: on a busy virtual machine that clock came out low (1.7-2.0 GHz for a 3 GHz
 * core) and NumPy showed 124-136% of "peak". Here the roof is measured as the quantity it is:
 * twelve independent chains of vector FMAs (enough to cover the FMA latency on two pipes), run
 * for a few milliseconds, best of many trials, since noise only ever slows a trial down.
 * Returns GFLOP/s of one core (an FMA counts two), or 0 where no FMA SIMD unit is known.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <time.h>
#include "matmul.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma")))

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { CHAINS = 12 };
static volatile double sink;

/* One trial: n rounds of CHAINS independent FMAs; returns FLOP/s. */
#define FMA_TRIAL(NAME, ATTR, VEC, SET1, FMADD, ADD, LANES, SCALAR)                      \
    static ATTR double NAME(int64_t n) {                                                \
        VEC acc[CHAINS];                                                                \
        const VEC a = SET1((SCALAR)0.999999), b = SET1((SCALAR)1e-7);                    \
        for (int j = 0; j < CHAINS; ++j) acc[j] = SET1((SCALAR)(j + 1));                 \
        double t0 = now_seconds();                                                      \
        for (int64_t i = 0; i < n; ++i)  /* the chains stay in registers: no barrier */  \
            for (int j = 0; j < CHAINS; ++j) acc[j] = FMADD(acc[j], a, b);              \
        double t1 = now_seconds();                                                      \
        VEC total = acc[0];                                                             \
        for (int j = 1; j < CHAINS; ++j) total = ADD(total, acc[j]);                    \
        SCALAR lanes[LANES];                                                            \
        __builtin_memcpy(lanes, &total, sizeof lanes);                                  \
        sink = (double)lanes[0];                                                        \
        return 2.0 * LANES * CHAINS * (double)n / (t1 - t0);                            \
    }

FMA_TRIAL(trial_avx512_f32, AVX512, __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, 16, float)
FMA_TRIAL(trial_avx512_f64, AVX512, __m512d, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_add_pd, 8, double)
FMA_TRIAL(trial_avx2_f32, AVX2, __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, 8, float)
FMA_TRIAL(trial_avx2_f64, AVX2, __m256d, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_add_pd, 4, double)

double matmul_measure_fma_gflops(int64_t elem_size, int64_t trials, double *median_gflops) {
    double (*trial)(int64_t) = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        trial = elem_size == 4 ? trial_avx512_f32 : trial_avx512_f64;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        trial = elem_size == 4 ? trial_avx2_f32 : trial_avx2_f64;
    if (!trial || trials < 1) return 0.0;
    double rates[64];
    if (trials > 64) trials = 64;
    const int64_t n = 400 * 1000; /* about 2-5 ms per trial */
    trial(n / 10);                 /* wake the vector unit (AVX-512 licence, frequency) */
    double best = 0;
    for (int64_t t = 0; t < trials; ++t) {
        rates[t] = trial(n);
        if (rates[t] > best) best = rates[t];
    }
    if (median_gflops) { /* insertion sort: a handful of values */
        for (int64_t i = 1; i < trials; ++i)
            for (int64_t j = i; j > 0 && rates[j] < rates[j - 1]; --j) {
                double swap = rates[j]; rates[j] = rates[j - 1]; rates[j - 1] = swap;
            }
        *median_gflops = rates[trials / 2] * 1e-9;
    }
    return best * 1e-9;
}
#else
double matmul_measure_fma_gflops(int64_t elem_size, int64_t trials, double *median_gflops) {
    (void)elem_size; (void)trials;
    if (median_gflops) *median_gflops = 0.0;
    return 0.0; /* not measured here: the harness falls back to clock x lanes x FMA units */
}
#endif
