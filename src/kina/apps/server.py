"""`kina serve MODEL`: the OpenAI-compatible HTTP API, on Starlette and uvicorn.

In:  the parsed flags (kina.apps.cli: the model, --host, --port, --alias, --parallel, --queue, ...).
Out: an HTTP server until Ctrl-C:
       POST /v1/chat/completions   messages -> the model's chat template -> the answer
       POST /v1/completions        a prompt (text or token ids) continued
       GET  /v1/models             the one model served (its name: --alias, or the file's)
       GET  /health                {"status": "ok", requests running and waiting, tokens generated}
     Either POST streams with "stream": true as server-sent events: `data: {chunk}` per piece of
     text, a last chunk with the finish reason and `usage` (or, with
     "stream_options": {"include_usage": true}, OpenAI's extra chunk with empty `choices` and the
     usage), then `data: [DONE]`.

Guarantees: requests are checked before they are queued (kina.apps.protocol: OpenAI's error
object, status 400/404/413), then run by the scheduler's one model thread (kina.apps.scheduler:
a bounded queue, 503 past it; slots decoded a step each in turn, each on its own cache), so
concurrent requests never share a cache. A client that disconnects (mid-stream, or waiting for
a whole answer) cancels its request: its generation stops at its next step. Sampling follows the request (`temperature`
defaults to 1, as OpenAI's does; 0 is greedy); the `seed` given makes it repeatable.
"""
from __future__ import annotations

import asyncio
import json
import socket
import sys
import time

from ..models.sampling import Sampler
from . import flags, protocol
from .decoding import ContextError, Pretrained, no_template
from .protocol import ApiError
from .scheduler import Busy, Job, Scheduler
from .template import TemplateError


def make_app(model: Pretrained, scheduler: Scheduler, name: str):
    """The Starlette application serving `model` as `name`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    started = time.time()

    class EventStream(StreamingResponse):
        """Server-sent events whose job is cancelled when the response ends for any reason (a
        client gone mid-stream included): a finished job is not affected."""

        def __init__(self, events, job: Job):
            super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
            self.job = job

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                scheduler.cancel(self.job)

    def error(e: ApiError) -> JSONResponse:
        return JSONResponse(protocol.error_json(e), status_code=e.status)

    async def health(request: Request):
        return JSONResponse({"status": "ok", "model": name, **scheduler.stats()})

    async def models(request: Request):
        return JSONResponse(protocol.models_json(name, started))

    async def chat(request: Request):
        return await complete(request, chat=True)

    async def completions(request: Request):
        return await complete(request, chat=False)

    async def complete(request: Request, chat: bool):
        try:
            p = protocol.parse(protocol.loads(await request.body()), chat)
            if p.model is not None and p.model != name:
                raise ApiError(404, f"the model {p.model!r} does not exist: this server serves {name!r}",
                               param="model", code="model_not_found")
            ids = prompt_ids(p, chat)
            try:
                model.check_fits(ids)
            except ContextError as e:
                raise ApiError(413, str(e), param="messages" if chat else "prompt",
                               code="context_length_exceeded") from None
            loop, events = asyncio.get_running_loop(), asyncio.Queue()
            job = Job(ids, Sampler(p.temperature, 0, p.top_p, p.seed),
                      lambda kind, value: loop.call_soon_threadsafe(events.put_nowait, (kind, value)),
                      {"max_new_tokens": p.max_tokens, "stop": p.stop})
            try:
                scheduler.submit(job)
            except Busy as e:
                raise ApiError(503, str(e), code="server_busy") from None
        except ApiError as e:
            return error(e)
        rid = protocol.new_id(chat)
        if p.stream:
            return EventStream(stream(events, chat, rid, p.include_usage), job)
        try:
            checked = time.monotonic()
            while True:
                try:
                    kind, value = await asyncio.wait_for(events.get(), 0.1)
                except asyncio.TimeoutError:
                    kind = None
                if time.monotonic() - checked > 0.1:  # is anyone still waiting for the answer?
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return error(ApiError(499, "the client closed the request", code="client_closed"))
                if kind == "error":
                    return error(ApiError(500, f"generation failed: {value}", code="generation_failed"))
                if kind == "done":
                    return JSONResponse(protocol.completion_json(chat, rid, name, value))
        finally:
            scheduler.cancel(job)  # a client gone, or the server stopping: its generation stops

    def prompt_ids(p: protocol.Params, chat: bool) -> list[int]:
        if chat:
            if model.template is None:
                raise ApiError(400, no_template(name) + " (POST /v1/completions continues a prompt)",
                               code="no_chat_template")
            try:
                return model.chat_ids(p.messages)
            except TemplateError as e:
                raise ApiError(400, str(e), param="messages", code="template_error") from None
        if isinstance(p.prompt, str):
            if model.text is None:
                raise ApiError(400, "prompt: the model has no tokenizer: send token ids", param="prompt")
            return model.text.encode(p.prompt)
        bad = [t for t in p.prompt if not 0 <= t < model.config.vocab_size]
        if bad:
            raise ApiError(400, f"prompt: token id {bad[0]} is out of range (vocabulary: {model.config.vocab_size})",
                           param="prompt")
        return list(p.prompt)

    async def stream(events: asyncio.Queue, chat: bool, rid: str, include_usage: bool):
        def sse(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
        if chat:
            yield sse(protocol.chunk_json(chat, rid, name, role=True))
        while True:
            kind, value = await events.get()
            if kind == "text":
                yield sse(protocol.chunk_json(chat, rid, name, text=value))
            elif kind == "error":
                yield sse(protocol.error_json(ApiError(500, f"generation failed: {value}", code="generation_failed")))
                break
            else:
                yield sse(protocol.chunk_json(chat, rid, name, done=value, with_usage=not include_usage))
                if include_usage:
                    yield sse(protocol.chunk_json(chat, rid, name, done=value, with_usage=True, no_choices=True))
                break
        yield "data: [DONE]\n\n"

    async def not_found(request: Request, exc: HTTPException):
        return error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                              code="not_found" if exc.status_code == 404 else None))

    routes = [Route(path, fn, methods=[method]) for paths, fn, method in [
        (("/health", "/v1/health"), health, "GET"), (("/v1/models", "/models"), models, "GET"),
        (("/v1/chat/completions", "/chat/completions"), chat, "POST"),
        (("/v1/completions", "/completions"), completions, "POST")] for path in paths]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found})


def run(args, status) -> int:
    """`kina serve`: load the model, bind, serve until interrupted."""
    try:
        import uvicorn
    except ImportError:
        raise flags.UsageError("kina serve needs starlette and uvicorn: pip install 'kina[serve]'") from None
    if args.queue < 0:
        raise flags.UsageError(f"--queue: expected an int >= 0, got {args.queue}")
    if not 0 <= args.port < 65536:
        raise flags.UsageError(f"--port: expected a port from 0 to 65535, got {args.port}")
    model = flags.load(args, status, "kina serve")
    name = args.alias or model.name
    app = make_app(model, Scheduler(model, args.parallel, args.queue), name)
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as e:
        raise flags.UsageError(f"--host {args.host} --port {args.port}: cannot listen there ({e.strerror or e})") \
            from None
    host, port = sock.getsockname()[:2]
    print(f"kina serve: {name} at http://{host}:{port}/v1 ({model.max_seq_len} tokens of context, "
          f"{args.parallel} slots); POST /v1/chat/completions, /v1/completions; GET /v1/models, /health",
          file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=1))
    server.run(sockets=[sock])
    return 0
