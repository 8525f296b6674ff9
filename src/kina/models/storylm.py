"""StoryLM-0: a Llama-form decoder whose every layer step is one compiled Kina call.

In:  the model's sizes and either a seed (random weights) or a weights file
     (`.npz`, or `.safetensors` when the `safetensors` package is installed) or a
     mapping of arrays, named as `weight_layout` lists; then token ids.
Out: `StoryLM`, whose `generate` returns greedy token ids, decoding with a KV cache
     (prefill, then one compiled step per layer per token) or, with
     `use_cache=False`, recomputing the whole sequence at every token; and
     `NumPyStoryLM`, the same model with every layer written in NumPy (the
     benchmark's NumPy row, and a second reference).

The model (kernels/storylm.kina; examples/storylm0_decoder_step.kina is its F32 step):
per layer, h = x + Attn(RMSNorm(x)) and out = h + MLP(RMSNorm(h)), RMSNorm with a
gain and eps, NeoX rotary embedding on q and k, attention scaled by 1/sqrt(Dh),
a SwiGLU MLP; then a final RMSNorm and the output head. Weights are stored
[in, out] (a projection is x @ W), as in this table (D = d_model, F = ffn_dim,
V = vocab_size; i = 0 .. n_layers-1):

    embed [V, D]                the token embedding (a row lookup on the host)
    layers.i.attn_norm [D]      RMSNorm gain before attention
    layers.i.wq, .wk, .wv [D, D]  query, key, value projections (heads are Dh-wide
                                column blocks: head j is columns j*Dh .. j*Dh+Dh-1)
    layers.i.wo [D, D]          output projection
    layers.i.mlp_norm [D]       RMSNorm gain before the MLP
    layers.i.w_gate, .w_up [D, F], layers.i.w_down [F, D]   SwiGLU MLP
    norm [D]                    final RMSNorm gain
    head [D, V]                 output head

Guarantees:
  - Every layer step, and the final norm and head, run compiled Kina, built once per
    (dtype, sizes) with `kina.compile_file(..., dtypes=, dims=)`. The host does only
    the embedding lookup, the greedy argmax and bookkeeping; the rotary tables and
    the causal mask are constants it computes once per position.
  - The caches are functional, as in Section 19: each layer step takes Kᵀ [1, H, Dh, S]
    and V [1, H, S, Dh] and returns them one position longer, into the other of two
    buffers (`StoryCache`); prefilling P tokens then decoding gives what token-by-token
    decoding gives. A decode step is one prepared ctypes call per layer, plus the head.
  - A weights mapping or file must hold exactly the documented tensors, each of its
    shape and of the model's dtype; anything else is a ValueError (TypeError for a
    dtype) naming the tensor. Bad sizes and token ids are errors naming the parameter.
"""
from __future__ import annotations

import functools
import math
import numbers
import os
import zipfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .. import runtime
from .common import KERNELS, KINA_DTYPES, Decoder, causal_mask, count, kina_dtype

_LAYER_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")  # kernel order


def weight_layout(n_layers: int) -> dict[str, tuple[str, ...]]:
    """Every tensor a StoryLM weights file holds, by name, with its shape in size names."""
    D, F, V = "d_model", "ffn_dim", "vocab_size"
    layer = dict(attn_norm=(D,), wq=(D, D), wk=(D, D), wv=(D, D), wo=(D, D), mlp_norm=(D,),
                 w_gate=(D, F), w_up=(D, F), w_down=(F, D))
    layout = {"embed": (V, D)}
    for i in range(n_layers):
        layout.update({f"layers.{i}.{name}": dims for name, dims in layer.items()})
    return {**layout, "norm": (D,), "head": (D, V)}


def weight_shapes(vocab_size: int, d_model: int, n_layers: int, ffn_dim: int) -> dict[str, tuple[int, ...]]:
    """`weight_layout` at these sizes: every tensor's name and shape."""
    sizes = dict(vocab_size=vocab_size, d_model=d_model, ffn_dim=ffn_dim)
    return {name: tuple(sizes[d] for d in dims) for name, dims in weight_layout(n_layers).items()}


def random_weights(shapes: Mapping[str, tuple[int, ...]], seed: int, dtype) -> dict[str, np.ndarray]:
    """Seeded weights: N(0, 1) embeddings, gains near 1, N(0, 1/fan_in) matrices."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if name == "embed":
            a = rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(shape[0])
        out[name] = a.astype(dtype)
    return out


def read_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a `.npz` or `.safetensors` file, by name (not yet checked)."""
    path = Path(path)
    if path.suffix not in (".npz", ".safetensors"):
        raise ValueError(f"weights: expected a .npz or .safetensors file, got {str(path)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"weights: no such file: {str(path)!r}")
    if path.suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise ValueError(f"weights: reading {path.name} needs the safetensors package (pip install "
                             f"safetensors), or save the tensors with numpy.savez as a .npz") from None
        return load_file(str(path))
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise ValueError("it holds one array, not named tensors")
        with npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"weights: {str(path)!r} is not a readable .npz file ({e})") from None


def check_weights(weights: Mapping[str, np.ndarray], layout: Mapping[str, tuple[str, ...]],
                  sizes: Mapping[str, int], dtype: np.dtype) -> dict[str, np.ndarray]:
    """64-byte-aligned copies of `weights`, once each is exactly as `layout` (at `sizes`)
    and `dtype` say; a missing, unexpected or wrong tensor is an error naming it."""
    def expected(name):
        dims = layout[name]
        return f"[{', '.join(str(sizes[d]) for d in dims)}] ([{', '.join(dims)}])"

    missing = [name for name in layout if name not in weights]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"weights: tensor {missing[0]!r} is missing{more}; expected shape {expected(missing[0])}")
    extra = [name for name in weights if name not in layout]
    if extra:
        raise ValueError(f"weights: unexpected tensor {extra[0]!r}: not a StoryLM weight of these sizes "
                         f"(kina.storylm.weight_layout lists them)")
    out = {}
    for name, dims in layout.items():
        a = weights[name]
        if not isinstance(a, np.ndarray):
            raise TypeError(f"weights: tensor {name!r} must be a numpy.ndarray, got {type(a).__name__}")
        if a.dtype != dtype:
            raise TypeError(f"weights: tensor {name!r} has dtype {a.dtype}, expected {dtype}, the model's "
                            f"(nothing is converted on load)")
        if a.shape != tuple(sizes[d] for d in dims):
            raise ValueError(f"weights: tensor {name!r} has shape {list(a.shape)}, expected {expected(name)}")
        out[name] = runtime.empty(a.shape, dtype)
        out[name][...] = a
    return out


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, got {value}")
    return float(value)


class StoryCache:
    """The KV caches of one sequence, for every layer: Kᵀ [1, H, Dh, n] and V [1, H, n, Dh]
    after n positions, `model.max_seq_len` at most.

    The layer programs are functional (they return the caches one position longer),
    so each layer has two buffers of each: a step reads one and writes the other, then
    they swap. The buffers are zero pages until written (only the used part costs
    memory), and a step's kernel call is prepared once per layer and buffer
    (`runtime.PreparedCall`): per token only sizes change in its descriptors.
    """

    def __init__(self, model: "StoryLM"):
        self.model = model
        H, Dh, T, dt = model.n_heads, model.head_dim, model.max_seq_len, model.dtype
        self._k = [[runtime.zeros((1, H, Dh, T), dt) for _ in range(2)] for _ in range(model.n_layers)]
        self._v = [[runtime.zeros((1, H, T, Dh), dt) for _ in range(2)] for _ in range(model.n_layers)]
        self._n, self._cur = 0, 0  # positions filled; which buffer of each pair holds them
        self._calls = None  # the prepared step calls, made by the model on the first step

    @property
    def n_filled(self) -> int:
        return self._n

    def keys(self, layer: int) -> np.ndarray:
        """A read-only view of layer `layer`'s filled Kᵀ, [1, H, Dh, n_filled]."""
        view = self._k[layer][self._cur][..., :self._n]
        view.flags.writeable = False
        return view

    def values(self, layer: int) -> np.ndarray:
        """A read-only view of layer `layer`'s filled V, [1, H, n_filled, Dh]."""
        view = self._v[layer][self._cur][:, :, :self._n]
        view.flags.writeable = False
        return view

    def _views(self, layer: int, n_new: int):
        """(k_past, v_past, k_next, v_next) for `n_new` more positions: the filled part of
        one buffer and the part of the other that the layer program writes."""
        n, cur = self._n, self._cur
        k, v = self._k[layer], self._v[layer]
        return k[cur][..., :n], v[cur][:, :, :n], k[1 - cur][..., :n + n_new], v[1 - cur][:, :, :n + n_new]

    def _advance(self, n_new: int) -> None:
        self._n, self._cur = self._n + n_new, 1 - self._cur

    def __repr__(self) -> str:
        return f"StoryCache({self.model.n_layers} layers, max_seq_len={self.model.max_seq_len}) with {self._n} filled"


class StoryLM(Decoder):
    """StoryLM-0 with seeded (or loaded) weights; every layer is compiled Kina.

        model = StoryLM(vocab_size=256, d_model=64, n_heads=4, n_layers=2, ffn_dim=176, max_seq_len=512)
        model.generate([1, 2, 3], n_new=20)                   # prefill, then one step per token
        model.generate([1, 2, 3], n_new=20, use_cache=False)  # the whole sequence at every token
        StoryLM(..., weights="storylm.npz")                   # real weights, named as weight_layout says

    `max_seq_len` bounds the positions (the rotary tables' length); nothing else
    depends on it. `model.weights` holds the tensors by name (np.savez(path,
    **model.weights) writes a file that loads back).
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, ffn_dim: int,
                 max_seq_len: int, seed: int = 0, dtype=np.float32,
                 weights: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
                 eps: float = 1e-6, rope_theta: float = 10000.0):
        counts = dict(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers, ffn_dim=ffn_dim,
                      max_seq_len=max_seq_len)
        for name, value in counts.items():
            setattr(self, name, count(name, value, 1))
        self.seed = count("seed", seed, 0)
        self.dtype = kina_dtype(dtype)
        self.eps = _positive("eps", eps)
        self.rope_theta = _positive("rope_theta", rope_theta)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model: {d_model} is not a multiple of n_heads = {n_heads}")
        self.head_dim = self.d_model // self.n_heads
        if self.head_dim % 2:
            raise ValueError(f"n_heads: the head width d_model / n_heads = {self.head_dim} must be even "
                             f"(rotary embedding splits each head in two halves)")
        sizes = dict(vocab_size=self.vocab_size, d_model=self.d_model, ffn_dim=self.ffn_dim)
        layout = weight_layout(self.n_layers)
        if weights is None:
            weights = random_weights(weight_shapes(**sizes, n_layers=self.n_layers), self.seed, self.dtype)
        elif isinstance(weights, (str, os.PathLike)):
            weights = read_weights(weights)
        elif not isinstance(weights, Mapping):
            raise TypeError(f"weights: expected a path to a .npz/.safetensors file or a mapping of arrays, "
                            f"got {type(weights).__name__}")
        self.weights = check_weights(weights, layout, sizes, self.dtype)
        self._prepare()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, d_model={self.d_model}, n_heads={self.n_heads}, "
                f"n_layers={self.n_layers}, ffn_dim={self.ffn_dim}, max_seq_len={self.max_seq_len}, dtype={self.dtype})")

    # -- what the layer programs take ----------------------------------------------
    def _prepare(self) -> None:
        """Arguments built once: per-layer weight lists (gains as [1, 1, D]), eps, scale,
        the rotary tables [max_seq_len, 1, 1, R], and the compiled programs."""
        D, R, w = self.d_model, self.head_dim // 2, self.weights
        gain = lambda a: a.reshape(1, 1, D)
        self._layers = [[gain(w[p + n]) if n.endswith("norm") else w[p + n] for n in _LAYER_WEIGHTS]
                        for p in (f"layers.{i}." for i in range(self.n_layers))]
        self._norm, self._head, self._embed = gain(w["norm"]), w["head"], w["embed"]
        self._eps = np.full((1, 1, 1), self.eps, self.dtype)
        self._scale = np.full((1, 1, 1, 1), 1 / math.sqrt(self.head_dim), self.dtype)
        inv_freq = self.rope_theta ** (-2 * np.arange(R, dtype=np.float64) / self.head_dim)
        angle = np.arange(self.max_seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]
        self._cos = np.cos(angle).astype(self.dtype).reshape(self.max_seq_len, 1, 1, R)
        self._sin = np.sin(angle).astype(self.dtype).reshape(self.max_seq_len, 1, 1, R)
        self._kernels = self._compile()

    def _compile(self):
        return _program(KINA_DTYPES[self.dtype], self.d_model, self.n_heads, self.ffn_dim, self.vocab_size)

    def _layer(self, i: int, x, cos, sin, k_past, v_past, mask, outs) -> None:
        """Layer i on x [1, P, D] at rotary rows cos, sin [1, P, 1, 1, R], after the caches
        k_past [1, H, Dh, S] and v_past [1, H, S, Dh], under mask [1, 1, P, S+P] (None
        when P = 1: no position to hide); writes outs = [k_next, v_next, out]."""
        # every argument is built by this class, of the shapes the program was compiled for
        if mask is None:
            self._kernels.decoder_step.call_unchecked(
                [x, *self._layers[i], cos, sin, k_past, v_past, self._eps, self._scale], outs)
        else:
            self._kernels.decoder_prefill.call_unchecked(
                [x, *self._layers[i], cos, sin, k_past, v_past, mask, self._eps, self._scale], outs)

    def _logits(self, x) -> np.ndarray:
        """The logits [V] after the last position of x [1, P, D]."""
        out = runtime.empty((1, 1, self.vocab_size), self.dtype)
        self._kernels.logits.call_unchecked([x[:, -1:], self._norm, self._head, self._eps], [out])
        return out[0, 0]

    # -- the forward pass ----------------------------------------------------------
    def new_cache(self) -> StoryCache:
        """Empty caches for a new sequence."""
        return StoryCache(self)

    def _forward(self, tokens: list[int], cache: StoryCache | None) -> np.ndarray:
        """Run `tokens` after the cache's positions (or from position 0 with no cache),
        extending the cache; the logits after the last token."""
        if cache is not None and len(tokens) == 1:
            return self._decode(tokens[0], cache)
        return self._run(tokens, cache)

    def _run(self, tokens: list[int], cache: StoryCache | None) -> np.ndarray:
        """`_forward` through `_layer`, one call per layer on new arrays and cache views."""
        start, P, H, Dh, dt = cache.n_filled if cache else 0, len(tokens), self.n_heads, self.head_dim, self.dtype
        x = self._embed[tokens][None]
        cos, sin = self._cos[None, start:start + P], self._sin[None, start:start + P]
        mask = causal_mask(start, P, dt) if P > 1 else None
        for i in range(self.n_layers):
            if cache is None:
                past = [runtime.empty((1, H, Dh, 0), dt), runtime.empty((1, H, 0, Dh), dt)]
                nexts = [runtime.empty((1, H, Dh, P), dt), runtime.empty((1, H, P, Dh), dt)]
            else:
                *past, k_next, v_next = cache._views(i, P)
                nexts = [k_next, v_next]
            out = runtime.empty((1, P, self.d_model), dt)
            self._layer(i, x, cos, sin, *past, mask, [*nexts, out])
            x = out
        if cache is not None:
            cache._advance(P)
        return self._logits(x)

    def _decode(self, token: int, cache: StoryCache) -> np.ndarray:
        """One token through every layer's decoder_step on the cache's prepared calls:
        the embedding row and the rotary rows are copied into fixed buffers, and each
        call's descriptors change only in the four cache sizes."""
        if cache._calls is None:
            cache._calls = self._prepare_calls(cache)
        steps, x, cos, sin, logits = cache._calls
        S = cache.n_filled
        x[0, 0] = self._embed[token]
        cos[0], sin[0] = self._cos[S], self._sin[S]
        for call in steps[cache._cur]:
            call.set_dims(S=S)  # k_past, v_past [.., S, ..] and k_next, v_next [.., S+1, ..]
            call()
        cache._advance(1)
        logits()
        return logits.out[0, 0].copy()

    def _prepare_calls(self, cache: StoryCache):
        """decoder_step per layer and per direction (buffer 0 -> 1 and 1 -> 0), chained by
        fixed activations x_0 .. x_L, and the head on x_L."""
        D, R, dt, L = self.d_model, self.head_dim // 2, self.dtype, self.n_layers
        xs = [runtime.empty((1, 1, D), dt) for _ in range(L + 1)]
        cos, sin = runtime.empty((1, 1, 1, 1, R), dt), runtime.empty((1, 1, 1, 1, R), dt)
        step = self._kernels.decoder_step
        steps = [[step.prepare([xs[i], *self._layers[i], cos, sin, cache._k[i][cur], cache._v[i][cur],
                                self._eps, self._scale], [cache._k[i][1 - cur], cache._v[i][1 - cur], xs[i + 1]],
                                dims=("S",))
                  for i in range(L)] for cur in (0, 1)]
        out = runtime.empty((1, 1, self.vocab_size), dt)
        logits = self._kernels.logits.prepare([xs[L], self._norm, self._head, self._eps], [out])
        logits.out = out
        return steps, xs[0], cos, sin, logits

    def _check_cache(self, cache, n_new: int) -> None:
        if not isinstance(cache, StoryCache) or cache.model is not self:
            raise TypeError("cache: expected this model's StoryCache, from new_cache()")
        if cache.n_filled + n_new > self.max_seq_len:
            raise ValueError(f"cache: {cache.n_filled} positions + {n_new} new exceed max_seq_len = "
                             f"{self.max_seq_len}")

    def prefill(self, tokens: Sequence[int], cache: StoryCache) -> np.ndarray:
        """Run `tokens` at once after the cache's positions (one decoder_prefill call per
        layer; decoder_step for one token), extend the cache; the logits after the last token."""
        tokens = self._some_tokens(tokens)
        self._check_cache(cache, len(tokens))
        return self._forward(tokens, cache)

    def step(self, token: int, cache: StoryCache) -> np.ndarray:
        """One decode step: `token` at position n_filled, one decoder_step call per layer; its logits."""
        (token,) = self._tokens("token", [token])
        self._check_cache(cache, 1)
        return self._forward([token], cache)

    def recompute(self, tokens: Sequence[int]) -> np.ndarray:
        """The logits after `tokens`, all of them run afresh (one decoder_prefill call per layer, no cache)."""
        tokens = self._some_tokens(tokens)
        if len(tokens) > self.max_seq_len:
            raise ValueError(f"tokens: {len(tokens)} tokens exceed max_seq_len = {self.max_seq_len}")
        return self._forward(tokens, None)

    def _some_tokens(self, tokens) -> list[int]:
        tokens = self._tokens("tokens", tokens)
        if not tokens:
            raise ValueError("tokens: expected at least one token")
        return tokens


class NumPyStoryLM(StoryLM):
    """The same model, every layer and the head written in NumPy (one op per formula)."""

    def _compile(self):
        if self.dtype == runtime.numpy_dtype("BF16"):  # ml_dtypes' bfloat16 matmul returns float32
            raise TypeError("dtype: NumPyStoryLM's layers are NumPy matmuls, which have no bfloat16 result: "
                            "use float16, float32 or float64 (StoryLM itself takes bfloat16)")
        return None

    def _rms_norm(self, x, gain):
        return x * (1 / np.sqrt(np.mean(x * x, axis=2, keepdims=True) + self._eps)) * gain

    def _layer(self, i, x, cos, sin, k_past, v_past, mask, outs):
        g1, wq, wk, wv, wo, g2, w_gate, w_up, w_down = self._layers[i]
        P, H, Dh, R = x.shape[1], self.n_heads, self.head_dim, self.head_dim // 2
        k_next, v_next, out = outs

        def rope(t):  # [1, P, D] -> [1, P, H, Dh], NeoX half rotation on [.., 2, R]
            t = t.reshape(1, P, H, 2, R)
            half = np.concatenate([-t[:, :, :, 1:], t[:, :, :, :1]], axis=3)
            return (t * cos + half * sin).reshape(1, P, H, Dh)

        a = self._rms_norm(x, g1)
        q, k, v = rope(a @ wq), rope(a @ wk), (a @ wv).reshape(1, P, H, Dh)
        np.concatenate([k_past, k.transpose(0, 2, 3, 1)], axis=3, out=k_next)
        np.concatenate([v_past, v.transpose(0, 2, 1, 3)], axis=2, out=v_next)
        scores = q.transpose(0, 2, 1, 3) @ k_next * self._scale
        if mask is not None:
            scores = scores + mask
        e = np.exp(scores - scores.max(axis=3, keepdims=True))
        context = (e / e.sum(axis=3, keepdims=True)) @ v_next
        h = x + context.transpose(0, 2, 1, 3).reshape(1, P, self.d_model) @ wo
        m = self._rms_norm(h, g2)
        gate = m @ w_gate
        out[...] = h + (gate / (1 + np.exp(-gate)) * (m @ w_up)) @ w_down

    def _decode(self, token, cache):
        return self._run([token], cache)

    def _logits(self, x):
        return (self._rms_norm(x[:, -1:], self._norm) @ self._head)[0, 0]


@functools.lru_cache(maxsize=None)
def _program(dtype: str, d_model: int, n_heads: int, ffn_dim: int, vocab_size: int):
    """kernels/storylm.kina compiled for one dtype and size (B = 1; S and P stay symbolic)."""
    import kina
    head_dim = d_model // n_heads
    dims = dict(B=1, D=d_model, H=n_heads, Dh=head_dim, R=head_dim // 2, F=ffn_dim, V=vocab_size)
    return kina.compile_file(KERNELS / "storylm.kina", dtypes={"T": dtype}, dims=dims)
