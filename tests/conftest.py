"""Shared test helpers: the one NumPy-reference helper, and golden-file updates.

`check_against_numpy(source, fn, *inputs)` compiles `source`, runs `fn`, runs the
NumPy reference interpreter on the same inputs, and compares shape, then dtype,
then values (bit-exact where the op is exact, else within `rtol`).

`pytest --update-golden` rewrites tests/golden/* from the current compiler; review
the diff before committing.

`make test` runs the tests on two pytest-xdist workers (`-n 2 --dist loadfile`). A
file's tests stay on one worker, so its module and session fixtures are built once;
the files in KERNEL_GROUP build the same storylm.kina kernels (StoryLM, Hugging Face at
each dtype, and bench_model's tiny shape at the same sizes), so they share a worker, one after
another, and each kernel is compiled once, then taken from the shared compile cache.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import kina
from kina import knobs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DYN_TEXT = (EXAMPLES / "storylm0_kv_step_dyn.kina").read_text()
GENERIC_STEP = ROOT / "src" / "kina" / "models" / "seed" / "kv_step.kina"  # the same step, generic in T


def kv_inputs(B, H, Dh, S, dtype=np.float32, seed=0):
    """Seeded inputs of the Section 19 step: q_new, k_past, k_new, v_past, v_new, scale."""
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(dtype)
    return r(B, H, 1, Dh), r(B, H, Dh, S), r(B, H, Dh, 1), r(B, H, S, Dh), r(B, H, 1, Dh), \
        np.full((1, 1, 1, 1), 1 / np.sqrt(max(Dh, 1)), dtype)


KERNEL_GROUP = {"test_storylm", "test_hf", "test_hf_dtypes", "test_hf_text", "test_bench_model"}


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the files of KERNEL_GROUP as one (xdist's own `loadgroup`
    marks a test by rewriting its node id, which pytest 9 no longer lets it do)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "storylm-kernels" if Path(path).stem in KERNEL_GROUP else path
    return ByFile(config, log)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """tests/hf_checkpoints.py's Hugging Face folders by name -> (folder, the transformers
    model), each written once per session for every file that asks (skipped without torch)."""
    from hf_checkpoints import checkpoints
    return checkpoints(tmp_path_factory)


@pytest.fixture(scope="session")
def kina_model(checkpoint):
    """The StoryLM of each of those folders by name, loaded once per session."""
    from hf_checkpoints import models
    return models(checkpoint)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/ from the current compiler")


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden")


@pytest.fixture(autouse=True, scope="session")
def _cache_dir(request, tmp_path_factory):
    """One compile cache for the session, kept between sessions in pytest's cache folder
    (.pytest_cache/d/kina-compile-cache), so the kernels many tests share (the models'
    attention and prefill, StoryLM's layer, each per dtype and size) are built once, not
    again by every session. Keeping it is safe: the cache key covers the compiler's own
    code, the LLVM version, the CPU and the options. KINA_CACHE_DIR, if set, wins; with
    `-p no:cacheprovider` the session gets a fresh folder, so every build is cold. Tests
    that need a real build set KINA_NO_CACHE or a KINA_CACHE_DIR of their own."""
    if "KINA_CACHE_DIR" in os.environ:
        yield
        return
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("kina-compile-cache") if cache is not None else tmp_path_factory.mktemp("kina-cache")
    with knobs.scoped(KINA_CACHE_DIR=folder):
        yield


def assert_same(got: np.ndarray, want: np.ndarray, rtol: float = 0.0, atol: float = 0.0, what: str = "result"):
    """Shape, then dtype, then values; rtol=atol=0 means bit-exact (NaNs compare equal)."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if rtol == 0 and atol == 0:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what, equal_nan=True)


def check_against_numpy(source: str, fn: str, *inputs: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6,
                        exact: tuple[int, ...] = (), dtypes=None, dims=None):
    """Compile and interpret `source` (specialised with `dtypes` and `dims`); compare `fn`'s
    results. Results listed in `exact` must match bit for bit."""
    compiled = getattr(kina.compile_source(source, "<test>", dtypes=dtypes, dims=dims), fn)(*inputs)
    reference = getattr(kina.interpret(source, "<test>", dtypes=dtypes, dims=dims), fn)(*inputs)
    assert len(compiled) == len(reference)
    for i, (got, want) in enumerate(zip(compiled, reference)):
        if i in exact:
            assert_same(got, want, what=f"result {i}")
        else:
            assert_same(got, want, rtol=rtol, atol=atol, what=f"result {i}")
    return compiled


CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHAT_CORPUS = ["Once upon a time there was a little fox.", "The fox liked to run in the woods, and the owl watched.",
               "What is the capital of France? Paris is the capital of France.", "Hello! How are you today?"] * 20


@pytest.fixture(scope="session")
def chat_folder(checkpoint, tmp_path_factory):
    """An instruct model for kina.apps' tests: tests/hf_checkpoints.py's llama-mha weights (the same
    kernel build) with a byte-level BPE trained here, whose specials are <s> 0, </s> 1, <|im_start|> 2
    and <|im_end|> 3 (EOS, the end of a turn), a ChatML template, and a context of 4096."""
    import json
    import shutil
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CHAT_CORPUS, trainer)
    folder = tmp_path_factory.mktemp("chat") / "tiny-chat"
    shutil.copytree(checkpoint("llama-mha")[0], folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>",
                                         chat_template=CHATML).save_pretrained(folder)
    for name, changes in (("config.json", {"max_position_embeddings": 4096, "eos_token_id": 3}),
                          ("generation_config.json", {"eos_token_id": 3})):
        path = folder / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return folder
