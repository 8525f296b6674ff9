"""Hugging Face model folders in: a Llama-family checkpoint as a StoryLM.

In:  a folder as `save_pretrained` writes it (or as the Hub hands it out):
     config.json, and model.safetensors or shards listed by
     model.safetensors.index.json; for text, tokenizer.json with
     tokenizer_config.json and generation_config.json when present.
Out: `load_pretrained(folder, dtype=None, max_seq_len=None, weight_dtype=None)`, the `StoryLM`
     (kina.models.storylm) that computes what transformers' LlamaForCausalLM,
     MistralForCausalLM or Qwen2ForCausalLM computes from that folder; `read_config`
     (the checked config as StoryLM's options); `load_tokenizer(folder)`, a `Text`
     holding the `tokenizers.Tokenizer` and the BOS/EOS ids.

Guarantees:
  - Nothing here needs torch or transformers: safetensors files are read by their
    own header (8-byte length, JSON, raw little-endian data) through a memory map,
    BF16 as ml_dtypes.bfloat16. Linear weights, stored [out, in], are transposed
    into StoryLM's [in, out] once, on load, converted to `dtype` (default float32,
    whatever the file holds); a tied head is the embedding table itself.
  - Every config field that changes the math is honoured or refused: the
    architecture, hidden_act (silu only), the rope type (default, linear, llama3;
    from `rope_parameters`, transformers 5, or top-level rope_theta/rope_scaling),
    partial rotary, attention_bias (q/k/v/o biases, honoured) and mlp_bias
    (refused), head_dim, rms_norm_eps, tie_word_embeddings, quantization, and a
    sliding window smaller than the positions asked for (refused: the model would
    attend past the window).
  - A folder that does not fit is a `CheckpointError` (a ValueError) naming the
    file and the field or tensor: a missing file, a missing or unexpected tensor, a
    wrong shape, an unsupported architecture or setting.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from .. import files, runtime
from ..runtime import arena
from .common import kina_dtype
from .storylm import ROPE_TYPES, StoryLM, check_pass_options, tensor_dtype, weight_dtype_of, weight_layout

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
DEFAULT_MAX_SEQ_LEN = 4096  # the rotary tables' length when max_seq_len is not given (capped by the config's)

_CONFIG_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
                  "float64": np.float64}


class CheckpointError(ValueError):
    """A model folder that Kina cannot run: the message names the file and the field or tensor."""


# -- config.json -------------------------------------------------------------------------

def read_config(folder: str | os.PathLike, max_seq_len: int | None = None) -> dict:
    """config.json, checked, as StoryLM's keyword arguments (without weights and dtype),
    plus "architecture", "dtype" (the checkpoint's, a NumPy dtype or None) and
    "sliding_window"."""
    path = Path(folder) / "config.json"
    c = _read_json(path)

    def field(name, default=None, required=False):
        if name not in c or c[name] is None:
            if required:
                raise CheckpointError(f"{path}: field {name!r} is missing")
            return default
        return c[name]

    def refuse(name, why):
        raise CheckpointError(f"{path}: field {name!r} = {json.dumps(c.get(name))}: {why}")

    archs = field("architectures", required=True)
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        refuse("architectures", f"unsupported architecture: Kina runs {', '.join(ARCHITECTURES)}")
    arch = archs[0]
    if field("model_type", ARCHITECTURES[arch]) != ARCHITECTURES[arch]:
        refuse("model_type", f"expected {ARCHITECTURES[arch]!r} for {arch}")
    if field("hidden_act", "silu") != "silu":
        refuse("hidden_act", "only silu (SwiGLU) is supported")
    if field("mlp_bias", False):
        refuse("mlp_bias", "MLP biases are not supported")
    for name in ("quantization_config", "attn_logit_softcapping", "final_logit_softcapping"):
        if field(name) is not None:
            refuse(name, "not supported")
    if field("pretraining_tp", 1) != 1:
        refuse("pretraining_tp", "only 1 is supported")

    def integer(name, **kw):
        v = field(name, **kw)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            refuse(name, "expected a positive integer")
        return v

    sizes = {k: integer(k, required=True) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                    "num_hidden_layers", "num_attention_heads")}
    heads = sizes["num_attention_heads"]
    kv_heads = integer("num_key_value_heads") or heads
    if heads % kv_heads:
        refuse("num_key_value_heads", f"num_attention_heads = {heads} is not a multiple of it")
    head_dim = integer("head_dim")
    if head_dim is None:
        if sizes["hidden_size"] % heads:
            refuse("hidden_size", f"not a multiple of num_attention_heads = {heads}, and there is no head_dim")
        head_dim = sizes["hidden_size"] // heads
    if head_dim % 2:
        refuse("head_dim", "must be even (rotary embedding splits each head in two halves)")
    eps = field("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        refuse("rms_norm_eps", "expected a number > 0")

    # rope: transformers 5 writes rope_parameters; older files a top-level rope_theta and rope_scaling
    rope = dict(field("rope_parameters", {}) or {})
    where = "rope_parameters"
    if not rope:
        rope = dict(field("rope_scaling", {}) or {})
        where = "rope_scaling"
        rope.setdefault("rope_theta", field("rope_theta", 10000.0))
    if "type" in rope and "rope_type" not in rope:  # the older spelling
        rope["rope_type"] = rope.pop("type")
    kind = rope.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise CheckpointError(f"{path}: field {where!r}: rope_type {kind!r} is not supported "
                              f"(Kina computes {', '.join(ROPE_TYPES)})")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{path}: field {where!r}: partial_rotary_factor "
                              f"{rope['partial_rotary_factor']} is not supported (only 1.0)")
    needed = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                "original_max_position_embeddings")}.get(kind, ())
    for key in needed:
        if not isinstance(rope.get(key), (int, float)) or isinstance(rope.get(key), bool):
            raise CheckpointError(f"{path}: field {where!r}: rope_type {kind!r} needs a number {key!r}")
    theta = rope.get("rope_theta", field("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or not theta > 0:
        raise CheckpointError(f"{path}: field {where!r}: rope_theta must be a number > 0, got {theta!r}")

    # sliding window: Mistral's applies whenever set; Qwen2's only with use_sliding_window
    window = field("sliding_window")
    if arch == "Qwen2ForCausalLM" and not field("use_sliding_window", False):
        window = None
    limit = integer("max_position_embeddings") or DEFAULT_MAX_SEQ_LEN
    if max_seq_len is None:
        max_seq_len = min(limit, DEFAULT_MAX_SEQ_LEN, window or limit)
    if window is not None and max_seq_len > window:
        refuse("sliding_window", f"attention is limited to {window} positions, fewer than the "
                                 f"{max_seq_len} asked for; Kina has no sliding-window attention")

    dtype = field("dtype", field("torch_dtype"))
    if dtype is not None and dtype not in _CONFIG_DTYPES:
        refuse("dtype" if "dtype" in c else "torch_dtype", f"expected one of {', '.join(_CONFIG_DTYPES)}")
    attention_bias = bool(field("attention_bias", False))
    return dict(architecture=arch, dtype=_CONFIG_DTYPES.get(dtype), sliding_window=window,
                vocab_size=sizes["vocab_size"], d_model=sizes["hidden_size"], n_heads=heads,
                n_layers=sizes["num_hidden_layers"], ffn_dim=sizes["intermediate_size"], max_seq_len=max_seq_len,
                eps=float(eps), rope_theta=float(theta), n_kv_heads=kv_heads, head_dim=head_dim,
                qkv_bias=attention_bias or arch == "Qwen2ForCausalLM", o_bias=attention_bias,
                tie_embeddings=bool(field("tie_word_embeddings", False)),
                rope_scaling=None if kind == "default" else {k: rope[k] for k in ("rope_type", *needed)})


def _read_json(path: Path) -> dict:
    try:
        return files.read_json(path)
    except files.FileError as e:
        raise CheckpointError(str(e)) from None


# -- safetensors ---------------------------------------------------------------------------

def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of one .safetensors file, by name: read-only views of a memory map,
    every header entry checked against the file's size first (kina.files)."""
    try:
        return files.read_safetensors(path, mmap=True)
    except files.FileError as e:
        raise CheckpointError(str(e)) from None


def read_tensors(folder: Path) -> dict[str, tuple[np.ndarray, Path]]:
    """Every tensor of the folder's checkpoint, with the file it is in: model.safetensors,
    or the shards model.safetensors.index.json maps each name to."""
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: field 'weight_map' is missing")
        out = {}
        for shard in sorted(set(weight_map.values())):
            tensors = read_safetensors(folder / shard)
            for name, a in tensors.items():
                out[name] = (a, folder / shard)
        for name, shard in weight_map.items():
            if name not in out:
                raise CheckpointError(f"{index}: tensor {name!r} is mapped to {shard}, which does not hold it")
        return out
    if single.is_file():
        return {name: (a, single) for name, a in read_safetensors(single).items()}
    raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json "
                          f"(Kina reads safetensors checkpoints, not .bin or .pt)")


# -- the model -------------------------------------------------------------------------------

# StoryLM's tensor <- (Hugging Face's tensor, transposed?) per layer, then for the whole model
_LAYER_NAMES = {"attn_norm": ("input_layernorm.weight", False), "wq": ("self_attn.q_proj.weight", True),
                "wk": ("self_attn.k_proj.weight", True), "wv": ("self_attn.v_proj.weight", True),
                "wo": ("self_attn.o_proj.weight", True), "bq": ("self_attn.q_proj.bias", False),
                "bk": ("self_attn.k_proj.bias", False), "bv": ("self_attn.v_proj.bias", False),
                "bo": ("self_attn.o_proj.bias", False), "mlp_norm": ("post_attention_layernorm.weight", False),
                "w_gate": ("mlp.gate_proj.weight", True), "w_up": ("mlp.up_proj.weight", True),
                "w_down": ("mlp.down_proj.weight", True)}
_MODEL_NAMES = {"embed": ("model.embed_tokens.weight", False), "norm": ("model.norm.weight", False),
                "head": ("lm_head.weight", True)}


def hf_name(name: str) -> tuple[str, bool]:
    """The Hugging Face tensor behind a StoryLM weight name, and whether it is stored transposed."""
    if name.startswith("layers."):
        _, i, short = name.split(".")
        hf, transposed = _LAYER_NAMES[short]
        return f"model.layers.{i}.{hf}", transposed
    return _MODEL_NAMES[name]


def load_pretrained(folder: str | os.PathLike, dtype=None, max_seq_len: int | None = None,
                    allow_nonfinite: bool = False, fma: bool = False, weight_dtype=None,
                    pass_options: str = "") -> StoryLM:
    """The StoryLM of a Hugging Face Llama, Mistral or Qwen2 folder, its weights converted to
    `dtype` (default float32) and projections transposed to [in, out]; `weight_dtype`
    (float16 or bfloat16 with dtype float32: StoryLM's) holds the matrices narrower,
    the activations, norms and biases staying in `dtype`; `max_seq_len`
    (default the config's max_position_embeddings, at most DEFAULT_MAX_SEQ_LEN) bounds
    the positions. A weight that holds NaN or infinity (in the file, or after the
    conversion to `dtype`, as an F32 value past F16's range) is refused, naming the
    tensor and its file, unless `allow_nonfinite`. `fma`: the matmuls round each
    multiply-add once (StoryLM's `fma`); `pass_options`: StoryLM's, more options for the build's passes."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such model folder")
    options = read_config(folder, max_seq_len)
    arch, stored, window = options.pop("architecture"), options.pop("dtype"), options.pop("sliding_window")
    dt = kina_dtype(np.float32 if dtype is None else dtype)
    wdt = weight_dtype_of(dt, weight_dtype)
    check_pass_options(pass_options)  # before the tensors are read
    layout = weight_layout(options["n_layers"], options["qkv_bias"], options["o_bias"], options["tie_embeddings"])
    D, F, V = options["d_model"], options["ffn_dim"], options["vocab_size"]
    Q, KV = options["n_heads"] * options["head_dim"], options["n_kv_heads"] * options["head_dim"]
    sizes = dict(d_model=D, ffn_dim=F, vocab_size=V, q_dim=Q, kv_dim=KV)
    tensors = read_tensors(folder)
    wanted = {}
    for name, dims in layout.items():
        hf, transposed = hf_name(name)
        shape = tuple(sizes[d] for d in dims)
        wanted[hf] = (name, shape[::-1] if transposed else shape, transposed)
    ignored = {"lm_head.weight"} if options["tie_embeddings"] else set()  # a tied head may be saved too
    for hf, (a, path) in tensors.items():
        if hf not in wanted and hf not in ignored and not hf.endswith("rotary_emb.inv_freq"):
            raise CheckpointError(f"{path}: unexpected tensor {hf!r}: not a weight of this {arch} "
                                  f"(config.json: {options['n_layers']} layers, "
                                  f"{'with' if options['qkv_bias'] else 'no'} q/k/v biases)")
    weights = {}
    block = arena.arrays({name: (shape[::-1] if transposed else shape, tensor_dtype(shape, dt, wdt))
                          for name, shape, transposed in wanted.values()})
    for hf, (name, shape, transposed) in wanted.items():
        if hf not in tensors:
            where = folder / ("model.safetensors.index.json" if (folder / "model.safetensors.index.json").is_file()
                              else "model.safetensors")
            raise CheckpointError(f"{where}: tensor {hf!r} is missing; expected shape {list(shape)}")
        a, path = tensors[hf]
        if a.shape != shape:
            raise CheckpointError(f"{path}: tensor {hf!r} has shape {list(a.shape)}, expected {list(shape)} "
                                  f"(from config.json)")
        out = block[name]
        with np.errstate(over="ignore"):
            out[...] = a.T if transposed else a  # converted element by element, no temporary copy
        if not allow_nonfinite:
            _require_finite(out.T if transposed else out, f"{path}: tensor {hf!r}", a)  # in the file's layout
        weights[name] = out
    model = StoryLM(**options, dtype=dt, weights=weights, _own_weights=True, allow_nonfinite=True, fma=fma,
                    weight_dtype=wdt, pass_options=pass_options)
    model.architecture, model.checkpoint_dtype, model.sliding_window, model.folder = arch, stored, window, folder
    return model


def _require_finite(a: np.ndarray, where: str, stored: np.ndarray) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        how = "holds NaN or infinity" if not np.isfinite(stored).all() else \
            f"overflows {a.dtype} (a value past its range)"
        raise CheckpointError(f"{where} {how}: {int(bad.sum())} of {a.size} values are not finite, the first at "
                              f"index {list(first)}; pass allow_nonfinite=True (kina generate "
                              "--allow-nonfinite) to load it anyway")


# -- text ---------------------------------------------------------------------------------

@dataclass
class Text:
    """A folder's tokenizer (`tokenizers.Tokenizer`) and special ids: `bos_id` (prepended
    to an encoded prompt when the tokenizer's own post-processor does not add it and
    tokenizer_config.json's add_bos_token asks for it), `eos_ids` (generation stops at
    any of them: generation_config.json's eos_token_id, else config.json's, else
    tokenizer_config.json's eos_token)."""

    tokenizer: object
    bos_id: int | None
    eos_ids: tuple[int, ...]
    add_bos: bool

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text).ids
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(folder: str | os.PathLike) -> Text:
    """The folder's tokenizer.json (read by the `tokenizers` package) and special ids."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.exists():
        raise CheckpointError(f"{path}: no such file (pass token ids instead, or add the model's tokenizer)")
    try:
        text = files.read_text(path, limit=1 << 30)  # a directory, a binary or a huge file
    except files.FileError as e:
        raise CheckpointError(str(e)) from None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise CheckpointError("reading tokenizer.json needs the tokenizers package (pip install tokenizers)") from None
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as e:  # the Rust side raises its own Exception type
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path}: not a tokenizer the tokenizers package reads ({reason})") from None
    tc = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    gc = _read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
    cc = _read_json(folder / "config.json") if (folder / "config.json").is_file() else {}

    def token_id(value):
        if isinstance(value, dict):  # an AddedToken written out
            value = value.get("content")
        return tokenizer.token_to_id(value) if isinstance(value, str) else None

    def ids(value):
        if value is None:
            return ()
        return tuple(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))

    bos = gc.get("bos_token_id", cc.get("bos_token_id"))
    if not isinstance(bos, int):
        bos = token_id(tc.get("bos_token"))
    eos = ids(gc.get("eos_token_id")) or ids(cc.get("eos_token_id"))
    if not eos and token_id(tc.get("eos_token")) is not None:
        eos = (token_id(tc.get("eos_token")),)
    add_bos = bool(tc.get("add_bos_token", False))
    return Text(tokenizer, bos, eos, add_bos)
