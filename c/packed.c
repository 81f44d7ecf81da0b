/* Packed SIMD matmul (Goto / BLIS): the step after blocked.c.
 *
 * What changes from blocked.c: the blocked kernel reuses tiles from cache but still lets the
 * compiler's vectorized j loop load and store a row of C for every multiply-add, and it reads
 * A and B in place, with strides. Here (Goto & van de Geijn, "Anatomy of High-Performance
 * Matrix Multiplication", 2008; the BLIS loop nest):
 *
 *   - a micro-kernel (packed_avx512.c, packed_avx2.c, packed_portable.c) keeps an MR x NR
 *     tile of C in vector registers for a whole KC-long stretch of the K sum, so the inner
 *     loop is nothing but loads of B, broadcasts of A and FMAs;
 *   - A and B are copied ("packed") into contiguous, aligned, zero-padded panels laid out in
 *     exactly the order the micro-kernel reads them, so every load is unit stride, every
 *     cache line fetched is used whole, and edge tiles need no special case inside the loop;
 *   - three cache-block sizes, one per cache level, derived from the cache sizes:
 *
 *       loop 5  for jc in N step NC     B panel  KC x NC  packed once, lives in L3
 *       loop 4   for pc in K step KC    (the K sum, cut into KC-long pieces)
 *       loop 3    for ic in M step MC   A block  MC x KC  packed once, lives in L2
 *       loop 2     for jr in NC step NR B sliver KC x NR  reused by every ir, lives in L1
 *       loop 1      for ir in MC step MR A micro-panel MR x KC streams in from L2
 *                    micro-kernel: C[ic+ir.., jc+jr..] (+)= A micro-panel x B sliver
 *
 * Block sizes are derived at run time from the cache sizes the OS reports (sysconf on Linux,
 * sysctl on macOS; fixed fallbacks elsewhere), not fixed at build time, so one binary fits
 * the machine it runs on; see derive_blocking for the reasoning.
 *
 * Micro-kernel variant: chosen at run time from cpuid (__builtin_cpu_supports, which also
 * checks that the OS saves the wide registers): AVX-512 if present, else AVX2+FMA, else the
 * portable C kernel. One build therefore runs on any x86-64 and never executes an instruction
 * the CPU lacks; a caller may force a variant, and gets an error code if the CPU lacks it.
 *
 * Threads: POSIX threads, created per call (no pool, no static state: the functions are
 * re-entrant and may run on several caller threads at once). pthreads rather than OpenMP
 * because Apple's clang ships without OpenMP and because two or three explicit threads over
 * disjoint blocks of C need nothing more. C is cut into a grid of disjoint blocks (along M
 * and N, in whole MR x NR tiles), one per thread, each thread running the full loop nest
 * above on its block with its own pack buffers. The K sum is never split, and each C element
 * is computed by the same FMA chain whichever thread computes it, so the result is bitwise
 * identical for every thread count.
 *
 * Caveats: each thread packs the part of A (or B) its block needs, so when the grid cuts
 * both dimensions the panels of the other operand are packed more than once (a small cost
 * next to 2*M*N*K for large problems; a shared-panel scheme with barriers, as BLIS uses on
 * many-core machines, would avoid it). Results may differ in the last bits from other
 * variants and other machines (different tile shapes, different KC), never across threads.
 *
 * Shapes: A [M, K], B [K, N], C [M, N], row-major, contiguous. C is overwritten.
 * Returns 0, or PACKED_ERR_* below.
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* posix_memalign and the cache-size sysconf names under a strict -std=c11 */
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

#include "matmul.h"
#include "packed.h"

enum {
    PACKED_OK = 0,
    PACKED_ERR_VARIANT = 1,  /* unknown variant, or one this CPU (or this build) cannot run */
    PACKED_ERR_MEMORY = 2,   /* the pack buffers could not be allocated */
    PACKED_ERR_ARGUMENT = 3, /* a negative dimension */
};

static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* ---- which micro-kernels this CPU can run ----------------------------------------------- */

int matmul_packed_variant_supported(int64_t variant) {
    switch (variant) {
    case PACKED_AUTO:
    case PACKED_PORTABLE:
        return 1;
#if PACKED_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
    /* libgcc's and compiler-rt's checks include XGETBV: a feature the OS does not save the
     * registers of counts as absent. */
    case PACKED_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case PACKED_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

int64_t matmul_packed_resolve_variant(int64_t variant) {
    if (variant == PACKED_AUTO) {
        if (matmul_packed_variant_supported(PACKED_AVX512)) return PACKED_AVX512;
        if (matmul_packed_variant_supported(PACKED_AVX2)) return PACKED_AVX2;
        return PACKED_PORTABLE;
    }
    return matmul_packed_variant_supported(variant) ? variant : -1;
}

static const struct packed_kernel *kernel_for(int64_t variant, size_t elem_size) {
    const int f32 = elem_size == sizeof(float);
    switch (matmul_packed_resolve_variant(variant)) {
    case PACKED_PORTABLE:
        return f32 ? &packed_portable_f32 : &packed_portable_f64;
#if PACKED_HAVE_X86
    case PACKED_AVX2:
        return f32 ? &packed_avx2_f32 : &packed_avx2_f64;
    case PACKED_AVX512:
        return f32 ? &packed_avx512_f32 : &packed_avx512_f64;
#endif
    default:
        return NULL;
    }
}

/* ---- cache sizes and block sizes --------------------------------------------------------- */

struct cache_sizes {
    int64_t l1, l2, l3; /* bytes: L1 data and L2 of one core, L3 as reported */
};

static int64_t clamp_or(int64_t value, int64_t lo, int64_t hi, int64_t fallback) {
    if (value <= 0) return fallback;
    return value < lo ? lo : (value > hi ? hi : value);
}

/* Read on every call (a few sysconf/sysctl calls, microseconds) instead of caching in a
 * static, which would need a lock or pthread_once to stay re-entrant. Fallbacks are a common
 * desktop/server core (32 KiB L1d, 512 KiB L2, 8 MiB L3); the clamps reject nonsense such as
 * a VM reporting 0. */
static struct cache_sizes read_cache_sizes(void) {
    int64_t l1 = 0, l2 = 0, l3 = 0;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
    l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#elif defined(__APPLE__)
    /* Apple Silicon: the performance cores' figures (perflevel0); Intel Macs: the plain keys. */
    const char *names[3][2] = {{"hw.perflevel0.l1dcachesize", "hw.l1dcachesize"},
                               {"hw.perflevel0.l2cachesize", "hw.l2cachesize"},
                               {"hw.perflevel0.l3cachesize", "hw.l3cachesize"}};
    int64_t *out[3] = {&l1, &l2, &l3};
    for (int level = 0; level < 3; ++level)
        for (int alt = 0; alt < 2 && *out[level] <= 0; ++alt) {
            int64_t value = 0;
            size_t size = sizeof value;
            if (sysctlbyname(names[level][alt], &value, &size, NULL, 0) == 0) *out[level] = value;
        }
#endif
    struct cache_sizes c;
    c.l1 = clamp_or(l1, 16 << 10, 256 << 10, 32 << 10);
    c.l2 = clamp_or(l2, 128 << 10, 16 << 20, 512 << 10);
    c.l3 = clamp_or(l3, 0, INT64_C(1) << 32, 8 << 20);
    if (c.l3 < c.l2) c.l3 = 4 * c.l2; /* no L3 (Apple Silicon): treat memory as the next level */
    return c;
}

struct blocking {
    int64_t mr, nr, kc, mc, nc;
};

/* Goto & van de Geijn's rules, with A broadcast and B loaded as vectors:
 *
 * KC: the B sliver (KC x NR), reused by every micro-kernel call of loop 1, must stay in L1
 *     while the A micro-panels (MR x KC each) stream through it. Give the sliver three
 *     quarters of L1, leaving a quarter for the A micro-panel being read and the C tile. (Half
 *     of L1 was measured a few per cent slower: a longer KC amortises the micro-kernel's
 *     load/store of the C tile over more FMAs.)
 * MC: the packed A block (MC x KC) is re-read from L2 once per B sliver (every jr); half of
 *     L2 leaves room for the B panel lines passing through on their way to L1.
 * NC: the packed B panel (KC x NC) is re-read from L3 once per A block (every ic); half of
 *     L3. NC only sets how often A is re-packed (once per NC columns), so it is capped at
 *     4096: past that the re-packing costs nothing measurable and the buffer only grows.
 *
 * KC must not depend on the thread count: it fixes where the K sum is split, which is the
 * only blocking choice that changes the result's rounding.
 */
static struct blocking derive_blocking(const struct packed_kernel *k, size_t elem_size) {
    const struct cache_sizes cache = read_cache_sizes();
    const int64_t es = (int64_t)elem_size;
    struct blocking b;
    b.mr = k->mr;
    b.nr = k->nr;
    b.kc = cache.l1 * 3 / 4 / (b.nr * es);
    b.kc = max_i64(64, min_i64(1024, b.kc / 8 * 8));
    b.mc = cache.l2 / 2 / (b.kc * es);
    b.mc = max_i64(b.mr, b.mc / b.mr * b.mr);
    b.nc = cache.l3 / 2 / (b.kc * es);
    b.nc = max_i64(b.nr, min_i64(4096, b.nc) / b.nr * b.nr);
    return b;
}

int matmul_packed_blocking(int64_t variant, int64_t elem_size, int64_t *sizes) {
    if (elem_size != sizeof(float) && elem_size != sizeof(double)) return PACKED_ERR_ARGUMENT;
    const struct packed_kernel *k = kernel_for(variant, (size_t)elem_size);
    if (!k) return PACKED_ERR_VARIANT;
    const struct blocking b = derive_blocking(k, (size_t)elem_size);
    const struct cache_sizes cache = read_cache_sizes();
    const int64_t values[8] = {b.mr, b.nr, b.kc, b.mc, b.nc, cache.l1, cache.l2, cache.l3};
    memcpy(sizes, values, sizeof values);
    return PACKED_OK;
}

/* ---- packing ----------------------------------------------------------------------------- */

/* A[i0 : i0+mc, p0 : p0+kc] into ceil(mc / MR) micro-panels of MR x kc, each p-major (the
 * MR values of one column together, the order the kernel broadcasts them), rows past the
 * matrix's edge zero. */
#define DEFINE_PACK_A(T, SUFFIX)                                                              \
    static void pack_a_##SUFFIX(const T *A, int64_t K, int64_t i0, int64_t mc, int64_t p0,   \
                                int64_t kc, int64_t mr, T *restrict out) {                    \
        for (int64_t ir = 0; ir < mc; ir += mr) {                                             \
            const int64_t rows = min_i64(mr, mc - ir);                                        \
            const T *src = A + (i0 + ir) * K + p0;                                            \
            for (int64_t p = 0; p < kc; ++p) {                                                \
                int64_t i = 0;                                                                \
                for (; i < rows; ++i) out[i] = src[i * K + p];                                \
                for (; i < mr; ++i) out[i] = 0;                                               \
                out += mr;                                                                    \
            }                                                                                 \
        }                                                                                     \
    }
DEFINE_PACK_A(float, f32)
DEFINE_PACK_A(double, f64)

/* B[p0 : p0+kc, j0 : j0+nc] into ceil(nc / NR) slivers of kc x NR, each p-major (one row of
 * NR values after another, the order the kernel loads them), columns past the edge zero.
 * Type-agnostic: rows are copied as bytes. */
static void pack_b(const char *B, int64_t N, int64_t j0, int64_t nc, int64_t p0, int64_t kc,
                   int64_t nr, size_t es, char *restrict out) {
    /* Row by row of B, so B is read with unit stride (a sliver-by-sliver walk would read 64
     * bytes per row, each on a new page); each row segment is scattered over the slivers. */
    const size_t row_bytes = (size_t)nr * es, sliver_bytes = (size_t)kc * row_bytes;
    for (int64_t p = 0; p < kc; ++p) {
        const char *src = B + ((size_t)(p0 + p) * (size_t)N + (size_t)j0) * es;
        char *dst = out + (size_t)p * row_bytes;
        for (int64_t jr = 0; jr < nc; jr += nr) {
            const size_t used = (size_t)min_i64(nr, nc - jr) * es;
            memcpy(dst, src, used);
            if (used < row_bytes) memset(dst + used, 0, row_bytes - used);
            src += used;
            dst += sliver_bytes;
        }
    }
}

/* ---- the loop nest, on one thread's block of C ------------------------------------------- */

struct job {
    const void *A, *B;
    void *C;
    int64_t M, N, K;
    size_t es;
    const struct packed_kernel *kernel;
    struct blocking blk;
    int64_t m0, m1, n0, n1; /* this thread's block of C: rows [m0, m1), columns [n0, n1) */
    void *a_pack, *b_pack;  /* this thread's buffers, PACK_ALIGNMENT-aligned */
};

static void run_block(const struct job *job) {
    const struct blocking b = job->blk;
    const size_t es = job->es;
    const char *B = job->B;
    char *C = job->C;
    char *a_pack = job->a_pack, *b_pack = job->b_pack;

    for (int64_t jc = job->n0; jc < job->n1; jc += b.nc) {
        const int64_t nc = min_i64(b.nc, job->n1 - jc);
        for (int64_t pc = 0; pc < job->K; pc += b.kc) {
            const int64_t kc = min_i64(b.kc, job->K - pc);
            /* The first KC piece writes C, the rest add to it: C is never read uninitialised
             * and never needs zeroing. */
            const int accumulate = pc > 0;
            pack_b(B, job->N, jc, nc, pc, kc, b.nr, es, b_pack);
            for (int64_t ic = job->m0; ic < job->m1; ic += b.mc) {
                const int64_t mc = min_i64(b.mc, job->m1 - ic);
                if (es == sizeof(float))
                    pack_a_f32(job->A, job->K, ic, mc, pc, kc, b.mr, (float *)a_pack);
                else
                    pack_a_f64(job->A, job->K, ic, mc, pc, kc, b.mr, (double *)a_pack);
                for (int64_t jr = 0; jr < nc; jr += b.nr) {
                    const char *sliver = b_pack + (size_t)(jr * kc) * es;
                    const int64_t n = min_i64(b.nr, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += b.mr) {
                        char *c_tile = C + ((size_t)(ic + ir) * (size_t)job->N + (size_t)(jc + jr)) * es;
                        job->kernel->run(kc, a_pack + (size_t)(ir * kc) * es, sliver, c_tile, job->N,
                                         min_i64(b.mr, mc - ir), n, accumulate);
                    }
                }
            }
        }
    }
}

static void *thread_main(void *arg) {
    run_block(arg);
    return NULL;
}

/* ---- threads: a grid of blocks of C ------------------------------------------------------ */

/* Below this many multiply-adds per thread, creating a thread costs more than it saves. The
 * thread count never changes the result, so this is purely a speed choice. */
#define MIN_FMAS_PER_THREAD (INT64_C(1) << 20)

/* Choose tm x tn blocks (tm * tn <= threads) over units_m x units_n micro-tiles: fewest
 * tiles on the busiest thread first (load balance), then the squarest blocks, which pack the
 * least: a thread packs (its rows + its columns) x K. */
static void choose_grid(int64_t threads, int64_t units_m, int64_t units_n, int64_t mr, int64_t nr,
                        int64_t *tm_out, int64_t *tn_out) {
    int64_t best_tm = 1, best_tn = 1, best_load = units_m * units_n, best_edge = units_m * mr + units_n * nr;
    for (int64_t tm = 1; tm <= threads && tm <= units_m; ++tm) {
        const int64_t tn = min_i64(threads / tm, units_n);
        const int64_t rows = (units_m + tm - 1) / tm, cols = (units_n + tn - 1) / tn;
        const int64_t load = rows * cols, edge = rows * mr + cols * nr;
        if (load < best_load || (load == best_load && edge < best_edge)) {
            best_tm = tm, best_tn = tn, best_load = load, best_edge = edge;
        }
    }
    *tm_out = best_tm;
    *tn_out = best_tn;
}

static int64_t online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* ---- fewer rows than one register tile: no packing ------------------------------------ */

/* With M < MR (a GEMV when M = 1) each element of B feeds fewer than MR multiply-adds, so
 * packing B (read it, write a copy, read the copy again) costs more than the product. Stream B
 * once instead, one row of B at a time updating every row of C (C stays in cache), in the unit
 * stride order of naive.c's ikj loop, which the compiler vectorizes. One thread: the product is
 * bound by memory bandwidth, and the result is the same for every thread count. */
#define DEFINE_SKINNY(T, SUFFIX)                                                                \
    static void skinny_##SUFFIX(const T *restrict A, const T *restrict B, T *restrict C,        \
                                int64_t M, int64_t N, int64_t K) {                              \
        memset(C, 0, (size_t)M * (size_t)N * sizeof(T));                                        \
        for (int64_t p = 0; p < K; ++p) {                                                       \
            const T *restrict b_row = B + p * N;                                                \
            for (int64_t i = 0; i < M; ++i) {                                                   \
                const T a_ip = A[i * K + p];                                                    \
                T *restrict c_row = C + i * N;                                                  \
                for (int64_t j = 0; j < N; ++j) c_row[j] += a_ip * b_row[j];                    \
            }                                                                                   \
        }                                                                                       \
    }
DEFINE_SKINNY(float, f32)
DEFINE_SKINNY(double, f64)

static int packed_matmul(const void *A, const void *B, void *C, int64_t M, int64_t N, int64_t K,
                         int64_t threads, int64_t variant, size_t es) {
    if (M < 0 || N < 0 || K < 0) return PACKED_ERR_ARGUMENT;
    const struct packed_kernel *kernel = kernel_for(variant, es);
    if (!kernel) return PACKED_ERR_VARIANT;
    if (M == 0 || N == 0) return PACKED_OK;
    if (K == 0) { /* an empty sum: C = 0, as NumPy gives */
        memset(C, 0, (size_t)M * (size_t)N * es);
        return PACKED_OK;
    }
    if (M < kernel->mr) {
        if (es == sizeof(float))
            skinny_f32(A, B, C, M, N, K);
        else
            skinny_f64(A, B, C, M, N, K);
        return PACKED_OK;
    }
    const struct blocking blk = derive_blocking(kernel, es);

    if (threads <= 0) threads = online_cores();
    const int64_t units_m = (M + blk.mr - 1) / blk.mr, units_n = (N + blk.nr - 1) / blk.nr;
    /* In double: M*N*K may overflow int64 (it only has to fit the work, not memory). */
    const double fmas = (double)M * (double)N * (double)K;
    const int64_t by_work = fmas / MIN_FMAS_PER_THREAD < 1 ? 1 : fmas / MIN_FMAS_PER_THREAD > 1024 ? 1024 : (int64_t)(fmas / MIN_FMAS_PER_THREAD);
    threads = min_i64(min_i64(threads, by_work), min_i64(units_m * units_n, 1024));
    int64_t tm, tn;
    choose_grid(threads, units_m, units_n, blk.mr, blk.nr, &tm, &tn);
    const int64_t count = tm * tn;

    /* Each thread's buffers sized for the largest block it can get; one allocation for all,
     * made before any thread starts, so a failure leaves nothing to clean up but this. */
    const int64_t block_m = (units_m + tm - 1) / tm * blk.mr, block_n = (units_n + tn - 1) / tn * blk.nr;
    const size_t a_bytes = (size_t)round_up(min_i64(blk.mc, block_m), blk.mr) * (size_t)blk.kc * es;
    const size_t b_bytes = (size_t)round_up(min_i64(blk.nc, block_n), blk.nr) * (size_t)blk.kc * es;
    const size_t a_step = (size_t)round_up((int64_t)a_bytes, PACK_ALIGNMENT);
    const size_t b_step = (size_t)round_up((int64_t)b_bytes, PACK_ALIGNMENT);
    const size_t per_thread = a_step + b_step;
    void *buffers = NULL;
    if (posix_memalign(&buffers, PACK_ALIGNMENT, per_thread * (size_t)count) != 0) return PACKED_ERR_MEMORY;

    struct job stack_jobs[8];
    pthread_t stack_ids[8];
    struct job *jobs = stack_jobs;
    pthread_t *ids = stack_ids;
    if (count > 8) {
        jobs = malloc(sizeof *jobs * (size_t)count);
        ids = malloc(sizeof *ids * (size_t)count);
        if (!jobs || !ids) {
            free(jobs);
            free(ids);
            free(buffers);
            return PACKED_ERR_MEMORY;
        }
    }
    for (int64_t t = 0; t < count; ++t) {
        const int64_t bm = t / tn, bn = t % tn;
        struct job *job = &jobs[t];
        job->A = A, job->B = B, job->C = C;
        job->M = M, job->N = N, job->K = K, job->es = es;
        job->kernel = kernel, job->blk = blk;
        /* Cut at whole micro-tiles, so only the last block of a row or column has edge tiles. */
        job->m0 = min_i64(M, units_m * bm / tm * blk.mr);
        job->m1 = min_i64(M, units_m * (bm + 1) / tm * blk.mr);
        job->n0 = min_i64(N, units_n * bn / tn * blk.nr);
        job->n1 = min_i64(N, units_n * (bn + 1) / tn * blk.nr);
        job->a_pack = (char *)buffers + per_thread * (size_t)t;
        job->b_pack = (char *)job->a_pack + a_step;
    }
    /* Thread 0's block runs on the calling thread. A thread that cannot be created has its
     * block run here too: slower, never wrong. */
    char started_flags[1024];
    for (int64_t t = 1; t < count; ++t) started_flags[t] = pthread_create(&ids[t], NULL, thread_main, &jobs[t]) == 0;
    run_block(&jobs[0]);
    for (int64_t t = 1; t < count; ++t) {
        if (started_flags[t])
            pthread_join(ids[t], NULL);
        else
            run_block(&jobs[t]);
    }
    if (jobs != stack_jobs) {
        free(jobs);
        free(ids);
    }
    free(buffers);
    return PACKED_OK;
}

int matmul_packed_f32(const float *A, const float *B, float *C, int64_t M, int64_t N, int64_t K,
                      int64_t threads, int64_t variant) {
    return packed_matmul(A, B, C, M, N, K, threads, variant, sizeof(float));
}

int matmul_packed_f64(const double *A, const double *B, double *C, int64_t M, int64_t N, int64_t K,
                      int64_t threads, int64_t variant) {
    return packed_matmul(A, B, C, M, N, K, threads, variant, sizeof(double));
}
