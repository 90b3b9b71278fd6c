"""Tables of notebook 05, the ablations (method §3.8): every SPIRe variant's measured tau over
the training seeds, its paired difference to SPIRe, the tau its training predicted, and
the parts of SPIRe ranked by the modeled multiplier they are worth (`ablations`); and what the
intervals are about (method §10): over training randomness with the target held fixed (two
seeds or more), or, with one seed, the one trained draft per variant."""

from __future__ import annotations

import numpy as np

from spirelib.engine.drafts import draft_factory
from spirelib.engine.spire import ABLATIONS
from spirelib.engine.tau import AcceptCounts, TauProtocol, delta_tau, measure_tau, tau_over_seeds
from spirelib.modeling import perfmodel
from spirelib.modeling.ablations import PAPER_IMPORTANCE_ORDER as PAPER_ORDER
from spirelib.modeling.ablations import (
    DRAFT,
    TRAINING,
    importance,
    matches_paper_order,
    resolved_ranking,
    variant_multipliers,
)
from spirelib.modeling.acceptance import tau_from_per_position
from spirelib.modeling.methods import label

TAU_COLUMNS = {"variant": "variant", "tau": "tau (mean over seeds, 95% CI)",
               "predicted": "tau predicted in training (from alpha_j)", "delta": "vs SPIRe (paired, 95% CI)",
               "seeds": "vs SPIRe per seed", "resolved": "resolved over training seeds?",
               "paper": "tau (paper, L = 512)", "paper_delta": "paper vs SPIRe"}
IMPORTANCE_COLUMNS = {"rank": "rank (ours)", "ours": "part", "drop": "TM lost without it (ours)",
                      "delta": "tau with it minus without (paired)", "paper_rank": "rank (paper)",
                      "paper_drop": "TM lost without it (paper taus)"}


def budget_note(tokens: int, main_tokens: int, n_variants: int, n_seeds: int, training_seconds: float) -> str:
    """The ablations' training budget (tokens per seed) against the main SPIRe draft's, in words."""
    return (f"**Budget.** Each variant trains on {tokens:,} tokens per seed, "
            + ("the main SPIRe draft's budget." if tokens >= main_tokens else
               f"{tokens / main_tokens:.0%} of the main SPIRe draft's {main_tokens:,} (notebook 03): "
               f"{n_variants} variants x {n_seeds} seeds at the full budget would take "
               f"{n_variants * n_seeds * main_tokens / tokens:.0f}x this notebook's training time "
               f"({training_seconds:.0f} s here, or loaded from the cache). Differences between variants can grow "
               "with training; the seeds show how much they move at this budget."))


def variant_counts(target, variants: dict, contexts, context_length: int, protocol: TauProtocol,
                   temperature: float, progress: bool = True) -> dict[int, dict[str, AcceptCounts]]:
    """seed -> variant -> AcceptCounts at `context_length` (method §5's protocol): every variant
    at every seed (`variants`: seed -> name -> trained SPIRe draft) decodes the same contexts
    ((n, L + G) tokens) with the same random streams, so differences are paired."""
    counts = {}
    for seed, by_name in variants.items():
        factories = {name: draft_factory("spire", target, v.model, temperature=temperature)
                     for name, v in by_name.items()}
        measured = measure_tau(target, factories, {context_length: contexts}, protocol, progress=progress)
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


def interval_note(deltas: dict) -> dict | None:
    """What the paired intervals of `deltas` (name -> `tau.DeltaTau`, all over the same seeds and
    contexts) are about, as results.json records it: "scope" (TRAINING or DRAFT), the seeds S and
    contexts n, the degrees of freedom of the seeds' and the contexts' terms (method §10) and that
    the target is held fixed. None without deltas."""
    if not deltas:
        return None
    d = next(iter(deltas.values()))
    df_seeds, df_contexts = d.df
    return {"scope": d.scope, "about": d.about, "seeds": d.seeds, "n_contexts": d.n_contexts, "df_seeds": df_seeds,
            "df_contexts": df_contexts, "target": "fixed"}


def ranking(ours: list[tuple[str, float]], component_deltas: dict) -> list[dict]:
    """`ablations.resolved_ranking` of `ours` (`headline_importance`) with the paired differences
    per part (`paired_deltas`): over two seeds or more, resolved over training randomness
    (`DeltaTau.resolved`); with one seed, whether the interval excludes 0 for that seed's trained
    drafts (`DeltaTau.excludes_zero`), rows marked scope DRAFT."""
    note = interval_note(component_deltas)
    scope = note["scope"] if note else TRAINING
    shown = {part: d.resolved if scope == TRAINING else d.excludes_zero for part, d in component_deltas.items()}
    return resolved_ranking(ours, shown, scope)


def predicted_taus(variants: dict, k: int) -> dict[str, float]:
    """Per variant, the tau its training predicts from the validation alpha_j of each draft
    position j = 1..k (`acceptance.tau_from_per_position`), averaged over the seeds
    (`variants`: seed -> name -> trained draft)."""
    seeds = list(variants)
    return {name: float(np.mean([tau_from_per_position([variants[s][name].summary[f"alpha_{j}"]
                                                        for j in range(1, k + 1)]) for s in seeds]))
            for name in variants[seeds[0]]}


def tau_rows(stats: dict, predicted: dict, deltas: dict, paper_tau: dict) -> list[dict]:
    """Per variant: tau (95% CI) over the seeds (`seed_taus`), the tau predicted in training, the
    paired difference to SPIRe (mean, CI, per seed, and whether it is resolved over training
    randomness, or with one seed whether it shows for that trained draft) and the paper's tau and
    difference."""
    rows = []
    for name, s in stats.items():
        d = deltas.get(name)
        rows.append({"variant": label(name), "tau": f"{s.mean:.3f} ± {s.ci95:.3f}", "predicted": predicted[name],
                     "delta": f"{d.mean:+.3f} ± {d.ci95:.3f}" if d is not None else "(reference)",
                     "seeds": ", ".join(f"{x:+.3f}" for x in d.per_seed) if d is not None else "",
                     "resolved": _resolved_cell(d) if d is not None else "",
                     "paper": paper_tau.get(name, np.nan),
                     "paper_delta": paper_tau.get(name, np.nan) - paper_tau["spire"]})
    return rows


def _resolved_cell(d) -> str:
    if d.scope == DRAFT:
        return ("one seed: shows for this trained draft, not resolved over training" if d.excludes_zero else
                "one seed: not even for this trained draft")
    return "yes" if d.resolved else "not resolved at this scale"


def importance_rows(ranked: list[dict], component_deltas: dict, paper: dict, paper_order) -> list[dict]:
    """The parts of SPIRe in our order (`ablations.resolved_ranking`): the multiplier lost
    without each, the paired tau difference behind it (a cost-model-only part has none), and
    the paper's rank (`paper_order`) and multiplier lost with its taus (`paper`: part -> TM)."""
    return [{"rank": r["rank"] or _no_rank(r), "ours": r["part"], "drop": r["multiplier_lost"],
             "delta": (f"{component_deltas[r['part']].mean:+.3f} ± {component_deltas[r['part']].ci95:.3f}"
                       if r["part"] in component_deltas else "cost model only"),
             "paper_rank": list(paper_order).index(r["part"]) + 1, "paper_drop": paper.get(r["part"], np.nan)}
            for r in ranked]


def _no_rank(row: dict) -> str:
    if row.get("scope") == DRAFT:
        return "hurts this trained draft" if row.get("effect") == "harmful" else "within the contexts' noise"
    return "harmful at this scale" if row.get("effect") == "harmful" else "not resolved at this scale"


def check_variants(names) -> None:
    """Refuse ablation names that `spire.ABLATIONS` does not know (ValueError naming the choices)."""
    unknown = sorted(set(names) - set(ABLATIONS))
    if unknown:
        raise ValueError(f"unknown ablations {unknown}; choose from {sorted(ABLATIONS)}")


def scale_note(target_scale: str, base, tokens: int, seeds, context_length: int, n_contexts: int, series) -> str:
    """The scale of the ablations in one line: the target's (`display.model_scale`), every
    variant's shape (`base`: the series' SpireConfig) and training tokens per seed, the seeds and
    the tau protocol (method §5: L, contexts, the series' k, G and temperature)."""
    return (f"{target_scale}; every variant {base.num_layers} layers, window {base.window}, {tokens:,} training "
            f"tokens per seed, seeds {seeds}; tau at L = {context_length}, n = {n_contexts} contexts, "
            f"k = {series.k}, G = {series.new_tokens}, T = {series.temperature:g}")


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


#: How `order_sentence` words each effect, per scope (method §10): over training randomness
#: (two seeds or more), or about the one trained draft per variant that one seed gave.
EFFECT_WORDS = {
    TRAINING: {"helps": "resolved as helping at this scale",
               "harmful": "Resolved as harmful here, removing it raises tau",
               "not resolved": "Not resolved at this scale (no rank)"},
    DRAFT: {"helps": "help this trained draft beyond its contexts' noise",
            "harmful": "Hurt this trained draft, removing it raises its tau",
            "not resolved": "Within the contexts' noise for this trained draft (no rank)"},
}


def effect_of(row: dict) -> str:
    """A ranking row's effect ("helps", "harmful", "not resolved"; `resolved_ranking`). Rows recorded
    before "effect" existed help when resolved (the default) with a positive multiplier."""
    return row.get("effect") or ("not resolved" if not row.get("resolved", True) else
                                 "helps" if row["multiplier_lost"] > 0 else "harmful")


def scope_phrase(interval: dict | None) -> str:
    """The words that open `order_sentence`: what its differences are about (`interval_note`); ""
    for results recorded before 05 recorded its interval (those used the earlier interval, whose
    degrees of freedom were wrong: method §10)."""
    if not interval:
        return ""
    if interval["scope"] == DRAFT:
        return "For one trained draft per variant (one seed, the target fixed; not over training randomness): "
    return f"Over training randomness ({interval['seeds']} seeds per variant, the target fixed): "


def order_sentence(ranked: list[dict], interval: dict | None = None, taus: dict | None = None) -> str:
    """What this run says of SPIRe's parts (`resolved_ranking`'s rows) against the paper's order
    (method §3.8), in words, after what it is about (`scope_phrase` of `interval_note`): the parts
    that help, ranked; the parts resolved as harmful, with their tau difference where `taus`
    (part -> {"mean", "ci95"}, `DeltaTau.to_dict`) has it; the parts not resolved (neither gets a
    rank), and whether the ranked parts keep the paper's order. 05's lead and the run index's
    claim (`findings`) both say it in these words."""
    scope = (interval or {}).get("scope", TRAINING)
    words = EFFECT_WORDS[scope]
    helps, harmful, unresolved = (
        [r for r in ranked if effect_of(r) == effect] for effect in ("helps", "harmful", "not resolved"))
    text = (scope_phrase(interval) + f"{len(helps)} of {len(ranked)} parts {'are ' if scope == TRAINING else ''}"
            + words["helps"]
            + (": " + " > ".join(f"{r['part']} ({r['multiplier_lost']:+.2f}x)" for r in helps) if helps else "")
            + (", in the paper's order" if matches_paper_order([(r["part"], 0) for r in helps]) else
               ", not in the paper's order") + ".")
    if harmful:
        text += (f" {words['harmful']}: "
                 + ", ".join(f"{r['part']} ({_tau_text(taus, r['part'])}{r['multiplier_lost']:+.2f}x; the paper "
                             f"ranks it {PAPER_ORDER.index(r['part']) + 1} of {len(PAPER_ORDER)})" for r in harmful)
                 + ".")
    if unresolved:
        text += f" {words['not resolved']}: " + ", ".join(r["part"] for r in unresolved) + "."
    return text


def _tau_text(taus: dict | None, part: str) -> str:
    d = (taus or {}).get(part)
    return f"{d['mean']:+.3f} ± {d['ci95']:.3f} tau, " if d else ""


def interval_sentence(interval: dict | None) -> str:
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
    n, df_contexts = interval["n_contexts"], interval["df_contexts"]
    if interval["scope"] == DRAFT:
        return (f"**One trained draft per variant.** With one training seed, every difference is about the two "
                f"trained drafts that seed gave. Its 95% interval covers only the noise of the {n} contexts "
                f"(Student's t, {df_contexts} degrees of freedom), not training randomness, so nothing here is "
                f"resolved in that sense: that takes two seeds or more (docs/method.md §10). {varies} {fixed}")
    df = interval["df_seeds"]
    seeds_term = (f"{df} degree of freedom: t = 12.7, so only large effects, or seeds that agree closely, are resolved"
                  if df == 1 else f"{df} degrees of freedom")
    return (f"**Over training randomness.** Each variant was trained at {interval['seeds']} seeds. {varies} {fixed} "
            f"Each 95% interval adds two terms in quadrature, each with its own Student's t (docs/method.md §10): "
            f"the seeds' spread ({seeds_term}) and the noise of the {n} contexts that all seeds share "
            f"({df_contexts} degrees of freedom).")


def ablation_results(stats: dict, ranked: list[dict], deltas: dict, component_deltas: dict, seeds, agree: bool,
                     protocol: dict) -> dict:
    """What notebook 05 records: per variant its tau over the seeds (mean, CI, contexts), the
    ranking, the paired differences to SPIRe per variant and per part, what their intervals are
    about (`interval_note`), the seeds, whether the ranking matches the paper's and the protocol
    (`ablation_protocol`)."""
    return {"tau": {name: {"mean": s.mean, "ci95": s.ci95, "n_contexts": s.n_contexts} for name, s in stats.items()},
            "importance": ranked,
            "delta_tau": {name: d.to_dict() for name, d in deltas.items()},
            "component_delta_tau": {part: d.to_dict() for part, d in component_deltas.items()},
            "interval": interval_note(component_deltas or deltas),
            "seeds": seeds, "importance_matches_paper": agree, "ablation_protocol": protocol}


def ablation_protocol(series, context_length: int, n_contexts: int, budget, base, seeds, training_seconds: float,
                      scale: str) -> dict:
    """How the ablations were measured (method §5's tau protocol) and trained, as results.json holds it."""
    return {"context_length": context_length, "n_contexts": n_contexts, "k": series.k,
            "new_tokens": series.new_tokens, "temperature": series.temperature, "seed": series.tau_seed,
            "training": budget.to_dict(), "spire": base.to_dict(), "seeds": seeds,
            "training_seconds": training_seconds, "scale": scale}


# ---------------------------------------------------------------------------- learning curves

def learning_curve(metrics: list[dict], initial: dict | None = None, key: str = "alpha") -> list[tuple[int, float]]:
    """(training tokens, validation `key`) of a training run's metrics log, the step-0 value
    (`pipeline.initial_spire_metrics`) first where given: a learning curve of the training-time
    expected acceptance alpha (method §8) by default."""
    points = [(0, float(initial[key]))] if initial and key in initial else []
    return points + [(int(m["tokens"]), float(m[key])) for m in metrics if m["kind"] == "val" and key in m]


def pays_from(with_it: list[tuple[int, float]], without: list[tuple[int, float]], margin: float = 1e-3) -> int | None:
    """The training tokens from which a part pays on the learning curves (`learning_curve` of the
    variant with the part and of the one without, at the same evaluations): the first evaluation
    from which on `with_it` stays above `without` by more than `margin` (a difference below the
    three decimals the curves are reported with is a tie); None when it is not above at the last."""
    common = sorted(set(dict(with_it)) & set(dict(without)))
    a, b = dict(with_it), dict(without)
    start = None
    for tokens in common:
        if a[tokens] > b[tokens] + margin:
            start = tokens if start is None else start
        else:
            start = None
    return start


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


PATH_CHECK = ("A defect in the target-activation path is ruled out by tests, not assumed: tests/test_spire.py checks "
              "that k-pass training computes what step-by-step inference computes, and that the keys and values the "
              "draft stores for every verified position, round after round in the engine, are those the target layer "
              "it was pruned from stored at that position (no layer or position off by one).")


def lead(ranked: list[dict], tokens: int, main_tokens: int, step0: str = "", curves: str = "",
         interval: dict | None = None, taus: dict | None = None) -> list[str]:
    """05's conclusion in words, before its evidence (Markdown paragraphs): what helps, hurts or is
    not resolved, and about what (`order_sentence` with `interval_note` and the parts' tau
    differences `taus`: the words the run index's claim uses too); what the intervals are about
    (`interval_sentence`); the budget the variants trained at against the main draft's; the
    variants at step 0 (`step0_sentence`) and where each part starts to pay on the learning curves
    (`curve_sentence`); and, when a part that reads the target's activations is resolved as
    harmful, what rules out a defect in that path (`PATH_CHECK`)."""
    budget = (f"The variants trained on {tokens:,} tokens per seed, "
              + ("the main SPIRe draft's budget." if tokens >= main_tokens else
                 f"{tokens / main_tokens:.0%} of the main SPIRe draft's {main_tokens:,}: a difference measured here "
                 "can change sign with more training (the learning curves below show how it moves)."))
    paragraphs = [order_sentence(ranked, interval, taus)]
    paragraphs += [p for p in (interval_sentence(interval), budget, step0, curves) if p]
    if any(r.get("effect") == "harmful" and r["part"] == "target activations" for r in ranked):
        paragraphs.append(PATH_CHECK)
    return paragraphs
