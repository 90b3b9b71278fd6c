"""Training-cost accounting and the paper's cost analysis (method §2, "Cost analysis").

Units: training the target once = 1 unit. Serving the target autoregressively for the
deployment's lifetime = `serving_units` (paper: 10). Speculative decoding divides decoding
cost by the throughput multiplier TM, so it saves serving_units * (1 - 1/TM), less the
cost of training its draft (paper: SPIRe about 1/4 unit; MagicDec needs no training).
"""

from __future__ import annotations

import numpy as np

from spirelib.throughput.methods import CARDS
from spirelib.throughput.perfmodel import (
    ModelShape,
    body_params,
    fused_params,
    positive,
    resolve_shape,
    scalar_or_array,
)

PAPER_SERVING_UNITS = 10.0


def training_flops(params, tokens, *, flops_per_param_token: float = 6.0):
    """Training FLOPs ~= 6 * params * tokens (forward 2, backward 4 per parameter per token).
    MFU = training_flops(flop_params(shape), tokens/s) / peak FLOP/s."""
    return scalar_or_array(flops_per_param_token * positive(params, "params") * positive(tokens, "tokens"))


def flop_params(shape: ModelShape, vocab_size: int | None = None) -> int:
    """Parameters that cost matmul FLOPs per token: the body (method §2) plus the unembedding
    (the embedding is a lookup). `vocab_size` defaults to the shape's own (a `ModelConfig`)."""
    vocab = vocab_size if vocab_size is not None else shape.vocab_size
    return body_params(shape) + shape.d_model * vocab


def chinchilla_tokens(params, *, tokens_per_param: float = 20.0):
    """Compute-optimal training tokens, 20 per parameter (method §6: each model trained on 20 x N)."""
    return scalar_or_array(tokens_per_param * positive(params, "params"))


def budget_fraction(tokens, params) -> float:
    """The share of the paper's training budget, 20 tokens per parameter (method §6), that a model
    of `params` (body) parameters trained on `tokens` got."""
    return float(positive(tokens, "tokens") / chinchilla_tokens(params))


def draft_training_units(draft: ModelShape | str, target: ModelShape | str, *, token_ratio: float = 1.0,
                         mfu_ratio: float = 1.0, method: str | None = None, k: int = 4) -> float:
    """A draft's training cost in target-training units, from body parameters.

    cost ratio = (N_draft / N_target) * (draft tokens / target tokens) / (draft MFU / target MFU).
    With equal tokens and MFU this is the paper's "1/4 of the body parameters" for SPIRe;
    a lower draft MFU (mfu_ratio < 1) raises it. With `method`, N_draft counts the weights its
    card runs beyond its layers (`fused_params`: EAGLE-3's fusion), times k steps where its
    training unrolls them over every position (EAGLE-3's training-time test).
    """
    shape = resolve_shape(draft, "draft")
    n = body_params(shape)
    if method is not None:
        n = (n + fused_params(method, shape)) * (k if CARDS[method].unrolled else 1)
    ratio = n / body_params(resolve_shape(target, "target"))
    return float(ratio * positive(token_ratio, "token_ratio") / positive(mfu_ratio, "mfu_ratio"))


def measured_training_units(target_tokens_per_s: float, draft_tokens_per_s: float) -> float:
    """A draft's training cost per token in target-training units, from measured training speed:
    the target's training tokens/s over the draft's (method §2, "Cost analysis"). Trained on as
    many tokens as the target, the draft costs this many units. Unlike `draft_training_units` it
    holds everything a training step does: SPIRe's runs the frozen target forward on every batch."""
    return float(positive(target_tokens_per_s, "target_tokens_per_s") / positive(draft_tokens_per_s,
                                                                                   "draft_tokens_per_s"))


def serving_savings(tm, *, serving_units: float = PAPER_SERVING_UNITS, training_units: float = 0.0):
    """Net savings in target-training units: serving_units * (1 - 1/TM) - training_units."""
    tm = positive(tm, "tm")
    serving = positive(serving_units, "serving_units")
    return scalar_or_array(serving * (1 - 1 / tm) - np.asarray(training_units, dtype=float))


def break_even_serving(tm, training_units, *, baseline_tm=1.0, baseline_training_units=0.0):
    """Serving volume (target-training units) above which a draft out-saves a baseline.

    Solves S (1/baseline_tm - 1/tm) = training_units - baseline_training_units. Against
    autoregressive decoding (baseline_tm = 1) it is the volume that repays the draft's
    training. inf where the draft never catches up; 0 where it is ahead from the start.
    """
    tm = positive(tm, "tm")
    base = positive(baseline_tm, "baseline_tm")
    extra = np.asarray(training_units, dtype=float) - np.asarray(baseline_training_units, dtype=float)
    gain = 1 / base - 1 / tm  # decoding cost saved per serving unit
    with np.errstate(divide="ignore", invalid="ignore"):
        volume = np.where(extra <= 0, 0.0, np.where(gain > 0, extra / gain, np.inf))
    return scalar_or_array(volume)


def cost_table(multipliers: dict[str, float], training_units: dict[str, float], *,
               serving_units: float = PAPER_SERVING_UNITS) -> list[dict]:
    """The paper's cost comparison: per method TM, gross savings, training cost, net savings.

    Rows are sorted by net savings, best first; `vs_best_other` is net savings over the next
    best method's (e.g. SPIRe's margin over MagicDec). `net_from_rounded` is the paper's own
    arithmetic: net savings from TM and training cost rounded to two decimals first.
    """
    rows = []
    for method, tm in multipliers.items():
        training = float(training_units.get(method, 0.0))
        gross = serving_savings(tm, serving_units=serving_units)
        rows.append({"method": method, "tm": float(tm), "gross_savings": gross, "training_units": training,
                     "net_savings": gross - training,
                     "net_from_rounded": serving_savings(round(float(tm), 2), serving_units=serving_units,
                                                         training_units=round(training, 2))})
    rows.sort(key=lambda row: row["net_savings"], reverse=True)
    for i, row in enumerate(rows):
        others = [r["net_savings"] for j, r in enumerate(rows) if j != i]
        row["vs_best_other"] = row["net_savings"] / max(others) - 1 if others and max(others) > 0 else float("nan")
    return rows
