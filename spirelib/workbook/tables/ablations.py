"""Tables of notebook 05, the ablations (method §3.8): every SPIRe variant's measured tau over
the training seeds, its paired difference to SPIRe, the tau its training predicted, and
the parts of SPIRe ranked by the modeled multiplier they are worth (`ablations`); what the
intervals are about (method §10): over training randomness with the target held fixed (two
seeds or more), or, with one seed, the one trained draft per variant; and which differences are
resolved, family-wise over every comparison the table reports (Holm's step-down, method §10).
Each difference's own 95% interval is shown too, uncorrected and labelled so."""

from __future__ import annotations

import numpy as np

from spirelib.decoding.drafts import draft_factory
from spirelib.measure.tau import AcceptCounts, DeltaTau, TauProtocol, delta_tau, measure_tau, t_quantile, tau_over_seeds
from spirelib.model.spire import ABLATIONS
from spirelib.modeling import perfmodel
from spirelib.modeling.ablations import (
    COMPONENTS,
    DRAFT,
    MEASURED_COMPONENTS,
    TRAINING,
    importance,
    matches_paper_order,
    resolved_ranking,
    variant_multipliers,
)
from spirelib.modeling.ablations import PAPER_IMPORTANCE_ORDER as PAPER_ORDER
from spirelib.modeling.acceptance import tau_from_per_position
from spirelib.modeling.methods import label

TAU_COLUMNS = {"variant": "variant", "tau": "tau (mean over seeds, 95% CI)",
               "predicted": "tau predicted in training (from alpha_j)",
               "delta": "vs SPIRe (paired, 95% CI of this difference alone, uncorrected)",
               "seeds": "vs SPIRe per seed", "resolved": "resolved over training seeds? (family-wise, Holm)",
               "paper": "tau (paper, L = 512)", "paper_delta": "paper vs SPIRe"}
IMPORTANCE_COLUMNS = {"rank": "rank (ours)", "ours": "part",
                      "drop": "throughput multiplier (TM) lost without it (ours)",
                      "delta": "tau with it minus without (paired, 95% CI of this part alone, uncorrected)",
                      "paper_rank": "rank (paper)", "paper_drop": "TM lost without it (paper taus)"}


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


#: The family-wise error rate at which 05 calls differences resolved (method §10): the chance
#: that any comparison of one ablation table with no effect is called resolved.
FAMILY_LEVEL = 0.05


def half_width(seeds_var, contexts_var, seeds: int, n_contexts: int, level: float):
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
    comparisons remain unresolved, each one whose interval at level / r (`half_width`) excludes
    0 is resolved; it stops when none is. Resolving all that pass at once is Holm's order on the
    intervals' p-values: r only shrinks, so the others pass at the next step too."""
    mean = np.abs(np.asarray(mean, dtype=float))
    m = mean.shape[-1]
    widths = np.stack([half_width(seeds_var, contexts_var, seeds, n_contexts, level / r) for r in range(1, m + 1)],
                      axis=-1)  # (..., m, r - 1)
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
    tested = family(component_deltas, deltas)
    if not tested:
        return {}
    ds = list(tested.values())
    shown = dict(zip(tested, holm([d.mean for d in ds], [d.seeds_var for d in ds], [d.contexts_var for d in ds],
                                  ds[0].seeds, ds[0].n_contexts, level).tolist()))
    pair_of = {frozenset(COMPONENTS[part]): part for part in component_deltas}
    return {**shown, **{name: shown[pair_of.get(frozenset((name, "spire")), name)] for name in deltas}}


def interval_note(deltas: dict, comparisons: int) -> dict | None:
    """What the paired intervals of `deltas` (name -> `tau.DeltaTau`, all over the same seeds and
    contexts) are about, as results.json records it: "scope" (TRAINING or DRAFT), the seeds S and
    contexts n, the degrees of freedom of the seeds' and the contexts' terms (method §10), that
    the target is held fixed, and the family its verdicts are controlled over (Holm, at
    `FAMILY_LEVEL`, over `comparisons`: the size of the table's `family`). None without deltas."""
    if not deltas:
        return None
    d = next(iter(deltas.values()))
    df_seeds, df_contexts = d.df
    return {"scope": d.scope, "about": d.about, "seeds": d.seeds, "n_contexts": d.n_contexts, "df_seeds": df_seeds,
            "df_contexts": df_contexts, "target": "fixed",
            "family": {"procedure": "Holm", "level": FAMILY_LEVEL, "comparisons": comparisons}}


def ranking(ours: list[tuple[str, float]], component_deltas: dict, shown: dict[str, bool]) -> list[dict]:
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


def importance_rows(ranked: list[dict], component_deltas: dict, paper: dict, paper_order) -> list[dict]:
    """The parts of SPIRe in our order (`ablations.resolved_ranking`): the multiplier lost
    without each, the paired tau difference behind it (a cost-model-only part has none), and
    the paper's rank (`paper_order`) and multiplier lost with its taus (`paper`: part -> TM)."""
    return [{"rank": r["rank"] or _no_rank(r), "ours": r["part"], "drop": r["multiplier_lost"],
             "delta": (f"{component_deltas[r['part']].mean:+.3f} ± {component_deltas[r['part']].ci95:.3f}"
                       if r["part"] in component_deltas else "modeled, no interval (cost model only)"),
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
    TRAINING: {"helps": "help at this scale (a measured part only when resolved)",
               "harmful": "Resolved as harmful here, removing it raises tau",
               "not resolved": "Not resolved at this scale (no rank)",
               "variant": "Also resolved, a variant against SPIRe"},
    DRAFT: {"helps": "help this trained draft (a measured part only beyond its contexts' noise)",
            "harmful": "Hurt this trained draft, removing it raises its tau",
            "not resolved": "Within the contexts' noise for this trained draft (no rank)",
            "variant": "Also beyond the contexts' noise, a trained variant against SPIRe's"},
}


def effect_of(row: dict) -> str:
    """A ranking row's effect ("helps", "harmful", "not resolved"; `resolved_ranking`). Rows recorded
    before "effect" existed help when resolved (the default) with a positive multiplier."""
    return row.get("effect") or ("not resolved" if not row.get("resolved", True) else
                                 "helps" if row["multiplier_lost"] > 0 else "harmful")


def scope_phrase(interval: dict | None) -> str:
    """The words that open `order_sentence`: what its differences are about (`interval_note`) and,
    where recorded, the family its verdicts are controlled over (method §10); "" for results
    recorded before 05 recorded its interval (those used the earlier interval, whose degrees of
    freedom were wrong: method §10)."""
    if not interval:
        return ""
    fam = interval.get("family")
    controlled = (f"; family-wise over the table's {fam['comparisons']} comparisons, Holm at {fam['level']:.0%}"
                  if fam else "")
    if interval["scope"] == DRAFT:
        return ("For one trained draft per variant (one seed, the target fixed; not over training randomness"
                f"{controlled}): ")
    return f"Over training randomness ({interval['seeds']} seeds per variant, the target fixed{controlled}): "


def order_sentence(ranked: list[dict], interval: dict | None = None, taus: dict | None = None,
                   variants: dict | None = None) -> str:
    """What this run says of SPIRe's parts (`resolved_ranking`'s rows) against the paper's order
    (method §3.8), in words, after what it is about (`scope_phrase` of `interval_note`): the parts
    that help, ranked; the parts resolved as harmful; the parts not resolved (neither gets a rank),
    and whether the ranked parts keep the paper's order; then every other comparison of the table
    resolved in either direction (`variants`: variant -> `delta_record` of its difference to
    SPIRe, those that are no part's). Every measured part carries its tau difference where `taus`
    (part -> `delta_record`) has it, each its own uncorrected 95% interval, said once; a part of
    the cost model alone is labelled "modeled, no interval". 05's lead and the run index's claim
    (`findings`) both say it in these words."""
    scope = (interval or {}).get("scope", TRAINING)
    words = EFFECT_WORDS[scope]
    helps, harmful, unresolved = (
        [r for r in ranked if effect_of(r) == effect] for effect in ("helps", "harmful", "not resolved"))
    text = (scope_phrase(interval) + f"{len(helps)} of {len(ranked)} parts " + words["helps"]
            + (": " + " > ".join(_part_text(r, taus) for r in helps) if helps else "")
            + (", in the paper's order" if matches_paper_order([(r["part"], 0) for r in helps]) else
               ", not in the paper's order") + ".")
    if harmful:
        text += (f" {words['harmful']}: "
                 + ", ".join(_part_text(r, taus, f"; the paper ranks it {PAPER_ORDER.index(r['part']) + 1} of "
                                                 f"{len(PAPER_ORDER)}") for r in harmful) + ".")
    if unresolved:
        text += f" {words['not resolved']}: " + ", ".join(_part_text(r, taus) if taus else r["part"]
                                                          for r in unresolved) + "."
    parts = {frozenset(pair) for pair in COMPONENTS.values()}
    beyond = [(name, d) for name, d in (variants or {}).items()
              if frozenset((name, "spire")) not in parts and d.get("family_excludes_zero")]
    if beyond:
        text += (f" {words['variant']}: " + ", ".join(
            f"{label(name)} {'above' if d['mean'] > 0 else 'below'} SPIRe ({d['mean']:+.3f} ± {d['ci95']:.3f} tau)"
            for name, d in beyond) + ".")
    if taus or beyond:
        text += " Each ± is that difference's own 95% interval, uncorrected."
    return text


def _part_text(row: dict, taus: dict | None, tail: str = "") -> str:
    """A part with its tau difference (where `taus` has it; "modeled, no interval" for a part of
    the cost model alone) and the multiplier it is worth."""
    d = (taus or {}).get(row["part"])
    tau = (f"{d['mean']:+.3f} ± {d['ci95']:.3f} tau, " if d else
           "" if row["part"] in MEASURED_COMPONENTS else "modeled, no interval, ")
    return f"{row['part']} ({tau}{row['multiplier_lost']:+.2f}x{tail})"


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
                f"resolved in that sense: that takes two seeds or more (docs/method.md §10). {varies} {fixed}"
                f"{family_sentence(interval)}")
    df = interval["df_seeds"]
    seeds_term = (f"{df} degree of freedom: t = 12.7, so only large effects, or seeds that agree closely, are resolved"
                  if df == 1 else f"{df} degrees of freedom")
    return (f"**Over training randomness.** Each variant was trained at {interval['seeds']} seeds. {varies} {fixed} "
            f"Each 95% interval adds two terms in quadrature, each with its own Student's t (docs/method.md §10): "
            f"the seeds' spread ({seeds_term}) and the noise of the {n} contexts that all seeds share "
            f"({df_contexts} degrees of freedom).{family_sentence(interval)}")


def family_sentence(interval: dict) -> str:
    """How the verdicts are controlled across the table (method §10), in words, after a space; ""
    for results recorded before 05 recorded its family (`interval_note`)."""
    fam = interval.get("family")
    if not fam:
        return ""
    m, level = fam["comparisons"], fam["level"]
    return (f" The table makes {m} comparisons at once, so a difference counts only family-wise (Holm's step-down): "
            f"the most evident is tested at level {level:g}/{m}, the next at {level:g}/{m - 1}, and so on, stopping at "
            f"the first that fails. The chance that any difference with no effect passes is then at most {level:.0%}; "
            "with each 95% interval alone it is about one run in five. The ± figures are each difference's own 95% "
            "interval, uncorrected: one can exclude 0 while the family's test does not pass it.")


def ablation_results(stats: dict, ranked: list[dict], deltas: dict, component_deltas: dict, shown: dict[str, bool],
                     seeds, agree: bool, protocol: dict) -> dict:
    """What notebook 05 records: per variant its tau over the seeds (mean, CI, contexts), the
    ranking, the paired differences to SPIRe per variant and per part (`delta_record`, with their
    family-wise verdicts `shown`), what their intervals are about (`interval_note`), the seeds,
    whether the ranking matches the paper's and the protocol (`ablation_protocol`)."""
    return {"tau": {name: {"mean": s.mean, "ci95": s.ci95, "n_contexts": s.n_contexts} for name, s in stats.items()},
            "importance": ranked,
            "delta_tau": {name: delta_record(d, shown[name]) for name, d in deltas.items()},
            "component_delta_tau": {part: delta_record(d, shown[part]) for part, d in component_deltas.items()},
            "interval": interval_note(component_deltas or deltas, len(family(component_deltas, deltas))),
            "seeds": seeds, "importance_matches_paper": agree, "ablation_protocol": protocol}


def delta_record(d: DeltaTau, shown: bool) -> dict:
    """A paired difference as results.json holds it (`DeltaTau.to_dict`): "resolved" is the
    family-wise verdict (method §10), "family_excludes_zero" what it shows with one seed too;
    "ci95", "excludes_zero" and "resolved_alone" are this difference's own interval, uncorrected."""
    return {**d.to_dict(), "resolved": shown and d.scope == TRAINING, "family_excludes_zero": shown,
            "resolved_alone": d.resolved}


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
         interval: dict | None = None, taus: dict | None = None, variants: dict | None = None) -> list[str]:
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
    if any(r.get("effect") == "harmful" and r["part"] == "target activations" for r in ranked):
        paragraphs.append(PATH_CHECK)
    return paragraphs
