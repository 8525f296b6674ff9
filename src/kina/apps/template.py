"""A model's chat template, rendered as transformers renders it.

In:  the template's Jinja source (a folder's chat_template.jinja or tokenizer_config.json, a GGUF
     file's `tokenizer.chat_template`: `kina.models.tokenizer.Text.chat_template`), the special
     tokens' text, and a conversation: a list of {"role": ..., "content": ...} messages.
Out: `ChatTemplate(source, bos_token=..., eos_token=...)`; `.render(messages,
     add_generation_prompt=True)` -> the prompt text (special tokens written out, as the
     tokenizer then encodes them: `Text.encode(text, add_special=False)`).

Guarantees: the environment is transformers' (`apply_chat_template`): jinja2's
`ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, `raise_exception(message)`, `strftime_now(format)` and a `tojson` that does not
escape HTML, and the template sees `messages`, `add_generation_prompt`, `tools`, `documents`,
`bos_token` and `eos_token`; so the text is the text transformers renders (tests/test_chat.py
compares the two). A template that does not parse, or that raises (`raise_exception`, an
undefined call, a sandbox violation), is a `TemplateError` of one line naming where it came from.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Sequence


class TemplateError(ValueError):
    """A chat template that does not parse or that refused a conversation."""


def _raise_exception(message):
    import jinja2
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class ChatTemplate:
    """A compiled chat template and the special tokens it is given."""

    def __init__(self, source: str, bos_token: str | None = None, eos_token: str | None = None,
                 where: str = "the chat template"):
        try:
            import jinja2
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise TemplateError("a chat template needs the jinja2 package (pip install jinja2)") from None
        self.source, self.where = source, where
        self.tokens = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols, _generation_tag()])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"{where}: line {e.lineno}: {e.message}") from None

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as the model's prompt text; with `add_generation_prompt`, ending where
        the assistant's next reply begins."""
        import jinja2
        try:
            return self._template.render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.tokens)
        except jinja2.TemplateError as e:  # raise_exception, an undefined value called, a SecurityError
            raise TemplateError(f"{self.where}: {e.message or type(e).__name__}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:  # Python errors inside it
            raise TemplateError(f"{self.where}: {type(e).__name__}: {e}") from None


def _generation_tag():
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker): its body, as is."""
    import jinja2
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()
    return Generation
