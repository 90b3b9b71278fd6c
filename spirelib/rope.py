"""Rotary position embeddings (RoFormer): each pair of adjacent head dimensions is a complex
number, rotated by position x frequency.

Positions are explicit: the model rotates queries and keys by their positions in the
original text (spec 3.4); the sink+window cache can re-rotate its sink keys to emulate
positions-in-cache (MagicDec's implementation, see `kvcache.SinkWindowKVCache`). One
complex multiply per element is a third of the cost of the real-valued "rotate half" form,
forward and backward (measured on this CPU).
"""

from __future__ import annotations

import torch


def rope_rotation(positions: torch.Tensor, d_head: int, base: float) -> torch.Tensor:
    """Unit complex rotations for integer `positions` (B, T): (B, 1, T, d_head/2), complex64."""
    # 1 / base^(i/d), as Hugging Face's Llama computes it: base^(-i/d) differs by an ulp in about a
    # third of the frequencies, which shows (1e-3 in the logits) past 100k tokens of relative distance.
    inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2, device=positions.device, dtype=torch.float32) / d_head)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, T, d_head/2)
    return torch.polar(torch.ones_like(angles), angles)[:, None]


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (B, H, T, d_head) by `rotation` (B, 1, T, d_head/2); computed in fp32 or wider."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    pairs = torch.view_as_complex(wide.reshape(*x.shape[:-1], -1, 2))  # (B, H, T, d_head/2)
    rotated = torch.view_as_real(pairs * (rotation if wide.dtype == torch.float32 else rotation.to(torch.complex128)))
    return rotated.flatten(-2).to(x.dtype)
