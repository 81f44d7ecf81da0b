// wgmma.cu - Hopper's tensor-core path: TMA, mbarriers, wgmma.mma_async and warp specialization.
//
// Technique: the recipe of the fastest published Hopper GEMMs (CUTLASS 3's warp-specialized
// "cooperative" kernel), written out instruction by instruction with the named PTX wrappers of
// cuda/ptx.h, each of which the CPU emulation implements with the ISA's semantics. A block of
// 384 threads is three warp groups: warp group 0 is the producer (one thread issues every
// copy), warp groups 1 and 2 are consumers, each computing 64 rows of a 128 x 256 tile of C with
// one m64n256k16 wgmma per 16-deep K step (128 FP32 accumulators per thread).
// Changes from mma.cu, and why each pays:
//  - TMA (cp.async.bulk.tensor.2d, UTMALDG) instead of cp.async: one thread asks the copy engine
//    for a whole box (A: 128 rows x 64 k = 16 KiB; B: 64 k x 64 n, four per stage = 32 KiB),
//    with the address arithmetic, the edge handling and the swizzle done by the hardware from a
//    tensor map. mma.cu spent 128 threads x 8 cp.async per tile and per-thread bounds checks;
//    here the out-of-bounds part of a box arrives as zeros (which add nothing to the sums).
//  - mbarriers instead of cp.async.wait_group + __syncthreads: per stage a "full" barrier (the
//    producer's arrive.expect_tx of the stage's bytes, completed by the copies' complete_tx) and
//    an "empty" one (one arrival per consumer warp when it no longer reads the stage). Producer
//    and consumers never meet at a block-wide barrier: each waits only for what it needs, so
//    copies of the next 3 stages run while the tensor cores work.
//  - wgmma.mma_async from shared memory instead of ldmatrix + mma.sync: the operands go from
//    shared memory to the tensor cores without passing through registers (no LDSM, no fragment
//    registers), and one instruction does 64 x 256 x 16 for a warp group (mma.sync: 16 x 8 x 16
//    per warp). It is asynchronous: the consumer issues a K tile's 4 wgmmas, commits them, and
//    waits for the previous tile's group (wait_group 1) before releasing that tile's stage, so
//    the tensor cores always have the next group queued.
//  - The 128-byte swizzle of the TMA (the same XOR of address bits [4, 7) with [7, 10) that
//    mma.cu did by hand, over 8 rows of 128 bytes) is what the wgmma descriptors read back: A
//    K-major (rows of 64 k), B MN-major ("transposed": rows of 64 n, B being [K, N] row-major),
//    so neither operand needs a transpose anywhere.
//  - Warp specialization with setmaxnreg: the producer warp group drops to 40 registers per
//    thread, the consumers rise to 232, which is what holds 128 accumulators per thread plus
//    descriptors and addresses without spilling (the register file: 128 x 40 + 256 x 232 <= 64 Ki).
//  - A persistent grid: as many blocks as SMs, each walking tiles blockIdx.x, + gridDim.x, ...
//    in grouped order (GROUP_M tile rows at a time, so concurrently computed tiles share their
//    A rows and B columns in L2). The barriers' phases carry on from tile to tile, so the
//    producer prefetches the next tile's first stages while the consumers finish this one.
//  - 4 stages of 48 KiB in dynamic shared memory (192 KiB + barriers; the launch opts in to
//    more than 48 KiB), instead of mma.cu's 3 stages of 16 KiB in static shared memory.
// Constraints: sm_90a only (wgmma and setmaxnreg exist only in the architecture-specific
// target). BF16 or FP16 in, FP32 accumulation, C in the input dtype (rounded once). Any M, N, K.
// TMA needs a 16-byte aligned base and row pitches that are multiples of 16 bytes: when K (for
// A) or N (for B) is not a multiple of 8, the harness copies that operand into a buffer whose
// rows are padded to the next multiple of 8 elements (plans.py; not timed, and never the case
// for the benchmark shapes), while the tensor map keeps the true sizes, so the padding is never
// read: the TMA zero-fills beyond them. The epilogue writes only inside C, as pairs of adjacent
// columns when N is even.
// The tensor maps are encoded on the host by the driver's cuTensorMapEncodeTiled, called through
// ctypes on libcuda (harness/backends/cuda/tensormap.py): PyCUDA has no binding for it, and the
// driver library is present wherever a GPU is. In the CPU emulation the same call goes to the
// emulation's stand-in encoder, whose map the emulated TMA interprets.
// Caveats:
//  - No thread-block clusters (no TMA multicast): each block loads its own A and B boxes.
//  - The epilogue stores the accumulators straight from registers (2 elements per store);
//    CUTLASS stages C through shared memory and stores it with TMA, which matters more as K
//    shrinks.
//  - H200 goals, measured with scripts/gpu_check.sh when a GPU is available: BF16 at 4096^3 and
//    8192^3, at least 80% of cuBLAS (stretch 100%).
//
// Launch (read by the harness: harness/backends/cuda/plans.py): a persistent grid, at most one
// block per SM; the tensor maps of A ([M, K], boxes of 128 rows x 64 k) and B ([K, N], boxes of
// 64 k x 64 n), then C, M, N, K; the ring in dynamic shared memory (the static is 0):
// @launch wgmma grid (max(1, min(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SMS))) block (THREADS)
//         args (tensor_map(A, M, K, BLOCK_M, BLOCK_K), tensor_map(B, K, N, BLOCK_K, 64), C, M, N, K)
//         shared SHARED_BYTES static_shared 0
// @archs sm_90a

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "progress.h"
#include "ptx.h"

#define BLOCK_M 128
#define BLOCK_N 256
#define BLOCK_K 64  // 64 x 2 B = 128 B: one swizzled row
#define STAGES 4
#define CONSUMERS 2                      // consumer warp groups, 64 rows of the tile each
#define THREADS (128 * (CONSUMERS + 1))  // 384
#define GROUP_M 8
#define A_STAGE_BYTES (BLOCK_M * BLOCK_K * 2)  // 16 KiB
#define B_BOX_BYTES (BLOCK_K * 64 * 2)         // 8 KiB: 64 k rows x 64 n (128 B)
#define B_STAGE_BYTES (BLOCK_K * BLOCK_N * 2)  // 32 KiB: 4 boxes side by side
#define STAGE_BYTES (A_STAGE_BYTES + B_STAGE_BYTES)
// The stages, then 2 x STAGES mbarriers; + 1 KiB to align the base to 1024 (the swizzle's period).
#define SHARED_BYTES (STAGES * STAGE_BYTES + 2 * STAGES * 8 + 1024)

__device__ __forceinline__ unsigned to_bits(float v, const __nv_bfloat16*) {
    return __bfloat16_as_ushort(__float2bfloat16(v));
}
__device__ __forceinline__ unsigned to_bits(float v, const __half*) { return __half_as_ushort(__float2half(v)); }

__device__ __forceinline__ void wgmma(float (&d)[128], unsigned long long a, unsigned long long b,
                                      const __nv_bfloat16*) {
    ptx::wgmma_m64n256k16_bf16(d, a, b, 1);
}
__device__ __forceinline__ void wgmma(float (&d)[128], unsigned long long a, unsigned long long b, const __half*) {
    ptx::wgmma_m64n256k16_f16(d, a, b, 1);
}

// Where consumer `consumer` reads stage s, and the shared-memory descriptors of its k step kk
// (tests/test_cute_oracle.py checks these four against CuTe's). A: K-major, rows of 128 B,
// 8-row groups 1024 B apart; k step kk = 32 bytes along the (swizzled) row. B: MN-major, k step
// kk = 16 rows of 128 B; 64-column boxes 8 KiB apart (LBO), 8-row groups 1024 B apart (SBO).
__device__ __forceinline__ ptx::smem_t a_stage_of(ptx::smem_t smem, int s, int consumer) {
    return smem + s * STAGE_BYTES + consumer * 64 * 128;
}
__device__ __forceinline__ ptx::smem_t b_stage_of(ptx::smem_t smem, int s) {
    return smem + s * STAGE_BYTES + A_STAGE_BYTES;
}
__device__ __forceinline__ unsigned long long a_descriptor(ptx::smem_t a_stage, int kk) {
    return ptx::wgmma_descriptor(a_stage + kk * 32, 16, 1024, ptx::kSwizzle128B);
}
__device__ __forceinline__ unsigned long long b_descriptor(ptx::smem_t b_stage, int kk) {
    return ptx::wgmma_descriptor(b_stage + kk * 16 * 128, B_BOX_BYTES, 1024, ptx::kSwizzle128B);
}

// The tile's origin (row0, col0) of the i-th tile in grouped order.
__device__ __forceinline__ void tile_origin(int i, int tiles_m, int tiles_n, int& row0, int& col0) {
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (i / per_group) * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    row0 = (first_m + (i % per_group) % group_rows) * BLOCK_M;
    col0 = ((i % per_group) / group_rows) * BLOCK_N;
}

template <class T>
__device__ __forceinline__ void wgmma_gemm(const ptx::TensorMap* a_map, const ptx::TensorMap* b_map, T* __restrict__ C,
                                           int M, int N, int K) {
    unsigned char* raw = ptx::dynamic_shared_memory();
    const ptx::smem_t raw_smem = ptx::smem_address(raw);
    const ptx::smem_t smem = (raw_smem + 1023) & ~ptx::smem_t(1023);  // stage s at smem + s * STAGE_BYTES
    const ptx::smem_t full = smem + STAGES * STAGE_BYTES, empty = full + STAGES * 8;  // 8 bytes per mbarrier

    const int warp_group = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            ptx::mbarrier_init(full + 8 * s, 1);               // the producer's arrive.expect_tx
            ptx::mbarrier_init(empty + 8 * s, CONSUMERS * 4);  // one arrival per consumer warp
        }
        ptx::fence_mbarrier_init();
    }
    __syncthreads();

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M, tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    const int tiles = tiles_m * tiles_n, k_tiles = (K + BLOCK_K - 1) / BLOCK_K;

    if (warp_group == 0) {
        // Producer. Stage s and its phase run on across tiles; a stage is refilled once all 8
        // consumer warps have released it (on a fresh barrier parity 1 counts as complete).
        ptx::setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            int s = 0;
            unsigned phase = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                int row0, col0;
                tile_origin(tile, tiles_m, tiles_n, row0, col0);
                for (int t = 0; t < k_tiles; ++t) {
                    ptx::mbarrier_wait_parity(empty + 8 * s, phase ^ 1);
                    ptx::mbarrier_arrive_expect_tx(full + 8 * s, STAGE_BYTES);
                    const ptx::smem_t a_dst = smem + s * STAGE_BYTES, b_dst = a_dst + A_STAGE_BYTES;
                    ptx::tma_load_2d(a_dst, a_map, t * BLOCK_K, row0, full + 8 * s);
#pragma unroll
                    for (int j = 0; j < BLOCK_N / 64; ++j)
                        ptx::tma_load_2d(b_dst + j * B_BOX_BYTES, b_map, col0 + 64 * j, t * BLOCK_K, full + 8 * s);
                    if (++s == STAGES) s = 0, phase ^= 1;
                    MATMUL_PROGRESS_MARK(PROGRESS_PRODUCER, (tile - blockIdx.x) / gridDim.x * k_tiles + t + 1);
                }
            }
        }
        return;
    }

    // Consumers: warp group g (1 or 2) computes rows 64 (g - 1) .. 64 g - 1 of each tile.
    ptx::setmaxnreg_inc<232>();
    const int consumer = warp_group - 1, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    int s = 0;
    unsigned phase = 0;
    float acc[128];
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        int row0, col0;
        tile_origin(tile, tiles_m, tiles_n, row0, col0);
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0.f;
        int previous = -1;  // the stage whose wgmmas may still be reading it
        for (int t = 0; t < k_tiles; ++t) {
            ptx::mbarrier_wait_parity(full + 8 * s, phase);
            const ptx::smem_t a_stage = a_stage_of(smem, s, consumer), b_stage = b_stage_of(smem, s);
            ptx::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BLOCK_K / 16; ++kk)
                wgmma(acc, a_descriptor(a_stage, kk), b_descriptor(b_stage, kk), C);
            ptx::wgmma_commit_group();
            ptx::wgmma_wait_group<1>();  // the previous tile's wgmmas are done: release its stage
            if (previous >= 0 && lane == 0) ptx::mbarrier_arrive(empty + 8 * previous);
            previous = s;
            if (++s == STAGES) s = 0, phase ^= 1;
            if (threadIdx.x % 128 == 0)
                MATMUL_PROGRESS_MARK(PROGRESS_CONSUMER + consumer, (tile - blockIdx.x) / gridDim.x * k_tiles + t + 1);
        }
        ptx::wgmma_wait_group<0>();
        if (previous >= 0 && lane == 0) ptx::mbarrier_arrive(empty + 8 * previous);

        // Epilogue: acc[i] of lane l in warp w is (16 w + l / 4 + 8 ((i / 2) % 2), 8 (i / 4) + 2 (l % 4) + i % 2).
        unsigned short* c_bits = reinterpret_cast<unsigned short*>(C);
        const bool pairs = N % 2 == 0 && reinterpret_cast<size_t>(C) % 4 == 0;
#pragma unroll
        for (int i = 0; i < 128; i += 2) {
            const int row = row0 + consumer * 64 + warp * 16 + lane / 4 + 8 * ((i / 2) % 2);
            const int col = col0 + 8 * (i / 4) + 2 * (lane % 4);
            if (row >= M || col >= N) continue;
            const unsigned lo = to_bits(acc[i], C), hi = to_bits(acc[i + 1], C);
            unsigned short* out = c_bits + (size_t)row * N + col;
            if (pairs) {  // N even, col even: col + 1 < N too
                *reinterpret_cast<unsigned*>(out) = lo | (hi << 16);
            } else {
                out[0] = static_cast<unsigned short>(lo);
                if (col + 1 < N) out[1] = static_cast<unsigned short>(hi);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    wgmma_bf16(const __grid_constant__ ptx::TensorMap a_map, const __grid_constant__ ptx::TensorMap b_map,
               __nv_bfloat16* __restrict__ C, int M, int N, int K) {
    wgmma_gemm(&a_map, &b_map, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    wgmma_f16(const __grid_constant__ ptx::TensorMap a_map, const __grid_constant__ ptx::TensorMap b_map,
              __half* __restrict__ C, int M, int N, int K) {
    wgmma_gemm(&a_map, &b_map, C, M, N, K);
}
