"""The ablations measured and judged (method §3.8, §5, §10), as notebook 05 runs them: every
SPIRe variant at every training seed decodes the same contexts with the same random streams
(`variant_counts`), so its difference to SPIRe is paired (`paired_deltas`, `table_deltas`,
`seed_taus`), in two looks where the table settles early (`DeltaRule`); which
differences are resolved, family-wise over every comparison one table reports (Holm's
step-down, `verdicts`; `resolved_family` for any family, 04's KV-budget sweep too), and the
ranking of SPIRe's parts they support; the tau each variant's training predicted; the modeled
multiplier each part is worth at the paper's headline cell with our taus and with the paper's;
and each variant's learning curve (where a part starts to pay on them: `ablations.pays_from`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spirelib.decoding.builders import draft_factory
from spirelib.measure.intervals import t_quantile
from spirelib.measure.stopping import HALF_WIDTH
from spirelib.measure.tau import AcceptCounts, DeltaTau, TauProtocol, delta_tau, measure_tau, tau_over_seeds
from spirelib.model.config import ABLATIONS
from spirelib.throughput import perfmodel
from spirelib.throughput.ablations import (
    COMPONENTS,
    MEASURED_COMPONENTS,
    TRAINING,
    RankedPart,
    importance,
    resolved_ranking,
    variant_multipliers,
)
from spirelib.throughput.acceptance import tau_from_per_position


def variant_counts(target, variants: dict, contexts, context_length: int, protocol: TauProtocol,
                   temperature: float, progress: bool = True, rule: DeltaRule | None = None,
                   ) -> dict[int, dict[str, AcceptCounts]]:
    """seed -> variant -> AcceptCounts at `context_length` (method §5's protocol): every variant
    at every seed (`variants`: seed -> name -> trained SPIRe draft) decodes the same contexts
    ((n, L + G) tokens) with the same random streams, so differences are paired. One `measure_tau`
    decodes them all (as "seed/variant"), so each batch's target prefill serves every draft; under
    `rule` (`DeltaRule`) they all stop at its first look when the table is settled there."""
    factories = {draft_key(seed, name): draft_factory("spire", target, v.model, temperature=temperature)
                 for seed, by_name in variants.items() for name, v in by_name.items()}
    measured = measure_tau(target, factories, {context_length: contexts}, protocol, progress=progress,
                           rule=rule).counts
    return {seed: {name: measured[draft_key(seed, name)][context_length] for name in by_name}
            for seed, by_name in variants.items()}


def draft_key(seed, variant: str) -> str:
    """How `variant_counts` names one seed's variant among the drafts it decodes ("seed/variant")."""
    return f"{seed}/{variant}"


def seed_and_variant(key: str) -> tuple[str, str]:
    """The (seed, variant) a `draft_key` names (the seed as text)."""
    seed, variant = key.split("/", 1)
    return seed, variant


def paired_deltas(counts: dict[int, dict[str, AcceptCounts]], pairs: dict[str, tuple[str, str]]) -> dict:
    """name -> `tau.delta_tau` of variant a minus variant b over all seeds of `counts`, for
    every (a, b) of `pairs` whose two variants were measured."""
    seeds = list(counts)
    return {name: delta_tau([counts[s][a] for s in seeds], [counts[s][b] for s in seeds])
            for name, (a, b) in pairs.items() if a in counts[seeds[0]] and b in counts[seeds[0]]}


def table_deltas(counts: dict) -> tuple[dict, dict]:
    """(component_deltas, deltas) of 05's table from `counts` (seed -> variant -> AcceptCounts):
    every measured part's paired difference (`MEASURED_COMPONENTS`) and every variant's to SPIRe
    (`paired_deltas`)."""
    names = counts[next(iter(counts))]
    return (paired_deltas(counts, MEASURED_COMPONENTS),
            paired_deltas(counts, {name: (name, "spire") for name in names if name != "spire"}))


def seed_taus(counts: dict[int, dict[str, AcceptCounts]]) -> dict:
    """name -> `tau.tau_over_seeds`: every variant's tau, the mean over the seeds of `counts`, with
    its 95% interval over training seeds and contexts (with one seed: over its contexts)."""
    seeds = list(counts)
    return {name: tau_over_seeds([counts[s][name] for s in seeds]) for name in counts[seeds[0]]}


#: The family-wise error rate at which 05 calls differences resolved (method §10): the chance
#: that any comparison of one ablation table with no effect is called resolved.
FAMILY_LEVEL = 0.05
#: The share of `FAMILY_LEVEL` 05's first look spends (`DeltaRule.look_level`; why this share: its docstring).
FIRST_SHARE = 0.2


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


@dataclass(frozen=True)
class DeltaRule:
    """When notebook 05 has decoded enough contexts (method §5, §10): a two-look design over its
    table's family (`family`), every seed's every variant decoding the same batches in lockstep
    (`variant_counts`).

    At the first look, after `first` contexts (a batch boundary: the caller's multiple of its
    batch size), the table stops if every comparison is settled (`settled`): resolved family-wise,
    or its own 95% interval within +-`width` tau, or beyond the reach of more contexts, where the
    seeds' term of its interval alone (at the level Holm's last step tests) is wider than |mean|:
    more contexts narrow only the contexts' term. Otherwise it decodes on to the `cap` and is
    judged there, whatever its intervals.

    **Why Holm at a share of `level` at each look** (`look_level`). Stopping where a difference is
    resolved is a test repeated at each look. With two looks placed before any context is decoded,
    each tested at its share of the level (Bonferroni over looks, as 09's `stopping.SpeedupRule`),
    the chance that the stopped look resolves a difference with no effect is at most P(look 1 does)
    + P(look 2 does) <= `level`, whatever chose the look. The first look spends `FIRST_SHARE` (0.2:
    Holm at 0.01), the cap the rest (0.04). Simulated at 05's budget
    (tests/measure/test_ablation_stopping.py), a part worth 0.5 tau is then resolved in 0.96-1.00 of
    replicates (one look at 0.05: 0.98-1.00); an even split stops more tables early but resolves it
    in only 0.88-0.91 where the seeds spread most, since with 3 seeds Holm's t grows fast in the tail
    (t_2 = 10.9 at 0.05/6, 15.4 at 0.025/6, 24.4 at 0.01/6). For 05's last measured pruned init,
    +0.515 +- 0.049 at 128 contexts, Holm's first step at the first look needs the seeds' standard
    error under 0.515 / 24.4 = 0.021; that +-0.049 puts it at 0.011 or less. Each difference's own
    95% interval is reported as measured at the look it stopped; the same simulation checks that it still covers (0.95-0.975) and that any null part
    is resolved in at most 0.02 of replicates.
    `first` >= `cap`: one look, at the cap, at `level`."""

    first: int
    cap: int
    width: float = HALF_WIDTH
    level: float = FAMILY_LEVEL

    def __post_init__(self):
        if not (self.first >= 1 and self.cap >= 1 and self.width >= 0 and 0 < self.level < 1):
            raise ValueError(f"a DeltaRule needs first >= 1, cap >= 1, width >= 0 and 0 < level < 1, got {self}")

    @classmethod
    def of(cls, first_look: int, n_contexts: int, width: float = HALF_WIDTH) -> DeltaRule:
        """The rule of 05's parameters (`look_problems`): the first look after `first_look` contexts
        (0: one look), the cap `n_contexts`."""
        return cls(first_look or n_contexts, n_contexts, width)

    @property
    def looks(self) -> int:
        """How many looks the design has: 1 where `cap` <= `first`, else 2."""
        return 1 if self.cap <= self.first else 2

    @property
    def first_look(self) -> int | None:
        """The contexts at the first of two looks, as results.json records it; None with one look."""
        return self.first if self.looks > 1 else None

    @property
    def look_width(self) -> float | None:
        """The half-width that settles a comparison at the first of two looks; None with one look."""
        return self.width if self.looks > 1 else None

    def look_level(self, n_contexts: int) -> float:
        """Holm's family-wise level at the look after `n_contexts`: `FIRST_SHARE` of `level` at the
        first of two looks, the rest at the cap (Bonferroni over the looks); `level` with one look."""
        if self.looks == 1:
            return self.level
        return round(self.level * (FIRST_SHARE if n_contexts < self.cap else 1 - FIRST_SHARE), 12)

    def settled(self, mean, seeds_var, contexts_var, seeds: int, n_contexts: int) -> np.ndarray:
        """Which comparisons of a family (last axis; batched over leading ones, measured at the same
        S seeds and n contexts) more contexts would not change (class docstring)."""
        mean = np.abs(np.asarray(mean, dtype=float))
        resolved = holm(mean, seeds_var, contexts_var, seeds, n_contexts, self.look_level(n_contexts))
        precise = seeds_half_width(seeds_var, contexts_var, seeds, n_contexts, 0.05) <= self.width
        if seeds < 2:
            return resolved | precise
        reach = seeds_half_width(seeds_var, 0.0, seeds, n_contexts, self.look_level(self.cap))
        return resolved | precise | (mean < reach)

    def stops(self, mean, seeds_var, contexts_var, seeds: int, n_contexts: int) -> np.ndarray:
        """Whether a table (its family on the last axis, as `settled`) stops at this look: every
        comparison settled."""
        return self.settled(mean, seeds_var, contexts_var, seeds, n_contexts).all(-1)

    def stopped(self, counts: dict[str, AcceptCounts]) -> list[str]:
        """Every draft of `counts` ("seed/variant" -> its AcceptCounts so far, `variant_counts`) at
        the first look where the table is settled there; else none (`tau.measure_tau`'s rule)."""
        n = {c.accepted.shape[0] for c in counts.values()}
        if self.looks == 1 or n != {self.first}:
            return []
        by_seed: dict[str, dict[str, AcceptCounts]] = {}
        for key, c in counts.items():
            seed, name = seed_and_variant(key)
            by_seed.setdefault(seed, {})[name] = c
        tested = list(family(*table_deltas(by_seed)).values())
        if not tested:
            return []
        stop = self.stops([d.mean for d in tested], [d.seeds_var for d in tested], [d.contexts_var for d in tested],
                          tested[0].seeds, self.first)
        return list(counts) if stop else []


def look_problems(first_look, n_contexts, batch_size, width) -> list[str]:
    """What is wrong with notebook 05's stopping parameters, in words ([] when nothing is): the
    first look an integer >= 2 and a multiple of the batch size (0: one look, at `n_contexts`),
    and the width a number >= 0."""
    out = []
    if isinstance(first_look, bool) or not isinstance(first_look, int) or first_look < 0 or first_look == 1:
        out.append(f"delta_first_look must be 0 (one look) or an integer >= 2 (contexts), got {first_look!r}")
    elif first_look and first_look % batch_size:
        out.append(f"delta_first_look ({first_look}) must be a multiple of decode_batch_size ({batch_size}): "
                   "a look falls between batches")
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width >= 0:
        out.append(f"delta_half_width must be a number >= 0, got {width!r}")
    return out


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
