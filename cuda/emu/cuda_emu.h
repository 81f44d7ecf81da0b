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
//    include/ptx_emu.h) use a per-warp barrier and a per-warp exchange buffer. A shuffle or
//    `__syncwarp` whose mask leaves out the calling lane, or a shuffle that reads a lane outside
//    its mask, is an error.
//  - Asynchronous copies (cp.async, TMA; include/ptx_emu.h, include/hopper_emu.h) land at a
//    time the environment variable MATMUL_EMU_ASYNC chooses for the launch, any time the ISA
//    allows: `wait` (the default) as late as possible (a cp.async at the wait_group that covers
//    its group; a TMA box when a thread tests its mbarrier in the fibers, when the issuing
//    thread next blocks in the threaded variant), `issue` at once, or `random:SEED` each copy
//    at a random scheduling point of the issuing thread between the two (per-thread generators
//    seeded from SEED, the block and the thread). So a consumer that reads before its wait
//    reads stale data under `wait` and `random`, and a producer that refills a stage before the
//    consumers released it overwrites what they still read under `issue` and `random`; under
//    ThreadSanitizer both are races (the issuing thread writes the copy). Each thread keeps its
//    copies in flight in its ThreadState; a thread that exits lands them.
//  - mbarriers (Hopper; include/hopper_emu.h): the state of each barrier (phase, pending
//    arrivals, transaction bytes) lives here, keyed by its shared address and reset per block.
//    A fiber whose mbarrier try_wait fails yields (Park::yielded) and runs again after the
//    others; when a whole round of the scheduler changes nothing (no barrier state, no fiber
//    that got past its wait, no copy left to land), the waits can never complete and the launch
//    fails as a deadlock that names what every thread waits on. With EMU_THREADS each
//    barrier's state sits behind its own mutex, so an arrive (release) and a wait that observes
//    its phase (acquire) are a happens-before edge for ThreadSanitizer, and nothing else is;
//    there a watchdog reports a launch in which no thread made progress for
//    MATMUL_EMU_WATCHDOG_S seconds (default 10) the same way and ends the program (status 3).
//  - setmaxnreg (include/hopper_emu.h) moves registers through a per-CTA pool: every warp starts
//    with what one CTA per SM can have (64K registers / threads, a multiple of 8, at most 256
//    per thread); .dec returns the difference to the pool, .inc takes it and waits while the
//    pool is short (as the GPU's TRY_ALLOC loop does), so a budget that cannot be met is a
//    deadlock, reported with the registers asked for and free.
//  - Dynamic shared memory (`ptx::dynamic_shared_memory()`): one 228 KiB window per library,
//    aligned to 256 KiB so that the low 18 bits of a host address are its offset in the window,
//    as a shared-window address is on the GPU (wgmma descriptors hold 18-bit addresses). It is
//    filled with 0xff bytes (NaN in FP16 and BF16) before each block. The async proxy (TMA
//    writes, wgmma reads) has a view of its own: TMA writes both, fence.proxy.async copies the
//    generic one into it, so wgmma operands written with plain stores and no fence read as NaN.
//  - Errors the GPU would stop the kernel for (a misaligned address, a wgmma without its fence,
//    descriptors that differ across a warp group...) end the launch with a message (fault()):
//    the harness raises it; the threaded variant, which runs as a program of its own, aborts.
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
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#ifdef EMU_THREADS
#include <chrono>
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
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

// ---- device functions -------------------------------------------------------------------
using std::max;
using std::min;
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// prmt.b32: byte n of the result is byte (s >> 4n) & 7 of the 8 bytes {y, x} (x's are 0-3).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long bytes = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned)(bytes >> 8 * ((s >> 4 * n) & 7) & 0xff) << 8 * n;
    return r;
}
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

inline LaunchState launch;              // one launch at a time per library (the shim locks)
inline thread_local ThreadState* self;  // the CUDA thread running on this OS thread

void block_barrier();
void warp_barrier();
void yield();

// ---- errors --------------------------------------------------------------------------------------
#ifndef EMU_THREADS
[[noreturn]] void fiber_fault(const char* what);  // ends the launch with `what` (the scheduler below)
inline bool fiber_running = false;
#endif

// What the GPU would stop the kernel for (a misaligned address, say): said, and the launch ends.
[[noreturn]] inline void fault(const char* what) {
#ifndef EMU_THREADS
    if (fiber_running) fiber_fault(what);
#endif
    std::fprintf(stderr, "CUDA emulation: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void faultf(const char* format, ...) {
    static thread_local char message[1024];
    va_list args;
    va_start(args, format);
    std::vsnprintf(message, sizeof message, format, args);
    va_end(args);
    fault(message);
}

// ---- when asynchronous copies land (MATMUL_EMU_ASYNC, see the header) -------------------------------
enum class Landing { at_wait, at_issue, random };
struct AsyncPolicy {
    Landing landing = Landing::at_wait;
    unsigned long long seed = 0;
};
inline AsyncPolicy async_policy;

// Read once per launch; nullptr, or why the value is not understood.
inline const char* read_async_policy() {
    const char* value = std::getenv("MATMUL_EMU_ASYNC");
    AsyncPolicy policy;
    if (!value || !*value || std::strcmp(value, "wait") == 0) {
        policy.landing = Landing::at_wait;
    } else if (std::strcmp(value, "issue") == 0) {
        policy.landing = Landing::at_issue;
    } else if (std::strncmp(value, "random:", 7) == 0 && value[7]) {
        char* end = nullptr;
        policy.seed = std::strtoull(value + 7, &end, 10);
        if (*end) return "MATMUL_EMU_ASYNC must be wait, issue or random:SEED (SEED a decimal integer)";
        policy.landing = Landing::random;
    } else {
        return "MATMUL_EMU_ASYNC must be wait, issue or random:SEED (SEED a decimal integer)";
    }
    async_policy = policy;
    return nullptr;
}

// A cp.async in flight, or a 16-byte chunk of a TMA box: the bytes read from global memory at
// issue, and where they will land.
struct AsyncCopy {
    unsigned char* destination;
    unsigned char bytes[16];
};

struct MBarrier;
// A TMA box in flight: its chunks, and the barrier its complete_tx goes to when it lands.
struct TmaCopy {
    MBarrier* barrier;
    std::vector<AsyncCopy> chunks;
    long long bytes;
};

// A wgmma.mma_async issued and not yet waited for (include/hopper_emu.h): what compute needs to
// run it for the whole warp at the wait_group that covers it, given every lane's accumulators.
struct PendingMma {
    void (*compute)(float* const* d, int warp, unsigned long long a, unsigned long long b, int scale_d);
    float* d;
    unsigned long long a, b;
    int scale_d;
};

// What a thread waits on, for deadlock reports (atomics: the threaded watchdog reads them).
enum class Wait : int { none, block_barrier, warp_barrier, mbarrier, registers };

struct ThreadState {
    uint3 tid{0, 0, 0};
    int linear = 0, warp = 0, lane = 0;
    unsigned long long rng = 0;                       // the random landing times (Landing::random)
    std::vector<AsyncCopy> async_open;                // issued since the last commit_group
    std::deque<std::vector<AsyncCopy>> async_groups;  // committed, oldest first, not yet landed
    std::vector<TmaCopy> tma_in_flight;               // issued by this thread, not landed
    bool wgmma_fenced = false;                        // a wgmma.fence since the last wait_group
    std::vector<PendingMma> mma_open;                 // issued since the last commit_group
    std::deque<std::vector<PendingMma>> mma_groups;   // committed, oldest first, not yet computed
    std::atomic<int> wait_kind{0};
    std::atomic<std::uintptr_t> wait_address{0};
    std::atomic<long> wait_value{0};

    void reset(int i, dim3 block, unsigned long long block_linear) {
        tid = {unsigned(i) % block.x, (unsigned(i) / block.x) % block.y, unsigned(i) / (block.x * block.y)};
        linear = i;
        warp = i / kWarpSize;
        lane = i % kWarpSize;
        // splitmix64 of (seed, block, thread): independent landing times per thread, the same every run
        unsigned long long z = async_policy.seed * 0x9e3779b97f4a7c15ull + (block_linear << 20) + unsigned(i) + 1;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        rng = z ^ (z >> 31);
        async_open.clear();
        async_groups.clear();
        tma_in_flight.clear();
        wgmma_fenced = false;
        mma_open.clear();
        mma_groups.clear();
        waiting(Wait::none);
    }
    void waiting(Wait kind, std::uintptr_t address = 0, long value = 0) {
        wait_address.store(address, std::memory_order_relaxed);
        wait_value.store(value, std::memory_order_relaxed);
        wait_kind.store(int(kind), std::memory_order_release);
    }
};

// One chance in four: whether a copy in flight lands at this scheduling point (Landing::random).
inline bool coin(ThreadState& s) {
    s.rng ^= s.rng << 13, s.rng ^= s.rng >> 7, s.rng ^= s.rng << 17;
    return (s.rng & 3) == 0;
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

// ---- Hopper: the bytes of a tensor map, dynamic shared memory, mbarriers -------------------------
// A CUtensorMap's 128 bytes, as the kernel receives them (signature letter 'T').
struct alignas(64) TensorMapBytes {
    unsigned long long opaque[16];
};

constexpr size_t kSharedWindowBytes = 228 * 1024, kSharedWindowAlign = size_t(1) << 18;
// Filled with 0xff from the start: reset_block_state fills the window only once a kernel has
// asked for it, which the first block of the first launch does after its reset.
inline unsigned char* nan_filled_window() {
    auto* bytes = static_cast<unsigned char*>(std::aligned_alloc(kSharedWindowAlign, kSharedWindowAlign));
    std::memset(bytes, 0xff, kSharedWindowBytes);
    return bytes;
}
inline unsigned char* shared_window() {
    static unsigned char* window = nan_filled_window();
    return window;
}
// The async proxy's view of the window (see the header).
inline unsigned char* async_view() {
    static unsigned char* view = nan_filled_window();
    return view;
}
inline std::atomic<bool> window_in_use{false};  // set by ptx::dynamic_shared_memory()

inline bool in_window(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p), base = reinterpret_cast<std::uintptr_t>(shared_window());
    return a >= base && a < base + kSharedWindowBytes;
}

// A write of the async proxy (TMA): both views see it.
inline void land_async_proxy(const std::vector<AsyncCopy>& chunks) {
    for (const AsyncCopy& copy : chunks) {
        std::memcpy(copy.destination, copy.bytes, sizeof copy.bytes);
        if (in_window(copy.destination))
            std::memcpy(async_view() + (copy.destination - shared_window()), copy.bytes, sizeof copy.bytes);
    }
}

struct MBarrier {
    unsigned expected = 0, pending = 0, phase = 0;
    long long tx = 0;               // bytes expected minus bytes completed
    std::vector<AsyncCopy> copies;  // TMA chunks that land at a test (fibers, Landing::at_wait)
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
    // Any state change (a barrier's, the register pool's, a copy landing, a barrier released):
    // the fiber scheduler's and the threaded watchdog's sign of progress.
    std::atomic<unsigned long> changes{0};
};
inline MBarriers mbarriers;

inline void changed() {
    mbarriers.changes.fetch_add(1, std::memory_order_relaxed);
}  // no ordering: not an edge for TSan

inline void add_tx(MBarrier& b, long long bytes) {
    b.tx += bytes;
    if (b.tx > (1 << 20) - 1 || b.tx < -((1 << 20) - 1)) fault("mbarrier: transaction count out of range (2^20 - 1)");
}

// Both counts at zero: the phase completes, the next one waits for the init count again.
inline void maybe_complete(MBarrier& b) {
    if (b.pending == 0 && b.tx == 0) {
        ++b.phase;
        b.pending = b.expected;
#ifdef EMU_THREADS
        b.cv.notify_all();
#endif
    }
}

// A TMA box lands: its bytes, then its complete_tx on the barrier (under the barrier's lock, so a
// wait that sees the phase complete happens after the writes).
inline void land_tma(TmaCopy& copy) {
    land_async_proxy(copy.chunks);
    MBarrier& b = *copy.barrier;
#ifdef EMU_THREADS
    std::lock_guard<std::mutex> lock(b.mutex);
#endif
    add_tx(b, -copy.bytes);
    changed();
    maybe_complete(b);
}

// A scheduling point of thread s (a barrier, a wait, an asynchronous operation): under
// Landing::random each copy in flight lands here with probability 1/4, in no particular order
// (the ISA promises none before the wait). `blocking`: s is about to wait for other threads;
// in the threaded variant under Landing::at_wait that is when its TMA boxes land, the latest
// moment at which no thread can be waiting for them without s being stuck too.
inline void async_progress(ThreadState& s, bool blocking) {
    const Landing landing = async_policy.landing;
    if (landing == Landing::random) {
        auto land_some = [&](std::vector<AsyncCopy>& copies) {
            copies.erase(std::remove_if(copies.begin(), copies.end(),
                                        [&](const AsyncCopy& c) {
                                            if (!coin(s)) return false;
                                            std::memcpy(c.destination, c.bytes, sizeof c.bytes);
                                            return true;
                                        }),
                         copies.end());
        };
        land_some(s.async_open);
        for (std::vector<AsyncCopy>& group : s.async_groups) land_some(group);
    }
    const bool all = blocking && landing == Landing::at_wait;
#ifndef EMU_THREADS
    if (landing == Landing::at_wait) return;  // the fibers' late TMA lands at a test of its barrier
#endif
    for (size_t i = 0; i < s.tma_in_flight.size();) {
        if (all || (landing == Landing::random && coin(s))) {
            land_tma(s.tma_in_flight[i]);
            s.tma_in_flight.erase(s.tma_in_flight.begin() + long(i));
        } else {
            ++i;
        }
    }
}

// Whether s has copies in flight; landing them all (a thread that exits, or a fiber schedule in
// which nothing else can move).
inline bool async_finish(ThreadState& s) {
    const bool any = !s.async_open.empty() || !s.async_groups.empty() || !s.tma_in_flight.empty();
    async_wait(s, 0);
    land(s.async_open);
    s.async_open.clear();
    for (TmaCopy& copy : s.tma_in_flight) land_tma(copy);
    s.tma_in_flight.clear();
    return any;
}

// setmaxnreg's pool (include/hopper_emu.h), per block: registers per thread of each warp, and the
// registers released by .dec that .inc may take.
struct RegisterPool {
    int initial = 0;
    long free = 0;
    int per_thread[kMaxWarps];
    // the value each warp requested, in order, per warp group (the uniformity check)
    int count[kMaxWarps / 4][4];
    int value[kMaxWarps / 4][4][16];
#ifdef EMU_THREADS
    std::mutex mutex;
#endif
};
inline RegisterPool register_pool;

// wgmma descriptors issued per warp group, by index, for the check that its 4 warps agree.
struct WgmmaLog {
    struct Entry {
        long index = -1;
        unsigned long long a = 0, b = 0;
        int warp = 0;
    } ring[256];
    long issued[4] = {0, 0, 0, 0};
#ifdef EMU_THREADS
    std::mutex mutex;
#endif
};
inline WgmmaLog wgmma_logs[kMaxWarps / 4];

inline void reset_block_state(int threads) {
    mbarriers.table.clear();
    RegisterPool& pool = register_pool;
    // One CTA per SM: 64K registers shared by its warps, in multiples of 8 per thread, at most 256.
    const int warps = (threads + kWarpSize - 1) / kWarpSize;
    pool.initial = std::min(256, 65536 / (warps * kWarpSize) / 8 * 8);
    pool.free = 0;
    std::fill(pool.per_thread, pool.per_thread + kMaxWarps, pool.initial);
    for (auto& c : pool.count) std::fill(c, c + 4, 0);
    for (WgmmaLog& log : wgmma_logs) {
        for (WgmmaLog::Entry& e : log.ring) e.index = -1;
        std::fill(log.issued, log.issued + 4, 0);
    }
    if (window_in_use.load()) {  // uninitialised shared memory reads as NaN, in both proxies
        std::memset(shared_window(), 0xff, kSharedWindowBytes);
        std::memset(async_view(), 0xff, kSharedWindowBytes);
    }
}

// What every live thread waits on, one line per run of threads waiting on the same thing.
inline std::string describe_waits(ThreadState* const* threads, int n, const bool* done) {
    auto describe = [](ThreadState& s) -> std::string {
        char text[256];
        const std::uintptr_t address = s.wait_address.load(std::memory_order_relaxed);
        const long value = s.wait_value.load(std::memory_order_relaxed);
        switch (Wait(s.wait_kind.load(std::memory_order_acquire))) {
        case Wait::block_barrier: return "__syncthreads()";
        case Wait::warp_barrier: return "a warp barrier (__syncwarp, a shuffle, a warp-collective operation)";
        case Wait::mbarrier: {
            auto found = mbarriers.table.find(address);
            const long offset = in_window(reinterpret_cast<void*>(address))
                                    ? long(address - reinterpret_cast<std::uintptr_t>(shared_window()))
                                    : -1;
            if (found == mbarriers.table.end()) {
                std::snprintf(text, sizeof text, "mbarrier at shared offset %ld, parity %ld", offset, value);
            } else {
                MBarrier& b = found->second;
                std::snprintf(
                    text, sizeof text,
                    "mbarrier at shared offset %ld, parity %ld (its phase %u: %u of %u arrivals and %lld bytes pending)",
                    offset, value, b.phase, b.pending, b.expected, b.tx);
            }
            return text;
        }
        case Wait::registers:
            std::snprintf(text, sizeof text,
                          "setmaxnreg.inc %ld: needs %lu more registers for its warp, the CTA's pool has %ld", value,
                          (unsigned long)address, register_pool.free);
            return text;
        default: return "nothing (running)";
        }
    };
    std::string out;
    for (int i = 0; i < n;) {
        if (done[i]) {
            ++i;
            continue;
        }
        const std::string what = describe(*threads[i]);
        int j = i + 1;
        while (j < n && !done[j] && describe(*threads[j]) == what) ++j;
        char range[64];
        if (j - i == 1)
            std::snprintf(range, sizeof range, "thread %d", i);
        else
            std::snprintf(range, sizeof range, "threads %d-%d", i, j - 1);
        out += std::string(out.empty() ? "" : "; ") + range + ": " + what;
        i = j;
    }
    return out;
}

inline int lane_id() { return self->lane; }
inline int warp_id() { return self->warp; }

// A warp-collective exchange. `mask`: the lanes that take part (CUDA's *_sync mask); the calling
// lane must be one of them, and a lane may read only from a lane in its mask.
template <class T, class SourceLane>
inline T warp_exchange(unsigned mask, T value, SourceLane source_lane, const char* what) {
    static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable_v<T>, "shuffle of an unsupported type");
    const int lane = lane_id(), warp = warp_id();
    if (!(mask >> lane & 1u))
        faultf("%s: lane %d calls it with mask 0x%08x, which leaves the lane out", what, lane, mask);
    std::memcpy(launch.slots[warp][lane], &value, sizeof(T));
    warp_barrier();  // every lane has parked its value
    T out = value;
    const int source = source_lane(lane);
    if (source >= 0 && source < kWarpSize) {
        if (source != lane && !(mask >> source & 1u))
            faultf("%s: lane %d reads lane %d, outside its mask 0x%08x", what, lane, source, mask);
        std::memcpy(&out, launch.slots[warp][source], sizeof(T));
    }
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
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    if (!(mask >> ::emu::lane_id() & 1u))
        ::emu::faultf("__syncwarp: lane %d calls it with mask 0x%08x, which leaves the lane out", ::emu::lane_id(),
                      mask);
    ::emu::warp_barrier();
}

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return ::emu::warp_exchange(
        mask, v, [&](int lane) { return (lane / width) * width + (src % width); }, "__shfl_sync");
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return ::emu::warp_exchange(
        mask, v,
        [&](int lane) {
            const int other = lane ^ lane_mask;
            return (other / width == lane / width) ? other : lane;
        },
        "__shfl_xor_sync");
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::emu::warp_exchange(
        mask, v,
        [&](int lane) {
            const int other = lane + int(delta);
            return (other / width == lane / width) ? other : lane;
        },
        "__shfl_down_sync");
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return ::emu::warp_exchange(
        mask, v,
        [&](int lane) {
            const int other = lane - int(delta);
            return (other >= 0 && other / width == lane / width) ? other : lane;
        },
        "__shfl_up_sync");
}

// ---- the block scheduler ----------------------------------------------------------------------------
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
    char fault[1024] = {0};  // the error that ended the launch, if one did
    bool faulted = false;
};
inline FiberRun fiber_run;

inline void park(Park where) {
    Fiber* me = static_cast<Fiber*>(self);
    async_progress(*me, where != Park::yielded);
    if (where == Park::block_barrier) me->waiting(Wait::block_barrier);
    if (where == Park::warp_barrier) me->waiting(Wait::warp_barrier);
    me->park = where;
    if (_setjmp(me->resume) == 0) _longjmp(fiber_run.scheduler, 1);
    if (where != Park::yielded) me->waiting(Wait::none);
}
inline void block_barrier() { park(Park::block_barrier); }
inline void warp_barrier() { park(Park::warp_barrier); }
// A wait that has not completed: let the other threads run first.
inline void yield() { park(Park::yielded); }

// A fault in a fiber: the fiber is abandoned (its stack is reused by the next launch) and the
// scheduler ends the launch with the message.
[[noreturn]] inline void fiber_fault(const char* what) {
    std::snprintf(fiber_run.fault, sizeof fiber_run.fault, "%s", what);
    fiber_run.faulted = true;
    static_cast<Fiber*>(self)->park = Park::done;
    _longjmp(fiber_run.scheduler, 1);
}

[[noreturn]] inline void fiber_main() {
    fiber_run.invoke(fiber_run.args);
    async_finish(*self);
    static_cast<Fiber*>(self)->park = Park::done;
    _longjmp(fiber_run.scheduler, 1);  // never return: there is no uc_link to return to
}

// Run fiber f until it parks or finishes.
__attribute__((noinline)) inline void resume(Fiber& f) {
    self = &f;
    fiber_running = true;
    if (_setjmp(fiber_run.scheduler) == 0) {
        if (!f.started) {
            f.started = true;
            setcontext(&f.context);
        }
        _longjmp(f.resume, 1);
    }
    fiber_running = false;
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
        if (base == MAP_FAILED) {
            base = nullptr;
            return;
        }
        for (int i = 0; i < n; ++i)  // a guard page under each stack: an overflow faults, never corrupts
            mprotect(static_cast<char*>(base) + size_t(i) * (kStackBytes + page), page, PROT_NONE);
    }
    ~Stacks() {
        if (base) munmap(base, bytes);
    }
    char* stack(int i) const {
        const size_t page = size_t(sysconf(_SC_PAGESIZE));
        return static_cast<char*>(base) + size_t(i) * (kStackBytes + page) + page;
    }
};

inline std::string deadlock_report(Fiber* fibers, int n, const char* what) {
    std::vector<ThreadState*> threads(n);
    std::unique_ptr<bool[]> done(new bool[n]);
    for (int i = 0; i < n; ++i) threads[i] = &fibers[i], done[i] = fibers[i].park == Park::done;
    return std::string(what) + ". Waiting: " + describe_waits(threads.data(), n, done.get());
}

// Runs every block of the grid; returns nullptr or a description of what went wrong.
inline const char* run_grid(Invoke invoke, void** args, dim3 grid, dim3 block) {
    static std::string error_text;
    const int n = int(block.x * block.y * block.z);
    Stacks stacks(n);
    if (!stacks.base) return "could not allocate fiber stacks";
    Fiber* fibers = new Fiber[n];
    fiber_run.invoke = invoke;
    fiber_run.args = args;
    fiber_run.faulted = false;
    launch.grid_dim = grid;
    launch.block_dim = block;
    const char* error = nullptr;
    for (unsigned bz = 0; bz < grid.z && !error; ++bz)
        for (unsigned by = 0; by < grid.y && !error; ++by)
            for (unsigned bx = 0; bx < grid.x && !error; ++bx) {
                launch.block = {bx, by, bz};
                reset_block_state(n);
                for (int i = 0; i < n; ++i) {
                    Fiber& f = fibers[i];
                    f.reset(i, block, (unsigned long long)(bz * grid.y + by) * grid.x + bx);
                    f.park = Park::runnable;
                    f.started = false;
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
                    for (int i = 0; i < n && !fiber_run.faulted; ++i)
                        if (fibers[i].park == Park::runnable) {
                            resume(fibers[i]);
                            if (fibers[i].park != Park::yielded || !waited) moved = true;
                        }
                    if (fiber_run.faulted) {
                        error = fiber_run.fault;
                        break;
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
                    if (released) {
                        // Threads waiting on an mbarrier test it again in the same round, before the
                        // released warps go on: a producer that the consumers just released runs
                        // between their arrive and their next instruction, as it may on the GPU.
                        for (int i = 0; i < n; ++i)
                            if (fibers[i].park == Park::yielded) fibers[i].park = Park::runnable;
                        continue;
                    }
                    bool yielded = false;
                    for (int i = 0; i < n; ++i) yielded = yielded || fibers[i].park == Park::yielded;
                    if (yielded) {
                        if (!moved && changes == mbarriers.changes.load(std::memory_order_relaxed)) {
                            // Nothing moved: copies still in flight may be what the waits wait for.
                            bool landed = false;
                            for (int i = 0; i < n; ++i) landed = async_finish(fibers[i]) || landed;
                            if (!landed) {
                                error_text = deadlock_report(
                                    fibers, n,
                                    "deadlock: threads wait on an mbarrier phase (or registers) that no arrival, copy or release can complete");
                                error = error_text.c_str();
                                break;
                            }
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
                        error_text = deadlock_report(
                            fibers, n,
                            "deadlock: some threads wait at __syncthreads() while others wait at a warp-level "
                            "barrier (__syncwarp, a shuffle or a WMMA call) that their warp can never complete");
                        error = error_text.c_str();
                        break;
                    }
                    changed();
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
    void reset(int n) {
        expected = n;
        arrived = 0;
    }
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(mutex);
        const unsigned long mine = generation;
        if (++arrived == expected) {
            arrived = 0;
            ++generation;
            changed();
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

inline void block_barrier() {
    async_progress(*self, true);
    self->waiting(Wait::block_barrier);
    threads_run.block.arrive_and_wait();
    self->waiting(Wait::none);
}
inline void warp_barrier() {
    async_progress(*self, true);
    self->waiting(Wait::warp_barrier);
    threads_run.warps[self->warp].arrive_and_wait();
    self->waiting(Wait::none);
}
inline void yield() {
    async_progress(*self, true);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
}

inline double watchdog_seconds() {
    const char* value = std::getenv("MATMUL_EMU_WATCHDOG_S");
    const double s = value ? std::atof(value) : 0.0;
    return s > 0 ? s : 10.0;
}

inline const char* run_grid(Invoke invoke, void** args, dim3 grid, dim3 block) {
    const int n = int(block.x * block.y * block.z);
    launch.grid_dim = grid;
    launch.block_dim = block;
    std::vector<ThreadState> states(n);
    const double patience = watchdog_seconds();
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                launch.block = {bx, by, bz};
                reset_block_state(n);
                threads_run.block.reset(n);
                for (int w = 0; w * kWarpSize < n; ++w)
                    threads_run.warps[w].reset(std::min(kWarpSize, n - w * kWarpSize));
                std::unique_ptr<std::atomic<bool>[]> finished(new std::atomic<bool>[n]);
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (int i = 0; i < n; ++i) {
                    ThreadState& s = states[i];
                    s.reset(i, block, (unsigned long long)(bz * grid.y + by) * grid.x + bx);
                    finished[i] = false;
                    threads.emplace_back([&s, &finished, i, invoke, args] {
                        self = &s;
                        invoke(args);
                        async_finish(s);
                        s.waiting(Wait::none);
                        threads_run.warps[s.warp].drop();
                        threads_run.block.drop();
                        changed();
                        finished[i].store(true, std::memory_order_release);
                    });
                }
                // The watchdog: a block whose threads made no progress for `patience` seconds is stuck.
                auto last_change = std::chrono::steady_clock::now();
                unsigned long last = mbarriers.changes.load();
                for (;;) {
                    bool all = true;
                    for (int i = 0; i < n && all; ++i) all = finished[i].load(std::memory_order_acquire);
                    if (all) break;
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    const unsigned long now_changes = mbarriers.changes.load();
                    const auto now = std::chrono::steady_clock::now();
                    if (now_changes != last) {
                        last = now_changes, last_change = now;
                    } else if (std::chrono::duration<double>(now - last_change).count() > patience) {
                        std::vector<ThreadState*> pointers(n);
                        std::unique_ptr<bool[]> done(new bool[n]);
                        for (int i = 0; i < n; ++i) pointers[i] = &states[i], done[i] = finished[i].load();
                        std::fprintf(
                            stderr,
                            "launch failed: deadlock: no thread of block (%u, %u, %u) made progress for %.0f s. Waiting: %s\n",
                            bx, by, bz, patience, describe_waits(pointers.data(), n, done.get()).c_str());
                        std::fflush(stderr);
                        std::_Exit(3);  // the stuck threads cannot be joined
                    }
                }
                for (auto& t : threads) t.join();
            }
    self = nullptr;
    return nullptr;
}

#endif  // EMU_THREADS

}  // namespace emu
