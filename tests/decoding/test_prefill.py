"""The prefill (spirelib.decoding.prefill): one serves several generations unchanged, a generation
staged on it refuses a prefill that lacks what it needs, and a target pass hands a draft exactly
the residual-stream entries it kept."""

import pytest
import torch
from test_speculative import CFG, drafts_for, peaky_model

from spirelib.decoding.prefill import prefill, prefill_needs, speculative_capacity, stage
from spirelib.decoding.speculative import autoregressive_generate, speculative_generate


def test_one_prefill_serves_several_generations():
    """Sharing the target's prefill between methods (as the tau protocol does) changes nothing:
    each generation equals one with its own prefill, random stream for random stream."""
    target = peaky_model()
    B, L, G, k = 4, 12, 15, 4
    contexts = torch.randint(0, CFG.vocab_size, (B, L), generator=torch.Generator().manual_seed(6))
    lengths = torch.tensor([12, 7, 10, 3])
    makers = drafts_for(target)  # every budgeted self-draft among them: the guided draft reads the prefill's scores
    shared = prefill(target, contexts, lengths, capacity=speculative_capacity(L, G, k),
                     **prefill_needs([make(1.0) for make in makers.values()], k))
    for name, make in makers.items():
        runs = []
        for prefilled in (shared, None):
            gen = torch.Generator().manual_seed(7)
            draft = make(1.0)
            runs.append(speculative_generate(target, draft, contexts, G, k=k, lengths=lengths, generator=gen, prefilled=prefilled))
        assert torch.equal(runs[0].tokens, runs[1].tokens), name
        assert torch.equal(runs[0].accepted, runs[1].accepted), name
    ad = [autoregressive_generate(target, contexts, G, lengths=lengths, generator=torch.Generator().manual_seed(8), prefilled=p)
          for p in (shared, None)]
    assert torch.equal(ad[0].tokens, ad[1].tokens)


def test_a_generation_refuses_a_prefill_that_lacks_what_it_needs():
    """`stage` names what to prefill with: a larger capacity, the residual-stream entries the draft
    reads, the verification's attention; a context of one token cannot be prefilled at all."""
    target = peaky_model()
    contexts = torch.randint(0, CFG.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
    small = prefill(target, contexts, capacity=12)
    with pytest.raises(ValueError, match="prefill with capacity=20"):
        stage(small, 20, ())
    with pytest.raises(ValueError, match=r"prefill with layers=\(1,\)"):
        stage(small, 12, (1,))
    with pytest.raises(ValueError, match="prefill with scored=5"):
        stage(small, 12, (), scored=5)
    kept = prefill(target, contexts, capacity=12, layers=(0, 2))
    assert kept.verified.stream((2,)).shape == (1, 2, 9, CFG.d_model)
    assert torch.equal(kept.verified.stream((2, 0)), kept.verified.layers.flip(0))
    with pytest.raises(ValueError, match="not \\[1\\]"):
        kept.verified.stream((1,))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        prefill(target, contexts[:, :1], capacity=12)
