"""Every drafting method's builder, in one explicit table (method §4): the torch half of a method
whose card (`throughput.methods.CARDS`) holds the rest. `draft_factory` makes the per-batch draft
factories the tau measurement, the wall clock and the benchmarks use.

A builder is `build(target, model, *, temperature, **options)` -> a fresh `speculative.Draft`;
`model` is the method's trained draft model (None for a method whose card needs none). The
sparse self-drafts take their `KVBudget` as `budget=`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from spirelib.decoding.drafts import MagicDecDraft, VanillaDraft, in_dtype, spire_draft
from spirelib.decoding.eagle3 import eagle3_builder
from spirelib.decoding.guided import GUIDED_BUDGET, GuidedDraft
from spirelib.decoding.lookup import MAX_N, MIN_N, LookupDraft
from spirelib.decoding.speculative import Draft
from spirelib.model.transformer import Transformer
from spirelib.throughput.methods import CARDS, MAGICDEC_BUDGET, KVBudget

DraftFactory = Callable[[], Draft]
"""Builds a fresh draft (one per batch; the engine hands it its uniforms every round)."""


def _vanilla(target, model, *, temperature):
    return VanillaDraft(model, temperature=temperature)


def _magicdec(target, model, *, temperature, budget: KVBudget = MAGICDEC_BUDGET, rope_mode: str = "cache"):
    return MagicDecDraft(target, budget, rope_mode=rope_mode, temperature=temperature)


def _spire(target, model, *, temperature):
    return spire_draft(model, temperature=temperature)


def _guided(target, model, *, temperature, budget: KVBudget = GUIDED_BUDGET):
    return GuidedDraft(target, budget, temperature=temperature)


RECENT_BUDGET = KVBudget.ring(MAGICDEC_BUDGET.entries, 0)  # MagicDec's entries, all of them recent


def _recent(target, model, *, temperature, budget: KVBudget = RECENT_BUDGET):
    return MagicDecDraft(target, budget, temperature=temperature)


def _lookup(target, model, *, temperature, min_n: int = MIN_N, max_n: int = MAX_N):
    return LookupDraft(target, min_n, max_n)


BUILDERS: dict[str, Callable[..., Draft]] = {"vanilla": _vanilla, "magicdec": _magicdec, "spire": _spire,
                                             "guided": _guided, "recent": _recent, "lookup": _lookup,
                                             "eagle3": eagle3_builder}


def draft_factory(method: str, target: Transformer, model: torch.nn.Module | None = None, *,
                  temperature: float, dtype: torch.dtype | None = None, **options) -> DraftFactory:
    """A factory of `method`'s drafts for `target` (and its trained draft `model`). The draft
    decodes in `dtype`, by default the target's (a bf16 target decodes with a bf16 copy of its
    fp32-trained draft: the target's activations and the draft's weights meet in one dtype)."""
    if method not in BUILDERS:
        raise ValueError(f"unknown method {method!r}; the decoded ones: {sorted(BUILDERS)}")
    build = BUILDERS[method]
    if CARDS[method].needs_model and model is None:
        raise ValueError(f"method {method!r} needs its trained draft model")
    try:  # an unknown option fails here, before any decoding
        inspect.signature(build).bind(target, model, temperature=temperature, **options)
    except TypeError as e:
        raise ValueError(f"method {method!r}: {e}") from None
    if model is not None:
        model = in_dtype(model, dtype or next(target.parameters()).dtype)
    return lambda: build(target, model, temperature=temperature, **options)
