// selfcheck.h - a standalone driver for one emulated FP32 GEMM kernel taking (A, B, C, M, N, K).
//
// Sanitizer builds run as programs of their own rather than inside Python: loading a
// ThreadSanitizer- or AddressSanitizer-instrumented library into an uninstrumented interpreter
// needs the sanitizer runtime preloaded and reports the interpreter's own noise.
//
//     program KERNEL M N K GRID_X GRID_Y GRID_Z BLOCK_X BLOCK_Y BLOCK_Z
//
// A, B and C are allocated at exactly their sizes, so a read or write past an edge is a
// heap-buffer-overflow for AddressSanitizer. Exit status: 0 the product matches a double-precision
// loop, 1 it does not, 2 bad arguments, 3 the launch failed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
    if (argc != 11) {
        std::fprintf(stderr, "usage: %s KERNEL M N K GRID_X GRID_Y GRID_Z BLOCK_X BLOCK_Y BLOCK_Z\n", argv[0]);
        return 2;
    }
    int index = -1;
    for (int i = 0; i < emu_kernel_count(); ++i)
        if (std::strcmp(emu_kernel_name(i), argv[1]) == 0) index = i;
    if (index < 0 || std::strcmp(emu_kernel_signature(index), "PPPiii") != 0) {
        std::fprintf(stderr, "no FP32 GEMM kernel (A, B, C, M, N, K) named %s\n", argv[1]);
        return 2;
    }
    int M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]);
    const unsigned grid[3] = {unsigned(std::atoi(argv[5])), unsigned(std::atoi(argv[6])), unsigned(std::atoi(argv[7]))};
    const unsigned block[3] = {unsigned(std::atoi(argv[8])), unsigned(std::atoi(argv[9])),
                               unsigned(std::atoi(argv[10]))};
    if (M < 1 || N < 1 || K < 1) return 2;
    float* A = new float[size_t(M) * K];
    float* B = new float[size_t(K) * N];
    float* C = new float[size_t(M) * N];
    unsigned state = 12345u;
    auto next = [&] {
        state = state * 1664525u + 1013904223u;
        return float(state >> 8) / float(1u << 24) * 2.f - 1.f;
    };
    for (size_t i = 0; i < size_t(M) * K; ++i) A[i] = next();
    for (size_t i = 0; i < size_t(K) * N; ++i) B[i] = next();
    void* args[] = {&A, &B, &C, &M, &N, &K};
    char error[4096] = {0};  // a deadlock report names every thread's wait
    if (emu_launch(index, grid, block, args, error, sizeof error) != 0) {
        std::fprintf(stderr, "launch failed: %s\n", error);
        return 3;
    }
    double worst = 0.0;
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double ref = 0.0;
            for (int k = 0; k < K; ++k) ref += double(A[size_t(i) * K + k]) * double(B[size_t(k) * N + j]);
            worst = std::fmax(worst, std::fabs(ref - double(C[size_t(i) * N + j])));
        }
    std::printf("max_abs_error %.3g\n", worst);
    delete[] A;
    delete[] B;
    delete[] C;
    return worst <= 4e-6 * K ? 0 : 1;
}
