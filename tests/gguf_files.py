"""GGUF files the tests write, as llama.cpp's converter and quantizer lay them out.

`write(path, tensors, config, matrix_type, ...)` writes a `llama`-architecture GGUF file with the
`gguf` package's GGUFWriter from Hugging Face tensors (q and k rows permuted as llama.cpp's
converter permutes them, matrices in `matrix_type`, the embedding in `embed_type`), with a
byte-level BPE vocabulary when given one. `pack(values, type)` makes a block format's bytes:
the `gguf` package's reference quantizers for Q8_0/Q4_0/Q4_1/Q5_0, and simple ones written
here for Q4_K and Q6_K, which it has none of (any bytes with finite scales are valid blocks;
`gguf.quants.dequantize` says what they hold). `write_gemma3` writes a `gemma3` file as
llama.cpp's converter does (norms with 1 added, no q/k permutation), and `sentencepiece_vocab`
a small vocabulary laid out as Gemma's (`llama_sentencepiece_vocab` as Llama 2's).
"""
from __future__ import annotations

import numpy as np

gguf = __import__("pytest").importorskip("gguf")

HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{HF_TO_GGUF[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's rotary halves interleaved (row 2i is HF's i, 2i+1 is i + Dh/2)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _f16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).view(np.uint8).reshape(*np.shape(x), 2)


def pack_q4_k(rows: np.ndarray) -> np.ndarray:
    """[n, K] floats (K a multiple of 256) as Q4_K bytes [n, K / 256 * 144]."""
    x = rows.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(x.min(axis=2), 0)
    scale = (x.max(axis=2) - lo) / 15
    d = np.maximum(scale.max(axis=1, keepdims=True), 1e-8) / 63
    dmin = np.maximum((-lo).max(axis=1, keepdims=True), 1e-8) / 63
    d, dmin = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / d), 1, 63).astype(np.uint8)
    m = np.clip(np.round(-lo / dmin), 0, 63).astype(np.uint8)
    q = np.clip(np.round((x + (dmin * m)[..., None]) / (d * sc)[..., None]), 0, 15).astype(np.uint8)
    n = x.shape[0]
    scales = np.zeros((n, 12), np.uint8)
    for t in range(4):
        scales[:, t] = sc[:, t] | ((sc[:, t + 4] >> 4) << 6)
        scales[:, 4 + t] = m[:, t] | ((m[:, t + 4] >> 4) << 6)
        scales[:, 8 + t] = (sc[:, t + 4] & 15) | ((m[:, t + 4] & 15) << 4)
    qs = q.reshape(n, 4, 2, 32)
    qs = (qs[:, :, 0] | (qs[:, :, 1] << 4)).reshape(n, 128)
    out = np.concatenate([_f16(d[:, 0]), _f16(dmin[:, 0]), scales, qs], axis=1)
    return out.reshape(rows.shape[0], -1)


def pack_q6_k(rows: np.ndarray) -> np.ndarray:
    """[n, K] floats (K a multiple of 256) as Q6_K bytes [n, K / 256 * 210]."""
    x = rows.reshape(-1, 16, 16).astype(np.float32)
    scale = np.maximum(np.abs(x).max(axis=2), 1e-8) / 31
    d = (scale.max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / d), 1, 127).astype(np.int8)
    q = (np.clip(np.round(x / (d * sc)[..., None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 256)
    n = q.shape[0]
    ql, qh = np.zeros((n, 128), np.uint8), np.zeros((n, 64), np.uint8)
    for j in range(256):
        h, r, l = j // 128, (j % 128) // 32, j % 32
        ql[:, 64 * h + 32 * (r % 2) + l] |= (q[:, j] & 15) << (4 * (r // 2))
        qh[:, 32 * h + l] |= (q[:, j] >> 4) << (2 * r)
    out = np.concatenate([ql, qh, sc.view(np.uint8), _f16(d[:, 0])], axis=1)
    return out.reshape(rows.shape[0], -1)


def pack(rows: np.ndarray, qtype: str) -> np.ndarray:
    """[n, K] floats as `qtype`'s bytes, one run of blocks per row (GGUF's layout of [n, K])."""
    rows = np.ascontiguousarray(rows, np.float32)
    if qtype == "Q4_K":
        return pack_q4_k(rows)
    if qtype == "Q6_K":
        return pack_q6_k(rows)
    return gguf.quants.quantize(rows, getattr(gguf.GGMLQuantizationType, qtype))


def write(path, tensors: dict, config: dict, matrix_type: str = "F32", embed_type: str | None = None,
          vocab=None, chat_template: str | None = None, types: dict | None = None,
          tokenizer_model: str = "gpt2", keys: dict | None = None) -> None:
    """A llama GGUF file of Hugging Face `tensors` (name -> array) and `config` (config.json's
    fields): q and k permuted, matrices in `matrix_type` (F32, F16, BF16 or a block format), the
    embedding in `embed_type` (default the matrices'), 1-D tensors in F32; `types` overrides a
    tensor's type by its GGUF name. `vocab`: (tokens, merges, token_types) of a byte-level BPE,
    declared as `tokenizer_model`; with `tokenizer_model` "llama", (tokens, scores, token_types) of
    a SentencePiece vocabulary (`llama_sentencepiece_vocab`: unk 0, bos 1, eos 2, as Llama 2's).
    `keys`: more `tokenizer.ggml.*` keys (a bool, or an int for a uint32 one)."""
    H, Hk, D = config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]
    Dh = config.get("head_dim") or D // H
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_rope_dimension_count(Dh)
    w.add_head_count(H)
    w.add_head_count_kv(Hk)
    w.add_key_length(Dh)
    w.add_value_length(Dh)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    w.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    w.add_vocab_size(config["vocab_size"])
    if vocab is not None and tokenizer_model == "llama":
        add_sentencepiece(w, vocab, unk=0, bos=1, eos=2)
    elif vocab is not None:
        tokens, merges, token_types = vocab
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(token_types)
        w.add_token_merges(merges)
        w.add_bos_token_id(config.get("bos_token_id", 0))
        w.add_eos_token_id(config.get("eos_token_id", 1))
        w.add_add_bos_token(False)
    for key, value in (keys or {}).items():
        (w.add_bool if isinstance(value, bool) else w.add_uint32)(f"tokenizer.ggml.{key}", value)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for hf, a in tensors.items():
        if hf == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        a = np.asarray(a, np.float32)
        if hf.endswith(("q_proj.weight", "q_proj.bias")):
            a = permute(a, H)
        elif hf.endswith(("k_proj.weight", "k_proj.bias")):
            a = permute(a, Hk)
        name = gguf_name(hf)
        kind = "F32" if a.ndim == 1 else (embed_type or matrix_type) if hf == "model.embed_tokens.weight" \
            else matrix_type
        add_tensor(w, name, a, (types or {}).get(name, kind))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add_tensor(w, name: str, a: np.ndarray, kind: str) -> None:
    """`a` (float32) into the GGUFWriter `w` as `kind`: F32, F16, BF16 or a block format (`pack`)."""
    a = np.ascontiguousarray(a)
    if kind == "F32":
        w.add_tensor(name, a)
    elif kind == "F16":
        w.add_tensor(name, a.astype(np.float16))
    elif kind == "BF16":
        import ml_dtypes
        w.add_tensor(name, a.astype(ml_dtypes.bfloat16).view(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)
    else:
        w.add_tensor(name, pack(a, kind), raw_dtype=getattr(gguf.GGMLQuantizationType, kind))


def add_sentencepiece(w, vocab, unk: int, bos: int, eos: int) -> None:
    """A SentencePiece vocabulary, (tokens, scores, token_types), into the GGUFWriter `w`."""
    tokens, scores, token_types = vocab
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(token_types)
    w.add_unk_token_id(unk)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)


# -- Gemma 3 ------------------------------------------------------------------------------------

GEMMA3_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                  "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                  "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                  "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                  "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                  "post_feedforward_layernorm": "post_ffw_norm"}


def write_gemma3(path, tensors: dict, config: dict, types: dict, embed_type: str = "Q8_0", vocab=None,
                 keys: dict | None = None) -> None:
    """A gemma3 GGUF file as llama.cpp's converter writes one from a Gemma3ForCausalLM's `tensors`
    and `config` (config.json's fields): every norm weight with 1 added, q and k as they are (no
    permutation), the head tied (no output.weight), each matrix in `types[its GGUF short name]`
    ("attn_q", ...; F32 when absent), the embedding in `embed_type`. `vocab`: (tokens, scores,
    token_types) of a SentencePiece vocabulary (bos 2, eos 1, unk 3, pad 0, as Gemma's); `keys`:
    more `gemma3.*` keys (a float for a float32 key, an int for a uint32 one)."""
    rope = (config.get("rope_parameters") or {}).get("full_attention") or {}
    w = gguf.GGUFWriter(str(path), arch="gemma3")
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_key_length(config["head_dim"])
    w.add_value_length(config["head_dim"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(rope.get("rope_theta", 1_000_000.0))
    w.add_sliding_window(config["sliding_window"])
    w.add_vocab_size(config["vocab_size"])
    for key, value in (keys or {}).items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"gemma3.{key}", value)
    if vocab is not None:
        add_sentencepiece(w, vocab, unk=3, bos=2, eos=1)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
    for hf, a in tensors.items():
        if hf == "lm_head.weight":
            continue
        a = np.asarray(a, np.float32)
        if hf == "model.embed_tokens.weight":
            name, kind = "token_embd.weight", embed_type
        elif hf == "model.norm.weight":
            name, kind = "output_norm.weight", "F32"
        else:
            _, _, i, rest = hf.split(".", 3)
            module, what = rest.rsplit(".", 1)
            short = GEMMA3_TO_GGUF[module]
            name, kind = f"blk.{i}.{short}.{what}", "F32" if a.ndim == 1 else types.get(short, "F32")
        if name.endswith("norm.weight"):
            a = a + np.float32(1)  # Gemma3RMSNorm's 1 + w, folded in as llama.cpp's converter does
        add_tensor(w, name, a, kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sentencepiece_vocab(corpus, n_pieces: int = 120, n_unused: int = 8):
    """(tokens, scores, token_types) of a small vocabulary laid out as Gemma's file lays out its
    own: <pad> <eos> <bos> <unk> <mask> (control), [multimodal] (user-defined), unused control
    pieces, <start_of_turn> <end_of_turn>, newline runs and space runs (user-defined; the space
    runs stored as spaces), the 256 byte pieces <0x00>..<0xFF>, then pieces learned from `corpus`
    by a BPE trainer over "▁"-spelled text, in the order it learned them (the order a Gemma
    tokenizer ranks its merges by)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    control = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    head = [(t, 3) for t in control] + [("[multimodal]", 4)] + [(f"<unused{i}>", 3) for i in range(n_unused)]
    head += [("<start_of_turn>", 3), ("<end_of_turn>", 3)]
    head += [("\n" * n, 4) for n in range(1, 4)] + [(" " * n, 4) for n in range(2, 5)]
    head += [(f"<0x{b:02X}>", 6) for b in range(256)]
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.Replace(" ", "\u2581")
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=n_pieces, show_progress=False))
    learned = [t for t, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])]
    tokens = [t for t, _ in head] + [t for t in learned if t not in {t for t, _ in head}]
    types = [k for _, k in head] + [1] * (len(tokens) - len(head))
    scores = [-1000.0 if k != 1 else -float(i) for i, k in enumerate(types)]
    return tokens, scores, types


def llama_sentencepiece_vocab(corpus, n_pieces: int = 160, user_defined: str = "<|user|>"):
    """(tokens, scores, token_types) of a small vocabulary laid out as Llama 2's file lays out its
    own: <unk> (unknown), <s> </s> (control), the 256 byte pieces <0x00>..<0xFF>, then pieces
    learned from `corpus` by a BPE trainer over "▁"-spelled text with a "▁" in front (space runs
    "▁▁" among them), scored minus the order they were learned in, then the single characters
    (scored below every piece), with `user_defined` (user-defined) among the pieces. The learned
    pieces are stored in the reverse of their scores' order, and pairs of them share a score, so
    ranking merges by place in the file gives other ids. Two ties that transformers breaks as
    SentencePiece does are there too: "▁zap" is "▁za" "p" (of "▁z"+"a" and "a"+"p", of one score,
    the longer left part first, though "ap" comes first in the file) and "▁qu" is "▁" "qu" (of
    "q"+"u" and "▁"+"q", of one score and length, the piece first in the file first)."""
    from tokenizers import Tokenizer, models, normalizers, trainers
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=n_pieces, show_progress=False))
    learned = [t for t, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1])]
    chars, pieces = [t for t in learned if len(t) == 1], [t for t in learned if len(t) > 1]
    ties = [("\u2581z", 0.5), ("ap", -0.5), ("\u2581za", -0.5), ("qu", -1.5), ("\u2581q", -1.5)]
    scored = [(t, -float(i // 2)) for i, t in enumerate(pieces) if t not in dict(ties)][::-1]
    scored += ties + [(user_defined, 0.0)]
    chars += [c for c in "\u2581zapqu" if c not in chars]
    scored += [(t, -float(len(pieces) + i)) for i, t in enumerate(chars)]
    head = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)] + [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    rows = head + [(t, score, 4 if t == user_defined else 1) for t, score in scored]
    return [t for t, _, _ in rows], [s for _, s, _ in rows], [k for _, _, k in rows]
