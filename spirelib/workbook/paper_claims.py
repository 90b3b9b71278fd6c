"""The paper's claims as this run checked them (`claims`): each a `Claim` with its numbers, under a stable key.

ARITHMETIC: the paper's own numbers run through this workbook's model, the same to the paper's two
decimals or explained; REPRODUCED or NOT_REPRODUCED: a claim about drafts, checked at this run's
scale (modeled with this run's tau, or measured). Each check (`CLAIMS`) reads what its notebook
recorded and says nothing where it recorded nothing. The index shows them under its verdict
(`findings`); `spirelib.workbook.claims` keeps them with each run and compares runs by key. Apart
from the verdict's maps, so that what was checked, and how strictly, reads in one place.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import NamedTuple

from spirelib.throughput import perfmodel
from spirelib.throughput.ablations import EFFECTS, PAPER_IMPORTANCE_ORDER, RankedPart
from spirelib.throughput.methods import label
from spirelib.throughput.recorded import (
    RecordedCell,
    explored,
    modeled_headline,
    paper_cost_checks,
    profiled_record,
    tau_lengths,
    tau_records,
    timed_cells,
    timed_trained_length,
    trained_budgets,
)
from spirelib.throughput.recorded_ablations import RecordedAblations, ablation_record
from spirelib.throughput.winners import winner as _winner
from spirelib.units import count
from spirelib.workbook.findings import Text, as_text, link, slower_than_ad
from spirelib.workbook.narrative import ablations as ablation_narrative
from spirelib.workbook.narrative.training import SMALL_BUDGET, percent
from spirelib.workbook.narrative.winners import pow2 as _pow2

ARITHMETIC, REPRODUCED, NOT_REPRODUCED = "arithmetic", "reproduced", "not reproduced"


class Claim(NamedTuple):
    """One of the paper's claims as this run checked it. `kind` ARITHMETIC: the paper's own numbers
    run through this workbook's model (`ok`: the same to the paper's two decimals, or explained);
    REPRODUCED: a claim about drafts, checked at this run's scale (modeled with this run's tau, or
    measured), agrees or not. `text`: the claim with its numbers, "Statement (how): evidence";
    `key`: a name for it that no rewording changes, by which runs' claims are compared
    (`spirelib.workbook.claims`)."""
    kind: str
    ok: bool
    text: Text
    key: str


def _same(ours: float, paper: float) -> bool:
    """Whether `ours` is the paper's number to the two decimals the paper prints."""
    return round(ours, 2) == round(paper, 2)


def _arithmetic_numbers(got: dict, paper: dict, methods: list[str]) -> tuple[bool, str]:
    ok = all(_same(got[m], paper[m]) for m in methods)
    numbers = ", ".join(f"{label(m)} {got[m]:.2f}x (paper {paper[m]:.2f}x"
                        + ("" if _same(got[m], paper[m]) else f"; differs at the second decimal: {got[m]:.4f}") + ")"
                        for m in methods)
    return ok, numbers


def _claim_headline(run: dict, results: dict) -> list[Claim]:
    recorded = modeled_headline(results, "01_performance_model")
    if recorded is None:
        return []
    got, paper = recorded.multipliers, perfmodel.PAPER_MULTIPLIERS["seqax-67m"]
    ok, numbers = _arithmetic_numbers(got, paper, [m for m in perfmodel.MODELED_METHODS if m in got])
    return [Claim(ARITHMETIC, ok, as_text("Multipliers at B = 64, L = 512, the paper's shapes and tau: ",
                                        link(run, "01_performance_model", numbers)), "arithmetic:multipliers")]


def _claim_70b(run: dict, results: dict) -> list[Claim]:
    recorded = modeled_headline(results, "07_llama3_70b_extrapolation")
    if recorded is None:
        return []
    got, paper = recorded.multipliers, perfmodel.PAPER_MULTIPLIERS["llama3-70b"]
    ok, numbers = _arithmetic_numbers(got, paper, [m for m in perfmodel.MODELED_METHODS if m in got and m in paper])
    return [Claim(ARITHMETIC, ok, as_text(f"Llama 3 70B at B = {paper['B']}, L = {_pow2(paper['L'])}: ",
                                        link(run, "07_llama3_70b_extrapolation", numbers)), "arithmetic:llama3-70b")]


def _claim_costs(run: dict, results: dict) -> list[Claim]:
    """Each of the paper's cost numbers: the same from the full multipliers, or the same only
    from the multipliers rounded to two decimals first (the paper's arithmetic, as 08 shows:
    said so), or not the same (called a difference)."""
    out = []
    for quantity, c in paper_cost_checks(results).items():
        full, rounded, paper = c.from_full_tm, c.from_rounded_tm, c.paper
        if _same(full, paper):
            text, ok = f"{full:.2f} (paper {paper:.2f})", True
        elif _same(rounded, paper):
            text, ok = (f"{full:.2f} (paper {paper:.2f}: the paper rounded its multipliers to two decimals first; "
                        f"from the rounded multipliers {rounded:.2f})"), True
        else:
            text, ok = f"{full:.2f} (paper {paper:.2f}; {rounded:.2f} from rounded multipliers): differs", False
        out.append(Claim(ARITHMETIC, ok, as_text(f"Serving savings, {quantity} (target-training units): ",
                                               link(run, "08_cost_analysis", text)), f"arithmetic:savings:{quantity}"))
    return out


def tau_order(results: dict) -> tuple[int, list[str], list[str]] | None:
    taus = tau_records(results)
    if not taus:
        return None
    at = min(tau_lengths(taus), key=lambda L: (abs(L - perfmodel.PAPER_TAU_CONTEXT), L))
    order = sorted((m for m in taus if at in taus[m]), key=lambda m: -taus[m][at].mean)
    paper_at = perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]
    paper_order = sorted((m for m in order if m in paper_at), key=lambda m: -paper_at[m])
    return at, order, paper_order


def budget_clause(results: dict) -> str:
    """The trained drafts' budgets as shares of the paper's 20 x N (notebook 03's "draft_budgets",
    `tables.training.draft_budgets`), for a claim built on their tau, after a semicolon; worded as
    about the budget, not the method, for a draft below `SMALL_BUDGET`; "" when 03 recorded none."""
    budgets = trained_budgets(results)
    if not budgets:
        return ""
    small = [name for name, b in budgets.items() if b.fraction < SMALL_BUDGET]
    return ("; drafts trained on " + " and ".join(f"{percent(b.fraction)} ({name})" for name, b in budgets.items())
            + " of the paper's 20 x N tokens" + (f": about that budget for the {' and the '.join(small)}, not about "
                                                 "the method" if small else ""))


def _claim_tau(run: dict, results: dict) -> list[Claim]:
    found = tau_order(results)
    if not found:
        return []
    at, order, paper_order = found
    taus = tau_records(results)
    paper_at = perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]
    here = ", ".join(f"{label(m)} {taus[m][at].mean:.2f}" for m in order)
    paper = ", ".join(f"{label(m)} {paper_at[m]:.2f}" for m in paper_order)
    ours = [m for m in order if m in paper_at]
    return [Claim(REPRODUCED, ours == paper_order,
                  as_text(f"Order of tau across drafts (measured): here at L = {at} ",
                          link(run, "04_measure_tau", here), f"; paper at L = 512: {paper}{budget_clause(results)}"),
                  "tau-order")]


def _claim_highlight_winner(run: dict, results: dict) -> list[Claim]:
    recorded = explored(results)
    if not recorded.at.get("paper shapes") or not recorded.measured:
        return []
    values = recorded.at["paper shapes"]
    win = _winner(values)
    numbers = ", ".join(f"{label(m)} {v:.2f}x" for m, v in sorted(values.items(), key=lambda kv: -kv[1]))
    return [Claim(REPRODUCED, win == "spire",
                  as_text(f"SPIRe is the best draft at B = {recorded.B}, L = {_pow2(recorded.L)} (modeled with this run's "
                          "tau at the paper's shapes): ", link(run, "06_speedup_explorer", numbers),
                          budget_clause(results)),
                  "spire-best-at-highlight")]


def ablation_effects(ranked: list[RankedPart]) -> tuple[list[RankedPart], list[RankedPart], list[RankedPart]]:
    """05's ranking split by what this run resolves (`RankedPart.effect`): (parts that help,
    ranked; parts resolved as harmful; parts not resolved)."""
    return tuple([r for r in ranked if r.effect == effect] for effect in EFFECTS)


def tau_effect(recorded: RecordedAblations, part: str) -> str:
    d = recorded.component_delta_tau.get(part)
    return f"{d.text()} tau" if d else "modeled, no interval (cost model only)"


def ablation_source(run: dict, results: dict) -> str:
    """Which run 05's figures come from, in words: the params file that ran 05 (an output folder
    updated with `--only` keeps each notebook's own), when it started, its seeds and training
    tokens per variant; "" when run.json does not say."""
    entry = run.get("notebooks", {}).get("05_ablations", {})
    params_file = entry.get("params_file") or run.get("params_file")
    if not params_file:
        return ""
    protocol = ablation_record(results).ablation_protocol
    seeds, tokens = protocol.seeds, protocol.training_tokens
    budget = ""
    if seeds and tokens:
        budget = f", {len(seeds)} seed{'s' if len(seeds) > 1 else ''} x {count(tokens)} training tokens per variant"
    started = entry.get("started", "")[:10]
    return f"(05 run with {params_file}{f' on {started}' if started else ''}{budget})"


def _claim_ablations(run: dict, results: dict) -> list[Claim]:
    """05's importance of SPIRe's parts in 05's own words (`narrative.ablations.order_sentence`, as
    its lead says it): over training randomness with the target fixed, or, with one seed, about
    one trained draft per variant, which cannot reproduce a claim about training this way; what is
    resolved is resolved family-wise (method §10), in either direction, a variant against SPIRe
    included."""
    recorded = ablation_record(results)
    ranked = recorded.importance
    if not ranked:
        return []
    helps, harmful, unresolved = ablation_effects(ranked)
    text = ("Importance of SPIRe's parts (measured tau, modeled at B = 64, L = 512): "
            + ablation_narrative.order_sentence(ranked, recorded.interval, recorded.component_delta_tau,
                                             recorded.delta_tau))
    ours = [r.part for r in helps]
    ok = (not harmful and not unresolved and ours == [p for p in PAPER_IMPORTANCE_ORDER if p in ours]
          and not recorded.one_seed)
    source = ablation_source(run, results)
    paper = " Paper: " + " > ".join(PAPER_IMPORTANCE_ORDER) + (f" {source}" if source else "")
    return [Claim(REPRODUCED, ok, as_text(link(run, "05_ablations", text), paper), "importance-order")]


def past_note(results: dict, cell: RecordedCell) -> str:
    """What a measured cell of 09 carries next to its figure when its contexts ran past the target's
    training windows (`measure.cells.mark_past_training`), the length 09 recorded (`timed_trained_length`)."""
    if not cell.past_training:
        return ""
    trained = timed_trained_length(results)
    return ("; past the " + (f"{trained:,}-token " if trained else "") + "windows the target was trained on, so "
            "about a target used beyond what it learned")


def _claim_measured(run: dict, results: dict) -> list[Claim]:
    cells = timed_cells(results)
    if not cells:
        return []
    slower, total = slower_than_ad(results)
    best = max(cells, key=lambda c: c.measured_speedup)
    errors = [abs(c.error) for c in cells]
    profiled = [abs(c.profiled_error) for c in cells if c.profiled_error is not None]
    claims = [
        Claim(REPRODUCED, slower == 0, as_text(
            "Speculative decoding is faster than AD on the clock (measured): ",
            link(run, "09_measured_vs_modeled", f"faster in {total - slower} of {total} measured cells"),
            f" ({sum(c.ci_low is not None and c.ci_low > 1.0 for c in cells)} resolved: 95% CI above 1)"
            f" (best {best.measured_speedup:.2f}x, {label(best.method)} at B = {best.B}, "
            f"L = {best.L}{past_note(results, best)})"), "sd-faster-measured"),
        Claim(REPRODUCED, statistics.median(errors) <= 0.25, as_text(
            "The paper's throughput model predicts measured speedups: ",
            link(run, "09_measured_vs_modeled",
                  f"median error {statistics.median(errors):.0%} over all {total} cells"),
            f", at most {max(errors):.0%}"), "paper-model-predicts"),
    ]
    if profiled:
        model = profiled_record(results)
        held = model.held_out_max_error if model else None
        bias = model.mean_signed_error if model and model.mean_signed_error is not None else 0.0
        ok = statistics.median(profiled) <= 0.10 and abs(bias) <= 0.05 and (held is None or held <= 0.15)
        claims.append(Claim(REPRODUCED, ok, as_text(
            "The profiled cost model of this machine predicts them (not a claim of the paper's): ",
            link(run, "09_measured_vs_modeled",
                  f"median error {statistics.median(profiled):.0%} over all {len(profiled)} cells"),
            f", mean signed error {bias:+.0%}"
            + (f", at most {held:.0%} on the cells it was not fitted to" if held is not None else "")
            + " (fitted to these runs' rounds at the other cells; the goals it is held to: a median error "
              "of at most 10%, a mean signed error within +/-5% and at most 15% on the cells it was not "
              "fitted to)"), "profiled-model-predicts"))
    return claims


CLAIMS: list[Callable[[dict, dict], list[Claim]]] = [_claim_headline, _claim_70b, _claim_costs, _claim_tau,
                                                     _claim_highlight_winner, _claim_ablations, _claim_measured]


def claims(run: dict, results: dict) -> dict[str, list[Claim]]:
    """The paper's claims this run checked, in three lists: ARITHMETIC (the paper's own numbers
    run through this model; `Claim.ok`: agrees), REPRODUCED and NOT_REPRODUCED at this scale
    (modeled with this run's tau, or measured)."""
    out: dict[str, list[Claim]] = {ARITHMETIC: [], REPRODUCED: [], NOT_REPRODUCED: []}
    for check in CLAIMS:
        for c in check(run, results):
            out[c.kind if c.kind == ARITHMETIC else REPRODUCED if c.ok else NOT_REPRODUCED].append(c)
    return out
