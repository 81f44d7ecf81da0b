// Stand-in for CUDA's mma.h (nvcuda::wmma), for the CPU emulation only (never on nvcc's path).
//
// On the GPU a fragment is spread over the 32 lanes of a warp in an unspecified layout. Here
// every lane holds the whole tile: loads and the multiply are done by each lane (redundantly).
// store_matrix_sync writes the tile as the GPU does, each lane its own share of the elements
// (here elements lane, lane + 32, ...), and synchronizes nothing: a lane that reads what other
// lanes stored needs a __syncwarp in between, and one that stores over what other lanes still
// read needs one before. Element-wise code over `x[0..num_elements)` behaves as on the GPU (the
// same operation on every element), which is all the real API allows.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
inline float to_float(float v) { return v; }
inline float to_float(__half v) { return __half2float(v); }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct dims<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct dims<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N;
};
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static constexpr int rows = detail::dims<Use, M, N, K>::rows;
    static constexpr int cols = detail::dims<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    T x[num_elements];  // row-major, whatever the memory layout it was loaded from
};

template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T value) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = value;
}
template <class Use, int M, int N, int K, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, float, Layout>& f, float value) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = value;
}

// matrix_a / matrix_b: the layout is part of the fragment's type.
template <class Use, int M, int N, int K, class T, class Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>, "matrix_a/b need a layout");
    using F = fragment<Use, M, N, K, T, Layout>;
    for (int r = 0; r < F::rows; ++r)
        for (int c = 0; c < F::cols; ++c)
            f.x[r * F::cols + c] = std::is_same_v<Layout, row_major> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}

// accumulator: the layout is given at the call.
template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c)
            f.x[r * N + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}

template <int M, int N, int K, class T>
inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
    for (int e = ::emu::lane_id(); e < M * N; e += ::emu::kWarpSize) {
        const int r = e / N, c = e % N;
        (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[e];
    }
}

// D = A * B + C, products and sums in FP32 (as the tensor cores do for BF16/FP16 inputs).
template <int M, int N, int K, class TA, class LA, class LB, class TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TA, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
    float fa[M * K], fb[K * N], out[M * N];  // widen once, not once per product
    for (int i = 0; i < M * K; ++i) fa[i] = detail::to_float(a.x[i]);
    for (int i = 0; i < K * N; ++i) fb[i] = detail::to_float(b.x[i]);
    for (int i = 0; i < M * N; ++i) out[i] = detail::to_float(c.x[i]);
    for (int i = 0; i < M; ++i)
        for (int k = 0; k < K; ++k) {
            const float aik = fa[i * K + k];
            for (int j = 0; j < N; ++j) out[i * N + j] += aik * fb[k * N + j];  // k in order: FP32 sums
        }
    for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
}

}  // namespace wmma
}  // namespace nvcuda
