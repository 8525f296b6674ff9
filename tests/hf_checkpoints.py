"""The Hugging Face checkpoints the tests build (tests/test_hf*.py): transformers' own
classes from tiny random configs, saved with save_pretrained, and the one comparison
with transformers that the tests make.

The reference is transformers itself, in float32 with eager attention: the logits at
every position of prompt + Kina's greedy tokens, in one forward pass, whose argmaxes
must be Kina's tokens (so transformers' greedy loop would choose the same ones) and
whose values must be within a bound of Kina's (relative to the row's largest).
`checkpoints` and `models` are behind the session fixtures `checkpoint(name)` and
`kina_model(name)` (tests/conftest.py): each folder is written and each model loaded
once per session, for every file that uses them.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kina.models.checkpoints.hf import load as load_pretrained  # noqa: E402

PROMPT = [5, 17, 2, 88, 41, 9, 250, 3]
N_NEW = 64
BASE = dict(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=8,
            max_position_embeddings=128, initializer_range=0.1, bos_token_id=0, eos_token_id=1)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# name -> (architecture, config changes); each distinct shape compiles one kernel build
SPECS = {
    "llama-mha": ("llama", dict(num_key_value_heads=8, head_dim=4)),
    # a tied head at small weights just repeats the last token: larger ones make varied text
    "llama-gqa2-tied-llama3": ("llama", dict(num_key_value_heads=4, head_dim=4, tie_word_embeddings=True,
                                             rope_parameters=LLAMA3, initializer_range=0.3)),
    "llama-gqa4-headdim8-linear": ("llama", dict(num_key_value_heads=2, head_dim=8,
                                                 rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                                  "factor": 2.0})),
    "llama-mqa": ("llama", dict(num_key_value_heads=1, head_dim=4, rms_norm_eps=1e-5,
                                rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    "llama-attention-bias": ("llama", dict(num_key_value_heads=8, head_dim=4, attention_bias=True,
                                           initializer_range=0.2)),
    "mistral": ("mistral", dict(num_key_value_heads=4, head_dim=4, sliding_window=4096)),
    "qwen2-bias-tied": ("qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True, initializer_range=0.3)),
}


def hf_classes(arch):
    t = transformers
    return {"llama": (t.LlamaConfig, t.LlamaForCausalLM), "mistral": (t.MistralConfig, t.MistralForCausalLM),
            "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM)}[arch]


def build_hf(arch, changes, seed=0):
    config_cls, model_cls = hf_classes(arch)
    torch.manual_seed(seed)
    config = config_cls(**{**BASE, **changes})
    config._attn_implementation = "eager"
    model = model_cls(config).eval()
    with torch.no_grad():  # gains near 1 and nonzero biases, so that both are exercised
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.1 * torch.randn_like(p))
    return model


def checkpoints(tmp_path_factory):
    """name -> (folder, the transformers model) of SPECS, each built on first use."""
    made = {}

    def get(name):
        if name not in made:
            arch, changes = SPECS[name]
            hf = build_hf(arch, changes)
            folder = tmp_path_factory.mktemp(name)
            hf.save_pretrained(folder)
            made[name] = (folder, hf)
        return made[name]
    return get


def models(checkpoint):
    """name -> Kina's StoryLM of that checkpoint's folder, each loaded on first use."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = load_pretrained(checkpoint(name)[0])
        return made[name]
    return get


def reference_logits(hf, ids) -> np.ndarray:
    """transformers' logits [len(ids), V] at every position, in float32."""
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float().numpy()


def rel_err(got, want) -> float:
    return float((np.abs(got - want).max(axis=-1) / np.abs(want).max(axis=-1)).max())


def check_against_transformers(model, hf, use_cache=True, tol=1e-4, prompt=PROMPT, n_new=N_NEW):
    got = model.trace(prompt, n_new, use_cache=use_cache)
    want = reference_logits(hf, prompt + got.tokens[:-1])[len(prompt) - 1:]
    assert list(np.argmax(want, axis=-1)) == got.tokens, "transformers' greedy choice differs"
    assert len(set(got.tokens)) > n_new // 8, "too few distinct tokens for a telling comparison"
    err = rel_err(got.logits, want)
    assert err < tol, err
    return got, err
