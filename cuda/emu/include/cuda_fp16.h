// Stand-in for CUDA's cuda_fp16.h, for the CPU emulation only (never on nvcc's path).
// __half is an IEEE binary16 bit pattern; conversions round to nearest even like the GPU's.
#pragma once
#include <cstring>

struct __half {
    unsigned short x;  // trivially default-constructible, so `__shared__ __half s[..]` is a plain static array
};

inline __half __float2half(float f) {
    _Float16 h = static_cast<_Float16>(f);  // GCC >= 12 / clang: IEEE round-to-nearest-even
    __half out;
    std::memcpy(&out.x, &h, 2);
    return out;
}
inline __half __float2half_rn(float f) { return __float2half(f); }
// Exact, and done with integer operations: a _Float16 -> float conversion may be a library
// call per element, which made the WMMA emulation many times slower for FP16 than for BF16.
inline float __half2float(__half h) {
    const unsigned sign = (h.x & 0x8000u) << 16, exponent = (h.x >> 10) & 0x1fu, mantissa = h.x & 0x3ffu;
    unsigned bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);  // Inf, NaN
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // normal: rebias 15 -> 127
    } else if (mantissa == 0) {
        bits = sign;  // +-0
    } else {          // subnormal: mantissa * 2^-24, exact in float
        float f = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
        std::memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    std::memcpy(&out, &bits, 4);
    return out;
}
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
