"""The Gemma 3 family: Gemma 3's text models (270M, 1B, and the language half of 4B, 12B, 27B).

Per layer, h = x + post_attn_norm(Attn(attn_norm(x))) and out = h + post_mlp_norm(GeGLU(
mlp_norm(h))): every norm an RMSNorm whose gain is 1 + weight, computed in F32; q and k
normalised per head before the NeoX rotary embedding; grouped-query attention scaled by
query_pre_attn_scalar^-0.5; a GeGLU MLP (GeLU's tanh form). The embedding rows are scaled by
sqrt(width) in the model's dtype; the head is tied. Five layers in six ("sliding") attend
within a window of the last `sliding_window` positions, with rotary base 10,000; the others
("full") see every position, with the file's base. The kernel is gemma3.kina.

From Hugging Face folders: Gemma3ForCausalLM (model_type gemma3_text), its layer kinds from
`layer_types` (or `sliding_window_pattern`). From GGUF files: architecture `gemma3`, whose
layer kinds llama.cpp derives from `attention.sliding_window` and a period of 6 (or
`attention.sliding_window_pattern`, when a file has it). llama.cpp's converter stores every
norm weight with the 1 already added (and leaves q and k in Hugging Face's row order):
`transform` takes the 1 away again in F32, as transformers reads such a file, so that both
sources give the kernel the same weights. Anything in a config that would change the math
and is not computed here (logit soft-capping, bidirectional attention, another activation,
other rotary scalings) is refused, naming the field.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..config import DecoderConfig, Rope
from . import Family, Tensor, attention_projections, embedding_and_head, gated_mlp, gguf_keys, hf_keys
from .llama import constants, dims  # the kernel's sizes, eps and scale: named as the Llama kernel's

ARCHITECTURES = {"Gemma3ForCausalLM": "gemma3_text"}
# Gemma3TextConfig's defaults, for fields an older config.json leaves out
GLOBAL_THETA, LOCAL_THETA, PATTERN = 1_000_000.0, 10_000.0, 6
# llama.cpp's gemma3 loader: a layer i is "sliding" unless i % period == period - 1, with this
# period when the file does not say (llama-model.cpp, set_swa_pattern(6))
LLAMA_CPP_PERIOD = 6
NORMS = ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm", "norm")
KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def tensors(config: DecoderConfig) -> list[Tensor]:
    L, B = "model.layers.{i}.", "blk.{i}."
    return [Tensor("attn_norm", ("d_model",), L + "input_layernorm.weight", B + "attn_norm.weight"),
            *attention_projections(config),
            Tensor("q_norm", ("head_dim",), L + "self_attn.q_norm.weight", B + "attn_q_norm.weight"),
            Tensor("k_norm", ("head_dim",), L + "self_attn.k_norm.weight", B + "attn_k_norm.weight"),
            Tensor("post_attn_norm", ("d_model",), L + "post_attention_layernorm.weight",
                   B + "post_attention_norm.weight"),
            Tensor("mlp_norm", ("d_model",), L + "pre_feedforward_layernorm.weight", B + "ffn_norm.weight"),
            *gated_mlp(),
            Tensor("post_mlp_norm", ("d_model",), L + "post_feedforward_layernorm.weight", B + "post_ffw_norm.weight"),
            *embedding_and_head(config)]


def config_from_hf(f, arch: str) -> DecoderConfig:
    """config.json (a `checkpoints.fields.Fields`) of a Gemma3ForCausalLM folder; a field absent
    takes Gemma3TextConfig's default."""
    if f.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        f.refuse("hidden_activation", "only gelu_pytorch_tanh (GeLU's tanh form) is supported")
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f.get(name) is not None:
            f.refuse(name, "logit soft-capping is not supported (Gemma 3 has none; Gemma 2 did)")
    if f.flag("use_bidirectional_attention", False):
        f.refuse("use_bidirectional_attention", "only causal attention is supported")
    sizes = {k: f.integer(k, required=True) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                     "num_hidden_layers", "num_attention_heads")}
    n_layers, heads = sizes["num_hidden_layers"], sizes["num_attention_heads"]
    kv_heads = f.integer("num_key_value_heads") or heads
    if heads % kv_heads:
        f.refuse("num_key_value_heads", f"num_attention_heads = {heads} is not a multiple of it")
    head_dim = f.integer("head_dim", 256)
    if head_dim % 2:
        f.refuse("head_dim", "must be even (rotary embedding splits each head in two halves)")
    # absent: Gemma3TextConfig's 4096; null: no window
    window = None if "sliding_window" in f.values and not f.has("sliding_window") else f.integer("sliding_window", 4096)
    kinds = _hf_kinds(f, n_layers)
    if "sliding" in kinds and window is None:
        f.refuse("sliding_window", "the sliding layers (layer_types) need a window")
    rope, rope_local = _hf_ropes(f)
    bias = f.flag("attention_bias", False)
    return DecoderConfig(
        vocab_size=sizes["vocab_size"], d_model=sizes["hidden_size"], n_layers=n_layers, n_heads=heads,
        ffn_dim=sizes["intermediate_size"], n_kv_heads=kv_heads, head_dim=head_dim,
        context_length=f.integer("max_position_embeddings", 131072), norm_eps=f.number("rms_norm_eps", 1e-6),
        rope=rope, rope_local=rope_local, qkv_bias=bias, o_bias=bias,
        tie_embeddings=f.flag("tie_word_embeddings", True), family="gemma3",
        sliding_window=window if "sliding" in kinds else None, layer_kinds=kinds,
        attn_scale=f.number("query_pre_attn_scalar", 256) ** -0.5, embed_scale=math.sqrt(sizes["hidden_size"]))


def _hf_kinds(f, n_layers: int) -> tuple[str, ...]:
    """Each layer's kind: `layer_types`, else every `sliding_window_pattern`-th layer full."""
    types = f.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers or not all(t in KINDS for t in types):
            f.refuse("layer_types", f"expected {n_layers} entries, each {' or '.join(KINDS)}")
        return tuple(KINDS[t] for t in types)
    period = f.integer("sliding_window_pattern", PATTERN)
    return tuple("full" if (i + 1) % period == 0 else "sliding" for i in range(n_layers))


def _hf_ropes(f) -> tuple[Rope, Rope]:
    """The full and the sliding layers' rotary embeddings: transformers 5's `rope_parameters` by
    layer type, or an older config's `rope_theta` and `rope_scaling` (full layers) and
    `rope_local_base_freq` (sliding layers)."""
    given = f.get("rope_parameters")
    if given is not None:
        if not isinstance(given, dict) or not set(given) <= set(KINDS):
            f.refuse("rope_parameters", f"expected the parameters of each layer type ({', '.join(KINDS)})")
        full = dict(given.get("full_attention") or {"rope_theta": GLOBAL_THETA})
        local = dict(given.get("sliding_attention") or {"rope_theta": LOCAL_THETA})
    else:
        full = dict(f.get("rope_scaling") or {})
        full["rope_theta"] = f.get("rope_theta", GLOBAL_THETA)
        local = {"rope_theta": f.get("rope_local_base_freq", LOCAL_THETA)}
    where = "rope_parameters" if given is not None else "rope_scaling"
    return hf_keys.rope(f, where, full), hf_keys.rope(f, where, local)


def config_from_gguf(f, arch: str) -> DecoderConfig:
    """The `gemma3.*` keys of a GGUF file (`Fields` with the prefix "gemma3."), read as llama.cpp
    reads them."""
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f.has(name):
            f.refuse(name, "logit soft-capping is not supported (Gemma 3 has none; Gemma 2 did)")
    d, heads, kv_heads, head_dim = gguf_keys.attention(f)
    n_layers = f.integer("block_count", required=True)
    rope = gguf_keys.rope(f, None)
    rope_local = Rope(f.number("rope.freq_base_swa", LOCAL_THETA))
    window = f.integer("attention.sliding_window")
    kinds = _gguf_kinds(f, n_layers) if window else ()
    # llama.cpp's attention scale: the file's, else 1/sqrt(head_dim), but for its 27B (62 layers)
    # 1/sqrt(width / heads) (query_pre_attn_scalar, which a GGUF file does not hold)
    scale = f.number("attention.scale") or (1 / math.sqrt(d / heads) if n_layers == 62 else 1 / math.sqrt(head_dim))
    return DecoderConfig(
        vocab_size=gguf_keys.vocab_size(f), d_model=d, n_layers=n_layers, n_heads=heads,
        ffn_dim=f.integer("feed_forward_length", required=True), n_kv_heads=kv_heads, head_dim=head_dim,
        context_length=f.integer("context_length", 131072), norm_eps=f.number("attention.layer_norm_rms_epsilon", 1e-6),
        rope=rope, rope_local=rope_local, tie_embeddings=True, family="gemma3",
        sliding_window=window if "sliding" in kinds else None, layer_kinds=kinds, attn_scale=scale,
        embed_scale=math.sqrt(d))


def _gguf_kinds(f, n_layers: int) -> tuple[str, ...]:
    """`attention.sliding_window_pattern`: a period (layer i full when i % period == period - 1) or
    one flag per layer (true: sliding); without it, llama.cpp's period."""
    pattern = f.get("attention.sliding_window_pattern", LLAMA_CPP_PERIOD)
    if isinstance(pattern, (list, tuple, np.ndarray)):
        if len(pattern) != n_layers:
            f.refuse("attention.sliding_window_pattern", f"expected one flag per layer ({n_layers})")
        return tuple("sliding" if bool(p) else "full" for p in pattern)
    period = f.integer("attention.sliding_window_pattern", LLAMA_CPP_PERIOD)
    return tuple("full" if i % period == period - 1 else "sliding" for i in range(n_layers))


def transform(name: str, array, source: str, config: DecoderConfig):
    """From GGUF, each norm's weight less the 1 llama.cpp's converter added, in F32 (transformers
    reads such a file so); the kernel adds the 1 (centred_rms_norm), as for a Hugging Face folder."""
    if source == "gguf" and name.rsplit(".", 1)[-1] in NORMS:
        return np.asarray(array, np.float32) - np.float32(1)
    return array


FAMILY = Family(name="gemma3", kernel=Path(__file__).with_name("gemma3.kina"), hf_architectures=ARCHITECTURES,
                gguf_architectures=("gemma3",), tensors=tensors, config_from_hf=config_from_hf,
                config_from_gguf=config_from_gguf, dims=dims, constants=constants, transform=transform, sliding=True)
