"""`kina serve` (kina.apps.server) through the official `openai` client and raw HTTP, against one
live server on 127.0.0.1 for the whole file (conftest's tiny `chat_folder`, 2 slots, a queue of 2):
chat and completions with and without streaming (each equal to the model run in-process), several
clients at once, a client that disconnects mid-stream (its generation stops), a full queue (503),
and each bad request with OpenAI's error object and status.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from conftest import ROOT  # noqa: E402
from kina.apps import Pretrained  # noqa: E402

NAME = "tiny-chat"


@pytest.fixture(scope="module")
def server(chat_folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "kina.apps", "serve", str(chat_folder), "--port", "0",
                                 "--parallel", "2", "--queue", "2"], stdout=f, stderr=f, env=env)
    try:
        for _ in range(1200):
            m = re.search(r"at http://127\.0\.0\.1:(\d+)/v1", log.read_text())
            if m or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert m, log.read_text()
        yield int(m.group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(chat_folder):
    return Pretrained(chat_folder)


def expected(model, prompt, n, chat=True):
    ids = model.chat_ids(prompt) if chat else model.encode(prompt)
    return model.generate(ids, max_new_tokens=n)


def request(port, method, path, body=None, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, r.read().decode()


def ask(text):
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [NAME]
    status, body = request(server, "GET", "/health")
    got = json.loads(body)
    assert status == 200 and got["status"] == "ok" and got["slots"] == 2


def test_chat_with_and_without_streaming(client, model):
    want = expected(model, ask("What is the capital of France?"), 12)
    r = client.chat.completions.create(model=NAME, messages=ask("What is the capital of France?"), max_tokens=12,
                                       temperature=0)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ("stop" if want.finish_reason == "eos" else "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_ids), len(want.ids))
    chunks = list(client.chat.completions.create(model=NAME, messages=ask("What is the capital of France?"),
                                                 max_tokens=12, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason and chunks[-1].usage == r.usage
    assert all(c.usage is None for c in chunks[:-1])
    spec = list(client.chat.completions.create(model=NAME, messages=ask("What is the capital of France?"),
                                               max_tokens=12, temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
    assert spec[-1].choices == [] and spec[-1].usage == r.usage and spec[-2].choices[0].finish_reason


def test_completions_and_the_raw_stream(client, model, server):
    want = expected(model, "Once upon a time", 10, chat=False)
    r = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=10, temperature=0)
    assert r.choices[0].text == want.text and r.usage.completion_tokens == len(want.ids)
    streamed = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=10, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want.text
    status, body = request(server, "POST", "/v1/completions",
                           {"prompt": "Once upon a time", "max_tokens": 4, "stream": True, "temperature": 0.7,
                            "seed": 5})
    events = body.split("\n\n")
    assert status == 200 and events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: ") for e in events[:-1])
    assert "usage" in json.loads(events[-3][6:]) and json.loads(events[-3][6:])["choices"][0]["finish_reason"]
    again = request(server, "POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4, "stream": True,
                                                        "temperature": 0.7, "seed": 5})[1]
    texts = lambda b: [json.loads(e[6:])["choices"][0]["text"] for e in b.split("\n\n")[:-2]]  # noqa: E731
    assert texts(again) == texts(body)  # the same seed, the same tokens


def test_several_clients_at_once(client, model):
    """Four requests at once (two streamed) on two slots and a queue of two: each answer is what the
    model gives its prompt alone."""
    prompts = [f"Tell me about the {w}." for w in ("fox", "owl", "moon", "woods")]
    wants = [expected(model, ask(p), 16).text for p in prompts]

    def one(i):
        if i % 2:
            stream = client.chat.completions.create(model=NAME, messages=ask(prompts[i]), max_tokens=16, temperature=0,
                                                    stream=True)
            return "".join(c.choices[0].delta.content or "" for c in stream)
        return client.chat.completions.create(model=NAME, messages=ask(prompts[i]), max_tokens=16,
                                              temperature=0).choices[0].message.content
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(one, range(4))) == wants


def _health(port):
    return json.loads(request(port, "GET", "/health")[1])


def _open_stream(port, body, stream=True):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": stream}),
                 headers={"Content-Type": "application/json"})
    return conn, conn.getresponse() if stream else None


@pytest.mark.parametrize("stream", [True, False], ids=["mid-stream", "waiting"])
def test_a_client_that_disconnects_stops_its_generation(server, model, stream):
    body = {"prompt": [5, 17, 2, 88], "max_tokens": 1500, "temperature": 0}
    if stream:
        full = model.generate([5, 17, 2, 88], max_new_tokens=1500)
        assert full.finish_reason == "length"  # undisturbed, it would make all 1500
    before = _health(server)["tokens_generated"]
    conn, r = _open_stream(server, body, stream)
    if stream:
        assert r.status == 200 and r.readline().startswith(b"data: ")
    else:
        time.sleep(0.05)
    conn.sock.close()  # gone
    conn.close()
    for _ in range(200):
        h = _health(server)
        if h["requests_running"] == 0:
            break
        time.sleep(0.05)
    assert h["requests_running"] == 0
    assert h["tokens_generated"] - before < 1000, h


def test_a_full_queue_is_503(server):
    """Two slots and a queue of two: a fifth long request at once is refused, OpenAI-style."""
    opened = [_open_stream(server, {"prompt": [5, 17], "max_tokens": 1500, "temperature": 0}) for _ in range(4)]
    try:
        assert all(r.status == 200 for _, r in opened)
        status, body = request(server, "POST", "/v1/completions", {"prompt": [5, 17], "max_tokens": 10})
        assert status == 503 and json.loads(body)["error"]["code"] == "server_busy"
    finally:
        for conn, _ in opened:
            conn.sock.close()
            conn.close()
    for _ in range(200):
        if _health(server)["requests_running"] == 0:
            break
        time.sleep(0.05)


@pytest.mark.parametrize("path, body, status, param, code, words", [
    ("/v1/chat/completions", b"{not json", 400, None, "invalid_json", "the body is not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", 400, None, "invalid_json", "must be a JSON object, got an array"),
    ("/v1/chat/completions", {"messages": ask("hi"), "temperature": "hot"}, 400, "temperature", "invalid_type",
     "temperature: expected a number, got a string"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages", None, "messages: expected a non-empty array"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", None,
     "expected one of system"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", None, "expected an integer >= 1"),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": ask("hi")}, 404, "model", "model_not_found",
     "the model 'gpt-4o' does not exist"),
    ("/v1/completions", {"prompt": "fox " * 4200}, 413, "prompt", "context_length_exceeded",
     "and the context holds 4096"),
    ("/v1/chat/completions", {"messages": ask("hi"), "n": 2}, 400, "n", "unsupported", "n: only 1 choice"),
    ("/v1/chat/completions", {"messages": ask("hi"), "tools": [{"type": "function"}]}, 400, "tools", "unsupported",
     "tools: not supported"),
    ("/v1/chat/completions", {"messages": ask("hi"), "logprobs": True}, 400, "logprobs", "unsupported", "logprobs"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", "unsupported", "one prompt per request"),
])
def test_bad_requests_are_openai_errors(server, path, body, status, param, code, words):
    got_status, got = request(server, "POST", path, raw=body if isinstance(body, bytes) else json.dumps(body).encode())
    error = json.loads(got)["error"]
    assert got_status == status and words in error["message"], got
    assert (error["param"], error["code"]) == (param, code) and error["type"] in ("invalid_request_error",
                                                                                   "not_found_error")


def test_the_client_sees_errors_as_its_own(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=ask("hi"))
    with pytest.raises(openai.BadRequestError, match="n: only 1 choice"):
        client.chat.completions.create(model=NAME, messages=ask("hi"), n=3)
