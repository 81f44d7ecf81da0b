/* Cache-blocked matmul: the ikj loop of naive.c, run one tile at a time, with the piece of C's
 * row being updated held in registers.
 *
 * What blocking buys: naive ikj streams all of B (K x N) once per row of A, and reads and
 * writes a row of C once per element of A. Here the loops over i, p and j are cut into tiles
 * of edge `tile`:
 *   - the tile of B chosen by (pp, jj), tile x tile elements (64 x 64 float32 = 16 KiB; never
 *     narrower than one register chunk, see below), is reused by every row of A in the ii
 *     loop while it sits in L1/L2, instead of coming from L3 or memory once per row;
 *   - inside a tile, a chunk of C's row i is accumulated in a small local array across the
 *     whole p loop. Its width is a compile-time constant, so the compiler keeps it in vector
 *     registers: each multiply-add then loads only B (A[i][p] is one broadcast), where naive
 *     ikj also loads and stores C every time.
 * The innermost loop is still the unit-stride, restrict-qualified j loop of ikj, which the
 * compiler vectorizes; blocking only changes where its operands come from.
 *
 * The B tile is first copied into a contiguous buffer, like the CUDA tiled kernel's copy into
 * shared memory, so that its rows sit next to each other in the cache. Each buffer row is
 * padded with zeros to a whole number of vectors (VECTOR_BYTES), so that every column of the
 * tile, the ragged last ones included, is updated by a fixed-width register chunk.
 *
 * Choosing the chunks: a tile's row is cut into chunks of 256, 128, 64 and 32 bytes, widest
 * first, and a last zero-padded 32-byte chunk for the ragged rest (a tile 100 float32 wide is
 * 64 + 32 + 4 columns). The register chunk is decoupled from the tile's edge: a tile is never
 * narrower than one wide chunk (WIDE columns: 64 float32, 32 float64), only shallower. A
 * tile 8 float32 wide would hold a single 8-lane vector of C per row: one chain of dependent
 * FMAs, and most of the time spent entering and leaving the chunk; that made tiles 8-32 run
 * far below naive ikj for reasons that have nothing to do with the caches. So the tile of B
 * is `tile` rows deep and max(tile, WIDE) columns wide: the tile sets how many multiply-adds
 * run between loading and storing a chunk of C and, from WIDE up, how much of B must stay in
 * cache to be reused. Small tiles then cost only loop overhead and reloads of C, and the tile
 * sweep (harness/experiments/tile_sweep.py) shows the caches, not the chunking.
 *
 * Loop order: jj, pp, ii (tiles), then i, j-chunk, p inside a tile. For every element of C the
 * sum over p runs in increasing order whatever the tile, and the file is compiled without FMA
 * contraction like naive.c (a multiply rounded, then an add rounded, as written), so every
 * tile size gives the same bits as naive ikj, on every instruction set.
 *
 * What it does not do (that is packed SIMD's job, the next step): hold a 2-D block of C in
 * registers, pack A and B into contiguous panels, or size each block for a different cache.
 *
 * Written once over `real` and compiled for float32 and float64 (real.h).
 * Shapes: A [M, K], B [K, N], C [M, N], row-major; tile >= 1. Returns 0, or -1 when the
 * tile buffer cannot be allocated.
 */
#include <stdlib.h>
#include <string.h>
#include "matmul.h"
#include "real.h"

/* The widest chunk of C's row held in registers, and the narrowest a tile can be: 256 bytes
 * (64 floats or 32 doubles, i.e. 8 AVX2 registers, 4 with AVX-512: eight independent FMA
 * chains cover the FMA latency on two pipes). The narrowest chunk is one 32-byte vector
 * (8 floats, 4 doubles); the chunks in between halve the width. (CMakeLists.txt turns off
 * GCC's unroll-and-jam for this file: it would unroll the p loop of the chunk update and move
 * acc from registers to the stack.) */
enum { WIDE_CHUNK_BYTES = 256, VECTOR_BYTES = 32 };
enum { WIDE = WIDE_CHUNK_BYTES / sizeof(real), VECTOR = VECTOR_BYTES / sizeof(real) };

/* c[0:width] += a_row[0:depth] @ b[0:depth, 0:width], where b's rows are ld elements apart.
 * Called only with a constant width (WIDE, WIDE/2, ... VECTOR): once inlined, the loops over j
 * have a fixed trip count, and the compiler keeps acc in vector registers across the p loop. */
static inline __attribute__((always_inline)) void chunk_update(const real *restrict a_row, const real *restrict b,
                                                               real *restrict c, int64_t ld, int64_t depth,
                                                               const int width) {
    real acc[width]; /* a fixed size once inlined */
    for (int j = 0; j < width; ++j) acc[j] = c[j];
    for (int64_t p = 0; p < depth; ++p) {
        const real a_ip = a_row[p];
        const real *restrict b_row = b + p * ld;
        for (int j = 0; j < width; ++j) acc[j] += a_ip * b_row[j];
    }
    for (int j = 0; j < width; ++j) c[j] = acc[j];
}

/* One row of a tile: c_row[0:width] += a_row[0:depth] @ b_tile, in chunks of WIDE, WIDE/2, ...
 * VECTOR columns, then one padded VECTOR chunk for the last width % VECTOR columns. */
static inline void tile_row(const real *restrict a_row, const real *restrict b_tile, real *restrict c_row, int64_t ld,
                            int64_t width, int64_t depth) {
    int64_t j0 = 0;
    for (; j0 + WIDE <= width; j0 += WIDE) chunk_update(a_row, b_tile + j0, c_row + j0, ld, depth, WIDE);
    if (j0 + WIDE / 2 <= width) {
        chunk_update(a_row, b_tile + j0, c_row + j0, ld, depth, WIDE / 2);
        j0 += WIDE / 2;
    }
    if (j0 + WIDE / 4 <= width) {
        chunk_update(a_row, b_tile + j0, c_row + j0, ld, depth, WIDE / 4);
        j0 += WIDE / 4;
    }
    if (j0 + VECTOR <= width) {
        chunk_update(a_row, b_tile + j0, c_row + j0, ld, depth, VECTOR);
        j0 += VECTOR;
    }
    if (j0 < width) {
        /* The ragged rest: fewer than VECTOR columns. The buffer's padding columns are zero,
         * so a full vector computed on a zero-padded copy of C's last columns is exact for
         * the real ones; only those are written back. */
        real rest[VECTOR] = {0};
        memcpy(rest, c_row + j0, (size_t)(width - j0) * sizeof(real));
        chunk_update(a_row, b_tile + j0, rest, ld, depth, VECTOR);
        memcpy(c_row + j0, rest, (size_t)(width - j0) * sizeof(real));
    }
}

/* The ikj loop run tile by tile, tile edge `tile` (>= 1; less counts as 1) in all three
 * dimensions. Returns 0, or -1 if its tile buffer cannot be allocated. */
MATMUL_API int TYPED(matmul_blocked)(const real *restrict A, const real *restrict B, real *restrict C, int64_t M,
                                     int64_t N, int64_t K, int64_t tile) {
    if (tile < 1) tile = 1;
    if (M > 0 && N > 0) memset(C, 0, (size_t)M * (size_t)N * sizeof(real));
    if (M == 0 || N == 0 || K == 0) return 0;
    /* The tile's columns: at least one wide register chunk (see above). */
    const int64_t tile_n = tile < WIDE ? WIDE : tile;
    const int64_t tile_k = min_i64(tile, K);
    const int64_t ld_max = (min_i64(tile_n, N) + VECTOR - 1) / VECTOR * VECTOR; /* padded row */
    /* Allocated per call, so that concurrent calls share nothing. */
    real *b_tile = malloc((size_t)tile_k * (size_t)ld_max * sizeof(real));
    if (!b_tile) return -1;
    for (int64_t jj = 0; jj < N; jj += tile_n) {
        const int64_t j_end = min_i64(jj + tile_n, N), width = j_end - jj;
        const int64_t ld = (width + VECTOR - 1) / VECTOR * VECTOR;
        for (int64_t pp = 0; pp < K; pp += tile) {
            const int64_t p_end = min_i64(pp + tile, K), depth = p_end - pp;
            /* Copy the B tile into a contiguous buffer (the CPU's shared-memory tile): read in
             * place, its rows are N elements apart and for N a multiple of 1024 they all fall
             * in the same few L1 sets and evict each other. Padding columns are zero. */
            for (int64_t p = 0; p < depth; ++p) {
                real *row = b_tile + p * ld;
                memcpy(row, B + (pp + p) * N + jj, (size_t)width * sizeof(real));
                memset(row + width, 0, (size_t)(ld - width) * sizeof(real));
            }
            for (int64_t ii = 0; ii < M; ii += tile) {
                const int64_t i_end = min_i64(ii + tile, M);
                for (int64_t i = ii; i < i_end; ++i) tile_row(A + i * K + pp, b_tile, C + i * N + jj, ld, width, depth);
            }
        }
    }
    free(b_tile);
    return 0;
}
