// naive.cu - one thread per output element: the chapter's starting point.
//
// Technique: thread (row, col) walks the whole inner dimension, reading a row of A and a column
// of B straight from global memory: 2*K loads for 2*K FLOPs, an arithmetic intensity of
// 0.25 FLOP/byte in FP32. Every element of A is fetched N times and every element of B M times;
// only the L1/L2 caches stand between this kernel and DRAM.
// Changes from the previous step: none, this is the baseline the other kernels improve on.
// Constraints: FP32, any M, N, K (each thread checks its own bounds).
// Caveat: threadIdx.x runs along a row of C, so the 32 threads of a warp read 32 consecutive
// elements of B (one coalesced access) and the same element of A (a broadcast); swapping x and
// y would make every B load a separate, strided transaction.
//
// Launch (read by the harness: harness/backends/cuda/plans.py), a 16 x 16 block:
// @launch naive grid (cdiv(N, 16), cdiv(M, 16)) block (16, 16) args (A, B, C, M, N, K) static_shared 0

extern "C" __global__ void naive_f32(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                     int M, int N, int K) {
    // A [M, K], B [K, N], C [M, N]; all row-major.
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= M || col >= N) return;  // safe here: this kernel has no barrier to wait at
    float acc = 0.f;
    for (int k = 0; k < K; ++k) acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
    C[(size_t)row * N + col] = acc;
}
