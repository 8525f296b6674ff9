"""One model, three engines: Kina, transformers and llama.cpp (bench_model.py).

In:  a shape (SHAPES: the LlamaConfig fields), a seed and a folder, or a GGUF file; a prompt
     of token ids and a number of tokens to generate.
Out: build_folder() writes a LlamaForCausalLM of seeded random weights with
     save_pretrained (F32; gains and biases perturbed, so nothing is trivially 1 or 0);
     write_gguf() writes the same tensors as a llama.cpp GGUF file (F32, F16, BF16 or a
     block format); weight_bytes() is what one decode step reads; and the engines, each with
     run(prompt, n_new) -> {tokens, logits [n_new, V], prefill, decode (the median step),
     total} and generate(prompt, n_new) -> tokens (keeping no logits: what a peak-memory
     child runs): KinaEngine (kina.models.checkpoints.load, a folder or a GGUF file),
     TransformersEngine (from_pretrained, eager attention; a GGUF file dequantized to F32)
     and LlamaCppEngine (llama-cpp-python). compare() says where two runs' tokens part and
     how far apart their logits are.

Guarantees: every engine reads the one folder or file (llama.cpp a folder through the GGUF
written from its tensors); every run is greedy, prefills the prompt in one batch and then
decodes one token per step; its logits are float32 copies. llama.cpp runs as models.md's fair
F32 comparison asks: F32 KV cache, flash attention off, weights loaded rather than memory-mapped.
Nothing here imports kina, torch, transformers, gguf or llama_cpp until an engine needs it.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from .timing import SETTLE_S, busy_wait

# LlamaConfig fields per shape; rope_theta and rms_norm_eps as SmolLM's config has them. The
# weights' spread (initializer_range) is 0.05 at smollm and small: 32 distinct greedy tokens in
# 32 at smollm (30 at small), so the token comparison tells something, with the residual stream
# below 50 (below 12 at small). At 0.1 it reached 356 (86 at small); at 0.2, Kina's F16 RMSNorm
# overflowed at small (x * x past F16's 65504) and every logit was 0. The tiny shape, with a
# tied head, repeated one token at 0.05, hence 0.2 there.
SHAPES = {
    "smollm": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, initializer_range=0.05),
    "small": dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False, initializer_range=0.05),
    # GQA and a tied head, as smollm, so the quick check goes through the same mappings; the sizes
    # of tests/test_hf.py's llama-gqa2 model, so that the test of this shape reuses its F32 build
    "tiny": dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True, initializer_range=0.2),
}
COMMON = dict(rms_norm_eps=1e-5, max_position_embeddings=2048,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
              bos_token_id=1, eos_token_id=2)
STAMP = "bench_model.json"  # what build_folder wrote, so that a later run can reuse the folder


def describe(shape: str) -> str:
    c = SHAPES[shape]
    kv = c["num_key_value_heads"]
    return (f"d {c['hidden_size']}, {c['num_attention_heads']} heads"
            + (f" ({kv} KV heads)" if kv != c["num_attention_heads"] else "")
            + f", {c['num_hidden_layers']} layers, FFN {c['intermediate_size']}, vocab {c['vocab_size']}"
            + (", tied embeddings" if c["tie_word_embeddings"] else ""))


def build_folder(shape: str, seed: int, folder: Path) -> tuple[Path, bool]:
    """(the folder, whether it was built now): a LlamaForCausalLM of `shape` with seeded
    weights, saved F32. A folder this function wrote for the same shape, seed and
    transformers version is reused."""
    import torch
    import transformers
    stamp = {"shape": shape, "seed": seed, "config": {**SHAPES[shape], **COMMON},
             "transformers": transformers.__version__}
    try:
        if json.loads((folder / STAMP).read_text()) == stamp:
            return folder, False
    except (OSError, ValueError):
        pass
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**SHAPES[shape], **COMMON)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # gains near 1 and biases (none in Llama by default) nonzero
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.1 * torch.randn_like(p))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STAMP).unlink(missing_ok=True)
    model.save_pretrained(folder)
    (folder / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    return folder, True


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def tensors_of(folder: Path) -> dict[str, np.ndarray]:
    from kina.models.checkpoints.hf import read_tensors
    return {name: a for name, (a, _) in read_tensors(folder).items()}


def weight_bytes(folder: Path, itemsize: int) -> int:
    """What one decode step reads at `itemsize` bytes a weight: every layer's matrices and
    gains, the final norm and the head (for a tied head, the embedding table, once); the
    embedding row looked up and the KV cache are left out."""
    c, t = config_of(folder), tensors_of(folder)
    n = sum(a.size for name, a in t.items() if name != "model.embed_tokens.weight" and name != "lm_head.weight")
    head = t["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else t["lm_head.weight"]
    return (n + head.size) * itemsize


# -- llama.cpp's file ---------------------------------------------------------------------

GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf.split(".", 3)  # model.layers.<i>.<module>.weight
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{GGUF_NAMES[module]}.{kind}"


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """q_proj/k_proj rows for llama.cpp's rotary, which turns dims (2i, 2i+1) together where
    HF turns (i, i + Dh/2): llama.cpp's own converter does this (models.md)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dummy_vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """A Llama-style vocab of n pieces, which llama.cpp needs even when fed ids: <unk>, <s>,
    </s>, the 256 byte tokens, then plain pieces."""
    import gguf
    T = gguf.TokenType
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256
    if n < len(pieces) + 1:
        raise ValueError(f"vocab_size {n}: llama.cpp's dummy vocab needs at least {len(pieces) + 1} pieces")
    pieces += [f"p{i}" for i in range(n - len(pieces))]
    types += [T.NORMAL] * (n - len(types))
    return pieces, [0.0] * n, [int(t) for t in types]


def write_gguf(folder: Path, path: Path, dtype, embed_dtype=None) -> Path:
    """The folder's model as a GGUF file of arch llama, matrices in `dtype` (float32, float16
    or bfloat16, rounded to nearest even as Kina's loader rounds them; or a block format's name,
    "Q8_0", "Q4_0", "Q4_1" or "Q5_0", packed by the gguf package's reference quantizer), the
    embedding in `embed_dtype` (default `dtype`); gains stay F32, as llama.cpp's converter keeps them."""
    import gguf
    c = config_of(folder)
    H, Hk, D = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    Dh = c.get("head_dim") or D // H
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_rope_dimension_count(Dh)
    w.add_head_count(H)
    w.add_head_count_kv(Hk)
    w.add_key_length(Dh)
    w.add_value_length(Dh)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0)))
    w.add_vocab_size(c["vocab_size"])
    w.add_file_type(_file_type(dtype))
    pieces, scores, types = dummy_vocab(c["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for hf, a in tensors_of(folder).items():
        if hf == "lm_head.weight" and c.get("tie_word_embeddings"):
            continue
        a = np.asarray(a, np.float32)
        if hf.endswith("q_proj.weight"):
            a = permute_rows(a, H)
        elif hf.endswith("k_proj.weight"):
            a = permute_rows(a, Hk)
        if a.ndim != 2:
            w.add_tensor(gguf_name(hf), np.ascontiguousarray(a))
        else:
            data, raw = _encode(a, embed_dtype if embed_dtype is not None and hf == "model.embed_tokens.weight" else dtype)
            w.add_tensor(gguf_name(hf), data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _file_type(dtype):
    import gguf
    if isinstance(dtype, str):
        return gguf.LlamaFileType[f"MOSTLY_{dtype}"]
    from kina import runtime
    return {np.dtype(np.float32): gguf.LlamaFileType.ALL_F32, np.dtype(np.float16): gguf.LlamaFileType.MOSTLY_F16,
            runtime.numpy_dtype("BF16"): gguf.LlamaFileType.MOSTLY_BF16}[np.dtype(dtype)]


def _encode(a: np.ndarray, dtype) -> tuple[np.ndarray, object]:
    """(the bytes or values GGUFWriter.add_tensor takes, its raw_dtype) of matrix `a` in `dtype`."""
    import gguf
    if isinstance(dtype, str):  # a block format: its bytes, [rows, blocks * size]
        kind = gguf.GGMLQuantizationType[dtype]
        return gguf.quants.quantize(np.ascontiguousarray(a), kind), kind
    from kina import runtime
    if np.dtype(dtype) == runtime.numpy_dtype("BF16"):  # the gguf package takes BF16 as its bits
        return np.ascontiguousarray(a.astype(dtype)).view(np.uint16), gguf.GGMLQuantizationType.BF16
    return np.ascontiguousarray(a.astype(dtype)), None


# -- the engines --------------------------------------------------------------------------

def result(tokens, logits, seconds) -> dict:
    decode = seconds[1:]
    return dict(tokens=tokens, logits=np.stack(logits), prefill=seconds[0], decode=statistics.median(decode),
                total=sum(seconds))


class KinaEngine:
    """kina.models.checkpoints.load(path, dtype, weight_dtype, fma) of a folder or a GGUF file;
    greedy through Decoder.trace on `threads` threads (Decoder.threads, set per run: left unset
    it would be the machine's cores)."""

    def __init__(self, path: Path, dtype, max_seq_len: int, fma: bool = True, weight_dtype=None):
        from kina.models import checkpoints
        self.model = checkpoints.load(path, dtype=dtype, max_seq_len=max_seq_len, fma=fma, weight_dtype=weight_dtype)

    def run(self, prompt, n_new, threads: int = 1) -> dict:
        self.model.threads = threads
        g = self.model.trace(prompt, n_new)
        return result(g.tokens, list(g.logits.astype(np.float32)), g.step_seconds)

    def generate(self, prompt, n_new, threads: int = 1) -> list[int]:
        self.model.threads = threads
        return [token for token, _, _ in self.model.stream(prompt, n_new)]


class TransformersEngine:
    """transformers' LlamaForCausalLM.from_pretrained(folder), or AutoModelForCausalLM's of a
    GGUF file (from_pretrained(its folder, gguf_file=its name), every tensor dequantized to F32),
    eager attention, F32, under inference_mode; its own KV cache (past_key_values) and no
    attention mask (all ones: generate()'s mask from the pad token is never built);
    torch.set_num_threads per run."""

    def __init__(self, path: Path):
        import torch
        import transformers
        self.torch = torch
        path = Path(path)
        if path.is_dir():
            self.model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                       attn_implementation="eager").eval()
        else:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()
        self.version = transformers.__version__

    def run(self, prompt, n_new, threads: int = 1) -> dict:
        torch = self.torch
        torch.set_num_threads(threads)
        tokens, logits, seconds = [], [], []
        try:
            with torch.inference_mode():
                ids, past = torch.tensor([prompt]), None
                for _ in range(n_new):
                    t = time.perf_counter()
                    out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                    row = out.logits[0, -1]
                    token = int(torch.argmax(row))
                    seconds.append(time.perf_counter() - t)
                    past, ids = out.past_key_values, torch.tensor([[token]])
                    tokens.append(token)
                    logits.append(row.numpy().copy())
        finally:
            if threads > 1:  # let torch's idle workers stop spinning before the next engine runs
                torch.set_num_threads(1)
                busy_wait(SETTLE_S)
        return result(tokens, logits, seconds)


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, or None when it (or gguf) is not installed (the [llama] extra)."""
    try:
        import gguf  # noqa: F401
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.__version__


class LlamaCppEngine:
    """llama-cpp-python on a GGUF file: the prompt in one batch (llama.eval), then one
    token per eval; logits read with llama_get_logits_ith; threads set per run."""

    def __init__(self, path: Path, n_ctx: int):
        import llama_cpp
        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=max(512, n_ctx), n_ubatch=max(512, n_ctx),
                                   n_threads=1, n_threads_batch=1, flash_attn=False, use_mmap=False,
                                   type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _logits(self) -> np.ndarray:
        p = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(p, shape=(self.n_vocab,)).copy()

    def run(self, prompt, n_new, threads: int = 1) -> dict:
        self.lib.llama_set_n_threads(self.llm.ctx, threads, threads)
        self.llm.reset()
        tokens, logits, seconds, feed = [], [], [], list(prompt)
        for _ in range(n_new):
            t = time.perf_counter()
            self.llm.eval(feed)
            row = self._logits()
            token = int(np.argmax(row))
            seconds.append(time.perf_counter() - t)
            tokens.append(token)
            logits.append(row)
            feed = [token]
        if threads > 1:
            busy_wait(SETTLE_S)
        return result(tokens, logits, seconds)

    def generate(self, prompt, n_new, threads: int = 1) -> list[int]:
        self.lib.llama_set_n_threads(self.llm.ctx, threads, threads)
        self.llm.reset()
        tokens, feed = [], list(prompt)
        for _ in range(n_new):
            self.llm.eval(feed)
            p = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
            tokens.append(int(np.argmax(np.ctypeslib.as_array(p, shape=(self.n_vocab,)))))
            feed = [tokens[-1]]
        return tokens


def compare(got: dict, want: dict, steps: int | None = None) -> dict:
    """Where got's tokens first differ from want's (None: nowhere), and the largest logit
    difference relative to the row's largest |logit| over the steps before it (all, or
    the first `steps`): the steps after a divergence continue different texts; also that
    error at each of those steps (rel_err_steps)."""
    n = min(len(got["tokens"]), len(want["tokens"]))
    diverge = next((i for i in range(n) if got["tokens"][i] != want["tokens"][i]), None)
    upto = n if diverge is None else diverge + 1  # the step that diverged is compared too
    if steps is not None:
        upto = min(upto, steps)
    g, w = got["logits"][:upto], want["logits"][:upto]
    steps_err = [float(e) for e in np.abs(g - w).max(axis=-1) / np.abs(w).max(axis=-1)]
    return {"first_divergence": diverge, "steps_compared": upto, "rel_err": max(steps_err, default=0.0),
            "rel_err_steps": steps_err}
