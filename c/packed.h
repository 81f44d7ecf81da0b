/* Private header of the packed (Goto/BLIS) matmul: what the driver in packed.c needs to know
 * about each micro-kernel. Not part of the public interface (matmul.h), not read by cffi.
 *
 * A micro-kernel computes one MR x NR tile of C from two packed micro-panels:
 *
 *     Ap: kc x MR, stored p-major (for each p, the MR values A[i0 .. i0+MR-1][p]), contiguous
 *     Bp: kc x NR, stored p-major (for each p, the NR values B[p][j0 .. j0+NR-1]), contiguous
 *     C:  the tile's top-left element, row stride ldc; only the top-left m x n (m <= MR,
 *         n <= NR) part lies inside the matrix and only that part is read or written
 *
 * and writes C = tile (accumulate == 0) or C += tile (accumulate != 0). The panels are zero
 * padded to full MR and NR, so the kernel always runs the same full-width FMAs; an edge tile
 * differs only in how the registers are written back. Both panels are aligned to
 * PACK_ALIGNMENT bytes.
 *
 * Determinism: every element of the tile is one chain of fused multiply-adds over p = 0..kc-1
 * in order, starting from zero, whatever m, n or the tile's position. So a C element's value
 * depends only on the KC blocking of the K sum, never on how the M and N loops are cut up,
 * which is what makes the result identical for every thread count.
 */
#ifndef MATMUL_PACKED_H
#define MATMUL_PACKED_H

#include <stdint.h>

/* 64 bytes: a cache line, and the width of one AVX-512 register, so aligned vector loads of
 * a packed row never straddle two lines. */
#define PACK_ALIGNMENT 64

/* The variant numbers of the public interface (matmul.h): 0 chooses at run time. */
enum packed_variant {
    PACKED_AUTO = 0,
    PACKED_PORTABLE = 1,
    PACKED_AVX2 = 2,
    PACKED_AVX512 = 3,
};

typedef void (*packed_kernel_fn)(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc,
                                 int64_t m, int64_t n, int accumulate);

struct packed_kernel {
    int mr, nr;            /* the register tile of C */
    packed_kernel_fn run;
};

/* packed_portable.c: plain C, compiles for any target. */
extern const struct packed_kernel packed_portable_f32, packed_portable_f64;

#if defined(__x86_64__) || defined(__i386__)
#define PACKED_HAVE_X86 1
/* packed_avx2.c, packed_avx512.c: built with per-function target attributes, so they compile
 * whatever -march says; the driver calls them only after checking the CPU. */
extern const struct packed_kernel packed_avx2_f32, packed_avx2_f64;
extern const struct packed_kernel packed_avx512_f32, packed_avx512_f64;
#endif

/* packed_store_edge_f32 / _f64: write back the m x n part (inside C) of a register tile that
 * a kernel has stored to `tile` (row stride nr), as C = tile or C += tile. Every micro-kernel
 * ends an edge tile this way, so no byte outside the matrix is read or written. */
#define PACKED_DEFINE_STORE_EDGE(T, SUFFIX)                                                      \
    static inline void packed_store_edge_##SUFFIX(const T *tile, int64_t nr, T *C, int64_t ldc, \
                                                  int64_t m, int64_t n, int accumulate) {        \
        for (int64_t i = 0; i < m; ++i) {                                                        \
            T *row = C + i * ldc;                                                                \
            const T *values = tile + i * nr;                                                     \
            if (accumulate)                                                                      \
                for (int64_t j = 0; j < n; ++j) row[j] += values[j];                             \
            else                                                                                 \
                for (int64_t j = 0; j < n; ++j) row[j] = values[j];                              \
        }                                                                                        \
    }
PACKED_DEFINE_STORE_EDGE(float, f32)
PACKED_DEFINE_STORE_EDGE(double, f64)

#endif
