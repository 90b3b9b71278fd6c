"""Greedy decoding (temperature 0) is the argmax, taken directly: no one-hot distributions, no
sampling, no rejection sampling; the same tokens as the cache-free argmax of the target."""

import pytest
import torch
from test_speculative import CFG, drafts_for, peaky_model, random_dists, uniforms

from spirelib.decoding import drafts, sampling, speculative
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate
from spirelib.model import spire


def argmax_continuation(target, context, G):
    """G greedy tokens after `context` (L,), each the argmax of a cache-free forward over all before it."""
    seq = context.clone()
    with torch.no_grad():
        for _ in range(G):
            seq = torch.cat([seq, target(seq[None])[0, -1].argmax()[None]])
    return seq[len(context):]


@pytest.fixture
def no_sampling(monkeypatch):
    """Sampling and rejection sampling fail if anything calls them, under any name the engine imported."""
    def refuse(*args, **kwargs):
        raise AssertionError("greedy decoding left the argmax for sampling")
    for module in (sampling, speculative, drafts, spire):
        for name in ("sample", "rejection_sample"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, refuse)


def test_greedy_decoding_takes_the_argmax_without_sampling(no_sampling):
    target = peaky_model()
    contexts = torch.randint(0, CFG.vocab_size, (3, 11), generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([11, 6, 9])  # ragged: each row's first token comes from its own last position
    G = 9
    expected = torch.stack([argmax_continuation(target, contexts[b, : lengths[b]], G) for b in range(3)])
    ad = autoregressive_generate(target, contexts, G, temperature=0.0, lengths=lengths)
    assert torch.equal(ad.tokens, expected)
    sd = speculative_generate(target, drafts_for(target)["vanilla-perturbed"](0.0), contexts, G, k=3, temperature=0.0,
                              lengths=lengths)
    assert torch.equal(sd.tokens, expected)


def test_greedy_verification_is_rejection_sampling_at_one_hot_targets():
    gen = torch.Generator().manual_seed(0)
    B, k, V = 200, 4, 5
    logits = torch.randn(B, k + 1, V, generator=gen)
    best = logits.argmax(-1)
    drafts = torch.where(torch.rand(B, k, generator=gen) < 0.7, best[:, :k], torch.randint(0, V, (B, k), generator=gen))
    q = random_dists(B, k, V, gen)  # any draft distribution: greedy verification never reads it
    n_acc, nxt = sampling.verify(drafts, q, logits, 0.0)
    ref_acc, ref_next = sampling.rejection_sample(drafts, q, sampling.probabilities(logits, 0.0), uniforms(gen, B, 2, V=V))
    assert torch.equal(n_acc, ref_acc) and torch.equal(nxt, ref_next)
    assert 0 < n_acc.float().mean() < k, "the test needs ragged acceptance"
