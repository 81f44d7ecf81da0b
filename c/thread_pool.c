/* The packed matmul's persistent thread pool: see thread_pool.h for what it promises.
 *
 * Protocol. The caller publishes a job (task, context, parts) under `lock`, bumps
 * `generation` and broadcasts `wake`; worker w (1, 2, ...) waits for a generation it has not
 * seen, runs part w if w < parts, and the last worker to finish signals `done`. The caller
 * runs part 0 itself meanwhile, then waits for `remaining` to reach 0. `busy` admits one
 * caller at a time; a second caller does not wait for it (that could be a long product) but
 * runs its own parts inline.
 *
 * Workers that cannot be created leave their parts to the caller: slower, never wrong.
 * The workers run this library's code for as long as the process lives, so the library is
 * linked with -z nodelete (CMakeLists.txt): it must never be unloaded under them.
 * fork(): only the forking thread exists in the child, so the child handler forgets the
 * workers and re-initialises the locks (which another thread may have held at the fork).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under a strict -std=c11 */
#if defined(__APPLE__)
#define _DARWIN_C_SOURCE /* _SC_NPROCESSORS_ONLN, which a strict POSIX level hides there */
#endif
#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "matmul.h"

enum { MAX_WORKERS = POOL_MAX_THREADS - 1 }; /* the caller runs part 0 */

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER; /* one caller at a time */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;   /* a new job was published */
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;   /* the last worker finished */
static int64_t workers;                                  /* worker threads alive */
static uint64_t generation;                              /* jobs published so far */
static pool_task_fn job_task;
static void *job_context;
static int64_t job_parts, remaining;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* Waking a parked thread through the kernel can take hundreds of microseconds (measured on a
 * 2-core virtual machine: a 512^3 product ran no faster on 2 threads than on 1), more than a
 * 256^3 product's share. So both sides poll for up to SPIN_SECONDS before they sleep, as
 * OpenBLAS's threads do: the cost is a core kept busy that long after each product. */
static const double SPIN_SECONDS = 0.005;

/* pool_wait_at_least's pauses before it starts yielding its core (a few microseconds). */
enum { WAIT_SPINS = 256 };

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void spin_until_changed(const uint64_t *value, uint64_t old) {
    const double deadline = now_seconds() + SPIN_SECONDS;
    while (__atomic_load_n(value, __ATOMIC_ACQUIRE) == old) {
        for (int i = 0; i < 64; ++i) cpu_relax();
        if (now_seconds() > deadline) return;
    }
}

static void spin_until_zero(const int64_t *value) {
    const double deadline = now_seconds() + SPIN_SECONDS;
    while (__atomic_load_n(value, __ATOMIC_ACQUIRE) > 0) {
        for (int i = 0; i < 64; ++i) cpu_relax();
        if (now_seconds() > deadline) return;
    }
}

/* What a new worker is told: its number, and the last job it must not run (the job about to
 * be published may come before the new thread first takes the lock, so it cannot read this). */
struct worker_start {
    int64_t id;
    uint64_t seen;
};

static void *worker_main(void *arg) {
    const struct worker_start start = *(struct worker_start *)arg;
    free(arg);
    const int64_t id = start.id;
    uint64_t seen = start.seen;
    pthread_mutex_lock(&lock);
    for (;;) {
        if (generation == seen) { /* spin a little first: a woken thread starts late */
            pthread_mutex_unlock(&lock);
            spin_until_changed(&generation, seen);
            pthread_mutex_lock(&lock);
        }
        while (generation == seen) pthread_cond_wait(&wake, &lock);
        seen = generation;
        if (id >= job_parts) continue; /* not needed for this job */
        const pool_task_fn task = job_task;
        void *context = job_context;
        pthread_mutex_unlock(&lock);
        task(context, id);
        pthread_mutex_lock(&lock);
        if (__atomic_sub_fetch(&remaining, 1, __ATOMIC_RELEASE) == 0) pthread_cond_signal(&done);
    }
    return NULL;
}

static void forget_workers_after_fork(void) {
    pthread_mutex_init(&busy, NULL);
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&done, NULL);
    workers = 0;
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, forget_workers_after_fork); }

/* Start workers until there are `wanted`; returns how many exist. Called holding `busy`, before
 * the job is published, so `generation` is the last job a new worker has nothing to do with. */
static int64_t ensure_workers(int64_t wanted) {
    if (wanted > MAX_WORKERS) wanted = MAX_WORKERS;
    while (workers < wanted) {
        struct worker_start *start = malloc(sizeof *start);
        if (!start) break;
        start->id = workers + 1;
        start->seen = generation;
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&thread, &attributes, worker_main, start);
        pthread_attr_destroy(&attributes);
        if (failed) {
            free(start);
            break;
        }
        ++workers;
    }
    return workers;
}

/* Runs parts 0 .. pooled-1 on the caller and the workers, the rest on the caller after its own,
 * and returns when all are done. Called holding `busy`, which it releases. */
static void run_on_workers(int64_t parts, int64_t pooled, pool_task_fn task, void *context) {
    pthread_mutex_lock(&lock);
    job_task = task;
    job_context = context;
    job_parts = pooled;
    remaining = pooled - 1;
    __atomic_store_n(&generation, generation + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);

    task(context, 0);
    for (int64_t part = pooled; part < parts; ++part) task(context, part); /* no worker for these */

    spin_until_zero(&remaining);
    pthread_mutex_lock(&lock);
    while (remaining > 0) pthread_cond_wait(&done, &lock);
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&busy);
}

void pool_run(int64_t parts, pool_task_fn task, void *context) {
    if (parts <= 1 || pthread_mutex_trylock(&busy) != 0) {
        for (int64_t part = 0; part < parts; ++part) task(context, part);
        return;
    }
    pthread_once(&atfork_once, register_atfork);
    const int64_t helpers = ensure_workers(parts - 1);
    run_on_workers(parts, helpers + 1 < parts ? helpers + 1 : parts, task, context);
}

int pool_run_together(int64_t parts, pool_task_fn task, void *context) {
    if (parts <= 1) {
        if (parts == 1) task(context, 0);
        return 1;
    }
    if (parts > POOL_MAX_THREADS || pthread_mutex_trylock(&busy) != 0) return 0;
    pthread_once(&atfork_once, register_atfork);
    if (ensure_workers(parts - 1) + 1 < parts) {
        pthread_mutex_unlock(&busy);
        return 0;
    }
    run_on_workers(parts, parts, task, context);
    return 1;
}

void pool_wait_at_least(const int64_t *counter, int64_t value) {
    for (int64_t spins = 0; __atomic_load_n(counter, __ATOMIC_ACQUIRE) < value; ++spins) {
        if (spins < WAIT_SPINS)
            cpu_relax();
        else
            sched_yield(); /* more threads than cores: the one to wait for may need this core */
    }
}

int64_t pool_threads_for(int64_t requested, double work, int64_t max_parts) {
    int64_t threads = requested;
    if (threads <= 0) {
        const long online = sysconf(_SC_NPROCESSORS_ONLN);
        threads = online > 0 ? online : 1;
    }
    const double by_work = work / POOL_MIN_WORK_PER_THREAD;
    if (by_work < (double)threads) threads = by_work < 1 ? 1 : (int64_t)by_work;
    return max_i64(1, min_i64(min_i64(threads, max_parts), POOL_MAX_THREADS));
}

/* ---- the per-thread scratch (thread_pool.h) ---- */

static pthread_key_t scratch_key;
static pthread_once_t scratch_key_once = PTHREAD_ONCE_INIT;
struct scratch {
    void *data;
    size_t bytes;
};

static void free_scratch(void *scratch) {
    free(((struct scratch *)scratch)->data);
    free(scratch);
}

static void make_scratch_key(void) { pthread_key_create(&scratch_key, free_scratch); }

void *pool_thread_buffer(size_t bytes) {
    pthread_once(&scratch_key_once, make_scratch_key);
    struct scratch *scratch = pthread_getspecific(scratch_key);
    if (!scratch) {
        scratch = calloc(1, sizeof *scratch);
        if (!scratch || pthread_setspecific(scratch_key, scratch) != 0) {
            free(scratch);
            return NULL;
        }
    }
    if (scratch->bytes < bytes) {
        free(scratch->data);
        scratch->data = NULL;
        scratch->bytes = 0;
        if (posix_memalign(&scratch->data, 64, bytes) != 0) return NULL;
        scratch->bytes = bytes;
    }
    return scratch->data;
}
