"""Text in and out of a Hugging Face folder: sampling (kina.models.sampling), the
tokenizer and generate (kina.apps), and the `kina generate` command, on
tests/hf_checkpoints.py's llama-mha with a byte-level BPE trained here. Greedy text
equals transformers' own; sampling is seeded and follows the softmax; the command's
errors and its interruption are one line each.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hf_checkpoints import PROMPT, torch, transformers  # noqa: F401

tokenizers = pytest.importorskip("tokenizers")

from conftest import ROOT  # noqa: E402
from kina.apps import Pretrained  # noqa: E402
from kina.apps.cli import main  # noqa: E402
from kina.models.tokenizer import from_folder as load_tokenizer  # noqa: E402
from kina.models.sampling import Sampler  # noqa: E402


# -- sampling ------------------------------------------------------------------------------

def test_sampling_is_seeded_and_top_k_1_is_greedy(kina_model):
    m = kina_model("llama-mha")
    sample = lambda **kw: [t for t, _, _ in m.stream(PROMPT, 24, choose=Sampler(**kw).chooser())]
    a, b = sample(temperature=1.0, seed=3), sample(temperature=1.0, seed=3)
    assert a == b and a != sample(temperature=1.0, seed=4)
    assert sample(temperature=0.7, top_k=1, seed=5) == m.generate(PROMPT, 24) == sample()


def test_the_empirical_distribution_matches_the_softmax(kina_model):
    """At the prompt's last position: 20000 draws against softmax(logits / T), a chi-square
    bound (p ~ 1e-6 for a correct sampler), and top-k / top-p keep exactly their sets."""
    logits = kina_model("llama-mha").recompute(PROMPT).astype(np.float64)
    n = 20000
    for sampler in (Sampler(temperature=0.5, seed=1), Sampler(temperature=0.5, top_k=5, seed=2),
                    Sampler(temperature=0.5, top_p=0.6, seed=3)):
        z = logits / 0.5
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p)
        if sampler.top_k:
            keep = order[:sampler.top_k]
        elif sampler.top_p < 1:
            keep = order[:np.searchsorted(np.cumsum(p[order]), sampler.top_p) + 1]
        else:
            keep = order
        want = np.zeros_like(p)
        want[keep] = p[keep] / p[keep].sum()
        np.testing.assert_allclose(sampler.probabilities(logits), want, rtol=1e-12, atol=1e-15)
        choose = sampler.chooser()
        counts = np.bincount([choose(logits) for _ in range(n)], minlength=p.size)
        assert counts[want == 0].sum() == 0
        big = want * n >= 5  # the cells a chi-square test can use; the rest pooled
        observed = np.append(counts[big], counts[~big].sum())
        expected = np.append(want[big] * n, want[~big].sum() * n)
        used = expected > 0
        chi2 = (((observed - expected) ** 2)[used] / expected[used]).sum()
        dof = used.sum() - 1
        assert chi2 < dof + 7 * np.sqrt(2 * dof) + 10, (chi2, dof)


@pytest.mark.parametrize("kw, words", [(dict(temperature=-1), "temperature"), (dict(top_k=-2), "top_k"),
                                       (dict(top_p=0.0), "top_p"), (dict(seed=1.5), "seed")])
def test_bad_sampler_settings(kw, words):
    with pytest.raises(ValueError, match=words):
        Sampler(**kw)


# -- text and the command --------------------------------------------------------------------

CORPUS = ["Once upon a time there was a little fox.", "The fox liked to run in the woods, and the owl watched.",
          "Every evening the owl told the fox a story about the moon."] * 20


@pytest.fixture(scope="session")
def text_folder(checkpoint, tmp_path_factory):
    """llama-mha's folder with a byte-level BPE trained here (BOS <s> = 0, EOS </s> = 1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    folder = tmp_path_factory.mktemp("text")
    shutil.copytree(checkpoint("llama-mha")[0], folder, dirs_exist_ok=True)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    return folder


def test_the_tokenizer_round_trips_text(text_folder):
    text = load_tokenizer(text_folder)
    assert (text.bos_id, text.eos_ids) == (0, (1,))
    for s in ["Once upon a time", "the owl, the fox and the moon.", "héllo wörld ☃"]:
        ids = text.encode(s)
        assert ids[0] == 0 and ids.count(0) == 1  # the post-processor's BOS, not added twice
        assert text.decode(ids) == s


def test_generate_text_matches_transformers(text_folder, checkpoint):
    m = Pretrained(text_folder)
    out = m.generate("Once upon a time", max_new_tokens=40)
    hf = checkpoint("llama-mha")[1]
    with torch.no_grad():
        ids = torch.tensor([out.prompt_ids])  # (the mask given: BOS 0 is also the pad id)
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                           eos_token_id=1, pad_token_id=0)[0, len(out.prompt_ids):].tolist()
    assert out.ids == want
    assert out.text == load_tokenizer(text_folder).tokenizer.decode(want, skip_special_tokens=True)
    assert m.generate(out.prompt_ids, max_new_tokens=40).ids == out.ids  # text or ids
    if 1 in out.ids:
        assert out.ids[-1] == 1  # stopped at EOS
    assert len(out.text) > 6
    pieces = []  # streamed text is the text
    assert m.generate("Once upon a time", max_new_tokens=40, on_text=pieces.append).text == "".join(pieces)
    stop = out.text[4:7]  # a stop string cuts the text before it, stops, and is never streamed
    pieces = []
    cut = m.generate("Once upon a time", max_new_tokens=40, stop=[stop], on_text=pieces.append)
    assert cut.text == "".join(pieces) == out.text[:out.text.index(stop)] and len(cut.ids) < len(out.ids)


def test_kina_generate_json(text_folder, capsys):
    assert main(["generate", str(text_folder), "--prompt", "Once upon a time", "--max-new-tokens", "12",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == {"prompt_ids", "ids", "text", "prefill_ms", "decode_ms_per_token", "tokens_per_s",
                        "finish_reason", "model", "dtype", "weight_dtype", "ctx_size", "seed", "load_ms"}
    assert got["finish_reason"] in ("eos", "length") and got["model"] == text_folder.name and got["seed"] is None
    m = Pretrained(text_folder)
    want = m.generate("Once upon a time", max_new_tokens=12)
    assert (got["prompt_ids"], got["ids"], got["text"]) == (want.prompt_ids, want.ids, want.text)
    assert main(["generate", str(text_folder), "--prompt-ids", "0,5,17", "--max-new-tokens", "8", "--json",
                 "--temperature", "0.9", "--top-p", "0.8", "--seed", "7"]) == 0
    first = json.loads(capsys.readouterr().out)
    main(["generate", str(text_folder), "--prompt-ids", "0,5,17", "--max-new-tokens", "8", "--json",
          "--temperature", "0.9", "--top-p", "0.8", "--seed", "7"])
    assert json.loads(capsys.readouterr().out)["ids"] == first["ids"] and first["prompt_ids"] == [0, 5, 17]


def test_kina_generate_streams_text_as_a_module(text_folder):
    """`python -m kina.apps generate ...` prints the decoded text and the timings."""
    import os
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "kina.apps", "generate", str(text_folder), "--prompt",
                           "Once upon a time", "--max-new-tokens", "16"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    want = Pretrained(text_folder).generate("Once upon a time", max_new_tokens=16).text
    assert proc.stdout == want + "\n"
    assert "prefill" in proc.stderr and "tokens/s" in proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["generate", "/nonexistent/model", "--prompt-ids", "1"], "/nonexistent/model: no such model folder or file"),
    (["generate", "{folder}", "--prompt-ids", "1,999"], "token id 999 is out of range"),
    (["generate", "{folder}", "--prompt-ids", "1", "--top-p", "2"], "--top-p: expected a number in (0, 1]"),
    (["generate", "{folder}", "--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens: expected an int >= 1"),
    (["generate", "{folder}", "--prompt", "hi"], "tokenizer.json: no such file"),
    (["generate", "{folder}", "--prompt-ids", "1", "--dtype", "F8"], "argument --dtype: invalid choice: 'F8'"),
    (["generate", "{folder}"], "one of the arguments --prompt --prompt-ids is required"),
])
def test_kina_generate_errors_are_one_line(checkpoint, capsys, argv, words):
    folder = str(checkpoint("llama-mha")[0])
    capsys.readouterr()  # what building the checkpoint printed (transformers' progress bars)
    try:
        status = main([a.replace("{folder}", folder) for a in argv])
    except SystemExit as e:  # argparse's usage errors: 2, as argparse has it
        status = e.code - 1
    assert status == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("when", ["start", "decode"])
def test_kina_generate_interrupted_exits_130_with_one_line(checkpoint, when):
    """Ctrl-C while `kina generate` starts, or once it is decoding (its first ids streamed
    to stdout): its one line and exit status 130.

    The tiny model decodes its last 104 tokens in a few milliseconds, so on a loaded
    machine the interrupt can land after the command has printed everything, while the
    interpreter shuts down (its handlers reset, the default action kills it, -SIGINT) or
    after it has exited (status 0). Such a late try is tried again, up to five times;
    every try that lands while the command runs must give the line and 130."""
    import os
    import signal
    import time
    folder = str(checkpoint("llama-mha")[0])
    code = "import sys\nsys.argv[0] = 'kina'\nfrom kina.__main__ import kina\nsys.exit(kina())"
    for attempt in range(5):
        proc = subprocess.Popen([sys.executable, "-c", code, "generate", folder, "--prompt-ids", "1,2,3",
                                 "--max-new-tokens", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        seen = ""
        if when == "start":
            time.sleep(0.05)
        else:
            seen = proc.stdout.read(1)  # the first digit of the first id: decoding
            assert seen.isdigit(), seen
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        out, err = proc.communicate(timeout=120)
        out = seen + out
        if when == "start" and (proc.returncode == -signal.SIGINT or err.rstrip().endswith("KeyboardInterrupt")):
            return  # the interpreter's own start, before the entry point's first statement (tests/test_interrupts.py)
        if when == "decode" and out.strip() and proc.returncode in (0, -signal.SIGINT):
            continue  # too late: every id was already printed (see above)
        assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err)
        assert err.endswith("kina generate: interrupted\n"), err
        return
    pytest.fail("every interrupt landed after kina generate had finished")
