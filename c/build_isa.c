/* Which instruction-set extensions this build of the library was compiled for, and which of
 * them the CPU it is loaded on lacks.
 *
 * A library built with -march=native (CMakeLists.txt, MATMUL_NATIVE) lets the compiler use
 * every extension of the building CPU anywhere in the naive and blocked loops; copied to an
 * older CPU it would die of an illegal instruction in the middle of a call. The harness asks
 * matmul_build_missing_isa before its first call and refuses such a library with a clear
 * error instead. (The hand-written SIMD micro-kernels are not concerned: they carry their own
 * target attributes and are chosen at run time, packed_setup.c.)
 *
 * The compiler's predefined macros (__AVX2__, ...) record what this file, and so the whole
 * library, was compiled for. The functions themselves are compiled for plain x86-64 (the
 * target attribute below), so that asking is safe on any x86-64 CPU. Only extensions the
 * build uses are listed, so the compiler always knows the name __builtin_cpu_supports checks.
 */
#include <stdio.h>
#include <string.h>

#include "matmul.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#define BASELINE __attribute__((target("arch=x86-64")))

/* Appends `name` to the space-separated list in out[0:size]; returns 0 if it does not fit. */
BASELINE static int append(char *out, int64_t size, const char *name) {
    const size_t used = strlen(out), needed = used + (used ? 1 : 0) + strlen(name) + 1;
    if (needed > (size_t)size) return 0;
    snprintf(out + used, (size_t)size - used, "%s%s", used ? " " : "", name);
    return 1;
}

/* The extensions the build uses (all of them, or only those this CPU lacks) into out. */
BASELINE static int64_t list_features(char *out, int64_t size, int only_missing) {
    if (!out || size < 1) return -1;
    out[0] = '\0';
    int64_t count = 0;
    __builtin_cpu_init();
    /* __builtin_cpu_supports takes only a string literal, hence a macro. */
#define FEATURE(name)                                                                                                  \
    if (!only_missing || !__builtin_cpu_supports(name)) {                                                              \
        if (!append(out, size, name)) return -1;                                                                       \
        ++count;                                                                                                       \
    }
#ifdef __SSE3__
    FEATURE("sse3")
#endif
#ifdef __SSSE3__
    FEATURE("ssse3")
#endif
#ifdef __SSE4_1__
    FEATURE("sse4.1")
#endif
#ifdef __SSE4_2__
    FEATURE("sse4.2")
#endif
#ifdef __POPCNT__
    FEATURE("popcnt")
#endif
#ifdef __AVX__
    FEATURE("avx")
#endif
#ifdef __AVX2__
    FEATURE("avx2")
#endif
#ifdef __FMA__
    FEATURE("fma")
#endif
#ifdef __BMI__
    FEATURE("bmi")
#endif
#ifdef __BMI2__
    FEATURE("bmi2")
#endif
#ifdef __AVX512F__
    FEATURE("avx512f")
#endif
#ifdef __AVX512CD__
    FEATURE("avx512cd")
#endif
#ifdef __AVX512VL__
    FEATURE("avx512vl")
#endif
#ifdef __AVX512BW__
    FEATURE("avx512bw")
#endif
#ifdef __AVX512DQ__
    FEATURE("avx512dq")
#endif
#ifdef __AVX512IFMA__
    FEATURE("avx512ifma")
#endif
#ifdef __AVX512VBMI__
    FEATURE("avx512vbmi")
#endif
#ifdef __AVX512VBMI2__
    FEATURE("avx512vbmi2")
#endif
#ifdef __AVX512VNNI__
    FEATURE("avx512vnni")
#endif
#ifdef __AVX512BF16__
    FEATURE("avx512bf16")
#endif
#ifdef __AVX512FP16__
    FEATURE("avx512fp16")
#endif
#undef FEATURE
    return count;
}

/* The extensions this build was compiled for, space-separated into out[0:size]; and of those,
 * the ones this CPU lacks. Both return how many they wrote, or -1 if out is too small. */
BASELINE MATMUL_API int64_t matmul_build_isa(char *out, int64_t size) { return list_features(out, size, 0); }
BASELINE MATMUL_API int64_t matmul_build_missing_isa(char *out, int64_t size) { return list_features(out, size, 1); }

#else /* not x86-64: nothing beyond the target's baseline is recorded or checked */

MATMUL_API int64_t matmul_build_isa(char *out, int64_t size) {
    if (!out || size < 1) return -1;
    out[0] = '\0';
    return 0;
}
MATMUL_API int64_t matmul_build_missing_isa(char *out, int64_t size) { return matmul_build_isa(out, size); }

#endif
