"""The numbers of a decoder-only transformer, and nothing else.

In:  an architecture's sizes and settings, as a checkpoint reader maps them from its
     file (config.json, GGUF keys) or a user writes them.
Out: `DecoderConfig`, a frozen, hashable record, and `Rope`, its rotary embedding.
     `DecoderConfig.storylm0()` is the StoryLM-0 configuration.

Guarantees: a record that exists is consistent (every size positive, heads that
divide, an even head width, a known family and rope type); a bad value is a
TypeError or ValueError naming the field. The record says what the model computes,
never how Kina builds or runs it (dtypes, threads, passes are `decoder.Build`) or
where its weights come from. Family-specific numbers (a sliding window, the kind of
each layer, a second rotary base) have defaults that mean "as Llama does".
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields, replace

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3")
_ROPE_NEEDS = {"default": (), "linear": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def _count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite number > 0, got {value}")
    return float(value)


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding: inverse frequencies theta^(-2i/Dh), scaled as transformers'
    rope types say ("linear": divided by `factor`; "llama3": long wavelengths divided by
    `factor`, short ones kept, a smooth blend between). `params` holds the type's numbers as
    sorted (name, value) pairs, so the record stays hashable."""

    theta: float = 10000.0
    type: str = "default"
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "theta", _positive("rope_theta", self.theta))
        if self.type not in ROPE_TYPES:
            raise ValueError(f"rope_scaling: unknown rope_type {self.type!r}: expected one of {', '.join(ROPE_TYPES)}")
        given = dict(self.params)
        for key in _ROPE_NEEDS[self.type]:
            if key not in given:
                raise ValueError(f"rope_scaling: rope_type {self.type!r} needs {key!r}")
            _positive(f"rope_scaling[{key!r}]", given[key])
        object.__setattr__(self, "params", tuple(sorted((k, float(given[k])) for k in _ROPE_NEEDS[self.type])))

    @staticmethod
    def of(theta: float = 10000.0, scaling=None) -> "Rope":
        """From transformers' spelling: `rope_theta` and a `rope_scaling` dict (or None)."""
        scaling = dict(scaling or {})
        kind = scaling.pop("rope_type", scaling.pop("type", "default"))
        return Rope(theta, kind, tuple((k, v) for k, v in scaling.items() if k in _ROPE_NEEDS.get(kind, ())))

    @property
    def scaling(self) -> dict | None:
        """transformers' rope_scaling dict, or None for the default type."""
        return None if self.type == "default" else {"rope_type": self.type, **dict(self.params)}

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """The inverse frequencies [head_dim / 2], float64."""
        inv = self.theta ** (-2 * np.arange(head_dim // 2, dtype=np.float64) / head_dim)
        p = dict(self.params)
        if self.type == "linear":
            return inv / p["factor"]
        if self.type == "llama3":
            factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
            old = p["original_max_position_embeddings"]
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > old / low, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= old / high) & (wavelen <= old / low)
            return np.where(medium, smoothed, scaled)
        return inv

    def tables(self, head_dim: int, positions: int, dtype) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin [positions, head_dim / 2] in `dtype`, each computed in float64 and rounded once."""
        angle = np.arange(positions, dtype=np.float64)[:, None] * self.inv_freq(head_dim)[None, :]
        return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


@dataclass(frozen=True)
class DecoderConfig:
    """A decoder-only transformer's architecture (its family says how the numbers are used).

    Sizes: `vocab_size` V, `d_model` D, `n_layers`, `n_heads` query heads and `n_kv_heads`
    key/value heads (grouped-query attention; default `n_heads`) of `head_dim` Dh (default
    D / n_heads), the MLP width `ffn_dim` F, and `context_length`, the positions the model
    was trained for. Settings: `norm_eps`, `rope`, q/k/v and o biases, a head tied to the
    embedding table. Family numbers (Gemma 3): `sliding_window` (None: every layer attends to
    every position), `layer_kinds` ("full" or "sliding" per layer; empty: all full),
    `rope_local` (the sliding layers' rotary embedding; None: `rope`), `attn_scale` (None:
    1/sqrt(head_dim)), `embed_scale` (the embedding rows' factor; None: 1)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    ffn_dim: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    context_length: int = 4096
    norm_eps: float = 1e-6
    rope: Rope = field(default_factory=Rope)
    qkv_bias: bool = False
    o_bias: bool = False
    tie_embeddings: bool = False
    family: str = "llama"
    sliding_window: int | None = None
    layer_kinds: tuple[str, ...] = ()
    rope_local: Rope | None = None
    attn_scale: float | None = None
    embed_scale: float | None = None

    def __post_init__(self):
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_dim", "context_length"):
            put(name, _count(name, getattr(self, name)))
        put("n_kv_heads", self.n_heads if self.n_kv_heads is None else _count("n_kv_heads", self.n_kv_heads))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads: n_heads = {self.n_heads} is not a multiple of n_kv_heads = {self.n_kv_heads}")
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model: {self.d_model} is not a multiple of n_heads = {self.n_heads} "
                                 "(give head_dim)")
            put("head_dim", self.d_model // self.n_heads)
        put("head_dim", _count("head_dim", self.head_dim))
        if self.head_dim % 2:
            raise ValueError(f"head_dim: the head width head_dim = {self.head_dim} must be even "
                             "(rotary embedding splits each head in two halves)")
        put("norm_eps", _positive("norm_eps", self.norm_eps))
        for name in ("rope", "rope_local"):
            value = getattr(self, name)
            if not isinstance(value, Rope) and (name == "rope" or value is not None):
                raise TypeError(f"{name}: expected a kina.models.config.Rope, got {type(value).__name__}")
        for name in ("qkv_bias", "o_bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected True or False, got {type(getattr(self, name)).__name__}")
        if self.sliding_window is not None:
            put("sliding_window", _count("sliding_window", self.sliding_window))
        kinds = tuple(self.layer_kinds)
        if kinds and (len(kinds) != self.n_layers or not set(kinds) <= {"full", "sliding"}):
            raise ValueError(f"layer_kinds: expected {self.n_layers} entries, each 'full' or 'sliding', got {kinds}")
        if "sliding" in kinds and self.sliding_window is None:
            raise ValueError("layer_kinds: sliding layers need a sliding_window")
        put("layer_kinds", kinds)
        for name in ("attn_scale", "embed_scale"):
            if getattr(self, name) is not None:
                put(name, _positive(name, getattr(self, name)))

    # -- derived sizes --------------------------------------------------------------------
    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def kind(self, layer: int) -> str:
        """"full" or "sliding": what layer `layer` attends to."""
        return self.layer_kinds[layer] if self.layer_kinds else "full"

    def replace(self, **changes) -> "DecoderConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields as plain values (rope as theta and scaling), for printing and JSON."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("rope", "rope_local"):
            r = out.pop(name)
            if r is not None:
                out[f"{name}_theta"], out[f"{name}_scaling"] = r.theta, r.scaling
        out["layer_kinds"] = list(self.layer_kinds)
        return out

    @staticmethod
    def storylm0(vocab_size: int = 4096) -> "DecoderConfig":
        """StoryLM-0: d_model 512, 8 heads of 64, 4 layers, MLP width 1408, multi-head attention,
        no biases, an untied head, rope theta 10000 (the benchmark shape of its decoder step,
        examples/storylm0_decoder_step.kina)."""
        return DecoderConfig(vocab_size=vocab_size, d_model=512, n_layers=4, n_heads=8, ffn_dim=1408,
                             context_length=4096, norm_eps=1e-6)
