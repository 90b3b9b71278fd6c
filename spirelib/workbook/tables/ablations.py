"""Tables of notebook 05, the ablations (method §3.8): every SPIRe variant's measured tau over
the training seeds, its paired difference to SPIRe with its family-wise verdict (method §10),
the tau its training predicted, and the parts of SPIRe ranked by the modeled multiplier they
are worth; and what 05 records of them. Each difference's own 95% interval is shown too,
uncorrected and labelled so. The measurement and the verdicts are `measure.ablations`'."""

from __future__ import annotations

import numpy as np

from spirelib.measure.ablations import FAMILY_LEVEL, DeltaRule, family
from spirelib.measure.tau import DeltaTau
from spirelib.throughput.ablations import DRAFT, TRAINING, RankedPart
from spirelib.throughput.methods import label
from spirelib.throughput.recorded_ablations import (
    AblationProtocol,
    Family,
    RecordedAblations,
    RecordedDelta,
    RecordedInterval,
    VariantTau,
)

TAU_COLUMNS = {"variant": "variant", "tau": "tau (mean over seeds, 95% CI)",
               "predicted": "tau predicted in training (from alpha_j)",
               "delta": "vs SPIRe (paired, 95% CI of this difference alone, uncorrected)",
               "seeds": "vs SPIRe per seed", "resolved": "resolved over training seeds? (family-wise, Holm)",
               "paper": "tau (paper, L = 512)", "paper_delta": "paper vs SPIRe"}
IMPORTANCE_COLUMNS = {"rank": "rank (ours)", "ours": "part",
                      "drop": "throughput multiplier (TM) lost without it (ours)",
                      "delta": "tau with it minus without (paired, 95% CI of this part alone, uncorrected)",
                      "paper_rank": "rank (paper)", "paper_drop": "TM lost without it (paper taus)"}


def interval_note(deltas: dict, comparisons: int, rule: DeltaRule) -> RecordedInterval | None:
    """What the paired intervals of `deltas` (name -> `tau.DeltaTau`, all over the same seeds and
    contexts) are about, as results.json records it: "scope" (TRAINING or DRAFT), the seeds S and
    contexts n, the degrees of freedom of the seeds' and the contexts' terms (method §10), that
    the target is held fixed, and the family its verdicts are controlled over (Holm, at
    `FAMILY_LEVEL`, over `comparisons`: the size of the table's `family`; under `rule`'s looks,
    at its level where the table stopped). None without deltas."""
    if not deltas:
        return None
    d = next(iter(deltas.values()))
    df_seeds, df_contexts = d.df
    return RecordedInterval(d.scope, d.about, d.seeds, d.n_contexts, df_seeds, df_contexts, "fixed",
                            Family("Holm", FAMILY_LEVEL, comparisons, rule.looks, rule.look_level(d.n_contexts),
                                   rule.look_width))


def tau_rows(stats: dict, predicted: dict, deltas: dict, paper_tau: dict, shown: dict[str, bool]) -> list[dict]:
    """Per variant: tau (95% CI) over the seeds (`seed_taus`), the tau predicted in training, the
    paired difference to SPIRe (mean, its own uncorrected 95% CI, per seed, and its family-wise
    verdict `shown` (`verdicts`): resolved over training randomness, or with one seed whether it
    shows for that trained draft) and the paper's tau and difference."""
    rows = []
    for name, s in stats.items():
        d = deltas.get(name)
        rows.append({"variant": label(name), "tau": f"{s.mean:.3f} ± {s.ci95:.3f}", "predicted": predicted[name],
                     "delta": f"{d.mean:+.3f} ± {d.ci95:.3f}" if d is not None else "(reference)",
                     "seeds": ", ".join(f"{x:+.3f}" for x in d.per_seed) if d is not None else "",
                     "resolved": _resolved_cell(d, shown[name]) if d is not None else "",
                     "paper": paper_tau.get(name, np.nan),
                     "paper_delta": paper_tau.get(name, np.nan) - paper_tau["spire"]})
    return rows


def _resolved_cell(d, shown: bool) -> str:
    if d.scope == DRAFT:
        return ("one seed: shows for this trained draft, not resolved over training" if shown else
                "one seed: not even for this trained draft")
    if shown:
        return "yes"
    return ("not resolved at this scale (its own interval excludes 0, the family's does not)" if d.excludes_zero
            else "not resolved at this scale")


def importance_rows(ranked: list[RankedPart], component_deltas: dict, paper: dict, paper_order) -> list[dict]:
    """The parts of SPIRe in our order (`ablations.resolved_ranking`): the multiplier lost
    without each, the paired tau difference behind it (a cost-model-only part has none), and
    the paper's rank (`paper_order`) and multiplier lost with its taus (`paper`: part -> TM)."""
    return [{"rank": r.rank or _no_rank(r), "ours": r.part, "drop": r.multiplier_lost,
             "delta": (f"{component_deltas[r.part].mean:+.3f} ± {component_deltas[r.part].ci95:.3f}"
                       if r.part in component_deltas else "modeled, no interval (cost model only)"),
             "paper_rank": list(paper_order).index(r.part) + 1, "paper_drop": paper.get(r.part, np.nan)}
            for r in ranked]


def _no_rank(row: RankedPart) -> str:
    if row.scope == DRAFT:
        return "hurts this trained draft" if row.effect == "harmful" else "within the contexts' noise"
    return "harmful at this scale" if row.effect == "harmful" else "not resolved at this scale"


def ablation_results(stats: dict, ranked: list[RankedPart], deltas: dict, component_deltas: dict,
                     shown: dict[str, bool], seeds, agree: bool, protocol: AblationProtocol) -> RecordedAblations:
    """What notebook 05 records: per variant its tau over the seeds (mean, CI, contexts), the
    ranking, the paired differences to SPIRe per variant and per part (`delta_record`, with their
    family-wise verdicts `shown`), what their intervals are about (`interval_note`), the seeds,
    whether the ranking matches the paper's and the protocol (`ablation_protocol`)."""
    return RecordedAblations(
        tau={name: VariantTau(s.mean, s.ci95, s.n_contexts) for name, s in stats.items()}, importance=ranked,
        delta_tau={name: delta_record(d, shown[name]) for name, d in deltas.items()},
        component_delta_tau={part: delta_record(d, shown[part]) for part, d in component_deltas.items()},
        interval=interval_note(component_deltas or deltas, len(family(component_deltas, deltas)), looks_of(protocol)),
        seeds=seeds, importance_matches_paper=agree, ablation_protocol=protocol)


def looks_of(protocol: AblationProtocol) -> DeltaRule:
    """The looks `protocol` was measured under (`ablation_protocol`): its two-look rule, or one look
    where it had none (or recorded none)."""
    return DeltaRule.of(protocol.first_look or 0, protocol.n_contexts or 1, protocol.look_width or 0.0)


def delta_record(d: DeltaTau, shown: bool) -> RecordedDelta:
    """A paired difference as results.json holds it (`DeltaTau.to_dict`): "resolved" is the
    family-wise verdict (method §10), "family_excludes_zero" what it shows with one seed too;
    "ci95", "excludes_zero" and "resolved_alone" are this difference's own interval, uncorrected."""
    return RecordedDelta.from_dict({**d.to_dict(), "resolved": shown and d.scope == TRAINING,
                                    "family_excludes_zero": shown, "resolved_alone": d.resolved})


def ablation_protocol(series, context_length: int, rule: DeltaRule, budget, base, seeds, training_seconds: float,
                      scale: str) -> AblationProtocol:
    """How the ablations were measured (method §5's tau protocol, under `rule`'s looks) and trained,
    as results.json holds it."""
    return AblationProtocol(context_length, rule.cap, rule.first_look, rule.look_width,
                            series.k, series.new_tokens, series.temperature, series.tau_seed, budget.to_dict(),
                            base.to_dict(), seeds, training_seconds, scale)


