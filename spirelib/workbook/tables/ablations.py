"""Tables of notebook 05, the ablations (method §3.8): every SPIRe variant's measured tau over
the training seeds, its paired difference to SPIRe, the tau its training predicted, and
the parts of SPIRe ranked by the modeled multiplier they are worth (`ablations`)."""

from __future__ import annotations

import numpy as np

from spirelib.engine.drafts import draft_factory
from spirelib.engine.spire import ABLATIONS
from spirelib.engine.tau import AcceptCounts, TauProtocol, delta_tau, measure_tau
from spirelib.modeling import perfmodel
from spirelib.modeling.ablations import PAPER_IMPORTANCE_ORDER as PAPER_ORDER
from spirelib.modeling.ablations import importance, matches_paper_order, variant_multipliers
from spirelib.modeling.acceptance import tau_from_per_position
from spirelib.modeling.methods import label

TAU_COLUMNS = {"variant": "variant", "tau": "tau (all seeds, 95% CI)",
               "predicted": "tau predicted in training (from alpha_j)", "delta": "vs SPIRe (paired, 95% CI)",
               "seeds": "vs SPIRe per seed", "resolved": "difference resolved?", "paper": "tau (paper, L = 512)",
               "paper_delta": "paper vs SPIRe"}
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


def predicted_taus(variants: dict, k: int) -> dict[str, float]:
    """Per variant, the tau its training predicts from the validation alpha_j of each draft
    position j = 1..k (`acceptance.tau_from_per_position`), averaged over the seeds
    (`variants`: seed -> name -> trained draft)."""
    seeds = list(variants)
    return {name: float(np.mean([tau_from_per_position([variants[s][name].summary[f"alpha_{j}"]
                                                        for j in range(1, k + 1)]) for s in seeds]))
            for name in variants[seeds[0]]}


def tau_rows(stats: dict, predicted: dict, deltas: dict, paper_tau: dict) -> list[dict]:
    """Per variant: tau (95% CI) over all seeds, the tau predicted in training, the paired
    difference to SPIRe (mean, CI, per seed, resolved?) and the paper's tau and difference."""
    rows = []
    for name, s in stats.items():
        d = deltas.get(name)
        rows.append({"variant": label(name), "tau": f"{s.mean:.3f} ± {s.ci95:.3f}", "predicted": predicted[name],
                     "delta": f"{d.mean:+.3f} ± {d.ci95:.3f}" if d is not None else "(reference)",
                     "seeds": ", ".join(f"{x:+.3f}" for x in d.per_seed) if d is not None else "",
                     "resolved": ("yes" if d.resolved else "not resolved at this scale") if d is not None else "",
                     "paper": paper_tau.get(name, np.nan),
                     "paper_delta": paper_tau.get(name, np.nan) - paper_tau["spire"]})
    return rows


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


def order_sentence(ranked: list[dict], ours: list[tuple[str, float]]) -> str:
    """What this run says of SPIRe's parts (`resolved_ranking`'s rows) against the paper's order
    (method §3.8), in words: the parts that help, ranked; the parts resolved as harmful; the
    parts not resolved (neither gets a rank), and whether the ranked parts keep the paper's order."""
    helps = [r for r in ranked if r.get("effect", "helps" if r["resolved"] else "") == "helps"]
    harmful = [r for r in ranked if r.get("effect") == "harmful"]
    unresolved = [r for r in ranked if not r["resolved"]]
    text = (f"{len(helps)} of {len(ranked)} parts are resolved as helping at this scale"
            + (": " + " > ".join(f"{r['part']} ({r['multiplier_lost']:+.2f}x)" for r in helps) if helps else "")
            + (", in the paper's order" if matches_paper_order([(r["part"], 0) for r in helps]) else
               ", not in the paper's order") + ".")
    if harmful:
        text += (" Resolved as harmful here, removing it raises tau: "
                 + ", ".join(f"{r['part']} ({r['multiplier_lost']:+.2f}x; the paper ranks it "
                             f"{PAPER_ORDER.index(r['part']) + 1} of {len(PAPER_ORDER)})" for r in harmful) + ".")
    if unresolved:
        text += " Not resolved at this scale (no rank): " + ", ".join(r["part"] for r in unresolved) + "."
    return text


def ablation_results(stats: dict, ranked: list[dict], deltas: dict, component_deltas: dict, seeds, agree: bool,
                     protocol: dict) -> dict:
    """What notebook 05 records: per variant its tau (mean, CI, contexts), the ranking, the paired
    differences to SPIRe per variant and per part, the seeds, whether the ranking matches the
    paper's and the protocol (`ablation_protocol`)."""
    return {"tau": {name: {"mean": s.mean, "ci95": s.ci95, "n_contexts": s.n_contexts} for name, s in stats.items()},
            "importance": ranked,
            "delta_tau": {name: d.to_dict() for name, d in deltas.items()},
            "component_delta_tau": {part: d.to_dict() for part, d in component_deltas.items()},
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


def lead(ranked: list[dict], tokens: int, main_tokens: int, step0: str = "", curves: str = "") -> list[str]:
    """05's conclusion in words, before its evidence (Markdown paragraphs): what helps, hurts or is
    not resolved (`order_sentence`); the budget the variants trained at against the main draft's;
    the variants at step 0 (`step0_sentence`) and where each part starts to pay on the learning
    curves (`curve_sentence`); and, when a part that reads the target's activations is resolved as
    harmful, what rules out a defect in that path (`PATH_CHECK`)."""
    budget = (f"The variants trained on {tokens:,} tokens per seed, "
              + ("the main SPIRe draft's budget." if tokens >= main_tokens else
                 f"{tokens / main_tokens:.0%} of the main SPIRe draft's {main_tokens:,}: a difference measured here "
                 "can change sign with more training (the learning curves below show how it moves)."))
    paragraphs = [order_sentence(ranked, []), budget]
    paragraphs += [p for p in (step0, curves) if p]
    if any(r.get("effect") == "harmful" and r["part"] == "target activations" for r in ranked):
        paragraphs.append(PATH_CHECK)
    return paragraphs
