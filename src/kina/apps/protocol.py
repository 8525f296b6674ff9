"""The OpenAI API's requests and responses, as `kina serve` reads and writes them.

In:  a request's JSON body for POST /v1/chat/completions or /v1/completions, and the served
     model's name.
Out: `parse(body, chat=...)` -> `Params` (checked), or an `ApiError`; the response objects
     (`completion_json`, `chunk_json`, `models_json`) and `error_json`, as OpenAI's
     clients (the `openai` package) read them.

Guarantees: every field the server acts on is checked for its type and range, and a request
Kina cannot honour is refused rather than half-done: `ApiError(status, message, param, code)`
with OpenAI's error object {"error": {"message", "type", "param", "code"}}: 400 for bad JSON, a
wrong type or value, or an option Kina does not support (`n` > 1, tools, logprobs, ... each
named); 404 for another model's name; 413 for a prompt past the context; 503 when busy.
Unknown fields are ignored, as llama-server ignores them.
"""
from __future__ import annotations

import json
import numbers
import time
import uuid
from dataclasses import dataclass, field

from .decoding import OPENAI_FINISH, Completion

ROLES = ("system", "developer", "user", "assistant")
# options Kina does not support: the field -> the value that means "not used"
UNSUPPORTED = {"tools": None, "functions": None, "function_call": None, "logprobs": False, "top_logprobs": None,
               "logit_bias": None, "presence_penalty": 0, "frequency_penalty": 0, "echo": False, "best_of": 1,
               "suffix": None, "audio": None, "prediction": None}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_json(e: ApiError) -> dict:
    kind = {404: "not_found_error", 503: "server_error"}.get(e.status, "invalid_request_error")
    return {"error": {"message": e.message, "type": kind, "param": e.param, "code": e.code}}


@dataclass
class Params:
    model: str | None
    messages: list[dict] | None = None  # chat
    prompt: str | list[int] | None = None  # completions: text or token ids
    max_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def loads(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, got {_kind(body)}", code="invalid_json")
    return body


def parse(body: dict, chat: bool) -> Params:
    for name, idle in UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value != idle and value != [] and value != {}:
            raise ApiError(400, f"{name}: not supported by kina serve", param=name, code="unsupported")
    n = _get(body, "n", numbers.Integral, 1)
    if n != 1:
        raise ApiError(400, f"n: only 1 choice per request is supported, got {n}", param="n", code="unsupported")
    if chat and body.get("tool_choice") not in (None, "none"):
        raise ApiError(400, "tool_choice: not supported by kina serve", param="tool_choice", code="unsupported")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise ApiError(400, "response_format: only {\"type\": \"text\"} is supported", param="response_format",
                       code="unsupported")
    p = Params(model=_get(body, "model", str, None))
    if chat:
        p.messages = _messages(body.get("messages"))
    else:
        p.prompt = _prompt(body.get("prompt"))
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    p.max_tokens = _get({"max_tokens": limit}, "max_tokens", numbers.Integral, None)
    if p.max_tokens is not None and p.max_tokens < 1:
        raise ApiError(400, f"max_tokens: expected an integer >= 1, got {p.max_tokens}", param="max_tokens")
    p.temperature = float(_get(body, "temperature", numbers.Real, 1.0))
    if not 0 <= p.temperature <= 2:
        raise ApiError(400, f"temperature: expected a number from 0 to 2, got {p.temperature}", param="temperature")
    p.top_p = float(_get(body, "top_p", numbers.Real, 1.0))
    if not 0 < p.top_p <= 1:
        raise ApiError(400, f"top_p: expected a number in (0, 1], got {p.top_p}", param="top_p")
    p.seed = _get(body, "seed", numbers.Integral, None)
    if p.seed is not None and p.seed < 0:
        p.seed &= (1 << 64) - 1  # OpenAI's seeds may be negative; NumPy's may not
    stop = body.get("stop")
    p.stop = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(p.stop, list) or not all(isinstance(s, str) for s in p.stop):
        raise ApiError(400, f"stop: expected a string or a list of strings, got {_kind(stop)}", param="stop")
    p.stream = _get(body, "stream", bool, False)
    options = _get(body, "stream_options", dict, None) or {}
    p.include_usage = bool(options.get("include_usage", False))
    return p


def _get(body: dict, name: str, kind, default):
    value = body.get(name)
    if value is None:
        return default
    if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
        want = {numbers.Integral: "an integer", numbers.Real: "a number", str: "a string", bool: "true or false",
                dict: "an object"}[kind]
        raise ApiError(400, f"{name}: expected {want}, got {_kind(value)}", param=name, code="invalid_type")
    return value


def _kind(value) -> str:
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number", list: "an array",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"messages: expected a non-empty array of messages, got {_kind(value)}", param="messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where}: expected an object, got {_kind(m)}", param=where)
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ApiError(400, f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)
                       for c in content):
                raise ApiError(400, f"{where}.content: only text parts are supported", param=f"{where}.content",
                               code="unsupported")
            content = "".join(c["text"] for c in content)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise ApiError(400, f"{where}.content: expected a string, got {_kind(content)}", param=f"{where}.content")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def _prompt(value) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        raise ApiError(400, "prompt: one prompt per request is supported", param="prompt", code="unsupported")
    raise ApiError(400, f"prompt: expected a string or an array of token ids, got {_kind(value)}", param="prompt")


# -- responses -------------------------------------------------------------------------------

def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(done: Completion) -> dict:
    return {"prompt_tokens": len(done.prompt_ids), "completion_tokens": len(done.ids),
            "total_tokens": len(done.prompt_ids) + len(done.ids)}


def completion_json(chat: bool, rid: str, model: str, done: Completion) -> dict:
    reason = OPENAI_FINISH[done.finish_reason]
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": done.text}, "logprobs": None,
                  "finish_reason": reason}
    else:
        choice = {"index": 0, "text": done.text, "logprobs": None, "finish_reason": reason}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage(done)}


def chunk_json(chat: bool, rid: str, model: str, text: str | None = None, role: bool = False,
               done: Completion | None = None, with_usage: bool = False, no_choices: bool = False) -> dict:
    """One streamed chunk: a piece of text, the first (chat: the role), the last (the finish
    reason; with its usage), or, with `no_choices`, OpenAI's usage-only chunk."""
    reason = OPENAI_FINISH[done.finish_reason] if done is not None else None
    if chat:
        delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    out = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
           "model": model, "choices": [] if no_choices else [choice]}
    if with_usage and done is not None:
        out["usage"] = usage(done)
    return out


def models_json(model: str, created: float) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": int(created), "owned_by": "kina"}]}
