"""Draft training losses (spec 3.7).

p is the target's next-token distribution, q the draft's (both at temperature 1).
HardTargetLoss is cross-entropy with the data's next token; distillation is
CE(p, q) = -sum_i p_i log q_i; alpha = sum_i min(p_i, q_i) is the probability that
rejection sampling accepts the draft's token (Leviathan et al. 2023); MixedLoss(w) =
w * CE(p, q) - (1 - w) * alpha. SPIRe uses w = 0.5; w = 1 is pure distillation.

The functions below define each loss plainly. Training uses `draft_losses`, which computes
the chosen loss, every per-position part and the gradient in one chunked pass over the
vocabulary (tests/test_spire.py checks it against the plain definitions).
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


class _DraftLosses(torch.autograd.Function):
    """The training loss of draft logits z (N, V) against target logits (N, V) and labels (N,),
    with the per-position distillation CE, alpha and hard CE, in one pass over row chunks.

    The loss is the last op of a step, so forward computes its gradient with respect to z
    too (d CE(p, q)/dz = q - p; d alpha/dz = m q - q (m . q) with m = [q < p]; d CE(label)/dz
    = q - onehot) and backward only scales it: no (N, V) intermediates beyond one chunk.
    At exact ties q_i = p_i, alpha's gradient counts p_i as the minimum (autograd of
    torch.minimum splits it in half; ties have probability zero for real logits).
    """

    @staticmethod
    def forward(ctx, logits, target_logits, labels, mix_weight, chunk):
        acc = torch.promote_types(logits.dtype, torch.float32)
        n = logits.shape[0]
        distill, alpha, hard = (torch.empty(n, dtype=acc, device=logits.device) for _ in range(3))
        grad = torch.empty_like(logits, dtype=acc) if ctx.needs_input_grad[0] else None
        for i in range(0, n, chunk):
            rows, label = slice(i, i + chunk), labels[i : i + chunk, None]  # label (c, 1)
            log_q = torch.log_softmax(logits[rows].to(acc), dim=-1)  # (c, V)
            q, p = log_q.exp(), torch.softmax(target_logits[rows].to(acc), dim=-1)
            distill[rows] = -(p * log_q).sum(-1)
            alpha[rows] = torch.minimum(p, q).sum(-1)
            hard[rows] = -log_q.gather(1, label)[:, 0]
            if grad is None:
                continue
            if mix_weight is None:
                grad[rows] = q.scatter_add_(1, label, -torch.ones_like(label, dtype=acc))
            else:
                below = torch.where(q < p, q, 0.0)  # m * q
                grad[rows] = mix_weight * (q - p) - (1.0 - mix_weight) * (below - q * below.sum(-1, keepdim=True))
        loss = hard.mean() if mix_weight is None else mix(distill.mean(), alpha.mean(), mix_weight)
        ctx.save_for_backward(grad)
        ctx.n, ctx.dtype = n, logits.dtype
        ctx.mark_non_differentiable(distill, alpha, hard)
        return loss, distill, alpha, hard

    @staticmethod
    def backward(ctx, grad_loss, *_):
        (grad,) = ctx.saved_tensors
        return (grad * (grad_loss / ctx.n)).to(ctx.dtype), None, None, None, None


def draft_losses(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                 mix_weight: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A draft's training loss and its parts, per position.

    draft_logits and target_logits (..., V), labels (...). `mix_weight` w gives MixedLoss(w);
    None gives HardTargetLoss. Returns the scalar loss (differentiable in draft_logits) and
    {"distill_ce", "alpha", "hard_ce"}, each (...) and detached, whatever the loss.
    """
    V = draft_logits.shape[-1]
    chunk = max(1, (1 << (28 if draft_logits.is_cuda else 17)) // V)  # rows per chunk: GPU big, CPU cache-sized
    loss, *parts = _DraftLosses.apply(draft_logits.reshape(-1, V), target_logits.reshape(-1, V),
                                      labels.reshape(-1), mix_weight, chunk)
    return loss, {name: part.view(labels.shape) for name, part in zip(("distill_ce", "alpha", "hard_ce"), parts)}
