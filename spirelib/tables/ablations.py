"""Tables of notebook 05, the ablations (spec 3.8): every SPIRe variant's measured tau over
the training seeds, its paired difference to SPIRe, the tau its training predicted, and
the parts of SPIRe ranked by the modeled multiplier they are worth (`ablations`)."""

from __future__ import annotations

import numpy as np

from spirelib.acceptance import tau_from_per_position
from spirelib.drafts import draft_factory
from spirelib.methods import label
from spirelib.tau import AcceptCounts, TauProtocol, delta_tau, measure_tau

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
    """seed -> variant -> AcceptCounts at `context_length` (spec 5's protocol): every variant
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
    return [{"rank": r["rank"] or "not resolved at this scale", "ours": r["part"], "drop": r["multiplier_lost"],
             "delta": (f"{component_deltas[r['part']].mean:+.3f} ± {component_deltas[r['part']].ci95:.3f}"
                       if r["part"] in component_deltas else "cost model only"),
             "paper_rank": list(paper_order).index(r["part"]) + 1, "paper_drop": paper.get(r["part"], np.nan)}
            for r in ranked]
