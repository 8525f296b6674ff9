"""The seed's decode path: one attention layer's KV cache, and a tiny decoder around it.

    kvcache.py   KVCache: one attention layer's keys and values, preallocated, appended in
                 place and attended to (the C-style nx_kv_cache API, in Python: docs/models.md);
                 prefill and causal_attention
    tiny.py      TinyDecoder: a seeded decoder whose attention is compiled Kina, the rest NumPy
    kv_step.kina, prefill.kina, attention.kina   their kernels, generic in the element type T

These came first: the StoryLM-0 decode step (examples/storylm0_kv_step.kina) and its cache.
The model families (kina.models.families) do not use them; they stay public and tested
(`kina.models.KVCache`, `kina.models.TinyDecoder`).
"""
from __future__ import annotations

import functools
from pathlib import Path

KERNELS = Path(__file__).resolve().parent


def kernel_program(name: str, dtype):
    """<name>.kina of this folder (generic in its element type T) compiled for `dtype` (a NumPy dtype)."""
    from ...driver.options import Options
    from ..generation import KINA_DTYPES
    return _compiled(name, KINA_DTYPES[dtype], Options())


@functools.lru_cache(maxsize=None)
def _compiled(name: str, dtype: str, options):
    import kina
    return kina.compile_file(KERNELS / f"{name}.kina", options, dtypes={"T": dtype})
