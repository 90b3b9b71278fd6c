"""The words of notebook 05, the ablations (method §3.8, §10): the training budget and the
scale, what the intervals are about and how the table's family of comparisons is controlled,
SPIRe's parts in this run's order against the paper's (`order_sentence`, which the run index's
claim uses too), the variants at step 0, where each part starts to pay on the learning curves,
and the conclusion (`lead`)."""

from __future__ import annotations

import numpy as np

from spirelib.throughput.ablations import (
    COMPONENTS,
    DRAFT,
    EFFECTS,
    MEASURED_COMPONENTS,
    TRAINING,
    RankedPart,
    matches_paper_order,
    pays_from,
)
from spirelib.throughput.ablations import PAPER_IMPORTANCE_ORDER as PAPER_ORDER
from spirelib.throughput.methods import label
from spirelib.throughput.recorded_ablations import RecordedDelta, RecordedInterval


def budget_note(tokens: int, main_tokens: int, n_variants: int, n_seeds: int, training_seconds: float) -> str:
    """The ablations' training budget (tokens per seed) against the main SPIRe draft's, in words."""
    return (f"**Budget.** Each variant trains on {tokens:,} tokens per seed, "
            + ("the main SPIRe draft's budget." if tokens >= main_tokens else
               f"{tokens / main_tokens:.0%} of the main SPIRe draft's {main_tokens:,} (notebook 03): "
               f"{n_variants} variants x {n_seeds} seeds at the full budget would take "
               f"{n_variants * n_seeds * main_tokens / tokens:.0f}x this notebook's training time "
               f"({training_seconds:.0f} s here, or loaded from the cache). Differences between variants can grow "
               "with training; the seeds show how much they move at this budget."))


def scale_note(target_scale: str, base, tokens: int, seeds, context_length: int, n_contexts: int, series) -> str:
    """The scale of the ablations in one line: the target's (`display.model_scale`), every
    variant's shape (`base`: the series' SpireConfig) and training tokens per seed, the seeds and
    the tau protocol (method §5: L, contexts, the series' k, G and temperature)."""
    return (f"{target_scale}; every variant {base.num_layers} layers, window {base.window}, {tokens:,} training "
            f"tokens per seed, seeds {seeds}; tau at L = {context_length}, n = {n_contexts} contexts, "
            f"k = {series.k}, G = {series.new_tokens}, T = {series.temperature:g}")


#: How `order_sentence` words each effect, per scope (method §10): over training randomness
#: (two seeds or more), or about the one trained draft per variant that one seed gave.
EFFECT_WORDS = {
    TRAINING: {"helps": "help at this scale (a measured part only when resolved)",
               "harmful": "Resolved as harmful here, removing it raises tau",
               "not resolved": "Not resolved at this scale (no rank)",
               "variant": "Also resolved, a variant against SPIRe"},
    DRAFT: {"helps": "help this trained draft (a measured part only beyond its contexts' noise)",
            "harmful": "Hurt this trained draft, removing it raises its tau",
            "not resolved": "Within the contexts' noise for this trained draft (no rank)",
            "variant": "Also beyond the contexts' noise, a trained variant against SPIRe's"},
}


def scope_phrase(interval: RecordedInterval | None) -> str:
    """The words that open `order_sentence`: what its differences are about (`interval_note`) and,
    where recorded, the family its verdicts are controlled over (method §10); "" for results
    recorded before 05 recorded its interval (those used the earlier interval, whose degrees of
    freedom were wrong: method §10)."""
    if not interval:
        return ""
    fam = interval.family
    controlled = f"; family-wise over the table's {fam.comparisons} comparisons, Holm at {fam.level:.0%}" if fam else ""
    if interval.scope == DRAFT:
        return ("For one trained draft per variant (one seed, the target fixed; not over training randomness"
                f"{controlled}): ")
    return f"Over training randomness ({interval.seeds} seeds per variant, the target fixed{controlled}): "


def order_sentence(ranked: list[RankedPart], interval: RecordedInterval | None = None,
                   taus: dict[str, RecordedDelta] | None = None,
                   variants: dict[str, RecordedDelta] | None = None) -> str:
    """What this run says of SPIRe's parts (`resolved_ranking`'s rows) against the paper's order
    (method §3.8), in words, after what it is about (`scope_phrase` of `interval_note`): the parts
    that help, ranked; the parts resolved as harmful; the parts not resolved (neither gets a rank),
    and whether the ranked parts keep the paper's order; then every other comparison of the table
    resolved in either direction (`variants`: variant -> `delta_record` of its difference to
    SPIRe, those that are no part's). Every measured part carries its tau difference where `taus`
    (part -> `delta_record`) has it, each its own uncorrected 95% interval, said once; a part of
    the cost model alone is labelled "modeled, no interval". 05's lead and the run index's claim
    (`findings`) both say it in these words."""
    words = EFFECT_WORDS[interval.scope if interval else TRAINING]
    helps, harmful, unresolved = ([r for r in ranked if r.effect == effect] for effect in EFFECTS)
    text = (scope_phrase(interval) + f"{len(helps)} of {len(ranked)} parts " + words["helps"]
            + (": " + " > ".join(_part_text(r, taus) for r in helps) if helps else "")
            + (", in the paper's order" if matches_paper_order([(r.part, 0) for r in helps]) else
               ", not in the paper's order") + ".")
    if harmful:
        text += (f" {words['harmful']}: "
                 + ", ".join(_part_text(r, taus, f"; the paper ranks it {PAPER_ORDER.index(r.part) + 1} of "
                                                 f"{len(PAPER_ORDER)}") for r in harmful) + ".")
    if unresolved:
        text += f" {words['not resolved']}: " + ", ".join(_part_text(r, taus) if taus else r.part
                                                          for r in unresolved) + "."
    parts = {frozenset(pair) for pair in COMPONENTS.values()}
    beyond = [(name, d) for name, d in (variants or {}).items()
              if frozenset((name, "spire")) not in parts and d.family_excludes_zero]
    if beyond:
        text += (f" {words['variant']}: " + ", ".join(
            f"{label(name)} {'above' if d.mean > 0 else 'below'} SPIRe ({d.text()} tau)" for name, d in beyond) + ".")
    if taus or beyond:
        text += " Each ± is that difference's own 95% interval, uncorrected."
    return text


def _part_text(row: RankedPart, taus: dict[str, RecordedDelta] | None, tail: str = "") -> str:
    """A part with its tau difference (where `taus` has it; "modeled, no interval" for a part of
    the cost model alone) and the multiplier it is worth."""
    d = (taus or {}).get(row.part)
    tau = f"{d.text()} tau, " if d else "" if row.part in MEASURED_COMPONENTS else "modeled, no interval, "
    return f"{row.part} ({tau}{row.multiplier_lost:+.2f}x{tail})"


def interval_sentence(interval: RecordedInterval | None) -> str:
    """What 05's intervals are about, in words (method §10): what a seed varies, that the target is
    held fixed, and the interval's method and degrees of freedom; with one seed, that every
    difference is about one trained draft per variant. "" without `interval_note`."""
    if not interval:
        return ""
    varies = ("A seed is a draft's training seed: it draws the draft's training windows (which windows of the "
              "training split, in which order) and, for random init, its initial weights; a pruned-init variant has "
              "no random weights (all are copied from the target).")
    fixed = ("The target (notebook 02's), the contexts and the decoding streams are held fixed: this is about drafts "
             "trained on this one target, and a run with a freshly trained target can answer differently.")
    n, df_contexts = interval.n_contexts, interval.df_contexts
    if interval.scope == DRAFT:
        return (f"**One trained draft per variant.** With one training seed, every difference is about the two "
                f"trained drafts that seed gave. Its 95% interval covers only the noise of the {n} contexts "
                f"(Student's t, {df_contexts} degrees of freedom), not training randomness, so nothing here is "
                f"resolved in that sense: that takes two seeds or more (docs/method.md §10). {varies} {fixed}"
                f"{family_sentence(interval)}")
    df = interval.df_seeds
    seeds_term = (f"{df} degree of freedom: t = 12.7, so only large effects, or seeds that agree closely, are resolved"
                  if df == 1 else f"{df} degrees of freedom")
    return (f"**Over training randomness.** Each variant was trained at {interval.seeds} seeds. {varies} {fixed} "
            f"Each 95% interval adds two terms in quadrature, each with its own Student's t (docs/method.md §10): "
            f"the seeds' spread ({seeds_term}) and the noise of the {n} contexts that all seeds share "
            f"({df_contexts} degrees of freedom).{family_sentence(interval)}")


def family_sentence(interval: RecordedInterval) -> str:
    """How the verdicts are controlled across the table (method §10), in words, after a space; ""
    for results recorded before 05 recorded its family (`interval_note`)."""
    fam = interval.family
    if not fam:
        return ""
    m, level = fam.comparisons, fam.tested_at
    looks = ""
    if fam.looks > 1:
        looks = (f" The contexts were decoded in two looks, and the table was judged at the one where it stopped, "
                 f"after {interval.n_contexts} contexts: it stops at the first only where every comparison is settled "
                 f"(resolved, its interval within ±{fam.width:g}, or its seeds' spread alone too wide for more "
                 f"contexts to resolve it). The two looks share the {fam.level:.0%} (Bonferroni), so Holm tested at {level:g} "
                 "there, and the chance below holds whichever look the table stopped at.")
    return (f" The table makes {m} comparisons at once, so a difference counts only family-wise (Holm's step-down): "
            f"the most evident is tested at level {level:g}/{m}, the next at {level:g}/{m - 1}, and so on, stopping at "
            f"the first that fails.{looks} The chance that any difference with no effect passes is then at most "
            f"{fam.level:.0%}; with each 95% interval alone it is about one run in five. The ± figures are each "
            "difference's own 95% interval, uncorrected: one can exclude 0 while the family's test does not pass it.")


def curve_sentence(curves: dict[str, list[tuple[int, float]]], pairs: dict[str, tuple[str, str]]) -> str:
    """Where on the learning curves (`learning_curve` per variant) each part of SPIRe starts to
    pay (`pays_from`), or that it does not within the budget, with the gap (with it minus without)
    at every evaluation both curves share, and, when it does not pay, whether that gap narrowed
    or widened between the last two evaluations."""
    parts = []
    for part, (a, b) in pairs.items():
        if a not in curves or b not in curves or not curves[a] or not curves[b]:
            continue
        start, end = pays_from(curves[a], curves[b]), curves[a][-1][0]
        common = sorted(set(dict(curves[a])) & set(dict(curves[b])))
        gaps = [dict(curves[a])[t] - dict(curves[b])[t] for t in common]
        where = ("pays from step 0 on" if start == 0 else f"pays from {start:,} training tokens on"
                 if start is not None else f"does not pay within {end:,} training tokens")
        trend = ""
        if start is None and len(gaps) > 1:
            change = abs(gaps[-1]) - abs(gaps[-2])  # the latest trend: a part tied at step 0 starts at 0
            trend = ", unchanged" if abs(change) < 1e-3 else ", narrowing" if change < 0 else ", widening"
        parts.append(f"{part} ({label(a)} against {label(b)}) {where} (alpha with it minus without: "
                     + " → ".join(f"{g:+.3f}" for g in gaps) + f"{trend})")
    return ("On the learning curves of validation alpha (evaluations at "
            + ", ".join(f"{t:,}" for t in sorted({t for c in curves.values() for t, _ in c})) + " training tokens): "
            + "; ".join(parts) + ".") if parts else ""


def step0_sentence(initial: dict[str, dict], vocab_size: int) -> str:
    """The variants before any training (`pipeline.initial_spire_metrics` per variant): validation
    alpha and cross-entropy with the data against a uniform guess (ln V), and whether the pruned
    init starts above or below random weights."""
    if not initial:
        return ""
    rows = "; ".join(f"{label(n)} alpha {m['alpha']:.3f} (CE {m['hard_ce']:.2f})" for n, m in initial.items())
    text = (f"At step 0, before training, on the trainer's validation windows: {rows}; a uniform guess has CE "
            f"ln {vocab_size} = {np.log(vocab_size):.2f}.")
    pruned = {n: m for n, m in initial.items() if n != "random_init"}
    if "random_init" in initial and pruned:
        worse = [n for n, m in pruned.items() if m["alpha"] < initial["random_init"]["alpha"]]
        if worse:
            text += (f" The pruned init starts below random weights ({'; '.join(label(n) for n in worse)}): the "
                     "target's last layers, fed the draft's own shallow stream instead of the deep one they were "
                     "trained on, predict worse than a random draft; what the pruned init and the target's "
                     "activations are worth can only come from training.")
        else:
            text += " The pruned init starts above random weights."
    return text


PATH_CHECK = ("A defect in the target-activation path is ruled out by tests, not assumed: tests/model/test_spire.py "
              "checks that k-pass training computes what step-by-step inference computes, and that the keys and values "
              "the draft stores for every verified position, round after round in the engine, are those the target "
              "layer it was pruned from stored at that position (no layer or position off by one).")


def lead(ranked: list[RankedPart], tokens: int, main_tokens: int, step0: str = "", curves: str = "",
         interval: RecordedInterval | None = None, taus: dict[str, RecordedDelta] | None = None,
         variants: dict[str, RecordedDelta] | None = None) -> list[str]:
    """05's conclusion in words, before its evidence (Markdown paragraphs): what helps, hurts or is
    not resolved, and about what (`order_sentence` with `interval_note`, the parts' tau
    differences `taus` and the variants' `variants`: the words the run index's claim uses too);
    what the intervals are about
    (`interval_sentence`); the budget the variants trained at against the main draft's; the
    variants at step 0 (`step0_sentence`) and where each part starts to pay on the learning curves
    (`curve_sentence`); and, when a part that reads the target's activations is resolved as
    harmful, what rules out a defect in that path (`PATH_CHECK`)."""
    budget = (f"The variants trained on {tokens:,} tokens per seed, "
              + ("the main SPIRe draft's budget." if tokens >= main_tokens else
                 f"{tokens / main_tokens:.0%} of the main SPIRe draft's {main_tokens:,}: a difference measured here "
                 "can change sign with more training (the learning curves below show how it moves)."))
    paragraphs = [order_sentence(ranked, interval, taus, variants)]
    paragraphs += [p for p in (interval_sentence(interval), budget, step0, curves) if p]
    if any(r.effect == "harmful" and r.part == "target activations" for r in ranked):
        paragraphs.append(PATH_CHECK)
    return paragraphs
