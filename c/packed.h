/* Private header of the packed (Goto/BLIS) matmul: what packed.c, written once over `real`
 * (real.h), shares with the parts compiled once (packed_setup.c: which micro-kernel, which
 * block sizes) and with the micro-kernels. Not part of the public interface (the MATMUL_API
 * functions of packed.c and packed_setup.c), not read by cffi.
 *
 * A micro-kernel computes one MR x NR tile of C from two packed micro-panels:
 *
 *     Ap: kc x MR, stored p-major (for each p, the MR values A[i0 .. i0+MR-1][p]), contiguous
 *     Bp: kc x NR, stored p-major (for each p, the NR values B[p][j0 .. j0+NR-1]), contiguous
 *     C:  the tile's top-left element, row stride ldc; only the top-left m x n (m <= MR,
 *         n <= NR) part lies inside the matrix and only that part is read or written
 *
 * and writes C = tile (accumulate == 0) or C += tile (accumulate != 0). The panels are zero
 * padded to full MR and NR. A kernel computes only the m rows that exist (an M = 8 problem
 * pays for 8 rows, not 14), always the full NR columns; an edge tile in N differs only in
 * how the registers are written back. Both panels are aligned to PACK_ALIGNMENT bytes.
 *
 * Determinism: every element of the tile is one chain of fused multiply-adds over p = 0..kc-1
 * in order, starting from zero, whatever m, n or the tile's position. So a C element's value
 * depends only on the KC blocking of the K sum, never on how the M and N loops are cut up,
 * which is what makes the result identical for every thread count.
 */
#ifndef MATMUL_PACKED_H
#define MATMUL_PACKED_H

#include <stddef.h>
#include <stdint.h>

/* 64 bytes: a cache line, and the width of one AVX-512 register, so aligned vector loads of
 * a packed row never straddle two lines. */
#define PACK_ALIGNMENT 64

/* The variant numbers of the public interface (matmul_packed, packed.c): 0 chooses at run time. */
enum packed_variant {
    PACKED_AUTO = 0,
    PACKED_PORTABLE = 1,
    PACKED_AVX2 = 2,
    PACKED_AVX512 = 3,
};

/* The return codes of matmul_packed_f32 / _f64 (packed.c). */
enum packed_status {
    PACKED_OK = 0,
    PACKED_ERR_VARIANT = 1,  /* unknown variant, or one this CPU (or this build) cannot run */
    PACKED_ERR_MEMORY = 2,   /* the pack buffers could not be allocated */
    PACKED_ERR_ARGUMENT = 3, /* a negative dimension, or an unknown path */
    PACKED_ERR_PATH = 4,     /* the vector path asked for a shape with neither M = 1 nor N <= 8 */
};

/* The paths of matmul_packed_path_f32 / _f64 (packed.c, which says which shape takes which):
 * 0 chooses by shape. */
enum packed_path {
    PACKED_PATH_AUTO = 0,
    PACKED_PATH_VECTOR = 1,
    PACKED_PATH_DIRECT = 2,
    PACKED_PATH_NEST = 3,
    PACKED_PATH_VECTOR_READ_AHEAD = 4, /* the vector path, B (M = 1) or A (N = 1) read ahead on any CPU */
};

typedef void (*packed_kernel_fn)(int64_t kc, const void *Ap, const void *Bp, void *C, int64_t ldc, int64_t m, int64_t n,
                                 int accumulate);

/* The direct kernel: the same MR x NR register tile, reading A (m x k, row stride lda) and
 * B (k x n, row stride ldb) where they lie, no packing; C = A B for its m x n tile (m <= MR,
 * n <= NR), nothing outside the matrices read or written. For problems so small that
 * packing costs more than it saves (packed.c: direct_nest). */
typedef void (*packed_direct_fn)(int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *C,
                                 int64_t ldc, int64_t m, int64_t n);

/* A[i0 : i0+mc, p0 : p0+kc] (row stride K) into the kernel's micro-panels (packed.c: pack_a) */
typedef void (*packed_pack_a_fn)(const void *A, int64_t K, int64_t i0, int64_t mc, int64_t p0, int64_t kc, void *out);

struct packed_kernel {
    int mr, nr; /* the register tile of C */
    packed_kernel_fn run;
    packed_direct_fn direct;
    packed_pack_a_fn pack_a; /* NULL: packed.c's pack_a, element by element */
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

/* packed_setup.c: the micro-kernel `variant` runs for elements of elem_size bytes (NULL if it
 * cannot run here), and the cache sizes (read from the OS once per process). */
const struct packed_kernel *packed_kernel_for(int64_t variant, size_t elem_size);

struct cache_sizes {
    int64_t l1, l2, l3; /* bytes: L1 data and L2 of one core, L3 as reported */
};
struct cache_sizes packed_cache_sizes(void);

/* 1 on an AMD Zen 5 or later: choices measured to pay only there (packed_setup.c's deep_kc,
 * packed.c's GEMV reading ahead) are taken by the CPU's family. */
int packed_is_zen5_or_later(void);
/* 1 on an AMD Zen 4 (family 0x19 with AVX-512): c.packed's and c.bf16's measured exceptions. */
int packed_is_zen4(void);

/* The block sizes of the loop nest (packed.c), derived from the cache sizes. */
struct blocking {
    int64_t mr, nr, kc, mc, nc;
    int64_t deep_kc;      /* KC where K is longer than kc and M spans several A blocks (packed_setup.c) */
    int64_t l2_nc;        /* NC for a B panel that stays in L2 beside the A block */
    int64_t one_block_nc; /* NC where M fits in one A block: l2_nc, or nc where the CPU gains (packed_setup.c) */
};
struct blocking packed_blocking_for(const struct packed_kernel *kernel, size_t elem_size);

/* packed_store_edge_f32 / _f64 (packed_portable.c): write back the m x n part (inside C) of a
 * register tile that a kernel has stored to `tile` (row stride nr), as C = tile or C += tile.
 * Every micro-kernel ends an edge tile this way, so no byte outside the matrix is read or
 * written. */
void packed_store_edge_f32(const float *tile, int64_t nr, float *C, int64_t ldc, int64_t m, int64_t n, int accumulate);
void packed_store_edge_f64(const double *tile, int64_t nr, double *C, int64_t ldc, int64_t m, int64_t n,
                           int accumulate);

#endif
