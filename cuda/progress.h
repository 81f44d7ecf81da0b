// progress.h - how far a pipelined kernel got, for the GPU script's smoke test.
//
// A kernel that hangs on the GPU cannot say where: the host's synchronize never returns. Built
// with -DMATMUL_PROGRESS (the smoke test's second try at a kernel that hung; never the build
// that is timed or checked), the pipelined kernels write, from block 0, how many k-steps the
// producer has issued and each consumer has finished into mapped pinned host memory, which the
// host reads while the kernel still runs. matmul_progress points there (set by the loader);
// null, or any other build, writes nothing.
#pragma once

#if defined(MATMUL_PROGRESS) && !defined(CUDA_EMULATION)
__device__ unsigned long long* matmul_progress = nullptr;
#define MATMUL_PROGRESS_MARK(slot, value)                                                                              \
    do {                                                                                                               \
        if (blockIdx.x == 0 && matmul_progress != nullptr) {                                                           \
            reinterpret_cast<volatile unsigned long long*>(matmul_progress)[slot] = (value);                           \
            __threadfence_system();                                                                                    \
        }                                                                                                              \
    } while (0)
#else
#define MATMUL_PROGRESS_MARK(slot, value) ((void)0)
#endif

// The slots: what each role of the kernel reports.
enum { PROGRESS_PRODUCER = 0, PROGRESS_CONSUMER = 1 /* + consumer index */ };
