/* The runtime of a threaded entry (kina.ir.passes.threads), compiled into each .so
   that has one: the counters through which the threads of one call share its tasks.

   Each task of the entry has two counters in the call's workspace, each on its own
   cache line: `claimed` hands out its parts (kina_claim returns 0, 1, 2, ...: a part
   number below the task's count is the caller's to run, once), `done` counts the parts
   finished (kina_done). A task that reads what an earlier one wrote first waits until
   that one's `done` reaches its part count (kina_wait). No thread ever waits for
   another to arrive, only for parts another has claimed to finish: a thread the system
   has not scheduled yet claims nothing, and the running ones take its share. The
   caller zeroes the counters before each call. Waiting spins (a pause per try), then
   yields the core. Only libc is needed. */
#include <sched.h>
#include <stdint.h>

int64_t kina_claim(intptr_t claimed) {
    return __atomic_fetch_add((int64_t *)claimed, 1, __ATOMIC_ACQ_REL);
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
