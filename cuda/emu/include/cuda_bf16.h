// Stand-in for CUDA's cuda_bf16.h, for the CPU emulation only (never on nvcc's path).
// __nv_bfloat16 is the top half of an IEEE float; float -> bf16 rounds to nearest even.
#pragma once
#include <cstring>

#include "cuda_fp16.h"

struct __nv_bfloat16 {
    unsigned short x;
};

inline __nv_bfloat16 __float2bfloat16(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    __nv_bfloat16 out;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        out.x = static_cast<unsigned short>((u >> 16) | 0x40u);  // NaN stays a (quiet) NaN
        return out;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    out.x = static_cast<unsigned short>(u >> 16);
    return out;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) {
    const unsigned u = static_cast<unsigned>(h.x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
