// decode.cu - batched decode, Y [M, N] = X [M, K] @ W^T, W [N, K] stored as ggml's q8_0, q4_0,
// bf16 or q4_K (harness/model/quant.py), X float32; for M = 1..16 activation rows per pass over W.
//
// Technique: the GEMV of cuda/gemv.cu with fewer bytes per weight. It is bound by how fast W
// streams in, so W is read once per pass and everything else is registers: each lane loads a
// 32-weight block of ROWS rows of W (16-byte loads, all ROWS issued before the first is used;
// at M = 1 a step ahead of the arithmetic), turns the quants into exact floats in registers and applies them to every one of the up to
// MT rows of X it holds accumulators for (FP32 FMAs, each X vector used for the ROWS rows of W).
// Lanes that share rows combine their partial sums with a shuffle reduction, as in gemv.cu.
//
// Why it looks as it does: at M = 1 a q4_0 block is 18 bytes, so an H200 (4.8 TB/s, 132 SMs of
// 4 schedulers issuing one warp-instruction per cycle at 1.98 GHz) streams 0.85 x 4.8 TB/s only
// if a warp spends at most 4.6 instructions per block, 148 per lane per block (each lane has
// its own block): the instruction count, not the bytes, is the roof to design for
// (tests/test_cuda_decode_sass.py counts the loop). Converting each weight with I2F and
// scaling it, as the first version of this file did, took 194 (issue-bound at 3.1 TB/s); this
// one takes 118 (issue-bound at 5.1 TB/s), which leaves the memory as the limit (q8_0: 157 ->
// 128 of 279, bf16: 83 -> 92 of 525):
// - The magic-number trick instead of int-to-float conversions: a byte moved under the exponent
//   of 2^23 (one PRMT) is the float 2^23 + byte, and one FADD takes the 2^23 (and q4_0's 8)
//   away, exactly. A high nibble needs no shift: masked in place it is 16 n, and under the
//   exponent of 2^19 that is 2^19 + n. Per weight: 1.25 integer instructions, one FADD, one FFMA.
// - The next step's loads issued before this step's arithmetic (M = 1): a lane keeps two steps
//   of W in flight, so fewer warps cover the memory's latency.
// - The scale once per block: the FMAs take the integers q and X, and the block's sum is
//   multiplied by its fp16 scale d once (d * sum(q x) instead of sum((d q) x): the same kind
//   of roundings, one more per block, within the float32 error model), not once per weight.
// - Rows of X tiled in registers, MT = 1, 4 or 16, one kernel each (decode_<format>_m<MT>_f32;
//   the harness takes the smallest that holds M). M = 1 reads X straight from global memory
//   (K floats: they stay in L1). For M > 1 the block's warps stage MT rows of X for STAGE blocks
//   at a time in shared memory (coalesced loads, once for all the block's rows of W, where each
//   lane used to load its own 16 bytes from L1 at a 128-byte stride): every lane then reads its
//   block's X with one LDS.128 per 4 columns, without bank conflicts (the padding below). The
//   4-row kernel also scales once per block; the 16-row one, whose 16 x 32 FMAs per block are
//   its limit, scales each weight (one FMUL per 16 x 4 FMAs) instead of keeping 64 more sums.
// - The 16-byte loads of the quants: ggml's q4_0 / q8_0 blocks are 18 / 34 bytes (fp16 scale,
//   then the quants), so their quants are never 16-byte aligned. The harness repacks W once, in
//   prepare (not timed), into the same bytes in another order: all the scales first, fp16
//   [N, K/32] (a warp reads 32 consecutive ones: one coalesced 64-byte access), then, at the
//   next multiple of 16 bytes, all the quants, [N, K/32, 16] (q4_0: byte j = weight j in the
//   low nibble, weight j + 16 in the high one, as ggml) or [N, K/32, 32] (q8_0), as a GPU
//   inference engine repacks at load time. One block's quants are one (q4_0) or two (q8_0)
//   aligned 16-byte loads, for every K. bf16 is ggml's own layout, read 32 weights (4 x 16
//   bytes) at a time; a K that is not a multiple of 32 is padded with zero weights (and X with
//   zero columns) in prepare, which changes no sum.
// - Several rows per warp where K is short: LANES_PER_ROW lanes share ROWS rows (32 lanes, 16 in
//   the 16-row kernels, for K >= 1024; 8 for K >= 128; else 1: a row of K = 32 is one block,
//   one lane), so a warp works on ROWS * 32 / LANES_PER_ROW rows.
// - q4_K (256-weight super-blocks of 144 bytes, 4.5 bits a weight as q4_0; its own section
//   below): a lane's unit is a whole super-block of each of its ROWS_q4_K rows, whose 144 bytes
//   are 9 aligned 16-byte loads in ggml's own layout (no repacking), so its header (d, dmin, the
//   12 bytes of 6-bit scales and mins) is decoded once per 8 sub-blocks. Its weights are not
//   scaled once per block: each is dequantized exactly as ggml's float32 weight, (d sc_j) q -
//   dmin m_j, one FFMA (one rounding), then multiplied by x: 4.125 instructions a weight, 143.8
//   per 32 weights in the M = 1 loop of the 147.6 allowed (tests/test_cuda_decode_sass.py).
//   Lanes share a row from 4 super-blocks on (8 lanes; the warp from 32); for M > 1 the stage of
//   X holds 4 (2 for 16 rows) super-blocks, as many lanes a row.
// Constraints: K a multiple of 32 (the prepared layout guarantees it; q4_K: of 256), 16-byte-
// aligned buffers (cudaMalloc's are), any N and M >= 1, N * K / 32 < 2^32 (blocks are counted in
// 32 bits; q4_K: N * K / 256 * 9 < 2^32, its 16-byte vectors).
// Caveats: the block's sum of q x is up to 256 times a weight's product, so an X beyond about
// 1e36 overflows it where sum((d q) x) might not. For M of 8 and more the FP32 FMAs, not the
// bytes, are the limit (M * 32 FMAs per 18-byte q4_0 block); int8 dot products (dp4a) or tensor
// cores on X quantized to int8, as llama.cpp does, would be the next rung, with another error
// model; this one keeps X in float32 and the float32 error model. M > 16 is a second row of
// blocks of the grid (blockIdx.y), which reads W again.
//
// Launch (read by the harness: harness/backends/cuda/plans.py): WARPS warps per block, each on
// ROWS * 32 / LANES rows of W (LANES by format and MT, below); blockIdx.y = which MT rows of X.
// @launch decode_{0}_m{1} for each DECODE_KERNELS
//         grid (cdiv(N, WARPS * ROWS_{0} * 32 / LANES_{0}_M{1}), cdiv(M, {1})) block (WARPS * 32)
//         args (A, B, C, M, N, K) static_shared STAGE_BYTES_M{1}
//
// Buffers: A = the prepared weights (uint8), B = X [M, K] float32, C = Y [M, N] float32.

#include <cuda_fp16.h>
#include <stdint.h>

#define WARPS 4      // warps per block
#define ROWS_q4_0 4  // rows of W a lane works on at once (16-byte loads in flight per lane)
#define ROWS_q8_0 2
#define ROWS_bf16 2
#define BLOCK 32  // weights per block along K
// Lanes that share a row: 1 for K < 128 (up to 3 blocks), 8 for K < 1024, else the warp (half
// of it in the 16-row kernels, whose stages of X hold fewer blocks).
#define LANES_PER_ROW (1 + 7 * min(1, K / 128) + 24 * min(1, K / 1024))
#define LANES_PER_ROW_M16 (1 + 7 * min(1, K / 128) + 8 * min(1, K / 1024))
// Blocks of X per stage in shared memory (M > 1): the widest LANES_PER_ROW, so that every lane
// of a stage has a block of it; each block padded from 8 to 9 float4s (below).
#define STAGE 32
#define STAGE_M16 16
#define PADDED (BLOCK / 4 + 1)
// q4_K: super-blocks of 256 weights, 144 bytes (9 x 16: ggml's own layout is 16-byte aligned),
// a lane's unit of work; lanes share a row only where a row has 4 super-blocks (8 for 32 lanes).
#define ROWS_q4_K 2
#define SUPER 256
#define SUPER_VECS 9  // 16-byte loads per super-block: its header (d, dmin, 12 bytes of scales), 8 of quants
#define LANES_PER_ROW_q4_K (1 + 7 * min(1, K / 1024) + 24 * min(1, K / 8192))
#define SUPERS_PER_STAGE (STAGE * BLOCK / SUPER)  // M > 1: the stage of X is the other formats' bytes
#define SUPERS_PER_STAGE_M16 (STAGE_M16 * BLOCK / SUPER)
#define SUPER_PADDED (SUPER / 4 + 1)  // a super-block of a row of X in shared memory: 64 float4s, padded to 65

enum Format { Q4_0, Q8_0, BF16, Q4_K };

template <int F> struct Traits;
template <> struct Traits<Q4_0> {
    static constexpr int rows = ROWS_q4_0, vecs = 1;
};  // 16 bytes of quants
template <> struct Traits<Q8_0> {
    static constexpr int rows = ROWS_q8_0, vecs = 2;
};  // 32 bytes
template <> struct Traits<BF16> {
    static constexpr int rows = ROWS_bf16, vecs = 4;
};  // 64 bytes
template <> struct Traits<Q4_K> {
    static constexpr int rows = ROWS_q4_K, vecs = SUPER_VECS;
};  // a super-block: 144 bytes per 256 weights

__device__ __forceinline__ float scale_of(unsigned short bits) { return __half2float(__ushort_as_half(bits)); }

// The magic-number trick: the bits 0x4B000000 | n, n < 2^23, are the float 2^23 + n (n is 2^23's
// mantissa), so a byte moved under that exponent (PRMT, one instruction: byte `which` of `bytes`
// below the top byte of `exponent`, zeros between) and one subtraction are an exact int-to-float
// conversion, without I2F (16 per SM per clock in the programming guide's throughput table, an
// eighth of the FP32 rate). 2^e + n - (2^e + offset) = n - offset, exactly. The constant stays in
// a register: a mask and an OR of two immediates would be two LOP3s.
#define TWO_23 0x4B000000u  // 2^23
#define TWO_19 0x49000000u  // 2^19: a byte 16 n under it is 2^19 + n (the high nibble, unshifted)
__device__ __forceinline__ float magic_byte(unsigned bytes, unsigned exponent, int which, float offset) {
    return __uint_as_float(__byte_perm(bytes, exponent, 0x7540 + which)) - offset;
}

// Four weights of one row: those FMA'd with the float4 of X at 4 * q within the block. q4_0 and
// q8_0 give the integers (q - 8, q), exact; the block's scale is the caller's (once per block).
template <int F> __device__ __forceinline__ void weights4(const uint4 (&raw)[Traits<F>::vecs], int q, float (&w)[4]) {
    if constexpr (F == Q4_0) {
        // Weights 0..15 are the low nibbles of bytes 0..15, weights 16..31 the high nibbles: the
        // float4 q < 4 takes the low nibbles of word q, q >= 4 the high ones of word q - 4.
        const unsigned words[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
        const unsigned word = words[q % 4];
        const unsigned nibbles = q < 4 ? word & 0x0f0f0f0fu : word & 0xf0f0f0f0u;
        const unsigned exponent = q < 4 ? TWO_23 : TWO_19;
        const float offset = (q < 4 ? 8388608.f : 524288.f) + 8.f;
#pragma unroll
        for (int t = 0; t < 4; ++t) w[t] = magic_byte(nibbles, exponent, t, offset);
    } else if constexpr (F == Q8_0) {
        // Signed bytes: flipping the sign bit adds 128 (0..255), which the subtraction takes away.
        const unsigned words[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w, raw[1].x, raw[1].y, raw[1].z, raw[1].w};
        const unsigned biased = words[q] ^ 0x80808080u;
#pragma unroll
        for (int t = 0; t < 4; ++t) w[t] = magic_byte(biased, TWO_23, t, 8388608.f + 128.f);
    } else {
        // A BF16 value is the top half of an FP32 one: a shift or a mask of each 32-bit word.
        const unsigned lo = (&raw[q / 2].x)[q % 2 * 2], hi = (&raw[q / 2].x)[q % 2 * 2 + 1];
        w[0] = __uint_as_float(lo << 16);
        w[1] = __uint_as_float(lo & 0xffff0000u);
        w[2] = __uint_as_float(hi << 16);
        w[3] = __uint_as_float(hi & 0xffff0000u);
    }
}

__device__ __forceinline__ int lanes_per_row(int K, int widest) { return K < 128 ? 1 : K < 1024 ? 8 : widest; }

// Where a lane's rows and blocks are: LANES lanes share ROWS rows, block sub, sub + lanes, ...
// Blocks are counted in 32 bits (N * K / 32 < 2^32), so that an address is one IMAD.WIDE.
template <int F> struct Rows {
    static constexpr int R = Traits<F>::rows, V = Traits<F>::vecs;
    const uint4* quants;
    const unsigned short* scales;
    unsigned first[R];  // this lane's first block of each row
    int row0, sub;

    __device__ __forceinline__ Rows(const uint8_t* Wp, int N, int K, int lanes) {
        const unsigned blocks = K / BLOCK;
        const int lane = threadIdx.x % 32;
        sub = lane % lanes;
        row0 = ((blockIdx.x * WARPS + threadIdx.x / 32) * (32 / lanes) + lane / lanes) * R;
        scales = reinterpret_cast<const unsigned short*>(Wp);
        quants = reinterpret_cast<const uint4*>(F == BF16 ? Wp : Wp + ((size_t)N * blocks * 2 + 15) / 16 * 16);
        // Rows past N are read as row N - 1 and never stored: every lane of the warp stays for
        // the shuffles, and no load needs a guard.
#pragma unroll
        for (int r = 0; r < R; ++r) first[r] = min(row0 + r, N - 1) * blocks + sub;
    }
    // Block `b` (counted from this lane's first) of every row: all the loads first, used once
    // (evict first).
    __device__ __forceinline__ void load(unsigned b, uint4 (&raw)[R][V], float (&d)[R]) const {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4* at = quants + (first[r] + b) * V;
#pragma unroll
            for (int v = 0; v < V; ++v) raw[r][v] = __ldcs(at + v);
            d[r] = F == BF16 ? 1.f : scale_of(__ldcs(scales + (first[r] + b)));
        }
    }
};

// Butterfly reduction within each group of `lanes` lanes (xor offsets below the group width
// stay inside it); every lane of the warp takes part, so the full mask is right.
__device__ __forceinline__ float reduce(float v, int lanes) {
    for (int offset = lanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// The end of a batched kernel (decode_mt, decode_q4_k_mt): each row's sum gathered from the
// lanes that share it, written by the first of them (rows past N or M are never stored).
template <int MT, int R>
__device__ __forceinline__ void reduce_and_store(float (&acc)[MT][R], int lanes, int rows_of_x, int sub, int row0,
                                                 int m0, int N, float* __restrict__ Y) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m < rows_of_x) {
#pragma unroll
            for (int r = 0; r < R; ++r) acc[m][r] = reduce(acc[m][r], lanes);
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

// M = 1: X straight from global memory (K floats, which stay in L1 for every warp of the SM).
template <int F>
__device__ __forceinline__ void decode_m1(const uint8_t* __restrict__ Wp, const float* __restrict__ X,
                                          float* __restrict__ Y, int N, int K) {
    constexpr int R = Traits<F>::rows, V = Traits<F>::vecs;
    const int blocks = K / BLOCK;
    const int lanes = lanes_per_row(K, 32);
    const Rows<F> rows(Wp, N, K, lanes);
    const float4* x = reinterpret_cast<const float4*>(X + (size_t)blockIdx.y * K) + (size_t)rows.sub * (BLOCK / 4);
    Y += (size_t)blockIdx.y * N;  // a row of X per blockIdx.y (the harness launches one)

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    // One step ahead: the next block's loads are issued before this one's arithmetic, so that a
    // lane keeps two steps of W (2 x ROWS blocks) in flight and fewer warps cover the latency.
    uint4 raw[R][V];
    float d[R];
    if (rows.sub < blocks) rows.load(0, raw, d);
    for (int step = 0; rows.sub + step < blocks; step += lanes) {
        uint4 next[R][V];
        float next_d[R];
        if (rows.sub + step + lanes < blocks) rows.load(step + lanes, next, next_d);
        // The block's products with the integers q, then its scale once: d * sum(q x), not
        // sum((d * q) x); the same roundings in another order, one more (the product by d).
        float part[R];
#pragma unroll
        for (int r = 0; r < R; ++r) part[r] = 0.f;
#pragma unroll
        for (int q = 0; q < BLOCK / 4; ++q) {
            const float4 xv = __ldg(x + (size_t)step * (BLOCK / 4) + q);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float w[4];
                weights4<F>(raw[r], q, w);
                part[r] = fmaf(w[0], xv.x, part[r]);
                part[r] = fmaf(w[1], xv.y, part[r]);
                part[r] = fmaf(w[2], xv.z, part[r]);
                part[r] = fmaf(w[3], xv.w, part[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[r] = F == BF16 ? acc[r] + part[r] : fmaf(d[r], part[r], acc[r]);
            d[r] = next_d[r];
#pragma unroll
            for (int v = 0; v < V; ++v) raw[r][v] = next[r][v];
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = reduce(acc[r], lanes);
    if (rows.sub == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (rows.row0 + r < N) Y[rows.row0 + r] = acc[r];
    }
}

// M > 1: MT rows of X, staged in shared memory SB blocks at a time for all the block's warps
// (their rows of W share it), each lane reading its block's 8 float4s of each row from there.
template <int F, int MT>
__device__ __forceinline__ void decode_mt(const uint8_t* __restrict__ Wp, const float* __restrict__ X,
                                          float* __restrict__ Y, int M, int N, int K) {
    constexpr int R = Traits<F>::rows, V = Traits<F>::vecs;
    constexpr int SB = MT == 16 ? STAGE_M16 : STAGE;
    // The scale once per block needs a partial sum per row of X and of W: 16 more registers for
    // 4 rows of X, 64 for 16, where a multiply per weight (a sixteenth of the FMAs) is cheaper.
    constexpr bool scale_per_block = F != BF16 && MT <= 4;
    // A block of X is 8 float4s; padded to 9, the 8 lanes of a quarter-warp, which read the same
    // float4 of 8 consecutive blocks, read 8 different groups of 4 banks: no bank conflicts.
    __shared__ float4 xs[MT][SB][PADDED];

    const unsigned blocks = K / BLOCK;
    const int lanes = lanes_per_row(K, SB);
    const Rows<F> rows(Wp, N, K, lanes);
    const int m0 = blockIdx.y * MT;
    const int rows_of_x = min(MT, M - m0);
    const unsigned row_of_x = K / 4;  // in float4s
    const float4* x = reinterpret_cast<const float4*>(X) + (size_t)m0 * row_of_x;

    float acc[MT][R];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

    // This thread's share of each stage: float4s c and c + 128 of each row of it.
    const float4* from = x + threadIdx.x;
    float4* to = &xs[0][threadIdx.x / 8][threadIdx.x % 8];
    for (unsigned s0 = 0; s0 < blocks; s0 += SB, from += SB * 8) {
        // X [m0 .., 32 s0 .. 32 (s0 + SB)) in coalesced 16-byte loads, a row at a time, once every
        // warp is done with the previous stage. Rows past M are left as they are (rows of X are
        // computed in fours, but only the rows there are get stored), and blocks past K are
        // never read.
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SB * 8 / (WARPS * 32); ++j) {  // 2 (SB = 32) or 1 (16) float4s of a row per thread
            if (s0 + (threadIdx.x + j * WARPS * 32) / 8 < blocks) {
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    if (m >= rows_of_x) break;
                    to[(m * SB + j * WARPS * 32 / 8) * PADDED] = __ldg(from + m * row_of_x + j * WARPS * 32);
                }
            }
        }
        __syncthreads();  // the stage is written

        for (unsigned b = rows.sub; b < SB && s0 + b < blocks; b += lanes) {
            uint4 raw[R][V];
            float d[R];
            rows.load(s0 + b - rows.sub, raw, d);
            float part[MT][R];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r) part[m][r] = scale_per_block ? 0.f : acc[m][r];
#pragma unroll
            for (int q = 0; q < BLOCK / 4; ++q) {
                float w[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    weights4<F>(raw[r], q, w[r]);
                    if (!scale_per_block && F != BF16)
#pragma unroll
                        for (int t = 0; t < 4; ++t) w[r][t] *= d[r];  // exact: an fp16 times an 8-bit integer
                }
                // Rows of X in fours, each four past the first behind a warp-uniform test.
#pragma unroll
                for (int m4 = 0; m4 < MT; m4 += 4) {
                    if (m4 > 0 && m4 >= rows_of_x) break;
#pragma unroll
                    for (int m = m4; m < m4 + 4; ++m) {
                        const float4 xv = xs[m][b][q];
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            part[m][r] = fmaf(w[r][0], xv.x, part[m][r]);
                            part[m][r] = fmaf(w[r][1], xv.y, part[m][r]);
                            part[m][r] = fmaf(w[r][2], xv.z, part[m][r]);
                            part[m][r] = fmaf(w[r][3], xv.w, part[m][r]);
                        }
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r)
                    acc[m][r] = scale_per_block ? fmaf(d[r], part[m][r], acc[m][r]) : part[m][r];
        }
    }
    reduce_and_store<MT, R>(acc, lanes, rows_of_x, rows.sub, rows.row0, m0, N, Y);
}

// ---- q4_K: 256-weight super-blocks, each weight dequantized exactly ---------------------------------
//
// ggml's super-block (harness/model/quant.py), 144 bytes: fp16 d and dmin, 12 bytes of eight 6-bit
// scales sc_j and mins m_j, then 128 bytes of nibbles (chunk c = bytes 32c..32c+31: its low nibbles
// are sub-block 2c, its high nibbles sub-block 2c + 1). Weight = (d sc_j) q - dmin m_j. d sc_j and
// dmin m_j are exact (an fp16 times a 6-bit integer), (d sc_j) q too, so fmaf(q, d sc_j, -dmin m_j)
// rounds once, where ggml's dequantize_row_q4_K does: the kernel's weights are exactly ggml's float32
// weights, and only the FP32 sums round. (A scale once per sub-block, d sc sum(q x) - dmin m sum(x),
// would round two sums that may cancel: not the float32 error model of these weights.) 144 bytes
// are 9 aligned 16-byte loads, so ggml's layout is read as it is, with no repacking.

// (word & mask) | exponent as one LOP3. Written in C, with both constants known, the compiler makes
// two LOP3s of it (one per immediate: 176 instructions per sub-block instead of 144), so on the GPU
// it is PTX's lop3 (a & b | c), for which ptxas keeps the exponent in a register.
__device__ __forceinline__ unsigned and_or(unsigned word, unsigned mask, unsigned exponent) {
#ifdef CUDA_EMULATION
    return (word & mask) | exponent;
#else
    unsigned out;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(out) : "r"(word), "r"(mask), "r"(exponent));
    return out;
#endif
}

// The magic-number trick at any nibble position: (word & 0xf << p) | 2^(23 - p)'s exponent is the
// float 2^(23 - p) + n for p = 0, 4, ..., 16 (bits 0..19: the mantissa's), so one LOP3 (the mask an
// immediate, the exponent a register) and one FADD of an immediate turn a nibble into an exact
// float wherever it sits; the top three nibbles of a word are shifted down once (to 8, 12, 16).
// 9 integer instructions per 8 weights, where masking and then PRMT (q4_0's way) takes 10.
#define TWO_15 0x47000000u  // 2^15
#define TWO_11 0x45000000u  // 2^11
#define TWO_7 0x43000000u   // 2^7
__device__ __forceinline__ float magic_nibble(unsigned word, unsigned mask, unsigned exponent, float offset) {
    return __uint_as_float(and_or(word, mask, exponent)) - offset;
}

// One word of quants: the nibbles n of its 4 bytes, low (sub-block 2c) and high (2c + 1), as floats.
__device__ __forceinline__ void nibbles8(unsigned word, float (&lo)[4], float (&hi)[4]) {
    const unsigned up = word >> 12;  // byte 2's high nibble at 8, byte 3's at 12 (low) and 16 (high)
    lo[0] = magic_nibble(word, 0x0000000fu, TWO_23, 8388608.f);
    hi[0] = magic_nibble(word, 0x000000f0u, TWO_19, 524288.f);
    lo[1] = magic_nibble(word, 0x00000f00u, TWO_15, 32768.f);
    hi[1] = magic_nibble(word, 0x0000f000u, TWO_11, 2048.f);
    lo[2] = magic_nibble(word, 0x000f0000u, TWO_7, 128.f);
    hi[2] = magic_nibble(up, 0x00000f00u, TWO_15, 32768.f);
    lo[3] = magic_nibble(up, 0x0000f000u, TWO_11, 2048.f);
    hi[3] = magic_nibble(up, 0x000f0000u, TWO_7, 128.f);
}

// A super-block's header (uint4: d | dmin << 16, then the 12 bytes b), decoded once per step: d,
// dmin, and the 6-bit scales and mins as bytes (ggml's get_scale_min_k4: sc_j = b[j] & 63 and m_j
// = b[j + 4] & 63 for j < 4; for j >= 4 the low 4 bits from b[j + 4], the top 2 from b[j - 4]
// (sc) or b[j] (m)).
struct Header {
    float d, neg_dmin, shift_d, shift_m;  // shift_d = -2^23 d, shift_m = 2^23 dmin: exact
    unsigned sc[2], m[2];                 // byte j % 4 of sc[j / 4] is sc_j, of m[j / 4] m_j

    Header() = default;
    __device__ __forceinline__ explicit Header(uint4 h) {
        d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffffu)));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
        neg_dmin = -dmin;
        shift_d = -8388608.f * d;
        shift_m = 8388608.f * dmin;
        sc[0] = h.y & 0x3f3f3f3fu;
        m[0] = h.z & 0x3f3f3f3fu;
        sc[1] = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);
        m[1] = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);
    }
    // Sub-block j's scale d sc_j and negated min -dmin m_j, exactly: the byte under 2^23's exponent
    // (PRMT, as magic_byte) is 2^23 + sc, and fmaf(2^23 + sc, d, -2^23 d) = sc d, one instruction.
    __device__ __forceinline__ void sub_block(int j, float& scale, float& neg_min) const {
        scale = fmaf(__uint_as_float(__byte_perm(sc[j / 4], TWO_23, 0x7540 + j % 4)), d, shift_d);
        neg_min = fmaf(__uint_as_float(__byte_perm(m[j / 4], TWO_23, 0x7540 + j % 4)), neg_dmin, shift_m);
    }
};

// The 8 weights of one word of chunk c, exactly: lo[i] = (d sc_2c) n - dmin m_2c (one rounding: the
// product is exact), hi[i] likewise for sub-block 2c + 1.
__device__ __forceinline__ void q4k_weights(unsigned word, const float (&scale)[2], const float (&neg_min)[2],
                                            float (&lo)[4], float (&hi)[4]) {
    nibbles8(word, lo, hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo[i] = fmaf(lo[i], scale[0], neg_min[0]);
        hi[i] = fmaf(hi[i], scale[1], neg_min[1]);
    }
}

__device__ __forceinline__ int lanes_per_row_q4_k(int K, int widest) {
    return K < 1024 ? 1 : K < 8192 ? min(8, widest) : widest;
}

// Where a lane's rows and super-blocks are: LANES lanes share ROWS rows, super-block sub, sub +
// lanes, ... Counted in 16-byte vectors, in 32 bits (N * K / 256 * 9 < 2^32): one address per row
// and step, the super-block's 9 loads at immediate offsets from it.
struct Supers {
    static constexpr int R = ROWS_q4_K;
    const uint4* w;
    unsigned first[R];  // this lane's first super-block of each row, in 16-byte vectors
    int row0, sub;

    __device__ __forceinline__ Supers(const uint8_t* Wp, int N, int K, int lanes) {
        const unsigned supers = K / SUPER;
        const int lane = threadIdx.x % 32;
        sub = lane % lanes;
        row0 = ((blockIdx.x * WARPS + threadIdx.x / 32) * (32 / lanes) + lane / lanes) * R;
        w = reinterpret_cast<const uint4*>(Wp);
        // Rows past N are read as row N - 1 and never stored (as Rows does).
#pragma unroll
        for (int r = 0; r < R; ++r) first[r] = (min(row0 + r, N - 1) * supers + sub) * SUPER_VECS;
    }
};

// M = 1: a lane's step is one super-block of each of its ROWS rows, 9 loads each, all issued at
// the top of the step. Vector v = 1..8 is half of chunk c = (v - 1) / 2: its word e is word
// t = (v - 1) % 2 * 4 + e of the chunk, whose low nibbles multiply X's float4 16 c + t and high
// nibbles X's float4 16 c + 8 + t.
__device__ __forceinline__ void decode_q4_k_m1(const uint8_t* __restrict__ Wp, const float* __restrict__ X,
                                               float* __restrict__ Y, int N, int K) {
    constexpr int R = ROWS_q4_K, V = SUPER_VECS;
    const unsigned supers = K / SUPER;
    const int lanes = lanes_per_row_q4_k(K, 32);
    const Supers rows(Wp, N, K, lanes);
    const float4* x = reinterpret_cast<const float4*>(X + (size_t)blockIdx.y * K) + (size_t)rows.sub * (SUPER / 4);
    Y += (size_t)blockIdx.y * N;

    float acc[R][2];  // the low and the high nibbles' sums: two chains of FMAs per row
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = 0.f;
    unsigned at = 0;  // this step's super-block, from first[r], in 16-byte vectors
    for (unsigned s = rows.sub; s < supers; s += lanes, at += lanes * V, x += lanes * (SUPER / 4)) {
        uint4 raw[R][V];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const uint4* w = rows.w + (rows.first[r] + at);
#pragma unroll
            for (int v = 0; v < V; ++v) raw[r][v] = __ldcs(w + v);
        }
        Header header[R];
#pragma unroll
        for (int r = 0; r < R; ++r) header[r] = Header(raw[r][0]);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float scale[R][2], neg_min[R][2];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                header[r].sub_block(2 * c, scale[r][0], neg_min[r][0]);
                header[r].sub_block(2 * c + 1, scale[r][1], neg_min[r][1]);
            }
#pragma unroll
            for (int t = 0; t < 8; ++t) {
                const float4 xl = __ldg(x + 16 * c + t), xh = __ldg(x + 16 * c + 8 + t);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float lo[4], hi[4];
                    q4k_weights((&raw[r][1 + 2 * c + t / 4].x)[t % 4], scale[r], neg_min[r], lo, hi);
                    acc[r][0] = fmaf(lo[0], xl.x, acc[r][0]);
                    acc[r][0] = fmaf(lo[1], xl.y, acc[r][0]);
                    acc[r][0] = fmaf(lo[2], xl.z, acc[r][0]);
                    acc[r][0] = fmaf(lo[3], xl.w, acc[r][0]);
                    acc[r][1] = fmaf(hi[0], xh.x, acc[r][1]);
                    acc[r][1] = fmaf(hi[1], xh.y, acc[r][1]);
                    acc[r][1] = fmaf(hi[2], xh.z, acc[r][1]);
                    acc[r][1] = fmaf(hi[3], xh.w, acc[r][1]);
                }
            }
        }
    }
    float sum[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sum[r] = reduce(acc[r][0] + acc[r][1], lanes);
    if (rows.sub == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (rows.row0 + r < N) Y[rows.row0 + r] = sum[r];
    }
}

// M > 1: MT rows of X staged in shared memory SB super-blocks at a time (in the bytes the other
// formats' stage takes), each super-block of a row padded from 64 to 65 float4s, so that the lanes
// of a quarter-warp, which read the same float4 of up to 4 consecutive super-blocks, hit different
// banks; every dequantized weight applied to the MT rows.
template <int MT>
__device__ __forceinline__ void decode_q4_k_mt(const uint8_t* __restrict__ Wp, const float* __restrict__ X,
                                               float* __restrict__ Y, int M, int N, int K) {
    constexpr int R = ROWS_q4_K, V = SUPER_VECS;
    constexpr int SBLOCKS = MT == 16 ? STAGE_M16 : STAGE;
    constexpr int SB = MT == 16 ? SUPERS_PER_STAGE_M16 : SUPERS_PER_STAGE;
    static_assert(SB * SUPER_PADDED <= SBLOCKS * PADDED, "the stage fits the other formats' bytes");
    __shared__ float4 xs[MT][SBLOCKS * PADDED];

    const unsigned supers = K / SUPER;
    const int lanes = lanes_per_row_q4_k(K, SB);
    const Supers rows(Wp, N, K, lanes);
    const int m0 = blockIdx.y * MT;
    const int rows_of_x = min(MT, M - m0);
    const unsigned row_of_x = K / 4;  // in float4s
    const float4* x = reinterpret_cast<const float4*>(X) + (size_t)m0 * row_of_x;

    float acc[MT][R];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;

    for (unsigned s0 = 0; s0 < supers; s0 += SB) {
        __syncthreads();  // every warp is done with the previous stage
#pragma unroll
        for (int j = 0; j < SB * (SUPER / 4) / (WARPS * 32); ++j) {  // 2 (SB = 4) or 1 (2) float4s of a row
            const unsigned i = threadIdx.x + j * WARPS * 32;         // float4 i of the stage
            if (s0 + i / (SUPER / 4) < supers) {
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    if (m >= rows_of_x) break;
                    xs[m][i / (SUPER / 4) * SUPER_PADDED + i % (SUPER / 4)] =
                        __ldg(x + m * row_of_x + s0 * (SUPER / 4) + i);
                }
            }
        }
        __syncthreads();  // the stage is written

        for (unsigned u = rows.sub; u < SB && s0 + u < supers; u += lanes) {
            // The super-block's header, then a chunk (2 vectors) of each row at a time: the registers
            // of 16 rows of sums leave no room for all 9 vectors of both rows at once.
            const uint4* w[R];
            Header header[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                w[r] = rows.w + (rows.first[r] + (s0 + u - rows.sub) * V);
                header[r] = Header(__ldcs(w[r]));
            }
            const int at = u * SUPER_PADDED;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                uint4 raw[R][2];
                float scale[R][2], neg_min[R][2];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    raw[r][0] = __ldcs(w[r] + 1 + 2 * c);
                    raw[r][1] = __ldcs(w[r] + 2 + 2 * c);
                    header[r].sub_block(2 * c, scale[r][0], neg_min[r][0]);
                    header[r].sub_block(2 * c + 1, scale[r][1], neg_min[r][1]);
                }
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    float lo[R][4], hi[R][4];
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        q4k_weights((&raw[r][t / 4].x)[t % 4], scale[r], neg_min[r], lo[r], hi[r]);
#pragma unroll
                    for (int m4 = 0; m4 < MT; m4 += 4) {
                        if (m4 > 0 && m4 >= rows_of_x) break;
#pragma unroll
                        for (int m = m4; m < m4 + 4; ++m) {
                            const float4 xl = xs[m][at + 16 * c + t], xh = xs[m][at + 16 * c + 8 + t];
#pragma unroll
                            for (int r = 0; r < R; ++r) {
                                acc[m][r] = fmaf(lo[r][0], xl.x, acc[m][r]);
                                acc[m][r] = fmaf(lo[r][1], xl.y, acc[m][r]);
                                acc[m][r] = fmaf(lo[r][2], xl.z, acc[m][r]);
                                acc[m][r] = fmaf(lo[r][3], xl.w, acc[m][r]);
                                acc[m][r] = fmaf(hi[r][0], xh.x, acc[m][r]);
                                acc[m][r] = fmaf(hi[r][1], xh.y, acc[m][r]);
                                acc[m][r] = fmaf(hi[r][2], xh.z, acc[m][r]);
                                acc[m][r] = fmaf(hi[r][3], xh.w, acc[m][r]);
                            }
                        }
                    }
                }
            }
        }
    }
    reduce_and_store<MT, R>(acc, lanes, rows_of_x, rows.sub, rows.row0, m0, N, Y);
}

// The kernels, one per weight format and rows of X per pass (MT), all made from this one list:
// the wrappers below (DECODE_KERNEL), their @launch declarations above, and the names the
// harness gives the emulation (harness/backends/cuda/plans.py and emulation.py read it).
// clang-format off: one format a line
#define DECODE_KERNELS(X)                                                                                              \
    X(q4_0, 1) X(q4_0, 4) X(q4_0, 16)                                                                                  \
    X(q8_0, 1) X(q8_0, 4) X(q8_0, 16)                                                                                  \
    X(bf16, 1) X(bf16, 4) X(bf16, 16)                                                                                  \
    X(q4_K, 1) X(q4_K, 4) X(q4_K, 16)
// clang-format on

// Lanes per row of W, by format and MT (the launch's; the kernels' are lanes_per_row and
// lanes_per_row_q4_k), and bytes of X staged in shared memory, by MT.
#define LANES_q4_0_M1 LANES_PER_ROW
#define LANES_q4_0_M4 LANES_PER_ROW
#define LANES_q4_0_M16 LANES_PER_ROW_M16
#define LANES_q8_0_M1 LANES_PER_ROW
#define LANES_q8_0_M4 LANES_PER_ROW
#define LANES_q8_0_M16 LANES_PER_ROW_M16
#define LANES_bf16_M1 LANES_PER_ROW
#define LANES_bf16_M4 LANES_PER_ROW
#define LANES_bf16_M16 LANES_PER_ROW_M16
#define LANES_q4_K_M1 LANES_PER_ROW_q4_K
#define LANES_q4_K_M4 (1 + (SUPERS_PER_STAGE - 1) * min(1, K / 1024))
#define LANES_q4_K_M16 (1 + (SUPERS_PER_STAGE_M16 - 1) * min(1, K / 1024))
#define STAGE_BYTES_M1 0
#define STAGE_BYTES_M4 (4 * STAGE * PADDED * 16)
#define STAGE_BYTES_M16 (16 * STAGE_M16 * PADDED * 16)
#define FORMAT_q4_0 Q4_0
#define FORMAT_q8_0 Q8_0
#define FORMAT_bf16 BF16
#define FORMAT_q4_K Q4_K

template <int F, int MT>
__device__ __forceinline__ void decode_rows(const uint8_t* __restrict__ W, const float* __restrict__ X,
                                            float* __restrict__ Y, int M, int N, int K) {
    if constexpr (F == Q4_K && MT == 1)
        decode_q4_k_m1(W, X, Y, N, K);
    else if constexpr (F == Q4_K)
        decode_q4_k_mt<MT>(W, X, Y, M, N, K);
    else if constexpr (MT == 1)
        decode_m1<F>(W, X, Y, N, K);
    else
        decode_mt<F, MT>(W, X, Y, M, N, K);
}

#define DECODE_KERNEL(fmt, mt)                                                                                         \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) decode_##fmt##_m##mt##_f32(                               \
        const uint8_t* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int M, int N, int K) {      \
        decode_rows<FORMAT_##fmt, mt>(W, X, Y, M, N, K);                                                               \
    }
DECODE_KERNELS(DECODE_KERNEL)
