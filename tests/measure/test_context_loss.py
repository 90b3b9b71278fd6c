"""The target's loss on the continuation of each context (method §5, past the training length)."""

import math

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from spirelib.decoding.builders import draft_factory
from spirelib.decoding.prefill import prefill, speculative_capacity
from spirelib.decoding.speculative import autoregressive_generate
from spirelib.measure.context_loss import loss_stats, prefilled_losses
from spirelib.measure.tau import TauProtocol, measure_tau
from spirelib.model.config import ModelConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import KVBudget

CFG = ModelConfig(vocab_size=23, num_layers=2, d_model=16, n_q_per_kv=2, n_kv=2, d_head=4, d_ff=32)


def direct_loss(model, context: torch.Tensor, continuation: torch.Tensor) -> float:
    """One context's mean loss on its continuation, from the model's plain causal forward over the window."""
    window = torch.cat((context, continuation))[None]  # (1, L+G)
    logits = model(window)[0]  # (L+G, V): position t predicts token t + 1
    L, G = context.shape[0], continuation.shape[0]
    return F.cross_entropy(logits[L - 1 : L + G - 1], continuation).item()


def test_each_context_scores_only_its_continuation_given_everything_before():
    """Read from a prefill of ragged rows, after a generation has used the same prefill, each row's
    loss is the plain forward's over its own window."""
    torch.manual_seed(0)
    model = Transformer(CFG).double().eval()
    n, L, G = 4, 9, 3
    contexts, continuations = torch.randint(0, 23, (n, L)), torch.randint(0, 23, (n, G))
    lengths = torch.tensor([9, 5, 7, 2])
    shared = prefill(model, contexts, lengths, capacity=speculative_capacity(L, G, 2))
    autoregressive_generate(model, contexts, G + 2, lengths=lengths, prefilled=shared)  # writes past the contexts
    got = prefilled_losses(model, shared, continuations)
    assert torch.equal(shared.cache.lengths, lengths - 1 + G)  # it wrote the G positions after each context
    for i in range(n):
        assert got[i].item() == pytest.approx(direct_loss(model, contexts[i, : lengths[i]], continuations[i]),
                                              rel=1e-12)
    # changing the context changes the loss
    other = contexts.clone()
    other[:, 0] = (other[:, 0] + 1) % 23
    again = prefilled_losses(model, prefill(model, other, lengths, capacity=L + G), continuations)
    assert not torch.equal(again, got)


def test_the_tau_measurement_reads_the_loss_from_its_shared_prefill_and_decodes_as_without():
    """measure_tau with continuations: each context's loss is the plain forward's, and every method's
    accept counts (the guided draft's, which reads the prefill's attention, too) are those of a
    measurement without them."""
    torch.manual_seed(1)
    model = Transformer(CFG).double().eval()
    model.reset_parameters(0.3)  # confident: which keys the guided draft reads changes what it proposes
    L, G, n = 24, 6, 5
    contexts, continuations = torch.randint(0, 23, (n, L)), torch.randint(0, 23, (n, G))
    methods = {m: draft_factory(m, model, temperature=1.0, **options)
               for m, options in (("magicdec", {"budget": KVBudget(1, 3)}), ("guided", {"budget": KVBudget(1, 2, 2)}))}
    protocol = TauProtocol(k=2, new_tokens=G, batch_size=2)
    plain = measure_tau(model, methods, {L: contexts}, protocol)
    with_loss = measure_tau(model, methods, {L: contexts}, protocol, continuations={L: continuations})
    assert plain.losses == {}
    for m in methods:
        assert torch.equal(with_loss.counts[m][L].accepted, plain.counts[m][L].accepted), m
    expected = [direct_loss(model, contexts[i], continuations[i]) for i in range(n)]
    assert with_loss.losses[L].tolist() == pytest.approx(expected, rel=1e-12)


def test_loss_stats_is_the_t_interval_over_contexts():
    losses = torch.tensor([2.0, 2.5, 3.1, 2.2], dtype=torch.float64)
    s = loss_stats(losses)
    half = stats.t.ppf(0.975, 3) * stats.tstd(losses.numpy()) / math.sqrt(4)
    assert (s.mean, s.n_contexts) == (pytest.approx(2.45), 4)
    assert s.ci95 == pytest.approx(half, rel=1e-12)
    assert math.isnan(loss_stats(losses[:1]).ci95)


def test_mismatched_inputs_are_refused():
    model = Transformer(CFG).eval()
    shared = prefill(model, torch.zeros(3, 4, dtype=torch.long), capacity=6)
    with pytest.raises(ValueError, match="one continuation"):
        prefilled_losses(model, shared, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="prefill with a larger capacity"):
        prefilled_losses(model, shared, torch.zeros(3, 4, dtype=torch.long))  # 3 + 4 positions > 6
    assert prefilled_losses(model, shared, torch.zeros(3, 3, dtype=torch.long)).shape == (3,)


def test_the_sweep_runs_at_the_chosen_length_or_the_longest_within_the_training_windows():
    from spirelib.measure.context_loss import sweep_length

    assert sweep_length([256, 960, 2048], 64, 1024) == 960
    assert sweep_length([256, 960, 2048], 64, 1024, chosen=512) == 512
    assert sweep_length([2048, 4096], 64, 1024) == 2048  # none fits: the shortest
