"""`kina chat MODEL`: an interactive, multi-turn chat at a terminal.

In:  the parsed flags (kina.apps.cli: the model, --system, sampling, --ctx-size, ...), then lines
     from stdin: a message for the model, or a command (/help, /reset, /save FILE, /load FILE, /exit).
Out: each reply streamed to stdout as it decodes, then one line on stderr with what the turn
     cost (tokens prefilled and reused, time to the first token, tokens per second) and, when it
     did not end its turn by itself, why it stopped.

Guarantees:
  - The model's own chat template renders the conversation (kina.apps.template); a model
    without one (a base model) is refused before its weights are read, saying so.
  - Each turn prefills only its new tokens (kina.apps.session keeps the KV cache between turns).
  - Ctrl-C during a reply stops the reply, not the session: the reply is kept as far as it got,
    and the cache holds what ran. Ctrl-C at the prompt clears the line; Ctrl-D (end of input) leaves.
  - Line editing and history come from `readline` when stdin is a terminal.
  - An error in a turn (a conversation past the context, a file /load cannot read) is one line,
    and the session goes on.
"""
from __future__ import annotations

import contextlib
import signal
import sys

from . import flags
from .decoding import PREFILL_CHUNK, ContextError, no_template
from .session import ChatSession, SessionError
from .template import TemplateError

HELP = """commands:
  /reset        start over (the system message stays)
  /save FILE    write the conversation to FILE (JSON)
  /load FILE    replace the conversation with the one saved in FILE
  /exit         leave (as Ctrl-D does)
Ctrl-C stops a reply; at the prompt it clears the line."""

STOPPED = {"length": "--max-new-tokens reached", "context": "the context is full: /reset to start over",
           "stop": "a --stop string appeared", "interrupted": "stopped"}


def run(args, status) -> int:
    program = "kina chat"
    sampler = flags.sampler(args, program)
    model = flags.load(args, status, program, defer=True)
    if model.template is None:
        raise TemplateError(no_template(model.path))
    flags.load_model(model, status)
    session = ChatSession(model, args.system)
    out, err = sys.stdout, sys.stderr
    if sys.stdin.isatty():
        import readline  # noqa: F401  (input() gets line editing and history)
    seed = f", seed {sampler.seed}" if sampler.temperature else ""
    out.write(f"{model.name}: {model.max_seq_len} tokens of context{seed}. Ctrl-C stops a reply, Ctrl-D leaves, "
              "/help lists the commands.\n")
    with _handler(signal.default_int_handler):  # KeyboardInterrupt at the prompt, not the exit
        while True:
            try:
                line = input("> ")
            except EOFError:
                out.write("\n")
                return 0
            except KeyboardInterrupt:
                out.write("\n")
                continue
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if _command(line, session, out) == "exit":
                        return 0
                    continue
                _turn(session, line, sampler, args, out, err, status)
            except (ContextError, TemplateError, SessionError, OSError, ValueError) as e:
                err.write(f"{program}: error: {e}\n")


def _turn(session: ChatSession, line: str, sampler, args, out, err, status) -> None:
    reply = session.ask(line, sampler, max_new_tokens=args.max_new_tokens, stop=args.stop)
    stop = []
    with _handler(lambda *_: stop.append(True)):  # Ctrl-C: end the reply between two steps
        while not reply.done:
            if reply.prefilled < len(reply.to_prefill) and len(reply.to_prefill) > PREFILL_CHUNK:
                status.show(f"prefill {reply.prefilled}/{len(reply.to_prefill)} tokens")
            piece = reply.finish("interrupted") if stop else reply.advance()
            if reply.out.ids or reply.done:
                status.clear()
            if piece:
                out.write(piece)
                out.flush()
    done = session.end(reply)
    out.write("\n")
    out.flush()
    if done.finish_reason == "eos" and len(done.ids) == 1:
        err.write("(the model ended its turn at once, without a word)\n")
    elif done.finish_reason in STOPPED:
        err.write(f"[{STOPPED[done.finish_reason]}]\n")
    n_new = len(done.prompt_ids) - done.reused
    speed = f", {1 / (sum(done.decode_seconds) / len(done.decode_seconds)):.1f} tokens/s" if done.decode_seconds else ""
    err.write(f"[prefill {n_new} new tokens ({done.reused} reused): first token in {done.prefill_seconds:.2f} s; "
              f"{len(done.ids)} tokens{speed}]\n")


def _command(line: str, session: ChatSession, out) -> str | None:
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit"):
        return "exit"
    if name == "/help":
        out.write(HELP + "\n")
    elif name == "/reset":
        session.reset()
        out.write("(a new conversation)\n")
    elif name in ("/save", "/load"):
        if not arg:
            raise ValueError(f"{name}: expected a file name: {name} FILE")
        if name == "/save":
            session.save(arg)
            out.write(f"(saved {len(session.messages)} messages to {arg})\n")
        else:
            session.load(arg)
            out.write(f"(loaded {len(session.messages)} messages from {arg})\n")
    else:
        raise ValueError(f"{name}: no such command (/help lists them)")
    return None


@contextlib.contextmanager
def _handler(handler):
    """SIGINT handled by `handler` in the block (the main thread's; elsewhere, as it was)."""
    try:
        before = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
