"""Rotary position embeddings (RoFormer), "rotate half" layout.

Positions are explicit: the model rotates queries and keys by their positions in the
original text (spec 3.4); the sink+window cache can re-rotate its sink keys to emulate
positions-in-cache (MagicDec's implementation, see `kvcache.SinkWindowKVCache`).
"""

from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, d_head: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for integer `positions` (B, T), shaped (B, 1, T, d_head/2) for heads."""
    inv_freq = base ** (-torch.arange(0, d_head, 2, device=positions.device, dtype=torch.float32) / d_head)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, T, d_head/2)
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (B, H, T, d_head) by the angles in cos/sin (B, 1, T, d_head/2)."""
    x1, x2 = x.to(torch.promote_types(x.dtype, torch.float32)).chunk(2, dim=-1)  # bf16 rotates in fp32
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)
