"""Hugging Face folders in (kina.models.checkpoints.hf).

Every model here is built by transformers' own classes from a tiny random config
(tests/hf_checkpoints.py: weights, biases and gains perturbed so that nothing is
trivially zero or one) and written with save_pretrained; Kina reads the folder with no
torch. Against transformers in float32 with eager attention, Kina's greedy tokens are
the same and its logits within 1e-4, for prefill-then-decode and for recomputing, for
every architecture and mapping; a bad or damaged folder is one error naming the file
and the field or tensor. Other precisions (F16, BF16 and fma): tests/test_hf_dtypes.py;
text out (sampling, the tokenizer, `kina generate`): tests/test_hf_text.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hf_checkpoints import (BASE, N_NEW, PROMPT, SPECS, check_against_transformers,  # noqa: F401
                            torch)

tokenizers = pytest.importorskip("tokenizers")

from kina.models.checkpoints import CheckpointError  # noqa: E402
from kina.models.checkpoints.hf import load as load_pretrained, read_safetensors  # noqa: E402
from kina.models.tokenizer import from_folder as load_tokenizer  # noqa: E402


# -- the model against transformers --------------------------------------------------------

@pytest.mark.parametrize("name", list(SPECS))
def test_same_greedy_tokens_and_logits_as_transformers(checkpoint, kina_model, name):
    folder, hf = checkpoint(name)
    model = kina_model(name)
    check_against_transformers(model, hf, use_cache=True)


@pytest.mark.parametrize("name", ["llama-gqa2-tied-llama3", "qwen2-bias-tied"])
def test_recompute_matches_transformers(checkpoint, kina_model, name):
    check_against_transformers(kina_model(name), checkpoint(name)[1], use_cache=False, n_new=24)


def test_transformers_own_generate_loop_agrees(checkpoint, kina_model):
    folder, hf = checkpoint("llama-gqa4-headdim8-linear")
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=N_NEW, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    assert kina_model("llama-gqa4-headdim8-linear").generate(PROMPT, N_NEW) == out[0, len(PROMPT):].tolist()


def test_the_config_is_mapped(kina_model):
    mha, gqa, g4, mqa = (kina_model(n) for n in ("llama-mha", "llama-gqa2-tied-llama3",
                                                 "llama-gqa4-headdim8-linear", "llama-mqa"))
    assert (mha.n_kv_heads, gqa.n_kv_heads, g4.n_kv_heads, mqa.n_kv_heads) == (8, 4, 2, 1)
    assert g4.head_dim == 8 and g4.n_heads * g4.head_dim == 64 != g4.d_model
    assert gqa.tie_embeddings and "head" not in gqa.weights and np.shares_memory(gqa.weights["embed"], gqa._head)  # held once
    assert gqa.rope_scaling["rope_type"] == "llama3" and mqa.rope_theta == 500.0 and mqa.eps == 1e-5
    qwen = kina_model("qwen2-bias-tied")
    assert qwen.qkv_bias and not qwen.o_bias and qwen.architecture == "Qwen2ForCausalLM"
    biased = kina_model("llama-attention-bias")
    assert biased.qkv_bias and biased.o_bias and "layers.1.bo" in biased.weights
    # the cache holds the key/value heads only: bytes per token fall with the group
    assert [m.bytes_per_token for m in (mha, gqa, mqa)] == [2 * 2 * h * 4 * 4 for h in (8, 4, 1)]
    cache = mqa.new_cache()
    mqa.prefill(PROMPT, cache)
    assert cache.keys(0).shape == (1, 1, 4, len(PROMPT)) and cache.values(1).shape == (1, 1, len(PROMPT), 4)


def test_sharded_and_older_configs_load_the_same(checkpoint, kina_model, tmp_path):
    folder, hf = checkpoint("llama-gqa4-headdim8-linear")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    want = kina_model("llama-gqa4-headdim8-linear").trace(PROMPT, 8).logits
    np.testing.assert_array_equal(load_pretrained(tmp_path / "sharded").trace(PROMPT, 8).logits, want)
    # the older spelling: a top-level rope_theta and rope_scaling {"type": ...}
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    config = json.loads((old / "config.json").read_text())
    config.pop("rope_parameters")
    config.update(rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0}, torch_dtype="float32")
    config.pop("dtype")
    (old / "config.json").write_text(json.dumps(config))
    np.testing.assert_array_equal(load_pretrained(old).trace(PROMPT, 8).logits, want)


# -- errors: one clear message naming the file and the field or tensor ------------------------

def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            config.pop(k, None)
        else:
            config[k] = v
    (folder / "config.json").write_text(json.dumps(config))


def edit_tensors(folder, fn):
    from safetensors.numpy import save_file
    tensors = {k: np.array(v) for k, v in read_safetensors(folder / "model.safetensors").items()}
    fn(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize("config, tensors, words", [
    (dict(architectures=["GPT2LMHeadModel"]), None, "config.json: field 'architectures' = [\"GPT2LMHeadModel\"]: "
                                                    "unsupported architecture"),
    (dict(hidden_act="gelu"), None, "config.json: field 'hidden_act' = \"gelu\": only silu"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), None, "rope_type 'yarn' is not supported"),
    (dict(mlp_bias=True), None, "field 'mlp_bias' = true: MLP biases are not supported"),
    (dict(num_key_value_heads=3), None, "field 'num_key_value_heads' = 3: num_attention_heads = 8 is not a multiple"),
    (dict(hidden_size=None), None, "config.json: field 'hidden_size' is missing"),
    (dict(sliding_window=16), None, "field 'sliding_window' = 16: attention is limited to 16 positions, "
                                    "fewer than the 128 asked for"),
    (None, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
     "model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' is missing; expected shape [64, 32]"),
    (None, lambda t: t.update({"model.norm.weight": np.zeros(30, np.float32)}),
     "model.safetensors: tensor 'model.norm.weight' has shape [30], expected [32]"),
    (None, lambda t: t.update({"model.layers.0.self_attn.qq_proj.weight": t.pop("model.layers.0.self_attn.q_proj.weight")}),
     "model.safetensors: unexpected tensor 'model.layers.0.self_attn.qq_proj.weight'"),
])
def test_bad_folders_name_the_file_and_field(checkpoint, tmp_path, config, tensors, words):
    folder = tmp_path / "m"
    shutil.copytree(checkpoint("llama-mha")[0], folder)
    if config:
        edit_config(folder, **config)
    if tensors:
        edit_tensors(folder, tensors)
    with pytest.raises(CheckpointError) as e:
        load_pretrained(folder, max_seq_len=128)
    assert words in str(e.value) and str(folder) in str(e.value)


def test_missing_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such model folder"):
        load_pretrained(tmp_path / "absent")
    with pytest.raises(CheckpointError, match=r"config\.json: no such file"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        load_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: no such file"):
        load_tokenizer(tmp_path)


# -- damaged folders and non-finite weights (nothing damaged is trusted) -----------------------

def copy_folder(checkpoint, tmp_path, name="llama-mha"):
    src = checkpoint(name)[0]
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage,words", [
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:5000]), "truncated"),
    (lambda f: (f / "model.safetensors").write_bytes(b""), "too short"),
    (lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 64), "claims"),
    (lambda f: (f / "config.json").write_text('{"architectures": ['), "not valid JSON"),
    (lambda f: (f / "config.json").write_bytes(b""), "is empty"),
    (lambda f: ((f / "config.json").unlink(), (f / "config.json").mkdir()), "is a directory"),
    (lambda f: (f / "config.json").write_bytes(b"\x00\xff\xfe"), "not UTF-8"),
])
def test_a_damaged_folder_is_one_error_naming_the_file(checkpoint, tmp_path, damage, words):
    folder = copy_folder(checkpoint, tmp_path)
    damage(folder)
    with pytest.raises(ValueError, match=words) as e:
        load_pretrained(folder)
    assert str(folder) in str(e.value) and "\n" not in str(e.value)
    proc = subprocess.run([sys.executable, "-m", "kina.apps", "generate", str(folder), "--prompt-ids",
                           "1,2", "--max-new-tokens", "2"], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr and str(folder) in proc.stderr


def test_a_damaged_tokenizer_is_one_error_naming_the_file(checkpoint, tmp_path):
    folder = copy_folder(checkpoint, tmp_path)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 12}')
    with pytest.raises(CheckpointError, match="tokenizer.json: not a tokenizer") as e:
        load_tokenizer(folder)
    assert "\n" not in str(e.value)
    (folder / "tokenizer.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_tokenizer(folder)


def test_non_finite_weights_are_refused_naming_the_tensor(checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file
    folder = copy_folder(checkpoint, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    w = tensors["model.layers.1.mlp.up_proj.weight"].copy()
    w[3, 5] = np.nan
    tensors["model.layers.1.mlp.up_proj.weight"] = w
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' holds NaN or infinity: "
                                              r"1 of \d+ values are not finite, the first at index \[3, 5\]"):
        load_pretrained(folder)
    # the opt-out loads it; the NaN then reaches every logit, and generation stops naming the step
    model = load_pretrained(folder, allow_nonfinite=True)
    with pytest.raises(FloatingPointError, match=r"generation step 0 \(position 1\): 320 of 320 logits are NaN"):
        model.generate([1, 2], 3)


def test_a_value_past_f16s_range_is_refused_on_conversion(checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file
    folder = copy_folder(checkpoint, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].copy()
    tensors["model.norm.weight"][0] = 1e6
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    load_pretrained(folder)  # finite as float32
    with pytest.raises(CheckpointError, match="tensor 'model.norm.weight' overflows float16"):
        load_pretrained(folder, dtype=np.float16)
