// ptx.h - the PTX instructions that cuda/mma.cu and cuda/wgmma.cu use, one named device
// function each.
//
// On nvcc each function is the instruction itself, as inline PTX. In the CPU emulation
// (cuda/emu/, where cuda_emu.h defines CUDA_EMULATION) the same names come from
// cuda/emu/include/ptx_emu.h, which implements each instruction with the semantics stated
// here: ldmatrix and mma.sync as warp-collective operations over the 32 lanes' registers with
// the lane-to-element mapping below, cp.async copies that land only when wait_group says so;
// mbarriers with phases and transaction counts, TMA copies through a tensor-map stand-in that
// land only when a wait observes their barrier, wgmma reading shared memory through its
// descriptors (see the Hopper section below).
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
__device__ __forceinline__ smem_t smem_address(const void* p) {
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
__device__ __forceinline__ void ldmatrix_x1(unsigned& r0, smem_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r0) : "r"(address) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(unsigned& r0, unsigned& r1, smem_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1)
                 : "r"(address)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, smem_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(address)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(unsigned& r0, smem_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r0) : "r"(address) : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned& r0, unsigned& r1, smem_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r0), "=r"(r1)
                 : "r"(address)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                                                  smem_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(address)
                 : "memory");
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
                                                  const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
}
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                 const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
}

// ---- cp.async.cg.shared.global [dst], [src], 16, src_bytes ---------------------------------------
// Starts an asynchronous copy of 16 bytes from global to shared memory (both 16-byte aligned),
// cached in L2 only (.cg). Only the first src_bytes (0..16) are read; the rest of the 16 are
// zero-filled. The copy joins the thread's current (uncommitted) group; nothing may be assumed
// about when it lands until a wait_group covers that group.
__device__ __forceinline__ void cp_async_16(smem_t dst, const void* src, unsigned src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// cp.async.commit_group: the copies issued since the last commit become one group.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// cp.async.wait_group N: waits until at most N of the thread's most recent groups are pending;
// all older groups have landed in shared memory, visible to this thread (other threads need a
// barrier as well).
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ==== Hopper (sm_90a): mbarrier, TMA, wgmma, setmaxnreg (cuda/wgmma.cu) ===========================
//
// PTX ISA sections: "Parallel Synchronization and Communication Instructions: mbarrier",
// "Data Movement and Conversion Instructions: cp.async.bulk.tensor", "Asynchronous Warpgroup
// Level Matrix Multiply-Accumulate Instructions" (wgmma) and "Miscellaneous: setmaxnreg".

// A CUtensorMap's bytes (cuTensorMapEncodeTiled writes them on the host): 128 bytes, aligned
// as cuda.h declares CUtensorMap (alignas(128) since CUDA 12.x; tests/test_sass.py compares),
// passed to the kernel as a `const __grid_constant__` parameter so that its address is a
// parameter-space address the TMA unit can read.
struct alignas(128) TensorMap {
    unsigned long long opaque[16];
};

// The dynamic shared memory of the block (the launch's shared_size bytes).
__device__ __forceinline__ unsigned char* dynamic_shared_memory() {
    extern __shared__ __align__(1024) unsigned char ptx_dynamic_shared[];
    return ptx_dynamic_shared;
}

// ---- mbarrier (a 64-bit object in shared memory, 8-byte aligned) --------------------------------
// State: a phase number (starting at 0), the arrivals the current phase still waits for
// (starting at the init count) and a transaction count (bytes, starting at 0). The phase
// completes when both are zero: the phase number advances, the pending arrivals return to the
// init count. try_wait.parity(P) is true once the phase with parity P has completed, i.e. while
// the current phase's parity is not P: on a fresh barrier parity 1 is "complete" already.
__device__ __forceinline__ void mbarrier_init(smem_t bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the inits visible to the async proxy (the TMA unit) before any copy signals them.
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// One arrival (release semantics: this thread's earlier memory accesses happen before the
// phase completes).
__device__ __forceinline__ void mbarrier_arrive(smem_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Adds bytes to the transaction count, then one arrival: the phase now also waits for that
// many bytes of complete_tx (from the TMA copies that name this barrier).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(smem_t bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Non-blocking test (it may suspend for a hardware time limit): has the phase with this parity
// completed? Acquire semantics when true: what the arrivals released, and the bytes the copies
// wrote, are visible.
__device__ __forceinline__ bool mbarrier_try_wait_parity(smem_t bar, unsigned parity) {
    unsigned done;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}
__device__ __forceinline__ void mbarrier_wait_parity(smem_t bar, unsigned parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {}
}

// ---- fence.proxy.async.shared::cta ----------------------------------------------------------------
// Orders this thread's generic-proxy accesses to shared memory (plain loads and stores) with
// later async-proxy accesses (TMA, wgmma's operand reads), and the converse.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes -------------------
// One box of the 2-D tensor that `map` describes, its corner at (column x, row y) in elements,
// copied to shared memory at dst (128-byte aligned; 1024 for the 128B swizzle to start at its
// pattern's origin). Elements outside the tensor are written as zeros. The box lands laid out
// row after row (box_cols * element bytes per row) and, with CU_TENSOR_MAP_SWIZZLE_128B, each
// 16-byte chunk of the shared address moves by XOR of address bits [4, 7) with bits [7, 10)
// (the chunk index within a 128-byte row with the row index mod 8). When it has landed the copy
// performs complete_tx(box bytes, zero-filled ones included) on the mbarrier bar.
__device__ __forceinline__ void tma_load_2d(smem_t dst, const TensorMap* map, int x, int y, smem_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// ---- wgmma.fence / commit_group / wait_group ----------------------------------------------------
// fence: before the first wgmma, and whenever the accumulator registers were touched by other
// instructions since. commit_group: the wgmma ops issued since the last commit form a group.
// wait_group N: until at most N groups are pending; only then may the accumulators be read, or
// the shared memory the completed groups read be overwritten.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait_group() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// ---- wgmma.mma_async.sync.aligned.m64n256k16.f32.{bf16,f16}.{bf16,f16} ----------------------------
// D [64 x 256] (+)= A [64 x 16] * B [16 x 256], issued by the 4 warps of a warp group together,
// A and B read from shared memory through the descriptors: A K-major (tnspA 0), B MN-major
// (tnspB 1: B stored [K, N] with N contiguous). scale_d 0: D = A * B (the old D ignored).
// Accumulator fragment (ISA "Matrix fragments for wgmma .m64nNk16", D of .f32): 128 registers
// d[i] per thread; warp w (0..3) of the warp group owns rows 16 w .. 16 w + 15; in it, lane l
// holds row 16 w + l / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (l % 4) + (i % 2).
#define PTX_WGMMA_N256(TYPE)                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                 \
    asm volatile(                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
        "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                      \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                         \
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                        \
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                             \
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                            \
          "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                       \
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                  \
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                  \
          "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                  \
          "+f"(d[126]), "+f"(d[127])                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                         \
        : "l"(a_desc), "l"(b_desc), "r"(scale_d))
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[128], unsigned long long a_desc,
                                                      unsigned long long b_desc, int scale_d) {
    PTX_WGMMA_N256("bf16");
}
__device__ __forceinline__ void wgmma_m64n256k16_f16(float (&d)[128], unsigned long long a_desc,
                                                     unsigned long long b_desc, int scale_d) {
    PTX_WGMMA_N256("f16");
}
#undef PTX_WGMMA_N256

// ---- setmaxnreg.{inc,dec}.sync.aligned.u32 N --------------------------------------------------
// Raises (inc) or lowers (dec) the registers per thread of the executing warp group to N:
// N a multiple of 8 in [24, 256], the same for all 4 warps of the warp group. Producer warp
// groups give registers back so that the consumers can hold larger accumulator tiles.
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

}  // namespace ptx

#endif  // CUDA_EMULATION

// ---- Shared by the GPU and the emulation: plain arithmetic, no instruction --------------------------
namespace ptx {

// ---- wgmma shared-memory matrix descriptor (64 bits) ------------------------------------------
// bits  0-13: start address >> 4           bits 16-29: leading dimension byte offset >> 4
// bits 32-45: stride dimension byte offset >> 4   bits 49-51: base offset (0: patterns start
// 1024-byte aligned)   bits 62-63: swizzle mode (0 none, 1 128B, 2 64B, 3 32B).
// Layouts of a 16-bit operand with the 128B swizzle, in bytes before the swizzle of the address
// (the same XOR as the TMA's, so a box the TMA wrote is read back in place):
//   K-major (the 8 x 16-bit = 16 k of each row contiguous): element (row r, k) at
//     start + (r % 8) * 128 + (r / 8) * SBO + 2 k. LBO is unused (the 16 k fit in a row).
//   MN-major (.trans; rows of 64 MN elements contiguous): element (k, mn) at
//     start + (k % 8) * 128 + (k / 8) * SBO + 2 (mn % 64) + (mn / 64) * LBO.
constexpr int kSwizzleNone = 0, kSwizzle128B = 1, kSwizzle64B = 2, kSwizzle32B = 3;
__host__ __device__ constexpr unsigned long long wgmma_descriptor(unsigned long long address, unsigned lbo,
                                                                  unsigned sbo, int swizzle) {
    // address & 0x3ffff: a shared-window address fits in 18 bits (228 KiB); the emulation's window
    // is 256 KiB-aligned, so its low 18 bits are the offset in the window there too.
    return ((address & 0x3ffff) >> 4) | (static_cast<unsigned long long>((lbo >> 4) & 0x3fff) << 16) |
           (static_cast<unsigned long long>((sbo >> 4) & 0x3fff) << 32) |
           (static_cast<unsigned long long>(swizzle & 3) << 62);
}

}  // namespace ptx
