"""kina.runtime.arena: a model's weights as views of one block of huge pages.

The arrays keep their shapes and dtypes, never overlap, each starts on 64 bytes and
the block on 2 MiB; StoryLM's copied weights all come from one such block.
"""
import os
import sys

import numpy as np
import pytest

from kina.models import StoryLM
from kina.runtime import arena
from kina.runtime.pool import ALIGN, data_pointer

SPECS = {"a": ((3, 5), np.float32), "b": ((7,), np.float16), "none": ((0, 4), np.float32),
         "c": ((2, 3, 4), np.int64), "d": ((1,), np.uint8)}


def root(a: np.ndarray) -> np.ndarray:
    while a.base is not None:
        a = a.base
    return a


def test_arrays_are_aligned_disjoint_views_of_one_block():
    got = arena.arrays(SPECS)
    assert list(got) == list(SPECS)
    for name, (shape, dtype) in SPECS.items():
        assert got[name].shape == shape and got[name].dtype == dtype and got[name].flags.c_contiguous
        assert got[name].flags.writeable and data_pointer(got[name]) % ALIGN == 0
    assert len({id(root(a)) for a in got.values()}) == 1
    assert min(data_pointer(a) for a in got.values()) % arena.HUGE_PAGE == 0
    spans = sorted((data_pointer(a), data_pointer(a) + a.nbytes) for a in got.values() if a.nbytes)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    for i, a in enumerate(got.values()):  # writing each leaves the others as they were
        a[...] = i + 1
    for i, a in enumerate(got.values()):
        assert (a == i + 1).all()


def test_no_arrays():
    assert arena.arrays({}) == {}


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.isdir("/sys/kernel/mm/transparent_hugepage")),
                    reason="a Linux kernel with transparent huge pages")
def test_the_advice_is_taken_where_the_kernel_offers_it():
    raw = np.empty(2 * arena.HUGE_PAGE, np.uint8)
    start = data_pointer(raw) + (-data_pointer(raw) % arena.HUGE_PAGE)
    assert arena._advise_huge(start, arena.HUGE_PAGE) is True
    assert arena._advise_huge(start, 0) is False


def test_a_models_weights_are_one_block_and_unchanged():
    sizes = dict(vocab_size=64, d_model=16, n_heads=2, n_layers=2, ffn_dim=32, max_seq_len=16)
    m = StoryLM(**sizes, seed=4)
    mats = [a for layer in m._layer_weights for a in layer.values() if a.ndim == 2] + [m._head]
    assert len(mats) >= 2 * 7 + 1
    assert len({id(root(a)) for a in mats}) == 1
    assert all(data_pointer(a) % ALIGN == 0 for a in mats)
    again = StoryLM(weights={k: v.copy() for k, v in m.weights.items()}, **sizes)
    for name, a in m.weights.items():
        np.testing.assert_array_equal(again.weights[name], a)
