// selfcheck_tma.h - a standalone driver for one emulated TMA GEMM kernel taking
// (tensor map of A, tensor map of B, C, M, N, K), as selfcheck_half.h is for (A, B, C, M, N, K).
//
//     program KERNEL bf16|f16 M N K GRID_X BLOCK_X A_BOX_ROWS A_BOX_COLS B_BOX_ROWS B_BOX_COLS
//
// A and B are allocated with their rows padded to 16 bytes (TMA's pitch rule) and no more, C at
// exactly its size, so a read or write past an edge is a heap-buffer-overflow for
// AddressSanitizer. The tensor maps come from the emulation's cuTensorMapEncodeTiled (128B
// swizzle). The product is checked as in selfcheck_half.h. Exit status: 0 it matches, 1 it does
// not, 2 bad arguments, 3 the launch failed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace selfcheck {
template <class T> struct Codec;
template <> struct Codec<__nv_bfloat16> {
    static constexpr int tma_type = 9;  // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    static __nv_bfloat16 from(float v) { return __float2bfloat16(v); }
    static double to(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <> struct Codec<__half> {
    static constexpr int tma_type = 6;  // CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    static __half from(float v) { return __float2half(v); }
    static double to(__half v) { return __half2float(v); }
};

template <class T>
bool encode(::emu::TensorMapBytes& map, T* base, int rows, int cols, int pitch, unsigned box_rows, unsigned box_cols) {
    const unsigned long long dims[2] = {(unsigned long long)cols, (unsigned long long)rows};
    const unsigned long long strides[1] = {(unsigned long long)pitch * sizeof(T)};
    const unsigned box[2] = {box_cols, box_rows}, element_strides[2] = {1, 1};
    return emu_tensor_map_encode_tiled(&map, Codec<T>::tma_type, 2, base, dims, strides, box, element_strides, 0, 3, 0,
                                       0) == 0;
}

template <class T>
int run(int index, int M, int N, int K, const unsigned grid[3], const unsigned block[3], const unsigned boxes[4]) {
    const int lda = (K + 7) / 8 * 8, ldb = (N + 7) / 8 * 8;  // rows padded to 16 bytes
    T* A = new T[size_t(M) * lda];
    T* B = new T[size_t(K) * ldb];
    T* C = new T[size_t(M) * N];
    unsigned state = 12345u;
    auto next = [&] {
        state = state * 1664525u + 1013904223u;
        return float(state >> 8) / float(1u << 24) * 2.f - 1.f;
    };
    for (size_t i = 0; i < size_t(M) * lda; ++i) A[i] = Codec<T>::from(int(i % lda) < K ? next() : 0.f);
    for (size_t i = 0; i < size_t(K) * ldb; ++i) B[i] = Codec<T>::from(int(i % ldb) < N ? next() : 0.f);
    ::emu::TensorMapBytes a_map, b_map;
    if (!encode(a_map, A, M, K, lda, boxes[0], boxes[1]) || !encode(b_map, B, K, N, ldb, boxes[2], boxes[3])) {
        std::fprintf(stderr, "the tensor maps were refused\n");
        return 2;
    }
    void* args[] = {&a_map, &b_map, &C, &M, &N, &K};
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
                const double p = Codec<T>::to(A[size_t(i) * lda + k]) * Codec<T>::to(B[size_t(k) * ldb + j]);
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
        std::fprintf(stderr,
                     "usage: %s KERNEL bf16|f16 M N K GRID_X BLOCK_X A_BOX_ROWS A_BOX_COLS B_BOX_ROWS B_BOX_COLS\n",
                     argv[0]);
        return 2;
    }
    int index = -1;
    for (int i = 0; i < emu_kernel_count(); ++i)
        if (std::strcmp(emu_kernel_name(i), argv[1]) == 0) index = i;
    if (index < 0 || std::strcmp(emu_kernel_signature(index), "TTPiii") != 0) {
        std::fprintf(stderr, "no TMA GEMM kernel (A map, B map, C, M, N, K) named %s\n", argv[1]);
        return 2;
    }
    const int M = std::atoi(argv[3]), N = std::atoi(argv[4]), K = std::atoi(argv[5]);
    const unsigned grid[3] = {unsigned(std::atoi(argv[6])), 1, 1}, block[3] = {unsigned(std::atoi(argv[7])), 1, 1};
    const unsigned boxes[4] = {unsigned(std::atoi(argv[8])), unsigned(std::atoi(argv[9])),
                               unsigned(std::atoi(argv[10])), unsigned(std::atoi(argv[11]))};
    if (M < 1 || N < 1 || K < 1) return 2;
    if (std::strcmp(argv[2], "bf16") == 0) return selfcheck::run<__nv_bfloat16>(index, M, N, K, grid, block, boxes);
    if (std::strcmp(argv[2], "f16") == 0) return selfcheck::run<__half>(index, M, N, K, grid, block, boxes);
    return 2;
}
