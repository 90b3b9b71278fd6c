"""The target's own loss at each context length of the tau protocol (method §5, "Past the training
length"): beside a draft's tau at L, how well the target itself predicts the G tokens that follow a
context of L tokens, so a reader sees whether the draft or the target gives out first when L + G
runs past the windows they were trained on.

The unit is the context, as for tau: each context's mean cross-entropy over its G continuation
tokens, then the mean over contexts with a Student's t interval. The logits of one context's G
positions exist at a time, never a batch's (tokens x vocabulary).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from spirelib.measure.tau import t_quantile
from spirelib.model.transformer import Transformer


@dataclass(frozen=True)
class LossStats:
    """The target's continuation loss at one context length (nats per token)."""

    mean: float  # mean over contexts of each context's mean loss over its G continuation tokens
    ci95: float  # half-width of the 95% t-interval, contexts as the unit (nan with one context)
    n_contexts: int

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def continuation_losses(model: Transformer, contexts: torch.Tensor, continuations: torch.Tensor,
                        batch_size: int) -> torch.Tensor:
    """Each context's mean next-token cross-entropy over its continuation: contexts (n, L) and
    continuations (n, G) -> (n,) float64. Position L - 1 + j predicts continuation token j; the
    target reads the whole window at once (no cache), as in training."""
    if contexts.shape[0] != continuations.shape[0] or contexts.shape[1] < 1 or continuations.shape[1] < 1:
        raise ValueError(f"need n contexts (n, L >= 1) and their continuations (n, G >= 1), got "
                         f"{tuple(contexts.shape)} and {tuple(continuations.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    L, out = contexts.shape[1], []
    for i in range(0, contexts.shape[0], batch_size):
        window = torch.cat((contexts[i : i + batch_size], continuations[i : i + batch_size]), 1).to(device)  # (b, L+G)
        hidden = model.hidden(window[:, :-1])[:, L - 1 :]  # (b, G, d_model): the positions predicting the continuation
        targets = window[:, L:]  # (b, G)
        for h, t in zip(hidden, targets):  # one context's (G, V) logits at a time
            logits = model.head(h)  # (G, V), the loss in at least fp32
            out.append(F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), t).double())
    return torch.stack(out).cpu()


def sweep_length(context_lengths, new_tokens: int, trained_on: int, chosen: int = 0) -> int:
    """The context length of 04's KV-budget sweep: `chosen` if given, else the longest L whose L + G
    fits the `trained_on`-token training windows, else the shortest L."""
    within = [L for L in context_lengths if L + new_tokens <= trained_on]
    return chosen or (max(within) if within else min(context_lengths))


def loss_stats(losses: torch.Tensor) -> LossStats:
    """Mean and 95% t-interval of per-context losses (n,)."""
    n = losses.numel()
    ci95 = t_quantile(0.975, n - 1) * float(losses.std()) / math.sqrt(n) if n > 1 else math.nan
    return LossStats(float(losses.mean()), ci95, n)
