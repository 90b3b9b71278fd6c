"""Token sampling and modified rejection sampling (method §1, 5; Leviathan et al. 2023, Chen et al. 2023).

`rejection_sample` makes speculative decoding exactly lossless: every emitted token is a
sample from the target's distribution, whatever the draft proposed. Temperature 0 is
greedy decoding: its distributions are one-hot (`probabilities`), and sampling them, or
rejection sampling against them, has a closed form that needs neither (`draw`, `verify`, and
`Transformer.last_logits(greedy=True)`: the argmax, and accepting drafts while they are the
target's argmax), the same tokens at a fraction of the work.

Every random choice reads uniforms it is handed (`u`), never a generator: a generation draws
all of its uniforms once, ahead (`Noise`), and each round indexes its share, so a round captured
as one CUDA graph replays with no random-number state of its own, and eager and graphed decoding
consume the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling distribution (..., V) in fp32: softmax(logits / T), or one-hot argmax at T = 0."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return one_hot(logits.argmax(-1), logits.shape[-1])
    logits = logits.float()
    return torch.softmax(logits if temperature == 1 else logits / temperature, dim=-1)


def draw(logits: torch.Tensor, temperature: float, u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits (..., V) at `temperature` and the distributions (..., V)
    it is a sample of (`probabilities`, which rejection sampling reads), from uniforms u (..., W)
    (`sample`; None at T = 0): at T = 0 the argmax (what sampling the one-hot distribution gives,
    without sampling it)."""
    if temperature == 0:
        best = logits.argmax(-1)  # (...,)
        return best, one_hot(best, logits.shape[-1])
    probs = probabilities(logits, temperature)
    return sample(probs, u), probs


def one_hot(index: torch.Tensor, V: int) -> torch.Tensor:
    """fp32 one-hot distributions (..., V) at `index` (...), without a host sync: `F.one_hot`
    checks the indices' range on the host, two syncs per call (every greedy draft token)."""
    return torch.zeros((*index.shape, V), dtype=torch.float32, device=index.device).scatter_(-1, index[..., None], 1.0)


def verify(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_logits: torch.Tensor, temperature: float,
           u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`rejection_sample` of the drafts against the target's logits (B, k+1, V) at `temperature`,
    from uniforms u (B, 2, W) (None at T = 0).
    At T = 0 the target's distributions are one-hot at their argmax a_j: draft x_j is accepted
    with probability min(1, p_j(x_j) / q_j(x_j)), 1 if x_j = a_j and 0 otherwise, and the residual
    max(0, p_j - q_j) of a rejection is one-hot at a_j too. So greedy verification accepts drafts
    while they equal the target's argmax and emits the argmax after them, whatever q is: the
    tokens of rejection sampling, without its distributions."""
    if temperature != 0:
        return rejection_sample(draft_tokens, draft_probs, probabilities(target_logits, temperature), u)
    best = target_logits.argmax(-1)  # (B, k+1)
    k = draft_tokens.shape[1]
    n_accepted = (draft_tokens == best[:, :k]).long().cumprod(dim=1).sum(dim=1)  # (B,)
    return n_accepted, best.gather(1, n_accepted[:, None]).squeeze(1)


def uniform_width(V: int) -> int:
    """Uniforms one draw over V tokens reads (`sample`): one per block of the vocabulary, then one
    per token of the block drawn."""
    size = math.isqrt(V - 1) + 1  # tokens per block
    return -(-V // size) + size


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per distribution: probs (..., V), nonnegative, not necessarily normalized
    -> tokens (...), from uniforms u (..., W >= `uniform_width(V)`) in [0, 1).

    Two levels, each an exponential race (`_race`): the vocabulary is cut into ~sqrt(V)
    blocks of ~sqrt(V) tokens; a block is drawn by its mass, then a token within it by
    its probability: P(i) = (S_b / S) (p_i / S_b) = p_i / S exactly. That takes ~2 sqrt(V)
    uniforms per draw instead of V (faster: docs/benchmarks.md). Block masses are
    summed in float64, so no rounding accumulates over a block.
    """
    V = probs.shape[-1]
    size = math.isqrt(V - 1) + 1  # tokens per block
    n_blocks = -(-V // size)
    flat = probs.reshape(-1, V)
    u = u.reshape(flat.shape[0], -1)  # (N, W)
    if n_blocks * size != V:
        flat = F.pad(flat, (0, n_blocks * size - V))  # zero-probability padding
    blocks = flat.view(-1, n_blocks, size)  # (N, n_blocks, size)
    block = _race(blocks.sum(-1, dtype=torch.float64), u[:, :n_blocks])  # (N,)
    within = _race(blocks[torch.arange(blocks.shape[0], device=probs.device), block],
                   u[:, n_blocks : n_blocks + size])  # (N,)
    return (block * size + within).view(probs.shape[:-1])


def _race(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """argmax_i w_i / E_i with E_i i.i.d. Exp(1) is i with probability w_i / sum(w) (the
    exponential race, how `torch.multinomial` draws one sample). E = -log(U) from the uniforms u
    (N, n) is faster on the CPU than `exponential_` (docs/benchmarks.md); U is kept above 0 so that
    E is finite and an entry with w_i > 0 always beats every entry with w_i = 0. weights (N, n) -> (N,)."""
    return (weights / -u.clamp(min=torch.finfo(torch.float32).tiny).log()).argmax(-1)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of the drafts per row, then emit one more token.

    draft_tokens (B, k) were sampled from draft_probs (B, k, V); target_probs (B, k+1, V)
    are the target's distributions at the k draft positions and the one after; u (B, 2, W) are
    uniforms, the first k of u[:, 0] for the acceptances, u[:, 1] for the token after. Draft token
    x_j is accepted with probability min(1, p_j(x_j) / q_j(x_j)) while all before it were;
    at the first rejection the next token is drawn from norm(max(0, p_j - q_j)); if all k
    are accepted, a bonus token is drawn from p_k. Returns (n_accepted (B,), next_token (B,)).
    """
    B, k = draft_tokens.shape
    p = target_probs[:, :k].gather(2, draft_tokens[..., None]).squeeze(-1)  # (B, k)
    q = draft_probs.gather(2, draft_tokens[..., None]).squeeze(-1)  # (B, k)
    accepted = (u[:, 0, :k] * q < p).long().cumprod(dim=1)  # (B, k) 1 up to the first rejection
    n_accepted = accepted.sum(dim=1)  # (B,)
    rows = torch.arange(B, device=p.device)
    p_next = target_probs[rows, n_accepted]  # (B, V)
    q_next = torch.where((n_accepted < k)[:, None], draft_probs[rows, n_accepted.clamp(max=k - 1)], 0.0)  # (B, V)
    residual = (p_next - q_next).clamp(min=0)  # unnormalized: `sample` needs no normalization
    # residual is all 0 only if p_next == q_next, where rejection has probability 0 (float ties).
    residual = torch.where(residual.amax(dim=-1, keepdim=True) > 0, residual, p_next)
    return n_accepted, sample(residual, u[:, 1])


class Noise:
    """A generation's uniforms, drawn once, eagerly, before its first round (`draw`): `steps`
    rounds (or AD steps) of B rows, `slots` draws a row each of W >= `uniform_width(V)` (and >= k:
    a row's acceptances take one slot). A round reads its share with `at(step)`, `step` a device
    counter: nothing random happens inside a round, so a CUDA graph of it replays with fresh
    numbers, and eager and graphed decoding draw the same ones. At temperature 0 nothing is drawn
    (`buffer` None)."""

    def __init__(self, steps: int, batch: int, slots: int, V: int, temperature: float, device=None):
        width = max(uniform_width(V), slots)
        self.buffer = None if temperature == 0 else torch.empty(steps, batch, slots, width, device=device)
        if self.buffer is not None:  # a round's graph reads it where it was recorded
            torch._dynamo.mark_static_address(self.buffer)

    def draw(self, generator: torch.Generator | None) -> None:
        """Fresh uniforms for the whole generation, in place (the buffer keeps its address)."""
        if self.buffer is not None:
            self.buffer.uniform_(generator=generator)

    def at(self, step: torch.Tensor) -> torch.Tensor | None:
        """The uniforms (B, slots, W) of step `step` (a 0-d long tensor on the device), or None at T = 0."""
        if self.buffer is None:
            return None
        return self.buffer.index_select(0, step.clamp(max=self.buffer.shape[0] - 1).view(1))[0]
