"""The numbers behind the index's verdict (`DETAILS`), as data its `templates/details/` templates render.

Notebook 01's modeled multipliers against the paper's (`headline`), 04's tau against the paper's
Table 1 (`table1`), 05's parts of SPIRe against the paper's ranking (`ablation_ranking`) and 09's
speedups on the clock against the model (`measured_vs_modeled`); each None where its notebook
recorded nothing. Sentences are `findings.Text`; what a claim says as well (the order of tau, an
ablation's effect, a cell past the training windows) comes from `paper_claims`, so both say it alike.
"""

from __future__ import annotations

import statistics

from spirelib.throughput import perfmodel
from spirelib.throughput.ablations import PAPER_IMPORTANCE_ORDER, RankedPart
from spirelib.throughput.methods import label
from spirelib.throughput.recorded import (
    modeled_headline,
    tau_lengths,
    tau_protocol,
    tau_records,
    timed_cells,
    timed_machine,
    trained_budgets,
)
from spirelib.throughput.recorded_ablations import ablation_record
from spirelib.workbook.findings import Text, as_text, link, slower_than_ad, times
from spirelib.workbook.narrative import ablations as ablation_narrative
from spirelib.workbook.narrative.training import budget_sentence
from spirelib.workbook.paper_claims import ablation_effects, ablation_source, past_note, tau_effect, tau_order


def headline(run: dict, results: dict) -> dict | None:
    """Notebook 01's modeled multipliers at (64, 512) against the paper's: a row per method (its
    name, this run's multiplier linking 01, the paper's, whether they are the same to rounding)."""
    recorded = modeled_headline(results, "01_performance_model")
    if recorded is None:
        return None
    got, paper = recorded.multipliers, perfmodel.PAPER_MULTIPLIERS["seqax-67m"]
    return dict(rows=[[label(m), as_text(link(run, "01_performance_model", f"{got[m]:.2f}x")), f"{paper[m]:.2f}x",
                       "yes" if round(got[m], 2) == paper[m] else "no"]
                      for m in perfmodel.MODELED_METHODS if m in got])


def table1(run: dict, results: dict) -> dict | None:
    """Notebook 04's tau per method and L (95% CI) next to the paper's Table 1: the table, the
    order of the drafts at the L nearest 512 against the paper's, 03's budgets and 04's scale."""
    taus = tau_records(results)
    if not taus:
        return None
    lengths = tau_lengths(taus)[::-1]
    methods = [(m, label(m)) for m in perfmodel.MODELED_METHODS if m in taus]
    methods += [(m, label(m)) for m in taus if m not in perfmodel.MODELED_METHODS]
    protocol = tau_protocol(results)
    trained_on, G = protocol.trained_on, protocol.new_tokens or 0
    rows = []
    for L in lengths:
        past = trained_on and L + G > trained_on  # said next to the figure (04 puts the target's loss beside it)
        row: list[Text | str] = [f"{L} (past the {trained_on:,}-token training windows)" if past else str(L)]
        for m, _ in methods:
            cell = taus[m].get(L)
            row.append(as_text(link(run, "04_measure_tau", f"{cell.mean:.3f} ± {cell.ci95:.3f}"))
                       if cell else "-")
        paper = perfmodel.PAPER_TAU.get(L)
        row += [f"{paper[m]:.3f}" if paper and m in paper else "-" for m, _ in methods]
        rows.append(row)
    header = (["L"] + [f"{name} (this run)" for _, name in methods]
              + [f"{name} (paper)" for _, name in methods])
    at, order, paper_order = tau_order(results)
    paper_order_all = [m for m in order if m in perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]]
    budgets = trained_budgets(results)
    return dict(header=header, rows=rows, at=at, order=" > ".join(label(m) for m in order),
                paper_order=" > ".join(label(m) for m in paper_order), same=paper_order_all == paper_order,
                budgets=budget_sentence(budgets) if budgets else "",
                scale=protocol.scale)


def ablation_ranking(run: dict, results: dict) -> dict | None:
    """Notebook 05's parts of SPIRe: the ones resolved as helping, ranked, next to the paper's
    rank; the ones resolved as harmful and the unresolved ones without a rank; with one seed
    (`draft`), the same about one trained draft per variant (`narrative.ablations.EFFECT_WORDS`).
    Also what the interval is over (`about`), which run 05's figures come from and 05's scale."""
    recorded = ablation_record(results)
    if not recorded.importance:
        return None
    draft = recorded.one_seed
    helps, harmful, unresolved = ablation_effects(recorded.importance)

    def row(effect: str, r: RankedPart) -> list[Text | str]:
        return [effect, as_text(link(run, "05_ablations", f"{r.part} ({r.multiplier_lost:+.2f}x)")),
                tau_effect(recorded, r.part), str(PAPER_IMPORTANCE_ORDER.index(r.part) + 1)]

    labels = (("hurts this trained draft", "within the contexts' noise") if draft else
              ("harmful here", "not resolved"))
    rows = [row(str(i + 1), r) for i, r in enumerate(helps)]
    rows += [row(effect, r) for effect, group in zip(labels, (harmful, unresolved)) for r in group]
    return dict(draft=draft, about=ablation_narrative.scope_phrase(recorded.interval).rstrip(": "),
                source=ablation_source(run, results), rows=rows, scale=recorded.ablation_protocol.scale)


def measured_vs_modeled(run: dict, results: dict) -> dict | None:
    """Notebook 09's speedups on the clock against the throughput model: one sentence linking 09,
    and 09's scale."""
    cells = timed_cells(results)
    if not cells:
        return None
    errors = [abs(c.error) for c in cells]
    worst = max(cells, key=lambda c: abs(c.error))
    best = max(cells, key=lambda c: c.measured_speedup)
    slower, total = slower_than_ad(results)
    machine = timed_machine(results)
    text = (f"SD was slower than AD in {slower} of {total} measured cells. "
            f"Over all {total} cells the paper's model is off by {statistics.median(errors):.0%} (median) and at most "
            f"{max(errors):.0%} ({label(worst.method)} at B = {worst.B}, L = {worst.L}: modeled "
            f"{worst.modeled_speedup:.2f}x, measured {worst.measured_speedup:.2f}x). The fastest measured "
            f"speedup is {best.measured_speedup:.2f}x ({label(best.method)}, B = {best.B}, "
            f"L = {best.L}{past_note(results, best)}). "
            f"Calibrated HOI {machine.hoi if machine.hoi is not None else float('nan'):.1f} FLOP/byte")
    if machine.ad_step_overhead:
        text += f"; an AD step takes {times(machine.ad_step_overhead)} its modeled time"
    return dict(text=as_text(link(run, "09_measured_vs_modeled", text)), scale=machine.scale)


#: The details behind the verdict, in the index's order; each renders with the template of its name.
DETAILS = [headline, table1, ablation_ranking, measured_vs_modeled]
