"""GGUF files in: a model's config, weights (quantized blocks kept as they are) and tokenizer.

In:  a GGUF file (version 2 or 3) as llama.cpp's converters and quantizer write it.
Out: `read(path)`: the header (kina.files.read_gguf, every count and offset checked), the family
     and its `DecoderConfig` (from the `{arch}.*` keys); `load(path, ...)`: the `Decoder`;
     `load_text(path)`: its tokenizer (kina.models.tokenizer.from_gguf), or None.

Guarantees:
  - Block-quantized matrices (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K) are handed to the model as
    `runtime.QuantizedArray`s over a memory map of the file: their values are the format's
    (kina.dtypes), exactly as `gguf.quants.dequantize` gives them; nothing is requantized. With a
    float `weight_dtype` every matrix is dequantized (or converted) to it instead. F32, F16 and
    BF16 tensors are read as they are stored, converted to the build's dtypes.
  - The family (kina.models.families, by `general.architecture`) maps the keys and undoes what
    llama.cpp's converter changed (the llama family's q/k row order); a tied head is the
    embedding table when the file has no `output.weight`.
  - A damaged or unsupported file is one `CheckpointError` naming the file and what is wrong: the
    header (kina.files), an architecture Kina does not run, a missing key or tensor, a tensor of
    the wrong shape or type, a non-finite scale or value (naming the tensor and the block) unless
    `allow_nonfinite`.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ... import dtypes, files, runtime
from ...runtime import arena
from ...runtime.quant import QuantizedArray
from .. import families
from ..decoder import DEFAULT_MAX_SEQ_LEN, Decoder, check_pass_options
from ..generation import kina_dtype
from ..weights import require_finite
from .fields import CheckpointError, Fields

# the ggml types a file's tensors may be: every dtype with a GGUF spelling
BLOCK_SIZES = {d.gguf: (d.block, d.size) for d in dtypes.DTYPES.values() if d.gguf}


def is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == files.GGUF_MAGIC
    except OSError:
        return False


def _header(path) -> files.GGUFFile:
    """The file's header (files.read_gguf), read once for the describe, the tokenizer and the load
    that `kina generate` asks for in turn (a vocabulary is 100k strings): the last one read is kept,
    and used again while the file's size, time and inode are the same."""
    global _last
    try:
        st = os.stat(path)
        stamp = (os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        stamp = None  # read_gguf says what is wrong
    if stamp is None or _last is None or _last[0] != stamp:
        try:
            header = files.read_gguf(path, "", BLOCK_SIZES)
        except files.FileError as e:
            raise CheckpointError(str(e)) from None
        _last = (stamp, header) if stamp is not None else None
        return header
    return _last[1]


_last: tuple | None = None


def read(path: str | os.PathLike):
    """(header, family, DecoderConfig) of a GGUF file; nothing of its tensors is read."""
    header = _header(path)
    f = Fields(header.metadata, path)
    arch = f.text("general.architecture", required=True)
    family = families.by_gguf_architecture(arch)
    if family is None or family.config_from_gguf is None:
        f.refuse("general.architecture", f"unsupported architecture: Kina runs {', '.join(families.gguf_architectures())}")
    try:
        config = family.config_from_gguf(Fields(header.metadata, path, prefix=f"{arch}."), arch)
    except (TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: {e}") from None
    if ROPE_FREQS in header.tensors:
        config = config.replace(rope=_rope_from_factors(header, config, path))
    has_head = any(t.gguf_name(None) in header.tensors for t in family.tensors(config.replace(tie_embeddings=False))
                   if t.name == "head")
    return header, family, config.replace(tie_embeddings=not has_head)


ROPE_FREQS = "rope_freqs.weight"
# the llama3 rope scalings of the published Llama 3.1 (factor 8) and 3.2 (32) models, and between
_LLAMA3_SCALINGS = [{"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192} for factor in (8.0, 16.0, 32.0)]


def _rope_from_factors(header, config, path):
    """The Rope whose frequencies are what llama.cpp computes from `rope_freqs.weight`: its
    converter writes a Llama 3.1 (and later) model's rope scaling as one divisor per frequency
    (`theta^(-2i/Dh) / f_i`). Divisors that are all 1 change nothing; ones that a llama3 scaling
    of the published models gives (to 1e-6) are that scaling, as the model's config.json says;
    anything else is refused, naming the tensor, rather than run with other frequencies."""
    info = header.tensors[ROPE_FREQS]
    if dtypes.by_gguf(info.type).name != "F32":
        raise CheckpointError(f"{path}: tensor {ROPE_FREQS!r} is {dtypes.by_gguf(info.type).name}, expected F32")
    factors = np.asarray(files.gguf_array(header, info, np.float32), dtype=np.float64).reshape(-1)
    base = config.rope.inv_freq(config.head_dim)
    if factors.shape != base.shape or config.rope.type != "default":
        raise CheckpointError(f"{path}: tensor {ROPE_FREQS!r} ({factors.size} values) does not fit this model's rotary "
                              f"embedding ({base.size} frequencies, rope type {config.rope.type}); Kina cannot run it")
    if np.all(factors == 1):
        return config.rope
    for scaling in _LLAMA3_SCALINGS:
        rope = config.rope.of(config.rope.theta, scaling)
        if np.allclose(base / factors, rope.inv_freq(config.head_dim), rtol=1e-6, atol=0):
            return rope
    raise CheckpointError(f"{path}: tensor {ROPE_FREQS!r} holds rotary frequency divisors that no llama3 rope "
                          f"scaling Kina knows gives (factor 8, 16 or 32 over 8192 positions); Kina cannot run it")


def load_text(path: str | os.PathLike):
    """The file's tokenizer, or None when it has none."""
    header = _header(path)
    if "tokenizer.ggml.tokens" not in header.metadata:
        return None
    from ..tokenizer import from_gguf
    return from_gguf(header.metadata, path)


def _scales_finite(q: QuantizedArray, where: str) -> None:
    """Refuse a block whose scale (an F16 field) is NaN or infinite, naming the tensor and the block."""
    fmt = q.format
    blocks = q.data.reshape(-1, fmt.size)
    for offset in fmt.f16_fields:
        d = blocks[:, offset:offset + 2].copy().view(np.float16)[:, 0]
        bad = ~np.isfinite(d)
        if bad.any():
            first = int(np.argmax(bad))
            per_row = q.data.shape[-1] // fmt.size
            raise CheckpointError(f"{where} ({fmt.name}) has {int(bad.sum())} blocks with a NaN or infinite scale, "
                                  f"the first block {first % per_row} of row {first // per_row}; pass "
                                  "allow_nonfinite=True (kina generate --allow-nonfinite) to load it anyway")


def load(path: str | os.PathLike, dtype=None, max_seq_len: int | None = None, allow_nonfinite: bool = False,
         fma: bool = True, weight_dtype=None, pass_options: str = "", threads: int | None = None) -> Decoder:
    """The Decoder of a GGUF file: activations, norms and caches in `dtype` (default float32);
    the matrices as the file has them (block formats kept, F16/BF16 kept against F32
    activations) or, with `weight_dtype`, all of them converted to that float dtype;
    `max_seq_len` (default the model's context, at most DEFAULT_MAX_SEQ_LEN)."""
    path = Path(path)
    header, family, config = read(path)
    dt = kina_dtype(np.float32 if dtype is None else dtype)
    wdt = None if weight_dtype is None else kina_dtype(weight_dtype, "weight_dtype")
    check_pass_options(pass_options)
    if max_seq_len is None:
        max_seq_len = min(config.context_length, DEFAULT_MAX_SEQ_LEN)
    layout = family.layout(config)
    wanted = {}
    for name, (t, shape) in layout.items():
        i = int(name.split(".")[1]) if t.layer else None
        wanted[t.gguf_name(i)] = (name, t, shape)
    for gname, info in header.tensors.items():
        if gname not in wanted and gname != ROPE_FREQS:
            raise CheckpointError(f"{path}: unexpected tensor {gname!r}: not a weight of this {family.name} model "
                                  f"({config.n_layers} layers)")
    floats = {}  # the decoder's name -> (GGUFTensor, Tensor, the kernel's shape, the dtype it is held in)
    weights = {}
    for gname, (name, t, shape) in wanted.items():
        info = header.tensors.get(gname)
        if info is None:
            if t.optional:
                continue
            raise CheckpointError(f"{path}: tensor {gname!r} is missing (the {name} of this {family.name} model)")
        stored = shape[::-1] if t.transposed else shape
        if info.shape != stored:
            raise CheckpointError(f"{path}: tensor {gname!r} has shape {list(info.shape)}, expected {list(stored)} "
                                  f"(from the file's {family.name}.* keys)")
        kind = dtypes.by_gguf(info.type)
        if kind.blocked and t.matrix and wdt is None:
            data = family.transform(name, files.gguf_array(header, info), "gguf", config)
            q = QuantizedArray(kind.name, stored[::-1], data)
            if not allow_nonfinite:
                _scales_finite(q, f"{path}: tensor {gname!r}")
            weights[name] = q
            continue
        held = (wdt or _float_weight_dtype(kind, dt)) if t.matrix else dt
        floats[name] = (info, t, shape, held, kind)
    block = arena.arrays({name: (shape, held) for name, (_, _, shape, held, _) in floats.items()})
    for name, (info, t, shape, held, kind) in floats.items():
        if kind.blocked:
            values = QuantizedArray(kind.name, info.shape[::-1], files.gguf_array(header, info)).rows()
        else:
            values = files.gguf_array(header, info, runtime.numpy_dtype(kind.name))
        values = family.transform(name, values, "gguf", config)
        out = block[name]
        with np.errstate(over="ignore"):
            out[...] = values.T if t.transposed else values
        if not allow_nonfinite:
            try:
                require_finite(out.T if t.transposed else out, f"{path}: tensor {info.name!r}",
                               "pass allow_nonfinite=True (kina generate --allow-nonfinite) to load it anyway", values)
            except ValueError as e:
                raise CheckpointError(str(e)) from None
        weights[name] = out
    model = Decoder(config, weights, max_seq_len=max_seq_len, dtype=dt, weight_dtype=wdt, fma=fma, threads=threads,
                    pass_options=pass_options, allow_nonfinite=True, copy=False)
    model.architecture, model.checkpoint_dtype, model.source = header.metadata.get("general.architecture"), None, path
    return model


def _float_weight_dtype(kind, dt: np.dtype) -> np.dtype:
    """The dtype a float matrix of the file is held in when `weight_dtype` is not given: F16 or BF16
    as stored against F32 activations (half the bytes, each weight widened exactly), else `dt`."""
    if kind.name in ("F16", "BF16") and dt == np.float32:
        return runtime.numpy_dtype(kind.name)
    return dt
