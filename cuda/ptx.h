// ptx.h - the PTX instructions that cuda/mma.cu uses, one named device function each.
//
// On nvcc each function is the instruction itself, as inline PTX. In the CPU emulation
// (cuda/emu/, where cuda_emu.h defines CUDA_EMULATION) the same names come from
// cuda/emu/include/ptx_emu.h, which implements each instruction with the semantics stated
// here: ldmatrix and mma.sync as warp-collective operations over the 32 lanes' registers with
// the lane-to-element mapping below, cp.async copies that land only when wait_group says so.
// A kernel that assumes another layout, or reads shared memory before waiting, computes wrong
// results there as it would on the GPU.
//
// Notation (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point type" and
// "Warp-level matrix load instruction: ldmatrix"): lane = %laneid (0..31),
// groupID = lane >> 2, threadID_in_group = lane % 4. A .b32 register holding two 16-bit
// elements keeps the lower-indexed one in its low half.
//
// Shared-memory addresses are what __cvta_generic_to_shared returns (a 32-bit offset in the
// shared window on the GPU; a host address in the emulation), held as `smem_t`; kernels do
// their address (and swizzle) arithmetic on it in bytes.
#pragma once

#ifdef CUDA_EMULATION
#include "ptx_emu.h"
#else

namespace ptx {

using smem_t = unsigned;

// cvta.to.shared: the shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ smem_t smem_address(const void* p)
{
    return static_cast<smem_t>(__cvta_generic_to_shared(p));
}

// ---- ldmatrix.sync.aligned.m8n8{.x1,.x2,.x4}{,.trans}.shared.b16 ----------------------------------
// Loads 1, 2 or 4 matrices of 8 x 8 16-bit elements, one per destination register r_i.
// Row addresses: lanes 0-7 give the 8 rows of matrix 0, lanes 8-15 of matrix 1, 16-23 of
// matrix 2, 24-31 of matrix 3 (lane 8i + j: row j of matrix i); each row is 16 contiguous,
// 16-byte-aligned bytes. .x1 uses the addresses of lanes 0-7 only, .x2 those of lanes 0-15.
// Fragment: in r_i, lane l holds row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix i.
// .trans: the same with each matrix transposed: lane l holds elements (2 (l % 4), l / 4) and
// (2 (l % 4) + 1, l / 4), (row, column) of the matrix as stored.
// Volatile with a "memory" clobber: it reads shared memory that other threads wrote, so it must
// stay after the barrier that publishes it.
__device__ __forceinline__ void ldmatrix_x1(unsigned& r0, smem_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r0) : "r"(address) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(unsigned& r0, unsigned& r1, smem_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(address) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, smem_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(address) : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(unsigned& r0, smem_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r0) : "r"(address) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned& r0, unsigned& r1, smem_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1) : "r"(address) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, smem_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(address) : "memory");
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 -----------------------------
// D [16 x 8] = A [16 x 16] * B [16 x 8] + C [16 x 8], FP32 accumulation, over the whole warp.
// A: 4 .b32 registers a[0..3] holding a0..a7 (a[j] = a_{2j}, a_{2j+1}):
//     row = groupID + 8 for a2, a3, a6, a7 (a[1], a[3]); col = threadID_in_group * 2 + (i & 1),
//     + 8 for a4..a7 (a[2], a[3]).
// B: 2 .b32 registers b[0..1] holding b0..b3: row (k) = threadID_in_group * 2 + (i & 1), + 8
//     for b2, b3 (b[1]); col (n) = groupID.
// C, D: 4 .f32 registers c0..c3: row = groupID, + 8 for c2, c3; col = threadID_in_group * 2 + (i & 1).
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                  const float (&c)[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                 const float (&c)[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// ---- cp.async.cg.shared.global [dst], [src], 16, src_bytes ---------------------------------------
// Starts an asynchronous copy of 16 bytes from global to shared memory (both 16-byte aligned),
// cached in L2 only (.cg). Only the first src_bytes (0..16) are read; the rest of the 16 are
// zero-filled. The copy joins the thread's current (uncommitted) group; nothing may be assumed
// about when it lands until a wait_group covers that group.
__device__ __forceinline__ void cp_async_16(smem_t dst, const void* src, unsigned src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// cp.async.commit_group: the copies issued since the last commit become one group.
__device__ __forceinline__ void cp_async_commit_group()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// cp.async.wait_group N: waits until at most N of the thread's most recent groups are pending;
// all older groups have landed in shared memory, visible to this thread (other threads need a
// barrier as well).
template <int N>
__device__ __forceinline__ void cp_async_wait_group()
{
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

}  // namespace ptx

#endif  // CUDA_EMULATION
