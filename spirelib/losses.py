"""Draft training losses (spec 3.7).

p is the target's next-token distribution, q the draft's (both at temperature 1).
HardTargetLoss is cross-entropy with the data's next token; distillation is
CE(p, q) = -sum_i p_i log q_i; alpha = sum_i min(p_i, q_i) is the probability that
rejection sampling accepts the draft's token (Leviathan et al. 2023); MixedLoss(w) =
w * CE(p, q) - (1 - w) * alpha. SPIRe uses w = 0.5; w = 1 is pure distillation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def hard_target_loss(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of draft_logits (..., V) with the data's tokens labels (...)."""
    return F.cross_entropy(_at_least_fp32(draft_logits.reshape(-1, draft_logits.shape[-1])), labels.reshape(-1))


def distillation_loss(draft_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Mean CE(p, q) = -sum_i p_i log q_i over positions; logits/probs (..., V)."""
    return -(target_probs * torch.log_softmax(_at_least_fp32(draft_logits), dim=-1)).sum(-1).mean()


def expected_acceptance(draft_logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """alpha = sum_i min(p_i, q_i) per position (...): the chance the draft's sample is accepted."""
    return torch.minimum(target_probs, torch.softmax(_at_least_fp32(draft_logits), dim=-1)).sum(-1)


def mix(distill_ce: torch.Tensor, alpha: torch.Tensor, weight: float) -> torch.Tensor:
    """MixedLoss(w) from its parts: w * CE(p, q) - (1 - w) * alpha (both already averaged)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"MixedLoss weight must be in [0, 1], got {weight}")
    return weight * distill_ce - (1.0 - weight) * alpha


def mixed_loss(draft_logits: torch.Tensor, target_probs: torch.Tensor, weight: float = 0.5) -> torch.Tensor:
    """MixedLoss(w) = w * CE(p, q) + (1 - w) * (-alpha), averaged over positions."""
    return mix(distillation_loss(draft_logits, target_probs), expected_acceptance(draft_logits, target_probs).mean(), weight)
