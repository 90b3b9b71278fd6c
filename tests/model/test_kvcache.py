"""Cache reads cover only slots a key can be in: never the trash slot that takes dropped writes; a
dense cache read live (`DenseKVCache.live_mask`) reads the live key blocks only, and attends alike."""

import torch

from spirelib.model.config import SinkWindow
from spirelib.model.kvcache import DenseKVCache, SinkWindowKVCache


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


def _decode(live: bool, capacity: int, sparse=None, compiled: str | None = None, queries: int = 5):
    """A ragged prefill of a small GQA model, then a verification-sized forward of `queries` tokens
    over a dense cache of `capacity`, read masked or live (`DenseKVCache.live_mask`): its logits
    and the cache's mask of that forward."""
    from spirelib.model.config import ModelConfig
    from spirelib.model.transformer import Transformer

    cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    if compiled:  # traced whole, as a compiled forward is (dynamo, no graph break), run by `compiled`
        model._compiled = torch.compile(model._stream, fullgraph=True, dynamic=False, backend=compiled)
    contexts = torch.randint(0, 64, (3, 150), generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([150, 40, 126])  # the last row's queries straddle a block boundary
    cache = DenseKVCache(2, 3, 2, 8, capacity, sparse=sparse, live_reads=live)
    positions = torch.arange(150).expand(3, 150)
    with torch.no_grad():
        model.hidden(contexts, positions, cache, valid=positions < lengths[:, None])
        step = cache.next_positions(queries)
        tokens = torch.randint(0, 64, (3, queries), generator=torch.Generator().manual_seed(1))
        logits = model(tokens, step, cache)
    return logits, cache.mask(step)


def test_live_reads_attend_as_the_masked_reads_do():
    """Decode-time attention through the live block mask equals the masked read of the whole
    capacity: ragged rows, grouped-query heads, one token or a verification's k + 1, a sink + window."""
    for queries in (1, 5):
        for sparse in (None, SinkWindow(1, 16)):
            masked, _ = _decode(False, 512, sparse, queries=queries)
            live, _ = _decode(True, 512, sparse, queries=queries)
            torch.testing.assert_close(live, masked, rtol=1e-5, atol=1e-6)
    traced, _ = _decode(True, 512, compiled="aot_eager")
    torch.testing.assert_close(traced, _decode(False, 512)[0], rtol=1e-5, atol=1e-6)


def test_live_reads_read_the_live_length_not_the_capacity():
    """The key blocks a decode step's attention reads, counted from its block mask at two
    capacities with one live length: the same (the live rows' blocks), where the masked read
    covers the whole capacity, four times as many keys at four times the capacity."""
    from spirelib.model.kvcache import LIVE_BLOCK

    def keys_read(live: bool, capacity: int) -> int:
        _, mask = _decode(live, capacity)
        if live:
            return int(mask.kv_num_blocks.sum()) * LIVE_BLOCK  # per row, blocks up to its furthest query
        return mask.shape[0] * mask.shape[-1]  # every row, every slot
    assert keys_read(True, 512) == keys_read(True, 2048) == (2 + 1 + 2) * LIVE_BLOCK  # rows to 154, 44, 130
    assert keys_read(False, 2048) == 4 * keys_read(False, 512) == 3 * 2048
