/* The packed matmul's choices that do not depend on the element type: which micro-kernel this
 * CPU runs, the cache sizes, and the block sizes derived from them (packed.c uses them).
 *
 * Micro-kernel variant: chosen at run time from cpuid (__builtin_cpu_supports, which also
 * checks that the OS saves the wide registers): AVX-512 if present, else AVX2+FMA, else the
 * portable C kernel. One build therefore runs on any x86-64 and never executes an instruction
 * the CPU lacks; a caller may force a variant, and gets an error code if the CPU lacks it.
 *
 * Block sizes are derived at run time from the cache sizes the OS reports (sysfs on Linux,
 * then sysconf; sysctl on macOS; fixed fallbacks elsewhere), not fixed at build time, so one binary fits
 * the machine it runs on; see packed_blocking_for for the reasoning.
 */
#if !defined(__APPLE__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* the cache-size sysconf names under a strict -std=c11 */
#endif
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

#include "matmul.h"
#include "packed.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

/* ---- which micro-kernels this CPU can run ----------------------------------------------- */

/* 1 if this CPU and build can run the variant (packed.c's numbers), else 0. */
MATMUL_API int matmul_packed_variant_supported(int64_t variant) {
    switch (variant) {
    case PACKED_AUTO:
    case PACKED_PORTABLE: return 1;
#if PACKED_HAVE_X86 && (defined(__GNUC__) || defined(__clang__))
    /* libgcc's and compiler-rt's checks include XGETBV: a feature the OS does not save the
     * registers of counts as absent. */
    case PACKED_AVX2: __builtin_cpu_init(); return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case PACKED_AVX512: __builtin_cpu_init(); return __builtin_cpu_supports("avx512f");
#endif
    default: return 0;
    }
}

/* The variant that `variant` runs as (auto resolved), or -1 if it cannot run here. */
MATMUL_API int64_t matmul_packed_resolve_variant(int64_t variant) {
    if (variant == PACKED_AUTO) {
        if (matmul_packed_variant_supported(PACKED_AVX512)) return PACKED_AVX512;
        if (matmul_packed_variant_supported(PACKED_AVX2)) return PACKED_AVX2;
        return PACKED_PORTABLE;
    }
    return matmul_packed_variant_supported(variant) ? variant : -1;
}

const struct packed_kernel *packed_kernel_for(int64_t variant, size_t elem_size) {
    const int f32 = elem_size == sizeof(float);
    switch (matmul_packed_resolve_variant(variant)) {
    case PACKED_PORTABLE: return f32 ? &packed_portable_f32 : &packed_portable_f64;
#if PACKED_HAVE_X86
    case PACKED_AVX2: return f32 ? &packed_avx2_f32 : &packed_avx2_f64;
    case PACKED_AVX512: return f32 ? &packed_avx512_f32 : &packed_avx512_f64;
#endif
    default: return NULL;
    }
}

/* ---- cache sizes and block sizes --------------------------------------------------------- */

static int64_t clamp_or(int64_t value, int64_t lo, int64_t hi, int64_t fallback) {
    if (value <= 0) return fallback;
    return value < lo ? lo : (value > hi ? hi : value);
}

static struct cache_sizes cache;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

#if defined(__linux__)
/* Bytes of cpu0's cache of this level (1: the data cache) as Linux lists it in sysfs, 0 where
 * it does not. Preferred to sysconf, whose L3 comes from what a virtual machine's cpuid says of
 * its host: 320 MiB on an AMD EPYC Zen 4 VM and 384 MiB on a Zen 5 one, whose cores share
 * 32 MiB (the figure sysfs and lscpu give, and the harness's Python reads). */
static int64_t sysfs_cache_size(int level) {
    char path[96], text[32];
    for (int index = 0; index < 16; ++index) {
        int64_t found_level = 0, size = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", index);
        FILE *file = fopen(path, "r");
        if (!file) break;
        const int read_level = fscanf(file, "%" SCNd64, &found_level) == 1;
        fclose(file);
        if (!read_level || found_level != level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", index);
        if (!(file = fopen(path, "r"))) continue;
        const int read_type = fscanf(file, "%31s", text) == 1;
        fclose(file);
        if (!read_type || strcmp(text, "Instruction") == 0) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        if (!(file = fopen(path, "r"))) continue;
        char unit = 0;
        const int fields = fscanf(file, "%" SCNd64 "%c", &size, &unit);
        fclose(file);
        if (fields < 1) continue;
        if (fields == 2 && unit == 'K') size <<= 10;
        if (fields == 2 && unit == 'M') size <<= 20;
        return size;
    }
    return 0;
}
#endif

/* Fallbacks are a common desktop/server core (32 KiB L1d, 512 KiB L2, 8 MiB L3); the clamps
 * reject nonsense such as a VM reporting 0. */
static void read_cache_sizes(void) {
    int64_t l1 = 0, l2 = 0, l3 = 0;
#if defined(__linux__)
    l1 = sysfs_cache_size(1), l2 = sysfs_cache_size(2), l3 = sysfs_cache_size(3);
#endif
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
    if (l1 <= 0) l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    if (l2 <= 0) l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l3 <= 0) l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
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
    cache.l1 = clamp_or(l1, 16 << 10, 256 << 10, 32 << 10);
    cache.l2 = clamp_or(l2, 128 << 10, 16 << 20, 512 << 10);
    cache.l3 = clamp_or(l3, 0, INT64_C(1) << 32, 8 << 20);
    if (cache.l3 < cache.l2) cache.l3 = 4 * cache.l2; /* no L3 (Apple Silicon): memory is next */
}

/* Read once per process: the calls cost microseconds, which a 64^3 product cannot spare. */
struct cache_sizes packed_cache_sizes(void) {
    pthread_once(&cache_once, read_cache_sizes);
    return cache;
}

/* 1 on an AMD Zen 5 or later (family 0x1A on): packed_is_zen5_or_later. */
static int zen5_or_later;
/* 1 on a Zen 4: family 0x19 with AVX-512 (Zen 3, the same family, has none). */
static int zen4;

static void read_core_family(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    const int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "AuthenticAMD" */
    if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return;
    const unsigned base = (a >> 8) & 0xfu, family = base + (base == 0xfu ? (a >> 20) & 0xffu : 0u);
    zen5_or_later = family >= 0x1a;
    zen4 = family == 0x19 && __builtin_cpu_supports("avx512f");
#endif
}

static pthread_once_t family_once = PTHREAD_ONCE_INIT;

int packed_is_zen5_or_later(void) {
    pthread_once(&family_once, read_core_family);
    return zen5_or_later;
}

int packed_is_zen4(void) {
    pthread_once(&family_once, read_core_family);
    return zen4;
}

/* Whether kernel k takes the deep KC below: every kernel on a Zen 5, the AVX-512 ones on a
 * Zen 4 (its AVX2 kernel was 0.93-1.02x with it), where each was measured. */
static int takes_deep_kc(const struct packed_kernel *k) {
    pthread_once(&family_once, read_core_family);
#ifdef PACKED_HAVE_X86
    if (zen4) return k == &packed_avx512_f32 || k == &packed_avx512_f64;
#endif
    (void)k;
    return zen5_or_later;
}

/* Whether a B panel used by one A block alone (M fits in one) is sized for L2 (l2_nc) rather
 * than packed in rows as long as NC. Reading its panel back from L2 is the Goto rule, and what
 * was measured on the Xeon and the Zen 5. On a Zen 4 the long rows win, in both SIMD kernels
 * (the portable one follows them): B is read in streams as long as NC (eight rows at a time,
 * read ahead: packed.c's pack_b) and A is packed once per KC piece rather than once per
 * panel, while the panel's slivers come from L3. One thread, medians of 11 interleaved calls
 * with the order rotated each round, against the L2 panel: 64 x 4096 x 4096 float64
 * 1.04-1.08x faster (0.95-0.97x NumPy's speed, now 1.00-1.05x), 128 x 1024 x 4096 float64
 * 1.07x and float32 1.06x, 64 x 4096 x 4096 float32 1.07-1.09x, 168-336 x 4096 x 4096
 * float64 1.01-1.05x; the AVX2 kernel 1.00-1.07x; two threads (where each thread's block of M
 * fits in one A block: 1023 x 1025 x 1027, 512^3 float64) 0.99-1.08x. Reading the next
 * panel's rows ahead during the micro-kernels (any prefetch hint) was 0.80-0.98x. */
static int panel_from_l2(void) {
    pthread_once(&family_once, read_core_family);
    return !zen4;
}

/* Goto & van de Geijn's rules, with A broadcast and B loaded as vectors:
 *
 * KC: the B sliver (KC x NR), reused by every micro-kernel call of loop 1, must stay in L1
 *     while the A micro-panels (MR x KC each) stream through it. Give the sliver three
 *     quarters of L1, leaving a quarter for the A micro-panel being read and the C tile. (Half
 *     of L1 was measured a few per cent slower: a longer KC amortises the micro-kernel's
 *     load/store of the C tile over more FMAs.) deep_kc: on a Zen 5 and a Zen 4, longer still
 *     wins where K is long and M spans several A blocks (the panel of B then lives in L3
 *     anyway): a sliver of 64 KiB (KC = 512 for the AVX-512 tiles in float32 and float64)
 *     that streams from L2, with MC as for 3/4 of L1. On a Zen 5 (48 KiB of L1, so 4/3 of it;
 *     3/4 is KC = 288), one thread, interleaved with NumPy: 2048^3 1.04x faster in float32
 *     and float64, 1024^3 float32 1.02x. On a Zen 4 (32 KiB, so twice it; 3/4 is KC = 192),
 *     one thread, 5-9 interleaved calls, two runs: 1.02-1.10x faster at 512^3-2048^3 and
 *     1023 x 1025 x 1027 in both dtypes; KC = 768 and 1024 were no better than 512, and its
 *     AVX2 kernel (KC = 1024 there) was 0.93-1.02x, so that one keeps 3/4 of L1. Used for
 *     every shape, it lost 3-11% on the Zen 5 where the panel is sized for L2 (small K, small
 *     M), so packed.c takes it only for the other shapes. Other CPUs keep 3/4, what was
 *     measured on them.
 * MC: the packed A block (MC x KC) is re-read from L2 once per B sliver (every jr); half of
 *     L2 leaves room for the B panel lines passing through on their way to L1.
 * NC: the packed B panel (KC x NC) is re-read from L3 once per A block (every ic); half of
 *     L3. NC only sets how often A is re-packed (once per NC columns), so it is capped at
 *     4096: past that the re-packing costs nothing measurable and the buffer only grows.
 *     (packed.c narrows NC when M fits in one A block: see its loop nest.)
 *
 * KC must not depend on the thread count: it fixes where the K sum is split, which is the
 * only blocking choice that changes the result's rounding. (packed.c shortens it for a few
 * rows of A, by the shape alone.)
 */
struct blocking packed_blocking_for(const struct packed_kernel *k, size_t elem_size) {
    const struct cache_sizes sizes = packed_cache_sizes();
    const int64_t es = (int64_t)elem_size;
    struct blocking b;
    b.mr = k->mr;
    b.nr = k->nr;
    b.kc = sizes.l1 * 3 / 4 / (b.nr * es);
    b.kc = max_i64(64, min_i64(1024, b.kc / 8 * 8));
    b.mc = sizes.l2 / 2 / (b.kc * es);
    b.mc = max_i64(b.mr, b.mc / b.mr * b.mr);
    b.nc = sizes.l3 / 2 / (b.kc * es);
    b.nc = max_i64(b.nr, min_i64(4096, b.nc) / b.nr * b.nr);
    b.deep_kc = takes_deep_kc(k) ? max_i64(b.kc, min_i64(1024, 65536 / (b.nr * es) / 8 * 8)) : b.kc;
    b.l2_nc = max_i64(b.nr, min_i64(b.nc, sizes.l2 / 2 / (b.kc * es) / b.nr * b.nr));
    b.one_block_nc = panel_from_l2() ? b.l2_nc : b.nc;
    return b;
}

/* Fills sizes[0..9] with MR, NR, KC, MC, NC, the L1, L2, L3 sizes (bytes) they were derived
 * from, the deep KC (KC where this CPU takes none) and the NC where M fits in one A block, for
 * a variant and an element size (4 or 8). Returns as matmul_packed_f32 does. */
MATMUL_API int matmul_packed_blocking(int64_t variant, int64_t elem_size, int64_t *sizes) {
    if (elem_size != sizeof(float) && elem_size != sizeof(double)) return PACKED_ERR_ARGUMENT;
    const struct packed_kernel *k = packed_kernel_for(variant, (size_t)elem_size);
    if (!k) return PACKED_ERR_VARIANT;
    const struct blocking b = packed_blocking_for(k, (size_t)elem_size);
    const struct cache_sizes c = packed_cache_sizes();
    const int64_t values[10] = {b.mr, b.nr, b.kc, b.mc, b.nc, c.l1, c.l2, c.l3, b.deep_kc, b.one_block_nc};
    memcpy(sizes, values, sizeof values);
    return PACKED_OK;
}
