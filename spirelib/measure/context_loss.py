"""The target's own loss at each context length of the tau protocol (method §5, "Past the training
length"): beside a draft's tau at L, how well the target itself predicts the G tokens that follow a
context of L tokens, so a reader sees whether the draft or the target gives out first when L + G
runs past the windows they were trained on.

The unit is the context, as for tau: each context's mean cross-entropy over its G continuation
tokens, then the mean over contexts with a Student's t interval. The logits of one context's G
positions exist at a time, never a batch's (tokens x vocabulary). The loss is read from the
target prefill the tau measurement shares between its methods (`tau.measure_tau` with
`continuations`): G more positions over that cache, not a second pass over the L + G window.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from spirelib.decoding.prefill import Prefill
from spirelib.measure.intervals import t_quantile
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
def prefilled_losses(target: Transformer, prefilled: Prefill, continuations: torch.Tensor) -> torch.Tensor:
    """Each row's mean next-token cross-entropy over its continuation (B, G) -> (B,) float64,
    read from the target's `prefill` of the contexts (all but their last token): one G-token
    forward over the prefill's cache runs each context's last token and the first G - 1
    continuation tokens, position L - 1 + j predicting continuation token j. That is what a
    verification of G - 1 drafts costs, where reading the window L + G afresh would cost a
    second prefill. Like a generation, it writes only positions after the contexts
    (`prefill.Prefill`), so it may run before or after the generations that share the prefill."""
    B, G = continuations.shape
    cache, lengths = prefilled.cache, prefilled.verified.lengths  # (B,) each row's pending position
    if B != prefilled.pending.shape[0] or G < 1:
        raise ValueError(f"need one continuation (G >= 1 tokens) per prefilled row ({prefilled.pending.shape[0]}), "
                         f"got {tuple(continuations.shape)}")
    if prefilled.verified.tokens.shape[1] + G > cache.capacity:
        raise ValueError(f"the prefill's cache holds {cache.capacity} positions per row; the continuation needs "
                         f"{prefilled.verified.tokens.shape[1] + G}: prefill with a larger capacity")
    tokens = torch.cat((prefilled.pending[:, None], continuations[:, :-1].to(lengths.device)), 1)  # (B, G)
    positions = lengths[:, None] + torch.arange(G, device=lengths.device)  # (B, G)
    hidden = target.hidden(tokens, positions, cache)  # (B, G, d_model)
    out = []
    for h, t in zip(hidden, continuations.to(hidden.device)):  # one row's (G, V) logits at a time
        logits = target.head(h)  # (G, V), the loss in at least fp32
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
