// hopper_emu.h - the Hopper part of cuda/ptx.h on the CPU emulation: mbarriers, TMA through a
// tensor-map stand-in, wgmma descriptors and wgmma.mma_async, fence.proxy.async, setmaxnreg.
//
//  - mbarrier: the ISA's state machine (cuda_emu.h keeps the state per shared address): a
//    phase number, pending arrivals (from the init count) and a transaction count in bytes; the
//    phase completes when both reach zero. try_wait.parity(P) is true while the current phase's
//    parity differs from P. An arrive on a barrier never initialized, an init count out of range
//    or a transaction count beyond the ISA's range abort.
//  - TMA (cp.async.bulk.tensor.2d): the tensor map is the emulation's own 128-byte record,
//    written by emu_tensor_map_encode_tiled, which takes cuTensorMapEncodeTiled's arguments
//    and refuses what the driver refuses (unaligned base, pitches that are not multiples of 16
//    bytes, boxes over 256 or wider than the swizzle span...). A copy reads its box when issued,
//    zeros outside the tensor, and places each 16-byte chunk at the box-linear offset with the
//    swizzle applied to the shared address (128B: bits [4, 7) ^= bits [7, 10); 64B: [4, 6) ^=
//    [7, 9); 32B: bit 4 ^= bit 7). When it lands (MATMUL_EMU_ASYNC, cuda_emu.h) it completes its
//    bytes on the mbarrier:
//      `wait`: as late as the ISA allows: in the fibers when a thread tests that barrier
//        (try_wait), so a kernel that reads a stage without waiting reads what was there
//        before; in EMU_THREADS when the issuing thread next blocks, written by that thread;
//      `issue`: at once, by the issuing thread, so a producer that refills a stage the
//        consumers still read overwrites it under them;
//      `random:SEED`: at a random scheduling point of the issuing thread in between.
//    In the threaded variant a reader that did not wait on the barrier has no happens-before
//    edge to the issuing thread's writes: a ThreadSanitizer race.
//  - wgmma.mma_async is asynchronous here too: each lane records it (its accumulators'
//    address, the descriptors) in its open group; commit_group closes the group; it is computed
//    at the wgmma.wait_group that covers its group, the latest moment the ISA allows. So
//    accumulators read before the wait are not the product, and shared memory overwritten
//    before the wait is what the product reads. The wait is warp-collective: lane 0 checks the
//    lanes issued the same operations with warp-uniform descriptors, then each warp computes its
//    16 rows of D (the ISA's fragment: warp w of the warp group owns rows 16 w .. 16 w + 15)
//    from A and B read through the descriptors (start address, LBO, SBO, swizzle mode; the
//    canonical layouts of ptx.h) and scatters D through the fragment layout. An mma_async
//    without a wgmma.fence since the thread's last wgmma.wait_group (or since it started) is an
//    error, as are descriptors that differ between the 4 warps of a warp group. wgmma reads its
//    operands through the async proxy's view of shared memory (cuda_emu.h): what TMA wrote, or
//    what plain stores wrote before a fence.proxy.async.
//  - setmaxnreg: the per-CTA register pool of cuda_emu.h. Checked: a multiple of 8 in [24, 256]
//    (compile time), the same value for the 4 warps of the warp group, .dec never above and
//    .inc never below the warp's current count; an .inc the pool cannot give waits, and a wait
//    nothing can end is reported as a deadlock.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>
#ifdef EMU_THREADS
#include <chrono>
#include <mutex>
#endif

namespace ptx {

using TensorMap = ::emu::TensorMapBytes;

inline unsigned char* dynamic_shared_memory() {
    ::emu::window_in_use.store(true, std::memory_order_relaxed);
    return ::emu::shared_window();
}

namespace hopper {

// The stand-in tensor map: what cuTensorMapEncodeTiled was given, checked.
struct EmulatedTensorMap {
    std::uint64_t magic;
    std::uint64_t address;
    std::uint64_t dims[2];  // elements: columns (contiguous), rows
    std::uint64_t pitch;    // bytes between rows
    std::uint32_t box[2];   // elements: columns, rows
    std::uint32_t element_bytes;
    std::uint32_t swizzle;  // CUtensorMapSwizzle: 0 none, 1 32B, 2 64B, 3 128B
};
static_assert(sizeof(EmulatedTensorMap) <= sizeof(TensorMap), "the stand-in must fit in a CUtensorMap");
constexpr std::uint64_t kTensorMapMagic = 0x54656e736f724d31ull;  // "TensorM1"

// Byte span of the swizzle pattern's row for a CUtensorMapSwizzle / descriptor mode.
inline unsigned swizzle_span_tma(unsigned mode) { return mode == 3 ? 128 : mode == 2 ? 64 : mode == 1 ? 32 : 0; }
inline unsigned swizzle_span_descriptor(unsigned mode) { return mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0; }

// The swizzle of a shared-window offset for a pattern whose rows are `span` bytes: the 16-byte
// chunk index (bits 4 and up, log2(span / 16) of them) XOR the row index within the pattern's
// 8 rows (bits 7 and up): Swizzle<3,4,3> for 128 B, <2,4,3> for 64 B, <1,4,3> for 32 B.
inline std::uintptr_t swizzle(std::uintptr_t offset, unsigned span) {
    if (span == 0) return offset;
    const std::uintptr_t mask = (span / 16 - 1) << 4;
    return offset ^ ((offset >> 3) & mask);
}

inline unsigned char* window() { return ::emu::shared_window(); }
inline std::uintptr_t window_offset(std::uintptr_t address, const char* what) {
    const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(window());
    if (address < base || address >= base + ::emu::kSharedWindowBytes) ::emu::fault(what);
    return address - base;
}

// ---- mbarrier ------------------------------------------------------------------------------------
#ifdef EMU_THREADS
struct Lock {
    std::unique_lock<std::mutex> lock;
    explicit Lock(std::mutex& m) : lock(m) {}
};
#define PTX_EMU_LOCK(m) hopper::Lock lock(m)
#else
#define PTX_EMU_LOCK(m) (void)0
#endif

inline ::emu::MBarrier& barrier_at(smem_t bar, const char* op) {
    if (bar % 8 != 0) ::emu::fault("mbarrier: address not 8-byte aligned");
    auto found = ::emu::mbarriers.table.find(bar);
    if (found == ::emu::mbarriers.table.end()) {
        static thread_local char message[160];
        std::snprintf(message, sizeof message, "mbarrier: %s on a barrier that was never initialized", op);
        ::emu::fault(message);
    }
    return found->second;
}

// Both counts at zero: the phase completes, the next one waits for the init count again.
// The arrival count of the current phase: an arrival beyond it (the phase still waiting for its
// transaction bytes) is undefined behaviour in the ISA; here it is an error.
inline void arrive_once(::emu::MBarrier& b) {
    if (b.pending == 0)
        ::emu::fault("mbarrier: an arrival beyond the init count while the phase still waits for its transaction bytes "
                     "(a stage refilled before it was consumed?)");
    --b.pending;
}

using ::emu::add_tx;
using ::emu::maybe_complete;

// The fibers' late TMA (Landing::at_wait): the boxes of this barrier land at a test of it.
inline void land(::emu::MBarrier& b) {
    if (b.copies.empty()) return;
    ::emu::land_async_proxy(b.copies);
    b.copies.clear();
    add_tx(b, -b.copy_bytes);
    b.copy_bytes = 0;
    ::emu::changed();
    maybe_complete(b);
}

inline bool test_parity(::emu::MBarrier& b, unsigned parity) {
    land(b);
    return (b.phase & 1u) != (parity & 1u);
}

// ---- wgmma ---------------------------------------------------------------------------------------
struct Descriptor {
    std::uintptr_t start;  // host address
    unsigned lbo, sbo, mode, base_offset;
};
inline Descriptor decode(unsigned long long desc) {
    Descriptor d;
    d.start = reinterpret_cast<std::uintptr_t>(window()) + ((desc & 0x3fff) << 4);
    d.lbo = unsigned((desc >> 16) & 0x3fff) << 4;
    d.sbo = unsigned((desc >> 32) & 0x3fff) << 4;
    d.base_offset = unsigned((desc >> 49) & 7);
    d.mode = unsigned(desc >> 62);
    return d;
}

// The shared address of element (mn, k) of a 16-bit operand (mn: the row of A or the column of
// B; k: 0..15) in the descriptor's canonical layout (ptx.h), swizzle applied.
inline std::uintptr_t element_address(const Descriptor& d, bool mn_major, int mn, int k) {
    const unsigned span = swizzle_span_descriptor(d.mode);
    std::uintptr_t offset = d.start - reinterpret_cast<std::uintptr_t>(window());
    if (span == 0) {  // interleaved: core matrices of 8 rows x 16 bytes
        if (mn_major)
            offset += (mn % 8) * 2 + (mn / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
        else
            offset += (mn % 8) * 16 + (mn / 8) * d.sbo + (k % 8) * 2 + (k / 8) * d.lbo;
    } else if (mn_major) {  // rows of span bytes along MN, 8 k rows per pattern
        offset += (k % 8) * span + (k / 8) * d.sbo + (mn % (span / 2)) * 2 + (mn / (span / 2)) * d.lbo;
    } else {  // rows of span bytes along K (16 k = 32 bytes fit), 8 rows per pattern
        offset += (mn % 8) * span + (mn / 8) * d.sbo + k * 2;
    }
    offset = swizzle(offset, span);
    if (offset + 2 > ::emu::kSharedWindowBytes) ::emu::fault("wgmma: an operand element lies outside shared memory");
    return reinterpret_cast<std::uintptr_t>(window()) + offset;
}

inline float widen(unsigned short bits, const __nv_bfloat16*) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
inline float widen(unsigned short bits, const __half*) { return __half2float(__ushort_as_half(bits)); }

// wgmma reads through the async proxy: its view of the window (cuda_emu.h).
template <class T> inline float operand(const Descriptor& d, bool mn_major, int mn, int k) {
    unsigned short bits;
    const std::uintptr_t offset = element_address(d, mn_major, mn, k) - reinterpret_cast<std::uintptr_t>(window());
    std::memcpy(&bits, ::emu::async_view() + offset, 2);
    return widen(bits, static_cast<const T*>(nullptr));
}

// The accumulator fragment of m64nNk16 (ptx.h): (row, column) of d[i] of lane l in warp w.
inline int d_row(int warp_in_group, int lane, int i) { return 16 * warp_in_group + lane / 4 + 8 * ((i / 2) % 2); }
inline int d_col(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + (i % 2); }

// One wgmma for one warp (its 16 rows of the 64), given the 32 lanes' accumulators.
template <class T, int N, bool TRANS_A, bool TRANS_B>
inline void compute_mma(float* const* d, int warp, unsigned long long a_desc, unsigned long long b_desc, int scale_d) {
    const Descriptor da = decode(a_desc), db = decode(b_desc);
    if (da.base_offset || db.base_offset) ::emu::fault("wgmma: a non-zero base offset is not emulated");
    const int w = warp % 4;
    float A[16][16], B[16][N];
    for (int r = 0; r < 16; ++r)
        for (int k = 0; k < 16; ++k) A[r][k] = operand<T>(da, TRANS_A, 16 * w + r, k);
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < N; ++n) B[k][n] = operand<T>(db, TRANS_B, n, k);
    for (int l = 0; l < ::emu::kWarpSize; ++l)
        for (int i = 0; i < N / 2; ++i) {
            const int row = d_row(w, l, i) - 16 * w, col = d_col(l, i);
            float sum = scale_d ? d[l][i] : 0.f;  // products exact in FP32, sums in FP32, k in order
            for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
            d[l][i] = sum;
        }
}

// The 4 warps of a warp group issue each wgmma together: lane 0 of each warp logs its
// descriptors by issue index, and a warp that differs from the one that logged first is an error.
inline void check_warp_group_uniform(unsigned long long a_desc, unsigned long long b_desc) {
    if (::emu::lane_id() != 0) return;
    const int warp = ::emu::warp_id(), w = warp % 4;
    ::emu::WgmmaLog& log = ::emu::wgmma_logs[warp / 4];
    PTX_EMU_LOCK(log.mutex);
    const long index = log.issued[w]++;
    ::emu::WgmmaLog::Entry& e = log.ring[index % 256];
    if (e.index == index) {
        if (e.a != a_desc || e.b != b_desc)
            ::emu::faultf("wgmma.mma_async #%ld of warp group %d: warp %d gave descriptors A 0x%llx, B 0x%llx, "
                          "warp %d gave A 0x%llx, B 0x%llx (a warp group's descriptors must be the same)",
                          index, warp / 4, warp, a_desc, b_desc, e.warp, e.a, e.b);
    } else if (e.index < index) {  // the first warp here (a slot a lagging warp never compared is reused)
        e.index = index, e.a = a_desc, e.b = b_desc, e.warp = warp;
    }
}

// wgmma.mma_async: recorded in this lane's open group; computed at the wait_group covering it.
template <class T, int N, bool TRANS_A, bool TRANS_B>
inline void wgmma_m64nNk16(float* d, unsigned long long a_desc, unsigned long long b_desc, int scale_d) {
    if (!::emu::self->wgmma_fenced)
        ::emu::fault("wgmma.mma_async without a wgmma.fence before it (none since the thread started, or since its "
                     "last wgmma.wait_group: the accumulators may have been written by other instructions)");
    check_warp_group_uniform(a_desc, b_desc);
    ::emu::self->mma_open.push_back({&compute_mma<T, N, TRANS_A, TRANS_B>, d, a_desc, b_desc, scale_d});
}

inline ::emu::ThreadState* lanes[::emu::kMaxWarps][::emu::kWarpSize];

// wgmma.wait_group n, collective over the warp: lane 0 runs every lane's groups but the newest n,
// oldest first, operation by operation for the whole warp (their descriptors must agree).
inline void wait_group(size_t newest_pending) {
    const int lane = ::emu::lane_id(), warp = ::emu::warp_id();
    lanes[warp][lane] = ::emu::self;
    ::emu::warp_barrier();
    if (lane == 0) {
        ::emu::ThreadState* const* l = lanes[warp];
        while (l[0]->mma_groups.size() > newest_pending) {
            const std::vector<::emu::PendingMma>& group = l[0]->mma_groups.front();
            for (int other = 1; other < ::emu::kWarpSize; ++other)
                if (l[other]->mma_groups.size() != l[0]->mma_groups.size() ||
                    l[other]->mma_groups.front().size() != group.size())
                    ::emu::fault("wgmma: the lanes of a warp issued or committed different wgmma operations");
            for (size_t j = 0; j < group.size(); ++j) {
                float* d[::emu::kWarpSize];
                for (int other = 0; other < ::emu::kWarpSize; ++other) {
                    const ::emu::PendingMma& op = l[other]->mma_groups.front()[j];
                    if (op.compute != group[j].compute || op.a != group[j].a || op.b != group[j].b ||
                        (op.scale_d != 0) != (group[j].scale_d != 0))
                        ::emu::fault("wgmma.mma_async: descriptors or scale-d differ between the lanes of a warp");
                    d[other] = op.d;
                }
                group[j].compute(d, warp, group[j].a, group[j].b, group[j].scale_d);
            }
            for (int other = 0; other < ::emu::kWarpSize; ++other) l[other]->mma_groups.pop_front();
        }
    }
    ::emu::warp_barrier();  // the accumulators are written before any lane reads them
}

}  // namespace hopper

// ---- the ptx.h interface ----------------------------------------------------------------------------
inline void mbarrier_init(smem_t bar, unsigned count) {
    if (count < 1 || count > (1u << 20) - 1) ::emu::fault("mbarrier.init: count must be in [1, 2^20 - 1]");
    if (bar % 8 != 0) ::emu::fault("mbarrier.init: address not 8-byte aligned");
    ::emu::MBarrier& b = ::emu::mbarriers.table[bar];  // inserted, or found when re-initialized
    PTX_EMU_LOCK(b.mutex);
    b.expected = b.pending = count;
    b.phase = 0, b.tx = 0, b.copy_bytes = 0;
    b.copies.clear();
    ::emu::changed();
}
inline void fence_mbarrier_init() {}
inline void mbarrier_arrive(smem_t bar) {
    ::emu::async_progress(*::emu::self, false);
    ::emu::MBarrier& b = hopper::barrier_at(bar, "arrive");
    PTX_EMU_LOCK(b.mutex);
    hopper::arrive_once(b);
    ::emu::changed();
    hopper::maybe_complete(b);
}
inline void mbarrier_arrive_expect_tx(smem_t bar, unsigned bytes) {
    ::emu::async_progress(*::emu::self, false);
    ::emu::MBarrier& b = hopper::barrier_at(bar, "arrive.expect_tx");
    PTX_EMU_LOCK(b.mutex);
    hopper::add_tx(b, bytes);
    hopper::arrive_once(b);
    ::emu::changed();
    hopper::maybe_complete(b);
}
inline bool mbarrier_try_wait_parity(smem_t bar, unsigned parity) {
    ::emu::MBarrier& b = hopper::barrier_at(bar, "try_wait.parity");
    ::emu::ThreadState& s = *::emu::self;
#ifdef EMU_THREADS
    {
        PTX_EMU_LOCK(b.mutex);
        if (hopper::test_parity(b, parity)) return true;
    }
    ::emu::async_progress(s, true);  // about to wait: this thread's own copies land first (outside the lock)
    PTX_EMU_LOCK(b.mutex);
    if (hopper::test_parity(b, parity)) return true;
    // "may suspend for a time limit": wait for a change, then test once more
    s.waiting(::emu::Wait::mbarrier, bar, long(parity & 1u));
    b.cv.wait_for(lock.lock, std::chrono::microseconds(200));
    s.waiting(::emu::Wait::none);
    return hopper::test_parity(b, parity);
#else
    if (hopper::test_parity(b, parity)) return true;
    s.waiting(::emu::Wait::mbarrier, bar, long(parity & 1u));
    ::emu::yield();  // the other fibers run first
    s.waiting(::emu::Wait::none);
    return hopper::test_parity(b, parity);
#endif
}
inline void mbarrier_wait_parity(smem_t bar, unsigned parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {}
}

// The generic proxy's shared memory becomes the async proxy's (cuda_emu.h). Not instrumented for
// ThreadSanitizer: the copy stands for the hardware's ordering, not for a thread's reads and writes.
__attribute__((no_sanitize("thread"), noinline)) inline void fence_proxy_async() {
    const volatile unsigned long long* from = reinterpret_cast<const unsigned long long*>(::emu::shared_window());
    volatile unsigned long long* to = reinterpret_cast<unsigned long long*>(::emu::async_view());
    for (size_t i = 0; i < ::emu::kSharedWindowBytes / 8; ++i) to[i] = from[i];
}

inline void tma_load_2d(smem_t dst, const TensorMap* map, int x, int y, smem_t bar) {
    hopper::EmulatedTensorMap m;
    std::memcpy(&m, map, sizeof m);
    if (m.magic != hopper::kTensorMapMagic)
        ::emu::fault("cp.async.bulk.tensor: not a tensor map from emu_tensor_map_encode_tiled");
    if (dst % 128 != 0) ::emu::fault("cp.async.bulk.tensor: shared destination not 128-byte aligned");
    const std::uintptr_t offset = hopper::window_offset(dst, "cp.async.bulk.tensor: destination outside shared memory");
    const unsigned row_bytes = m.box[0] * m.element_bytes, bytes = row_bytes * m.box[1];
    if (offset + bytes > ::emu::kSharedWindowBytes) ::emu::fault("cp.async.bulk.tensor: box overruns shared memory");
    const unsigned span = hopper::swizzle_span_tma(m.swizzle);
    std::vector<::emu::AsyncCopy> chunks(bytes / 16);
    const auto* global = reinterpret_cast<const unsigned char*>(m.address);
    for (unsigned r = 0; r < m.box[1]; ++r)
        for (unsigned c = 0; c < m.box[0]; ++c) {
            const unsigned o = r * row_bytes + c * m.element_bytes;  // box-linear offset
            const long long gx = (long long)x + c, gy = (long long)y + r;
            unsigned char* out = chunks[o / 16].bytes + o % 16;
            if (gx >= 0 && gy >= 0 && (unsigned long long)gx < m.dims[0] && (unsigned long long)gy < m.dims[1])
                std::memcpy(out, global + gy * m.pitch + gx * m.element_bytes, m.element_bytes);
            else
                std::memset(out, 0, m.element_bytes);  // out of bounds: zero fill
        }
    for (unsigned i = 0; i < chunks.size(); ++i)
        chunks[i].destination = hopper::window() + hopper::swizzle(offset + 16 * i, span);
    ::emu::MBarrier& b = hopper::barrier_at(bar, "cp.async.bulk.tensor complete_tx");
    ::emu::TmaCopy copy{&b, std::move(chunks), (long long)bytes};
    const ::emu::Landing landing = ::emu::async_policy.landing;
    if (landing == ::emu::Landing::at_issue) {
        ::emu::land_tma(copy);  // lands now, written by this thread
        return;
    }
#ifndef EMU_THREADS
    if (landing == ::emu::Landing::at_wait) {  // lands when a thread tests the barrier
        b.copies.insert(b.copies.end(), copy.chunks.begin(), copy.chunks.end());
        b.copy_bytes += copy.bytes;
        return;
    }
#endif
    ::emu::self->tma_in_flight.push_back(std::move(copy));
    ::emu::async_progress(*::emu::self, false);
}

// Lane 0 of each warp checks the request and moves the warp's registers through the pool; the
// warp goes on together once it has them.
template <int N> inline void setmaxnreg(bool increase) {
    static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
    if (::emu::lane_id() == 0) {
        const int warp = ::emu::warp_id(), group = warp / 4, w = warp % 4;
        ::emu::RegisterPool& pool = ::emu::register_pool;
        PTX_EMU_LOCK(pool.mutex);  // the warps record concurrently in the threaded variant
        const int index = pool.count[group][w]++;
        if (index < 16) {
            pool.value[group][w][index] = increase ? N : -N;
            for (int other = 0; other < 4; ++other)
                if (other != w && pool.count[group][other] > index &&
                    pool.value[group][other][index] != pool.value[group][w][index])
                    ::emu::fault("setmaxnreg: the warps of a warp group asked for different register counts");
        }
        const int current = pool.per_thread[warp];
        if (increase && N < current)
            ::emu::faultf("setmaxnreg.inc %d: warp %d already has %d registers per thread", N, warp, current);
        if (!increase && N > current)
            ::emu::faultf("setmaxnreg.dec %d: warp %d has only %d registers per thread", N, warp, current);
        if (increase) {
            const long need = long(N - current) * ::emu::kWarpSize;
            while (pool.free < need) {  // the GPU's TRY_ALLOC loop: wait for another warp's .dec
                ::emu::self->waiting(::emu::Wait::registers, std::uintptr_t(need), N);
#ifdef EMU_THREADS
                lock.lock.unlock();
                ::emu::yield();
                lock.lock.lock();
#else
                ::emu::yield();
#endif
            }
            ::emu::self->waiting(::emu::Wait::none);
            pool.free -= need;
        } else {
            pool.free += long(current - N) * ::emu::kWarpSize;
        }
        pool.per_thread[warp] = N;
        ::emu::changed();
    }
    ::emu::warp_barrier();
}
template <int N> inline void setmaxnreg_inc() { setmaxnreg<N>(true); }
template <int N> inline void setmaxnreg_dec() { setmaxnreg<N>(false); }

inline void wgmma_fence() { ::emu::self->wgmma_fenced = true; }
inline void wgmma_commit_group() {
    ::emu::ThreadState& s = *::emu::self;
    s.mma_groups.push_back(std::move(s.mma_open));
    s.mma_open.clear();
}
template <int N> inline void wgmma_wait_group() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
    hopper::wait_group(size_t(N));
    // The accumulators are the thread's registers again: a later wgmma needs a fence first.
    ::emu::self->wgmma_fenced = false;
}

inline void wgmma_m64n256k16_bf16(float (&d)[128], unsigned long long a_desc, unsigned long long b_desc, int scale_d) {
    hopper::wgmma_m64nNk16<__nv_bfloat16, 256, false, true>(d, a_desc, b_desc, scale_d);
}
inline void wgmma_m64n256k16_f16(float (&d)[128], unsigned long long a_desc, unsigned long long b_desc, int scale_d) {
    hopper::wgmma_m64nNk16<__half, 256, false, true>(d, a_desc, b_desc, scale_d);
}

}  // namespace ptx

// cuTensorMapEncodeTiled's interface, for the emulated TMA: the harness calls it with the
// arguments it gives the driver on a GPU. Returns 0 (CUDA_SUCCESS) or 1 (CUDA_ERROR_INVALID_VALUE).
extern "C" __attribute__((visibility("default"))) int
emu_tensor_map_encode_tiled(void* tensor_map, int data_type, unsigned rank, void* address,
                            const unsigned long long* dims, const unsigned long long* strides, const unsigned* box,
                            const unsigned* element_strides, int interleave, int swizzle, int l2_promotion,
                            int oob_fill) {
    (void)l2_promotion;  // a cache hint: nothing to emulate
    // CUtensorMapDataType: UINT8 0, UINT16 1, UINT32 2, INT32 3, UINT64 4, INT64 5, FLOAT16 6,
    // FLOAT32 7, FLOAT64 8, BFLOAT16 9.
    static const unsigned element_bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2};
    if (!tensor_map || reinterpret_cast<std::uintptr_t>(tensor_map) % 64 != 0) return 1;
    if (data_type < 0 || data_type > 9 || rank != 2 || interleave != 0 || oob_fill != 0) return 1;
    if (swizzle < 0 || swizzle > 3) return 1;
    const unsigned size = element_bytes[data_type];
    if (reinterpret_cast<std::uintptr_t>(address) % 16 != 0) return 1;
    for (int i = 0; i < 2; ++i) {
        if (dims[i] < 1 || dims[i] > (1ull << 32)) return 1;
        if (box[i] < 1 || box[i] > 256 || element_strides[i] != 1) return 1;
    }
    if (strides[0] % 16 != 0 || strides[0] >= (1ull << 40) || strides[0] < dims[0] * size) return 1;
    if ((box[0] * size) % 16 != 0) return 1;
    const unsigned span = ptx::hopper::swizzle_span_tma(unsigned(swizzle));
    if (span && box[0] * size > span) return 1;  // the inner box must fit the swizzle span
    ptx::hopper::EmulatedTensorMap m{};
    m.magic = ptx::hopper::kTensorMapMagic;
    m.address = reinterpret_cast<std::uintptr_t>(address);
    m.dims[0] = dims[0], m.dims[1] = dims[1];
    m.pitch = strides[0];
    m.box[0] = box[0], m.box[1] = box[1];
    m.element_bytes = size;
    m.swizzle = unsigned(swizzle);
    std::memset(tensor_map, 0, sizeof(ptx::TensorMap));
    std::memcpy(tensor_map, &m, sizeof m);
    return 0;
}
