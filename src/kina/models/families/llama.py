"""The Llama family: Llama 2 and 3, Mistral, Qwen2, SmolLM, and StoryLM-0.

Per layer, h = x + Attn(RMSNorm(x)) and out = h + MLP(RMSNorm(h)): RMSNorm with a gain
and eps computed in F32, NeoX rotary embedding on q and k, grouped-query attention scaled
by 1/sqrt(head_dim), a SwiGLU MLP; then a final RMSNorm and the output head (tied to the
embedding table or not). Qwen2 adds q/k/v biases, Llama's `attention_bias` o's too. The
kernel is llama.kina.

From Hugging Face folders: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM. From
GGUF files: architecture `llama`, whose q and k rows llama.cpp's converter permuted so
that its interleaved rotary applies (`transform` puts them back; whole rows move, so a
quantized matrix is permuted without requantizing).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..config import DecoderConfig, Rope
from . import Family, Tensor, attention_projections, embedding_and_head, gated_mlp, gguf_keys, hf_keys

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}


def tensors(config: DecoderConfig) -> list[Tensor]:
    L, B = "model.layers.{i}.", "blk.{i}."
    return [Tensor("attn_norm", ("d_model",), L + "input_layernorm.weight", B + "attn_norm.weight"),
            *attention_projections(config),
            Tensor("mlp_norm", ("d_model",), L + "post_attention_layernorm.weight", B + "ffn_norm.weight"),
            *gated_mlp(), *embedding_and_head(config)]


def config_from_hf(f, arch: str) -> DecoderConfig:
    """config.json (a `checkpoints.fields.Fields`) of a Llama, Mistral or Qwen2 folder."""
    if f.get("hidden_act", "silu") != "silu":
        f.refuse("hidden_act", "only silu (SwiGLU) is supported")
    if f.get("mlp_bias", False):
        f.refuse("mlp_bias", "MLP biases are not supported")
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f.get(name) is not None:
            f.refuse(name, "not supported")
    if f.get("pretraining_tp", 1) != 1:
        f.refuse("pretraining_tp", "only 1 is supported")
    sizes = {k: f.integer(k, required=True) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                     "num_hidden_layers", "num_attention_heads")}
    heads = sizes["num_attention_heads"]
    kv_heads = f.integer("num_key_value_heads") or heads
    if heads % kv_heads:
        f.refuse("num_key_value_heads", f"num_attention_heads = {heads} is not a multiple of it")
    head_dim = f.integer("head_dim")
    if head_dim is None:
        if sizes["hidden_size"] % heads:
            f.refuse("hidden_size", f"not a multiple of num_attention_heads = {heads}, and there is no head_dim")
        head_dim = sizes["hidden_size"] // heads
    if head_dim % 2:
        f.refuse("head_dim", "must be even (rotary embedding splits each head in two halves)")
    eps = f.number("rms_norm_eps", 1e-6)
    window = f.integer("sliding_window")
    if arch == "Qwen2ForCausalLM" and not f.get("use_sliding_window", False):
        window = None  # Qwen2's applies only with use_sliding_window; Mistral's whenever set
    attention_bias = bool(f.get("attention_bias", False))
    return DecoderConfig(
        vocab_size=sizes["vocab_size"], d_model=sizes["hidden_size"], n_layers=sizes["num_hidden_layers"],
        n_heads=heads, ffn_dim=sizes["intermediate_size"], n_kv_heads=kv_heads, head_dim=head_dim,
        context_length=f.integer("max_position_embeddings") or 4096, norm_eps=eps, rope=hf_rope(f),
        qkv_bias=attention_bias or arch == "Qwen2ForCausalLM", o_bias=attention_bias,
        tie_embeddings=bool(f.get("tie_word_embeddings", False)), family="llama", sliding_window=window,
        layer_kinds=("sliding",) * sizes["num_hidden_layers"] if window else ())


def hf_rope(f) -> Rope:
    """The rotary embedding of a config.json: transformers 5's `rope_parameters`, or the older
    top-level `rope_theta` with `rope_scaling`."""
    rope = dict(f.get("rope_parameters", {}) or {})
    where = "rope_parameters"
    if not rope:
        rope = dict(f.get("rope_scaling", {}) or {})
        where = "rope_scaling"
    rope.setdefault("rope_theta", f.get("rope_theta", 10000.0))
    return hf_keys.rope(f, where, rope)


def config_from_gguf(f, arch: str) -> DecoderConfig:
    """The `llama.*` keys of a GGUF file (`Fields` with the prefix "llama.")."""
    d, heads, kv_heads, head_dim = gguf_keys.attention(f)
    rope = gguf_keys.rope(f, 10000.0)
    if f.integer("expert_count", 0, minimum=0):
        f.refuse("expert_count", "mixtures of experts are not supported")
    return DecoderConfig(
        vocab_size=gguf_keys.vocab_size(f), d_model=d, n_layers=f.integer("block_count", required=True),
        n_heads=heads, ffn_dim=f.integer("feed_forward_length", required=True), n_kv_heads=kv_heads,
        head_dim=head_dim, context_length=f.integer("context_length", 4096),
        norm_eps=f.number("attention.layer_norm_rms_epsilon", 1e-5), rope=rope, qkv_bias=False, o_bias=False,
        tie_embeddings=False, family="llama")


def transform(name: str, array, source: str, config: DecoderConfig):
    """From GGUF, q and k (and their biases) back in Hugging Face's row order: llama.cpp's
    converter interleaved each head's two rotary halves (row 2i is HF's row i, row 2i+1 is
    HF's row i + Dh/2), so that its pairwise rotary applies. Rows are output features, so a
    quantized matrix's blocks move whole. `array` is [out, ...] as stored."""
    short = name.rsplit(".", 1)[-1]
    if source != "gguf" or short not in ("wq", "wk", "bq", "bk"):
        return array
    heads = config.n_heads if short in ("wq", "bq") else config.n_kv_heads
    return unpermute_rows(array, heads)


def unpermute_rows(array, heads: int):
    """Rows [heads * Dh, ...] from GGUF's pairwise order to Hugging Face's halves, per head."""
    rows = array.shape[0]
    half = rows // heads // 2
    return array.reshape(heads, half, 2, *array.shape[1:]).swapaxes(1, 2).reshape(array.shape)


def dims(config: DecoderConfig) -> dict[str, int]:
    Hk, G, Dh = config.n_kv_heads, config.group, config.head_dim
    return dict(B=1, D=config.d_model, Hk=Hk, G=G, Dh=Dh, R=Dh // 2, Q=config.q_dim,
                KV=config.kv_dim, F=config.ffn_dim, V=config.vocab_size)


def constants(config: DecoderConfig, dtypes) -> dict[str, np.ndarray]:
    """eps in the norm dtype W, and the attention scale in T."""
    return {"eps": np.full((1, 1, 1), config.norm_eps, dtypes["W"]),
            "scale": np.full((1, 1, 1, 1), config.attn_scale or 1 / math.sqrt(config.head_dim), dtypes["T"])}


FAMILY = Family(name="llama", kernel=Path(__file__).with_name("llama.kina"), hf_architectures=ARCHITECTURES,
                gguf_architectures=("llama",), tensors=tensors, config_from_hf=config_from_hf,
                config_from_gguf=config_from_gguf, dims=dims, constants=constants, transform=transform)
