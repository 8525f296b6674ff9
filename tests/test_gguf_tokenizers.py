"""SentencePiece vocabularies of llama files (kina.models.tokenizer.from_gguf, `tokenizer.ggml.model`
"llama", as Llama 2, TinyLlama and Mistral v0.1 files hold them), against transformers on the same
file.

The files hold a tokenizer's keys and no tensors (tests/gguf_files.py: `write` with
`llama_sentencepiece_vocab`), which is all either tokenizer reads: transformers builds its own
with `AutoTokenizer.from_pretrained(folder, gguf_file=...)`. Kina must give the same ids on a
corpus, and decode them to the same text.
"""
from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("gguf")

import gguf_files  # noqa: E402
from kina.models import checkpoints  # noqa: E402
from kina.models.checkpoints import CheckpointError  # noqa: E402
from kina.models.tokenizer import from_gguf  # noqa: E402

CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)
TRAIN = ["the cat sat on the mat", "there is the theme, then the thesis", "hello world, hello there",
         "def f(x):\n    return x  # done", "Once upon a time there was a fox", "    indented    code"] * 4
CORPUS = ["Hello world 12345 and 3.14159", "  spaces   here\n\n\ttab", "emoji 😀🎉 日本語 ", "Привет, мир!",
          "def f(x):\n    return x**2  # comment\n", "Ünïcödé façade naïve", "١٢٣ العربية", "a\u00a0b\u200bc",
          "\r\n\r\n", "x" * 300, "I'm, you're, it's", "<s>text</s><unk>", "a<|user|>the<|user|> cat",
          "</s>the cat", "   leading", "trailing   ", "\x07\x00bell", "", " ", "\t\t\n \n", "▁ ▁▁x",
          "the theme of the thesis: there, then, them", "zap quick", "quiz zap"] + TRAIN[:6]


def llama_file(tmp_path, **keys):
    path = tmp_path / "spm.gguf"
    gguf_files.write(path, {}, CONFIG, vocab=gguf_files.llama_sentencepiece_vocab(TRAIN), tokenizer_model="llama",
                     keys=keys)
    return path


def test_merges_follow_the_scores_and_break_ties_as_transformers_does(tmp_path):
    """The vocabulary stores its pieces against their scores' order and holds two ties
    (gguf_files.llama_sentencepiece_vocab); "▁" goes first, and BOS."""
    text = checkpoints.load_text(llama_file(tmp_path))
    pieces = [text.tokenizer.id_to_token(i) for i in text.encode("zap quick")]
    assert pieces == ["<s>", "\u2581za", "p", "\u2581", "qu", "i", "c", "<0x6B>"]
    assert (text.bos_id, text.eos_ids, text.add_bos, text.bos_token, text.eos_token) == (1, (2,), True, "<s>", "</s>")
    assert text.decode(text.encode("  two <s>x")) == " two x"  # one leading space taken off, <s> skipped


@pytest.mark.parametrize("keys", [
    {},  # no add_bos_token: BOS first, as llama.cpp and transformers add it
    {"add_bos_token": False, "add_eos_token": True},
    {"add_bos_token": True, "add_space_prefix": True},
    {"add_space_prefix": False},  # transformers puts the "▁" first all the same; so does Kina
])
def test_the_tokenizer_gives_transformers_ids_on_a_corpus(tmp_path, keys):
    transformers = pytest.importorskip("transformers")
    path = llama_file(tmp_path, **keys)
    ours = checkpoints.load_text(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in CORPUS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=True), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
        assert ours.encode(text, add_special=False) == theirs.encode(text, add_special_tokens=False), text
    assert ours.add_bos == keys.get("add_bos_token", True)


def test_sentencepiece_of_an_architecture_kina_does_not_build_is_refused():
    meta = {"general.architecture": "phi3", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>"]}
    with pytest.raises(CheckpointError, match=r"^m.gguf: field 'tokenizer.ggml.model' = 'llama': Kina builds "
                                              r"SentencePiece \('llama'\) tokenizers for llama, gemma.* not 'phi3'"):
        from_gguf(meta, "m.gguf")
