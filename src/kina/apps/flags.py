"""What the `kina` commands share once their flags are parsed: the model they name, the
sampler, warnings and the error for a flag's bad value.

In:  parsed flags (`kina.apps.cli.parser`), a status line, the command's name for messages.
Out: `load(args, status, program)`: the `Pretrained` model, checked flag by flag before the
     weights are read; `load_model`; `sampler(args, program)`; `warn`; `UsageError`.

Guarantees: every problem with a flag is a `UsageError` naming the flag as the user typed it;
warnings are one line on stderr, the status line cleared first.
"""
from __future__ import annotations

import secrets
import sys
from pathlib import Path

from .. import files
from ..models.sampling import Sampler
from .decoding import Pretrained
from .terminal import Status, cores, watching_builds

SAMPLER_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


class UsageError(ValueError):
    """A flag's value that fails a check argparse cannot make (it names the flag)."""


def warn(program: str, message: str, status: Status | None = None) -> None:
    if status is not None:
        status.clear()
    print(f"{program}: warning: {message}", file=sys.stderr)


def sampler(args, program: str) -> Sampler:
    """The sampling flags as a Sampler, checked, errors naming the flags; a warning for flags that
    act only when sampling but came without --temperature; sampling without --seed draws one
    (reported, so that the run can be repeated)."""
    try:
        s = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    except ValueError as e:
        name, _, rest = str(e).partition(":")
        raise UsageError(f"{SAMPLER_FLAGS.get(name, name)}:{rest}") from None
    if s.temperature == 0:
        idle = [f for f, on in (("--top-k", args.top_k), ("--top-p", args.top_p != 1.0), ("--seed", args.seed is not None))
                if on]
        if idle:
            warn(program, f"{', '.join(idle)} {'has' if len(idle) == 1 else 'have'} no effect without --temperature: "
                          "generation is greedy; add --temperature T (for example 0.8) to sample")
    elif s.seed is None:
        s = Sampler(s.temperature, s.top_k, s.top_p, secrets.randbelow(1 << 31))
    return s


def load(args, status: Status, program: str, defer: bool = False) -> Pretrained:
    """The model the flags name, checked flag by flag before the weights are read; loaded with its
    first build announced (and, with `defer`, not yet: `.load_model()`)."""
    from .. import knobs, runtime
    if args.threads is not None:
        knobs.set("KINA_NUM_THREADS", str(args.threads), "--threads")
        if args.threads > cores():
            warn(program, f"--threads {args.threads} is more than the {cores()} cores this process may run on: "
                          "threads beyond them wait for each other")
    if args.weight_dtype and args.weight_dtype != "F32" and args.dtype != "F32":
        raise UsageError(f"--weight-dtype {args.weight_dtype}: needs --dtype F32 (F32 activations against narrower "
                         f"weights), got --dtype {args.dtype}")
    template = None
    if args.chat_template is not None:
        try:
            template = files.read_text(Path(args.chat_template))
        except files.FileError as e:
            raise UsageError(f"--chat-template: {e}") from None
    model = Pretrained(args.model, runtime.numpy_dtype(args.dtype), max_seq_len=None, fma=not args.exact,
                       weight_dtype=args.weight_dtype and runtime.numpy_dtype(args.weight_dtype),
                       allow_nonfinite=args.allow_nonfinite, chat_template=template, defer=True)
    if args.ctx_size is not None:
        if args.ctx_size > model.context:
            raise UsageError(f"--ctx-size: expected at most the model's context, {model.context}, got {args.ctx_size}")
        model.max_seq_len = args.ctx_size
    if not defer:
        load_model(model, status)
    return model


def load_model(model: Pretrained, status: Status) -> None:
    status.show(f"loading {model.name} ...")
    with watching_builds(status):
        model.load_model()
    status.clear()
