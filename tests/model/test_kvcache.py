"""Cache reads cover only slots a key can be in: never the trash slot that takes dropped writes."""

import torch

from spirelib.model.kvcache import DenseKVCache, SinkWindow, SinkWindowKVCache


def test_decode_reads_cover_the_capacity_not_the_trash_slot():
    cache = DenseKVCache(1, 2, 1, 4, capacity=8)
    cache.prepare(torch.arange(5).expand(2, 5))  # a prefill: causal over its own 5 slots
    assert cache.layer_kv(0, None)[0].shape[2] == 5
    step = cache.next_positions(1)
    cache.prepare(step)
    k, v = cache.layer_kv(0, step)
    assert k.shape[2] == v.shape[2] == 8 and cache.mask(step).shape[-1] == 8
    ring = SinkWindowKVCache(1, 2, 1, 4, SinkWindow(1, 4), slack=2)
    ring.prepare(torch.arange(3).expand(2, 3))
    assert ring.layer_kv(0, None)[0].shape[2] == ring.mask(torch.full((2, 1), 3)).shape[-1] == 1 + 4 + 2
