"""The `kina` command: `kina generate`, `kina chat` and `kina serve`, their flags, and their errors.

In:  argv: a subcommand, a model (a Hugging Face folder or a GGUF file) and flags.
Out: the subcommand's exit status: 0, 1 for an error (one line on stderr:
     `kina generate: error: --top-p: expected a number in (0, 1], got 2`), 2 for a usage error
     (argparse's, on one line too), 130 when interrupted; never a traceback.

Every flag is checked before any work, and named in its error as the user typed it. The rules
the commands share (docs/serving.md):
  - the context is the model's (`config.context_length`) unless `--ctx-size` (`-c`) says less;
    more is an error; the caches are sized from it, and a prompt past it fails before the load;
  - `--threads` above the cores this process may use is a warning;
  - `--top-k`, `--top-p` and `--seed` without `--temperature` are a warning: they act only when
    sampling, and generation stays greedy;
  - `--stop` takes llama-cli's escapes: `--stop "\\n\\n"` stops at a blank line;
  - running out of memory (a context too large for this machine) is one line naming --ctx-size.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..models.checkpoints import CheckpointError
from .decoding import ContextError
from .template import TemplateError
from .flags import UsageError
from .terminal import Status, unescape

DTYPES = ("F32", "BF16", "F16", "F64")
class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`kina generate: error: ...`), as every other error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one token id")
    return ids


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a Hugging Face folder (config.json, safetensors, tokenizer.json) "
                                                   "or a GGUF file")
    p.add_argument("-c", "--ctx-size", type=_positive, default=None,
                   help="the context in tokens: the prompt and the answer (default and most: the model's)")
    p.add_argument("--dtype", choices=DTYPES, default="F32", help="compute in this dtype (default F32)")
    p.add_argument("--weight-dtype", choices=("F32", "F16", "BF16"), default=None,
                   help="hold the weight matrices in this dtype, against F32 activations (--dtype F32); "
                        "default: as the checkpoint holds them (a GGUF file's quantized blocks as they are)")
    p.add_argument("-t", "--threads", type=_positive, default=None,
                   help="KINA_NUM_THREADS: the threads each layer step runs on (default: the cores)")
    p.add_argument("--exact", action="store_true",
                   help="the compiler's exact bits (as -O0: each multiply and add rounded apart, in k order) "
                        "rather than the default's fused multiply-adds; a slower prefill")
    p.add_argument("--allow-nonfinite", action="store_true",
                   help="load weights that hold NaN or infinity (refused by default, naming the tensor)")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a Jinja chat template to use instead of the model's own")


def _sampling_flags(p: argparse.ArgumentParser, max_new_default: int | None) -> None:
    p.add_argument("-n", "--max-new-tokens", type=_positive, default=max_new_default,
                   help=f"stop after this many tokens (default: {max_new_default or 'until the context is full'})")
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the K most likely tokens (0: all); needs --temperature")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="keep the most likely tokens up to probability P; needs --temperature")
    p.add_argument("--seed", type=int, default=None,
                   help="the sampling seed (the same seed, the same tokens; default: a new one, reported)")
    p.add_argument("--stop", action="append", default=[], type=unescape,
                   help="stop when the text contains this (repeatable; \\n, \\t, \\\\ and \\xNN are escapes)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kina", description="Run language models with Kina: continue a prompt, chat, or serve "
                                         "the OpenAI API.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="continue a prompt (or answer one, with --chat)",
                       description="Continue a prompt with a model, streaming the text as it decodes.")
    _model_flags(g)
    what = g.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="the prompt text (needs the model's tokenizer)")
    what.add_argument("--prompt-ids", type=_ids, help="the prompt as token ids: 1,2,3")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template: the prompt is a user message")
    g.add_argument("--system", help="with --chat: the system message")
    _sampling_flags(g, 64)
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    c = sub.add_parser("chat", help="talk with an instruct model, turn after turn",
                       description="An interactive chat with the model's own template; /help lists the commands.")
    _model_flags(c)
    c.add_argument("--system", help="the system message")
    _sampling_flags(c, None)
    s = sub.add_parser("serve", help="serve the OpenAI API (chat and completions) over HTTP",
                       description="An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions "
                                   "(streaming or not), GET /v1/models and /health.")
    _model_flags(s)
    s.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8080, help="the port (default 8080; 0: any free one)")
    s.add_argument("--alias", default=None, help="the model's name in the API (default: the file's or folder's)")
    s.add_argument("--parallel", type=_positive, default=4,
                   help="requests decoded together, a step each in turn, each on its own cache (default 4)")
    s.add_argument("--queue", type=int, default=16,
                   help="requests that may wait for a free slot; more are refused with 503 (default 16)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    program = f"kina {args.command}"
    status = Status()
    try:
        if args.command == "generate":
            from .generate import run
        elif args.command == "chat":
            from .chat import run
        else:
            from .server import run
        return run(args, status)
    except (CheckpointError, ContextError, TemplateError, UsageError, ValueError, TypeError, OSError,
            FloatingPointError) as e:
        status.clear()
        print(f"{program}: error: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:
        status.clear()
        context = f"--ctx-size {args.ctx_size}" if args.ctx_size else "the model's context (the default)"
        print(f"{program}: error: out of memory ({e or 'MemoryError'}): {context} may need more than this machine "
              "has; pass a smaller --ctx-size", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        status.clear()
        print(f"{program}: interrupted", file=sys.stderr)
        return 130
