"""The EAGLE-3 draft in the decoding engine (`decoding.eagle3`): greedy speculative decoding equals
greedy autoregressive decoding; sampled decoding follows the target's exact two-token law
(chi-square) with the whole vocabulary and with a reduced one; every round proposes what a fresh
draft over the accepted text proposes (its cache and its feature buffer hold nothing stale); the
rows of a ragged batch decode as if alone; and under the CUDA-graph stand-in (`graph_pool`) every
generation equals eager decoding. Models are float64 and random."""

from __future__ import annotations

import pytest
import torch
from graph_pool import GraphPool
from test_drafts import check_rounds_against_fresh_drafts, contexts_and_lengths, random_target
from test_speculative import assert_two_token_law, peaky_model

from spirelib.decoding.eagle3 import Eagle3Draft, eagle3_builder
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model.config import Eagle3Config, ModelConfig
from spirelib.model.eagle3 import Eagle3DraftModel

GREEDY = ModelConfig(vocab_size=7, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=48)


def eagle3_model(target, draft_vocab=None, seed=1, std=0.3, head=False) -> Eagle3DraftModel:
    """A random EAGLE-3 draft of `target` (weights N(0, std), norm gains 1 + noise); with `draft_vocab`,
    a reduced vocabulary of that many random target ids. `head`: the target's unembedding rows as head."""
    gen = torch.Generator().manual_seed(seed)
    V = target.cfg.vocab_size
    d2t = None if draft_vocab is None else torch.randperm(V, generator=gen)[:draft_vocab].sort().values
    model = Eagle3DraftModel.from_target(target, Eagle3Config(draft_vocab=draft_vocab, init_head=head), d2t).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "embed.weight" or (head and name in ("head.weight", "norm.weight")):
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.copy_(1 + 0.3 * noise if name.endswith("norm.weight") else std * noise)
    return model.eval()


@pytest.mark.parametrize("draft_vocab", [None, 5], ids=["full-vocab", "reduced-vocab"])
def test_greedy_speculative_decoding_equals_greedy_autoregressive_decoding(draft_vocab):
    target = peaky_model(GREEDY)
    model = eagle3_model(target, draft_vocab)
    factory = lambda: eagle3_builder(target, model, temperature=0.0)  # noqa: E731
    contexts = torch.randint(0, GREEDY.vocab_size, (4, 12), generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([12, 5, 9, 2])  # a context of 2: its prefill writes no draft entry
    G, k = 20, 4
    ad = autoregressive_generate(target, contexts, G, temperature=0.0, lengths=lengths)
    sd = speculative_generate(target, factory(), contexts, G, k=k, temperature=0.0, lengths=lengths)
    assert torch.equal(sd.tokens, ad.tokens)
    counts = sd.accepted[sd.accepted >= 0]
    assert (counts == 0).any() and (counts > 0).any(), f"ragged acceptance needed, got {counts.tolist()}"


@pytest.mark.parametrize("draft_vocab", [None, 4], ids=["full-vocab", "reduced-vocab"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_speculative_decoding_follows_the_target_distribution(draft_vocab, temperature):
    """The first two tokens follow the target's exact law at `temperature`: with a reduced vocabulary
    too, whose tokens outside have draft probability 0 (rejection sampling draws them from the residual)."""
    cfg = ModelConfig(vocab_size=6, num_layers=2, d_model=16, n_q_per_kv=1, n_kv=2, d_head=8, d_ff=32)
    target = peaky_model(cfg, std=0.15)
    model = eagle3_model(target, draft_vocab, std=0.1)
    context = torch.tensor([1, 4, 2, 2, 5, 0, 3, 1])
    sd = speculative_generate(target, eagle3_builder(target, model, temperature=temperature),
                              context.expand(12_000, -1), 2, k=3, temperature=temperature,
                              generator=torch.Generator().manual_seed(11))
    assert (sd.accepted[:, 0] > 0).float().mean() > 0.1, "the check needs accepted proposals"
    assert_two_token_law(target, context, sd.tokens, temperature)


@pytest.mark.parametrize("draft_vocab", [None, 15], ids=["full-vocab", "reduced-vocab"])
def test_every_round_proposes_what_a_fresh_draft_over_the_accepted_prefix_proposes(draft_vocab):
    """The draft's state after any round (its cache rolled back, entries rewritten from the
    verification's target features, the feature buffer) is what a draft begun on the accepted text
    holds: the same proposals and q, round by round, ragged acceptance, ragged contexts."""
    target = random_target()
    model = eagle3_model(target, draft_vocab, std=0.05)
    contexts, lengths = contexts_and_lengths(4, 11, 1, [11, 6, 9, 3])
    k = 4
    accepted = check_rounds_against_fresh_drafts(target, lambda: Eagle3Draft(model, 1.0), contexts, lengths, 24, k,
                                                 1.0, seed=7)
    counts = accepted[accepted >= 0]
    assert (counts == 0).any() and (counts == k).any() and ((counts > 0) & (counts < k)).any(), \
        f"the test needs ragged acceptance, got {sorted(set(counts.tolist()))}"


@pytest.mark.parametrize("draft_vocab", [None, 5], ids=["full-vocab", "reduced-vocab"])
def test_ragged_rows_decode_greedily_as_if_alone(draft_vocab):
    """Every row of a right-padded batch gets, greedily, the tokens and the accept counts it gets
    decoded alone, unpadded: padding, other rows' lengths and their progress do not leak into the
    draft's cache or its feature buffer. (Sampled, the fresh-draft test above covers ragged rows.)"""
    target = peaky_model(GREEDY)
    model = eagle3_model(target, draft_vocab)
    contexts = torch.randint(0, GREEDY.vocab_size, (4, 16), generator=torch.Generator().manual_seed(6))
    lengths = torch.tensor([16, 5, 11, 2])
    G, k = 18, 4

    def run(c, n):
        return speculative_generate(target, eagle3_builder(target, model, temperature=0.0), c, G, k=k,
                                    temperature=0.0, lengths=n)

    batch = run(contexts, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = run(contexts[b : b + 1, :n], None)
        assert torch.equal(batch.tokens[b], alone.tokens[0]), f"row {b}"
        assert torch.equal(batch.accepted[b][batch.accepted[b] >= 0], alone.accepted[0]), f"row {b}"
    assert (batch.accepted >= 0).sum(1).unique().numel() > 1, "rows finish in different rounds"
    assert (batch.accepted > 0).any()


def test_under_the_cuda_graph_stand_in_every_generation_equals_eager():
    """Each round one replay of the stand-in (outputs of earlier replays overwritten, in-place writes
    only to static addresses), the draft's step compiled, its cache and feature buffer pinned:
    greedy and sampled generations over ragged rows, and a second generation over the same pinned
    state, equal eager decoding token for token and count for count."""
    target = peaky_model(GREEDY)
    model = eagle3_model(target, 5)
    contexts = torch.randint(0, GREEDY.vocab_size, (4, 16), generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([16, 13, 16, 11])
    G, k = 12, 4

    def decode():
        out = []
        for temperature in (0.0, 1.0, 1.0):
            sd = speculative_generate(target, eagle3_builder(target, model, temperature=temperature), contexts, G,
                                      k=k, temperature=temperature, lengths=lengths,
                                      generator=torch.Generator().manual_seed(int(temperature) + 5))
            out.append((sd.tokens, sd.accepted))
        return out

    eager = decode()
    pool = GraphPool().install(target)
    model._compiled_step = pool.replay(model._step)  # the draft's step as a replay (inside a round: the round's)
    try:
        pooled = decode()
        replays = pool.replays
    finally:
        GraphPool.uninstall(target)
        model._compiled_step = None
    assert replays > 3 * G // (k + 1)
    for (tokens, accepted), (got, got_accepted) in zip(eager, pooled):
        assert torch.equal(got, tokens) and torch.equal(got_accepted, accepted)
