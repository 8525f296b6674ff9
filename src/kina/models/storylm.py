"""StoryLM: a Llama-family decoder made from sizes and a seed (or a weights file), and its
NumPy twin. StoryLM-0 is its default configuration.

In:  the model's sizes and options (as keywords: `StoryLM(vocab_size=256, d_model=64, n_heads=4,
     n_layers=2, ffn_dim=176, max_seq_len=512)`) and either a seed (random weights) or a weights
     file (`.npz`, or `.safetensors`) or a mapping of arrays, named as `weight_layout` lists;
     then token ids.
Out: `StoryLM`, a `kina.models.Decoder` of the Llama family (kina.models.families.llama: its
     kernel is llama.kina); `NumPyStoryLM`, the same model with every layer written in NumPy
     (the benchmark's NumPy row, and a second reference).

The tensors (D = d_model, F = ffn_dim, V = vocab_size, Q = n_heads * head_dim,
KV = n_kv_heads * head_dim; i = 0 .. n_layers-1), projections stored [in, out]:

    embed [V, D]                the token embedding (a row lookup on the host)
    layers.i.attn_norm [D]      RMSNorm gain before attention
    layers.i.wq [D, Q], .wk, .wv [D, KV]  query, key, value projections (head j is columns
                                j*head_dim .. j*head_dim+head_dim-1; query head j reads
                                key/value head j // (n_heads / n_kv_heads))
    layers.i.bq [Q], .bk, .bv [KV]  their biases, only with qkv_bias (Qwen2)
    layers.i.wo [Q, D]          output projection; layers.i.bo [D] only with o_bias
    layers.i.mlp_norm [D]       RMSNorm gain before the MLP
    layers.i.w_gate, .w_up [D, F], layers.i.w_down [F, D]   SwiGLU MLP
    norm [D]                    final RMSNorm gain
    head [D, V]                 output head, absent with tie_embeddings

Guarantees: the Decoder's. A weights mapping or file must hold exactly these tensors, each of
its shape and dtype; anything else is a ValueError (TypeError for a dtype) naming the tensor.
Bad sizes are errors naming the parameter.
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from .. import runtime
from . import families, weights as weights_mod
from .config import DecoderConfig, Rope
from .decoder import Decoder, norm_dtype, weight_dtype_of  # noqa: F401 (norm_dtype: for the tests' interpreter)
from .generation import causal_mask, count, kina_dtype  # noqa: F401 (causal_mask: as before)

LLAMA = families.get("llama")


def weight_layout(n_layers: int, qkv_bias: bool = False, o_bias: bool = False,
                  tie_embeddings: bool = False) -> dict[str, tuple[str, ...]]:
    """Every tensor a StoryLM weights file holds, by name, with its shape in size names."""
    config = DecoderConfig(vocab_size=1, d_model=2, n_layers=n_layers, n_heads=1, ffn_dim=1, qkv_bias=qkv_bias,
                           o_bias=o_bias, tie_embeddings=tie_embeddings)
    return {name: t.dims for name, (t, _) in LLAMA.layout(config).items() if not t.optional}


def weight_shapes(vocab_size: int, d_model: int, n_layers: int, ffn_dim: int, q_dim: int | None = None,
                  kv_dim: int | None = None, **options) -> dict[str, tuple[int, ...]]:
    """`weight_layout` at these sizes (q_dim and kv_dim default to d_model): every tensor's name and shape."""
    sizes = dict(vocab_size=vocab_size, d_model=d_model, ffn_dim=ffn_dim, q_dim=q_dim or d_model,
                 kv_dim=kv_dim or q_dim or d_model)
    return {name: tuple(sizes[d] for d in dims) for name, dims in weight_layout(n_layers, **options).items()}


class StoryLM(Decoder):
    """A Llama-family decoder with seeded (or loaded) weights; every layer is compiled Kina.

        model = StoryLM(vocab_size=256, d_model=64, n_heads=4, n_layers=2, ffn_dim=176, max_seq_len=512)
        model.generate([1, 2, 3], n_new=20)                   # prefill, then one step per token
        StoryLM(..., weights="storylm.npz")                   # real weights, named as weight_layout says
        StoryLM(..., n_kv_heads=2, head_dim=32, qkv_bias=True, tie_embeddings=True,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, ...})  # Llama 3, Qwen2, ...

    StoryLM-0 is the default configuration: n_kv_heads = n_heads, head_dim = d_model /
    n_heads, no biases, an untied head, unscaled rotary (`DecoderConfig.storylm0()` is its
    benchmark size). `max_seq_len` bounds the positions (the rotary tables' length); nothing
    else depends on it. `model.weights` holds the tensors by name (np.savez(path,
    **model.weights) writes a file that loads back).
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, ffn_dim: int,
                 max_seq_len: int, seed: int = 0, dtype=np.float32,
                 weights: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
                 eps: float = 1e-6, rope_theta: float = 10000.0, *, n_kv_heads: int | None = None,
                 head_dim: int | None = None, qkv_bias: bool = False, o_bias: bool = False,
                 tie_embeddings: bool = False, rope_scaling: Mapping | None = None, allow_nonfinite: bool = False,
                 threads: int | None = None, fma: bool = False, weight_dtype=None, pass_options: str = ""):
        self.seed = count("seed", seed, 0)
        config = DecoderConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                               ffn_dim=ffn_dim, n_kv_heads=n_kv_heads, head_dim=head_dim,
                               context_length=count("max_seq_len", max_seq_len, 1), norm_eps=_eps(eps),
                               rope=Rope.of(rope_theta, rope_scaling), qkv_bias=bool(qkv_bias), o_bias=bool(o_bias),
                               tie_embeddings=bool(tie_embeddings))
        dt = kina_dtype(dtype)
        wdt = weight_dtype_of(dt, weight_dtype)
        copy = True
        if weights is None:
            weights = weights_mod.random(LLAMA.layout(config), self.seed, dt, wdt)  # copied into one block
        elif isinstance(weights, (str, os.PathLike)):
            weights = weights_mod.read(weights)
        elif not isinstance(weights, Mapping):
            raise TypeError(f"weights: expected a path to a .npz/.safetensors file or a mapping of arrays, "
                            f"got {type(weights).__name__}")
        super().__init__(config, weights, max_seq_len=max_seq_len, dtype=dt, weight_dtype=wdt, fma=fma,
                         threads=threads, pass_options=pass_options, allow_nonfinite=allow_nonfinite, copy=copy)


def _eps(eps) -> float:
    try:
        return DecoderConfig(vocab_size=1, d_model=2, n_layers=1, n_heads=1, ffn_dim=1, norm_eps=eps).norm_eps
    except (TypeError, ValueError) as e:
        raise type(e)(str(e).replace("norm_eps", "eps")) from None


class NumPyStoryLM(StoryLM):
    """The same model, every layer and the head written in NumPy (one op per formula)."""

    def _compile(self, type_params=()):
        if self.dtype == runtime.numpy_dtype("BF16"):  # ml_dtypes' bfloat16 matmul returns float32
            raise TypeError("dtype: NumPyStoryLM's layers are NumPy matmuls, which have no bfloat16 result: "
                            "use float16, float32 or float64 (StoryLM itself takes bfloat16)")
        return None

    def _rms_norm(self, x, gain):
        """Normalised in the norm dtype and rounded once to the model's dtype, then scaled, as the kernel does."""
        eps = self._constants["eps"]
        x32 = x.astype(eps.dtype)
        return (x32 * (1 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + eps[0]))).astype(x.dtype) * gain

    def _layer(self, i, x, start, k_past, v_past, outs):
        w = self._layer_weights[i]
        c = self.config
        P, H, Hk, Dh, R = x.shape[1], c.n_heads, c.n_kv_heads, c.head_dim, c.head_dim // 2
        cos = self._cos[start:start + P].reshape(1, P, 1, 1, R)
        sin = self._sin[start:start + P].reshape(1, P, 1, 1, R)
        k_next, v_next, out = outs

        def rope(t, heads):  # [1, P, heads * Dh] -> [1, P, heads, Dh], NeoX half rotation on [.., 2, R]
            t = t.reshape(1, P, heads, 2, R)
            half = np.concatenate([-t[:, :, :, 1:], t[:, :, :, :1]], axis=3)
            return (t * cos + half * sin).reshape(1, P, heads, Dh)

        a = self._rms_norm(x, w["attn_norm"])
        q = rope(a @ w["wq"] + w["bq"], H)
        k = rope(a @ w["wk"] + w["bk"], Hk)
        v = (a @ w["wv"] + w["bv"]).reshape(1, P, Hk, Dh)
        np.concatenate([k_past, k.transpose(0, 2, 3, 1)], axis=3, out=k_next)
        np.concatenate([v_past, v.transpose(0, 2, 1, 3)], axis=2, out=v_next)
        group = np.arange(H) // (H // Hk)  # query head j reads key/value head j // G
        scores = q.transpose(0, 2, 1, 3) @ k_next[:, group] * self._constants["scale"]
        if P > 1:
            scores = scores + causal_mask(k_past.shape[3], P, self.dtype)
        e = np.exp(scores - scores.max(axis=3, keepdims=True))
        context = (e / e.sum(axis=3, keepdims=True)) @ v_next[:, group]
        h = x + context.transpose(0, 2, 1, 3).reshape(1, P, H * Dh) @ w["wo"] + w["bo"]
        m = self._rms_norm(h, w["mlp_norm"])
        gate = m @ w["w_gate"]
        out[...] = h + (gate / (1 + np.exp(-gate)) * (m @ w["w_up"])) @ w["w_down"]

    def _decode(self, token, cache):
        return self._run([token], cache)

    def _logits(self, x):
        return (self._rms_norm(x[:, -1:], self._model_weights["norm"]) @ self._model_weights["head"])[0, 0]
