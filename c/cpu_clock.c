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

/* Sixteen dependent adds per loop iteration, so the loop's own counter and branch (which
 * run in parallel on other ALUs) do not set the pace: each iteration takes 16 cycles. */
#if defined(__x86_64__) || defined(__i386__)
#define ADD_ONCE "add %1, %0\n\t"
#elif defined(__aarch64__)
#define ADD_ONCE "add %0, %0, %1\n\t"
#endif

static double adds_per_second(int64_t n) {
    uint64_t x = 0;
    double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i) {
#ifdef ADD_ONCE
        __asm__ volatile(ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE
                             ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE ADD_ONCE
                         : "+r"(x)
                         : "r"((uint64_t)i));
#else /* other ISAs: the compiler's chain; may under-report the clock if it adds overhead */
        for (int k = 0; k < 16; ++k) {
            x += (uint64_t)i;
            __asm__ volatile("" : "+r"(x));
        }
#endif
    }
    double t1 = now_seconds();
    __asm__ volatile("" ::"r"(x));
    return 16.0 * (double)n / (t1 - t0);
}

/* The core's clock in GHz. */
MATMUL_API double matmul_measure_clock_ghz(void) {
    const int64_t n = 1000 * 1000; /* 16 M adds: about 5 ms at 3 GHz, short enough to often run undisturbed */
    double best = 0;
    for (int trial = 0; trial < 40; ++trial) { /* best of many: noise only ever slows a run down */
        double rate = adds_per_second(n);
        if (rate > best) best = rate;
    }
    return best * 1e-9;
}
