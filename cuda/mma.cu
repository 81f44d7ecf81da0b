// mma.cu - tensor cores without WMMA: cp.async, ldmatrix and mma.sync.m16n8k16 in PTX (ptx.h).
//
// Technique: the rung that nvcuda::wmma hides. Each instruction is named (cuda/ptx.h), so the
// fragment layouts are the documented ones of the PTX ISA, and the CPU emulation checks them.
// A block of 4 warps (2 x 2) computes a 128 x 128 tile of C, each warp 64 x 64 as 4 x 8
// accumulator fragments of m16n8k16 (128 FP32 registers per lane). Per 16-deep K step a warp
// loads 4 A fragments (ldmatrix.x4, 16 x 16 each) and 8 B fragments (4 ldmatrix.x4.trans, two
// 16 x 8 fragments each) and issues 32 mma.sync: each A fragment feeds 8 MMAs, each B one 4.
// Changes from wmma.cu, and why each pays:
//  - Global -> shared with cp.async.cg (LDGSTS) instead of global -> registers -> shared: the
//    copy bypasses the registers (no staging registers, no store instructions) and L1, and runs
//    in the background, so it can be issued STAGES - 1 tiles ahead: a 3-stage ring of
//    BLOCK_K = 32 tiles, one __syncthreads() per tile. wmma.cu's double buffer hid one tile of
//    latency with registers; here two tiles are in flight while the tensor cores work.
//  - XOR-swizzled shared tiles instead of padded rows: the padding wmma.cu needed (16 bytes
//    per row) cost 8 KiB, which the third stage needs: 3 x (128 x 32 + 32 x 128) x 2 B = 48 KiB,
//    exactly the static limit, so no dynamic shared memory opt-in. The swizzle permutes the
//    16-byte chunks of each row so that the 8 row addresses of one ldmatrix matrix (8 rows, the
//    same 16-byte column) fall in 8 different 16-byte bank groups (128 bytes = all 32 banks):
//      A tile, rows of 32 halves = 64 B = 4 chunks: chunk' = chunk ^ ((row >> 1) & 3). Rows r
//        and r + 2 share banks (a bank period is 128 B = 2 rows); r >> 1 spreads 8 rows over
//        the 4 chunk positions of the even rows and the 4 of the odd ones.
//      B tile, rows of 128 halves = 256 B = 16 chunks: chunk' = chunk ^ (row & 7). All rows
//        start at bank 0; XOR with the row's low 3 bits puts 8 consecutive rows in 8 banks
//        groups, and stays inside the aligned group of 8 chunks (so inside the row).
//    The cp.async stores are conflict-free too: 8 consecutive threads write 2 whole A rows or
//    8 consecutive chunks of a B row. (This is CUTLASS's Swizzle<2,3,3> / <3,3,3>.)
//  - ldmatrix + mma.sync m16n8k16 instead of wmma.load + wmma.mma: the same hardware path
//    (LDSM, HMMA.16816), but with the layout known, the epilogue stores each lane's
//    accumulators straight to C (pairs of adjacent columns: c0, c1 and c2, c3) instead of
//    bouncing every fragment through shared memory; and no staging buffer (wmma.cu's 4 KiB).
//  - B is loaded with ldmatrix.trans from the row-major [K, N] tile: mma's B operand wants, per
//    register, two consecutive k of one column n, which are in two different rows of the tile.
//  - Grouped block order (GROUP_M) as in wmma.cu, so the tiles neighbouring blocks share stay
//    in L2.
// Constraints: BF16 or FP16 in, FP32 accumulation, C in the input dtype (rounded once). Any M,
// N, K: outside the matrices cp.async reads 0 bytes and zero-fills (a zero adds nothing to the
// dot product), and the source address is then the matrix's base, never past its end.
// cp.async needs a 16-byte-aligned source: A goes through it when K % 8 == 0 and A is 16-byte
// aligned, B when N % 8 == 0 and B is; otherwise that operand is read element by element and
// stored to the same swizzled place (the barriers that order the ring order those stores too).
// C is written as pairs when N is even and C 4-byte aligned, else element by element.
// sm_80 or newer (cp.async, BF16 mma.sync).
// Caveats:
//  - Hopper (sm_90, H100/H200): mma.sync runs there, but the peak needs wgmma.mma_async fed by
//    TMA (wgmma.cu is that rung); this kernel is the Ampere recipe (CUTLASS 2's sm80 multistage), the last
//    rung before those. H200 goals, measured with scripts/gpu_check.sh when a GPU is available:
//    BF16 at 4096^3 and 8192^3, at least 50% of cuBLAS (stretch 70%) and 3x cuda.wmma.
//  - Fragments are not double-buffered in registers (loaded for a K step, then used): the
//    compiler interleaves the next step's LDSM with the current HMMAs, and 2 blocks (8 warps)
//    per SM hide the rest.
//  - Tensor-core rounding: products are exact in FP32 and sums FP32, as in wmma.cu.
//
// Launch (read by the harness: harness/backends/cuda/plans.py), a 1-D grid for the grouped
// ordering:
// @launch mma grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)) block (THREADS) args (A, B, C, M, N, K)
//         static_shared STAGES * (A_STAGE_BYTES + B_STAGE_BYTES)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "progress.h"
#include "ptx.h"

#define BLOCK_M 128
#define BLOCK_N 128
#define BLOCK_K 32
#define STAGES 3
#define WARPS_M 2
#define WARPS_N 2
#define THREADS (32 * WARPS_M * WARPS_N)  // 128
#define WARP_M (BLOCK_M / WARPS_M)        // 64
#define WARP_N (BLOCK_N / WARPS_N)        // 64
#define FRAGS_M (WARP_M / 16)             // 4 m16 fragments down a warp's tile
#define FRAGS_N (WARP_N / 8)              // 8 n8 fragments across
#define GROUP_M 8
#define A_STAGE_BYTES (BLOCK_M * BLOCK_K * 2)  // 8 KiB
#define B_STAGE_BYTES (BLOCK_K * BLOCK_N * 2)  // 8 KiB

__device__ __forceinline__ bool aligned(const void* p, unsigned bytes) {
    return (reinterpret_cast<size_t>(p) % bytes) == 0;
}

// Byte offsets of 16-byte chunks in a stage (see the header for the swizzles).
__device__ __forceinline__ unsigned a_offset(int row, int chunk) {
    return row * (BLOCK_K * 2) + ((chunk ^ ((row >> 1) & 3)) << 4);
}
__device__ __forceinline__ unsigned b_offset(int row, int chunk) {
    return row * (BLOCK_N * 2) + ((chunk ^ (row & 7)) << 4);
}

// FP32 -> the input dtype, rounded to nearest even, as raw 16 bits.
__device__ __forceinline__ unsigned to_bits(float v, const __nv_bfloat16*) {
    return __bfloat16_as_ushort(__float2bfloat16(v));
}
__device__ __forceinline__ unsigned to_bits(float v, const __half*) { return __half_as_ushort(__float2half(v)); }

__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                    const __nv_bfloat16*) {
    ptx::mma_m16n8k16_bf16(d, a, b, d);
}
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const __half*) {
    ptx::mma_m16n8k16_f16(d, a, b, d);
}

// One 16-byte chunk of 8 elements, p[0 .. valid) from global memory and zeros after, to the
// shared address dst: cp.async when vec (then valid is 0 or 8 and p 16-byte aligned), else
// element by element with a plain store.
__device__ __forceinline__ void load_chunk(ptx::smem_t dst, unsigned short* dst_generic, const unsigned short* base,
                                           const unsigned short* p, int valid, bool vec) {
    valid = max(0, min(valid, 8));
    if (vec) {
        ptx::cp_async_16(dst, valid > 0 ? p : base, unsigned(valid) * 2);
    } else {
        unsigned v[8];
        for (int i = 0; i < 8; ++i) v[i] = i < valid ? p[i] : 0u;
        *reinterpret_cast<uint4*>(dst_generic) =
            make_uint4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16), v[6] | (v[7] << 16));
    }
}

template <class T>
__device__ __forceinline__ void mma_gemm(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M,
                                         int N, int K) {
    // A [M, K], B [K, N], C [M, N]; row-major, T = __nv_bfloat16 or __half, as raw 16-bit values.
    __shared__ __align__(128) unsigned short As[STAGES][BLOCK_M * BLOCK_K];
    __shared__ __align__(128) unsigned short Bs[STAGES][BLOCK_K * BLOCK_N];

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M, tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (blockIdx.x / per_group) * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    const int row0 = (first_m + (blockIdx.x % per_group) % group_rows) * BLOCK_M;
    const int col0 = ((blockIdx.x % per_group) / group_rows) * BLOCK_N;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int warp_row = (warp / WARPS_N) * WARP_M, warp_col = (warp % WARPS_N) * WARP_N;
    const unsigned short* a_bits = reinterpret_cast<const unsigned short*>(A);
    const unsigned short* b_bits = reinterpret_cast<const unsigned short*>(B);
    const bool vec_a = K % 8 == 0 && aligned(A, 16);
    const bool vec_b = N % 8 == 0 && aligned(B, 16);
    const bool vec_c = N % 2 == 0 && aligned(C, 4);
    const ptx::smem_t a_smem = ptx::smem_address(&As[0][0]), b_smem = ptx::smem_address(&Bs[0][0]);

    // Tile t (K from t * BLOCK_K) into stage s. A tile: 128 rows x 4 chunks; B tile: 32 rows x
    // 16 chunks; 512 chunks each, 4 per thread, consecutive threads on consecutive chunks.
    auto load_tile = [&](int t, int s) {
        const int k0 = t * BLOCK_K;
#pragma unroll
        for (int i = 0; i < BLOCK_M * BLOCK_K / 8 / THREADS; ++i) {
            const int v = tid + i * THREADS, r = v / (BLOCK_K / 8), c = v % (BLOCK_K / 8);
            const int row = row0 + r, k = k0 + c * 8;
            const unsigned offset = s * A_STAGE_BYTES + a_offset(r, c);
            load_chunk(a_smem + offset, &As[0][0] + offset / 2, a_bits, a_bits + (size_t)row * K + k,
                       row < M ? K - k : 0, vec_a);
        }
#pragma unroll
        for (int i = 0; i < BLOCK_K * BLOCK_N / 8 / THREADS; ++i) {
            const int v = tid + i * THREADS, r = v / (BLOCK_N / 8), c = v % (BLOCK_N / 8);
            const int k = k0 + r, col = col0 + c * 8;
            const unsigned offset = s * B_STAGE_BYTES + b_offset(r, c);
            load_chunk(b_smem + offset, &Bs[0][0] + offset / 2, b_bits, b_bits + (size_t)k * N + col,
                       k < K ? N - col : 0, vec_b);
        }
    };

    float acc[FRAGS_M][FRAGS_N][4];
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i)
#pragma unroll
        for (int j = 0; j < FRAGS_N; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;

    // The ring: tiles 0 .. STAGES - 2 in flight before the loop; one group per tile, committed
    // even when empty, so that "all groups but the newest STAGES - 2" is always "tile t".
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) load_tile(s, s);
        ptx::cp_async_commit_group();
    }
    // ldmatrix row addresses: lane l gives row l % 16 of a 16 x 16 block, at 16-byte chunk l / 16
    // (matrices 0..3 = rows 0-7 / 8-15 at k 0-7, then at k 8-15: the a0..a7 order for A; for B
    // the k 0-7 / 8-15 halves of n 0-7, then of n 8-15: b0,b1 / b2,b3 of two n8 fragments).
    const int ld_row = lane % 16, ld_chunk = lane / 16;
    for (int t = 0; t < k_tiles; ++t) {
        ptx::cp_async_wait_group<STAGES - 2>();  // this thread's copies of tile t have landed
        __syncthreads();                         // everyone's have; and everyone is done reading tile t - 1's stage
        if (t + STAGES - 1 < k_tiles) load_tile(t + STAGES - 1, (t + STAGES - 1) % STAGES);  // into t - 1's stage
        ptx::cp_async_commit_group();
        if (threadIdx.x == 0) MATMUL_PROGRESS_MARK(PROGRESS_CONSUMER, t);  // tiles 0 .. t - 1 computed
        const int s = t % STAGES;
        const ptx::smem_t a_stage = a_smem + s * A_STAGE_BYTES, b_stage = b_smem + s * B_STAGE_BYTES;
#pragma unroll
        for (int kk = 0; kk < BLOCK_K / 16; ++kk) {
            unsigned a[FRAGS_M][4], b[FRAGS_N][2];
#pragma unroll
            for (int i = 0; i < FRAGS_M; ++i)
                ptx::ldmatrix_x4(a[i][0], a[i][1], a[i][2], a[i][3],
                                 a_stage + a_offset(warp_row + i * 16 + ld_row, kk * 2 + ld_chunk));
#pragma unroll
            for (int j = 0; j < FRAGS_N; j += 2)
                ptx::ldmatrix_x4_trans(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                                       b_stage + b_offset(kk * 16 + ld_row, (warp_col + j * 8) / 8 + ld_chunk));
#pragma unroll
            for (int i = 0; i < FRAGS_M; ++i)
#pragma unroll
                for (int j = 0; j < FRAGS_N; ++j) mma(acc[i][j], a[i], b[j], A);
        }
    }
    ptx::cp_async_wait_group<0>();  // only empty groups are left; nothing is in flight at exit

    // Epilogue: lane l holds c0, c1 at (l / 4, 2 (l % 4) + {0, 1}) of each fragment, c2, c3
    // 8 rows down: two adjacent outputs, one 32-bit store when C allows it.
    unsigned short* c_bits = reinterpret_cast<unsigned short*>(C);
    const int g = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int i = 0; i < FRAGS_M; ++i)
#pragma unroll
        for (int j = 0; j < FRAGS_N; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + warp_row + i * 16 + g + 8 * h, col = col0 + warp_col + j * 8 + 2 * t4;
                if (row >= M || col >= N) continue;
                const unsigned lo = to_bits(acc[i][j][2 * h], C), hi = to_bits(acc[i][j][2 * h + 1], C);
                unsigned short* out = c_bits + (size_t)row * N + col;
                if (vec_c) {  // N even, col even: col + 1 < N too
                    *reinterpret_cast<unsigned*>(out) = lo | (hi << 16);
                } else {
                    out[0] = static_cast<unsigned short>(lo);
                    if (col + 1 < N) out[1] = static_cast<unsigned short>(hi);
                }
            }
}

extern "C" __global__ void __launch_bounds__(THREADS)
    mma_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B, __nv_bfloat16* __restrict__ C,
             int M, int N, int K) {
    mma_gemm(A, B, C, M, N, K);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    mma_f16(const __half* __restrict__ A, const __half* __restrict__ B, __half* __restrict__ C, int M, int N, int K) {
    mma_gemm(A, B, C, M, N, K);
}
