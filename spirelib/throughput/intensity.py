"""Verification's operational intensity and the critical context length (method §2, paper Figure 3):
where a k + 1-token verification pass can still be compute-bound, as batch and context grow.
Numpy only, like the rest of the paper's model (`perfmodel`)."""

from __future__ import annotations

import math

import numpy as np

from spirelib.throughput.perfmodel import (
    PAPER_HOI,
    body_params,
    kv_values_per_token,
    positive,
    resolve_shape,
    scalar_or_array,
)


def verification_intensity(shape, B, L, k=4, *, bytes_per_weight=1.0, bytes_per_kv=1.0):
    """Operational intensity of verification (method §2, paper Figure 3): 2 N (B k) / (N + B L x)."""
    shape = resolve_shape(shape, "shape")
    batch, length = np.broadcast_arrays(positive(B, "B"), positive(L, "L"))
    positive(k, "k")
    n = body_params(shape)
    flops = 2.0 * n * batch * k
    moved = n * bytes_per_weight + batch * length * kv_values_per_token(shape) * bytes_per_kv
    return scalar_or_array(flops / moved)


def critical_context_length(shape, hoi=PAPER_HOI, k=4, *, exact=False, bytes_per_kv=1.0):
    """L_crit (method §2): the longest context at which verification can still become compute-bound.

    The B -> infinity limit of the verification intensity is 2 N k / (L x); L_crit is where it
    meets HOI. The paper reads it on its power-of-two context grid (32 for seqax-67m, 4096 for
    Llama 3 70B): that is the default. exact=True gives the crossover itself.
    """
    shape = resolve_shape(shape, "shape")
    positive(hoi, "hoi")
    positive(k, "k")
    crossover = 2.0 * body_params(shape) * k / (kv_values_per_token(shape) * bytes_per_kv * hoi)
    if exact:
        return float(crossover)
    return 0 if crossover < 1 else 2 ** math.floor(math.log2(crossover))
