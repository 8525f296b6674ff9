"""The server's model thread: requests queued (bounded), then decoded together, a step each in turn.

In:  a loaded `Pretrained`, the number of slots (`parallel`) and of requests that may wait
     (`queue`); then `Job`s from the HTTP side (kina.apps.server), each a prompt's ids, a `Sampler`,
     the generation settings and `emit(kind, value)`, how its events reach the request.
Out: `Scheduler.submit(job)` (or `Busy` when the queue is full), `cancel(job)`; each job's
     events, from the model thread: ("text", piece) as the text grows, then ("done", Completion)
     or ("error", exception). `stats()`: requests running and waiting, tokens generated.

Design. A `Decoder` and its caches must not be driven from two threads at once, and Kina's
kernels run one sequence per call (batch 1). So one worker thread owns the model, and
`parallel` slots (`decoding.Slot`: a KV cache each, sized from the context, costing only the
pages it touches) hold the running requests. The worker admits waiting jobs into free slots,
then round-robin runs one unit of each running reply (a prefill chunk of at most
`decoding.PREFILL_CHUNK` tokens, or one token), so several streams progress together and a long
prompt cannot stall the others for more than a chunk. A free slot is chosen by the longest
common prefix of what its cache holds and the new prompt (as llama-server's prompt cache does):
a client that resends its conversation prefills only the new turn. Past `queue` waiting jobs,
`submit` raises `Busy` (the server's 503). A cancelled job (its client went away) is dropped at
its next turn, its slot freed. (Decoding several sequences in one kernel call would need kernels
with a batch dimension above 1.)
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..models.sampling import Sampler
from .decoding import Pretrained, Reply, Slot, common_prefix


class Busy(Exception):
    """Every slot is taken and the queue is full."""


@dataclass(eq=False)
class Job:
    prompt: list[int]
    sampler: Sampler
    emit: Callable[[str, object], None]
    settings: dict = field(default_factory=dict)  # Reply's: max_new_tokens, stop
    cancelled: bool = False


class Scheduler:
    def __init__(self, model: Pretrained, parallel: int = 4, queue: int = 16):
        self.model, self.queue_size = model, queue
        self.free = [Slot(model.model) for _ in range(parallel)]
        self.waiting: deque[Job] = deque()
        self.running: list[tuple[Job, Reply]] = []
        self.generated = 0  # tokens, all requests
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._work, name="kina-model", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.cond:
            if len(self.waiting) >= len(self.free) + self.queue_size:
                raise Busy(f"the server is busy: {len(self.running)} requests are running and {len(self.waiting)} "
                           "waiting; try again later")
            self.waiting.append(job)
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        with self.cond:
            job.cancelled = True
            if job in self.waiting:
                self.waiting.remove(job)

    def stats(self) -> dict:
        with self.cond:
            return {"requests_running": len(self.running), "requests_waiting": len(self.waiting),
                    "slots": len(self.running) + len(self.free), "tokens_generated": self.generated}

    def _admit(self) -> None:
        """Waiting jobs into free slots, each into the slot whose cache shares most of its prompt."""
        while self.waiting and self.free:
            job = self.waiting.popleft()
            slot = max(self.free, key=lambda s: common_prefix(s.ids, job.prompt))
            try:
                reply = self.model.reply(job.prompt, job.sampler, slot, **job.settings)
            except Exception as e:  # noqa: BLE001 (any failure is the request's, not the server's)
                job.emit("error", e)
                continue
            self.free.remove(slot)
            self.running.append((job, reply))

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.running:
                    self.cond.wait()
                self._admit()
                turn = list(self.running)
            for job, reply in turn:
                event = None
                if job.cancelled:
                    reply.finish("interrupted")
                else:
                    try:
                        n = len(reply.out.ids)
                        piece = reply.advance()
                        self.generated += len(reply.out.ids) - n
                        if piece:
                            job.emit("text", piece)
                        if reply.done:
                            event = ("done", reply.completion)
                    except Exception as e:  # noqa: BLE001
                        reply.finish("interrupted")
                        event = ("error", e)
                if reply.done or job.cancelled:
                    with self.cond:
                        self.running.remove((job, reply))
                        self.free.append(reply.slot)
                    if event is not None:
                        job.emit(*event)

