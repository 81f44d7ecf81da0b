// emu_launcher.h - the C entry points of an emulated kernel library.
//
// A generated translation unit includes cuda_emu.h, one kernel source (cuda/<technique>.cu),
// then this file, and lists the source's kernels:
//
//     EMU_KERNELS(EMU_KERNEL(tiled_f32) EMU_KERNEL(...))
//
// The library then exports, with C linkage:
//     int         emu_kernel_count(void);
//     const char* emu_kernel_name(int i);
//     const char* emu_kernel_signature(int i);   // PyCUDA-style: P pointer, i int, I unsigned, f float, T tensor map
//     int         emu_launch(int i, const unsigned grid[3], const unsigned block[3],
//                            void** args, char* error, int error_size);
// `args` is what cuLaunchKernel takes: one pointer per kernel parameter, pointing at its value.
// That is the launch interface the PyCUDA path uses too (grid, block, argument list), so the
// harness drives both with the same launch geometry.
#pragma once
#include <cstdio>
#include <mutex>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace emu {

template <class T> constexpr char signature_char() {
    if constexpr (std::is_pointer_v<T>)
        return 'P';
    else if constexpr (std::is_same_v<T, int>)
        return 'i';
    else if constexpr (std::is_same_v<T, unsigned>)
        return 'I';
    else if constexpr (std::is_same_v<T, float>)
        return 'f';
    else if constexpr (std::is_same_v<T, long long>)
        return 'q';
    else if constexpr (std::is_same_v<T, TensorMapBytes>)
        return 'T';  // a CUtensorMap, 128 bytes by value
    else
        return '?';
}

template <class... P> struct Signature {
    static constexpr char text[] = {signature_char<std::remove_cv_t<P>>()..., '\0'};
};

template <class... P> constexpr const char* signature_of(void (*)(P...)) { return Signature<P...>::text; }

template <class... P, size_t... I> void invoke_with(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<P>*>(args[I])...);
}
template <class... P> void invoke(void (*kernel)(P...), void** args) {
    invoke_with(kernel, args, std::index_sequence_for<P...>{});
}

struct KernelEntry {
    const char* name;
    Invoke invoke;
    const char* signature;
};

inline std::mutex launch_mutex;  // `__shared__` statics and the launch state are per library

}  // namespace emu

#define EMU_KERNEL(name)                                                                                               \
    ::emu::KernelEntry{#name, [](void** args) { ::emu::invoke(&name, args); }, ::emu::signature_of(&name)},

#define EMU_KERNELS(...)                                                                                               \
    static const ::emu::KernelEntry emu_table[] = {__VA_ARGS__};                                                       \
    EMU_EXPORT int emu_kernel_count(void) { return int(sizeof(emu_table) / sizeof(emu_table[0])); }                    \
    EMU_EXPORT const char* emu_kernel_name(int i) { return emu_table[i].name; }                                        \
    EMU_EXPORT const char* emu_kernel_signature(int i) { return emu_table[i].signature; }                              \
    EMU_EXPORT int emu_launch(int i, const unsigned grid[3], const unsigned block[3], void** args, char* error,        \
                              int error_size) {                                                                        \
        return ::emu::launch_checked(emu_table, emu_kernel_count(), i, grid, block, args, error, error_size);          \
    }

namespace emu {

inline int launch_checked(const KernelEntry* table, int count, int i, const unsigned grid[3], const unsigned block[3],
                          void** args, char* error, int error_size) {
    auto fail = [&](const char* message) {
        if (error && error_size > 0) std::snprintf(error, size_t(error_size), "%s", message);
        return 1;
    };
    if (i < 0 || i >= count) return fail("no such kernel");
    const unsigned long threads = (unsigned long)block[0] * block[1] * block[2];
    if (threads == 0 || threads > unsigned(kMaxThreads)) return fail("a block must have 1 to 1024 threads");
    if (block[2] > 64) return fail("blockDim.z must be <= 64");
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return fail("every grid dimension must be >= 1");
    if (grid[1] > 65535 || grid[2] > 65535) return fail("gridDim.y and gridDim.z must be <= 65535");
    std::lock_guard<std::mutex> lock(launch_mutex);
    if (const char* why = read_async_policy()) return fail(why);
    const char* message =
        run_grid(table[i].invoke, args, dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]));
    return message ? fail(message) : 0;
}

}  // namespace emu
