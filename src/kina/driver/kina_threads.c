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

/* A team: worker threads that stay awake between calls, so that handing a call to
   them costs a store and a cache miss, not waking a core (kina.runtime.workers.Team).
   Each worker spends its life in kina_team_work (called once, from its own thread, with
   the GIL released): it spins until the caller posts a call (a new `generation`), joins
   it, runs its share (the threaded entry, with its thread number), counts itself out,
   and spins again; after about a millisecond without a call it naps between checks,
   50 us, then twice as long each time up to 2 ms, and it returns when `stop` is set. The caller posts with kina_team_run, runs
   part 0 itself, then closes the call to late joiners and waits only for the workers
   that joined: a worker the system has not scheduled in time misses the call and
   touches nothing of it (the threaded entry's parts go to whoever claims them), so no
   call waits for a core to wake. `joined` holds the call's generation (bits 32-61),
   CLOSED, and the count of workers in (bits 0-31). */
#include <time.h>

#define KINA_TEAM_CLOSED (1LL << 62)
#define KINA_TEAM_GEN(g) (((g) & 0x3fffffffLL) << 32)

typedef struct {
    int64_t generation;
    char pad0[56];
    int64_t finished;
    char pad1[56];
    int64_t joined;
    char pad2[56];
    void *fn;
    void **args;
    int64_t nargs, nthreads, stop;
    void *ws;
} kina_team;

#define KINA_TEAM_MAX_ARGS 48

/* fn(args[0], ..., args[nargs - 1], tid, n, ws), with fn's own prototype: descriptor
   pointers, then the thread number and count, then the workspace's descriptor. */
static void kina_call(void *fn, void **a, int64_t nargs, int64_t tid, int64_t n, void *ws) {
    switch (nargs) {
    case 1: ((void (*)(void *, int64_t, int64_t, void *))fn)(a[0], tid, n, ws); return;
    case 2: ((void (*)(void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], tid, n, ws); return;
    case 3: ((void (*)(void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], tid, n, ws); return;
    case 4: ((void (*)(void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], tid, n, ws); return;
    case 5: ((void (*)(void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], tid, n, ws); return;
    case 6: ((void (*)(void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], tid, n, ws); return;
    case 7: ((void (*)(void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], tid, n, ws); return;
    case 8: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], tid, n, ws); return;
    case 9: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], tid, n, ws); return;
    case 10: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], tid, n, ws); return;
    case 11: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], tid, n, ws); return;
    case 12: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], tid, n, ws); return;
    case 13: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], tid, n, ws); return;
    case 14: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], tid, n, ws); return;
    case 15: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], tid, n, ws); return;
    case 16: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], tid, n, ws); return;
    case 17: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], tid, n, ws); return;
    case 18: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], tid, n, ws); return;
    case 19: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], tid, n, ws); return;
    case 20: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], tid, n, ws); return;
    case 21: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], tid, n, ws); return;
    case 22: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], tid, n, ws); return;
    case 23: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], tid, n, ws); return;
    case 24: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], tid, n, ws); return;
    case 25: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], tid, n, ws); return;
    case 26: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], tid, n, ws); return;
    case 27: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], tid, n, ws); return;
    case 28: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], tid, n, ws); return;
    case 29: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], tid, n, ws); return;
    case 30: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], tid, n, ws); return;
    case 31: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], tid, n, ws); return;
    case 32: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], tid, n, ws); return;
    case 33: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], tid, n, ws); return;
    case 34: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], tid, n, ws); return;
    case 35: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], tid, n, ws); return;
    case 36: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], tid, n, ws); return;
    case 37: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], tid, n, ws); return;
    case 38: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], tid, n, ws); return;
    case 39: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], tid, n, ws); return;
    case 40: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], tid, n, ws); return;
    case 41: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], tid, n, ws); return;
    case 42: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], tid, n, ws); return;
    case 43: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42], tid, n, ws); return;
    case 44: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42], a[43], tid, n, ws); return;
    case 45: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42], a[43], a[44], tid, n, ws); return;
    case 46: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42], a[43], a[44], a[45], tid, n, ws); return;
    case 47: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42], a[43], a[44], a[45], a[46], tid, n, ws); return;
    case 48: ((void (*)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, void *, int64_t, int64_t, void *))fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26], a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34], a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42], a[43], a[44], a[45], a[46], a[47], tid, n, ws); return;
    }
}

int64_t kina_team_max_args(void) { return KINA_TEAM_MAX_ARGS; }

void kina_team_work(kina_team *t, int64_t tid) {
    int64_t seen = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE);
    for (;;) {
        int64_t now;
        long nap = 50000; /* ns: after the spin, naps that double up to 2 ms while no call comes */
        for (unsigned tries = 0; (now = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE)) == seen; tries++) {
            if (tries < (1u << 14)) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
            } else {
                struct timespec pause = {0, nap};
                nanosleep(&pause, 0);
                nap = nap < 2000000 ? 2 * nap : nap;
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
            kina_call(t->fn, t->args, t->nargs, tid, t->nthreads, t->ws);
        __atomic_add_fetch(&t->finished, 1, __ATOMIC_ACQ_REL);
    }
}

void kina_team_run(kina_team *t, void *fn, void **args, int64_t nargs, int64_t nthreads, void *ws) {
    t->fn = fn;
    t->args = args;
    t->nargs = nargs;
    t->nthreads = nthreads;
    t->ws = ws;
    int64_t g = __atomic_load_n(&t->generation, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&t->finished, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->joined, KINA_TEAM_GEN(g), __ATOMIC_RELAXED);
    __atomic_store_n(&t->generation, g, __ATOMIC_RELEASE);
    kina_call(fn, args, nargs, 0, nthreads, ws);
    int64_t in = __atomic_fetch_or(&t->joined, KINA_TEAM_CLOSED, __ATOMIC_ACQ_REL) & 0xffffffffLL;
    kina_wait((intptr_t)&t->finished, in);
}

void kina_team_stop(kina_team *t) {
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&t->generation, 1, __ATOMIC_ACQ_REL);
}
