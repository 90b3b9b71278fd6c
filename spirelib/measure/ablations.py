"""The ablations measured and judged (method §3.8, §5, §10), as notebook 05 runs them: every
SPIRe variant at every training seed decodes the same contexts with the same random streams
(`variant_counts`), so its difference to SPIRe is paired (`paired_deltas`, `seed_taus`); which
differences are resolved, family-wise over every comparison one table reports (Holm's
step-down, `verdicts`; `resolved_family` for any family, 04's KV-budget sweep too), and the
ranking of SPIRe's parts they support; the tau each variant's training predicted; the modeled
multiplier each part is worth at the paper's headline cell with our taus and with the paper's;
and each variant's learning curve (where a part starts to pay on them: `ablations.pays_from`)."""

from __future__ import annotations

import numpy as np

from spirelib.decoding.builders import draft_factory
from spirelib.measure.intervals import t_quantile
from spirelib.measure.tau import AcceptCounts, DeltaTau, TauProtocol, delta_tau, measure_tau, tau_over_seeds
from spirelib.model.config import ABLATIONS
from spirelib.throughput import perfmodel
from spirelib.throughput.ablations import (
    COMPONENTS,
    TRAINING,
    RankedPart,
    importance,
    resolved_ranking,
    variant_multipliers,
)
from spirelib.throughput.acceptance import tau_from_per_position


def variant_counts(target, variants: dict, contexts, context_length: int, protocol: TauProtocol,
                   temperature: float, progress: bool = True) -> dict[int, dict[str, AcceptCounts]]:
    """seed -> variant -> AcceptCounts at `context_length` (method §5's protocol): every variant
    at every seed (`variants`: seed -> name -> trained SPIRe draft) decodes the same contexts
    ((n, L + G) tokens) with the same random streams, so differences are paired."""
    counts = {}
    for seed, by_name in variants.items():
        factories = {name: draft_factory("spire", target, v.model, temperature=temperature)
                     for name, v in by_name.items()}
        measured = measure_tau(target, factories, {context_length: contexts}, protocol,
                               progress=progress).counts
        counts[seed] = {name: by_length[context_length] for name, by_length in measured.items()}
    return counts


def paired_deltas(counts: dict[int, dict[str, AcceptCounts]], pairs: dict[str, tuple[str, str]]) -> dict:
    """name -> `tau.delta_tau` of variant a minus variant b over all seeds of `counts`, for
    every (a, b) of `pairs` whose two variants were measured."""
    seeds = list(counts)
    return {name: delta_tau([counts[s][a] for s in seeds], [counts[s][b] for s in seeds])
            for name, (a, b) in pairs.items() if a in counts[seeds[0]] and b in counts[seeds[0]]}


def seed_taus(counts: dict[int, dict[str, AcceptCounts]]) -> dict:
    """name -> `tau.tau_over_seeds`: every variant's tau, the mean over the seeds of `counts`, with
    its 95% interval over training seeds and contexts (with one seed: over its contexts)."""
    seeds = list(counts)
    return {name: tau_over_seeds([counts[s][name] for s in seeds]) for name in counts[seeds[0]]}


#: The family-wise error rate at which 05 calls differences resolved (method §10): the chance
#: that any comparison of one ablation table with no effect is called resolved.
FAMILY_LEVEL = 0.05


def seeds_half_width(seeds_var, contexts_var, seeds: int, n_contexts: int, level: float):
    """The half-width of `tau.seeds_interval` at two-sided `level` (0.05: its 95% interval), over
    arrays of its two variance terms (method §10): sqrt(t_{1-level/2, S-1}^2 seeds_var +
    t_{1-level/2, n-1}^2 contexts_var), without the seeds' term at one seed."""
    q = 1 - level / 2
    width = t_quantile(q, n_contexts - 1) ** 2 * np.asarray(contexts_var, dtype=float)
    if seeds > 1:
        width = width + t_quantile(q, seeds - 1) ** 2 * np.asarray(seeds_var, dtype=float)
    return np.sqrt(width)


def holm(mean, seeds_var, contexts_var, seeds: int, n_contexts: int, level: float = FAMILY_LEVEL) -> np.ndarray:
    """Holm's step-down over the last axis, m comparisons measured at the same S seeds and n
    contexts (method §10), batched over leading axes: which differences are resolved with the
    chance of resolving any null one held at `level`, whatever their dependence. While r
    comparisons remain unresolved, each one whose interval at level / r (`seeds_half_width`) excludes
    0 is resolved; it stops when none is. Resolving all that pass at once is Holm's order on the
    intervals' p-values: r only shrinks, so the others pass at the next step too."""
    mean = np.abs(np.asarray(mean, dtype=float))
    m = mean.shape[-1]
    widths = np.stack([seeds_half_width(seeds_var, contexts_var, seeds, n_contexts, level / r)
                       for r in range(1, m + 1)], axis=-1)  # (..., m, r - 1)
    resolved = np.zeros(mean.shape, dtype=bool)
    for _ in range(m):
        left = np.broadcast_to(m - resolved.sum(-1, keepdims=True), mean.shape)
        width = np.take_along_axis(widths, np.maximum(left - 1, 0)[..., None], -1)[..., 0]
        new = ~resolved & (mean > width)
        if not new.any():
            break
        resolved |= new
    return resolved


def family(component_deltas: dict, deltas: dict) -> dict[str, DeltaTau]:
    """The comparisons one ablation table reports, each once (method §10's family): every measured
    part (`paired_deltas` of `MEASURED_COMPONENTS`), and every variant's difference to SPIRe
    (`deltas`, keyed by variant) that is not a part's with the sign turned."""
    parts = {frozenset(pair) for part, pair in COMPONENTS.items() if part in component_deltas}
    return {**component_deltas,
            **{name: d for name, d in deltas.items() if frozenset((name, "spire")) not in parts}}


def verdicts(component_deltas: dict, deltas: dict, level: float = FAMILY_LEVEL) -> dict[str, bool]:
    """Part or variant -> whether its difference is resolved family-wise: `holm` over the `family`
    of the table, a variant taking the verdict of the part it differs from SPIRe by. Over two seeds
    or more, resolved over training randomness; with one seed, that the difference shows for that
    seed's trained drafts beyond the contexts' noise (never resolved over training, method §10)."""
    shown = resolved_family(family(component_deltas, deltas), level)
    pair_of = {frozenset(COMPONENTS[part]): part for part in component_deltas}
    return {**shown, **{name: shown[pair_of.get(frozenset((name, "spire")), name)] for name in deltas}}


def resolved_family(tested: dict[str, DeltaTau], level: float = FAMILY_LEVEL) -> dict[str, bool]:
    """Name -> whether its difference is resolved, `holm` over all of `tested` (paired differences
    measured at the same seeds and contexts) as one family: 05's tables (`verdicts`) and 04's
    KV-budget sweep, one comparison per budget."""
    if not tested:
        return {}
    ds = list(tested.values())
    return dict(zip(tested, holm([d.mean for d in ds], [d.seeds_var for d in ds], [d.contexts_var for d in ds],
                                 ds[0].seeds, ds[0].n_contexts, level).tolist()))


def ranking(ours: list[tuple[str, float]], component_deltas: dict, shown: dict[str, bool]) -> list[RankedPart]:
    """`ablations.resolved_ranking` of `ours` (`headline_importance`) with the family-wise verdicts
    `shown` (`verdicts`) of the paired differences per part (`paired_deltas`): over two seeds or
    more, resolved over training randomness; with one seed, what shows for that seed's trained
    drafts, rows marked scope DRAFT."""
    scope = next(iter(component_deltas.values())).scope if component_deltas else TRAINING
    return resolved_ranking(ours, {part: shown[part] for part in component_deltas}, scope)


def predicted_taus(variants: dict, k: int) -> dict[str, float]:
    """Per variant, the tau its training predicts from the validation alpha_j of each draft
    position j = 1..k (`acceptance.tau_from_per_position`), averaged over the seeds
    (`variants`: seed -> name -> trained draft)."""
    seeds = list(variants)
    return {name: float(np.mean([tau_from_per_position([variants[s][name].summary[f"alpha_{j}"]
                                                        for j in range(1, k + 1)]) for s in seeds]))
            for name in variants[seeds[0]]}


def check_variants(names) -> None:
    """Refuse ablation names that `config.ABLATIONS` does not know (ValueError naming the choices)."""
    unknown = sorted(set(names) - set(ABLATIONS))
    if unknown:
        raise ValueError(f"unknown ablations {unknown}; choose from {sorted(ABLATIONS)}")


def paper_deltas(names) -> dict[str, float]:
    """The paper's tau difference to SPIRe (method §3.8, `perfmodel.PAPER_ABLATION_TAU`) per variant it reports."""
    paper = perfmodel.PAPER_ABLATION_TAU
    return {name: paper[name] - paper["spire"] for name in names if name in paper}


def headline_importance(taus: dict, k: int, hoi: float = perfmodel.PAPER_HOI) -> list[tuple[str, float]]:
    """`ablations.importance` at the paper's headline cell (B = 64, L = 512, seqax-67m with its
    SPIRe draft, method §2): the modeled multiplier each part of SPIRe is worth given the variants' taus."""
    return importance(variant_multipliers(taus, 64, 512, "seqax-67m", "spire-draft", k=k, hoi=hoi))


def paper_importance(k: int, hoi: float = perfmodel.PAPER_HOI) -> dict[str, float]:
    """`headline_importance` with the paper's measured ablation taus (its "no_sparse_kv" is the
    cost model's, not a tau of its own)."""
    taus = {name: tau for name, tau in perfmodel.PAPER_ABLATION_TAU.items() if name != "no_sparse_kv"}
    return dict(headline_importance(taus, k, hoi))


def learning_curve(metrics: list[dict], initial: dict | None = None, key: str = "alpha") -> list[tuple[int, float]]:
    """(training tokens, validation `key`) of a training run's metrics log, the step-0 value
    (`pipeline.initial_spire_metrics`) first where given: a learning curve of the training-time
    expected acceptance alpha (method §8) by default."""
    points = [(0, float(initial[key]))] if initial and key in initial else []
    return points + [(int(m["tokens"]), float(m[key])) for m in metrics if m["kind"] == "val" and key in m]
