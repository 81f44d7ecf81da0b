/* One type name for the C matmuls that are written once for float32 and float64.
 *
 * A file that includes this header is compiled twice (CMakeLists.txt: the objects matmul_f32
 * and matmul_f64), once with MATMUL_REAL_FLOAT and once with MATMUL_REAL_DOUBLE. Its functions
 * are written once, in plain C, over the type `real`; the only macro is the one that gives each
 * public name its suffix:
 *
 *     void TYPED(matmul_naive_ijk)(const real *A, ...)   ->   matmul_naive_ijk_f32 / _f64
 *
 * Micro-kernels whose intrinsics differ by type (_mm512_fmadd_ps against _pd) are not written
 * this way: each is spelled out for its type (packed_avx512.c, packed_avx2.c).
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
