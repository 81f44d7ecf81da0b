// cuda_emu.h - a CPU emulation of the small part of CUDA C++ that the kernels in cuda/ use.
//
// The same .cu files that PyCUDA compiles with nvcc are compiled here with g++ (C++20) and run
// on the CPU through the launcher shim (emu_launcher.h), for correctness without a GPU. It is
// correctness only: nothing about speed carries over.
//
// How it maps CUDA onto the CPU:
//  - Blocks run one after another, so `__shared__` can become `static`: one copy per kernel,
//    shared by the threads of the block that is running. (Dynamic `extern __shared__` memory
//    cannot be emulated this way; the kernels here use static shared memory only.)
//  - The threads of a block are user-level fibers (ucontext) scheduled round-robin on one OS
//    thread; `__syncthreads()` parks a fiber until every live thread of the block has arrived.
//    A thread that returns drops out of every barrier, as on the GPU, so early exits cannot
//    deadlock the emulator; barriers that can never be met (divergent `__syncthreads`) are
//    reported as an error instead of hanging.
//  - With EMU_THREADS defined, each CUDA thread is an OS thread instead and the barriers are
//    mutex/condition-variable barriers: slow, but ThreadSanitizer then sees the real
//    happens-before edges, so a missing `__syncthreads` shows up as a data race.
//  - Warp-collective operations (shuffles, `__syncwarp`, WMMA, and ldmatrix / mma.sync in
//    include/ptx_emu.h) use a per-warp barrier and a per-warp exchange buffer.
//  - cp.async (include/ptx_emu.h): each thread keeps its own pending copies, in groups, here in
//    its ThreadState. A copy reads global memory when issued and writes shared memory only when
//    a cp.async.wait_group covers its group (or, as the GPU eventually would, when the thread
//    exits): a kernel that reads the tile before waiting reads stale data, and under
//    ThreadSanitizer a thread that reads what another thread's copy wrote, with no barrier
//    after that thread's wait_group, is a data race.
//  - mbarriers (Hopper; include/hopper_emu.h): the state of each barrier (phase, pending
//    arrivals, transaction bytes) lives here, keyed by its shared address and reset per block.
//    A fiber whose mbarrier try_wait fails yields (Park::yielded) and runs again after the
//    others; when a whole round of the scheduler changes nothing (no barrier state, no fiber
//    that got past its wait), the waits can never complete and the launch fails as a deadlock.
//    With EMU_THREADS each barrier's state sits behind its own mutex, so an arrive (release)
//    and a wait that observes its phase (acquire) are a happens-before edge for
//    ThreadSanitizer, and nothing else is.
//  - Dynamic shared memory (`ptx::dynamic_shared_memory()`): one 228 KiB window per library,
//    aligned to 256 KiB so that the low 18 bits of a host address are its offset in the window,
//    as a shared-window address is on the GPU (wgmma descriptors hold 18-bit addresses).
//  - threadIdx/blockIdx/blockDim/gridDim are macros over a thread-local pointer to the running
//    thread's state and the launch's state.
#pragma once

// _longjmp between fiber stacks is what the fibers are made of; glibc's fortified longjmp
// would take a jump to another stack for stack corruption.
#undef _FORTIFY_SOURCE

#if !defined(_XOPEN_SOURCE) && defined(__APPLE__)
#define _XOPEN_SOURCE 700  // macOS hides ucontext without it
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <unordered_map>
#include <vector>

#ifdef EMU_THREADS
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#else
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#endif

#define CUDA_EMULATION 1

// ---- keywords ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

// ---- vector types -----------------------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ---- device functions -------------------------------------------------------------------
using std::max;
using std::min;
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// No separate shared window here: the "shared address" is the host address itself.
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }
template <class T> inline T __ldg(const T* p) { return *p; }   // read-only cache: a plain load
template <class T> inline T __ldcs(const T* p) { return *p; }  // streaming load: a plain load
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }

namespace emu {

constexpr int kWarpSize = 32;
constexpr int kMaxThreads = 1024;
constexpr int kMaxWarps = kMaxThreads / kWarpSize;
constexpr int kSlotBytes = 16;  // the largest value a shuffle exchanges

struct ThreadState;

struct LaunchState {
    uint3 block{0, 0, 0};
    dim3 block_dim, grid_dim;
    // A lane's value for a shuffle is parked here until its warp has arrived.
    alignas(16) unsigned char slots[kMaxWarps][kWarpSize][kSlotBytes];
};

inline LaunchState launch;                 // one launch at a time per library (the shim locks)
inline thread_local ThreadState* self;     // the CUDA thread running on this OS thread

void block_barrier();
void warp_barrier();

// A cp.async in flight: the bytes it read from global memory, and where they will land.
struct AsyncCopy {
    unsigned char* destination;
    unsigned char bytes[16];
};

// A wgmma.mma_async issued and not yet waited for (include/hopper_emu.h): what compute needs to
// run it for the whole warp at the wait_group that covers it, given every lane's accumulators.
struct PendingMma {
    void (*compute)(float* const* d, int warp, unsigned long long a, unsigned long long b, int scale_d);
    float* d;
    unsigned long long a, b;
    int scale_d;
};

struct ThreadState {
    uint3 tid{0, 0, 0};
    int linear = 0, warp = 0, lane = 0;
    std::vector<AsyncCopy> async_open;                 // issued since the last commit_group
    std::deque<std::vector<AsyncCopy>> async_groups;   // committed, oldest first, not yet landed
    bool wgmma_fenced = false;                         // a wgmma.fence came before any wgmma
    std::vector<PendingMma> mma_open;                  // issued since the last commit_group
    std::deque<std::vector<PendingMma>> mma_groups;    // committed, oldest first, not yet computed
};

// What the GPU would stop the kernel for (a misaligned address, say): said, then abort.
[[noreturn]] inline void fault(const char* what) {
    std::fprintf(stderr, "CUDA emulation: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

inline void land(const std::vector<AsyncCopy>& group) {
    for (const AsyncCopy& copy : group) std::memcpy(copy.destination, copy.bytes, sizeof copy.bytes);
}

// cp.async.wait_group n: every group but the newest n lands, oldest first.
inline void async_wait(ThreadState& s, size_t newest_pending) {
    while (s.async_groups.size() > newest_pending) {
        land(s.async_groups.front());
        s.async_groups.pop_front();
    }
}

// A thread that exits with copies in flight: they still land (uncommitted ones too).
inline void async_finish(ThreadState& s) {
    async_wait(s, 0);
    land(s.async_open);
    s.async_open.clear();
}

// ---- Hopper: the bytes of a tensor map, dynamic shared memory, mbarriers -------------------------
// A CUtensorMap's 128 bytes, as the kernel receives them (signature letter 'T').
struct alignas(64) TensorMapBytes { unsigned long long opaque[16]; };

constexpr size_t kSharedWindowBytes = 228 * 1024, kSharedWindowAlign = size_t(1) << 18;
inline unsigned char* shared_window() {
    static unsigned char* window = static_cast<unsigned char*>(std::aligned_alloc(kSharedWindowAlign, kSharedWindowAlign));
    return window;
}

struct MBarrier {
    unsigned expected = 0, pending = 0, phase = 0;
    long long tx = 0;                         // bytes expected minus bytes completed
    std::vector<AsyncCopy> copies;            // TMA chunks not landed yet (fibers only)
    long long copy_bytes = 0;
#ifdef EMU_THREADS
    // One lock per barrier: an arrive and a wait on the same barrier are ordered for
    // ThreadSanitizer, operations on different barriers are not (as on the GPU).
    std::mutex mutex;
    std::condition_variable cv;
#endif
};
struct MBarriers {
    // By shared address; entries are added by mbarrier.init only (before the block's threads
    // use them, after a barrier), so lookups take no lock. Reset per block.
    std::unordered_map<std::uintptr_t, MBarrier> table;
    std::atomic<unsigned long> changes{0};    // any state change: the fiber scheduler's progress
};
inline MBarriers mbarriers;

// setmaxnreg per warp group: the value each warp requested, in order (uniformity check).
struct RegisterRequests {
    int count[4] = {0, 0, 0, 0};
    int value[4][16];
#ifdef EMU_THREADS
    std::mutex mutex;
#endif
};
inline RegisterRequests register_requests[kMaxWarps / 4];

inline void reset_block_state() {
    mbarriers.table.clear();
    for (RegisterRequests& r : register_requests) std::fill(r.count, r.count + 4, 0);
}

inline int lane_id() { return self->lane; }
inline int warp_id() { return self->warp; }

template <class T, class SourceLane>
inline T warp_exchange(T value, SourceLane source_lane) {
    static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable_v<T>, "shuffle of an unsupported type");
    const int lane = lane_id(), warp = warp_id();
    std::memcpy(launch.slots[warp][lane], &value, sizeof(T));
    warp_barrier();  // every lane has parked its value
    T out = value;
    const int source = source_lane(lane);
    if (source >= 0 && source < kWarpSize) std::memcpy(&out, launch.slots[warp][source], sizeof(T));
    warp_barrier();  // every lane has read before any lane parks its next value
    return out;
}

}  // namespace emu

#define threadIdx (::emu::self->tid)
#define blockIdx (::emu::launch.block)
#define blockDim (::emu::launch.block_dim)
#define gridDim (::emu::launch.grid_dim)
#define warpSize 32

inline void __syncthreads() { ::emu::block_barrier(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::emu::warp_barrier(); }

// The mask is not modelled: every kernel here shuffles with the full warp.
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return ::emu::warp_exchange(v, [&](int lane) { return (lane / width) * width + (src % width); });
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    return ::emu::warp_exchange(v, [&](int lane) {
        const int other = lane ^ mask;
        return (other / width == lane / width) ? other : lane;
    });
}
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    return ::emu::warp_exchange(v, [&](int lane) {
        const int other = lane + int(delta);
        return (other / width == lane / width) ? other : lane;
    });
}
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    return ::emu::warp_exchange(v, [&](int lane) {
        const int other = lane - int(delta);
        return (other >= 0 && other / width == lane / width) ? other : lane;
    });
}

// ---- the block scheduler ----------------------------------------------------------------
namespace emu {

using Invoke = void (*)(void**);

#ifndef EMU_THREADS

// Fibers: every CUDA thread of a block is a ucontext with its own stack. A fiber is started
// with setcontext; after that, switches are _setjmp/_longjmp, which (unlike swapcontext) make
// no system call to save and restore the signal mask: several times faster per barrier.
enum class Park { runnable, block_barrier, warp_barrier, yielded, done };

struct Fiber : ThreadState {
    ucontext_t context;
    jmp_buf resume;
    bool started = false;
    Park park = Park::runnable;
};

struct FiberRun {
    jmp_buf scheduler;
    Invoke invoke = nullptr;
    void** args = nullptr;
};
inline FiberRun fiber_run;

inline void park(Park where) {
    Fiber* me = static_cast<Fiber*>(self);
    me->park = where;
    if (_setjmp(me->resume) == 0) _longjmp(fiber_run.scheduler, 1);
}
inline void block_barrier() { park(Park::block_barrier); }
inline void warp_barrier() { park(Park::warp_barrier); }
// A wait that has not completed: let the other threads run first.
inline void yield() { park(Park::yielded); }

[[noreturn]] inline void fiber_main() {
    fiber_run.invoke(fiber_run.args);
    async_finish(*self);
    static_cast<Fiber*>(self)->park = Park::done;
    _longjmp(fiber_run.scheduler, 1);  // never return: there is no uc_link to return to
}

// Run fiber f until it parks or finishes.
__attribute__((noinline)) inline void resume(Fiber& f) {
    self = &f;
    if (_setjmp(fiber_run.scheduler) == 0) {
        if (!f.started) {
            f.started = true;
            setcontext(&f.context);
        }
        _longjmp(f.resume, 1);
    }
}

// 256 KiB per thread holds a warp's WMMA fragments (each lane keeps whole tiles here).
constexpr size_t kStackBytes = 256 * 1024;

struct Stacks {
    void* base = nullptr;
    size_t bytes = 0;
    int count = 0;
    explicit Stacks(int n) : count(n) {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        bytes = size_t(n) * (kStackBytes + page);
        base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) { base = nullptr; return; }
        for (int i = 0; i < n; ++i)  // a guard page under each stack: an overflow faults, never corrupts
            mprotect(static_cast<char*>(base) + size_t(i) * (kStackBytes + page), page, PROT_NONE);
    }
    ~Stacks() { if (base) munmap(base, bytes); }
    char* stack(int i) const {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        return static_cast<char*>(base) + size_t(i) * (kStackBytes + page) + page;
    }
};

// Runs every block of the grid; returns nullptr or a description of what went wrong.
inline const char* run_grid(Invoke invoke, void** args, dim3 grid, dim3 block) {
    const int n = int(block.x * block.y * block.z);
    Stacks stacks(n);
    if (!stacks.base) return "could not allocate fiber stacks";
    Fiber* fibers = new Fiber[n];
    fiber_run.invoke = invoke;
    fiber_run.args = args;
    launch.grid_dim = grid;
    launch.block_dim = block;
    const char* error = nullptr;
    for (unsigned bz = 0; bz < grid.z && !error; ++bz)
    for (unsigned by = 0; by < grid.y && !error; ++by)
    for (unsigned bx = 0; bx < grid.x && !error; ++bx) {
        launch.block = {bx, by, bz};
        reset_block_state();
        for (int i = 0; i < n; ++i) {
            Fiber& f = fibers[i];
            f.tid = {unsigned(i) % block.x, (unsigned(i) / block.x) % block.y, unsigned(i) / (block.x * block.y)};
            f.linear = i;
            f.warp = i / kWarpSize;
            f.lane = i % kWarpSize;
            f.park = Park::runnable;
            f.started = false;
            f.async_open.clear();
            f.async_groups.clear();
            f.wgmma_fenced = false;
            f.mma_open.clear();
            f.mma_groups.clear();
            getcontext(&f.context);
            f.context.uc_stack.ss_sp = stacks.stack(i);
            f.context.uc_stack.ss_size = kStackBytes;
            f.context.uc_link = nullptr;
            makecontext(&f.context, reinterpret_cast<void (*)()>(fiber_main), 0);
        }
        bool waited = false;  // the previous round resumed yielded fibers only
        for (;;) {
            const unsigned long changes = mbarriers.changes.load(std::memory_order_relaxed);
            bool moved = false;  // a fiber got past a wait, or ran from a barrier
            for (int i = 0; i < n; ++i)
                if (fibers[i].park == Park::runnable) {
                    resume(fibers[i]);
                    if (fibers[i].park != Park::yielded || !waited) moved = true;
                }
            waited = false;
            // Everyone is parked or done. Release whole warps waiting at a warp barrier first,
            // then the block barrier once every live thread has reached it.
            bool live = false, released = false, all_at_block = true;
            for (int w = 0; w * kWarpSize < n; ++w) {
                bool any = false, all = true;
                for (int i = w * kWarpSize; i < std::min(n, (w + 1) * kWarpSize); ++i) {
                    if (fibers[i].park == Park::done) continue;
                    any = true;
                    if (fibers[i].park != Park::warp_barrier) all = false;
                }
                if (any && all) {
                    for (int i = w * kWarpSize; i < std::min(n, (w + 1) * kWarpSize); ++i)
                        if (fibers[i].park == Park::warp_barrier) fibers[i].park = Park::runnable;
                    released = true;
                }
            }
            if (released) continue;
            bool yielded = false;
            for (int i = 0; i < n; ++i) yielded = yielded || fibers[i].park == Park::yielded;
            if (yielded) {
                if (!moved && changes == mbarriers.changes.load(std::memory_order_relaxed)) {
                    error = "deadlock: threads wait on an mbarrier phase that no arrival or copy can complete";
                    break;
                }
                for (int i = 0; i < n; ++i)
                    if (fibers[i].park == Park::yielded) fibers[i].park = Park::runnable;
                waited = true;
                continue;
            }
            for (int i = 0; i < n; ++i) {
                if (fibers[i].park == Park::done) continue;
                live = true;
                if (fibers[i].park != Park::block_barrier) all_at_block = false;
            }
            if (!live) break;
            if (!all_at_block) {
                error = "deadlock: some threads wait at __syncthreads() while others wait at a warp-level "
                        "barrier (__syncwarp, a shuffle or a WMMA call) that their warp can never complete";
                break;
            }
            for (int i = 0; i < n; ++i)
                if (fibers[i].park == Park::block_barrier) fibers[i].park = Park::runnable;
        }
    }
    self = nullptr;
    delete[] fibers;
    return error;
}

#else  // EMU_THREADS

// One OS thread per CUDA thread. A barrier that a finished thread leaves (drop) releases the
// others if they were only waiting for it: the GPU's behaviour for exited threads.
struct Barrier {
    std::mutex mutex;
    std::condition_variable cv;
    int expected = 0, arrived = 0;
    unsigned long generation = 0;
    void reset(int n) { expected = n; arrived = 0; }
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(mutex);
        const unsigned long mine = generation;
        if (++arrived == expected) {
            arrived = 0;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != mine; });
        }
    }
    void drop() {
        std::unique_lock<std::mutex> lock(mutex);
        --expected;
        if (arrived > 0 && arrived == expected) {
            arrived = 0;
            ++generation;
            cv.notify_all();
        }
    }
};

struct ThreadsRun {
    Barrier block;
    Barrier warps[kMaxWarps];
};
inline ThreadsRun threads_run;

inline void block_barrier() { threads_run.block.arrive_and_wait(); }
inline void warp_barrier() { threads_run.warps[self->warp].arrive_and_wait(); }
inline void yield() { std::this_thread::yield(); }

inline const char* run_grid(Invoke invoke, void** args, dim3 grid, dim3 block) {
    const int n = int(block.x * block.y * block.z);
    launch.grid_dim = grid;
    launch.block_dim = block;
    std::vector<ThreadState> states(n);
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        launch.block = {bx, by, bz};
        reset_block_state();
        threads_run.block.reset(n);
        for (int w = 0; w * kWarpSize < n; ++w) threads_run.warps[w].reset(std::min(kWarpSize, n - w * kWarpSize));
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (int i = 0; i < n; ++i) {
            ThreadState& s = states[i];
            s.tid = {unsigned(i) % block.x, (unsigned(i) / block.x) % block.y, unsigned(i) / (block.x * block.y)};
            s.linear = i;
            s.warp = i / kWarpSize;
            s.lane = i % kWarpSize;
            s.async_open.clear();
            s.async_groups.clear();
            s.wgmma_fenced = false;
            s.mma_open.clear();
            s.mma_groups.clear();
            threads.emplace_back([&s, invoke, args] {
                self = &s;
                invoke(args);
                async_finish(s);
                threads_run.warps[s.warp].drop();
                threads_run.block.drop();
            });
        }
        for (auto& t : threads) t.join();
    }
    self = nullptr;
    return nullptr;
}

#endif  // EMU_THREADS

}  // namespace emu
