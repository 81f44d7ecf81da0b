// tiled.cu - shared-memory tiling: the chapter-12 kernel, 16x16 tiles.
//
// Technique: each block computes a TILE x TILE tile of C. It walks K in phases; in each phase
// the block copies one TILE x TILE tile of A and one of B into shared memory (one element per
// thread), then every thread accumulates TILE products from them. Each value loaded from
// global memory is used TILE times, so global traffic drops by a factor of TILE (an intensity
// of TILE/4 = 4 FLOP/byte instead of 0.25).
// Changes from naive.cu: the two shared tiles and the phase loop.
// Constraints: FP32, any M, N, K.
// Three details make it correct (the chapter's list):
//  1. Two barriers per phase: the tile is complete before anyone reads it, and everyone has
//     finished reading before the next phase overwrites it. Without the second, fast threads
//     overwrite the tile under slow ones: a race that is wrong only sometimes.
//     tests/test_cuda_sanitizers.py removes it and shows ThreadSanitizer reporting the race.
//  2. Zero-padded edges: a load outside A or B stores 0, which leaves the dot product as it is,
//     so edge tiles need no special arithmetic.
//  3. Every thread reaches every barrier, including threads whose output lies outside C: they
//     help load the tiles and only skip the final store.
// Bank conflicts: As[ty][k] is one word for a whole half-warp (a broadcast) and Bs[k][tx] is 16
// consecutive words, so neither read conflicts and no padding is needed.
//
// Launch (read by the harness: harness/backends/cuda/plans.py):
// @launch tiled grid (cdiv(N, TILE), cdiv(M, TILE)) block (TILE, TILE) args (A, B, C, M, N, K)
//         static_shared 2 * TILE * TILE * 4

#define TILE 16

extern "C" __global__ void tiled_f32(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                     int M, int N, int K) {
    // A [M, K], B [K, N], C [M, N]; all row-major.
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int phase = 0; phase < K; phase += TILE) {
        const int ak = phase + tx, bk = phase + ty;
        As[ty][tx] = (row < M && ak < K) ? A[(size_t)row * K + ak] : 0.f;
        Bs[ty][tx] = (bk < K && col < N) ? B[(size_t)bk * N + col] : 0.f;
        __syncthreads();  // the tile is fully loaded before anyone reads it
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();  // everyone is done reading before the next phase overwrites it
    }
    if (row < M && col < N) C[(size_t)row * N + col] = acc;
}
