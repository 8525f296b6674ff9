"""A chat session: the conversation, rendered by the model's template, on one KV cache kept between turns.

In:  a `Pretrained` model with a chat template, an optional system message, then the user's
     messages one at a time.
Out: `ChatSession`: `ask(content, ...)` -> the `Reply` to the conversation so far (the caller
     advances it, and may stop it), `end(reply)` records the answer; `say(content)` does both;
     `reset()`, `save(path)`, `load(path)`; `messages`.

Guarantees:
  - A turn prefills only its new tokens: the whole conversation is rendered and encoded, and
    the session's `Slot` keeps the longest common prefix of what its cache holds and the new
    prompt (the tokens the template writes differently from what the model generated, such as
    the end-of-turn token it was not fed, are the only ones run again).
  - A reply stopped by the caller (Ctrl-C) is kept as the answer, as far as it got, and the
    cache holds exactly the tokens it ran (`len(slot.ids) == cache.n_filled`), so the next turn
    is consistent. A turn that cannot be asked (a conversation past the context, a template
    that refuses it) raises before anything changes.
  - `save` writes the messages as JSON ({"format": "kina-chat-1", "model", "messages"}); `load`
    reads them back (checking each message), replacing the conversation; the cache is then
    reused as far as the new conversation agrees with it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from .. import files
from ..models.sampling import Sampler
from .decoding import Completion, Pretrained, Reply, Slot, no_template
from .template import TemplateError

FORMAT = "kina-chat-1"


class SessionError(ValueError):
    """A session file that cannot be read as a conversation."""


class ChatSession:
    def __init__(self, model: Pretrained, system: str | None = None):
        if model.template is None:
            raise TemplateError(no_template(model.path))
        self.model, self.system = model, system
        self.slot = Slot(model.model)
        self.messages: list[dict] = []
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system message stays); the cache is kept for its prefix."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def ask(self, content: str, sampler: Sampler = Sampler(), **settings) -> Reply:
        """The reply to the conversation with the user's `content` added (max_new_tokens, stop: the
        Reply's); nothing changes if it cannot be asked."""
        messages = [*self.messages, {"role": "user", "content": content}]
        reply = self.model.reply(self.model.chat_ids(messages), sampler, self.slot, **settings)
        self.messages = messages
        return reply

    def end(self, reply: Reply) -> Completion:
        """Record the reply's text (as far as it got) as the assistant's answer."""
        if not reply.done:
            reply.finish("interrupted")
        self.messages.append({"role": "assistant", "content": reply.completion.text})
        return reply.completion

    def say(self, content: str, sampler: Sampler = Sampler(), on_text: Callable[[str], None] | None = None,
            **settings) -> Completion:
        reply = self.ask(content, sampler, **settings)
        while not reply.done:
            piece = reply.advance()
            if piece and on_text is not None:
                on_text(piece)
        return self.end(reply)

    def save(self, path: str | os.PathLike) -> None:
        data = {"format": FORMAT, "model": self.model.name, "messages": self.messages}
        Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")

    def load(self, path: str | os.PathLike) -> None:
        try:
            data = files.read_json(Path(path))
        except files.FileError as e:
            raise SessionError(str(e)) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("messages"), list):
            raise SessionError(f"{path}: not a saved chat (expected a JSON object with \"format\": \"{FORMAT}\" "
                               "and \"messages\")")
        for i, m in enumerate(data["messages"]):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise SessionError(f"{path}: messages[{i}]: expected {{\"role\": str, \"content\": str}}")
        self.messages = [{"role": m["role"], "content": m["content"]} for m in data["messages"]]
