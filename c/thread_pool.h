/* A persistent pool of worker threads for the packed matmul (thread_pool.c).
 *
 * pool_run(parts, task, context) runs task(context, part) for part = 0 .. parts-1, each on its
 * own thread (part 0 on the caller's), and returns when all have finished. The workers are
 * created on first use and parked between calls, so a call costs a wake-up (microseconds)
 * instead of a thread creation (tens of microseconds each), which is what lets threads pay
 * from 256^3 products.
 *
 * Safe to call from several threads at once: one caller at a time gets the workers, and a
 * caller that finds them busy runs its parts itself, one after another (slower, never wrong:
 * the parts of one call write disjoint data). Safe across fork(): the child starts with no
 * workers and makes its own.
 */
#ifndef MATMUL_THREAD_POOL_H
#define MATMUL_THREAD_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef void (*pool_task_fn)(void *context, int64_t part);

void pool_run(int64_t parts, pool_task_fn task, void *context);

/* As pool_run, but only if every part can run on a thread of its own, all at once (the pool is
 * free and has the workers): then its parts may wait for each other (pool_wait_at_least), and
 * it returns 1 when all are done. Otherwise it runs nothing and returns 0, and the caller
 * runs a plan whose parts do not wait for each other. */
int pool_run_together(int64_t parts, pool_task_fn task, void *context);

/* Waits until *counter (updated atomically by another part) is at least value: spinning a
 * little, then yielding the core between looks. Its load acquires, so what the part that
 * raised the counter wrote before raising it (with release) is visible after. */
void pool_wait_at_least(const int64_t *counter, int64_t value);

enum {
    /* The most threads one call runs on: the caller and POOL_MAX_THREADS - 1 workers (parts
     * beyond them run on the caller, after its own). */
    POOL_MAX_THREADS = 1024,
    /* Below this many multiply-adds a thread, waking one costs more than it saves. */
    POOL_MIN_WORK_PER_THREAD = 1 << 19,
};

/* The library's one thread-count policy: how many parts to cut a job of `work` multiply-adds
 * into. `requested` threads (every online core if <= 0), fewer where a thread would get under
 * POOL_MIN_WORK_PER_THREAD, never more than the job's max_parts independent pieces or
 * POOL_MAX_THREADS, and at least 1. A speed choice only: every kernel here gives the same bits
 * for every thread count. */
int64_t pool_threads_for(int64_t requested, double work, int64_t max_parts);

/* The calling thread's scratch (pack buffers): at least `bytes`, 64-byte aligned (a cache
 * line, an AVX-512 register, an AMX tile row), kept between calls, grown when too small
 * (its contents then lost), freed when the thread exits; NULL if it cannot be had. One per
 * thread, shared by the kernels that use it (c.packed, c.bf16): a call uses it only while it
 * runs, and no kernel calls another. */
void *pool_thread_buffer(size_t bytes);

#endif
