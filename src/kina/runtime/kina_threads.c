/* The runtime of a threaded entry (kina.ir.passes.threads), compiled into each .so
   that has one: the counters through which the threads of one call share its tasks.

   Each task of the entry has two counters in the call's workspace, each on its own
   cache line: `claimed` hands out its parts (kina_claim returns a part number below the
   task's count, the caller's to run, once, or the count when none is left), `done`
   counts the parts finished (kina_done). A task that reads what an earlier one wrote
   first waits until that one's `done` reaches its part count (kina_wait). No thread ever
   waits for another to arrive, only for parts another has claimed to finish: a thread
   the system has not scheduled yet claims nothing, and the running ones take its share.
   The caller zeroes the counters before each call. Waiting spins (a pause per try),
   then yields the core. Only libc is needed. kina_abi.h declares what the compiled code
   and the loader call here. */
#include <sched.h>
#include <stdint.h>

#include "kina_abi.h"

/* Thread `tid` of `nthreads` claims a part of a task of `parts`: first the next of its own
   range, parts [tid * parts / nthreads, (tid + 1) * parts / nthreads), in order, then the
   last part still free, from the back of another thread's range. `claimed` is then a mask
   of the parts taken. So a thread reads its parts' memory front to back, as one thread
   does all of them: two threads that took every other part from one counter each began a
   stream afresh at every part, and a SmolLM decode step in 8 parts a task took 11.90 ms
   on two threads against 11.23 so (docs/performance.md, "What an F16 step lacks of 85% of
   the floor"). Past 64 parts, or on one thread, `claimed` counts: parts 0, 1, 2, ... */
static uint64_t kina_bits(int64_t lo, int64_t hi) { /* the mask of parts [lo, hi), 0 <= lo <= hi <= 64 */
    uint64_t below_hi = hi >= 64 ? ~0ull : (1ull << hi) - 1;
    return lo >= 64 ? 0 : below_hi & ~((1ull << lo) - 1);
}

int64_t kina_claim(intptr_t claimed, int64_t parts, int64_t tid, int64_t nthreads) {
    if (parts > 64 || nthreads <= 1)
        return __atomic_fetch_add((int64_t *)claimed, 1, __ATOMIC_ACQ_REL);
    uint64_t *taken = (uint64_t *)claimed, all = kina_bits(0, parts);
    uint64_t own = kina_bits(tid * parts / nthreads, (tid + 1) * parts / nthreads);
    for (;;) {
        uint64_t left = ~__atomic_load_n(taken, __ATOMIC_ACQUIRE) & all;
        if (!left)
            return parts;
        int part = (left & own) ? __builtin_ctzll(left & own) : 63 - __builtin_clzll(left);
        if (!(__atomic_fetch_or(taken, 1ull << part, __ATOMIC_ACQ_REL) & (1ull << part)))
            return part;
    }
}

void kina_done(intptr_t done) {
#if defined(__x86_64__)
    __builtin_ia32_sfence(); /* this part's non-temporal stores, before anyone reads them */
#endif
    __atomic_add_fetch((int64_t *)done, 1, __ATOMIC_RELEASE);
}

void kina_wait(intptr_t done, int64_t parts) {
    for (unsigned tries = 0; __atomic_load_n((int64_t *)done, __ATOMIC_ACQUIRE) < parts; tries++) {
        if (tries < (1u << 12)) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

/* A team: worker threads that stay awake between calls, so that handing a call to
   them costs a store and a cache miss, not waking a core (kina.runtime.workers.Team).
   Each worker spends its life in kina_team_work (called once, from its own thread, with
   the GIL released): it spins until the caller posts a call (a new `generation`), joins
   it, runs its share (fn, the entry's kina_<f>_team from the team-entries pass, which
   takes the call's array of descriptor pointers, with its thread number), counts itself out,
   and spins again; after about a millisecond without a call it sleeps until the next call
   rings `bell` (a futex on Linux: a napping worker woke up to 2 ms late, and missed the first
   calls of a prefill that came after an idle moment; elsewhere it naps between checks, 50 us,
   then twice as long each time up to 2 ms), and it returns when `stop` is set. The caller
   posts with kina_team_run, runs part 0 itself, then closes the call to late joiners and
   waits only for the workers that joined: a worker the system has not scheduled in time
   misses the call and touches nothing of it (the threaded entry's parts go to whoever
   claims them), so no call waits for a core to wake. `joined` holds the call's generation (bits 32-61),
   CLOSED, and the count of workers in (bits 0-31). */
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define KINA_TEAM_CLOSED (1LL << 62)
#define KINA_TEAM_GEN(g) (((g) & 0x3fffffffLL) << 32)

struct kina_team {
    int64_t generation;
    char pad0[56];
    int64_t finished;
    char pad1[56];
    int64_t joined;
    char pad2[56];
    kina_team_entry fn; /* kina_<f>_team */
    void **args;
    int64_t nthreads, stop;
    void *ws;
    int64_t sleepers; /* workers in kina_team_sleep */
    int32_t bell;     /* rung (incremented) at each post: the futex the sleepers wait on */
};

_Static_assert(sizeof(kina_team) <= KINA_TEAM_BYTES, "the loader allocates KINA_TEAM_BYTES for a kina_team");

/* Sleep until the generation moves past `seen` or the bell rings (or a spurious wake-up:
   the caller checks again). The worker counts itself among the sleepers before it looks at
   the generation, and the caller rings the bell after posting before it looks at the
   sleepers (all sequentially consistent), so either the worker sees the new call or the
   caller wakes it; a bell rung in between makes the futex wait return at once. */
static void kina_team_sleep(kina_team *t, int64_t seen, long *nap) {
#if defined(__linux__) && defined(SYS_futex)
    (void)nap;
    int32_t bell = __atomic_load_n(&t->bell, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&t->generation, __ATOMIC_SEQ_CST) == seen)
        syscall(SYS_futex, &t->bell, FUTEX_WAIT_PRIVATE, bell, (void *)0, (void *)0, 0);
    __atomic_sub_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
#else
    struct timespec pause = {0, *nap};
    nanosleep(&pause, 0);
    *nap = *nap < 2000000 ? 2 * *nap : *nap;
#endif
}

/* After a post: wake the workers asleep in kina_team_sleep, if any. */
static void kina_team_ring(kina_team *t) {
    __atomic_add_fetch(&t->bell, 1, __ATOMIC_SEQ_CST);
#if defined(__linux__) && defined(SYS_futex)
    if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &t->bell, FUTEX_WAKE_PRIVATE, 0x7fffffff, (void *)0, (void *)0, 0);
#endif
}

void kina_team_work(kina_team *t, int64_t tid) {
    int64_t seen = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t now;
        long nap = 50000; /* ns: without a futex, after the spin, naps that double up to 2 ms */
        for (unsigned tries = 0; (now = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE)) == seen; tries++) {
            if (tries < (1u << 14)) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
            } else {
                kina_team_sleep(t, seen, &nap);
            }
        }
        seen = now;
        if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE))
            return;
        int64_t w = __atomic_load_n(&t->joined, __ATOMIC_ACQUIRE);
        int in = 0;
        while ((w & ~0xffffffffLL) == KINA_TEAM_GEN(now)) { /* this call's, and not closed */
            if (__atomic_compare_exchange_n(&t->joined, &w, w + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                in = 1;
                break;
            }
        }
        if (!in)
            continue; /* missed it: the caller has finished without this thread */
        if (tid < t->nthreads)
            t->fn(t->args, tid, t->nthreads, t->ws);
        __atomic_add_fetch(&t->finished, 1, __ATOMIC_ACQ_REL);
    }
}

void kina_team_run(kina_team *t, kina_team_entry fn, void **args, int64_t nthreads, void *ws) {
    t->fn = fn;
    t->args = args;
    t->nthreads = nthreads;
    t->ws = ws;
    int64_t g = __atomic_load_n(&t->generation, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&t->finished, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->joined, KINA_TEAM_GEN(g), __ATOMIC_RELAXED);
    __atomic_store_n(&t->generation, g, __ATOMIC_SEQ_CST);
    kina_team_ring(t);
    fn(args, 0, nthreads, ws);
    int64_t in = __atomic_fetch_or(&t->joined, KINA_TEAM_CLOSED, __ATOMIC_ACQ_REL) & 0xffffffffLL;
    kina_wait((intptr_t)&t->finished, in);
}

void kina_team_stop(kina_team *t) {
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&t->generation, 1, __ATOMIC_SEQ_CST);
    kina_team_ring(t);
}

/* A run of calls in one entry from the host (kina.runtime.CallSequence), in order:
   call i is team[i], the function's team entry, on the team, its workspace's first zero[i]
   bytes (the task counters) zeroed first, when there is a team and a team entry and
   nthreads > 1; else packed[i](args[i]) on this thread (kina_<f>_packed, the function's
   own body). The host's code between the calls of a decode step, evicted from the caches
   by each layer's weights, had cost 80 us a call on the Zen 1 VM. */
#include <string.h>

void kina_run_sequence(kina_team *t, int64_t n, void **packed, void **team, void ***args, void **ws,
                       const int64_t *zero, int64_t nthreads) {
    for (int64_t i = 0; i < n; i++) {
        if (t && nthreads > 1 && team[i]) {
            memset(((void **)ws[i])[1], 0, (size_t)zero[i]); /* a memref<?xi8> descriptor: its aligned pointer */
            kina_team_run(t, (kina_team_entry)team[i], args[i], nthreads, ws[i]);
        } else {
            ((kina_packed_entry)packed[i])(args[i]);
        }
    }
}
