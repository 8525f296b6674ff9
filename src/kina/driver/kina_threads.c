/* The runtime of a threaded entry (kina.ir.passes.threads), compiled into each .so
   that has one: a barrier for the threads of one call.

   The workspace every thread of a call is given starts with two counters, each on
   its own cache line: `arrived` counts the threads at the barrier, `generation` the
   barriers passed. A thread reads the generation, then counts itself in; the last one
   in resets the count and advances the generation, which releases the others. The
   caller zeroes both before the first call; a call that returns leaves `arrived` at 0.
   Waiting threads spin (a pause per try), then yield the core, so that a thread whose
   core was taken by another process still gets through. Only libc is needed. */
#include <sched.h>
#include <stdint.h>

typedef struct {
    int64_t arrived;
    char pad0[56];
    int64_t generation;
    char pad1[56];
} kina_barrier_state;

void kina_barrier(intptr_t workspace, int64_t nthreads) {
    if (nthreads <= 1)
        return;
#if defined(__x86_64__)
    __builtin_ia32_sfence(); /* the non-temporal stores of this thread's part, before the others read them */
#endif
    kina_barrier_state *b = (kina_barrier_state *)workspace;
    int64_t generation = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == nthreads) {
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->generation, generation + 1, __ATOMIC_RELEASE);
        return;
    }
    for (unsigned tries = 0; __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) == generation; tries++) {
        if (tries < (1u << 12)) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}
