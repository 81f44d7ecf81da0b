/* Measure the core clock, for the "% of peak" column.
 *
 * A chain of dependent integer adds retires one add per cycle on every x86-64 and ARM core
 * of the last decade, so cycles = adds and GHz = adds / seconds. /proc/cpuinfo's "cpu MHz"
 * is the nominal clock, not the boost clock the kernels actually run at.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <time.h>
#include "matmul.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double adds_per_second(int64_t n) {
    uint64_t x = 0;
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i) {
        x += (uint64_t)i;
        __asm__ volatile("" : "+r"(x)); /* keep the chain: one add per iteration, not folded */
    }
    double t1 = now_seconds();
    __asm__ volatile("" ::"r"(x));
    return (double)n / (t1 - t0);
}

double matmul_measure_clock_ghz(void) {
    const int64_t n = 200 * 1000 * 1000;
    double best = 0;
    for (int trial = 0; trial < 5; ++trial) { /* best of five: noise only ever slows a run down */
        double rate = adds_per_second(n);
        if (rate > best) best = rate;
    }
    return best * 1e-9;
}
