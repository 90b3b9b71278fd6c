"""The verification-guided sparse self-draft (spirelib.decoding.guided): the attention a forward
records is the target's, recomputed here by hand; the entries chosen are the sink, the window and
each head's best-scoring older positions, chosen here one row and head at a time; the draft's
logits are the target's attention restricted to them, each layer and KV head its own; and
speculative decoding with it stays exact (greedy = AD, chi-square at three temperatures, rows as
if alone)."""

from __future__ import annotations

import math

import pytest
import torch
from test_drafts import CFG, assert_rows_as_if_alone, contexts_and_lengths, random_target
from test_speculative import assert_two_token_law, peaky_model

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.guided import GuidedDraft, select
from spirelib.decoding.prefill import prefill
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import scaled_dot_product_attention
from spirelib.throughput.methods import KVBudget


def by_hand(target, tokens: torch.Tensor, masks=None):
    """Each layer's (input x (B, T, d_model), queries (B, n_q, T, d_head), keys (B, n_kv, T, d_head))
    and the final hidden states, running the blocks one op at a time over tokens (B, T) at positions
    0..T-1: causal attention, or where `masks[layer]` (B, n_kv, T, T) is given, exactly those keys."""
    B, T = tokens.shape
    rope = target.rope(torch.arange(T).expand(B, T))
    x, layers = target.embed(tokens), []
    for i, block in enumerate(target.blocks):
        q, k, v = block.attn.qkv(block.attn_norm(x), rope)
        layers.append((x, q, k))
        mask = torch.ones(T, T, dtype=torch.bool).tril().expand(B, 1, T, T) if masks is None else masks[i]
        heads = scaled_dot_product_attention(q, k, v, mask)  # (B, n_q, T, d_head)
        x = block.finish(x, block.attn.wo(heads.transpose(1, 2).reshape(B, T, -1)))
    return layers, target.head(x)


def test_a_forward_records_the_attention_of_its_last_queries():
    """After a prefill of ragged rows, each layer's scores are, per KV head, the softmax attention of
    each row's last k + 1 context queries (all its query heads) over the keys they see, summed."""
    target = random_target()
    contexts, lengths = contexts_and_lengths(3, 12, 2, [12, 7, 9])
    m = 3
    pf = prefill(target, contexts, lengths, capacity=20, scored=m)
    layers, _ = by_hand(target, contexts[:, :-1])
    groups, d_head = CFG.n_q_per_kv, CFG.d_head
    for i, (_, q, k) in enumerate(layers):
        for b, n in enumerate((lengths - 1).tolist()):  # the prefill holds positions 0..n-1
            want = torch.zeros(CFG.n_kv, 20, dtype=q.dtype)
            for t in range(n - m, n):
                for h in range(CFG.n_q_per_kv * CFG.n_kv):
                    probs = torch.softmax(q[b, h, t] @ k[b, h // groups, : t + 1].T / math.sqrt(d_head), -1)
                    want[h // groups, : t + 1] += probs
            torch.testing.assert_close(pf.cache.scores[i][b].to(want.dtype), want, rtol=1e-6, atol=1e-9)


def chosen_by_hand(scores: torch.Tensor, n: int, sink: int, window: int, top: int) -> list[set[int]]:
    """Per KV head of one row (scores (n_kv, C), positions 0..n-1): the sink, the window before n and
    the `top` best-scoring positions between them."""
    older = [p for p in range(sink, n - window)]
    out = []
    for head in scores:
        best = sorted(older, key=lambda p: -float(head[p]))[:top]
        out.append(set(range(min(sink, n))) | set(range(max(sink, n - window), n)) | set(best))
    return out


@pytest.mark.parametrize("n", [3, 9, 20, 40])
def test_select_keeps_the_sink_the_window_and_each_heads_best_older_positions(n):
    gen = torch.Generator().manual_seed(n)
    scores = torch.rand(2, 3, 48, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([n, max(n // 2, 1)])
    index, chosen = select(scores, lengths, sink=2, window=5, top=4)
    assert index.shape == (2, 3, 11) and chosen.shape == (2, 11)
    for b in range(2):
        for h in range(3):
            got = {int(p) for p, ok in zip(index[b, h], chosen[b]) if ok}
            assert got == chosen_by_hand(scores[b], int(lengths[b]), 2, 5, 4)[h]
            assert len(got) == int(chosen[b].sum()), "no position is chosen twice"


def test_the_drafts_logits_are_the_target_reading_only_the_chosen_entries():
    """After the prefill, the draft's pass over the pending token equals the target's forward over
    the whole text with each layer's and KV head's attention of the pending token restricted to
    the chosen entries and itself (computed here from the recorded scores, independently of
    `select`'s indices)."""
    target = random_target()
    contexts, lengths = contexts_and_lengths(2, 30, 3, [30, 24])
    k, sink, window, top = 3, 1, 4, 5
    pf = prefill(target, contexts, lengths, capacity=40, scored=k + 1)
    draft = GuidedDraft(target, KVBudget(sink, window, top), temperature=0.0)
    draft.begin(pf.verified, k)
    n = lengths - 1  # the pending token's position
    logits = draft._step(pf.pending, n)  # (B, V)
    for b in range(2):
        T = int(n[b]) + 1
        text = torch.cat([contexts[b, : T - 1], pf.pending[b : b + 1]])[None]  # (1, T)
        masks = []
        for layer in range(CFG.num_layers):
            mask = torch.ones(T, T, dtype=torch.bool).tril().expand(1, CFG.n_kv, T, T).clone()
            for h, keep in enumerate(chosen_by_hand(pf.cache.scores[layer][b], T - 1, sink, window, top)):
                mask[0, h, T - 1] = False
                mask[0, h, T - 1, sorted(keep | {T - 1})] = True
            masks.append(mask)
        _, want = by_hand(target, text, masks)
        torch.testing.assert_close(logits[b], want[0, -1], rtol=1e-9, atol=1e-10)


def test_greedy_speculative_decoding_with_the_guided_draft_equals_autoregressive():
    target = random_target()
    contexts, lengths = contexts_and_lengths(4, 40, 1, [40, 20, 33, 5])
    ad = autoregressive_generate(target, contexts, 20, temperature=0.0, lengths=lengths)
    sd = speculative_generate(target, GuidedDraft(target, KVBudget(1, 4, 4), temperature=0.0), contexts, 20, k=4,
                              temperature=0.0, lengths=lengths)
    assert torch.equal(sd.tokens, ad.tokens)
    accepted = sd.accepted[sd.accepted >= 0]
    assert accepted.max() > 0 and accepted.min() < 4, "the test needs ragged acceptance"


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_sampled_speculative_decoding_with_the_guided_draft_matches_the_target_distribution(temperature):
    cfg = ModelConfig(vocab_size=6, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    target = peaky_model(cfg, std=0.15)
    gen = torch.Generator().manual_seed(12)
    context = torch.tensor([1, 4, 2, 2, 5, 0, 3, 1, 4, 2, 0, 5])
    n = 20_000
    draft = GuidedDraft(target, KVBudget(1, 2, 2), temperature=temperature)
    sd = speculative_generate(target, draft, context.expand(n, -1), 2, k=3, temperature=temperature, generator=gen)
    assert (sd.accepted[:, 0] > 0).float().mean() > 0.05, "the check needs accepted proposals"
    assert_two_token_law(target, context, sd.tokens, temperature)


def test_ragged_rows_decode_greedily_as_if_alone():
    target = random_target()
    contexts, lengths = contexts_and_lengths(4, 30, 6, [30, 12, 21, 2])
    def run(c, n):
        return speculative_generate(target, GuidedDraft(target, KVBudget(1, 3, 3), temperature=0.0), c, 18, k=4,
                                    temperature=0.0, lengths=n)
    assert_rows_as_if_alone(run, contexts, lengths)


def test_a_shared_prefill_without_scores_is_refused_and_the_registry_builds_it():
    target = random_target()
    contexts, _ = contexts_and_lengths(2, 10, 1, [10, 10])
    plain = prefill(target, contexts, capacity=30)
    draft = draft_factory("guided", target, temperature=0.0, budget=KVBudget(1, 3, 2))()
    assert draft.budget == KVBudget(1, 3, 2)
    with pytest.raises(ValueError, match="prefill with scored=5"):
        speculative_generate(target, draft, contexts, 5, k=4, temperature=0.0, prefilled=plain)


def test_a_copied_prefill_records_into_scores_of_its_own():
    """Generations interleaved over copies of one prefill (wallclock) must not share the buffers
    one verification's attention is recorded into."""
    target = random_target()
    contexts, _ = contexts_and_lengths(2, 10, 1, [10, 10])
    shared = prefill(target, contexts, capacity=30, scored=5)
    twin = shared.copy()
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(shared.cache.scores, twin.cache.scores))
    assert all(torch.equal(a, b) for a, b in zip(shared.cache.scores, twin.cache.scores))


def test_one_prefill_serves_guided_generations_one_after_another():
    """The KV-budget sweep runs guided drafts of several budgets over one prefill: each must start
    from the prefill's own recorded attention, not from the last verification of the draft before
    it, so each equals a generation with its own prefill, random stream for random stream."""
    target = random_target()
    contexts, lengths = contexts_and_lengths(3, 24, 2, [24, 15, 20])
    k, G = 4, 12
    shared = prefill(target, contexts, lengths, capacity=24 + G + 2 * k, scored=k + 1)

    def run(top, prefilled):
        gen = torch.Generator().manual_seed(3)
        draft = GuidedDraft(target, KVBudget(1, 2, top), temperature=1.0)
        return speculative_generate(target, draft, contexts, G, k=k, lengths=lengths, generator=gen,
                                    prefilled=prefilled)

    run(5, shared)  # an earlier method of the sweep, its verifications recorded into the shared cache
    alone, after = run(2, None), run(2, shared)
    assert torch.equal(after.tokens, alone.tokens)
    assert torch.equal(after.accepted, alone.accepted)
