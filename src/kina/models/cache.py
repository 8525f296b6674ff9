"""The KV caches of one sequence of a `Decoder`, every layer's.

In:  the decoder (its layers, key/value heads, head width, dtype and `max_seq_len`).
Out: `DecoderCache`: per layer Kᵀ [1, Hk, Dh, n] and V [1, Hk, n, Dh] after n positions.

The layer programs are functional (they return the caches one position longer, a
concat), and each layer has one buffer of each: a step is given its filled part as the
past and the same buffer, one position longer, as the result. The concat's prefix is
then the past itself, which the compiled step leaves where it is (a fused matmul whose
slot is rhs's own memory skips the copy: matmul-loops), so a step writes only its new
position and reads the cache once. The buffers are zero pages until written (only the
used part costs memory), and a step's kernel calls are prepared once per cache
(`runtime.PreparedCall`): per token only sizes change in their descriptors.
"""
from __future__ import annotations

import numpy as np

from .. import runtime


class DecoderCache:
    """Kᵀ and V of every layer for up to the decoder's `max_seq_len` positions; `n_filled` of them used."""

    def __init__(self, model):
        self.model = model
        c, T, dt = model.config, model.max_seq_len, model.dtype
        Hk, Dh = c.n_kv_heads, c.head_dim
        self._k = [runtime.zeros((1, Hk, Dh, T), dt) for _ in range(c.n_layers)]
        self._v = [runtime.zeros((1, Hk, T, Dh), dt) for _ in range(c.n_layers)]
        self._n = 0  # positions filled
        self._calls = None  # the prepared step calls, made by the model on the first step

    @property
    def n_filled(self) -> int:
        return self._n

    def keys(self, layer: int) -> np.ndarray:
        """A read-only view of layer `layer`'s filled Kᵀ, [1, Hk, Dh, n_filled]."""
        view = self._k[layer][..., :self._n]
        view.flags.writeable = False
        return view

    def values(self, layer: int) -> np.ndarray:
        """A read-only view of layer `layer`'s filled V, [1, Hk, n_filled, Dh]."""
        view = self._v[layer][:, :, :self._n]
        view.flags.writeable = False
        return view

    def views(self, layer: int, n_new: int):
        """(k_past, v_past, k_next, v_next) for `n_new` more positions: the filled part of the
        layer's buffers, and the same buffers `n_new` positions longer (where the layer
        program writes the new positions; the prefix it leaves as it is)."""
        n, k, v = self._n, self._k[layer], self._v[layer]
        return k[..., :n], v[:, :, :n], k[..., :n + n_new], v[:, :, :n + n_new]

    def advance(self, n_new: int) -> None:
        self._n += n_new

    def truncate(self, n: int) -> None:
        """Forget every position from `n` on (what is left is the first `n` positions' keys and
        values, as if only they had been run): a chat that edits its last turn, or a server
        that reuses a prompt's common prefix."""
        if not 0 <= n <= self._n:
            raise ValueError(f"n: expected 0 <= n <= n_filled = {self._n}, got {n}")
        self._n = n

    @property
    def nbytes(self) -> int:
        """The bytes its filled positions hold (the buffers' untouched pages cost nothing)."""
        return self._n * self.model.bytes_per_token

    def __repr__(self) -> str:
        return (f"DecoderCache({self.model.config.n_layers} layers, max_seq_len={self.model.max_seq_len}) "
                f"with {self._n} filled")
