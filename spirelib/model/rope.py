"""Rotary position embeddings (RoFormer): each pair of adjacent head dimensions is a complex
number, rotated by position x frequency.

Positions are explicit: the model rotates queries and keys by their positions in the
original text (method §3.4); the sink+window cache can re-rotate its sink keys to emulate
positions-in-cache (MagicDec's implementation, see `kvcache.SinkWindowKVCache`). One
complex multiply per element costs less than the real-valued "rotate half" form, forward and
backward (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import math

import torch


def rope_frequencies(d_head: int, base: float, scaling: tuple | None = None, device=None) -> torch.Tensor:
    """The d_head/2 rotation frequencies (fp32): 1 / base^(2j/d_head), then, with `scaling`
    (a `LLAMA3_SCALING_FIELDS` tuple), Llama 3.1's: wavelengths longer than
    original_max / low_freq_factor slowed down by `factor`, shorter than original_max /
    high_freq_factor kept, those between interpolated (transformers' `_compute_llama3_parameters`,
    operation for operation, so that the fp32 values agree)."""
    # 1 / base^(i/d), as Hugging Face's Llama computes it: base^(-i/d) differs by an ulp in about a
    # third of the frequencies, which shows (1e-3 in the logits) past 100k tokens of relative distance.
    inv_freq = 1.0 / base ** (torch.arange(0, d_head, 2, device=device, dtype=torch.float32) / d_head)
    if scaling is None:
        return inv_freq
    factor, low, high, old_context = scaling
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_rotation(positions: torch.Tensor, d_head: int, base: float, scaling: tuple | None = None) -> torch.Tensor:
    """Unit complex rotations for integer `positions` (B, T): (B, 1, T, d_head/2), complex64
    (`scaling`: see `rope_frequencies`). Inside a compiled graph, whose compilers generate no
    kernels for complex numbers, the same rotations as (cos, sin) pairs: (B, 1, T, d_head/2, 2)
    fp32, the layout of `torch.view_as_real`."""
    if torch.compiler.is_compiling():  # the frequencies become constants of the graph
        angles = positions.to(torch.float32)[..., None] * rope_frequencies(d_head, base, scaling, positions.device)
        return torch.stack((angles.cos(), angles.sin()), dim=-1)[:, None]
    angles = positions.to(torch.float32)[..., None] * _cached_frequencies(d_head, base, scaling, positions.device)
    return torch.polar(torch.ones_like(angles), angles)[:, None]


@functools.lru_cache(maxsize=64)
def _cached_frequencies(d_head: int, base: float, scaling: tuple | None, device: torch.device) -> torch.Tensor:
    """`rope_frequencies`, computed once per (shape, device): every forward asks for them."""
    return rope_frequencies(d_head, base, scaling, device)


def clear_frequency_cache() -> None:
    """Forget the frequencies `rope_rotation` cached: tensors made under a `FakeTensorMode` (the memory
    simulation, `training.simulate`) must not outlive it."""
    _cached_frequencies.cache_clear()


def apply_rope(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (B, H, T, d_head) by `rotation` (`rope_rotation`: complex, or (cos, sin)
    pairs); computed in fp32 or wider."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    if not rotation.is_complex():  # (cos, sin) pairs: the complex product written out
        cos, sin = rotation.to(wide.dtype).unbind(-1)  # (B, 1, T, d_head/2) each
        even, odd = wide.unflatten(-1, (-1, 2)).unbind(-1)  # (B, H, T, d_head/2) each
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).to(x.dtype)
    pairs = torch.view_as_complex(wide.reshape(*x.shape[:-1], -1, 2))  # (B, H, T, d_head/2)
    rotated = torch.view_as_real(pairs * (rotation if wide.dtype == torch.float32 else rotation.to(torch.complex128)))
    return rotated.flatten(-2).to(x.dtype)
