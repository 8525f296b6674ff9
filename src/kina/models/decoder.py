"""The generic decoder: any family's kernel, its parameters bound by name.

In:  a `DecoderConfig`, its weights by the decoder's names (`Family.layout`: `layers.{i}.wq`,
     `embed`, `norm`, `head`), and how to build and run it: the activation `dtype` T, the
     matrices' `weight_dtype`, `fma`, `pass_options`, `threads`, `max_seq_len`.
Out: `Decoder`: `prefill`, `step` and `recompute` (each the logits after its last token),
     `new_cache`, and the generation loop (`generate`, `stream`, `trace`: `Generator`).

The family's kernel (`Family.kernel`) has three functions: `decoder_step` (one new position
of one layer), `decoder_prefill` (P new positions of one layer, under a causal mask) and
`logits` (the final norm and the head at the last position). The decoder compiles it once
per dtypes and sizes (`Family.dims`; S and P stay symbolic) and calls them, binding **every
parameter by its name** in the compiled function's signature, from:

    the layer's weights       by their layout names (attn_norm, wq, ..., as the family lists them)
    the family's constants    `Family.constants` (eps, scale, ...)
    the call's inputs         x [1, P, D], cos and sin [P, R] (the rotary rows of the new
                              positions), k_past, v_past (the cache), mask [P, S+P] (prefill)
    model-level weights       norm, head (the logits)

each reshaped (as a view) to the shape the parameter declares. A kernel that needs another
tensor just declares it: a weight named in its family's layout, or a constant. A kernel's
type parameters take their dtypes from what is bound to them: T is the activations', W the
norm's (F32, or F64 for F64 activations), and a weight's type parameter (`wq: tensor<U, ...>`)
the dtype of that weight.

Guarantees:
  - Every layer step, and the final norm and head, run compiled Kina. The host does only the
    embedding lookup (times the config's `embed_scale`), the choice of the next token and
    bookkeeping; the rotary tables and the causal mask are constants it computes once per position.
  - A layer of kind "sliding" (`DecoderConfig.layer_kinds`) attends only to the last
    `sliding_window` positions up to each query, with its own rotary base (`rope_local`): its
    cache holds at most the window (kina.models.cache), a prefill's mask hides what lies further
    back, and a cached prompt runs in chunks of at most the window.
  - Prefilling P tokens then decoding gives what token-by-token decoding gives. A decode step is
    one prepared call per layer plus the head, run as one `runtime.CallSequence`, each on
    `threads` threads (default `runtime.default_threads()`, read per token), with the same bits
    on any number of threads.
  - By default (`fma=True`, the fastest build within the families' bound against transformers)
    each matmul rounds each multiply-add once, and a block-quantized one sums x * q over each
    group before scaling it (quantized-matmul-loops{block-sums=true}): prefill, compute-bound, is
    about 1.35x faster than with `fma=False`, which sums in k order as fmul then fadd, the
    compiler's exact bits (those of -O0). Either way the bits are the same on any thread count.
  - Weights are checked once (kina.models.weights); a kernel parameter with nothing to bind is
    an error naming the kernel file, the function and the parameter.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .. import runtime
from . import families, kernels, weights as weights_mod
from .cache import DecoderCache
from .config import DecoderConfig
from .generation import KINA_DTYPES, Generator, causal_mask, count, kina_dtype
from ..runtime.quant import QuantizedArray, dequantize_blocks

DEFAULT_MAX_SEQ_LEN = 4096  # the rotary tables' length when max_seq_len is not given (capped by the config's)
# A model whose largest weight is smaller than this gets no threaded entries: no op of its layer
# moves enough to be worth splitting (the threads pass's min-bytes is 64 KiB per part), and the
# entries would double its build time.
THREADED_MIN_WEIGHT_BYTES = 128 << 10


def norm_dtype(dtype: str) -> str:
    """The dtype a kernel's norms compute in (its W) for activations T = `dtype`: F32, as Hugging
    Face computes RMSNorm, or F64 for F64."""
    return "F64" if dtype == "F64" else "F32"


def weight_dtype_of(dtype: np.dtype, weight_dtype) -> np.dtype:
    """The weight matrices' dtype for a model of `dtype`: `weight_dtype`, checked (the model's
    dtype, or float16 or bfloat16 against float32 activations), or `dtype`."""
    if weight_dtype is None:
        return dtype
    wdt = kina_dtype(weight_dtype, "weight_dtype")
    if wdt != dtype and (dtype != np.float32 or wdt == np.float64):
        raise ValueError(f"weight_dtype: expected the model's dtype ({dtype}), or float16 or bfloat16 with "
                         f"dtype float32 (F32 activations against narrow weights), got {wdt} with dtype {dtype}")
    return wdt


def check_pass_options(text) -> str:
    """`text` if the build's passes take it as options, else a TypeError or ValueError naming
    pass_options. The empty default imports nothing."""
    if isinstance(text, str) and not text:
        return text
    from kina.driver.options import Options
    return Options(pass_options=text).pass_options


class Decoder(Generator):
    """A decoder-only transformer whose every layer step is one call of its family's compiled kernel.

        config = DecoderConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, ffn_dim=176)
        model = Decoder(config, weights)                  # weights by layout name (kina.models.weights)
        model.generate([1, 2, 3], n_new=20)               # prefill, then one step per token
        model.generate([1, 2, 3], n_new=20, use_cache=False)

    `model.config` is the architecture; the config's fields read as attributes too
    (`model.n_heads`). `model.weights` holds the checked tensors by name; with a tied
    head, "embed" is a view, the transpose of the [D, V] copy the head reads.
    """

    def __init__(self, config: DecoderConfig, weights: Mapping[str, np.ndarray], *, max_seq_len: int | None = None,
                 dtype=np.float32, weight_dtype=None, fma: bool = True, threads: int | None = None,
                 pass_options: str = "", allow_nonfinite: bool = False, copy: bool = True):
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config: expected a kina.models.DecoderConfig, got {type(config).__name__}")
        self.config = config
        self.family = families.get(config.family)
        self.max_seq_len = count("max_seq_len", max_seq_len, 1) if max_seq_len is not None else \
            min(config.context_length, DEFAULT_MAX_SEQ_LEN)
        self.threads = None if threads is None else count("threads", threads, 1)
        if not isinstance(fma, bool):
            raise TypeError(f"fma: expected True or False, got {type(fma).__name__}")
        self.fma = fma
        self.pass_options = check_pass_options(pass_options)
        self.dtype = kina_dtype(dtype)
        # None: each matrix as given (the dtype, a narrower float against F32, or a block format)
        self.weight_dtype = None if weight_dtype is None else weight_dtype_of(self.dtype, weight_dtype)
        if not isinstance(weights, Mapping):
            raise TypeError(f"weights: expected a mapping of arrays by name, got {type(weights).__name__}")
        self.layout = self.family.layout(config)
        self.weights = weights_mod.check(weights, self.layout, self.dtype, self.weight_dtype, copy=copy,
                                         allow_nonfinite=allow_nonfinite)
        self._prepare()
        # absent optional tensors (a model without biases) are zeros to the kernel, not weights of the model
        self.weights = {n: a for n, a in self.weights.items() if n in weights or not self.layout[n][0].optional}

    def __getattr__(self, name: str):
        config = self.__dict__.get("config")
        if config is not None and name in DecoderConfig.__dataclass_fields__:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        wdt = "" if self.weight_dtype in (None, self.dtype) else f", weight_dtype={self.weight_dtype}"
        return f"{type(self).__name__}({self.config}, max_seq_len={self.max_seq_len}, dtype={self.dtype}{wdt})"

    # the names StoryLM's options had
    @property
    def eps(self) -> float:
        return self.config.norm_eps

    @property
    def rope_theta(self) -> float:
        return self.config.rope.theta

    @property
    def rope_scaling(self) -> dict | None:
        return self.config.rope.scaling

    def layer_window(self, layer: int) -> int | None:
        """The window layer `layer` attends within, when it is shorter than max_seq_len (else
        None: the layer sees, and its cache keeps, every position)."""
        c = self.config
        W = c.sliding_window
        return W if c.kind(layer) == "sliding" and W is not None and W < self.max_seq_len else None

    @property
    def bytes_per_token_by_kind(self) -> dict[str, int]:
        """The KV cache's bytes per position by layer kind: K and V of n_kv_heads heads a layer. A
        sliding layer holds at most 2W - 1 positions (`DecoderCache.capacity`): then a token costs it nothing."""
        c = self.config
        per_layer = 2 * c.n_kv_heads * c.head_dim * self.dtype.itemsize
        sliding = sum(self.layer_window(i) is not None for i in range(c.n_layers))
        return {"full": (c.n_layers - sliding) * per_layer, "sliding": sliding * per_layer}

    @property
    def bytes_per_token(self) -> int:
        """What a position costs in the KV cache once the sliding windows are full: K and V of
        n_kv_heads heads in every layer that keeps every position (all layers of a model without
        sliding-window layers)."""
        return self.bytes_per_token_by_kind["full"]

    # -- the kernel and what it is given ------------------------------------------------
    def _prepare(self) -> None:
        """The compiled kernel, the rotary tables [max_seq_len, R], and every layer's arguments by name."""
        c, dt, w = self.config, self.dtype, self.weights
        T = KINA_DTYPES[dt]
        self._dtypes = {"T": dt, "W": runtime.numpy_dtype(norm_dtype(T))}
        self._constants = self.family.constants(c, self._dtypes)
        self._cos, self._sin = c.rope.tables(c.head_dim, self.max_seq_len, dt)
        self._tables = {"full": (self._cos, self._sin)}  # the rotary rows of each layer kind
        if "sliding" in c.layer_kinds:
            self._tables["sliding"] = (self._cos, self._sin) if c.rope_local in (None, c.rope) else \
                c.rope_local.tables(c.head_dim, self.max_seq_len, dt)
        names = sorted({t.name for t, _ in self.layout.values() if t.layer})
        self._layer_weights = [{n: w[f"layers.{i}.{n}"] for n in names} for i in range(c.n_layers)]
        if c.tie_embeddings and isinstance(w["embed"], QuantizedArray):  # blocks along D: the head's form already
            self._head = w["embed"]
        elif c.tie_embeddings:  # the table, held once, as [D, V]: the head reads it as x @ W, row after row.
            # Rewritten in the table's own memory (the model's copy, C-contiguous and aligned), whose
            # block would otherwise keep a dead [V, D] slot for the model's life.
            table = w["embed"]
            head = table.reshape(-1).reshape(c.d_model, c.vocab_size)
            head[...] = table.T.copy()
            w["embed"] = head.T
            self._head = head
        else:
            self._head = w["head"]
        self._model_weights = {"norm": w["norm"], "head": self._head}
        # one build per distinct set of weight dtypes (a Q4_K_M file's layers mix Q4_K and Q6_K; each
        # build is made once: _program is cached); the head runs layer 0's
        self._layer_kernels = [self._compile(self._type_params(i)) for i in range(c.n_layers)]
        self._kernels = self._layer_kernels[0]
        self._settle_weights()

    def _settle_weights(self) -> None:
        """Each block-quantized weight held only in the layout its builds read it in (their
        sidecars' `layouts`): a memory-mapped file's rows are dropped as each is tiled."""
        if self._kernels is None:
            return
        wanted: dict[int, set] = {}
        for i, builds in enumerate(self._layer_kernels):
            for fn in (builds.decoder_step, builds.decoder_prefill):
                for name, a in self._layer_weights[i].items():
                    if isinstance(a, QuantizedArray):
                        wanted.setdefault(id(a), set()).add(fn.signature.layout(name))
        head = self._kernels.logits.signature.layout("head")
        if isinstance(self._head, QuantizedArray):
            wanted.setdefault(id(self._head), set()).add(head)
        for a in [*(a for w in self._layer_weights for a in w.values()), self._head]:
            layouts = wanted.get(id(a))
            if layouts is not None and len(layouts) == 1:
                a.settle(layouts.pop())

    def _type_params(self, layer: int) -> tuple:
        """The kernel's type parameters for `layer`'s weights and the head, from what is bound to
        them (see the module doc)."""
        values = {"T": KINA_DTYPES[self.dtype], "W": norm_dtype(KINA_DTYPES[self.dtype])}
        declared = kernels.kernel_params(self.family.kernel)
        bound = {**self._layer_weights[layer], **self._model_weights}
        for fn, params in declared.items():
            for name, dtype in params.items():
                if name in bound and dtype not in KINA_DTYPES.values() and dtype not in values:
                    values[dtype] = dtype_name(bound[name])
        return tuple(sorted(values.items()))

    def _compile(self, type_params: tuple):
        largest = max(a.nbytes for a in [*self._layer_weights[0].values(), self._head])
        dims = self.family.dims(self.config)
        return kernels.program(self.family.kernel, type_params, tuple(sorted(dims.items())),
                        self.fma, largest >= THREADED_MIN_WEIGHT_BYTES, self.pass_options)

    def _arguments(self, fn, inputs: dict, layer: int | None, env: dict[str, int]) -> list[np.ndarray]:
        """`fn`'s arguments in its order, each by its parameter's name (see the module doc)."""
        sources = (inputs, self._constants, self._layer_weights[layer] if layer is not None else {},
                   self._model_weights)
        out = []
        for i, (name, t) in enumerate(fn.signature.params):
            a = next((s[name] for s in sources if name in s), None)
            if a is None:
                raise ValueError(f"{self.family.kernel}: {fn.signature.name}: parameter {name!r} has nothing to bind to: "
                                 f"not a weight of family {self.family.name!r}, a constant or a call input")
            if isinstance(a, QuantizedArray):  # its bytes, in the layout the build chose
                out.append(fn.storage_of(i, a))
                continue
            shape = tuple(d.evaluate(env) for d in t.dims)
            out.append(a if a.shape == shape else a.reshape(shape))
        return out

    def _threads(self) -> int:
        return self.threads or runtime.default_threads()

    def _layer(self, i: int, x, start: int, k_past, v_past, outs) -> None:
        """Layer i on x [1, P, D] at positions start .., after the caches k_past [1, Hk, Dh, S]
        and v_past [1, Hk, S, Dh] (the positions start - S .. start - 1); writes outs =
        [k_next, v_next, out]."""
        P, S = x.shape[1], k_past.shape[3]
        cos, sin = self._tables[self.config.kind(i)]
        inputs = {"x": x, "cos": cos[start:start + P], "sin": sin[start:start + P], "k_past": k_past, "v_past": v_past}
        if P == 1:
            fn = self._layer_kernels[i].decoder_step
        else:
            fn = self._layer_kernels[i].decoder_prefill
            inputs["mask"] = _mask(S, P, self.dtype, self.layer_window(i))
        fn.call_unchecked(self._arguments(fn, inputs, i, {"S": S, "P": P}), outs, self._threads())

    def _logits(self, x) -> np.ndarray:
        """The logits [V] after the last position of x [1, P, D]."""
        out = runtime.empty((1, 1, self.config.vocab_size), self.dtype)
        fn = self._kernels.logits
        fn.call_unchecked(self._arguments(fn, {"x": x[:, -1:]}, None, {}), [out], self._threads())
        return out[0, 0]

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """The embedding rows of `tokens`, [1, P, D] in the model's dtype (times `embed_scale`)."""
        table = self.weights["embed"]
        if isinstance(table, QuantizedArray):  # its columns are the rows of the table: one run of blocks each
            x = dequantize_blocks(table.row_bytes(list(tokens)), table.dtype).reshape(1, len(tokens), -1)
            x = x.astype(self.dtype, copy=False)
        else:
            x = table[list(tokens)][None].astype(self.dtype, copy=False)
        if self.config.embed_scale is not None:
            x = x * self.dtype.type(self.config.embed_scale)
        return x

    # -- the forward pass ------------------------------------------------------------------
    def new_cache(self) -> DecoderCache:
        """Empty caches for a new sequence."""
        return DecoderCache(self)

    def _forward(self, tokens: list[int], cache: DecoderCache | None) -> np.ndarray:
        if cache is not None and len(tokens) == 1:
            return self._decode(tokens[0], cache)
        return self._run(tokens, cache)

    def _run(self, tokens: list[int], cache: DecoderCache | None) -> np.ndarray:
        """`_forward` through `_layers`: at once, or into a cache in chunks of at most its `chunk`."""
        step = (cache.chunk if cache is not None else None) or len(tokens)
        for at in range(0, len(tokens), step):
            x = self._layers(tokens[at:at + step], cache)
        return self._logits(x)

    def _layers(self, tokens: list[int], cache: DecoderCache | None) -> np.ndarray:
        """Every layer on `tokens` through `_layer`, one call per layer on new arrays and cache
        views; the last layer's output [1, P, D]."""
        c, dt = self.config, self.dtype
        start, P, H, Dh = cache.n_filled if cache else 0, len(tokens), c.n_kv_heads, c.head_dim
        x = self.embed(tokens)
        if cache is not None:
            cache.reserve(P)
        for i in range(c.n_layers):
            if cache is None:
                past = [runtime.empty((1, H, Dh, 0), dt), runtime.empty((1, H, 0, Dh), dt)]
                nexts = [runtime.empty((1, H, Dh, P), dt), runtime.empty((1, H, P, Dh), dt)]
            else:
                *past, k_next, v_next = cache.views(i, P)
                nexts = [k_next, v_next]
            out = runtime.empty((1, P, c.d_model), dt)
            self._layer(i, x, start, *past, [*nexts, out])
            x = out
        if cache is not None:
            cache.advance(P)
        return x

    def _decode(self, token: int, cache: DecoderCache) -> np.ndarray:
        """One token through every layer's decoder_step on the cache's prepared calls: the
        embedding row and the rotary rows are copied into fixed buffers, and each call's
        descriptors change only in the cache sizes (and, for a sliding-window layer, where its
        window starts); the layers and the head run as one CallSequence (no Python between them)."""
        if cache._calls is None:
            cache._calls = self._prepare_calls(cache)
        steps = cache._calls
        S = cache.n_filled
        cache.reserve(1)
        steps.x[0, 0] = self.embed([token])[0, 0]
        for kind, (cos, sin) in steps.rotary.items():
            cos[...], sin[...] = self._tables[kind][0][S], self._tables[kind][1][S]
        run = steps.run
        if not steps.sliding:  # every layer's k_past, v_past [.., S, ..] and k_next, v_next [.., S+1, ..]
            run.set_dim("S", S)
        else:
            if steps.full:
                run.set_dim("S", S, calls=steps.full)
            layer = steps.sliding[0]  # every sliding layer's window starts at the same position and slot
            first = cache.first(layer)
            slot = first - cache.held_from(layer)
            if slot != steps.slot:  # the window moved on: its views start one slot further (or back at 0)
                for i in steps.sliding:
                    k, v, W = cache._k[i][..., slot:], cache._v[i][:, :, slot:], cache.windows[i]
                    for name, view in (("k_past", k[..., :W]), ("out0", k[..., :W]), ("v_past", v[:, :, :W]),
                                       ("out1", v[:, :, :W])):
                        run.calls[i].set_data(name, view)
                steps.slot = slot
            run.set_dim("S", S - first, calls=steps.sliding)
        run.threads = self._threads()  # each call all threads: the step's ops split between them
        run()  # the layers, then the head, in one entry from here
        cache.advance(1)
        return steps.logits[0, 0].copy()

    def _prepare_calls(self, cache: DecoderCache) -> "_Steps":
        """decoder_step per layer, from its cache buffers (the past) into the same buffers (the
        next), chained by fixed activations x_0 .. x_L, and the head on x_L. A full layer's is
        prepared on whole buffers, which bound S to max_seq_len - 1 (k_next holds S+1 positions),
        a sliding layer's on a view of W positions (S up to W - 1) that `_decode` moves along with
        the window; it sets S before every call. All of them as one CallSequence."""
        c, dt, L = self.config, self.dtype, self.config.n_layers
        R = c.head_dim // 2
        xs = [runtime.empty((1, 1, c.d_model), dt) for _ in range(L + 1)]
        rotary = {kind: (runtime.empty((1, R), dt), runtime.empty((1, R), dt)) for kind in self._tables}
        steps = []
        for i in range(L):
            step = self._layer_kernels[i].decoder_step
            W = cache.windows[i]
            k, v = (cache._k[i], cache._v[i]) if W is None else (cache._k[i][..., :W], cache._v[i][:, :, :W])
            cos, sin = rotary[c.kind(i)]
            inputs = {"x": xs[i], "cos": cos, "sin": sin, "k_past": k, "v_past": v}
            args = self._arguments(step, inputs, i, {"S": k.shape[3], "P": 1})
            steps.append(step.prepare(args, [k, v, xs[i + 1]], dims=("S",)))
        out = runtime.empty((1, 1, c.vocab_size), dt)
        head = self._kernels.logits
        logits = head.prepare(self._arguments(head, {"x": xs[L]}, None, {}), [out])
        sliding = tuple(i for i in range(L) if cache.windows[i] is not None)
        return _Steps(runtime.CallSequence([*steps, logits]), xs[0], rotary, out,
                      tuple(i for i in range(L) if i not in sliding), sliding)

    def _check_cache(self, cache, n_new: int) -> None:
        if not isinstance(cache, DecoderCache) or cache.model is not self:
            raise TypeError("cache: expected this model's cache, from new_cache()")
        if cache.n_filled + n_new > self.max_seq_len:
            raise ValueError(f"cache: {cache.n_filled} positions + {n_new} new exceed max_seq_len = "
                             f"{self.max_seq_len}")

    def prefill(self, tokens: Sequence[int], cache: DecoderCache) -> np.ndarray:
        """Run `tokens` at once after the cache's positions (one decoder_prefill call per layer;
        decoder_step for one token), extend the cache; the logits after the last token."""
        tokens = self._some_tokens(tokens)
        self._check_cache(cache, len(tokens))
        return self._forward(tokens, cache)

    def step(self, token: int, cache: DecoderCache) -> np.ndarray:
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


@dataclass
class _Steps:
    """A cache's prepared decode step: the CallSequence (each layer's decoder_step, then the head),
    its input row `x`, the rotary rows by layer kind, the logits it writes, the layers that keep
    every position (`full`) and those that keep a window (`sliding`), and where the windows start."""

    run: runtime.CallSequence
    x: np.ndarray
    rotary: dict
    logits: np.ndarray
    full: tuple[int, ...]
    sliding: tuple[int, ...]
    slot: int = 0


@functools.lru_cache(maxsize=2)
def _mask(n_past: int, n_new: int, dtype: np.dtype, window: int | None) -> np.ndarray:
    """causal_mask, made once for the layers of a call that share it (read-only; the last two kept:
    a call's full and sliding layers')."""
    mask = causal_mask(n_past, n_new, dtype, window)
    mask.flags.writeable = False
    return mask


def dtype_name(a) -> str:
    """The Kina dtype of a weight: a block format's name, or the float's (F32, F16, ...)."""
    return a.dtype if isinstance(a, QuantizedArray) else KINA_DTYPES[np.dtype(a.dtype)]
