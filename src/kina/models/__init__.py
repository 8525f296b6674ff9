"""The models: a KV cache and decoders built on compiled Kina programs.

    common.py   shared checks, kernels, the greedy loop (`Decoder`); imports no model
    kvcache.py  KVCache (preallocated, in-place step), prefill, causal attention
    tiny.py     TinyDecoder, attention in Kina, the rest in NumPy
    storylm.py  StoryLM, a Llama-form decoder whose every layer step is one Kina call
    kernels/    the Kina programs they compile
"""
from .common import Generation, causal_mask
from .kvcache import CacheFullError, KVCache, causal_attention, prefill
from .storylm import NumPyStoryLM, StoryCache, StoryLM
from .tiny import TinyDecoder

__all__ = ["CacheFullError", "Generation", "KVCache", "NumPyStoryLM", "StoryCache", "StoryLM", "TinyDecoder",
           "causal_attention", "causal_mask", "prefill"]
