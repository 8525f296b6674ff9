"""Chat (kina.apps): the chat template against transformers' apply_chat_template, a session's
turns prefilling only their new tokens (counted), /reset /save /load, Ctrl-C during a reply,
`kina chat` at a pseudo-terminal, and a base model told apart; on conftest's tiny `chat_folder`.
"""
from __future__ import annotations

import io
import json
import os
import signal
import sys

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("jinja2")

from conftest import CHATML  # noqa: E402
from kina.apps import Pretrained, Slot  # noqa: E402
from kina.apps.cli import main  # noqa: E402
from kina.apps.decoding import common_prefix  # noqa: E402
from kina.apps.session import ChatSession, SessionError  # noqa: E402
from kina.apps.template import ChatTemplate, TemplateError  # noqa: E402
from terminal_screen import run_in_pty, screen  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! \"quoted\" <b>"}, {"role": "user", "content": "What now?"}]
# raise_exception, strftime_now, tojson (transformers' own: no HTML escapes), loop controls, bos_token
STRICT = ("{{ bos_token }}{% if messages[0]['role'] != 'system' %}{{ raise_exception('the first message must be "
          "the system message') }}{% endif %}Today is {{ strftime_now('%Y-%m-%d') }}.\n"
          "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
          "[{{ m['role'] }}] {{ m['content'] | tojson }}\n{% endfor %}"
          "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def model(chat_folder):
    return Pretrained(chat_folder)


@pytest.mark.parametrize("source", [CHATML, STRICT], ids=["chatml", "raise-strftime-tojson"])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_the_template_renders_as_transformers(chat_folder, source, generation_prompt):
    hf = transformers.AutoTokenizer.from_pretrained(chat_folder)
    want = hf.apply_chat_template(MESSAGES, chat_template=source, tokenize=False,
                                  add_generation_prompt=generation_prompt)
    got = ChatTemplate(source, bos_token="<s>", eos_token="<|im_end|>").render(MESSAGES, generation_prompt)
    assert got == want and ("Today is" in got) == (source == STRICT)
    if source == STRICT:
        with pytest.raises(TemplateError, match="^the chat template: the first message must be the system message$"):
            ChatTemplate(source).render(MESSAGES[1:])
        with pytest.raises(Exception, match="the first message must be"):  # transformers refuses it too
            hf.apply_chat_template(MESSAGES[1:], chat_template=source, tokenize=False)


def test_a_bad_template_is_one_line_and_the_sandbox_holds():
    with pytest.raises(TemplateError, match=r"^x.jinja: line 1: .*") as e:
        ChatTemplate("{% for m in messages %}", where="x.jinja")
    assert "\n" not in str(e.value)
    with pytest.raises(TemplateError, match="unsafe|access"):  # no way out of the sandbox
        ChatTemplate("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render(MESSAGES)


def test_the_model_template_and_ids_are_transformers(model, chat_folder):
    hf = transformers.AutoTokenizer.from_pretrained(chat_folder)
    assert model.chat_ids(MESSAGES) == hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                              return_dict=False)


def _counting(model):
    """The tokens the model's decoder prefills, counted (prefill calls; decode steps are apart)."""
    counted = []
    decoder = model.model
    prefill = type(decoder).prefill
    decoder.prefill = lambda tokens, cache: (counted.append(len(tokens)), prefill(decoder, tokens, cache))[1]
    return counted


def test_each_turn_prefills_only_its_new_tokens(model):
    counted = _counting(model)
    try:
        session = ChatSession(model, system="You are terse.")
        done = []
        for i, question in enumerate(["Hello!", "What is the capital of France?", "And of the fox?", "Thanks"]):
            held = list(session.slot.ids)
            counted.clear()
            out = session.say(question, max_new_tokens=6)
            assert sum(counted) == len(out.prompt_ids) - out.reused  # prefilled: only what the cache lacked
            assert len(session.slot.ids) == session.slot.cache.n_filled
            if i:
                assert out.reused >= len(done[-1].prompt_ids)
                assert out.reused == min(common_prefix(held, out.prompt_ids), len(out.prompt_ids) - 1)
                assert sum(counted) < len(out.prompt_ids) // 2
            # the same answer as a fresh cache prefilled with the whole conversation
            fresh = model.reply(out.prompt_ids, slot=Slot(model.model), max_new_tokens=6)
            while not fresh.done:
                fresh.advance()
            assert fresh.completion.ids == out.ids and fresh.completion.reused == 0
            done.append(out)
        assert [m["role"] for m in session.messages] == ["system"] + ["user", "assistant"] * 4
    finally:
        del model.model.prefill


def test_reset_save_load(model, tmp_path):
    session = ChatSession(model, system="Be brief.")
    first = session.say("Hello!", max_new_tokens=5)
    session.save(tmp_path / "chat.json")
    saved = json.loads((tmp_path / "chat.json").read_text())
    assert saved["format"] == "kina-chat-1" and saved["messages"] == session.messages
    assert saved["messages"][-1] == {"role": "assistant", "content": first.text}
    session.reset()
    assert session.messages == [{"role": "system", "content": "Be brief."}]
    again = session.say("Hello!", max_new_tokens=5)  # the system message's tokens are still cached
    assert again.ids == first.ids and again.reused >= len(model.chat_ids(session.messages[:1], False)) - 1
    session.load(tmp_path / "chat.json")
    assert session.messages == saved["messages"]
    nxt = session.say("More?", max_new_tokens=5)
    assert nxt.reused >= len(first.prompt_ids)  # the loaded conversation agrees with the cache
    (tmp_path / "bad.json").write_text('{"format": "kina-chat-1", "messages": [{"role": 1}]}')
    with pytest.raises(SessionError, match=r"bad.json: messages\[0\]: expected"):
        session.load(tmp_path / "bad.json")
    with pytest.raises(SessionError, match="no such file"):
        session.load(tmp_path / "missing.json")


def test_a_stopped_reply_is_kept_and_the_cache_matches(model):
    session = ChatSession(model)
    reply = session.ask("Tell me a story.", max_new_tokens=40)
    for _ in range(4):  # the prefill and three tokens
        reply.advance()
    done = session.end(reply)
    assert done.finish_reason == "interrupted" and len(done.ids) == 4
    assert session.messages[-1] == {"role": "assistant", "content": done.text}
    assert session.slot.ids == done.prompt_ids + done.ids[:-1] and session.slot.cache.n_filled == len(session.slot.ids)
    nxt = session.say("Go on.", max_new_tokens=5)
    fresh = model.generate(nxt.prompt_ids, max_new_tokens=5)
    assert nxt.ids == fresh.ids


class _Interrupting(io.StringIO):
    """stdout that sends this process SIGINT at the `at`-th write of a reply's text (Ctrl-C)."""

    def __init__(self, at):
        super().__init__()
        self.writes, self.at = 0, at

    def write(self, s):
        if not s.startswith(("> ", "\n", "tiny-chat:", "(")):
            self.writes += 1
            if self.writes == self.at:
                os.kill(os.getpid(), signal.SIGINT)
        return super().write(s)


def test_kina_chat_commands_and_ctrl_c(chat_folder, tmp_path, monkeypatch, capsys):
    """In-process, with stdin a file: Ctrl-C (a real SIGINT) ends the reply and the session goes on;
    /save, /reset, /load, a bad command; end of input leaves with status 0."""
    save = tmp_path / "s.json"
    lines = ["Tell me a story.", f"/save {save}", "/reset", "/frobnicate", f"/load {save}", "Hello!", ""]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines)))
    out = _Interrupting(at=3)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["chat", str(chat_folder), "-n", "60"]) == 0
    err = capsys.readouterr().err
    text = out.getvalue()
    assert err.count("[stopped]") == 1 and "kina chat: error: /frobnicate: no such command" in err
    assert "(saved 2 messages" in text and "(a new conversation)" in text and "(loaded 2 messages" in text
    saved = json.loads(save.read_text())["messages"]
    assert saved[0]["content"] == "Tell me a story." and 0 < len(saved[1]["content"]) < 60 * 4
    assert err.count("[prefill") == 2 and "reused)" in err and "Traceback" not in err


def test_kina_chat_at_a_terminal(chat_folder, model):
    """A person at a terminal: the answer stays on the screen, Ctrl-C at the prompt clears the line,
    Ctrl-D leaves."""
    want = ChatSession(model).say("Hello!", max_new_tokens=12).text
    want = "".join(c for c in want.strip().splitlines()[0] if c >= " ")  # as a terminal shows it
    status, raw = run_in_pty(["chat", str(chat_folder), "-n", "12"],
                             [("> ", "Hel"), ("Hel", "\x03"), ("> ", "Hello!\r"), ("> ", "\x04")])
    rows = screen(raw)
    assert status == 0, raw
    assert want and any(want in row for row in rows), (want, rows)
    assert any(r.startswith("> Hello!") for r in rows) and "Traceback" not in raw


def test_a_base_model_is_told_apart(checkpoint, capsys):
    folder = str(checkpoint("llama-mha")[0])
    assert main(["chat", folder]) == 1
    err = capsys.readouterr().err
    assert "has no chat template (a base model, not an instruct one?)" in err and err.count("\n") == 1
    assert main(["generate", folder, "--prompt", "hi", "--chat"]) == 1  # no tokenizer either: said first
    assert capsys.readouterr().err.count("\n") == 1
