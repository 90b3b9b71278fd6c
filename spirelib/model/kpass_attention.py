"""Attention of SPIRe's k-pass training (method §3.6) without a dense mask.

In pass j, the query of block b (first position n_b, so the query sits at n_b + j) sees
three groups of memory: the sink (positions < sink, all before the block), a band of the
target's memory [n_b + j - window, n_b - 1] outside the sink, and the block's own memory
from its earlier passes. A dense mask would score every query against all T positions.
Here the bands of C = window // k consecutive blocks, which overlap, share one gathered
span of (C - 1) k + window positions: a query scores about 2 x window keys instead of T,
and each span is gathered once per layer per training step and reused by every pass. One
softmax runs over the three groups together, so this is exactly the attention inference
computes (tests/model/test_spire.py compares the two).
"""

from __future__ import annotations

import math

import torch

from spirelib.model.config import SinkWindow


class BandedMemory:
    """Which target positions each block's queries may see, in chunks of consecutive blocks.

    `span`, the positions one chunk gathers, is (C - 1) k + window for blocks k apart (what
    `spire.block_positions` makes: the caller passes it, no host sync); for other block
    starts it is measured from them, which waits for the device once."""

    def __init__(self, starts: torch.Tensor, seq_len: int, k: int, sparse: SinkWindow, span: int | None = None):
        self.n_blocks = len(starts)
        self.chunk = max(1, sparse.window // k)  # C blocks per gathered span
        n_chunks = math.ceil(self.n_blocks / self.chunk)
        padded = torch.cat([starts, starts[-1:].expand(n_chunks * self.chunk - self.n_blocks)])
        grouped = padded.view(n_chunks, self.chunk)  # (n_chunks, C) first position of each block
        span_measured = span is None
        if span_measured:
            span = int((grouped[:, -1] - grouped[:, 0]).max()) + sparse.window
        pos = grouped[:, :1] - sparse.window + torch.arange(span, device=starts.device)  # (n_chunks, S)
        self.index = pos.clamp(0, seq_len - 1)
        real = (torch.arange(n_chunks * self.chunk, device=starts.device) < self.n_blocks).view(n_chunks, self.chunk)
        block_start = grouped[..., None]  # (n_chunks, C, 1)
        self.pos = pos[:, None, :]  # (n_chunks, 1, S)
        self.context = real[..., None] & (self.pos >= sparse.sink) & (self.pos < block_start)  # (n_chunks, C, S)
        self.lowest = block_start - sparse.window  # the band starts at lowest + j in pass j
        self.sink = torch.arange(sparse.sink, device=starts.device) < starts[:, None]  # (n_blocks, sink)
        # Blocks k apart (`span` given): chunk c's span starts at c C k - (window - 1), so the spans are
        # windows of x padded by window - 1 positions before it, C k apart (`gather`).
        self.regular = None if span_measured else (sparse.window - 1, span, self.chunk * k, seq_len)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Each chunk's span of x (B, H, T, d): (B, H, n_chunks, S, d). For blocks k apart, windows
        of x zero-padded (`Tensor.unfold`: its backward adds the windows' gradients back, where
        indexing's scatters them one by one), copied once (every pass reads them); a position outside
        x is never visible (`context`), so its zero enters no result."""
        if self.regular is None:
            return x[:, :, self.index]
        before, span, step, seq_len = self.regular
        n_chunks = self.index.shape[0]
        after = max(0, (n_chunks - 1) * step + span - (before + seq_len))
        padded = torch.nn.functional.pad(x, (0, 0, before, after))  # (B, H, before + T + after, d)
        return padded.unfold(2, span, step)[:, :, :n_chunks].transpose(-1, -2).contiguous()  # (B, H, n_chunks, S, d)

    def band_mask(self, j: int) -> torch.Tensor:
        """Visible span positions for pass j: (n_chunks, C, S)."""
        return self.context & (self.pos >= self.lowest + j)


def memory_attention(q: torch.Tensor, memory: BandedMemory, j: int, band: tuple[torch.Tensor, torch.Tensor],
                     sink: tuple[torch.Tensor, torch.Tensor], own: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Attention output (B, n_blocks, n_q * d_head) of pass j's queries q (B, n_q, n_blocks, d_head).

    band: gathered target keys/values (B, n_kv, n_chunks, S, d_head); sink: the first positions'
    keys/values (B, n_kv, sink, d_head); own: the blocks' own keys/values (B, n_kv, n_blocks, J,
    d_head), every one visible (or None before any exist).
    """
    B, n_q, n_blocks, d_head = q.shape
    band_k, band_v = band
    n_kv, n_chunks, span = band_k.shape[1], band_k.shape[2], band_k.shape[3]
    groups, C = n_q // n_kv, memory.chunk
    q = q.reshape(B, n_kv, groups, n_blocks, d_head) * d_head ** -0.5
    padded = torch.nn.functional.pad(q, (0, 0, 0, n_chunks * C - n_blocks)).view(B, n_kv, groups, n_chunks, C, d_head)
    scores = [torch.einsum("bhgcid,bhcsd->bhgcis", padded, band_k).reshape(B, n_kv, groups, n_chunks * C, span)
              [..., :n_blocks, :].masked_fill(~memory.band_mask(j).view(n_chunks * C, span)[:n_blocks], -math.inf),
              torch.einsum("bhgnd,bhsd->bhgns", q, sink[0]).masked_fill(~memory.sink, -math.inf)]
    if own is not None:  # a few keys per query: products summed, not a batched matmul of one row each
        scores.append((q[..., None, :] * own[0][:, :, None]).sum(-1))  # (B, n_kv, groups, n_blocks, J)
    sizes = [s.shape[-1] for s in scores]
    probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1).split(sizes, dim=-1)
    band_p = torch.nn.functional.pad(probs[0], (0, 0, 0, n_chunks * C - n_blocks)).view(B, n_kv, groups, n_chunks, C, span)
    out = torch.einsum("bhgcis,bhcsd->bhgcid", band_p, band_v).reshape(B, n_kv, groups, n_chunks * C, d_head)[..., :n_blocks, :]
    out = out + torch.einsum("bhgns,bhsd->bhgnd", probs[1], sink[1])
    if own is not None:
        out = out + (probs[2][..., None] * own[1][:, :, None]).sum(-2)
    return out.reshape(B, n_q, n_blocks, d_head).transpose(1, 2).reshape(B, n_blocks, n_q * d_head)
