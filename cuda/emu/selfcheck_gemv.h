// selfcheck_gemv.h - a standalone driver for one emulated GEMV kernel taking (W, x, y, N, K),
// as selfcheck.h is for the GEMM kernels (see there why sanitizer builds are programs of their own).
//
//     program KERNEL f32|bf16 N K GRID_X BLOCK_X
//
// W [N, K], x [K] and y [N] are allocated at exactly their sizes (new[] aligns them to 16
// bytes, as the kernel's vector path wants), so a read or write past an edge is a
// heap-buffer-overflow for AddressSanitizer. y is checked against a double-precision loop over
// the same inputs, to the output's rounding (2^-8 relative for BF16) plus FP32 summation.
// Exit status: 0 it matches, 1 it does not, 2 bad arguments, 3 the launch failed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_bf16.h>

namespace selfcheck {
template <class T> struct Codec;
template <> struct Codec<float> {
    static float from(float v) { return v; }
    static double to(float v) { return v; }
    static constexpr double relative = 1e-6;
};
template <> struct Codec<__nv_bfloat16> {
    static __nv_bfloat16 from(float v) { return __float2bfloat16(v); }
    static double to(__nv_bfloat16 v) { return __bfloat162float(v); }
    static constexpr double relative = 1.0 / 128;
};

template <class T> int run(int index, int N, int K, const unsigned grid[3], const unsigned block[3]) {
    T* W = new T[size_t(N) * K];
    T* x = new T[size_t(K)];
    T* y = new T[size_t(N)];
    unsigned state = 12345u;
    auto next = [&] {
        state = state * 1664525u + 1013904223u;
        return float(state >> 8) / float(1u << 24) * 2.f - 1.f;
    };
    for (size_t i = 0; i < size_t(N) * K; ++i) W[i] = Codec<T>::from(next());
    for (size_t i = 0; i < size_t(K); ++i) x[i] = Codec<T>::from(next());
    void* args[] = {&W, &x, &y, &N, &K};
    char error[4096] = {0};  // a deadlock report names every thread's wait
    if (emu_launch(index, grid, block, args, error, sizeof error) != 0) {
        std::fprintf(stderr, "launch failed: %s\n", error);
        return 3;
    }
    double worst = 0.0;  // in units of the allowed error
    for (int n = 0; n < N; ++n) {
        double ref = 0.0, magnitude = 0.0;
        for (int k = 0; k < K; ++k) {
            const double p = Codec<T>::to(W[size_t(n) * K + k]) * Codec<T>::to(x[k]);
            ref += p;
            magnitude += std::fabs(p);
        }
        const double allowed = std::fabs(ref) * Codec<T>::relative + 1e-6 * magnitude + 1e-6;
        worst = std::fmax(worst, std::fabs(ref - Codec<T>::to(y[n])) / allowed);
    }
    std::printf("max_error_over_allowed %.3g\n", worst);
    delete[] W;
    delete[] x;
    delete[] y;
    return worst <= 1.0 ? 0 : 1;
}
}  // namespace selfcheck

int main(int argc, char** argv) {
    if (argc != 7) {
        std::fprintf(stderr, "usage: %s KERNEL f32|bf16 N K GRID_X BLOCK_X\n", argv[0]);
        return 2;
    }
    int index = -1;
    for (int i = 0; i < emu_kernel_count(); ++i)
        if (std::strcmp(emu_kernel_name(i), argv[1]) == 0) index = i;
    if (index < 0 || std::strcmp(emu_kernel_signature(index), "PPPii") != 0) {
        std::fprintf(stderr, "no GEMV kernel (W, x, y, N, K) named %s\n", argv[1]);
        return 2;
    }
    const int N = std::atoi(argv[3]), K = std::atoi(argv[4]);
    const unsigned grid[3] = {unsigned(std::atoi(argv[5])), 1, 1}, block[3] = {unsigned(std::atoi(argv[6])), 1, 1};
    if (N < 1 || K < 1) return 2;
    if (std::strcmp(argv[2], "f32") == 0) return selfcheck::run<float>(index, N, K, grid, block);
    if (std::strcmp(argv[2], "bf16") == 0) return selfcheck::run<__nv_bfloat16>(index, N, K, grid, block);
    return 2;
}
