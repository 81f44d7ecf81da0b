/* Cache-blocked matmul: the ikj loop of naive.c, run one tile at a time, with the row of C
 * being updated held in registers.
 *
 * What blocking buys: naive ikj streams all of B (K x N) once per row of A, and reads and
 * writes a row of C once per element of A. Here the loops over i, p and j are cut into tiles
 * of edge `tile`:
 *   - the tile of B chosen by (pp, jj), tile x tile elements (64 x 64 float32 = 16 KiB), is
 *     reused by every row of A in the ii loop while it sits in L1/L2, instead of coming from
 *     L3 or memory once per row;
 *   - inside a tile, a CHUNK-wide piece of C's row i is accumulated in a small local array
 *     across the whole p loop. Its width is a compile-time constant, so the compiler keeps it
 *     in vector registers: each multiply-add then loads only B (A[i][p] is one broadcast),
 *     where naive ikj also loads and stores C every time.
 * The innermost loop is still the unit-stride, restrict-qualified j loop of ikj, which the
 * compiler vectorizes; blocking only changes where its operands come from.
 *
 * The B tile is first copied into a contiguous buffer, like the CUDA tiled kernel's copy into
 * shared memory, so that its rows sit next to each other in the cache.
 *
 * Loop order: jj, pp, ii (tiles), then i, j-chunk, p inside a tile. Tiles narrower than the
 * narrow chunk, and the ragged last columns of a tile, take the plain ikj loop: correct, just
 * slower. Tiny tiles also lose because each chunk's p loop is only `tile` long: loading and
 * storing the accumulators costs as much as the multiply-adds between them.
 *
 * What it does not do (that is packed SIMD's job, the next step): hold a 2-D block of C in
 * registers, pack A and B into contiguous panels, or size each block for a different cache.
 *
 * Shapes: A [M, K], B [K, N], C [M, N], row-major; tile >= 1. Returns 0, or -1 when the
 * tile buffer cannot be allocated.
 */
#include <stdlib.h>
#include <string.h>
#include "matmul.h"

/* Chunks of C's row held in registers: 256 bytes (64 floats or 32 doubles, i.e. 8 AVX2
 * registers, 4 with AVX-512: eight independent FMA chains cover the FMA latency on two pipes),
 * then 64-byte chunks for tiles narrower than that, then a plain loop for the ragged rest.
 * (CMakeLists.txt turns off GCC's unroll-and-jam for this file: it would unroll the p loop
 * of the chunk update and move acc from registers to the stack.) */
#define WIDE_CHUNK_BYTES 256
#define NARROW_CHUNK_BYTES 64

static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* NAME(a_row, B, c, N, p0, p1): C[i, j0:j0+CHUNK] += A[i, p0:p1] @ B[p0:p1, j0:j0+CHUNK], with
 * a_row = A[i], B and c pointing at column j0. CHUNK is a compile-time constant, so the
 * compiler keeps acc in vector registers across the whole p loop. */
#define DEFINE_CHUNK_UPDATE(T, NAME, BYTES)                                                    \
    static inline void NAME(const T *restrict a_row, const T *restrict B, T *restrict c,      \
                            int64_t N, int64_t p0, int64_t p1) {                               \
        enum { CHUNK = (BYTES) / sizeof(T) };                                                  \
        T acc[CHUNK];                                                                          \
        for (int j = 0; j < CHUNK; ++j) acc[j] = c[j];                                         \
        for (int64_t p = p0; p < p1; ++p) {                                                    \
            const T a_ip = a_row[p];                                                           \
            const T *restrict b = B + p * N;                                                   \
            for (int j = 0; j < CHUNK; ++j) acc[j] += a_ip * b[j];                             \
        }                                                                                      \
        for (int j = 0; j < CHUNK; ++j) c[j] = acc[j];                                         \
    }

#define DEFINE_BLOCKED(T, SUFFIX)                                                              \
    DEFINE_CHUNK_UPDATE(T, wide_chunk_##SUFFIX, WIDE_CHUNK_BYTES)                              \
    DEFINE_CHUNK_UPDATE(T, narrow_chunk_##SUFFIX, NARROW_CHUNK_BYTES)                          \
                                                                                               \
    int matmul_blocked_##SUFFIX(const T *restrict A, const T *restrict B, T *restrict C,      \
                                int64_t M, int64_t N, int64_t K, int64_t tile) {               \
        enum { WIDE = WIDE_CHUNK_BYTES / sizeof(T), NARROW = NARROW_CHUNK_BYTES / sizeof(T) };  \
        if (tile < 1) tile = 1;                                                                \
        if (M > 0 && N > 0) memset(C, 0, (size_t)M * (size_t)N * sizeof(T));                  \
        if (M == 0 || N == 0 || K == 0) return 0;                                              \
        const int64_t tile_k = min_i64(tile, K), tile_n = min_i64(tile, N);                    \
        T *b_tile = malloc((size_t)tile_k * (size_t)tile_n * sizeof(T)); /* per call: re-entrant */ \
        if (!b_tile) return -1;                                                                \
        for (int64_t jj = 0; jj < N; jj += tile) {                                             \
            const int64_t j_end = min_i64(jj + tile, N), width = j_end - jj;                   \
            for (int64_t pp = 0; pp < K; pp += tile) {                                         \
                const int64_t p_end = min_i64(pp + tile, K);                                   \
                /* Copy the B tile into a contiguous buffer (the CPU's shared-memory tile):    \
                 * read in place, its rows are N elements apart and for N a multiple of 1024   \
                 * they all fall in the same few L1 sets and evict each other. */              \
                for (int64_t p = pp; p < p_end; ++p)                                           \
                    memcpy(b_tile + (p - pp) * width, B + p * N + jj, (size_t)width * sizeof(T)); \
                for (int64_t ii = 0; ii < M; ii += tile) {                                     \
                    const int64_t i_end = min_i64(ii + tile, M);                               \
                    for (int64_t i = ii; i < i_end; ++i) {                                     \
                        const T *restrict a_row = A + i * K + pp;                              \
                        T *restrict c_row = C + i * N + jj;                                    \
                        const int64_t depth = p_end - pp;                                      \
                        int64_t j0 = 0;                                                        \
                        for (; j0 + WIDE <= width; j0 += WIDE)                                 \
                            wide_chunk_##SUFFIX(a_row, b_tile + j0, c_row + j0, width, 0, depth); \
                        for (; j0 + NARROW <= width; j0 += NARROW)                             \
                            narrow_chunk_##SUFFIX(a_row, b_tile + j0, c_row + j0, width, 0, depth); \
                        for (int64_t p = 0; p < depth && j0 < width; ++p) { /* ragged rest */  \
                            const T a_ip = a_row[p];                                           \
                            const T *restrict b_row = b_tile + p * width;                      \
                            for (int64_t j = j0; j < width; ++j) c_row[j] += a_ip * b_row[j];  \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        free(b_tile);                                                                          \
        return 0;                                                                              \
    }

DEFINE_BLOCKED(float, f32)
DEFINE_BLOCKED(double, f64)
