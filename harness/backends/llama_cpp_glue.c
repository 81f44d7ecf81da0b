/* The llama.cpp peer's glue: one decode product through ggml's CPU backend, with the weights
 * placed as llama.cpp's model loader places them.
 *
 * The loader (llama-model.cpp) offers each weight first to the CPU backend's extra buffer
 * types, among them CPU_REPACK, and keeps the first whose device says it supports the tensor's
 * MUL_MAT; else the plain CPU buffer. A weight in CPU_REPACK is rearranged when its bytes are
 * set (q4_0 into q4_0_8x8 on AVX2, say) and multiplied by the repack kernels (ggml_gemv_* for
 * one row of X, ggml_gemm_* for four or more); a weight in the plain buffer goes through
 * ggml_compute_forward_mul_mat, which tries llamafile's tinyBLAS first (two or more rows) and
 * else the type's vec_dot. This file does the same with one weight, one activation and one
 * MUL_MAT node, and says which placement the weight got.
 *
 * Built by harness/backends/llama_cpp.py against the ggml it built; never part of the project's
 * own C library (c/), which must build without llama.cpp. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

struct peer {
    ggml_backend_t backend;
    struct ggml_context *weights_ctx, *graph_ctx;
    ggml_backend_buffer_t weights_buffer, graph_buffer;
    struct ggml_tensor *w, *x, *y;
    struct ggml_cgraph *graph;
    char placement[64]; /* the buffer type W lives in */
    char repacked[64];  /* what the repack buffer turned W into ("q4_0_8x8"), or "" */
};

/* ggml logs "repack tensor <name> with <type>_<cols>x<rows>" at debug level when it repacks:
 * the one witness of which layout the repack kernels run on. */
static char *log_target;

static void capture_repack(enum ggml_log_level level, const char *text, void *user) {
    (void)level, (void)user;
    const char *with = strstr(text, "repack tensor");
    if (!log_target || !with || !(with = strstr(with, " with "))) return;
    snprintf(log_target, 64, "%s", with + 6);
    log_target[strcspn(log_target, "\n")] = '\0';
}

static void say(char *error, size_t error_size, const char *text) { snprintf(error, error_size, "%s", text); }

/* The CPU device's repack buffer type, if this build has one. */
static ggml_backend_buffer_type_t repack_buffer_type(ggml_backend_dev_t device) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(device);
    ggml_backend_dev_get_extra_bufts_t extra_types =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!extra_types) return NULL;
    for (ggml_backend_buffer_type_t *type = extra_types(device); type && *type; type++)
        if (strcmp(ggml_backend_buft_name(*type), "CPU_REPACK") == 0) return *type;
    return NULL;
}

/* As the loader's weight_buft_supported: would the device run MUL_MAT(W, X) with W in `type`? */
static int supports_weight_in(ggml_backend_dev_t device, ggml_backend_buffer_type_t type, enum ggml_type wtype,
                              int64_t n, int64_t k, int64_t m) {
    struct ggml_init_params params = {4 * ggml_tensor_overhead(), NULL, true};
    struct ggml_context *ctx = ggml_init(params);
    if (!ctx) return 0;
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, wtype, k, n);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, m);
    struct ggml_tensor *op = ggml_mul_mat(ctx, w, x);
    ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(type, 0);
    w->buffer = probe;
    int supported = probe && ggml_backend_dev_supports_op(device, op);
    w->buffer = NULL;
    if (probe) ggml_backend_buffer_free(probe);
    ggml_free(ctx);
    return supported;
}

void llama_cpp_peer_free(struct peer *peer) {
    if (!peer) return;
    if (peer->graph_buffer) ggml_backend_buffer_free(peer->graph_buffer);
    if (peer->weights_buffer) ggml_backend_buffer_free(peer->weights_buffer);
    if (peer->graph_ctx) ggml_free(peer->graph_ctx);
    if (peer->weights_ctx) ggml_free(peer->weights_ctx);
    if (peer->backend) ggml_backend_free(peer->backend);
    free(peer);
}

/* W [n, k] of ggml type `wtype` (its bytes, `w_bytes` long), X [m, k] float32 row-major, on
 * `threads` threads; `repack` 1 places W as the loader does, 0 keeps it in the plain CPU buffer
 * (llama.cpp's --no-repack). NULL with the reason in `error` when it cannot be set up. */
struct peer *llama_cpp_peer_new(int wtype, int64_t n, int64_t k, int64_t m, const void *w, size_t w_bytes,
                                const float *x, int threads, int repack, char *error, size_t error_size) {
    struct peer *peer = calloc(1, sizeof *peer);
    if (!peer) return say(error, error_size, "out of memory"), NULL;
    ggml_backend_dev_t device = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    peer->backend = device ? ggml_backend_dev_init(device, NULL) : NULL;
    if (!peer->backend) return say(error, error_size, "ggml has no CPU device"), llama_cpp_peer_free(peer), NULL;
    ggml_backend_cpu_set_n_threads(peer->backend, threads);

    struct ggml_init_params params = {2 * ggml_tensor_overhead(), NULL, true};
    peer->weights_ctx = ggml_init(params);
    peer->w = ggml_new_tensor_2d(peer->weights_ctx, (enum ggml_type)wtype, k, n);
    ggml_set_name(peer->w, "w");
    if (ggml_nbytes(peer->w) != w_bytes) {
        snprintf(error, error_size, "ggml sizes this %s W at %zu bytes, the harness gave %zu",
                 ggml_type_name((enum ggml_type)wtype), ggml_nbytes(peer->w), w_bytes);
        return llama_cpp_peer_free(peer), NULL;
    }
    ggml_backend_buffer_type_t type = ggml_backend_cpu_buffer_type();
    ggml_backend_buffer_type_t repack_type = repack ? repack_buffer_type(device) : NULL;
    if (repack_type && supports_weight_in(device, repack_type, (enum ggml_type)wtype, n, k, m)) type = repack_type;
    snprintf(peer->placement, sizeof peer->placement, "%s", ggml_backend_buft_name(type));
    peer->weights_buffer = ggml_backend_alloc_ctx_tensors_from_buft(peer->weights_ctx, type);
    if (!peer->weights_buffer) return say(error, error_size, "W's buffer could not be allocated"), llama_cpp_peer_free(peer), NULL;
    ggml_backend_buffer_set_usage(peer->weights_buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    log_target = peer->repacked;
    ggml_log_set(capture_repack, NULL);
    ggml_backend_tensor_set(peer->w, w, 0, w_bytes); /* in CPU_REPACK, this rearranges W */
    ggml_log_set(NULL, NULL);
    log_target = NULL;

    params.mem_size = 3 * ggml_tensor_overhead() + ggml_graph_overhead();
    peer->graph_ctx = ggml_init(params);
    peer->x = ggml_new_tensor_2d(peer->graph_ctx, GGML_TYPE_F32, k, m);
    peer->y = ggml_mul_mat(peer->graph_ctx, peer->w, peer->x); /* ne = [n, m]: Y [m, n] row-major */
    peer->graph = ggml_new_graph(peer->graph_ctx);
    ggml_build_forward_expand(peer->graph, peer->y);
    peer->graph_buffer = ggml_backend_alloc_ctx_tensors(peer->graph_ctx, peer->backend);
    if (!peer->graph_buffer) return say(error, error_size, "X and Y could not be allocated"), llama_cpp_peer_free(peer), NULL;
    ggml_backend_tensor_set(peer->x, x, 0, ggml_nbytes(peer->x));
    return peer;
}

/* The product; 0 on success, else ggml's status. */
int llama_cpp_peer_run(struct peer *peer) { return (int)ggml_backend_graph_compute(peer->backend, peer->graph); }

void llama_cpp_peer_result(struct peer *peer, float *out) {
    ggml_backend_tensor_get(peer->y, out, 0, ggml_nbytes(peer->y));
}

const char *llama_cpp_peer_placement(struct peer *peer) { return peer->placement; }

const char *llama_cpp_peer_repacked(struct peer *peer) { return peer->repacked; }

int llama_cpp_has_llamafile(void) { return ggml_cpu_has_llamafile(); }

int llama_cpp_has_avx(void) { return ggml_cpu_has_avx(); }

const char *llama_cpp_ggml_version(void) { return ggml_version(); }
