"""Hugging Face checkpoints at other precisions than the default build: F16 and BF16
folders (read as float32, and computed in their own dtype), and fused multiply-adds
(the default fma=True, and fma=False: the exact bits), each against transformers in float32 (tests/hf_checkpoints.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hf_checkpoints import (N_NEW, PROMPT, SPECS, build_hf, check_against_transformers,  # noqa: F401
                            hf_classes, reference_logits, rel_err, torch)

import ml_dtypes  # noqa: E402

from kina.apps import Pretrained  # noqa: E402
from kina.apps.cli import main  # noqa: E402
from kina.models.checkpoints.hf import load as load_pretrained, read_safetensors  # noqa: E402


def test_exact_bits_still_match_transformers(checkpoint, kina_model):
    """fma=False (the compiler's exact bits, as -O0): other bits than the default's fused
    multiply-adds, the same tokens and logits within the same bound against transformers, and
    the same bits on 1 and 2 threads. (llama-mha: the build `kina generate --exact` of
    text_folder uses too.)"""
    folder, hf = checkpoint("llama-mha")
    exact = load_pretrained(folder, fma=False)
    assert not exact.fma and kina_model("llama-mha").fma
    got, _ = check_against_transformers(exact, hf)
    fused = kina_model("llama-mha").trace(PROMPT, N_NEW)
    assert got.tokens == fused.tokens and not np.array_equal(got.logits, fused.logits)
    exact.threads = 2
    assert np.array_equal(exact.trace(PROMPT, N_NEW).logits, got.logits)
    with pytest.raises(TypeError, match="^fma: expected True or False, got str$"):
        load_pretrained(folder, fma="yes")


def test_kina_generate_exact(checkpoint, capsys):
    """`kina generate --exact` is Pretrained(fma=False): the same ids; the default fuses."""
    folder = checkpoint("llama-mha")[0]
    assert main(["generate", str(folder), "--prompt-ids", "5,17,2", "--max-new-tokens", "12", "--json", "--exact"]) == 0
    exact = Pretrained(folder, fma=False)
    assert not exact.model.fma and Pretrained(folder, defer=True)._options["fma"]
    assert json.loads(capsys.readouterr().out)["ids"] == exact.generate([5, 17, 2], max_new_tokens=12).ids


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_half_precision_checkpoints(checkpoint, kina_model, tmp_path, half):
    """A BF16 or F16 checkpoint, read as float32, against transformers reading it as float32:
    the same tokens, logits within 1e-4. Computed in BF16 (F16) itself (--dtype BF16), the logits
    stay within 5e-2 (5e-3) of the float32 reference over the first 8 tokens, greedy-chosen by Kina."""
    hf = build_hf("llama", SPECS["llama-mha"][1]).to(getattr(torch, half))
    hf.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == half
    stored = read_safetensors(tmp_path / "model.safetensors")["model.norm.weight"].dtype
    assert stored == (np.dtype(ml_dtypes.bfloat16) if half == "bfloat16" else np.float16)
    hf32 = hf_classes("llama")[1].from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    check_against_transformers(load_pretrained(tmp_path), hf32)
    native = load_pretrained(tmp_path, dtype=ml_dtypes.bfloat16 if half == "bfloat16" else np.float16)
    got = native.trace(PROMPT, 8)
    want = reference_logits(hf32, PROMPT + got.tokens[:-1])[len(PROMPT) - 1:]
    assert rel_err(got.logits.astype(np.float32), want) < (5e-2 if half == "bfloat16" else 5e-3)


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_f32_activations_against_half_weights(checkpoint, kina_model, half):
    """weight_dtype (F32 activations, the weight matrices F16 or BF16, each widened exactly
    in a mixed matmul): what transformers computes in float32 from the same rounded
    weights (the same tokens, logits within 1e-4), and within the stated bound of
    transformers on the float32 weights themselves: 2e-3 (F16) or 1.5e-2 (BF16) over
    N_NEW greedy tokens, closer than the model computed in F16 throughout. The activations,
    norms, biases and KV cache stay float32."""
    folder, hf = checkpoint("llama-mha")
    wdt = ml_dtypes.bfloat16 if half == "bfloat16" else np.float16
    mixed = load_pretrained(folder, weight_dtype=wdt)
    assert mixed.dtype == np.float32 and mixed.weight_dtype == wdt
    assert mixed.weights["layers.0.wq"].dtype == wdt and mixed.weights["norm"].dtype == np.float32
    rounded = hf_classes("llama")[1].from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in rounded.named_parameters():
            if p.dim() == 2:  # the matrices, as Kina holds them
                p.copy_(p.to(getattr(torch, half)).float())
    check_against_transformers(mixed, rounded)
    got = mixed.trace(PROMPT, N_NEW)
    want = reference_logits(hf, PROMPT + got.tokens[:-1])[len(PROMPT) - 1:]
    bound = 1.5e-2 if half == "bfloat16" else 2e-3
    assert rel_err(got.logits, want) < bound
    if half == "float16":
        f16 = load_pretrained(folder, dtype=np.float16).trace(PROMPT, N_NEW)
        want16 = reference_logits(hf, PROMPT + f16.tokens[:-1])[len(PROMPT) - 1:]
        assert rel_err(got.logits, want) < rel_err(f16.logits.astype(np.float32), want16)
    with pytest.raises(ValueError, match="^weight_dtype: expected the model's dtype \\(float16\\), or float16 or "
                                         "bfloat16 with dtype float32 .*got float32 with dtype float16$"):
        load_pretrained(folder, dtype=np.float16, weight_dtype=np.float32)
    with pytest.raises(TypeError, match="^weight_dtype: expected float16, bfloat16 \\(ml_dtypes\\), float32 or "
                                        "float64, got int8$"):
        load_pretrained(folder, weight_dtype=np.int8)


def test_kina_generate_weight_dtype(checkpoint, capsys):
    """`kina generate --weight-dtype F16` is Pretrained(weight_dtype=float16): the same ids."""
    folder = checkpoint("llama-mha")[0]
    assert main(["generate", str(folder), "--prompt-ids", "5,17,2", "--max-new-tokens", "12", "--json",
                 "--weight-dtype", "F16"]) == 0
    mixed = Pretrained(folder, weight_dtype=np.float16)
    assert mixed.model.weight_dtype == np.float16 and json.loads(capsys.readouterr().out)["ids"] == \
        mixed.generate([5, 17, 2], max_new_tokens=12).ids
