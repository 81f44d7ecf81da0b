// wmma.cu - tensor cores through nvcuda::wmma: BF16 or FP16 inputs, FP32 accumulation.
//
// Technique: a warp multiplies 16x16x16 tiles with one collective operation (mma_sync) on the
// tensor cores, whose throughput is many times that of the FP32 SIMT pipes. Feeding them needs
// even more reuse than register_tiled.cu: a block of 4 warps computes a 128x128 tile of C, each
// warp a 64x64 sub-tile held as 4x4 accumulator fragments (so each A fragment loaded feeds 4
// MMAs and each B fragment 4 MMAs). A and B go global -> registers -> shared memory in
// 16-byte vectors; the shared tiles are double-buffered and the next tile is loaded into
// registers while the tensor cores work on the current one. Consecutive blocks are ordered in
// groups (GROUP_M) so that the tiles they share stay in L2.
// Changes from register_tiled.cu: the FMAs become warp-wide wmma fragments; half-precision
// inputs (half the bytes per element); FP32 accumulators rounded once to the input dtype when
// stored. A one-warp-per-16x16-tile WMMA kernel (the usual first try) loads every fragment
// straight from global memory and reaches only a few per cent of cuBLAS.
// Constraints: BF16 or FP16, any M, N, K: edge tiles are zero-padded as they are staged in shared
// memory (a zero adds nothing to the dot product), so sizes need not be multiples of 16.
// 16-byte loads need K (for A) and N (for B and C) to be multiples of 8 and 16-byte-aligned
// pointers; otherwise the same kernel moves elements one by one. sm_80 or newer (BF16 WMMA).
// Shared memory: 2 x (128 x 40 + 32 x 136) halves + 4 x 16 x 16 floats = 41 KiB, under the 48 KiB
// static limit, so no opt-in for dynamic shared memory is needed.
// Caveats:
//  - Tensor-core rounding: products are exact in FP32 and sums are FP32, so results match an
//    FP32-accumulated reference to FP32 rounding, then are rounded once to BF16/FP16.
//  - Hopper (sm_90, H100/H200): WMMA compiles to the warp-level mma.sync instructions, which on
//    Hopper reach well under half of the tensor-core peak. The peak needs wgmma.mma_async: a
//    warpgroup (4 warps) issues asynchronous 64xNx16 MMAs that read A and B directly from
//    shared memory through matrix descriptors, fed by the Tensor Memory Accelerator
//    (cp.async.bulk.tensor) into a multi-stage shared-memory ring guarded by mbarriers, with
//    producer and consumer warps specialised, and often thread-block clusters multicasting
//    tiles. That is what cuBLAS and CUTLASS 3 (CuTe) kernels do on Hopper; WMMA cannot express
//    any of it, so this kernel stays far below cuBLAS there; wgmma.cu is that Hopper rung. On
//    Ampere (sm_80) the next step is cp.async multi-stage pipelines (mma.cu).
//  - BF16 fragment loads are inline PTX (load_shared below). nvcc 13.0 turns
//    load_matrix_sync of an FP16 fragment into `wmma.load.*.shared.f16`, which ptxas lowers to
//    ldmatrix (SASS LDSM.16.M88.4 for A, LDSM.16.MT88.4 for B). For BF16 it emits
//    `wmma.load.*.bf16` without the `.shared` state space, although the pointer is into shared
//    memory: ptxas then has a generic address, on which ldmatrix is impossible, and emitted
//    4 generic 32-bit loads (LD.E) per fragment plus a MOVM.16.MT88 per register to transpose
//    B: 64 LD.E and 32 MOVM per 32-wide K step instead of 16 LDSM, and 254 registers instead
//    of 244 (sm_80 and sm_90). load_shared issues the very instruction load_matrix_sync would,
//    with `.shared` named: the BF16 kernel now compiles to the FP16 kernel's instructions (the
//    conversions aside) and 244 registers, and on an H200 runs at its speed (4096^3: 255
//    instead of 202 TFLOP/s). tests/test_sass.py checks for LDSM and against LD/MOVM. The
//    fragment layout is untouched (whatever wmma.load defines), so nothing here depends on
//    an undocumented layout; it relies only on the fragment's storage being the 4 x 32-bit
//    registers of the PTX fragment, which is how CUDA's mma.h passes it to its own builtin.
//    Two alternatives rely on more than that: ldmatrix PTX into the fragment assumes wmma's
//    unspecified element-to-lane mapping; and loading an FP16 fragment and copying its bits is
//    not possible as such, as an FP16 m16n16k16 fragment holds 16 elements per lane (8
//    registers) and a BF16 one 8 (4 registers): the layouts differ. The CPU emulation, which
//    has no PTX, loads the BF16 fragments with load_matrix_sync, which means the same.
//
// Launch (read by the harness: harness/backends/cuda/plans.py), a 1-D grid for the grouped
// ordering; static shared memory: the padded double-buffered tiles, then one 16 x 16 staging
// tile of floats per warp:
// @launch wmma grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)) block (THREADS) args (A, B, C, M, N, K)
//         static_shared 2 * (BLOCK_M * A_LD + BLOCK_K * B_LD) * 2 + WARPS_M * WARPS_N * 16 * 16 * 4

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

#define BLOCK_M 128
#define BLOCK_N 128
#define BLOCK_K 32
#define WARPS_M 2
#define WARPS_N 2
#define THREADS (32 * WARPS_M * WARPS_N)  // 128
#define FRAG_M (BLOCK_M / WARPS_M / 16)   // 4 accumulator fragments down a warp's sub-tile
#define FRAG_N (BLOCK_N / WARPS_N / 16)   // 4 across
// Padding of 8 halves (16 bytes) per row staggers the rows over the shared-memory banks; it
// keeps every fragment pointer 32-byte aligned and the leading dimensions multiples of 8, as
// load_matrix_sync requires.
#define A_LD (BLOCK_K + 8)
#define B_LD (BLOCK_N + 8)
#define GROUP_M 8

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<size_t>(p) & 15) == 0; }

// FP32 -> the input dtype, rounded to nearest even, as raw 16 bits.
__device__ __forceinline__ unsigned short to_bits(float v, const __nv_bfloat16*) {
    return __bfloat16_as_ushort(__float2bfloat16(v));
}
__device__ __forceinline__ unsigned short to_bits(float v, const __half*) { return __half_as_ushort(__float2half(v)); }

// Eight consecutive 16-bit elements from p + offset, of which `valid` (<= 0 .. 8) lie inside the
// matrix; the rest are zero (0x0000 is +0 in both BF16 and FP16).
__device__ __forceinline__ uint4 load8(const unsigned short* __restrict__ p, size_t offset, int valid, bool vec) {
    if (vec && valid >= 8) return *reinterpret_cast<const uint4*>(p + offset);
    unsigned v[8];
    for (int i = 0; i < 8; ++i) v[i] = i < valid ? p[offset + i] : 0u;
    return make_uint4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16), v[6] | (v[7] << 16));
}

// A fragment from shared memory: load_matrix_sync, except for BF16 on the GPU (see the header).
template <class Fragment, class T> __device__ __forceinline__ void load_shared(Fragment& f, const T* p, unsigned ldm) {
    wmma::load_matrix_sync(f, p, ldm);
}

#ifdef __CUDA_ARCH__
// The asm is volatile with a "memory" clobber because it reads shared memory: the compiler must
// keep it after the stores and the barrier that fill the tile.
__device__ __forceinline__ void
load_shared(wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>& f, const __nv_bfloat16* p,
            unsigned ldm) {
    unsigned* r = reinterpret_cast<unsigned*>(f.x);
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address), "r"(ldm)
                 : "memory");
}
__device__ __forceinline__ void
load_shared(wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>& f, const __nv_bfloat16* p,
            unsigned ldm) {
    unsigned* r = reinterpret_cast<unsigned*>(f.x);
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address), "r"(ldm)
                 : "memory");
}
#endif

template <class T>
__device__ __forceinline__ void wmma_gemm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M,
                                          int N, int K) {
    // A [M, K], B [K, N], C [M, N]; row-major, T = __nv_bfloat16 or __half. Block 128 threads
    // (2 x 2 warps); a 128 x 128 tile of C per block, 64 x 64 per warp.
    __shared__ __align__(128) T As[2][BLOCK_M][A_LD];
    __shared__ __align__(128) T Bs[2][BLOCK_K][B_LD];
    __shared__ __align__(128) float Cs[THREADS / 32][16 * 16];  // per-warp staging for the epilogue

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M, tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (blockIdx.x / per_group) * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    const int row0 = (first_m + (blockIdx.x % per_group) % group_rows) * BLOCK_M;
    const int col0 = ((blockIdx.x % per_group) / group_rows) * BLOCK_N;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int warp_row = (warp / WARPS_N) * (BLOCK_M / WARPS_M);
    const int warp_col = (warp % WARPS_N) * (BLOCK_N / WARPS_N);
    const unsigned short* a_bits = reinterpret_cast<const unsigned short*>(A);
    const unsigned short* b_bits = reinterpret_cast<const unsigned short*>(B);
    const bool vec_a = (K % 8 == 0) && aligned16(A);
    const bool vec_b = (N % 8 == 0) && aligned16(B);
    const bool vec_c = (N % 8 == 0) && aligned16(C);

    // Staging: a tile of A is 128 x 32 = 512 vectors of 8, a tile of B 32 x 128 = 512: 4 of each
    // per thread. Thread t takes vectors t, t + 128, ...: consecutive threads read consecutive
    // 16 bytes of a row (coalesced).
    constexpr int PER_THREAD = BLOCK_M * BLOCK_K / 8 / THREADS;  // 4 (the same for B)
    uint4 ra[PER_THREAD], rb[PER_THREAD];
    auto load_tiles = [&](int k0) {
        for (int i = 0; i < PER_THREAD; ++i) {
            const int v = tid + i * THREADS;
            const int r = v / (BLOCK_K / 8), k = k0 + (v % (BLOCK_K / 8)) * 8;
            const int valid = row0 + r < M ? K - k : 0;
            ra[i] = load8(a_bits, (size_t)(row0 + r) * K + k, valid, vec_a);
        }
        for (int i = 0; i < PER_THREAD; ++i) {
            const int v = tid + i * THREADS;
            const int k = k0 + v / (BLOCK_N / 8), c = (v % (BLOCK_N / 8)) * 8;
            const int valid = k < K ? N - (col0 + c) : 0;
            rb[i] = load8(b_bits, (size_t)k * N + col0 + c, valid, vec_b);
        }
    };
    auto store_tiles = [&](int buf) {
        for (int i = 0; i < PER_THREAD; ++i) {
            const int v = tid + i * THREADS;
            *reinterpret_cast<uint4*>(&As[buf][v / (BLOCK_K / 8)][(v % (BLOCK_K / 8)) * 8]) = ra[i];
            *reinterpret_cast<uint4*>(&Bs[buf][v / (BLOCK_N / 8)][(v % (BLOCK_N / 8)) * 8]) = rb[i];
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FRAG_M][FRAG_N];
#pragma unroll
    for (int i = 0; i < FRAG_M; ++i)
#pragma unroll
        for (int j = 0; j < FRAG_N; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    load_tiles(0);
    store_tiles(0);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += BLOCK_K) {
        const bool more = k0 + BLOCK_K < K;  // uniform: every thread reaches the barrier below
        if (more) load_tiles(k0 + BLOCK_K);  // in flight while the tensor cores work
#pragma unroll
        for (int kk = 0; kk < BLOCK_K; kk += 16) {
            // All FRAG_M A fragments stay live; B fragments are loaded one at a time, each used
            // for FRAG_M MMAs: the same reuse with fewer registers (the accumulators alone take 128).
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[FRAG_M];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
#pragma unroll
            for (int i = 0; i < FRAG_M; ++i) load_shared(a[i], &As[buf][warp_row + i * 16][kk], A_LD);
#pragma unroll
            for (int j = 0; j < FRAG_N; ++j) {
                load_shared(b, &Bs[buf][kk][warp_col + j * 16], B_LD);
#pragma unroll
                for (int i = 0; i < FRAG_M; ++i) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
            }
        }
        if (more) store_tiles(buf ^ 1);
        // One barrier per step with two buffers: it publishes the tile just stored, and nobody can
        // overwrite the buffer read in this step before everyone has passed it.
        __syncthreads();
        buf ^= 1;
    }

    // Epilogue: the fragment's element layout is unspecified, so each accumulator goes through
    // the warp's staging tile in shared memory; then each lane converts 8 values to the input
    // dtype and writes them as one 16-byte store (two lanes per 16-element row).
    float* stage = Cs[warp];
    const int r = lane / 2, c = (lane % 2) * 8;
    // Unrolled so that acc[i][j] is always a compile-time index: a runtime index would put the
    // accumulators in local memory (ptxas reports it as a stack frame).
#pragma unroll
    for (int i = 0; i < FRAG_M; ++i)
#pragma unroll
        for (int j = 0; j < FRAG_N; ++j) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();  // the tile is in place before the lanes read it
            const int row = row0 + warp_row + i * 16 + r, col = col0 + warp_col + j * 16 + c;
            if (row < M && col < N) {
                unsigned short bits[8];
                for (int q = 0; q < 8; ++q) bits[q] = to_bits(stage[r * 16 + c + q], C);
                unsigned short* out = reinterpret_cast<unsigned short*>(C) + (size_t)row * N + col;
                if (vec_c) {  // N % 8 == 0 and col % 8 == 0: all eight are inside C
                    *reinterpret_cast<uint4*>(out) = make_uint4(bits[0] | (bits[1] << 16), bits[2] | (bits[3] << 16),
                                                                bits[4] | (bits[5] << 16), bits[6] | (bits[7] << 16));
                } else {
                    for (int q = 0; q < 8 && col + q < N; ++q) out[q] = bits[q];
                }
            }
            __syncwarp();  // every lane has read the tile before the next store overwrites it
        }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    wmma_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B, __nv_bfloat16* __restrict__ C,
              int M, int N, int K) {
    wmma_gemm(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    wmma_f16(const __half* __restrict__ A, const __half* __restrict__ B, __half* __restrict__ C, int M, int N, int K) {
    wmma_gemm(A, B, C, M, N, K);
}
