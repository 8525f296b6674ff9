"""The models: a KV cache and decoders built on compiled Kina programs.

    common.py   shared checks, kernels, the greedy loop (`Decoder`); imports no model
    kvcache.py  KVCache (preallocated, in-place step), prefill, causal attention
    tiny.py     TinyDecoder, attention in Kina, the rest in NumPy
    storylm.py  StoryLM, the Llama-family decoder whose every layer step is one Kina call
    hf.py       Hugging Face folders (Llama, Mistral, Qwen2) into a StoryLM, and their tokenizers
    sampling.py greedy, temperature, top-k and top-p choice of the next token
    generate.py text in, text out (Pretrained), and the `kina generate` command
    kernels/    the Kina programs they compile
"""
from .common import Generation, causal_mask
from .kvcache import CacheFullError, KVCache, causal_attention, prefill
from .storylm import NumPyStoryLM, StoryCache, StoryLM
from .tiny import TinyDecoder

__all__ = ["CacheFullError", "Generation", "KVCache", "NumPyStoryLM", "StoryCache", "StoryLM", "TinyDecoder",
           "causal_attention", "causal_mask", "prefill"]
