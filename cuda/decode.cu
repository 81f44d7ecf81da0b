// decode.cu - batched decode, Y [M, N] = X [M, K] @ W^T, W [N, K] stored as ggml's q8_0, q4_0 or
// bf16 (harness/quant.py), X float32; for M = 1..16 activation rows per pass over W.
//
// Technique: the GEMV of cuda/gemv.cu with fewer bytes per weight. It is bound by how fast W
// streams in, so W is read once per pass and everything else is registers: each lane loads a
// 32-weight block of ROWS rows of W (16-byte loads, all ROWS issued before the first is used),
// dequantizes it in registers (weight = d * q, exact in float32: an fp16 scale times an integer
// of at most 8 bits), and applies it to every one of the up to MT rows of X it holds
// accumulators for (FP32 FMAs, X read through the read-only cache, each X vector used for the
// ROWS rows of W). So a block of W is loaded once and used M times, and a vector of X is
// loaded once and used ROWS times. Lanes that share rows combine their partial sums with a
// shuffle reduction, as in gemv.cu (no shared memory, no block barrier).
//
// What changes from cuda/gemv.cu, and why:
// - The 16-byte loads. ggml's q4_0 / q8_0 blocks are 18 / 34 bytes (fp16 scale, then the
//   quants), so a block's quants start 2 bytes past a 16-byte boundary at best, and a row of W
//   starts on one only when K is a multiple of 256. A 16-byte load of the quants as ggml lays
//   them out is therefore impossible without staging (shared memory, or shuffles and funnel
//   shifts between lanes). Instead the harness repacks W once, in prepare (not timed), into
//   the layout a GPU kernel wants, with exactly the same bytes: all the scales first, fp16
//   [N, K/32] (a warp reads 32 consecutive ones: one coalesced 64-byte access), then, at the
//   next multiple of 16 bytes, all the quants, [N, K/32, 16] (q4_0: byte j = weight j in the
//   low nibble, weight j + 16 in the high one, as ggml) or [N, K/32, 32] (q8_0). One block's
//   quants are then one (q4_0) or two (q8_0) aligned 16-byte loads, for every K. The bytes
//   read are the bytes ggml would read; only their order differs (as a GPU inference engine
//   repacks weights at load time). bf16 is ggml's own layout, read 32 weights (4 x 16 bytes)
//   at a time; a K that is not a multiple of 32 is padded with zero weights (and X with zero
//   columns) in prepare, which changes no sum.
// - Several rows per warp where K is short: LANES_PER_ROW lanes share ROWS rows (32 lanes for
//   K >= 1024, 8 for K >= 128, else 1: a row of K = 32 is one block, one lane), so a warp
//   works on ROWS * 32 / LANES_PER_ROW rows; the shuffle reduction stops at that width.
// - M rows of X: accumulators acc[MT][ROWS] stay in registers (the loops over them are
//   unrolled, the rows past M skipped by a warp-uniform branch). MT, the tile of rows of X, is
//   1, 4 or 16, one kernel each (decode_<format>_m<MT>_f32; the harness takes the smallest that
//   holds M), so the M = 1 GEMV keeps a GEMV's registers. M > 16 is a second row of blocks of
//   the grid (blockIdx.y), which reads W again.
// Constraints: K a multiple of 32 (the prepared layout guarantees it), 16-byte-aligned
// buffers (cudaMalloc's are), any N and M >= 1.
// Caveat: the 16-row tile needs 162-232 registers (no spills), so 5..16 rows run at low
// occupancy; for M of 8 and more the FP32 FMAs, not the bytes, are the limit (M * 32 FMAs per 18-byte
// q4_0 block): int8 dot products (dp4a) or tensor cores on X quantized to int8, as llama.cpp
// does, would be the next rung; this one keeps X in float32 and the float32 error model.
//
// Launch (read by the harness: harness/backends/cuda/plans.py): WARPS warps per block, each on
// ROWS * 32 / LANES_PER_ROW rows of W; blockIdx.y = which MT rows of X.
// @launch decode_q4_0_m1 grid (cdiv(N, WARPS * ROWS_Q4_0 * 32 / LANES_PER_ROW), cdiv(M, 1)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_q4_0_m4 grid (cdiv(N, WARPS * ROWS_Q4_0 * 32 / LANES_PER_ROW), cdiv(M, 4)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_q4_0_m16 grid (cdiv(N, WARPS * ROWS_Q4_0 * 32 / LANES_PER_ROW), cdiv(M, 16)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_q8_0_m1 grid (cdiv(N, WARPS * ROWS_Q8_0 * 32 / LANES_PER_ROW), cdiv(M, 1)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_q8_0_m4 grid (cdiv(N, WARPS * ROWS_Q8_0 * 32 / LANES_PER_ROW), cdiv(M, 4)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_q8_0_m16 grid (cdiv(N, WARPS * ROWS_Q8_0 * 32 / LANES_PER_ROW), cdiv(M, 16)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_bf16_m1 grid (cdiv(N, WARPS * ROWS_BF16 * 32 / LANES_PER_ROW), cdiv(M, 1)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_bf16_m4 grid (cdiv(N, WARPS * ROWS_BF16 * 32 / LANES_PER_ROW), cdiv(M, 4)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
// @launch decode_bf16_m16 grid (cdiv(N, WARPS * ROWS_BF16 * 32 / LANES_PER_ROW), cdiv(M, 16)) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared 0
//
// Buffers: A = the prepared weights (uint8), B = X [M, K] float32, C = Y [M, N] float32.

#include <cuda_fp16.h>
#include <stdint.h>

#define WARPS 4      // warps per block
#define ROWS_Q4_0 4  // rows of W a lane works on at once (16-byte loads in flight per lane)
#define ROWS_Q8_0 2
#define ROWS_BF16 2
#define BLOCK 32  // weights per block along K
// Lanes that share a row: 1 for K < 128 (up to 3 blocks), 8 for K < 1024, else the warp.
#define LANES_PER_ROW (1 + 7 * min(1, K / 128) + 24 * min(1, K / 1024))

enum Format { Q4_0, Q8_0, BF16 };

template <int F> struct Traits;
template <> struct Traits<Q4_0> {
    static constexpr int rows = ROWS_Q4_0, vecs = 1;
};  // 16 bytes of quants
template <> struct Traits<Q8_0> {
    static constexpr int rows = ROWS_Q8_0, vecs = 2;
};  // 32 bytes
template <> struct Traits<BF16> {
    static constexpr int rows = ROWS_BF16, vecs = 4;
};  // 64 bytes

__device__ __forceinline__ float scale_of(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }

// Four weights of one row, dequantized: those FMA'd with the float4 of X at 4 * q within the block.
template <int F>
__device__ __forceinline__ void weights4(const uint4 (&raw)[Traits<F>::vecs], float d, int q, float (&w)[4]) {
    if constexpr (F == Q4_0) {
        // Weights 0..15 are the low nibbles of bytes 0..15, weights 16..31 the high nibbles.
        const unsigned words[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
        const unsigned v = words[q % 4] >> (q / 4 * 4);
#pragma unroll
        for (int t = 0; t < 4; ++t) w[t] = d * (float)((int)((v >> (8 * t)) & 15u) - 8);
    } else if constexpr (F == Q8_0) {
        const unsigned words[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w, raw[1].x, raw[1].y, raw[1].z, raw[1].w};
        const unsigned v = words[q];
#pragma unroll
        for (int t = 0; t < 4; ++t) w[t] = d * (float)((int)(v << (24 - 8 * t)) >> 24);
    } else {
        // A BF16 value is the top half of an FP32 one: a shift or a mask of each 32-bit word.
        const unsigned lo = (&raw[q / 2].x)[q % 2 * 2], hi = (&raw[q / 2].x)[q % 2 * 2 + 1];
        w[0] = __uint_as_float(lo << 16);
        w[1] = __uint_as_float(lo & 0xffff0000u);
        w[2] = __uint_as_float(hi << 16);
        w[3] = __uint_as_float(hi & 0xffff0000u);
    }
}

template <int F, int MT>
__device__ __forceinline__ void decode(const uint8_t* __restrict__ Wp, const float* __restrict__ X,
                                       float* __restrict__ Y, int M, int N, int K) {
    constexpr int R = Traits<F>::rows, V = Traits<F>::vecs;
    const int blocks = K / BLOCK;
    const int lanes = LANES_PER_ROW;  // a power of two: 1, 8 or 32
    const int lane = threadIdx.x % 32;
    const int sub = lane % lanes;  // this lane's share of the row: blocks sub, sub + lanes, ...
    const int group = (blockIdx.x * WARPS + threadIdx.x / 32) * (32 / lanes) + lane / lanes;
    const int row0 = group * R;
    const int m0 = blockIdx.y * MT;
    const int rows_of_x = min(MT, M - m0);
    // Rows past N are read as row N - 1 and never stored: every lane of the warp stays for the
    // shuffles, and no load needs a guard.
    int row[R];
#pragma unroll
    for (int r = 0; r < R; ++r) row[r] = min(row0 + r, N - 1);

    const unsigned short* scales = reinterpret_cast<const unsigned short*>(Wp);
    const size_t quants_at = ((size_t)N * blocks * 2 + 15) / 16 * 16;
    const uint4* quants = reinterpret_cast<const uint4*>(F == BF16 ? Wp : Wp + quants_at);
    const float* x = X + (size_t)m0 * K;

    float acc[MT][R];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

    for (int b = sub; b < blocks; b += lanes) {
        uint4 raw[R][V];
        float d[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {  // every load of the step first, then the arithmetic
            const size_t block = (size_t)row[r] * blocks + b;
#pragma unroll
            for (int v = 0; v < V; ++v) raw[r][v] = __ldcs(quants + block * V + v);  // used once: evict first
            d[r] = F == BF16 ? 1.f : scale_of(__ldcs(scales + block));
        }
        const float4* xb = reinterpret_cast<const float4*>(x + (size_t)b * BLOCK);
#pragma unroll
        for (int q = 0; q < BLOCK / 4; ++q) {
            float w[R][4];
#pragma unroll
            for (int r = 0; r < R; ++r) weights4<F>(raw[r], d[r], q, w[r]);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                if (m < rows_of_x) {
                    const float4 xv = __ldg(xb + (size_t)m * (K / 4) + q);
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        acc[m][r] = fmaf(w[r][0], xv.x, acc[m][r]);
                        acc[m][r] = fmaf(w[r][1], xv.y, acc[m][r]);
                        acc[m][r] = fmaf(w[r][2], xv.z, acc[m][r]);
                        acc[m][r] = fmaf(w[r][3], xv.w, acc[m][r]);
                    }
                }
            }
        }
    }
    // Butterfly reduction within each group of `lanes` lanes (xor offsets below the group width
    // stay inside it); every lane of the warp takes part, so the full mask is right.
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m < rows_of_x) {
#pragma unroll
            for (int r = 0; r < R; ++r)
                for (int offset = lanes / 2; offset > 0; offset /= 2)
                    acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], offset);
        }
    }
    if (sub == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (m < rows_of_x && row0 + r < N) Y[(size_t)(m0 + m) * N + row0 + r] = acc[m][r];
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_q4_0_m1_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                       int K) {
    decode<Q4_0, 1>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_q4_0_m4_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                       int K) {
    decode<Q4_0, 4>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_q4_0_m16_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                        int K) {
    decode<Q4_0, 16>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_q8_0_m1_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                       int K) {
    decode<Q8_0, 1>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_q8_0_m4_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                       int K) {
    decode<Q8_0, 4>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_q8_0_m16_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                        int K) {
    decode<Q8_0, 16>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_bf16_m1_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                       int K) {
    decode<BF16, 1>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_bf16_m4_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                       int K) {
    decode<BF16, 4>(W, X, Y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    decode_bf16_m16_f32(const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N,
                        int K) {
    decode<BF16, 16>(W, X, Y, M, N, K);
}
