"""The transformer and its KV caches: parameter counts, and cached decoding == full forward."""

import pytest
import torch

from spirelib.model.config import ModelConfig, SinkWindow
from spirelib.model.kvcache import DenseKVCache, SinkWindowKVCache
from spirelib.model.transformer import Transformer

TINY = ModelConfig(vocab_size=61, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48)


def tiny_model(cfg=TINY, seed=0):
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def dense_cache(model, batch, capacity, sparse=None):
    c = model.cfg
    return DenseKVCache(c.num_layers, batch, c.n_kv, c.d_head, capacity, sparse=sparse)


def layer_stack_params(model: Transformer) -> int:
    """The parameters the module's blocks hold: the oracle `ModelConfig.body_params` is checked against."""
    return sum(p.numel() for p in model.blocks.parameters())


def test_body_params_match_the_performance_model():
    from spirelib.throughput.perfmodel import body_params

    model = tiny_model()
    assert layer_stack_params(model) == body_params(TINY.shape())
    paper = ModelConfig(vocab_size=50304, num_layers=8, d_model=512, n_q_per_kv=1, n_kv=8, d_head=128, d_ff=4096)
    with torch.device("meta"):
        assert layer_stack_params(Transformer(paper)) == 67_117_056 == paper.body_params()
        assert sum(p.numel() for p in Transformer(paper).parameters()) == paper.num_params()
    assert sum(p.numel() for p in model.parameters()) == TINY.num_params()


def test_residual_stream_hidden_and_head_compose_to_the_logits():
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (2, 7))
    logits, layers = model(tokens), model.residual_stream(tokens)
    assert layers.shape == (TINY.num_layers + 1, 2, 7, TINY.d_model)
    torch.testing.assert_close(layers[0], model.embed(tokens))
    torch.testing.assert_close(logits, model.unembed(model.norm(layers[-1])))
    torch.testing.assert_close(logits, model.head(layers[-1]))
    same = model.hidden(tokens)  # a prefill: the last block's output, no (B, T, V) logits
    assert torch.equal(same, layers[-1])


@torch.no_grad()
def test_prefill_then_decode_equals_full_forward_with_ragged_rows():
    model = tiny_model()
    B, T = 3, 12
    tokens = torch.randint(0, TINY.vocab_size, (B, T))
    full = model(tokens)  # (B, T, V)
    prompt_lens = torch.tensor([3, 5, 8])
    cache = dense_cache(model, B, T)
    pos = torch.arange(8).expand(B, 8)
    out = model(tokens[:, :8], pos, cache, valid=pos < prompt_lens[:, None])
    for b in range(B):
        torch.testing.assert_close(out[b, : prompt_lens[b]], full[b, : prompt_lens[b]], atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == prompt_lens.tolist()
    # Decode the rest two tokens at a time; each row continues at its own length.
    while int(cache.lengths.min()) < T - 1:
        pos = cache.next_positions(2).clamp(max=T - 1)
        step = model(tokens.gather(1, pos), pos, cache)
        torch.testing.assert_close(step, full.gather(1, pos[..., None].expand(-1, -1, TINY.vocab_size)), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_rollback_then_rewrite_matches_full_forward():
    """Drafted positions are written, partly rejected per row, then overwritten."""
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (2, 12))
    cache = dense_cache(model, 2, 12)
    model(tokens[:, :5], cache=cache)
    drafts = torch.randint(0, TINY.vocab_size, (2, 4))
    model(drafts, cache.next_positions(4), cache)
    accepted = torch.tensor([0, 2])
    cache.rollback(5 + accepted)
    sequences = tokens.clone()  # what each row's text is after acceptance
    sequences[1, 5:7] = drafts[1, :2]
    pos = cache.next_positions(3)
    step = model(sequences.gather(1, pos), pos, cache)
    full = model(sequences)
    torch.testing.assert_close(step, full.gather(1, pos[..., None].expand(-1, -1, TINY.vocab_size)), atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("include_sink", [1, 0])
def test_sink_window_ring_matches_dense_sparse_reference(include_sink):
    """The ring cache (constant memory) attends exactly as a dense cache read through the
    sink+window mask, and as the cache-free forward with the same sparsity."""
    model = tiny_model()
    sparse = SinkWindow(sink=include_sink, window=5)
    B, T = 2, 30
    tokens = torch.randint(0, TINY.vocab_size, (B, T))
    reference = model(tokens, sparse=sparse)
    dense = dense_cache(model, B, T, sparse=sparse)
    c = model.cfg
    ring = SinkWindowKVCache(c.num_layers, B, c.n_kv, c.d_head, sparse, slack=3)
    # A long prefill into the dense cache, copied into the ring (only sink + recent survive),
    # then decoding in steps of 1..3 tokens through the ring.
    model(tokens[:, :17], cache=dense)
    ring.ingest(dense, torch.arange(17).expand(B, 17))
    assert ring.k[0].shape[2] == include_sink + 5 + 3 + 1  # slots per layer (B, n_kv, S+1, d_head)
    t = 17
    for n in [1, 3, 2, 1, 3, 1, 2]:
        pos = ring.next_positions(n)
        out = model(tokens[:, t : t + n], pos, ring)
        torch.testing.assert_close(out, reference[:, t : t + n], atol=1e-5, rtol=1e-5)
        t += n


@torch.no_grad()
def test_cache_rope_mode_sees_positions_in_the_cache():
    """One layer: with positions-in-cache, a query over sink + window scores exactly as the
    compacted sequence (sink tokens, window tokens, query) at positions 0..n-1 would."""
    cfg = ModelConfig(vocab_size=61, num_layers=1, d_model=32, n_q_per_kv=1, n_kv=4, d_head=8, d_ff=48)
    model = tiny_model(cfg)
    sparse = SinkWindow(sink=2, window=4)
    tokens = torch.randint(0, cfg.vocab_size, (1, 20))
    dense = DenseKVCache(1, 1, cfg.n_kv, cfg.d_head, 20)
    model(tokens[:, :19], cache=dense)
    ring = SinkWindowKVCache(1, 1, cfg.n_kv, cfg.d_head, sparse, slack=1, rope_mode="cache")
    ring.ingest(dense, torch.arange(19)[None])
    out = model(tokens[:, 19:], torch.tensor([[19]]), ring)
    compacted = torch.cat([tokens[:, :2], tokens[:, 15:20]], dim=1)  # sink, window (4 before), query
    torch.testing.assert_close(out[:, 0], model(compacted)[:, -1], atol=1e-5, rtol=1e-5)
    original = SinkWindowKVCache(1, 1, cfg.n_kv, cfg.d_head, sparse, slack=1, rope_mode="original")
    original.ingest(dense, torch.arange(19)[None])
    assert not torch.allclose(model(tokens[:, 19:], torch.tensor([[19]]), original), out)


def test_cache_capacity_is_enforced():
    """A write past the capacity is caught on the device (no host sync in the forward), lands in
    the trash slot instead of another position's, and `check` (once per generation) reports it."""
    model = tiny_model()
    cache = dense_cache(model, 1, 4)
    model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    cache.check()  # within the capacity: nothing to report
    model(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[3, 4, 5]]), cache)
    assert cache.key_positions[0, :4].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="position 5 exceeds the cache capacity 4"):
        cache.check()


@torch.no_grad()
def test_prefill_fast_path_equals_the_masked_path():
    """A fresh dense cache's first forward at positions 0..T-1 attends causally over its own T
    keys only; a cache that was written before takes the general masked path: same logits."""
    model = tiny_model()
    B, T = 3, 10
    tokens = torch.randint(0, TINY.vocab_size, (B, T))
    pos = torch.arange(T).expand(B, T)
    valid = pos < torch.tensor([10, 4, 7])[:, None]
    fast = dense_cache(model, B, 16)
    out_fast = model(tokens, pos, fast, valid=valid)
    assert fast.mask(pos) is None and fast.layer_kv(0, pos)[0].shape[2] == T
    slow = dense_cache(model, B, 16)
    model(tokens[:, :1], pos[:, :1], slow, valid=torch.zeros(B, 1, dtype=torch.bool))  # writes nothing
    out_slow = model(tokens, pos, slow, valid=valid)
    assert slow.mask(pos) is not None
    torch.testing.assert_close(out_fast[valid], out_slow[valid], atol=1e-5, rtol=1e-5)


def test_rope_frequencies_are_computed_as_hugging_face_does():
    """1 / base^(i/d), not base^(-i/d): they differ by an ulp in about a third of the
    frequencies, which moves the logits past 100k tokens of relative distance."""
    from spirelib.model.rope import rope_rotation

    positions = torch.tensor([[131072]])
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128)
    angles = positions.float()[..., None] * inv_freq
    assert torch.equal(rope_rotation(positions, 128, 500000.0), torch.polar(torch.ones_like(angles), angles)[:, None])


@pytest.mark.parametrize("tied", [False, True])
def test_initial_parameters_are_the_constructors_numbers_one_tensor_at_a_time(tied):
    """`Transformer.initial_parameters` (a sharded random-init draft's ranks keep their rows of each):
    the parameters `Transformer(cfg)` draws from the same generator state, and the generator left where
    the constructor leaves it (its layers' own draws replayed first)."""
    cfg = ModelConfig(vocab_size=50, num_layers=2, d_model=16, n_q_per_kv=2, n_kv=1, d_head=8, d_ff=24,
                      tie_embeddings=tied, qkv_bias=tied)
    torch.manual_seed(3)
    built = dict(Transformer(cfg).named_parameters())
    after = torch.rand(4)
    torch.manual_seed(3)
    replayed = dict(Transformer.initial_parameters(cfg))
    assert list(replayed) == list(built) and all(torch.equal(built[k], replayed[k]) for k in built)
    assert torch.equal(torch.rand(4), after)
