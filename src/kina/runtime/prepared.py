"""Calls on fixed buffers, patched and run again and again: `PreparedCall`, and runs of
them in one entry from the host, `CallSequence`.

In:  a `Function` and the buffers of its arguments and results (`Function.prepare`).
Out: a `PreparedCall`, whose descriptors are built once and patched in place (a size, a
     data pointer) between calls; a `CallSequence` of prepared calls of one module, run
     in order from C (kina_threads.c's kina_run_sequence).

Guarantees: the buffers bound every descriptor: no patch can make the kernel read or
write outside them, and a call's descriptors are checked against the signature as a
call's arguments are, whenever a patch may have changed them. A mistake is a TypeError
or ValueError naming the argument, never a stray write.
"""
from __future__ import annotations

import ctypes
import numbers

import numpy as np

from .binding import MEMORY_BYTES
from .descriptors import Workspace, check_threads, descriptor_words
from .arrays import numpy_dtype, passable
from .pool import data_pointer


def _check_dim_value(where: str, dim: str, n, largest: int, bound: str) -> None:
    """A value set_dim takes: an integer from 0 to `largest` (`bound` says what sets it)."""
    if not isinstance(n, numbers.Integral) or isinstance(n, bool):
        raise TypeError(f"{where}: {dim} must be an integer, got {type(n).__name__}")
    if not 0 <= n <= largest:
        raise ValueError(f"{where}: {dim} = {n} is outside 0 .. {largest}, what {bound}")


class PreparedCall:
    """One call's memref descriptors, built once, for a caller that calls the same
    kernel on the same buffers again and again (kina.models.KVCache's in-place step,
    StoryLM's decode step): it patches what changes (a size, a data pointer) and
    calls, one ctypes call and no allocation.

    Arguments are named as the function's signature names them (the results are
    `out0`, `out1`, ...), sizes by the signature's dim names:

        call = fn.prepare([q, k, v, s], [out], dims=("N",))
        call.set_dim("N", n)        # every axis whose size is N (or N+1, ...) in any descriptor
        call.set_size("k", "N", n)  # just k's axis of size N
        call.set_data("out0", a)

    The arrays given are the buffers, and they bound every descriptor: no patch can
    make the kernel read or write outside them (the call keeps them alive).
      - Each buffer must be a NumPy array of its parameter's dtype and rank, passable
        (aligned, unit innermost stride: it is used in place, never copied), the outs
        writable; a dim named in `dims` may take any value from 0 to the largest at
        which every axis that carries it (S, S+1, ...) fits in its buffer (`dim_range`),
        and the descriptors start at that largest value; every other size must be what
        the signature says, as for a call's arguments (`bind`). So even a call never
        patched is one the signature allows.
      - `set_dim` refuses a value outside `dim_range`; `set_size` one past that axis of
        its buffer, and since it patches one axis alone (the others may follow) the
        descriptors are checked against the signature at the next call; `set_data` an
        array not of the buffer's dtype, shape and strides (writable, for an out).
    A mistake is a TypeError or ValueError naming the argument, never a stray write.

    The names are checked here, once: `dims` must be dim names of the signature, and
    a name or (argument, dim) pair that the signature lacks is a ValueError naming it.
    Where each one lives in the descriptors is worked out here too, so that a patch
    costs a table look-up, a comparison and a store."""

    def __init__(self, fn: Function, arrays: list[np.ndarray], outs: list[np.ndarray], dims=(), threads: int = 1):
        self._fn = fn
        self.threads = threads  # > 1: the threaded entry on that many threads, if the function has one
        self._workspace = Workspace()
        sig, starts = fn.signature, [offset // 8 for offset in fn._offsets]
        types = [*fn.storage_types, *sig.results]
        names = [*(n for n, _ in sig.params), *(f"out{i}" for i in range(len(sig.results)))]
        arrays, outs = [fn.storage_of(i, a) for i, a in enumerate(arrays)], list(outs)
        if len(arrays) != len(sig.params) or len(outs) != len(sig.results):
            raise TypeError(f"{sig.name}(): prepare takes {len(sig.params)} arrays and {len(sig.results)} outs "
                            f"({', '.join(names)}), got {len(arrays)} and {len(outs)}")
        for i, (name, t, a) in enumerate(zip(names, types, (*arrays, *outs))):
            where = f"{sig.name}(): prepare: {name}"
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{where} must be a numpy.ndarray, got {type(a).__name__}")
            if a.dtype != numpy_dtype(t.dtype):
                raise TypeError(f"{where} must have dtype {numpy_dtype(t.dtype)} ({t.dtype}), got {a.dtype}")
            if a.ndim != t.rank:
                raise ValueError(f"{where} must have rank {t.rank} {t.shape_str()}, got shape {list(a.shape)}")
            if not passable(a):
                raise ValueError(f"{where} must be aligned with unit innermost stride (a prepared call uses "
                                 f"its buffers in place)")
            if i >= len(arrays) and not a.flags.writeable:
                raise ValueError(f"{where} must be writable")
        self._buffers = [*arrays, *outs]  # kept alive: the descriptors point into them
        self._names, self._types, self._starts = names, types, starts
        self._index = {name: i for i, name in enumerate(names)}
        # what set_data takes for each: an array of the buffer's dtype, shape and strides
        self._layout = [(a.dtype, a.shape, a.strides, a.dtype.alignment, i >= len(arrays))
                        for i, a in enumerate(self._buffers)]
        self._start = dict(zip(names, starts))  # name -> its descriptor's first word
        # (name, dim) -> the size word of the axis that is exactly that dim, and the buffer's length there
        self._size_word = {(name, d.symbol): start + 3 + axis for name, t, start in zip(names, types, starts)
                           for axis, d in enumerate(t.dims) if d.symbol}
        self._size_cap = {(name, d.symbol): a.shape[axis] for name, t, a in zip(names, types, self._buffers)
                          for axis, d in enumerate(t.dims) if d.symbol}
        # every dim that may be patched -> (largest value, ((word, const, coeff), ...) of each axis
        # whose size is const + coeff * dim)
        known = {n for t in types for d in t.dims for n in d.names}
        self._dim_words: dict[str, tuple[int, tuple[tuple[int, int, int], ...]]] = {}
        for dim in dims:
            if dim not in known:
                raise ValueError(f"{sig.name}(): prepare: no parameter or result has a dim named {dim!r} "
                                 f"(its dims: {', '.join(sorted(known)) or 'none'})")
            found, largest, tightest = [], None, None
            for name, t, start, a in zip(names, types, starts, self._buffers):
                for axis, d in enumerate(t.dims):
                    if dim in d.names:
                        if len(d.terms) != 1:
                            raise ValueError(f"{sig.name}(): prepare: dim {d} mixes {dim} with other dims; "
                                             f"patch it with set_size")
                        const, coeff = d.const, d.terms[0][1]
                        found.append((start + 3 + axis, const, coeff))
                        fits = (a.shape[axis] - const) // coeff  # the largest value whose axis fits here
                        if largest is None or fits < largest:
                            largest, tightest = fits, (name, axis, d, a.shape[axis])
            if largest < 0:
                name, axis, d, length = tightest
                raise ValueError(f"{sig.name}(): prepare: {name} dim {axis} is {d}, at least {d.const}, but its "
                                 f"buffer holds {length}")
            self._dim_words[dim] = (largest, tuple(found))
        self._raw = descriptor_words(self._buffers)
        for largest, words in self._dim_words.values():
            for word, const, coeff in words:
                self._raw[word] = const + coeff * largest
        self.words = np.frombuffer(self._raw, np.int64)  # a read-only view: patches go through the setters
        self.words.flags.writeable = False
        self._pointers = fn._pointers(self._raw)
        self._args = (ctypes.c_void_p * len(self._pointers))(*self._pointers)  # as the team entry takes them
        self._check()
        # the workspace bytes of its threaded entry at the largest sizes it may take: the
        # descriptors start at them (every axis its buffer's length, or what the largest
        # value of its dim makes it), no patch can pass them, and a workspace's need only
        # grows with the sizes (temporaries' sizes are products and sums of them); 0 if none
        self._most_workspace = fn._workspace_bytes(*self._pointers) if fn._workspace_bytes else 0

    def _where(self, name: str) -> int:
        start = self._start.get(name)
        if start is None:
            raise ValueError(f"{self._fn.__name__}(): no parameter or result named {name!r} "
                             f"(it has: {', '.join(self._start)})")
        return start

    def _check(self) -> None:
        """The descriptors' sizes against the signature and the buffers, as `bind` checks a
        call's arguments: each size within its buffer, static dims as declared, every dim
        name one value, compound dims (S+1) and the results' sizes what that value makes
        them, and the intermediates within this machine's memory."""
        self._stale = True
        raw, fname, sig = self._raw, self._fn.__name__, self._fn.signature
        sizes = [raw[start + 3:start + 3 + t.rank] for t, start in zip(self._types, self._starts)]
        for name, size, a in zip(self._names, sizes, self._buffers):
            for axis, (n, length) in enumerate(zip(size, a.shape)):
                if not 0 <= n <= length:
                    raise ValueError(f"{fname}(): prepared call: {name} dim {axis} is {n}, but its buffer "
                                     f"holds {length}")
        env, where = {}, {}
        for name, t, size in zip(self._names[:len(sig.params)], self._types, sizes):
            for axis, (d, n) in enumerate(zip(t.dims, size)):
                if d.symbol:
                    if d.symbol in env and env[d.symbol] != n:
                        raise ValueError(f"{fname}(): prepared call: dim {d.symbol} is {env[d.symbol]} in "
                                         f"{where[d.symbol]} but {n} in {name} (dim {axis})")
                    env[d.symbol], where[d.symbol] = n, name
        for name, t, size in zip(self._names, self._types, sizes):
            for axis, (d, n) in enumerate(zip(t.dims, size)):
                want = d.evaluate(env)
                if n != want:
                    raise ValueError(f"{fname}(): prepared call: {name} dim {axis} must be {d} = {want}, got {n}")
        need = sum(t.nbytes(env) for t in sig.temporaries)
        if need > MEMORY_BYTES:
            raise ValueError(f"{fname}(): prepared call: at {', '.join(f'{k}={v}' for k, v in env.items())} its "
                             f"intermediate tensors need {need} bytes, more than this machine's {MEMORY_BYTES}")
        self._stale = False

    def dim_range(self, dim: str) -> range:
        """The values `set_dim(dim, n)` takes: 0 up to the largest that fits every buffer."""
        found = self._dim_words.get(dim)
        if found is None:
            raise ValueError(f"{self._fn.__name__}(): dim_range: dim {dim!r} was not named to prepare(dims=...)")
        return range(found[0] + 1)

    def set_dim(self, dim: str, n: int) -> None:
        """The dim `dim` is now `n` long, in every descriptor that carries it (as a whole
        axis or inside one like S+1); only dims named to `prepare` may be set, and only
        to a value in `dim_range(dim)`. (Per decode step and layer: about as cheap as
        four bare stores by position.)"""
        raw = self._raw
        try:
            largest, words = self._dim_words[dim]
        except KeyError:
            raise ValueError(f"{self._fn.__name__}(): set_dim: dim {dim!r} was not named to prepare(dims=...)") from None
        _check_dim_value(f"{self._fn.__name__}(): set_dim", dim, n, largest, "the buffers given to prepare hold")
        for word, const, coeff in words:
            raw[word] = const + coeff * n

    def set_dims(self, **sizes: int) -> None:
        """`set_dim` for each dim given."""
        for dim, n in sizes.items():
            self.set_dim(dim, n)

    def set_size(self, name: str, dim: str, n: int) -> None:
        """Argument `name`'s axis whose size is the dim `dim` is now `n` long (at most its
        buffer's length there); the descriptors are checked at the next call, when
        the other axes of that dim must agree."""
        word = self._size_word.get((name, dim))
        if word is None:
            self._where(name)
            raise ValueError(f"{self._fn.__name__}(): {name} has no axis of size {dim!r}")
        length = self._size_cap[name, dim]
        if not 0 <= n <= length:
            raise ValueError(f"{self._fn.__name__}(): set_size: {name}'s {dim} = {n} is outside 0 .. {length}, "
                             f"what its buffer holds")
        self._raw[word] = n
        self._stale = True

    def set_data(self, name: str, a: np.ndarray) -> None:
        """Argument `name` now points at `a`'s data: `a` must be of the buffer's dtype,
        shape and strides, aligned (writable, for an out); the call keeps it alive."""
        i = self._index.get(name)
        if i is None:
            self._where(name)
        dtype, shape, strides, alignment, is_out = self._layout[i]
        p = data_pointer(a) if isinstance(a, np.ndarray) else None
        if not (p is not None and a.dtype == dtype and a.shape == shape and a.strides == strides
                and p % alignment == 0 and (not is_out or a.flags.writeable)):
            got = f"{a.dtype} {list(a.shape)} strides {a.strides}" if isinstance(a, np.ndarray) else type(a).__name__
            if p is not None and a.shape == shape and a.dtype == dtype and a.strides == strides:
                got += ", read-only" if p % alignment == 0 else ", misaligned"
            raise ValueError(f"{self._fn.__name__}(): set_data: {name} must be a{' writable' if is_out else 'n'} "
                             f"aligned {dtype} array of shape {list(shape)} and strides {strides}, as prepared; "
                             f"got {got}")
        self._buffers[i] = a
        start = self._starts[i]
        self._raw[start] = self._raw[start + 1] = p

    def __call__(self) -> None:
        if self._fn._module.closed:
            raise ValueError(f"{self._fn.__name__}(): the module {self._fn._module.path.name} is closed")
        if self._stale:
            self._check()
        self._run(self.threads)

    def _run(self, threads: int) -> None:
        if threads > 1 and self._fn.threaded:
            self._fn._run_threaded(self._pointers, threads, self._workspace, self._args, self._most_workspace)
        else:
            self._fn._cfunc(*self._pointers)


class CallSequence:
    """Prepared calls run in order, in one entry from the host:

        steps = CallSequence([layer_0, layer_1, ..., head])   # PreparedCalls
        steps.threads = 2
        steps()                                                # as each call in turn

    Each call runs as calling it alone runs it (its descriptors checked if patched),
    with the same bits; but the calls themselves are made from C (kina_threads.c's
    kina_run_sequence), one after the other, so the host's interpreter does not run
    between them. That matters when the calls stream more than the caches hold: a
    SmolLM-shape decode layer reads 14 MB of weights, after which each line of Python
    between two layers missed the caches, and the host's part of a 2-thread layer call
    was about 80 us (of 1 ms) on the Zen 1 VM. The threaded calls share one workspace,
    as large as the largest needs at the largest sizes its patches allow (known when it
    was prepared: no work per run; call i's threads have all finished before call i + 1
    zeroes its task counters), so each layer's temporaries lie where
    the layer before left its own, in the cache, not in one of 30 blocks a token
    touches once each: a SmolLM-shape F16 decode step on two threads, 11.33 -> 11.07 ms
    (docs/performance.md, "One workspace for a token's calls"). `threads` applies to
    every call (each on that many threads if it has a threaded entry, as
    PreparedCall.threads; default 1). Where the module cannot (built without kinac's
    passes, or a function without kina_<f>_packed), or the team is busy with another
    call, the calls are made one by one from here instead, each in its own workspace.
    The calls keep their own state: patch them (set_dim, ...) between runs, or give a dim
    to all of them at once with the sequence's own `set_dim`."""

    def __init__(self, calls, threads: int = 1):
        calls = list(calls)
        if not calls:
            raise ValueError("CallSequence: calls must hold at least one PreparedCall, got none")
        for i, c in enumerate(calls):
            if not isinstance(c, PreparedCall):
                raise TypeError(f"CallSequence: calls[{i}] must be a PreparedCall (Function.prepare), "
                                f"got {type(c).__name__}")
        # Calls may be of several modules (builds of one kernel for layers whose weights differ in
        # dtype): they run on the first's team and sequence runner, which keep no state of their own
        # (kina_threads.c: the team and the workspace are passed in), each call's entry its own module's.
        module = calls[0]._fn._module
        self._modules = list({id(c._fn._module): c._fn._module for c in calls}.values())
        self.calls, self._module, self.threads = calls, module, check_threads("CallSequence", threads)
        self._dims: dict = {}  # (dim, calls) -> (the largest value they all take, their size words): set_dim
        n = len(calls)
        self._native = (all(c._fn._packed is not None for c in calls)
                        and module._run_sequence is not None)
        if self._native:  # the arrays kina_run_sequence reads, fixed for the calls' life
            team = [c._fn._team_entry.value if c._fn._team_entry is not None and c._fn._counter_bytes is not None
                    else None for c in calls]
            self._packed = (ctypes.c_void_p * n)(*[c._fn._packed for c in calls])
            self._team = (ctypes.c_void_p * n)(*team)
            self._args = (ctypes.c_void_p * n)(*[ctypes.addressof(c._args) for c in calls])
            self._workspace = Workspace()  # shared: the calls run one at a time
            self._most = max(c._most_workspace for c in calls)  # what the largest sizes need, known at prepare
            self._ws = (ctypes.c_void_p * n)(*[self._workspace.descriptor] * n)
            self._zero = (ctypes.c_int64 * n)(*[c._fn._counter_bytes or 0 for c in calls])

    def set_dim(self, dim: str, n: int, calls: tuple[int, ...] | None = None) -> None:
        """`set_dim(dim, n)` on every call prepared with `dim` (`prepare(dims=...)`), in one
        pass over their size words (a decode step's 30 layers: 120 stores, not 30 method
        calls); `n` must be in every such call's `dim_range`. `calls` (indices into the
        sequence) sets only those: a dim that is not one value across the sequence (a
        sliding-window layer's cache length beside a full layer's)."""
        found = self._dims.get((dim, calls))
        if found is None:
            chosen = self.calls if calls is None else [self.calls[i] for i in calls]
            chosen = [c for c in chosen if dim in c._dim_words]
            if not chosen:
                raise ValueError(f"CallSequence: set_dim: no call{'' if calls is None else ' of ' + str(calls)} "
                                 f"was prepared with dims=({dim!r},)")
            found = self._dims[dim, calls] = (min(c._dim_words[dim][0] for c in chosen),
                                              tuple((c._raw, word, const, coeff) for c in chosen
                                                    for word, const, coeff in c._dim_words[dim][1]))
        largest, words = found
        _check_dim_value("CallSequence: set_dim", dim, n, largest, "the buffers of every call prepared with it hold")
        for raw, word, const, coeff in words:
            raw[word] = const + coeff * n

    def __call__(self) -> None:
        module, threads = self._module, check_threads("CallSequence", self.threads)
        for m in self._modules:
            if m.closed:
                raise ValueError(f"CallSequence: the module {m.path.name} is closed")
        for c in self.calls:
            if c._stale:
                c._check()
        if self._native:
            if threads == 1:
                module._run_sequence(None, len(self.calls), self._packed, self._team, self._args, self._ws,
                                     self._zero, 1)
                return
            self._workspace.reserve(self._most)  # a no-op after the first run
            if module.team(threads - 1).run_sequence(len(self.calls), self._packed, self._team, self._args,
                                                     self._ws, self._zero, threads):
                return
        for c in self.calls:
            c._run(threads)
