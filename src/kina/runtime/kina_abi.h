/* kina_abi.h: the ABI between the code kinac emits, the C runtime (kina_threads.c) and
   the loader (kina.runtime). kina/abi.py holds the same names for the Python side, the
   one table the passes, the driver and the loader read; tests/test_abi.py checks that
   the two agree and that kina_threads.c defines every function declared here.

   A Kina function f gives a .so these entries (their arguments: pointers to memref
   descriptors {allocated, aligned, offset, sizes[r], strides[r]}, int64 words, the
   inputs' then the outputs'):

     _mlir_ciface_kina_f(in.., out..)                       the body (the abi pass)
     _mlir_ciface_kina_f_threaded(in.., out.., tid, n, ws)  its threaded entry (threads)
     _mlir_ciface_kina_f_workspace(in.., out..) -> bytes    what ws needs (threads)
     _mlir_ciface_kina_f_counters() -> bytes                ws's first bytes, zeroed per call
     kina_f_packed(args)                                    the body, args an array of those
                                                            pointers (team-entries)
     kina_f_team(args, tid, n, ws)                          the threaded entry, likewise

   A threaded entry calls kina_claim, kina_done and kina_wait; the loader calls the team's
   functions and kina_run_sequence. */
#ifndef KINA_ABI_H
#define KINA_ABI_H

#include <stdint.h>

#define KINA_PREFIX "kina_"               /* every exported name */
#define KINA_C_INTERFACE "_mlir_ciface_"  /* MLIR's prefix of a function's C interface */
#define KINA_SUFFIX_THREADED "_threaded"
#define KINA_SUFFIX_WORKSPACE "_workspace"
#define KINA_SUFFIX_COUNTERS "_counters"
#define KINA_SUFFIX_PACKED "_packed"
#define KINA_SUFFIX_TEAM "_team"

typedef void (*kina_packed_entry)(void **args);                                   /* kina_<f>_packed */
typedef void (*kina_team_entry)(void **args, int64_t tid, int64_t nthreads, void *ws); /* kina_<f>_team */

/* What a threaded entry calls, on a task's two counters in its workspace (`claimed` and
   `done`, each on its own cache line): thread `tid` of `nthreads` claims a part of a task
   of `parts` (the part's number, or `parts` when none is left), counts a part done, and
   waits until a task's `parts` are all done. */
int64_t kina_claim(intptr_t claimed, int64_t parts, int64_t tid, int64_t nthreads);
void kina_done(intptr_t done);
void kina_wait(intptr_t done, int64_t parts);

/* A team of worker threads that stay in the runtime between calls. The loader allocates
   KINA_TEAM_BYTES for one, zeroed (kina_threads.c asserts that its struct fits), and gives
   it to: kina_team_work, once from each worker thread (number `tid`, from 1), which returns
   after kina_team_stop; kina_team_run, which runs `fn` on the caller (tid 0) and the
   workers that join in time, and returns when those have finished. */
#define KINA_TEAM_BYTES 256
typedef struct kina_team kina_team;
void kina_team_work(kina_team *t, int64_t tid);
void kina_team_run(kina_team *t, kina_team_entry fn, void **args, int64_t nthreads, void *ws);
void kina_team_stop(kina_team *t);

/* `n` calls in order in one entry from the host: call i runs team[i] (a kina_team_entry) on
   the team, its workspace ws[i]'s first zero[i] bytes zeroed first, where there is a team,
   a team entry and nthreads > 1; else packed[i] (a kina_packed_entry) on this thread. */
void kina_run_sequence(kina_team *t, int64_t n, void **packed, void **team, void ***args, void **ws,
                       const int64_t *zero, int64_t nthreads);

#endif
