"""What a decoding benchmark holds (spirelib.bench.decode_memory): its cache bytes equal what the
caches allocate, its weights what the models hold; the refusal before compute is tests/cli's."""

import pytest

from spirelib.bench.decode_memory import cache_bytes, held_bytes
from spirelib.measure.tau import DecodingProtocol
from spirelib.model.config import ModelConfig, SinkWindow, vanilla_draft_config
from spirelib.model.kvcache import SelectedKVCache, SinkWindowKVCache
from spirelib.model.transformer import Transformer


def test_held_bytes_prices_the_caches_decoding_allocates():
    cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=1, n_kv=2, d_head=16, d_ff=64)
    model = Transformer(cfg)
    for cache, slots in ((model.new_cache(3, 40), 40),
                         (SinkWindowKVCache(2, 3, 2, 16, SinkWindow(1, 4), 4, rope_mode="cache"), 1 + 4 + 4)):
        allocated = sum(t.nbytes for t in cache.static_tensors())
        assert cache_bytes(cfg, 3, slots, 4) == pytest.approx(allocated, abs=64)  # up to scalar bookkeeping
    decoding = DecodingProtocol(k=3, new_tokens=6)
    parts = held_bytes(cfg, ["ad", "vanilla"], 3, 24, decoding, 4, "rounds")
    assert parts["weights"] == 4 * sum(p.numel() for m in (model, Transformer(vanilla_draft_config(cfg)))
                                       for p in m.parameters())
    # the guided draft: its chosen entries and ring (sink 1 + window 4 entries, k + 1 = 4 slots) and the
    # scores its verification records in the target's cache (capacity L + G + 2k = 36)
    selected = SelectedKVCache(2, 3, 2, 16, 1 + 4, 4)
    scores = sum(t.nbytes for t in model.new_cache(3, 36, scored=4).scores)
    guided = held_bytes(cfg, ["guided"], 3, 24, decoding, 4, "rounds")["draft caches"]
    assert guided == pytest.approx(sum(t.nbytes for t in selected.static_tensors()) + scores, abs=64)
