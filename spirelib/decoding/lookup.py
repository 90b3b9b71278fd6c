"""Prompt lookup (n-gram) drafting: the training-free draft every serving engine ships (vLLM's
`ngram`, SGLang's and TensorRT-LLM's n-gram drafters), the floor any trained draft must clear.

The draft is no model: it finds an earlier occurrence of the context's last n tokens (the longest
n in [min_n, max_n], its earliest occurrence, as vLLM's proposer does) and proposes the k tokens
that followed it. A proposal is a deterministic token, so its distribution q is one-hot, and
rejection sampling stays exactly lossless (method §1): token x is accepted with probability p(x)
and a rejection resamples from p without x. Where no n-gram recurs, the row proposes its pending
token again (engines propose nothing there; a fixed-k batch proposes something, and any proposal
is lossless). Its cost per round is a comparison of every window of the history with the suffix
(`propose`, a few kernels, no host sync), next to nothing beside a forward (docs/method.md §2).
"""

from __future__ import annotations

import torch

from spirelib.decoding.prefill import TargetPass
from spirelib.decoding.sampling import one_hot
from spirelib.model.kvcache import static_buffer
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import card

MIN_N, MAX_N = card("lookup").ngrams  # n-gram lengths tried, longest first (the card says why)


def match_starts(history: torch.Tensor, lengths: torch.Tensor, n: int) -> torch.Tensor:
    """For each row of `history` (B, C) whose first `lengths` (B,) tokens are the context, the
    position right after the earliest earlier occurrence of its last `n` tokens (the occurrence
    ending before the context's last token), or -1 where none: (B,)."""
    B, C = history.shape
    if C < n + 1:
        return torch.full((B,), -1, dtype=torch.long, device=history.device)
    ends = (lengths - n).clamp(min=0)  # (B,) the suffix starts here
    suffix = history.gather(1, ends[:, None] + torch.arange(n, device=history.device))  # (B, n)
    windows = history.unfold(1, n, 1)  # (B, C - n + 1, n): window i is history[:, i:i + n]
    starts = torch.arange(windows.shape[1], device=history.device)  # (C - n + 1,)
    earlier = starts[None, :] + n < lengths[:, None]  # the window ends before the last token
    found = (windows == suffix[:, None, :]).all(-1) & earlier & (lengths[:, None] >= n)  # (B, C - n + 1)
    first = found.int().argmax(1)  # (B,) the earliest match (argmax returns the first maximum)
    return torch.where(found.any(1), first + n, -1)


def propose_lookup(history: torch.Tensor, lengths: torch.Tensor, k: int, min_n: int, max_n: int) -> torch.Tensor:
    """k proposed tokens (B, k) after the context `history[:, :lengths]` (B, C): the tokens that
    followed the longest recurring suffix n-gram (n from `max_n` down to `min_n`); a proposal that
    runs past the context continues from the proposal itself (a repeating pattern repeats). Rows
    with no recurring n-gram propose their last token k times."""
    B = history.shape[0]
    start = torch.full((B,), -1, dtype=torch.long, device=history.device)
    for n in range(max_n, min_n - 1, -1):  # the longest n with a match wins
        start = torch.where(start >= 0, start, match_starts(history, lengths, n))
    last = history.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)  # (B,)
    # The context, then room for the proposal: token j is read at start + j < lengths + j, so a
    # proposal that runs past the context reads its own earlier tokens.
    ext = torch.cat((history, history.new_zeros(B, k)), dim=1)  # (B, C + k)
    found = start >= 0
    for j in range(k):
        token = torch.where(found, ext.gather(1, (start + j).clamp(min=0)[:, None]).squeeze(1), last)  # (B,)
        ext.scatter_(1, (lengths + j)[:, None], token[:, None])
    return ext.gather(1, lengths[:, None] + torch.arange(k, device=history.device))  # (B, k)


class LookupDraft:
    """Prompt lookup behind the engine's `Draft` protocol: the draft keeps each row's tokens (the
    prefill's context, then every verified token and the pending one) and proposes by `propose_lookup`."""

    target_layers: tuple[int, ...] = ()  # reads no target activations

    def __init__(self, target: Transformer, min_n: int = MIN_N, max_n: int = MAX_N):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min_n <= max_n, got min_n {min_n}, max_n {max_n}")
        self.target, self.vocab_size, self.min_n, self.max_n = target, target.cfg.vocab_size, min_n, max_n
        self.key = ("lookup", min_n, max_n)

    def begin(self, verified: TargetPass, k: int) -> None:
        B, capacity = verified.tokens.shape[0], verified.cache.capacity
        # One trailing column takes the writes that are not kept (padding), as the caches' trash slot.
        self.history = static_buffer(self.target, ("lookup", B, capacity), (B, capacity + 1), torch.long,
                                     verified.tokens.device)  # (B, C+1), kept by a compiled target
        self.history.zero_()
        self.accept(verified)

    def static_tensors(self) -> list[torch.Tensor]:
        return [self.history]

    def _write(self, tokens: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """Tokens (B, T) at positions (B, T) where `valid` (the rest into the trash column)."""
        trash = self.history.shape[1] - 1
        self.history.scatter_(1, torch.where(valid & (positions < trash), positions, trash), tokens)

    def propose(self, pending: torch.Tensor, positions: torch.Tensor, k: int, u: torch.Tensor | None):
        self._write(pending[:, None], positions[:, None], torch.ones_like(positions[:, None], dtype=torch.bool))
        tokens = propose_lookup(self.history[:, :-1], positions + 1, k, self.min_n, self.max_n)  # (B, k)
        return tokens, one_hot(tokens, self.vocab_size)  # (B, k), (B, k, V): q is the proposal itself

    def accept(self, verified: TargetPass) -> None:
        self._write(verified.tokens, verified.positions, verified.valid)
