"""`kina generate MODEL --prompt TEXT`: continue (or, with --chat, answer) one prompt.

In:  the parsed flags (kina.apps.cli) and a `Status` on stderr.
Out: the text on stdout as it decodes (the ids, space-separated, for a model without a
     tokenizer), then on stderr why it stopped and the timings; with `--json`, one object
     instead: {"prompt_ids", "ids", "text", "finish_reason", "prefill_ms", "decode_ms_per_token",
     "tokens_per_s", "model", "dtype", "weight_dtype", "ctx_size", "seed", "load_ms"}.

Guarantees: the text stays on the screen: nothing else shares its row while it streams (the
status line, which shows loading, a first build and a long prompt's prefill, is cleared before
the first piece of text), and the statistics come once, at the end, on lines of their own, as
llama-cli prints them. The prompt is checked against the context before the weights are read.
A model whose first token ends its turn says so, and what to try.
"""
from __future__ import annotations

import json
import sys

from . import flags
from .decoding import PREFILL_CHUNK

REASONS = {"eos": "the model ended its turn{token}", "length": "--max-new-tokens ({n}) reached",
           "stop": "a --stop string appeared", "context": "the context ({ctx} tokens) is full",
           "interrupted": "interrupted"}


def run(args, status) -> int:
    program = "kina generate"
    sampler = flags.sampler(args, program)
    if args.system is not None and not args.chat:
        raise flags.UsageError("--system: needs --chat")
    model = flags.load(args, status, program, defer=True)
    ids = prompt_ids(model, args)
    model.check_fits(ids)
    flags.load_model(model, status)
    out, err = sys.stdout, sys.stderr
    reply = model.reply(ids, sampler, max_new_tokens=args.max_new_tokens, stop=args.stop)
    streamed = 0  # ids printed, for a model without a tokenizer
    while not reply.done:
        if reply.prefilled < len(reply.to_prefill) and len(reply.to_prefill) > PREFILL_CHUNK and not args.json:
            status.show(f"prefill {reply.prefilled}/{len(reply.to_prefill)} tokens")
        piece = reply.advance()
        if args.json:
            continue
        if reply.out.ids:
            status.clear()
        if model.text is None and len(reply.out.ids) > streamed:
            piece = (" " if streamed else "") + " ".join(map(str, reply.out.ids[streamed:]))
            streamed = len(reply.out.ids)
        if piece:
            out.write(piece)
            out.flush()
    done = reply.completion
    result = {**done.to_json(), "model": model.name, "dtype": args.dtype,
              "weight_dtype": args.weight_dtype or "as stored", "ctx_size": model.max_seq_len,
              "seed": sampler.seed if sampler.temperature else None, "load_ms": round(1e3 * model.load_seconds, 1)}
    if args.json:
        print(json.dumps(result))
        return 0
    out.write("\n")
    out.flush()
    end = model.text.special.get(done.ids[-1]) if model.text and done.ids else None
    why = REASONS[done.finish_reason].format(token=f" ({end})" if end else "", n=args.max_new_tokens,
                                             ctx=model.max_seq_len)
    if done.finish_reason == "eos" and len(done.ids) == 1:
        why = f"the model ended its turn at once, without a word (its first token was {end or done.ids[0]})"
        if not args.chat and model.template is not None:
            why += ": it is an instruct model; pass --chat to apply its chat template"
    seed = f", seed {sampler.seed}" if sampler.temperature else ""
    err.write(f"stopped: {why}\n"
              f"loaded {model.name} ({model.model.architecture}, {args.dtype}{seed}) in {model.load_seconds:.2f} s; "
              f"prefill {len(ids) - done.reused} tokens: {result['prefill_ms']:.1f} ms; decode "
              f"{max(len(done.ids) - 1, 0)} tokens: {result['decode_ms_per_token']:.2f} ms/token "
              f"({result['tokens_per_s']:.1f} tokens/s)\n")
    return 0


def prompt_ids(model, args) -> list[int]:
    """The prompt's ids: encoded text, the chat template's rendering of it, or the ids given (checked)."""
    if args.prompt is None:
        if args.chat:
            raise flags.UsageError("--chat: needs --prompt (text), not --prompt-ids")
        vocab = model.config.vocab_size
        for i, t in enumerate(args.prompt_ids):
            if not 0 <= t < vocab:
                raise flags.UsageError(f"--prompt-ids: token id {t} is out of range: expected 0 <= id < "
                                     f"vocab_size = {vocab}")
        return list(args.prompt_ids)
    if model.text is None:
        raise flags.UsageError(f"--prompt: {model.path}: {model.no_text}; pass --prompt-ids instead")
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        return model.chat_ids([*system, {"role": "user", "content": args.prompt}])
    return model.text.encode(args.prompt)
