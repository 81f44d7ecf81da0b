// selfcheck_half.h - a standalone driver for one emulated BF16 or FP16 GEMM kernel taking
// (A, B, C, M, N, K), as selfcheck.h is for FP32 ones (see there why sanitizer builds are
// programs of their own).
//
//     program KERNEL bf16|f16 M N K GRID_X GRID_Y GRID_Z BLOCK_X BLOCK_Y BLOCK_Z
//
// A, B and C are allocated at exactly their sizes (new[] aligns them to 16 bytes, as the
// kernels' vector paths want), so a read or write past an edge is a heap-buffer-overflow for
// AddressSanitizer. The product is checked against a double-precision loop over the same
// 16-bit inputs, to the output's rounding (2^-8 relative for BF16) plus FP32 summation.
// Exit status: 0 it matches, 1 it does not, 2 bad arguments, 3 the launch failed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace selfcheck {
template <class T> struct Codec;
template <> struct Codec<__nv_bfloat16> {
    static __nv_bfloat16 from(float v) { return __float2bfloat16(v); }
    static double to(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <> struct Codec<__half> {
    static __half from(float v) { return __float2half(v); }
    static double to(__half v) { return __half2float(v); }
};

template <class T> int run(int index, int M, int N, int K, const unsigned grid[3], const unsigned block[3]) {
    T* A = new T[size_t(M) * K];
    T* B = new T[size_t(K) * N];
    T* C = new T[size_t(M) * N];
    unsigned state = 12345u;
    auto next = [&] {
        state = state * 1664525u + 1013904223u;
        return float(state >> 8) / float(1u << 24) * 2.f - 1.f;
    };
    for (size_t i = 0; i < size_t(M) * K; ++i) A[i] = Codec<T>::from(next());
    for (size_t i = 0; i < size_t(K) * N; ++i) B[i] = Codec<T>::from(next());
    void* args[] = {&A, &B, &C, &M, &N, &K};
    char error[4096] = {0};  // a deadlock report names every thread's wait
    if (emu_launch(index, grid, block, args, error, sizeof error) != 0) {
        std::fprintf(stderr, "launch failed: %s\n", error);
        return 3;
    }
    double worst = 0.0;  // in units of the allowed error
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double ref = 0.0, magnitude = 0.0;
            for (int k = 0; k < K; ++k) {
                const double p = Codec<T>::to(A[size_t(i) * K + k]) * Codec<T>::to(B[size_t(k) * N + j]);
                ref += p;
                magnitude += std::fabs(p);
            }
            const double allowed = std::fabs(ref) / 128.0 + 1e-6 * magnitude + 1e-6;
            worst = std::fmax(worst, std::fabs(ref - Codec<T>::to(C[size_t(i) * N + j])) / allowed);
        }
    std::printf("max_error_over_allowed %.3g\n", worst);
    delete[] A;
    delete[] B;
    delete[] C;
    return worst <= 1.0 ? 0 : 1;
}
}  // namespace selfcheck

int main(int argc, char** argv) {
    if (argc != 12) {
        std::fprintf(stderr, "usage: %s KERNEL bf16|f16 M N K GRID_X GRID_Y GRID_Z BLOCK_X BLOCK_Y BLOCK_Z\n", argv[0]);
        return 2;
    }
    int index = -1;
    for (int i = 0; i < emu_kernel_count(); ++i)
        if (std::strcmp(emu_kernel_name(i), argv[1]) == 0) index = i;
    if (index < 0 || std::strcmp(emu_kernel_signature(index), "PPPiii") != 0) {
        std::fprintf(stderr, "no GEMM kernel (A, B, C, M, N, K) named %s\n", argv[1]);
        return 2;
    }
    const int M = std::atoi(argv[3]), N = std::atoi(argv[4]), K = std::atoi(argv[5]);
    const unsigned grid[3] = {unsigned(std::atoi(argv[6])), unsigned(std::atoi(argv[7])), unsigned(std::atoi(argv[8]))};
    const unsigned block[3] = {unsigned(std::atoi(argv[9])), unsigned(std::atoi(argv[10])),
                               unsigned(std::atoi(argv[11]))};
    if (M < 1 || N < 1 || K < 1) return 2;
    if (std::strcmp(argv[2], "bf16") == 0) return selfcheck::run<__nv_bfloat16>(index, M, N, K, grid, block);
    if (std::strcmp(argv[2], "f16") == 0) return selfcheck::run<__half>(index, M, N, K, grid, block);
    return 2;
}
