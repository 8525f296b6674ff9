"""The threads that run a threaded entry: the module's `Team`, or worker threads.

In:  a ctypes function and one list of pointer arguments per thread (`run_concurrently`);
     or a loaded .so whose C runtime keeps a team of threads (`Team`).
Out: every call has run; the first on the calling thread, the others on worker
     threads (ctypes releases the GIL for each call).

A threaded call runs on its module's `Team`, whose threads wait in the C runtime between
calls; `run_concurrently` runs it on worker threads of this module's own pool when the team
is busy with another call (concurrent callers) or the .so has none (an older build).

Why threads of our own: a worker waits on a condition of its own, and the caller
builds every part's arguments, so a worker wakes and runs the kernel and nothing
else: the hand-over (most of it waking a core) is what a split adds to the kernel. Each
worker is bound to one core, and for the call the caller is bound off the workers'
cores (then given its own binding back): left to the scheduler, a woken worker often
ran on its caller's core, where the two parts ran one after the other. The
measurements: docs/performance.md, "Worker threads".

Guarantees: a call returns only when every part handed to a worker has finished,
even when the calling thread is interrupted (the interruption is raised after),
so no part writes into buffers its caller has dropped. An exception in a part is
raised in the caller. The caller's binding is restored. Parts go to the cores
with the fewest parts of this process running, the caller's own core counting
as busy. Concurrent callers never share a worker. A forked child starts with no
workers. Where the system cannot bind threads (no `sched_setaffinity`, or it
refuses), workers are unbound and the rest holds. Idle workers are kept for reuse.
"""
from __future__ import annotations

import ctypes
import os
import threading

from .. import abi


def cpus() -> set[int] | None:
    """The cores the calling thread may run on, or None where that is unknown."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


def _set_cpus(wanted: set[int]) -> bool:
    """Bind the calling thread (only) to `wanted`; False if the system refuses."""
    try:
        os.sched_setaffinity(0, wanted)
        return True
    except (AttributeError, OSError):
        return False


try:
    _sched_getcpu = ctypes.CDLL(None).sched_getcpu  # glibc: the core this thread is on now
except AttributeError:
    _sched_getcpu = None


class _Worker:
    """A thread, bound to `cpu` (None: unbound), that runs one part at a time.

    Hand-over through one condition over two counts: `start` counts a part in, the
    worker counts it out when it has run, and `wait` waits until the two agree. So
    `wait` returns only when the part has run, and can be called again after an
    interruption at any point (at once if nothing is running)."""

    def __init__(self, cpu: int | None):
        self.cpu = cpu
        self._cond = threading.Condition(threading.Lock())
        self._job = self._error = None
        self._started = self._finished = 0
        self.thread = threading.Thread(target=self._loop, name=f"kina-worker-{cpu}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        if self.cpu is not None:
            _set_cpus({self.cpu})
        while True:
            with self._cond:
                while self._finished == self._started:
                    self._cond.wait()
                cfunc, pointers = self._job
            error = None
            try:
                cfunc(*pointers)
            except BaseException as e:  # raised in the caller; this thread stays usable
                error = e
            with self._cond:
                self._error, self._finished = error, self._finished + 1
                self._cond.notify()

    def start(self, cfunc, pointers) -> None:
        with self._cond:
            self._job, self._error = (cfunc, pointers), None
            self._started += 1
            self._cond.notify()

    def wait(self) -> BaseException | None:
        """Block until every part given is done; the last one's exception, if any."""
        with self._cond:
            while self._finished < self._started:
                self._cond.wait()
            return self._error


class _Pool:
    def __init__(self):
        self.lock = threading.Lock()
        self.idle: dict[int | None, list[_Worker]] = {}
        self.running: dict[int | None, int] = {}  # parts of this process running per core

    def take(self, n: int) -> list[_Worker]:
        """n workers for one call: the least busy cores, the caller's own counting as busy."""
        allowed = cpus()
        here = _sched_getcpu() if _sched_getcpu is not None else None
        picks = []
        with self.lock:
            for _ in range(n):
                if allowed and len(allowed) > 1:
                    cpu = min(sorted(allowed), key=lambda c: self.running.get(c, 0) + (c == here))
                else:
                    cpu = None
                self.running[cpu] = self.running.get(cpu, 0) + 1
                idle = self.idle.get(cpu)
                picks.append((cpu, idle.pop() if idle else None))
        workers = []
        try:
            for cpu, w in picks:
                workers.append(w or _Worker(cpu))
        except BaseException:  # no thread (or interrupted): hand back what was taken
            with self.lock:
                for i, (cpu, idle_one) in enumerate(picks):
                    self.running[cpu] -= 1
                    kept = workers[i] if i < len(workers) else idle_one  # made (or reused), else as taken
                    if kept is not None:
                        self.idle.setdefault(cpu, []).append(kept)
            raise
        return workers

    def give_back(self, workers: list[_Worker]) -> None:
        with self.lock:
            for w in workers:
                self.running[w.cpu] -= 1
                self.idle.setdefault(w.cpu, []).append(w)


_pool = _Pool()


def _forget_workers() -> None:  # in a forked child the pool's threads do not exist
    global _pool
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


def run_concurrently(cfunc, calls: list[list]) -> None:
    """cfunc(*pointers) for each pointer list: the first here, the others on worker threads."""
    pool = _pool
    workers = pool.take(len(calls) - 1)
    mine = keep = None
    handed, part_error, interrupt = [], None, None
    try:
        mine = cpus()
        keep = mine - {w.cpu for w in workers} if mine else None
        if keep and keep != mine:
            _set_cpus(keep)  # off the workers' cores for the call
        for worker, pointers in zip(workers, calls[1:]):
            handed.append(worker)  # first: an interruption inside start still waits for it
            worker.start(cfunc, pointers)
        cfunc(*calls[0])
    finally:
        for worker in handed:  # every part must finish before its buffers may be reused
            while True:
                try:
                    part_error = worker.wait() or part_error
                    break
                except BaseException as e:  # interrupted while waiting: wait on, raise it after
                    interrupt = interrupt or e
        if keep and keep != mine:
            _set_cpus(mine)
        pool.give_back(workers)
        if interrupt is not None:
            raise interrupt  # chained to an exception of the caller's own part, if there is one
    if part_error is not None:
        raise part_error


# the C runtime's functions the host calls (kina_abi.h), with their ctypes signatures
_HOST_CALLS = {
    abi.TEAM_WORK: [ctypes.c_void_p, ctypes.c_int64],
    abi.TEAM_RUN: [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p],
    abi.TEAM_STOP: [ctypes.c_void_p],
    abi.RUN_SEQUENCE: [ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_void_p] * 5, ctypes.c_int64],
}


def host_call(lib, name: str):
    """The C runtime's function `name` (one of abi.HOST_CALLS) in the loaded .so `lib`, typed
    as kina_abi.h declares it; None if the .so has none (an older one, or one without a
    threaded entry)."""
    fn = getattr(lib, name, None)
    if fn is not None:
        fn.restype, fn.argtypes = None, _HOST_CALLS[name]
    return fn


class Team:
    """`workers` threads that stay in the C runtime of a threaded .so (kina_threads.c's
    kina_team_work, the GIL released) between calls, spinning for about a millisecond
    after each call and then asleep on a futex that the next call wakes (naps of 50 us,
    doubling up to 2 ms, without one), so that handing them a call within that millisecond
    costs a store, not waking a core (the `_Worker` hand-over: ~100 us). A worker that
    is not running when a call comes misses it: the caller never waits for one to wake,
    only for those that joined to finish (see kina_threads.c). Each is bound
    to a core; for a call the caller is bound off their cores, then given its own
    binding back. One call at a time (`run` returns False when another is running);
    `close()` stops and joins them, and must come before the .so is unloaded."""

    def __init__(self, lib, workers: int):
        self._lib, self.workers = lib, workers
        self._state = ctypes.create_string_buffer(abi.TEAM_BYTES)  # a kina_team, zeroed
        self._busy = threading.Lock()
        self._team_run, self._team_work, self._team_stop = (host_call(lib, name) for name in
                                                            (abi.TEAM_RUN, abi.TEAM_WORK, abi.TEAM_STOP))
        self._run_sequence = host_call(lib, abi.RUN_SEQUENCE)
        allowed = sorted(cpus() or [])
        here = _sched_getcpu() if _sched_getcpu is not None else None
        others = [c for c in allowed if c != here] or allowed
        self._cpus = [others[i % len(others)] if len(allowed) > 1 else None for i in range(workers)]
        self._threads = [threading.Thread(target=self._work, args=(tid + 1, cpu), name=f"kina-team-{cpu}",
                                          daemon=True) for tid, cpu in enumerate(self._cpus)]
        for t in self._threads:
            t.start()
        _teams.add(self)

    def _work(self, tid: int, cpu: int | None) -> None:
        if cpu is not None:
            _set_cpus({cpu})
        self._team_work(self._state, tid)

    def run(self, fn, args, nthreads: int, workspace: int) -> bool:
        """fn(args, tid, nthreads, workspace) on this thread (tid 0) and every worker (tid
        1, 2, ...; those >= nthreads return at once): `fn` a team entry (kina_<f>_team, from
        the team-entries pass), `args` its array of descriptor pointers; False, having run
        nothing, when another call holds the team."""
        return self._bound(lambda: self._team_run(self._state, fn, args, nthreads, workspace))

    def run_sequence(self, n: int, packed, team, args, workspaces, zero, nthreads: int) -> bool:
        """kina_run_sequence (kina_threads.c) on this team: `n` calls in order in one entry
        from the host, each through its team entry on `nthreads` threads; False, having
        run nothing, when another call holds the team."""
        return self._bound(lambda: self._run_sequence(self._state, n, packed, team, args, workspaces, zero, nthreads))

    def _bound(self, run) -> bool:
        """run() holding the team, with this thread bound off the workers' cores (and given
        its own binding back after); False, having run nothing, if another call holds it."""
        if not self._busy.acquire(blocking=False):
            return False
        mine = keep = None
        try:
            mine = cpus()
            keep = mine - set(self._cpus) if mine else None
            if keep and keep != mine:
                _set_cpus(keep)
            run()
        finally:
            if keep and keep != mine:
                _set_cpus(mine)
            self._busy.release()
        return True

    def close(self) -> None:
        if self._threads:
            with self._busy:
                self._team_stop(self._state)
                for t in self._threads:
                    t.join()
            self._threads = []
        _teams.discard(self)


_teams: set = set()


def _forget_teams() -> None:  # in a forked child the teams' threads do not exist
    for team in list(_teams):
        team._threads = []
    _teams.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_teams)
