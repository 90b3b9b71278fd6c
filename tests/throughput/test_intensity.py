"""Verification's operational intensity and the critical context length (method §2, paper Figure 3)."""

import pytest

from spirelib.throughput.intensity import critical_context_length, verification_intensity


def test_critical_context_lengths():
    assert critical_context_length("seqax-67m") == 32
    assert critical_context_length("llama3-70b") == 4096


def test_critical_context_is_where_the_large_batch_intensity_meets_hoi():
    for name in ("seqax-67m", "llama3-70b"):
        crossover = critical_context_length(name, exact=True)
        assert critical_context_length(name) <= crossover < 2 * critical_context_length(name)
        limit = verification_intensity(name, 1e15, crossover)
        assert limit == pytest.approx(600.0, rel=1e-6)
