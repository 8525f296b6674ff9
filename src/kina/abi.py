"""The names a built .so and the runtime agree on, in one table.

For a Kina function `f`, the passes give the .so these entries (all but the first two
only where the threads and team-entries passes ran), and the loader looks them up by
these names:

    symbol                              made by        what it is
    _mlir_ciface_kina_f(in.., out..)    abi            the body; each argument a memref descriptor pointer
    _mlir_ciface_kina_f_threaded(       threads        the threaded entry: each thread of a call runs it,
        in.., out.., tid, n, ws)                       sharing the workspace `ws`
    _mlir_ciface_kina_f_workspace(..)   threads        the bytes `ws` needs for these arguments
    _mlir_ciface_kina_f_counters()      threads        its first bytes, the task counters zeroed per call
    kina_f_packed(args)                 team-entries   the body, its descriptor pointers as one array
    kina_f_team(args, tid, n, ws)       team-entries   the threaded entry, likewise (a team thread's call)

(`kina_` is the abi pass's `prefix` option; `_mlir_ciface_` is MLIR's, for a function
with `llvm.emit_c_interface`.) A threaded entry calls the C runtime `C_SOURCE`
(kina_threads.c, linked into a .so that has one) through `ENTRY_CALLS`; the loader calls
`HOST_CALLS`. `HEADER` (kina_abi.h) declares all of them in C; a test checks that it
declares every name here, that the C source defines them, and that both say the same
suffixes and `TEAM_BYTES`. The sidecar beside each .so is a JSON record of
`SIDECAR_FORMAT`.

Guarantees: a leaf module (it imports nothing from `kina`); the passes, the driver and
the loader spell none of these names themselves.
"""
from __future__ import annotations

from pathlib import Path

PREFIX = "kina_"  # every exported name (the abi pass's default prefix)
C_INTERFACE = "_mlir_ciface_"  # MLIR's prefix of a function's C interface
# what the threads pass adds beside each function, and what team-entries adds beside those
THREADED, WORKSPACE, COUNTERS = "_threaded", "_workspace", "_counters"
PACKED, TEAM = "_packed", "_team"

# kina_threads.c: what a threaded entry calls (claim a part of a task, count it done, wait
# for a task's parts), and what the loader calls (a team of threads; a run of calls)
CLAIM, DONE, WAIT = "kina_claim", "kina_done", "kina_wait"
TEAM_WORK, TEAM_RUN, TEAM_STOP = "kina_team_work", "kina_team_run", "kina_team_stop"
RUN_SEQUENCE = "kina_run_sequence"
ENTRY_CALLS = (CLAIM, DONE, WAIT)
HOST_CALLS = (TEAM_WORK, TEAM_RUN, TEAM_STOP, RUN_SEQUENCE)
TEAM_BYTES = 256  # what the loader allocates for a kina_team (the header asserts it is enough)

SIDECAR_FORMAT = "kina-sidecar-1"

RUNTIME = Path(__file__).resolve().parent / "runtime"
C_SOURCE = RUNTIME / "kina_threads.c"
HEADER = RUNTIME / "kina_abi.h"


def exported(fn: str, suffix: str = "") -> str:
    """The exported name of Kina function `fn` (`kina_f`), with a suffix (`kina_f_packed`)."""
    return f"{PREFIX}{fn}{suffix}"


def c_interface(fn: str, suffix: str = "") -> str:
    """The C interface of Kina function `fn` (`_mlir_ciface_kina_f`), or of an entry the
    threads pass added beside it (`suffix`: THREADED, WORKSPACE, COUNTERS)."""
    return f"{C_INTERFACE}{PREFIX}{fn}{suffix}"
