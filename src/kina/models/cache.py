"""The KV caches of one sequence of a `Decoder`, every layer's.

In:  the decoder (its config's layers, key/value heads, head width and sliding window, its
     dtype and `max_seq_len`).
Out: `DecoderCache`: per layer Kᵀ [1, Hk, Dh, n] and V [1, Hk, n, Dh] of the positions it
     holds, and the views a layer call reads and writes (`views`).

The layer programs are functional (they return the caches one call longer, a concat), and
each layer has one buffer of each: a call is given the positions it may attend as the past
and the same buffer, that many positions longer, as the result. The concat's prefix is then
the past itself, which the compiled call leaves where it is (a fused matmul whose slot is
rhs's own memory skips the copy: matmul-loops), so a step writes only its new position and
reads the cache once. The buffers are zero pages until written (only the used part costs
memory), and a step's kernel calls are prepared once per cache (`runtime.PreparedCall`).

A layer of kind "sliding" (DecoderConfig.layer_kinds) whose window W is shorter than
max_seq_len attends only to the W positions up to its query, so its buffer holds at most
W - 1 + `chunk` positions (`chunk` = W: the most a call may add): the last W - 1 positions,
then the call's new ones. When a call would run past the buffer's end, the last W - 1
positions move to its start (`reserve`; every W tokens in decode: about one position's copy
a token). Its views start at the first position a new query may see, so a decode step reads
exactly the window, and a prefill's mask (`generation.causal_mask`'s `window`) hides what
lies further back. A token costs `bytes_per_token` in the layers that keep every position,
and nothing more in the sliding ones once their window is full (`nbytes`).
"""
from __future__ import annotations

import numpy as np

from .. import runtime


class DecoderCache:
    """Kᵀ and V of every layer; `n_filled` positions run. Full layers hold all of them (up to
    the decoder's `max_seq_len`); sliding-window layers hold the last ones (see the module doc)."""

    def __init__(self, model):
        self.model = model
        c, T, dt = model.config, model.max_seq_len, model.dtype
        Hk, Dh = c.n_kv_heads, c.head_dim
        self.windows = [model.layer_window(i) for i in range(c.n_layers)]  # None: the layer keeps every position
        self.window = next((w for w in self.windows if w is not None), None)
        self.chunk = self.window  # the most positions one call may add (None: any, up to max_seq_len)
        held = T if self.window is None else min(T, self.window - 1 + self.chunk)
        self.capacity = [T if w is None else held for w in self.windows]
        self._k = [runtime.zeros((1, Hk, Dh, n), dt) for n in self.capacity]
        self._v = [runtime.zeros((1, Hk, n, Dh), dt) for n in self.capacity]
        self._n = 0  # positions filled
        self._first = 0  # the position in slot 0 of the sliding-window layers' buffers
        self._calls = None  # the prepared step calls, made by the model on the first step

    @property
    def n_filled(self) -> int:
        return self._n

    def first(self, layer: int) -> int:
        """The first position the next call's new positions may attend to in `layer` (0 for a
        full layer): where its `views` begin."""
        if self.windows[layer] is None:
            return 0
        return max(self._first, self._n - (self.windows[layer] - 1))

    def keys(self, layer: int) -> np.ndarray:
        """A read-only view of layer `layer`'s Kᵀ [1, Hk, Dh, n] of the positions it holds
        (from `held_from(layer)`: 0, or for a sliding layer a later one)."""
        view = self._k[layer][..., :self._n - self.held_from(layer)]
        view.flags.writeable = False
        return view

    def values(self, layer: int) -> np.ndarray:
        """A read-only view of layer `layer`'s V [1, Hk, n, Dh], as `keys`."""
        view = self._v[layer][:, :, :self._n - self.held_from(layer)]
        view.flags.writeable = False
        return view

    def held_from(self, layer: int) -> int:
        """The first position layer `layer`'s buffers hold."""
        return 0 if self.windows[layer] is None else self._first

    def reserve(self, n_new: int) -> None:
        """Make room for `n_new` more positions in the sliding layers' buffers: if they would run
        past the end, their last W - 1 positions move to the start. At most `chunk` at once."""
        if self.window is None:
            return
        if n_new > self.chunk:
            raise ValueError(f"n_new: a sliding-window cache takes at most {self.chunk} positions a call, got {n_new}")
        held = self._n - self._first
        cap = self.capacity[self.windows.index(self.window)]
        if held + n_new <= cap:
            return
        keep = min(held, self.window - 1)
        for i, w in enumerate(self.windows):
            if w is not None:
                k, v = self._k[i], self._v[i]
                k[..., :keep] = k[..., held - keep:held].copy()
                v[:, :, :keep] = v[:, :, held - keep:held].copy()
        self._first = self._n - keep

    def views(self, layer: int, n_new: int):
        """(k_past, v_past, k_next, v_next) for `n_new` more positions: the positions from
        `first(layer)` on, and the same buffers `n_new` positions longer (where the layer
        program writes the new positions; the prefix it leaves as it is). Call `reserve(n_new)`
        first."""
        k, v = self._k[layer], self._v[layer]
        lo = self.first(layer) - self.held_from(layer)
        n = self._n - self.held_from(layer)
        if n + n_new > k.shape[3]:
            raise ValueError(f"cache: layer {layer} holds {k.shape[3]} positions, {n} filled: no room for {n_new} "
                             "more (reserve first)")
        return k[..., lo:n], v[:, :, lo:n], k[..., lo:n + n_new], v[:, :, lo:n + n_new]

    def advance(self, n_new: int) -> None:
        self._n += n_new

    def restorable(self, n: int) -> int:
        """The most positions, at most `n`, that `truncate` can go back to: `n` itself while
        every sliding layer still holds the positions position `n` would attend to, else 0."""
        if not 0 <= n <= self._n:
            raise ValueError(f"n: expected 0 <= n <= n_filled = {self._n}, got {n}")
        if self.window is None or self._first == 0 or n - (self.window - 1) >= self._first:
            return n
        return 0

    def truncate(self, n: int) -> None:
        """Forget every position from `n` on (what is left is the first `n` positions' keys and
        values, as if only they had been run): a chat that edits its last turn, or a server
        that reuses a prompt's common prefix. A sliding layer must still hold what position
        `n` attends to (`restorable(n) == n`)."""
        if not 0 <= n <= self._n:
            raise ValueError(f"n: expected 0 <= n <= n_filled = {self._n}, got {n}")
        if self.restorable(n) != n:
            raise ValueError(f"n: the sliding-window layers no longer hold the positions before {self._first}: "
                             f"truncate to 0, or to at least {self._first + self.window - 1}")
        self._n = n
        if n == 0:
            self._first = 0

    @property
    def nbytes(self) -> int:
        """The bytes its held positions take (the buffers' untouched pages cost nothing)."""
        per_layer = 2 * self.model.config.n_kv_heads * self.model.config.head_dim * self.model.dtype.itemsize
        return sum(min(self._n, cap) * per_layer for cap in self.capacity)

    def __repr__(self) -> str:
        window = f", window {self.window}" if self.window else ""
        return (f"DecoderCache({self.model.config.n_layers} layers, max_seq_len={self.model.max_seq_len}{window}) "
                f"with {self._n} filled")
