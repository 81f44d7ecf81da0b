// gemv.cu - matrix-vector product y = W x, the decode-time shape (M = 1): BF16 or FP32.
//
// Technique: a GEMV does 2 FLOPs per element of W and uses each element once, so no tiling can
// help: the kernel is bound by how fast W streams from memory, and everything here serves
// bandwidth. One warp per output row; each lane reads 16 bytes at a time (8 BF16 or 4 FP32
// values), consecutive lanes consecutive 16 bytes, so a warp reads 512 contiguous bytes per
// load instruction; UNROLL independent loads per lane are in flight before the first is used,
// to keep enough bytes moving to cover DRAM latency; the warp's 32 partial sums are combined
// with a shuffle reduction (no shared memory, no block barrier). W is read with a streaming
// (evict-first) load since it is used once; x, read by every warp, goes through the read-only
// cache.
// Changes from the GEMM kernels: no tiling and no shared memory: a different bottleneck.
// Constraints: W [N, K] row-major (the harness passes the transpose of its B [K, N]), x [K],
// y [N]; any N and K; FP32 accumulation, y rounded once to the input dtype. 16-byte loads need
// K to be a multiple of 8 (BF16) or 4 (FP32) and 16-byte-aligned W and x, so that every row
// starts aligned; otherwise the same kernel reads element by element.
// Caveat: with K small (a few hundred) a whole warp per row is wasteful; several rows per warp
// would do better there. The chapter's point stands: a real decode GEMV is quantization
// (fewer bytes) plus this kind of streaming.
//
// Launch (read by the harness: harness/backends/cuda/plans.py): ROWS_PER_BLOCK warps, a row each:
// @launch gemv grid (cdiv(N, ROWS_PER_BLOCK)) block (ROWS_PER_BLOCK * 32) args (A, B, C, N, K) static_shared 0

#include <cuda_bf16.h>

#define ROWS_PER_BLOCK 8  // warps per block, one row each
#define UNROLL 4          // 16-byte loads in flight per lane

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<size_t>(p) & 15) == 0; }

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* y, float v) { *y = v; }
__device__ __forceinline__ void store(__nv_bfloat16* y, float v) { *y = __float2bfloat16(v); }

// Dot product of two 16-byte vectors. A BF16 value is the top half of an FP32 one, so widening
// is a shift or a mask of each 32-bit word (no conversion instruction).
__device__ __forceinline__ float dot16(uint4 w, uint4 x, const __nv_bfloat16*) {
    const unsigned ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        s += __uint_as_float(ws[i] << 16) * __uint_as_float(xs[i] << 16);
        s += __uint_as_float(ws[i] & 0xffff0000u) * __uint_as_float(xs[i] & 0xffff0000u);
    }
    return s;
}
__device__ __forceinline__ float dot16(uint4 w, uint4 x, const float*) {
    return __uint_as_float(w.x) * __uint_as_float(x.x) + __uint_as_float(w.y) * __uint_as_float(x.y) +
           __uint_as_float(w.z) * __uint_as_float(x.z) + __uint_as_float(w.w) * __uint_as_float(x.w);
}

template <class T>
__device__ __forceinline__ void gemv(const T* __restrict__ W, const T* __restrict__ x, T* __restrict__ y, int N,
                                     int K) {
    // W [N, K] row-major, x [K], y [N]. One warp per row, ROWS_PER_BLOCK warps per block.
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    // A whole warp leaves together, and there is no __syncthreads in this kernel and the
    // shuffles involve only this warp, so returning early is safe.
    if (row >= N) return;
    const T* w = W + (size_t)row * K;
    constexpr int VEC = 16 / sizeof(T);
    float acc = 0.f;
    if (K % VEC == 0 && aligned16(W) && aligned16(x)) {
        const uint4* w4 = reinterpret_cast<const uint4*>(w);
        const uint4* x4 = reinterpret_cast<const uint4*>(x);
        const int n4 = K / VEC;
        int i = lane;
        for (; i + 32 * (UNROLL - 1) < n4; i += 32 * UNROLL) {
            uint4 wv[UNROLL], xv[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {  // all loads first, then the arithmetic
                wv[u] = __ldcs(w4 + i + 32 * u);
                xv[u] = __ldg(x4 + i + 32 * u);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) acc += dot16(wv[u], xv[u], w);
        }
        for (; i < n4; i += 32) acc += dot16(__ldcs(w4 + i), __ldg(x4 + i), w);
    } else {
        for (int k = lane; k < K; k += 32) acc += to_float(w[k]) * to_float(x[k]);
    }
    // Butterfly reduction: after log2(32) = 5 exchanges every lane holds the row's sum.
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (lane == 0) store(y + row, acc);
}

extern "C" __global__ void __launch_bounds__(ROWS_PER_BLOCK * 32)
    gemv_bf16(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
              int N, int K) {
    gemv(W, x, y, N, K);
}

extern "C" __global__ void __launch_bounds__(ROWS_PER_BLOCK * 32)
    gemv_f32(const float* __restrict__ W, const float* __restrict__ x, float* __restrict__ y, int N, int K) {
    gemv(W, x, y, N, K);
}
