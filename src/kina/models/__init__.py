"""The models: decoder-only transformers whose every layer is one compiled Kina call.

    config.py       DecoderConfig: an architecture's numbers, nothing else (and Rope)
    families/       one module per architecture family, with its kernel (llama.py + llama.kina,
                    gemma3.py + gemma3.kina), the blocks kernels share (blocks.kina), and the
                    checkpoint keys families spell alike (gguf_keys.py, hf_keys.py)
    decoder.py      Decoder: any family's kernel, its parameters bound by name; prefill, step, generation
    kernels.py      a family's kernel compiled: its functions' parameters by name, its builds
    cache.py        DecoderCache: a sequence's keys and values, every layer's
    weights.py      a decoder's weights checked once against its family's layout; seeded weights
    checkpoints/    readers: Hugging Face folders (hf.py), GGUF files (gguf.py), the fields of either
                    (fields.py) and the one CheckpointError
    tokenizer.py    Text: a tokenizers.Tokenizer with the model's special ids and chat template, from
                    a folder or a GGUF file's tokenizer.ggml.* keys
    generation.py   the generation loop every model shares (Generator), greedy, causal_mask
    sampling.py     greedy, temperature, top-k and top-p choice of the next token
    storylm.py      StoryLM: a seeded Llama-family Decoder (StoryLM-0 by default), and NumPyStoryLM
    seed/           the seed's KVCache and TinyDecoder, and their attention kernels

    kina.models.load("path/to/folder")          # the Decoder of a checkpoint (a folder or a .gguf file)

Text in, text out (Pretrained) and the `kina` commands are kina.apps'.
"""
from .cache import DecoderCache
from .checkpoints import CheckpointError, load
from .config import DecoderConfig, Rope
from .decoder import Decoder
from .generation import Generation, causal_mask
from .seed.kvcache import CacheFullError, KVCache, causal_attention, prefill
from .seed.tiny import TinyDecoder
from .storylm import NumPyStoryLM, StoryLM

StoryCache = DecoderCache  # the name it had

__all__ = ["CacheFullError", "CheckpointError", "Decoder", "DecoderCache", "DecoderConfig", "Generation", "KVCache",
           "NumPyStoryLM", "Rope", "StoryCache", "StoryLM", "TinyDecoder", "causal_attention", "causal_mask", "load",
           "prefill"]
