"""Token sampling and modified rejection sampling (spec 1, 5; Leviathan et al. 2023, Chen et al. 2023).

`rejection_sample` makes speculative decoding exactly lossless: every emitted token is a
sample from the target's distribution, whatever the draft proposed. Temperature 0 is
greedy decoding, expressed as one-hot distributions, so the same code path serves both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling distribution (..., V) in fp32: softmax(logits / T), or one-hot argmax at T = 0."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    logits = logits.float()
    return torch.softmax(logits if temperature == 1 else logits / temperature, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per distribution: probs (..., V), nonnegative, not necessarily normalized
    -> tokens (...).

    The exponential race, which is how `torch.multinomial` draws one sample: with E_i
    i.i.d. Exp(1), argmax_i p_i / E_i is i with probability p_i / sum(p). E = -log(U) from
    uniforms is several times faster on CPU than `exponential_`; U is kept above 0 so that
    E is finite and a token with p_i > 0 always beats every token with p_i = 0.
    """
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float32)
    exponential = -u.clamp_(min=torch.finfo(torch.float32).tiny).log_()  # (..., V) Exp(1)
    return (probs / exponential).argmax(-1)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of the drafts per row, then emit one more token.

    draft_tokens (B, k) were sampled from draft_probs (B, k, V); target_probs (B, k+1, V)
    are the target's distributions at the k draft positions and the one after. Draft token
    x_j is accepted with probability min(1, p_j(x_j) / q_j(x_j)) while all before it were;
    at the first rejection the next token is drawn from norm(max(0, p_j - q_j)); if all k
    are accepted, a bonus token is drawn from p_k. Returns (n_accepted (B,), next_token (B,)).
    """
    B, k = draft_tokens.shape
    p = target_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(-1)  # (B, k)
    q = draft_probs.gather(2, draft_tokens[..., None]).squeeze(-1)  # (B, k)
    u = torch.rand(B, k, generator=generator, device=p.device)
    accepted = (u * q < p).long().cumprod(dim=1)  # (B, k) 1 up to the first rejection
    n_accepted = accepted.sum(dim=1)  # (B,)
    rows = torch.arange(B, device=p.device)
    p_next = target_probs[rows, n_accepted]  # (B, V)
    q_next = torch.where((n_accepted < k)[:, None], draft_probs[rows, n_accepted.clamp(max=k - 1)], 0.0)  # (B, V)
    residual = (p_next - q_next).clamp(min=0)  # unnormalized: `sample` needs no normalization
    # residual is all 0 only if p_next == q_next, where rejection has probability 0 (float ties).
    residual = torch.where(residual.amax(dim=-1, keepdim=True) > 0, residual, p_next)
    return n_accepted, sample(residual, generator)
