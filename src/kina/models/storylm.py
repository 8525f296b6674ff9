"""StoryLM: the Llama-family decoder (Llama, Mistral, Qwen2; StoryLM-0 is one
configuration of it), whose every layer step is one compiled Kina call.

In:  the model's sizes and options and either a seed (random weights) or a weights
     file (`.npz`, or `.safetensors` when the `safetensors` package is installed) or a
     mapping of arrays, named as `weight_layout` lists; then token ids.
     (`kina.models.hf.load_pretrained` builds one from a Hugging Face model folder.)
Out: `StoryLM`, whose `generate` returns greedy token ids, decoding with a KV cache
     (prefill, then one compiled step per layer per token) or, with
     `use_cache=False`, recomputing the whole sequence at every token; and
     `NumPyStoryLM`, the same model with every layer written in NumPy (the
     benchmark's NumPy row, and a second reference).

The model (kernels/storylm.kina; examples/storylm0_decoder_step.kina is its F32 step):
per layer, h = x + Attn(RMSNorm(x)) and out = h + MLP(RMSNorm(h)), RMSNorm with a
gain and eps, NeoX rotary embedding on q and k (inverse frequencies from
`rope_theta`, scaled as `rope_scaling` says: none, "linear" or "llama3"), attention
scaled by 1/sqrt(head_dim) with n_kv_heads key/value heads each shared by
n_heads / n_kv_heads query heads (grouped-query attention), a SwiGLU MLP; then a
final RMSNorm and the output head. Projections are stored [in, out] (a projection is
x @ W), the head too ([D, V]). A tied head (`tie_embeddings`) is the embedding
table, [V, D]: the model holds it once, transposed to [D, V] when it is built, so
the head is the same `x @ W` (read row after row, at the read floor, where
`table @ xᵀ` is compute-bound on transposing squares: docs/performance.md, "A tied
head read [D, V]"; the same bits), and the embedding rows are read through that
copy's transpose. The tensors (D = d_model,
F = ffn_dim, V = vocab_size, Q = n_heads * head_dim, KV = n_kv_heads * head_dim;
i = 0 .. n_layers-1):

    embed [V, D]                the token embedding (a row lookup on the host)
    layers.i.attn_norm [D]      RMSNorm gain before attention
    layers.i.wq [D, Q], .wk, .wv [D, KV]  query, key, value projections (heads are
                                head_dim-wide column blocks: head j is columns
                                j*head_dim .. j*head_dim+head_dim-1; query head j
                                reads key/value head j // (n_heads / n_kv_heads))
    layers.i.bq [Q], .bk, .bv [KV]  their biases, only with qkv_bias (Qwen2)
    layers.i.wo [Q, D]          output projection; layers.i.bo [D] only with o_bias
    layers.i.mlp_norm [D]       RMSNorm gain before the MLP
    layers.i.w_gate, .w_up [D, F], layers.i.w_down [F, D]   SwiGLU MLP
    norm [D]                    final RMSNorm gain
    head [D, V]                 output head, absent with tie_embeddings

Guarantees:
  - Every layer step, and the final norm and head, run compiled Kina, built once per
    (dtype, sizes) with `kina.compile_file(..., dtypes=, dims=)`. The host does only
    the embedding lookup, the greedy argmax and bookkeeping; the rotary tables and
    the causal mask are constants it computes once per position.
  - The caches are functional, as in Section 19: each layer step takes Kᵀ
    [1, n_kv_heads, head_dim, S] and V [1, n_kv_heads, S, head_dim] and returns them
    one position longer, into the other of two buffers (`StoryCache`); only the
    n_kv_heads heads are stored (`bytes_per_token`). Prefilling P tokens then decoding
    gives what token-by-token decoding gives. A decode step is one prepared ctypes
    call per layer, plus the head, each on `threads` threads (default
    `runtime.default_threads()`, read per token) through its threaded entry (the
    threads pass), with the same bits on any number of threads.
  - By default each matmul sums in k order as fmul then fadd, the bits of -O0 and of
    any thread count; `fma=True` rounds each multiply-add once instead (prefill is
    compute-bound: about 1.35x faster there; still the same bits on any thread count).
    `pass_options` gives the build's passes options on top (`kinac --pass-options` text,
    "threads{parts=4}"), for measuring a variant (scripts/ab_passes.py); the bits are
    then the variant's.
  - A weights mapping or file must hold exactly the documented tensors, each of its
    shape and of the model's dtype; anything else is a ValueError (TypeError for a
    dtype) naming the tensor. Bad sizes and token ids are errors naming the parameter.
"""
from __future__ import annotations

import functools
import math
import numbers
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .. import files, runtime
from ..runtime import arena
from ..runtime.pool import data_pointer
from .common import KERNELS, KINA_DTYPES, Decoder, causal_mask, count, kina_dtype

# the kernel's order; a bias absent from the weights is passed as zeros
_LAYER_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "mlp_norm", "w_gate", "w_up", "w_down")
ROPE_TYPES = ("default", "linear", "llama3")


def weight_layout(n_layers: int, qkv_bias: bool = False, o_bias: bool = False,
                  tie_embeddings: bool = False) -> dict[str, tuple[str, ...]]:
    """Every tensor a StoryLM weights file holds, by name, with its shape in size names."""
    D, F, V, Q, KV = "d_model", "ffn_dim", "vocab_size", "q_dim", "kv_dim"
    layer = dict(attn_norm=(D,), wq=(D, Q), wk=(D, KV), wv=(D, KV), wo=(Q, D), mlp_norm=(D,),
                 w_gate=(D, F), w_up=(D, F), w_down=(F, D))
    if qkv_bias:
        layer.update(bq=(Q,), bk=(KV,), bv=(KV,))
    if o_bias:
        layer.update(bo=(D,))
    layout = {"embed": (V, D)}
    for i in range(n_layers):
        layout.update({f"layers.{i}.{name}": dims for name, dims in layer.items()})
    layout["norm"] = (D,)
    if not tie_embeddings:
        layout["head"] = (D, V)
    return layout


def weight_shapes(vocab_size: int, d_model: int, n_layers: int, ffn_dim: int, q_dim: int | None = None,
                  kv_dim: int | None = None, **options) -> dict[str, tuple[int, ...]]:
    """`weight_layout` at these sizes (q_dim and kv_dim default to d_model): every tensor's name and shape."""
    sizes = dict(vocab_size=vocab_size, d_model=d_model, ffn_dim=ffn_dim, q_dim=q_dim or d_model,
                 kv_dim=kv_dim or q_dim or d_model)
    return {name: tuple(sizes[d] for d in dims) for name, dims in weight_layout(n_layers, **options).items()}


def random_weights(shapes: Mapping[str, tuple[int, ...]], seed: int, dtype, weight_dtype=None) -> dict[str, np.ndarray]:
    """Seeded weights: N(0, 1) embeddings, gains near 1, small biases, N(0, 1/fan_in) matrices;
    the matrices (the embedding table too) in `weight_dtype` (default `dtype`), the same
    values as another dtype's model of the same seed, rounded once."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if name == "embed":
            a = rng.standard_normal(shape)
        elif name.split(".")[-1] in ("bq", "bk", "bv", "bo"):
            a = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(shape[0])
        out[name] = a.astype(tensor_dtype(shape, dtype, weight_dtype))
    return out


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping | None = None) -> np.ndarray:
    """The rotary inverse frequencies [head_dim / 2] (float64): theta^(-2i/head_dim), then
    scaled as transformers' rope types "linear" (divided by `factor`) and "llama3"
    (long wavelengths divided by `factor`, short ones kept, a smooth blend between)."""
    inv_freq = theta ** (-2 * np.arange(head_dim // 2, dtype=np.float64) / head_dim)
    kind = (scaling or {}).get("rope_type", "default")
    needs = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                               "original_max_position_embeddings")}.get(kind, ())
    for key in needs:
        if key not in scaling:
            raise ValueError(f"rope_scaling: rope_type {kind!r} needs {key!r}")
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return np.where(medium, smoothed, scaled)
    if kind != "default":
        raise ValueError(f"rope_scaling: unknown rope_type {kind!r}: expected one of {', '.join(ROPE_TYPES)}")
    return inv_freq


def read_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a `.npz` or `.safetensors` file, by name (not yet checked); a damaged
    file is a `kina.files.FileError` naming it."""
    path = Path(path)
    if path.suffix not in (".npz", ".safetensors"):
        raise ValueError(f"weights: expected a .npz or .safetensors file, got {str(path)!r}")
    if path.suffix == ".safetensors":
        return files.read_safetensors(path, "weights")
    return files.read_npz(path, "weights")


def check_weights(weights: Mapping[str, np.ndarray], layout: Mapping[str, tuple[str, ...]],
                  sizes: Mapping[str, int], dtype: np.dtype, copy: bool = True,
                  allow_nonfinite: bool = False, weight_dtype: np.dtype | None = None) -> dict[str, np.ndarray]:
    """64-byte-aligned copies of `weights` (views of one block of huge pages:
    kina.runtime.arena), once each is exactly as `layout` (at `sizes`) and `dtype` say
    (`tensor_dtype`: the matrices `weight_dtype`, when given); a missing, unexpected or
    wrong tensor is an error naming it, and so is one holding NaN or infinity unless
    `allow_nonfinite`. With `copy=False` (for
    arrays the caller made and gives up) an array that is already C-contiguous and
    aligned is kept as it is."""
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
                         f"(kina.models.storylm.weight_layout lists them)")
    for name, dims in layout.items():
        a = weights[name]
        if not isinstance(a, np.ndarray):
            raise TypeError(f"weights: tensor {name!r} must be a numpy.ndarray, got {type(a).__name__}")
        want = tensor_dtype(dims, dtype, weight_dtype)
        whose = "weight_dtype" if weight_dtype is not None and len(dims) == 2 else "dtype"
        if a.dtype != want:
            raise TypeError(f"weights: tensor {name!r} has dtype {a.dtype}, expected {want}, the model's {whose} "
                            f"(nothing is converted on load)")
        if a.shape != tuple(sizes[d] for d in dims):
            raise ValueError(f"weights: tensor {name!r} has shape {list(a.shape)}, expected {expected(name)}")
        if not allow_nonfinite and not np.isfinite(a).all():
            bad = ~np.isfinite(a)
            raise ValueError(f"weights: tensor {name!r} holds NaN or infinity ({int(bad.sum())} of {a.size} values, "
                             f"the first at index {[int(i) for i in np.argwhere(bad)[0]]}); pass "
                             "allow_nonfinite=True to load it anyway")
    kept = {name: weights[name] for name in layout if not copy and weights[name].flags.c_contiguous
            and data_pointer(weights[name]) % runtime.ALIGN == 0}
    copies = arena.arrays({name: (weights[name].shape, weights[name].dtype) for name in layout if name not in kept})
    for name, a in copies.items():
        a[...] = weights[name]
    return {name: kept[name] if name in kept else copies[name] for name in layout}


def tensor_dtype(dims: Sequence, dtype: np.dtype, weight_dtype: np.dtype | None) -> np.dtype:
    """The dtype a weight tensor of these dims is held in: the matrices (2 dims: the
    projections, the head and the embedding table) `weight_dtype` when given, the gains and
    biases `dtype`."""
    return weight_dtype if weight_dtype is not None and len(dims) == 2 else dtype


def weight_dtype_of(dtype: np.dtype, weight_dtype) -> np.dtype:
    """The weight matrices' dtype for a model of `dtype`: `weight_dtype`, checked (the
    model's dtype, or float16 or bfloat16 against float32 activations), or `dtype`."""
    if weight_dtype is None:
        return dtype
    wdt = kina_dtype(weight_dtype, "weight_dtype")
    if wdt != dtype and (dtype != np.float32 or wdt == np.float64):
        raise ValueError(f"weight_dtype: expected the model's dtype ({dtype}), or float16 or bfloat16 with "
                         f"dtype float32 (F32 activations against narrow weights), got {wdt} with dtype {dtype}")
    return wdt


def check_pass_options(text) -> str:
    """`text` if the build's passes take it as options (kina.driver.pipeline.Options checks
    it at this opt level), else a TypeError or ValueError naming pass_options. The empty
    default imports nothing (NumPyStoryLM builds no program)."""
    if isinstance(text, str) and not text:
        return text
    from kina.driver.pipeline import Options
    return Options(pass_options=text).pass_options


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, got {value}")
    return float(value)


class StoryCache:
    """The KV caches of one sequence, for every layer: Kᵀ [1, Hk, Dh, n] and V [1, Hk, n, Dh]
    (Hk = n_kv_heads, Dh = head_dim) after n positions, `model.max_seq_len` at most.

    The layer programs are functional (they return the caches one position longer, a
    concat), and each layer has one buffer of each: a step is given its filled part as
    the past and the same buffer, one position longer, as the result. The concat's
    prefix is then the past itself, which the compiled step leaves where it is (a
    fused matmul whose slot is rhs's own memory skips the copy: matmul-loops), so a
    step writes only its new position and reads the cache once. The buffers are zero
    pages until written (only the used part costs memory), and a step's kernel call is
    prepared once per layer (`runtime.PreparedCall`): per token only sizes change in
    its descriptors.
    """

    def __init__(self, model: "StoryLM"):
        self.model = model
        Hk, Dh, T, dt = model.n_kv_heads, model.head_dim, model.max_seq_len, model.dtype
        self._k = [runtime.zeros((1, Hk, Dh, T), dt) for _ in range(model.n_layers)]
        self._v = [runtime.zeros((1, Hk, T, Dh), dt) for _ in range(model.n_layers)]
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

    def _views(self, layer: int, n_new: int):
        """(k_past, v_past, k_next, v_next) for `n_new` more positions: the filled part of
        the layer's buffers, and the same buffers `n_new` positions longer (where the
        layer program writes the new positions; the prefix it leaves as it is)."""
        n, k, v = self._n, self._k[layer], self._v[layer]
        return k[..., :n], v[:, :, :n], k[..., :n + n_new], v[:, :, :n + n_new]

    def _advance(self, n_new: int) -> None:
        self._n += n_new

    def __repr__(self) -> str:
        return f"StoryCache({self.model.n_layers} layers, max_seq_len={self.model.max_seq_len}) with {self._n} filled"


class StoryLM(Decoder):
    """A Llama-family decoder with seeded (or loaded) weights; every layer is compiled Kina.

        model = StoryLM(vocab_size=256, d_model=64, n_heads=4, n_layers=2, ffn_dim=176, max_seq_len=512)
        model.generate([1, 2, 3], n_new=20)                   # prefill, then one step per token
        model.generate([1, 2, 3], n_new=20, use_cache=False)  # the whole sequence at every token
        StoryLM(..., weights="storylm.npz")                   # real weights, named as weight_layout says
        StoryLM(..., n_kv_heads=2, head_dim=32, qkv_bias=True, tie_embeddings=True,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, ...})  # Llama 3, Qwen2, ...

    StoryLM-0 is the default configuration: n_kv_heads = n_heads, head_dim =
    d_model / n_heads, no biases, an untied head, unscaled rotary. `max_seq_len` bounds
    the positions (the rotary tables' length); nothing else depends on it.
    `model.weights` holds the tensors by name (np.savez(path, **model.weights) writes a
    file that loads back); with tie_embeddings, its "embed" is a view, the transpose of
    the [D, V] copy the head reads (np.ascontiguousarray makes it contiguous).
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, ffn_dim: int,
                 max_seq_len: int, seed: int = 0, dtype=np.float32,
                 weights: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
                 eps: float = 1e-6, rope_theta: float = 10000.0, *, n_kv_heads: int | None = None,
                 head_dim: int | None = None, qkv_bias: bool = False, o_bias: bool = False,
                 tie_embeddings: bool = False, rope_scaling: Mapping | None = None, allow_nonfinite: bool = False,
                 threads: int | None = None, fma: bool = False, weight_dtype=None, pass_options: str = "",
                 _own_weights: bool = False):
        # the threads of each layer step and of the head (None: runtime.default_threads() at each token)
        self.threads = None if threads is None else count("threads", threads, 1)
        if not isinstance(fma, bool):
            raise TypeError(f"fma: expected True or False, got {type(fma).__name__}")
        self.fma = fma
        self.pass_options = check_pass_options(pass_options)
        counts = dict(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers, ffn_dim=ffn_dim,
                      max_seq_len=max_seq_len)
        for name, value in counts.items():
            setattr(self, name, count(name, value, 1))
        self.seed = count("seed", seed, 0)
        self.dtype = kina_dtype(dtype)
        self.weight_dtype = weight_dtype_of(self.dtype, weight_dtype)
        self.eps = _positive("eps", eps)
        self.rope_theta = _positive("rope_theta", rope_theta)
        self.n_kv_heads = self.n_heads if n_kv_heads is None else count("n_kv_heads", n_kv_heads, 1)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: n_heads = {n_heads} is not a multiple of n_kv_heads = {n_kv_heads}")
        if head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model: {d_model} is not a multiple of n_heads = {n_heads}")
            head_dim = self.d_model // self.n_heads
        self.head_dim = count("head_dim", head_dim, 1)
        if self.head_dim % 2:
            raise ValueError(f"n_heads: the head width head_dim = {self.head_dim} must be even "
                             f"(rotary embedding splits each head in two halves)")
        self.qkv_bias, self.o_bias, self.tie_embeddings = bool(qkv_bias), bool(o_bias), bool(tie_embeddings)
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        self._inv_freq = rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling)
        sizes = dict(vocab_size=self.vocab_size, d_model=self.d_model, ffn_dim=self.ffn_dim,
                     q_dim=self.n_heads * self.head_dim, kv_dim=self.n_kv_heads * self.head_dim)
        options = dict(qkv_bias=self.qkv_bias, o_bias=self.o_bias, tie_embeddings=self.tie_embeddings)
        layout = weight_layout(self.n_layers, **options)
        if weights is None:
            weights = random_weights(weight_shapes(**sizes, n_layers=self.n_layers, **options), self.seed, self.dtype,
                                     self.weight_dtype)
        elif isinstance(weights, (str, os.PathLike)):
            weights = read_weights(weights)
        elif not isinstance(weights, Mapping):
            raise TypeError(f"weights: expected a path to a .npz/.safetensors file or a mapping of arrays, "
                            f"got {type(weights).__name__}")
        self.weights = check_weights(weights, layout, sizes, self.dtype, copy=not _own_weights,
                                     allow_nonfinite=allow_nonfinite, weight_dtype=self.weight_dtype)
        self._prepare()

    def __repr__(self) -> str:
        extra = "".join(f", {k}={getattr(self, k)}" for k in ("n_kv_heads", "head_dim")
                        if getattr(self, k) != (self.n_heads if k == "n_kv_heads" else self.d_model // self.n_heads))
        return (f"{type(self).__name__}(vocab_size={self.vocab_size}, d_model={self.d_model}, n_heads={self.n_heads}, "
                f"n_layers={self.n_layers}, ffn_dim={self.ffn_dim}, max_seq_len={self.max_seq_len}{extra}, "
                f"dtype={self.dtype}{'' if self.weight_dtype == self.dtype else f', weight_dtype={self.weight_dtype}'})")

    @property
    def bytes_per_token(self) -> int:
        """The KV cache's bytes per position, all layers: K and V of n_kv_heads heads each
        (a StoryCache holds two buffers of each, for its functional steps)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype.itemsize

    # -- what the layer programs take ----------------------------------------------
    def _prepare(self) -> None:
        """Arguments built once: per-layer weight lists (gains as [1, 1, D], biases in
        heads, zeros for absent ones), eps, scale, the rotary tables
        [max_seq_len, 1, 1, R], and the compiled programs."""
        D, R, w, dt = self.d_model, self.head_dim // 2, self.weights, self.dtype
        Hk, G, Dh = self.n_kv_heads, self.n_heads // self.n_kv_heads, self.head_dim
        shapes = dict(bq=(1, 1, Hk, G, Dh), bk=(1, 1, Hk, Dh), bv=(1, 1, Hk, Dh), bo=(1, 1, D),
                      attn_norm=(1, 1, D), mlp_norm=(1, 1, D))
        zeros = {n: runtime.zeros(shapes[n], dt) for n in ("bq", "bk", "bv", "bo")}

        def arg(prefix, name):
            a = w.get(prefix + name)
            if a is None:
                return zeros[name]
            return a.reshape(shapes[name]) if name in shapes else a
        self._layers = [[arg(f"layers.{i}.", n) for n in _LAYER_WEIGHTS] for i in range(self.n_layers)]
        if self.tie_embeddings:  # the table, held once, as [D, V]: the head reads it as x @ W, row after row.
            # It is rewritten in the table's own memory (the model's copy, C-contiguous and aligned:
            # check_weights), whose block would otherwise keep a dead [V, D] slot for the model's life.
            table = w["embed"]
            self._head = table.reshape(-1).reshape(D, self.vocab_size)
            self._head[...] = table.T.copy()
            w["embed"] = self._head.T
        else:
            self._head = w["head"]
        self._norm, self._embed = w["norm"].reshape(1, 1, D), w["embed"]
        self._eps = np.full((1, 1, 1), self.eps, runtime.numpy_dtype(norm_dtype(KINA_DTYPES[self.dtype])))
        self._scale = np.full((1, 1, 1, 1), 1 / math.sqrt(self.head_dim), dt)
        angle = np.arange(self.max_seq_len, dtype=np.float64)[:, None] * self._inv_freq[None, :]
        self._cos = np.cos(angle).astype(dt).reshape(self.max_seq_len, 1, 1, R)
        self._sin = np.sin(angle).astype(dt).reshape(self.max_seq_len, 1, 1, R)
        self._kernels = self._compile()
        if self._kernels is not None:
            self._head_kernel = self._kernels.logits

    def _compile(self):
        largest = max(self.d_model * max(self.ffn_dim, self.n_heads * self.head_dim), self.vocab_size * self.d_model)
        return _program(KINA_DTYPES[self.dtype], self.d_model, self.n_kv_heads, self.n_heads // self.n_kv_heads,
                        self.head_dim, self.ffn_dim, self.vocab_size, self.fma,
                        largest * self.weight_dtype.itemsize >= THREADED_MIN_WEIGHT_BYTES, KINA_DTYPES[self.weight_dtype],
                        self.pass_options)

    def _layer(self, i: int, x, cos, sin, k_past, v_past, mask, outs) -> None:
        """Layer i on x [1, P, D] at rotary rows cos, sin [1, P, 1, 1, R], after the caches
        k_past [1, Hk, Dh, S] and v_past [1, Hk, S, Dh], under mask [1, 1, P, S+P] (None
        when P = 1: no position to hide); writes outs = [k_next, v_next, out]."""
        # every argument is built by this class, of the shapes the program was compiled for
        if mask is None:
            self._kernels.decoder_step.call_unchecked(
                [x, *self._layers[i], cos, sin, k_past, v_past, self._eps, self._scale], outs, self._threads())
        else:
            self._kernels.decoder_prefill.call_unchecked(
                [x, *self._layers[i], cos, sin, k_past, v_past, mask, self._eps, self._scale], outs, self._threads())

    def _logits(self, x) -> np.ndarray:
        """The logits [V] after the last position of x [1, P, D]."""
        out = runtime.empty((1, 1, self.vocab_size), self.dtype)
        self._head_kernel.call_unchecked([x[:, -1:], self._norm, self._head, self._eps], [out], self._threads())
        return out[0, 0]

    def _threads(self) -> int:
        return self.threads or runtime.default_threads()

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
        start, P, H, Dh, dt = cache.n_filled if cache else 0, len(tokens), self.n_kv_heads, self.head_dim, self.dtype
        x = self._embed[tokens][None].astype(dt, copy=False)
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
        call's descriptors change only in the four cache sizes; the layers and the head
        run as one CallSequence (no Python between them)."""
        if cache._calls is None:
            cache._calls = self._prepare_calls(cache)
        run, x, cos, sin, logits = cache._calls
        S = cache.n_filled
        x[0, 0] = self._embed[token]
        cos[0], sin[0] = self._cos[S], self._sin[S]
        run.set_dim("S", S)  # every layer's k_past, v_past [.., S, ..] and k_next, v_next [.., S+1, ..]
        run.threads = self._threads()  # each call all threads: the step's ops split between them
        run()  # the layers, then the head, in one entry from here
        cache._advance(1)
        return logits.out[0, 0].copy()

    def _prepare_calls(self, cache: StoryCache):
        """decoder_step per layer, from its cache buffers (the past) into the same buffers
        (the next), chained by fixed activations x_0 .. x_L, and the head on x_L. Each is
        prepared on whole buffers, which bound S to max_seq_len - 1 (k_next holds S+1
        positions); `_decode` sets S before every call. The L layers' calls and the
        head's as one CallSequence."""
        D, R, dt, L = self.d_model, self.head_dim // 2, self.dtype, self.n_layers
        xs = [runtime.empty((1, 1, D), dt) for _ in range(L + 1)]
        cos, sin = runtime.empty((1, 1, 1, 1, R), dt), runtime.empty((1, 1, 1, 1, R), dt)
        step = self._kernels.decoder_step
        steps = [step.prepare([xs[i], *self._layers[i], cos, sin, cache._k[i], cache._v[i], self._eps, self._scale],
                              [cache._k[i], cache._v[i], xs[i + 1]], dims=("S",))
                 for i in range(L)]
        out = runtime.empty((1, 1, self.vocab_size), dt)
        logits = self._head_kernel.prepare([xs[L], self._norm, self._head, self._eps], [out])
        logits.out = out
        return runtime.CallSequence([*steps, logits]), xs[0], cos, sin, logits

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
        """Normalised in the norm dtype and rounded once to the model's dtype, then scaled, as the kernel does."""
        x32 = x.astype(self._eps.dtype)
        return (x32 * (1 / np.sqrt(np.mean(x32 * x32, axis=2, keepdims=True) + self._eps))).astype(x.dtype) * gain

    def _layer(self, i, x, cos, sin, k_past, v_past, mask, outs):
        g1, wq, wk, wv, wo, bq, bk, bv, bo, g2, w_gate, w_up, w_down = self._layers[i]
        P, H, Hk, Dh, R = x.shape[1], self.n_heads, self.n_kv_heads, self.head_dim, self.head_dim // 2
        k_next, v_next, out = outs

        def rope(t, heads):  # [1, P, heads * Dh] -> [1, P, heads, Dh], NeoX half rotation on [.., 2, R]
            t = t.reshape(1, P, heads, 2, R)
            half = np.concatenate([-t[:, :, :, 1:], t[:, :, :, :1]], axis=3)
            return (t * cos + half * sin).reshape(1, P, heads, Dh)

        a = self._rms_norm(x, g1)
        q = rope(a @ wq + bq.reshape(1, 1, -1), H)
        k = rope(a @ wk + bk.reshape(1, 1, -1), Hk)
        v = (a @ wv + bv.reshape(1, 1, -1)).reshape(1, P, Hk, Dh)
        np.concatenate([k_past, k.transpose(0, 2, 3, 1)], axis=3, out=k_next)
        np.concatenate([v_past, v.transpose(0, 2, 1, 3)], axis=2, out=v_next)
        group = np.arange(H) // (H // Hk)  # query head j reads key/value head j // G
        scores = q.transpose(0, 2, 1, 3) @ k_next[:, group] * self._scale
        if mask is not None:
            scores = scores + mask
        e = np.exp(scores - scores.max(axis=3, keepdims=True))
        context = (e / e.sum(axis=3, keepdims=True)) @ v_next[:, group]
        h = x + context.transpose(0, 2, 1, 3).reshape(1, P, H * Dh) @ wo + bo
        m = self._rms_norm(h, g2)
        gate = m @ w_gate
        out[...] = h + (gate / (1 + np.exp(-gate)) * (m @ w_up)) @ w_down

    def _decode(self, token, cache):
        return self._run([token], cache)

    def _logits(self, x):
        return (self._rms_norm(x[:, -1:], self._norm) @ self._head)[0, 0]


def norm_dtype(dtype: str) -> str:
    """The dtype kernels/storylm.kina's RMSNorm computes in (its W) for T = `dtype`: F32, as
    Hugging Face's does, or F64 for F64."""
    return "F64" if dtype == "F64" else "F32"


# A model whose largest weight is smaller than this gets no threaded entries: no op of
# its layer moves enough to be worth splitting (the threads pass's min-bytes is 64 KiB
# per part), and the entries would double its build time.
THREADED_MIN_WEIGHT_BYTES = 128 << 10


@functools.lru_cache(maxsize=None)
def _program(dtype: str, d_model: int, n_kv_heads: int, group: int, head_dim: int, ffn_dim: int, vocab_size: int,
             fma: bool = False, threaded: bool = True, weights: str | None = None, pass_options: str = ""):
    """kernels/storylm.kina compiled for one dtype and size (B = 1; S and P stay symbolic);
    with `fma`, its matmuls round each multiply-add once (matmul-loops{fma=true}: faster
    where they are compute-bound, prefill; other bits than the default's); without
    `threaded`, no op of a symbolic size is split either (threads{symbolic=false}), so
    that, every static one being small, no function gets a threaded entry; `weights`:
    the weight matrices' dtype U (default `dtype`; F16 or BF16 against F32 activations);
    `pass_options`: more pass options, on top of those (a pass named in both takes both)."""
    import kina
    from kina.driver.pipeline import Options
    dims = dict(B=1, D=d_model, Hk=n_kv_heads, G=group, Dh=head_dim, R=head_dim // 2, Q=n_kv_heads * group * head_dim,
                KV=n_kv_heads * head_dim, F=ffn_dim, V=vocab_size)
    options = Options()
    given = [*(["matmul-loops{fma=true}"] if fma else []), *([] if threaded else ["threads{symbolic=false}"])]
    if options.opt_level == 0:  # neither pass runs
        given = []
    if given or pass_options:
        options = Options(pass_options=",".join([*given, *filter(None, [pass_options])]))
    return kina.compile_file(KERNELS / "storylm.kina", options, dims=dims,
                             dtypes={"T": dtype, "W": norm_dtype(dtype), "U": weights or dtype})
