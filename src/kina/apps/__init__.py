"""The programs that run models for people and for other programs: `kina generate|chat|serve`.

    cli.py       the `kina` command: its subcommands, flags and one-line errors
    flags.py     what the commands share once parsed: the model loaded as the flags say, the
                 sampler, warnings, UsageError
    generate.py  `kina generate`: one prompt, streamed; finish reason and timings; --json
    chat.py      `kina chat`: an interactive, multi-turn session at a terminal
    server.py    `kina serve`: the OpenAI-compatible HTTP API (Starlette on uvicorn)
    protocol.py  the OpenAI API's requests (checked) and responses, and its error object
    scheduler.py the server's one model thread: a bounded queue and slots decoded in turn
    session.py   a chat session: messages, the template, one KV cache kept between turns
    decoding.py  `Pretrained` (a checkpoint's model and tokenizer), `Reply` (one generation in
                 steps), `Slot` (a cache and the ids it holds), `Completion`
    template.py  the model's chat template in jinja2's sandbox, as transformers renders it
    terminal.py  the status line, the first run's build announced, flag escapes

Data flows one way: cli -> generate / chat / server -> flags, session / scheduler / protocol ->
decoding -> kina.models. Nothing in kina.models imports this package (tests/test_layout.py).
"""
from .decoding import Completion, Pretrained, Reply, Slot

__all__ = ["Completion", "Pretrained", "Reply", "Slot"]
