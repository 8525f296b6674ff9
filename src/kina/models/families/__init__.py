"""The model families: one module per architecture, and the table that finds them.

In:  a family's name (`DecoderConfig.family`), a Hugging Face `architectures` entry or a
     GGUF `general.architecture`.
Out: `Family`, what every family module declares (below); `Tensor`, one weight of it;
     `FAMILIES`, name -> Family; `get`, `by_hf_architecture`, `by_gguf_architecture`.

A family module is the one place that knows an architecture (llama.cpp keeps one file per
architecture under `src/models/`; this is the same idea). It holds:

    FAMILY = Family(name, kernel, hf_architectures, gguf_architectures, tensors, config_from_hf,
                    config_from_gguf, dims, constants, transform)

- `kernel`: its Kina file (next to the module), whose `decoder_step`, `decoder_prefill` and
  `logits` the generic decoder (kina.models.decoder) calls, binding every parameter by name;
- `tensors(config)`: every weight, named as the kernel's parameters (per layer) or as the
  decoder's model-level weights (`embed`, `norm`, `head`), with its shape in size names and
  its names in Hugging Face folders and GGUF files;
- `config_from_hf(fields)` / `config_from_gguf(fields)`: the checkpoint's config as a
  `DecoderConfig`, every field that changes the math honoured or refused (naming it);
- `dims(config)`: the kernel's dim values; `constants(config, dtypes)`: its non-weight inputs
  (eps, the attention scale, ...), by parameter name;
- `transform(name, array, source, config)`: what a checkpoint stores differently from what
  the kernel reads (llama.cpp's q/k row order in GGUF files, Gemma's `1 + w` norms).

docs/adding-a-model.md walks through adding one. Guarantees: this package imports no
family module at import time (the table loads them on first use) and nothing of `mlir`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import DecoderConfig

# name -> module under this package; a new family is one line here
_MODULES = {"llama": "llama", "gemma3": "gemma3"}


@dataclass(frozen=True)
class Tensor:
    """One weight: `name` (a kernel parameter of each layer when `layer`, else a model-level
    weight), `dims` in size names (d_model, q_dim, ...: `Family.sizes`), its names in a Hugging
    Face folder (`hf`, "{i}" for the layer) and a GGUF file (`gguf`), whether Hugging Face
    stores it transposed (a Linear's [out, in], where the kernel reads [in, out]), whether it
    is a `matrix` (held in the weight dtype, or quantized) rather than a vector (held in the
    activation dtype), and whether it may be absent (`optional`: zeros, as a model without
    biases)."""

    name: str
    dims: tuple[str, ...]
    hf: str | None = None
    gguf: str | None = None
    layer: bool = True
    transposed: bool = False
    optional: bool = False

    @property
    def matrix(self) -> bool:
        return len(self.dims) == 2

    def key(self, i: int | None) -> str:
        """The decoder's name for it: `layers.{i}.{name}`, or `name` for a model-level weight."""
        return f"layers.{i}.{self.name}" if self.layer else self.name

    def hf_name(self, i: int | None) -> str | None:
        return None if self.hf is None else self.hf.format(i=i)

    def gguf_name(self, i: int | None) -> str | None:
        return None if self.gguf is None else self.gguf.format(i=i)


# the names transformers and llama.cpp give the weights most families share
_L, _B = "model.layers.{i}.", "blk.{i}."


def attention_projections(config) -> list[Tensor]:
    """wq, wk, wv, wo and their biases (optional unless `config.qkv_bias`, `o_bias`), as
    transformers' `self_attn.*_proj` and llama.cpp's `attn_q`, ...: Llama's attention, which
    Gemma 3's shares."""
    L, B, qkv, o = _L, _B, not config.qkv_bias, not config.o_bias
    return [
        Tensor("wq", ("d_model", "q_dim"), L + "self_attn.q_proj.weight", B + "attn_q.weight", transposed=True),
        Tensor("wk", ("d_model", "kv_dim"), L + "self_attn.k_proj.weight", B + "attn_k.weight", transposed=True),
        Tensor("wv", ("d_model", "kv_dim"), L + "self_attn.v_proj.weight", B + "attn_v.weight", transposed=True),
        Tensor("wo", ("q_dim", "d_model"), L + "self_attn.o_proj.weight", B + "attn_output.weight", transposed=True),
        Tensor("bq", ("q_dim",), L + "self_attn.q_proj.bias", B + "attn_q.bias", optional=qkv),
        Tensor("bk", ("kv_dim",), L + "self_attn.k_proj.bias", B + "attn_k.bias", optional=qkv),
        Tensor("bv", ("kv_dim",), L + "self_attn.v_proj.bias", B + "attn_v.bias", optional=qkv),
        Tensor("bo", ("d_model",), L + "self_attn.o_proj.bias", B + "attn_output.bias", optional=o),
    ]


def gated_mlp() -> list[Tensor]:
    """w_gate, w_up, w_down: a gated MLP's matrices (`mlp.*_proj`, `ffn_*`)."""
    L, B = _L, _B
    return [
        Tensor("w_gate", ("d_model", "ffn_dim"), L + "mlp.gate_proj.weight", B + "ffn_gate.weight", transposed=True),
        Tensor("w_up", ("d_model", "ffn_dim"), L + "mlp.up_proj.weight", B + "ffn_up.weight", transposed=True),
        Tensor("w_down", ("ffn_dim", "d_model"), L + "mlp.down_proj.weight", B + "ffn_down.weight", transposed=True),
    ]


def embedding_and_head(config) -> list[Tensor]:
    """The model-level weights: the embedding table, the final norm, and the head unless it is
    tied to the embedding (`config.tie_embeddings`)."""
    out = [Tensor("embed", ("vocab_size", "d_model"), "model.embed_tokens.weight", "token_embd.weight", layer=False),
           Tensor("norm", ("d_model",), "model.norm.weight", "output_norm.weight", layer=False)]
    if not config.tie_embeddings:
        out.append(Tensor("head", ("d_model", "vocab_size"), "lm_head.weight", "output.weight", layer=False,
                          transposed=True))
    return out


def _no_transform(name, array, source, config):
    return array


@dataclass(frozen=True)
class Family:
    name: str
    kernel: Path
    hf_architectures: dict[str, str]  # architectures entry -> model_type
    gguf_architectures: tuple[str, ...]
    tensors: Callable[[DecoderConfig], list[Tensor]]
    config_from_hf: Callable
    config_from_gguf: Callable | None
    dims: Callable[[DecoderConfig], dict[str, int]]
    constants: Callable
    transform: Callable = _no_transform
    # its configs' sliding windows may be shorter than the positions asked for: the decoder windows
    # each "sliding" layer (DecoderConfig.layer_kinds); False: a folder with such a window is refused
    sliding: bool = False

    @staticmethod
    def sizes(config: DecoderConfig) -> dict[str, int]:
        """The size names a `Tensor.dims` may use."""
        return dict(d_model=config.d_model, ffn_dim=config.ffn_dim, vocab_size=config.vocab_size,
                    q_dim=config.q_dim, kv_dim=config.kv_dim, head_dim=config.head_dim)

    def layout(self, config: DecoderConfig) -> dict[str, tuple[Tensor, tuple[int, ...]]]:
        """Every weight of a model of `config`, by the decoder's name, with its shape."""
        sizes = self.sizes(config)
        specs = self.tensors(config)
        out = {t.name: (t, tuple(sizes[d] for d in t.dims)) for t in specs if t.name == "embed" and not t.layer}
        for i in range(config.n_layers):
            for t in specs:
                if t.layer:
                    out[t.key(i)] = (t, tuple(sizes[d] for d in t.dims))
        for t in specs:
            if not t.layer:
                out[t.key(None)] = (t, tuple(sizes[d] for d in t.dims))
        return out


def get(name: str) -> Family:
    """The family called `name` (a ValueError listing the others if there is none)."""
    if name not in _MODULES:
        raise ValueError(f"family: unknown model family {name!r}: Kina runs {', '.join(_MODULES)}")
    return importlib.import_module(f"{__name__}.{_MODULES[name]}").FAMILY


def all_families() -> list[Family]:
    return [get(name) for name in _MODULES]


def by_hf_architecture(arch: str) -> Family | None:
    return next((f for f in all_families() if arch in f.hf_architectures), None)


def by_gguf_architecture(arch: str) -> Family | None:
    return next((f for f in all_families() if arch in f.gguf_architectures), None)


def hf_architectures() -> list[str]:
    return [a for f in all_families() for a in f.hf_architectures]


def gguf_architectures() -> list[str]:
    return [a for f in all_families() for a in f.gguf_architectures]
