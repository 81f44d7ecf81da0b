/* One type name for the C matmuls that are written once for float32 and float64.
 *
 * A file that includes this header is compiled twice (CMakeLists.txt: the objects matmul_f32
 * and matmul_f64), once with MATMUL_REAL_FLOAT and once with MATMUL_REAL_DOUBLE. Its functions
 * are written once, in plain C, over the type `real`; the only macro is the one that gives each
 * public name its suffix:
 *
 *     void TYPED(matmul_naive_ijk)(const real *A, ...)   ->   matmul_naive_ijk_f32 / _f64
 *
 * The SIMD micro-kernels (packed_avx2.c, packed_avx512.c) are written this way too. Each says
 * once per type, under #if on MATMUL_REAL_DOUBLE, what differs: the register type, its lane
 * count and the intrinsics' suffix (a macro of the same kind, VEC(fmadd) -> _mm256_fmadd_ps /
 * _pd); a handful of one-intrinsic wrappers over those (vec_load, vec_broadcast, vec_fma,
 * vec_store, ...) follow, and the kernels over them are one text for both types.
 */
#ifndef MATMUL_REAL_H
#define MATMUL_REAL_H

#if defined(MATMUL_REAL_DOUBLE)
typedef double real;
#define TYPED(name) name##_f64
#elif defined(MATMUL_REAL_FLOAT)
typedef float real;
#define TYPED(name) name##_f32
#else
#error "compile with -DMATMUL_REAL_FLOAT or -DMATMUL_REAL_DOUBLE (CMakeLists.txt does both)"
#endif

#endif
