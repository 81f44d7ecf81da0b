// ptx_emu.h - cuda/ptx.h on the CPU emulation (never on nvcc's path): every instruction of
// that header, with the semantics it states (the PTX ISA's).
//
//  - ldmatrix and mma.sync are warp-collective: each lane deposits its operands (a row
//    address; its A, B and C registers) in the warp's exchange area and waits at the warp
//    barrier. Then each lane of ldmatrix reads its own elements from the addresses of the
//    lanes the ISA names; for mma.sync lane 0 assembles A, B and C from the 32 lanes' registers
//    through the ISA's lane-to-element mapping, multiplies, and scatters D the same way; after a
//    second barrier each lane takes its D registers, and a third keeps the area until all have.
//    Nothing here knows which layout a kernel "meant": registers in the wrong order, or a B
//    fragment loaded without .trans, give wrong products, as on the GPU.
//  - cp.async reads global memory when issued and lands in shared memory when MATMUL_EMU_ASYNC
//    says (cuda_emu.h): at the wait_group that covers its group (the latest moment the ISA
//    allows, the default), at issue, or at a random scheduling point of its thread in between.
//  - Misaligned addresses, which the GPU faults on, abort with a message.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace ptx {

using smem_t = std::uintptr_t;

inline smem_t smem_address(const void* p) { return static_cast<smem_t>(__cvta_generic_to_shared(p)); }

namespace detail {

struct WarpExchange {
    smem_t address[::emu::kWarpSize];
    unsigned a[::emu::kWarpSize][4];
    unsigned b[::emu::kWarpSize][2];
    float c[::emu::kWarpSize][4];
    float d[::emu::kWarpSize][4];
};
inline WarpExchange exchange[::emu::kMaxWarps];

inline unsigned short element16(smem_t row_address, int column) {
    unsigned short v;
    std::memcpy(&v, reinterpret_cast<const unsigned char*>(row_address) + 2 * column, 2);
    return v;
}

// ldmatrix .x<COUNT> [.trans]: register i of lane l from matrix i, whose row j is at the
// address lane 8 i + j gave.
template <int COUNT, bool TRANS> inline void ldmatrix(unsigned* r, smem_t address) {
    const int lane = ::emu::lane_id();
    WarpExchange& x = exchange[::emu::warp_id()];
    x.address[lane] = address;
    ::emu::warp_barrier();
    for (int i = 0; i < COUNT; ++i)
        for (int j = 0; j < 8; ++j)
            if (x.address[8 * i + j] % 16 != 0) ::emu::fault("ldmatrix: a row address is not 16-byte aligned");
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < COUNT; ++i) {
        unsigned lo, hi;
        if (TRANS) {  // elements (2t, g) and (2t + 1, g) of matrix i
            lo = element16(x.address[8 * i + 2 * t], g);
            hi = element16(x.address[8 * i + 2 * t + 1], g);
        } else {  // elements (g, 2t) and (g, 2t + 1)
            lo = element16(x.address[8 * i + g], 2 * t);
            hi = element16(x.address[8 * i + g], 2 * t + 1);
        }
        r[i] = lo | (hi << 16);
    }
    ::emu::warp_barrier();  // every lane has read the addresses before any lane deposits new ones
}

inline float widen(unsigned short bits, const __nv_bfloat16*) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
inline float widen(unsigned short bits, const __half*) { return __half2float(__ushort_as_half(bits)); }

// The m16n8k16 fragments (ptx.h), as (row, column) of element i of lane l.
inline int a_row(int lane, int i) { return lane / 4 + 8 * ((i / 2) % 2); }
inline int a_col(int lane, int i) { return (lane % 4) * 2 + (i % 2) + 8 * (i / 4); }
inline int b_row(int lane, int i) { return (lane % 4) * 2 + (i % 2) + 8 * (i / 2); }
inline int b_col(int lane, int) { return lane / 4; }
inline int c_row(int lane, int i) { return lane / 4 + 8 * (i / 2); }
inline int c_col(int lane, int i) { return (lane % 4) * 2 + (i % 2); }

template <class T>
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
    const int lane = ::emu::lane_id();
    WarpExchange& x = exchange[::emu::warp_id()];
    std::memcpy(x.a[lane], a, sizeof a);
    std::memcpy(x.b[lane], b, sizeof b);
    std::memcpy(x.c[lane], c, sizeof c);
    ::emu::warp_barrier();
    if (lane == 0) {
        float A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; ++l) {
            for (int i = 0; i < 8; ++i)
                A[a_row(l, i)][a_col(l, i)] =
                    widen(static_cast<unsigned short>(x.a[l][i / 2] >> (16 * (i % 2))), static_cast<const T*>(nullptr));
            for (int i = 0; i < 4; ++i)
                B[b_row(l, i)][b_col(l, i)] =
                    widen(static_cast<unsigned short>(x.b[l][i / 2] >> (16 * (i % 2))), static_cast<const T*>(nullptr));
            for (int i = 0; i < 4; ++i) C[c_row(l, i)][c_col(l, i)] = x.c[l][i];
        }
        // Products of 16-bit inputs are exact in FP32; sums in FP32, k in order.
        for (int l = 0; l < 32; ++l)
            for (int i = 0; i < 4; ++i) {
                const int row = c_row(l, i), col = c_col(l, i);
                float sum = C[row][col];
                for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
                x.d[l][i] = sum;
            }
    }
    ::emu::warp_barrier();  // D is in the exchange area
    std::memcpy(d, x.d[lane], sizeof d);
    ::emu::warp_barrier();  // every lane has its D before the area is reused
}

}  // namespace detail

inline void ldmatrix_x1(unsigned& r0, smem_t address) {
    unsigned r[1];
    detail::ldmatrix<1, false>(r, address);
    r0 = r[0];
}
inline void ldmatrix_x2(unsigned& r0, unsigned& r1, smem_t address) {
    unsigned r[2];
    detail::ldmatrix<2, false>(r, address);
    r0 = r[0], r1 = r[1];
}
inline void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, smem_t address) {
    unsigned r[4];
    detail::ldmatrix<4, false>(r, address);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
inline void ldmatrix_x1_trans(unsigned& r0, smem_t address) {
    unsigned r[1];
    detail::ldmatrix<1, true>(r, address);
    r0 = r[0];
}
inline void ldmatrix_x2_trans(unsigned& r0, unsigned& r1, smem_t address) {
    unsigned r[2];
    detail::ldmatrix<2, true>(r, address);
    r0 = r[0], r1 = r[1];
}
inline void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, smem_t address) {
    unsigned r[4];
    detail::ldmatrix<4, true>(r, address);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}

inline void mma_m16n8k16_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
    detail::mma_m16n8k16<__nv_bfloat16>(d, a, b, c);
}
inline void mma_m16n8k16_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
    detail::mma_m16n8k16<__half>(d, a, b, c);
}

// cp.async.cg 16 bytes: the first src_bytes read now, the rest zero; lands at wait_group.
inline void cp_async_16(smem_t dst, const void* src, unsigned src_bytes) {
    if (src_bytes > 16) ::emu::fault("cp.async: src-size larger than the copy size (16)");
    if (dst % 16 != 0) ::emu::fault("cp.async: shared destination not 16-byte aligned");
    if (src_bytes > 0 && reinterpret_cast<std::uintptr_t>(src) % 16 != 0)
        ::emu::fault("cp.async: global source not 16-byte aligned");
    ::emu::AsyncCopy copy;
    copy.destination = reinterpret_cast<unsigned char*>(dst);
    std::memset(copy.bytes, 0, sizeof copy.bytes);
    if (src_bytes > 0) std::memcpy(copy.bytes, src, src_bytes);
    if (::emu::async_policy.landing == ::emu::Landing::at_issue) {
        std::memcpy(copy.destination, copy.bytes, sizeof copy.bytes);
        return;
    }
    ::emu::self->async_open.push_back(copy);
    ::emu::async_progress(*::emu::self, false);
}
inline void cp_async_commit_group() {
    ::emu::ThreadState& s = *::emu::self;
    s.async_groups.push_back(std::move(s.async_open));
    s.async_open.clear();
    ::emu::async_progress(s, false);
}
template <int N> inline void cp_async_wait_group() {
    static_assert(N >= 0, "cp.async.wait_group takes a non-negative count");
    ::emu::async_wait(*::emu::self, size_t(N));
}

}  // namespace ptx

#include "hopper_emu.h"  // mbarrier, TMA, wgmma, setmaxnreg (sm_90a)
