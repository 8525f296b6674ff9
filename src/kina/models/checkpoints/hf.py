"""Hugging Face model folders in: config.json and safetensors weights, to a `Decoder`.

In:  a folder as `save_pretrained` writes it (or as the Hub hands it out): config.json, and
     model.safetensors or the shards model.safetensors.index.json lists.
Out: `read_config(folder)`: the family and its `DecoderConfig`, with the architecture and the
     checkpoint's dtype; `read_tensors(folder)`: every tensor, memory-mapped; `load(folder, ...)`:
     the `Decoder` that computes what transformers' model computes from that folder.

Guarantees:
  - Nothing here needs torch or transformers: safetensors files are read by their own header
    through a memory map (kina.files), BF16 as ml_dtypes.bfloat16. Linear weights, stored
    [out, in], are transposed into the kernel's [in, out] once, on load, converted to the
    build's dtypes (default float32, whatever the file holds), straight into the model's block.
  - The architecture picks the family (kina.models.families); the family maps the config,
    honouring or refusing (naming the field) everything that changes the math.
  - A folder that does not fit is a `CheckpointError` (a ValueError) naming the file and the
    field or tensor: a missing file, a missing, unexpected or misshapen tensor, a NaN.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ... import files, runtime
from ...runtime import arena
from .. import families
from ..decoder import DEFAULT_MAX_SEQ_LEN, Decoder, check_pass_options, weight_dtype_of
from ..generation import kina_dtype
from ..weights import dtype_of, require_finite
from .fields import CheckpointError, Fields

CONFIG_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}  # (ml_dtypes when asked for)


def is_folder(path: Path) -> bool:
    return path.is_dir()


def read_config(folder: str | os.PathLike):
    """(family, DecoderConfig, info) of a folder's config.json; `info` has "architecture" and
    "dtype" (the checkpoint's, a NumPy dtype or None)."""
    path = Path(folder) / "config.json"
    f = Fields(_read_json(path), path)
    archs = f.get("architectures", required=True)
    family = families.by_hf_architecture(archs[0]) if isinstance(archs, list) and len(archs) == 1 and \
        isinstance(archs[0], str) else None
    if family is None:
        f.refuse("architectures", f"unsupported architecture: Kina runs {', '.join(families.hf_architectures())}")
    arch = archs[0]
    if f.get("model_type", family.hf_architectures[arch]) != family.hf_architectures[arch]:
        f.refuse("model_type", f"expected {family.hf_architectures[arch]!r} for {arch}")
    if f.get("quantization_config") is not None:
        f.refuse("quantization_config", "not supported (Kina reads GGUF files for quantized models)")
    dtype = f.get("dtype", f.get("torch_dtype"))
    if dtype is not None and dtype not in CONFIG_DTYPES:
        f.refuse("dtype" if f.has("dtype") else "torch_dtype", f"expected one of {', '.join(CONFIG_DTYPES)}")
    config = family.config_from_hf(f, arch)
    held = None if dtype is None else runtime.numpy_dtype(CONFIG_DTYPES[dtype])
    return family, config, {"architecture": arch, "dtype": held, "fields": f}


def _read_json(path: Path) -> dict:
    try:
        value = files.read_json(path)
    except files.FileError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of one .safetensors file, by name: read-only views of a memory map, every
    header entry checked against the file's size first (kina.files)."""
    try:
        return files.read_safetensors(path, mmap=True)
    except files.FileError as e:
        raise CheckpointError(str(e)) from None


def read_tensors(folder: Path) -> dict[str, tuple[np.ndarray, Path]]:
    """Every tensor of the folder's checkpoint, with the file it is in: model.safetensors, or the
    shards model.safetensors.index.json maps each name to."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: field 'weight_map' is missing")
        out = {}
        for shard in sorted(set(weight_map.values())):
            for name, a in read_safetensors(folder / shard).items():
                out[name] = (a, folder / shard)
        for name, shard in weight_map.items():
            if name not in out:
                raise CheckpointError(f"{index}: tensor {name!r} is mapped to {shard}, which does not hold it")
        return out
    if single.is_file():
        return {name: (a, single) for name, a in read_safetensors(single).items()}
    raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json "
                          f"(Kina reads safetensors checkpoints, not .bin or .pt)")


def max_positions(config, f: Fields, max_seq_len: int | None, sliding: bool) -> int:
    """The positions to build for: `max_seq_len`, or the model's context (at most
    DEFAULT_MAX_SEQ_LEN); a family whose kernel has no sliding window refuses more positions
    than a window the config sets."""
    window = config.sliding_window
    if max_seq_len is None:
        max_seq_len = min(config.context_length, DEFAULT_MAX_SEQ_LEN, window if window and not sliding else 1 << 62)
    if window is not None and not sliding and max_seq_len > window:
        f.refuse("sliding_window", f"attention is limited to {window} positions, fewer than the {max_seq_len} asked "
                                   "for; Kina has no sliding-window attention for this family")
    return max_seq_len


def load(folder: str | os.PathLike, dtype=None, max_seq_len: int | None = None, allow_nonfinite: bool = False,
         fma: bool = True, weight_dtype=None, pass_options: str = "", threads: int | None = None) -> Decoder:
    """The Decoder of a Hugging Face folder, its weights converted to `dtype` (default float32)
    and projections transposed to [in, out]; `weight_dtype` (float16 or bfloat16 with dtype
    float32) holds the matrices narrower; `max_seq_len` (default the config's
    max_position_embeddings, at most DEFAULT_MAX_SEQ_LEN) bounds the positions. A weight that
    holds NaN or infinity (in the file, or after the conversion, as an F32 value past F16's
    range) is refused, naming the tensor and its file, unless `allow_nonfinite`. `fma` and
    `pass_options`: the Decoder's."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such model folder")
    family, config, info = read_config(folder)
    max_seq_len = max_positions(config, info["fields"], max_seq_len, family.sliding)
    dt = kina_dtype(np.float32 if dtype is None else dtype)
    wdt = weight_dtype_of(dt, weight_dtype)
    check_pass_options(pass_options)  # before the tensors are read
    layout = family.layout(config)
    tensors = read_tensors(folder)
    wanted = {}  # HF name -> (the decoder's name, shape as stored, Tensor)
    for name, (t, shape) in layout.items():
        i = int(name.split(".")[1]) if t.layer else None
        wanted[t.hf_name(i)] = (name, shape[::-1] if t.transposed else shape, t)
    ignored = {"lm_head.weight"} if config.tie_embeddings else set()  # a tied head may be saved too
    for hf, (a, path) in tensors.items():
        if hf not in wanted and hf not in ignored and not hf.endswith("rotary_emb.inv_freq"):
            raise CheckpointError(f"{path}: unexpected tensor {hf!r}: not a weight of this {info['architecture']} "
                                  f"(config.json: {config.n_layers} layers, "
                                  f"{'with' if config.qkv_bias else 'no'} q/k/v biases)")
    present = {hf: w for hf, w in wanted.items() if hf in tensors or not w[2].optional}
    block = arena.arrays({name: (layout[name][1], dtype_of(t, dt, wdt)) for name, _, t in present.values()})
    weights = {}
    for hf, (name, shape, t) in present.items():
        if hf not in tensors:
            where = folder / ("model.safetensors.index.json" if (folder / "model.safetensors.index.json").is_file()
                              else "model.safetensors")
            raise CheckpointError(f"{where}: tensor {hf!r} is missing; expected shape {list(shape)}")
        a, path = tensors[hf]
        if a.shape != shape:
            raise CheckpointError(f"{path}: tensor {hf!r} has shape {list(a.shape)}, expected {list(shape)} "
                                  f"(from config.json)")
        a = family.transform(name, a, "hf", config)
        out = block[name]
        with np.errstate(over="ignore"):
            out[...] = a.T if t.transposed else a  # converted element by element, no temporary copy
        if not allow_nonfinite:
            try:
                require_finite(out.T if t.transposed else out, f"{path}: tensor {hf!r}",  # in the file's layout
                               "pass allow_nonfinite=True (kina generate --allow-nonfinite) to load it anyway", a)
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        weights[name] = out
    model = Decoder(config, weights, max_seq_len=max_seq_len, dtype=dt, weight_dtype=wdt, fma=fma,
                    threads=threads, pass_options=pass_options, allow_nonfinite=True, copy=False)
    model.architecture, model.checkpoint_dtype, model.source = info["architecture"], info["dtype"], folder
    return model
