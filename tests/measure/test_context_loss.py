"""The target's loss on the continuation of each context (method §5, past the training length)."""

import math

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from spirelib.measure.context_loss import continuation_losses, loss_stats
from spirelib.model.transformer import ModelConfig, Transformer

CFG = ModelConfig(vocab_size=23, num_layers=2, d_model=16, n_q_per_kv=2, n_kv=2, d_head=4, d_ff=32)


def test_each_context_scores_only_its_continuation_given_everything_before():
    torch.manual_seed(0)
    model = Transformer(CFG).double().eval()
    n, L, G = 5, 7, 3
    contexts, continuations = torch.randint(0, 23, (n, L)), torch.randint(0, 23, (n, G))
    got = continuation_losses(model, contexts, continuations, batch_size=2)  # ragged last batch
    for i in range(n):
        window = torch.cat((contexts[i], continuations[i]))[None]  # (1, L+G)
        logits = model(window)[0]  # (L+G, V): position t predicts token t + 1
        expected = F.cross_entropy(logits[L - 1 : L + G - 1], continuations[i])
        assert got[i].item() == pytest.approx(expected.item(), rel=1e-12)
    # changing the context changes the loss; changing a token after the window does not exist to change
    other = contexts.clone()
    other[:, 0] = (other[:, 0] + 1) % 23
    assert not torch.equal(continuation_losses(model, other, continuations, 5), got)


def test_loss_stats_is_the_t_interval_over_contexts():
    losses = torch.tensor([2.0, 2.5, 3.1, 2.2], dtype=torch.float64)
    s = loss_stats(losses)
    half = stats.t.ppf(0.975, 3) * stats.tstd(losses.numpy()) / math.sqrt(4)
    assert (s.mean, s.n_contexts) == (pytest.approx(2.45), 4)
    assert s.ci95 == pytest.approx(half, rel=1e-12)
    assert math.isnan(loss_stats(losses[:1]).ci95)


def test_mismatched_inputs_are_refused():
    model = Transformer(CFG).eval()
    with pytest.raises(ValueError, match="continuations"):
        continuation_losses(model, torch.zeros(3, 4, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="batch_size"):
        continuation_losses(model, torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 2, dtype=torch.long), 0)


def test_the_sweep_runs_at_the_chosen_length_or_the_longest_within_the_training_windows():
    from spirelib.measure.context_loss import sweep_length

    assert sweep_length([256, 960, 2048], 64, 1024) == 960
    assert sweep_length([256, 960, 2048], 64, 1024, chosen=512) == 512
    assert sweep_length([2048, 4096], 64, 1024) == 2048  # none fits: the shortest
