"""`kina generate` (kina.apps) for a person and for a script: the text stays on a terminal (a
pseudo-terminal, its final screen replayed), why it stopped, --json's fields, the first build
announced, and every guard rail: the context and --ctx-size, the cache sized from the context,
an impossible allocation, --threads above the cores, sampling flags without a temperature,
--stop escapes, and errors naming the flag as typed.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest

pytest.importorskip("transformers")

from kina.apps import Pretrained  # noqa: E402
from kina.apps import decoding  # noqa: E402
from kina.apps.cli import main, parser  # noqa: E402
from kina.apps.terminal import Status, build_line, unescape, watching_builds  # noqa: E402
from terminal_screen import run_in_pty, screen  # noqa: E402

QUESTION = "What is the capital of France?"


def run(capsys, *argv):
    capsys.readouterr()
    try:
        status = main([str(a) for a in argv])
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def test_the_text_stays_on_a_terminal(chat_folder):
    """Everything on one terminal (stdout and stderr both): the streamed text is on the final
    screen, on a row of its own, and the statistics and why it stopped are on rows below; a long
    prompt's prefill progress was shown, then cleared."""
    want = Pretrained(chat_folder).generate("fox " * 300, max_new_tokens=24).text
    status, raw = run_in_pty(["generate", chat_folder, "--prompt", "fox " * 300, "-n", "24"])
    rows = [r for r in screen(raw) if r]
    assert status == 0, raw
    assert "prefill 256/" in raw  # the progress of a prompt longer than one chunk
    shown = "".join(c for c in want if c >= " " or c == "\n").splitlines()
    assert rows[:len(shown)] == [s.rstrip() for s in shown], (rows, want)
    assert rows[len(shown)].startswith("stopped: --max-new-tokens (24) reached")
    assert rows[len(shown) + 1].startswith("loaded tiny-chat (LlamaForCausalLM, F32) in ") and "tokens/s" in rows[-1]


def test_why_it_stopped_and_json(chat_folder, capsys, tmp_path):
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", QUESTION, "--chat", "-n", "5", "--json",
                           "--temperature", "0.8")
    got = json.loads(out)
    assert status == 0 and got["finish_reason"] == "length" and len(got["ids"]) == 5
    assert (got["model"], got["dtype"], got["ctx_size"]) == ("tiny-chat", "F32", 4096)
    assert isinstance(got["seed"], int) and got["load_ms"] > 0  # sampling without --seed: the seed it drew
    again = json.loads(run(capsys, "generate", chat_folder, "--prompt", QUESTION, "--chat", "-n", "5", "--json",
                           "--temperature", "0.8", "--seed", got["seed"])[1])
    assert again["ids"] == got["ids"]  # the reported seed repeats it
    stop = got["text"][1:3] or "x"
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", QUESTION, "--chat", "-n", "5", "--temperature",
                           "0.8", "--seed", got["seed"], "--stop", stop)
    assert "stopped: a --stop string appeared" in err or stop not in got["text"]
    # a model whose first token ends its turn says so, and what to try
    folder = tmp_path / "eager"
    shutil.copytree(chat_folder, folder)
    first = Pretrained(chat_folder).generate("fox", max_new_tokens=1).ids[0]
    for name in ("config.json", "generation_config.json"):
        config = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**config, "eos_token_id": first}))
    status, out, err = run(capsys, "generate", folder, "--prompt", "fox")
    assert status == 0 and out == "\n"
    assert "stopped: the model ended its turn at once, without a word" in err
    assert "it is an instruct model; pass --chat to apply its chat template" in err


def test_the_first_build_is_announced(chat_folder, tmp_path, monkeypatch, capsys):
    """Before a kernel build that is not in the compile cache: one line saying what is compiled, that
    it happens once, and where it is cached; nothing on a cache hit."""
    from kina.models import kernels
    seen = []
    with watching_builds(Status(enabled=False)):
        watch = kernels.watch_build
        kernels.watch_build = lambda kernel, options: (seen.append((kernel, options)), watch(kernel, options))[1]
        kernels.program.cache_clear()  # build (from the cache, filled by the fixtures) in this process again
        Pretrained(chat_folder, max_seq_len=64)
    assert kernels.watch_build is None and len(seen) == 1
    assert capsys.readouterr().err == ""  # in the cache: nothing said
    monkeypatch.setenv("KINA_CACHE_DIR", str(tmp_path / "empty"))
    kernel, options = seen[0]
    from kina.apps.terminal import _Build
    with _Build(Status(enabled=False), kernel, options):
        pass
    err = capsys.readouterr().err
    assert err.splitlines()[0] == build_line(kernel, options)
    assert re.match(r"compiling llama.kina \(T=F32, .*W=F32\) to machine code: this happens once", err), err
    assert str(tmp_path / "empty") in err


# -- the guard rails ---------------------------------------------------------------------------------

def test_the_context_is_enforced_before_any_work(chat_folder, capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the weights were read")
    monkeypatch.setattr(decoding.checkpoints, "load", refuse)
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", "fox " * 40, "--ctx-size", "32")
    assert status == 1 and err.count("\n") == 1
    assert re.search(r"the prompt is 4\d tokens, and the context holds 32 .*--ctx-size", err), err
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", "fox", "-c", "5000")
    assert status == 1 and "--ctx-size: expected at most the model's context, 4096, got 5000" in err
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", "fox", "--ctx-size", "0")
    assert status == 2 and "argument -c/--ctx-size: expected an int >= 1, got 0" in err


def test_the_cache_is_sized_from_the_context_not_max_new_tokens(chat_folder, capsys):
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", "fox", "-c", "24", "--max-new-tokens",
                           "10000000", "--json")
    got = json.loads(out)
    assert status == 0 and got["ctx_size"] == 24 and got["finish_reason"] in ("context", "eos")
    assert len(got["prompt_ids"]) + len(got["ids"]) - 1 <= 24
    model = Pretrained(chat_folder)
    assert model.model.max_seq_len == 4096 and model.model.new_cache().nbytes == 0  # zero pages until touched


def test_an_impossible_allocation_is_one_line(chat_folder, tmp_path, capsys):
    folder = tmp_path / "huge"
    shutil.copytree(chat_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1 << 42}))
    status, out, err = run(capsys, "generate", folder, "--prompt", "fox")
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("kina generate: error: out of memory") and "pass a smaller --ctx-size" in err


def test_threads_above_the_cores_warn(chat_folder, capsys, monkeypatch):
    import os
    monkeypatch.setenv("KINA_NUM_THREADS", "1")  # restored afterwards: --threads sets it for the process
    many = len(os.sched_getaffinity(0)) + 1
    status, out, err = run(capsys, "generate", chat_folder, "--prompt-ids", "1,999", "--threads", many)
    assert f"kina generate: warning: --threads {many} is more than the {many - 1} cores" in err
    assert "--prompt-ids: token id 999 is out of range" in err and status == 1


def test_sampling_flags_without_a_temperature_warn_and_stay_greedy(chat_folder, capsys):
    greedy = json.loads(run(capsys, "generate", chat_folder, "--prompt", "fox", "-n", "6", "--json")[1])
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", "fox", "-n", "6", "--json", "--top-k", "5",
                           "--top-p", "0.5", "--seed", "3")
    assert json.loads(out)["ids"] == greedy["ids"]
    assert "warning: --top-k, --top-p, --seed have no effect without --temperature: generation is greedy" in err


def test_stop_understands_escapes():
    assert parser().parse_args(["generate", "m", "--prompt", "x", "--stop", r"\n\n", "--stop", r"a\tb\\n\x41"]).stop \
        == ["\n\n", "a\tb\\nA"]
    assert unescape(r"no escape: \q \x4") == r"no escape: \q \x4"


@pytest.mark.parametrize("flags, words", [
    (["--temperature", "-1"], "--temperature: expected a finite number >= 0"),
    (["--top-k", "-2", "--temperature", "1"], "--top-k: expected an int >= 0"),
    (["--top-p", "0", "--temperature", "1"], "--top-p: expected a number in (0, 1]"),
    (["--seed", "-4", "--temperature", "1"], "--seed: expected an int >= 0"),
    (["--system", "be brief"], "--system: needs --chat"),
    (["--weight-dtype", "F16", "--dtype", "BF16"], "--weight-dtype F16: needs --dtype F32"),
    (["--chat-template", "/nonexistent.jinja"], "--chat-template: /nonexistent.jinja"),
])
def test_errors_name_the_flag_as_typed(chat_folder, capsys, flags, words):
    status, out, err = run(capsys, "generate", chat_folder, "--prompt", "fox", *flags)
    assert status == 1 and words in err and err.count("\n") == 1, err
