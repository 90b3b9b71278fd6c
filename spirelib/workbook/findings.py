"""The run index's lead: which draft wins where, at what scale, and what this run checked of the paper.

Built from the results the notebooks recorded (results.json) and the paper's numbers
(`perfmodel`, `ablations`; docs/method.md §2) as data, not HTML: sentences are `Text`, runs of
plain text (`Part`) that link the report of the notebook that made a number; `report` renders them
with its templates, `plain` gives the terminal and the claims' record the same words. Sections
whose notebook did not run (or recorded nothing) are left out, so a partial run (`--only`) still
gets an honest index.

The first screen (`verdict`) is one line of scale (target, training tokens, perplexity, corpus,
machine) and the winner over (B, L) as a small map per way of answering, each with a sentence
saying where the winner flips (`narrative.winners.where_sentence`): the paper's shapes and tau
(01), this run's tau at the paper's and at the trained shapes (06), this machine measured at the
cells 09 timed and its profiled model (09). `claims` then separates the paper's arithmetic (its
own numbers run through this model) from what this run reproduced, or did not, at its own scale.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from spirelib.measure.ablations import effect_of
from spirelib.modeling import perfmodel
from spirelib.modeling.ablations import PAPER_IMPORTANCE_ORDER
from spirelib.modeling.methods import color, label
from spirelib.modeling.winners import AD, by_cell, unresolved_cells
from spirelib.modeling.winners import grid_counts as _grid_counts
from spirelib.modeling.winners import winner as _winner
from spirelib.workbook.narrative import ablations as ablation_narrative
from spirelib.workbook.narrative.training import SMALL_BUDGET, budget_sentence, percent
from spirelib.workbook.narrative.winners import pow2 as _pow2
from spirelib.workbook.narrative.winners import span as _span
from spirelib.workbook.narrative.winners import where_sentence

# The grid "over the grid" refers to when a notebook recorded none (06's grid).
GRID_B = [int(b) for b in 2 ** np.arange(0, 8)]  # 1 .. 128
GRID_L = [int(L) for L in 2 ** np.arange(5, 14)]  # 32 .. 8K


@dataclasses.dataclass(frozen=True)
class Part:
    """A run of a sentence: its words, the page it links (the report of the notebook that made its
    number) or how the index marks it ("strong", or "aside": smaller, grey); the terminal and the
    claims' record read the words alone (`plain`)."""

    text: str
    href: str | None = None
    mark: str | None = None


Text = tuple[Part, ...]  # a sentence, or a table's cell, as the index shows it


def plain(text: Text) -> str:
    """A `Text` as plain words: the terminal's verdict, the claims' statements and evidence."""
    return "".join(part.text for part in text).strip()


def _text(*parts: str | Part) -> Text:
    """A `Text` of `parts`, each a Part or plain words (empty ones left out)."""
    return tuple(p if isinstance(p, Part) else Part(p) for p in parts if p)


def _link(run: dict, stem: str, text: str) -> Part:
    """`text` linking the report of notebook `stem`, plain where the run has no report of it."""
    page = run.get("notebooks", {}).get(stem, {}).get("html")
    return Part(text, href=page or None)


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def times(value: float) -> str:
    """A ratio of times (an AD step's measured over its modeled time), one format everywhere."""
    return f"{value:,.1f}x"


def scale_facts(run: dict, results: dict) -> dict:
    """What the index's scale line says, from what the notebooks recorded: the target's shape and
    body parameters, its training tokens, validation perplexity, the corpus and the machine."""
    target = results.get("02_train_target", {}).get("target") or {}
    protocol = results.get("04_measure_tau", {}).get("tau_protocol", {})
    machine = results.get("09_measured_vs_modeled", {}).get("machine", {})
    series = (run.get("params") or {}).get("series") or {}
    shape = protocol.get("target") or series.get("target") or {}
    facts = {"layers": shape.get("num_layers"), "d_model": shape.get("d_model"),
             "body_params": target.get("body_params"), "tokens": target.get("tokens") or protocol.get("target_tokens"),
             "perplexity": float(np.exp(target["val_loss"])) if target.get("val_loss") is not None else None,
             "corpus": series.get("corpus") or None, "device": machine.get("device"),
             "trained_on": target.get("device"), "threads": machine.get("threads")}
    return {k: v for k, v in facts.items() if v is not None}


def scale_line(run: dict, results: dict) -> str | None:
    """One line: the scale every answer below was made at (None when nothing of it was recorded)."""
    f = scale_facts(run, results)
    parts = []
    if "layers" in f:
        parts.append(f"target {f['layers']} layers x d_model {f['d_model']}"
                     + (f" ({_count(f['body_params'])} body parameters; the paper's: "
                        f"{_count(perfmodel.body_params('seqax-67m'))})" if "body_params" in f else ""))
    if "tokens" in f:
        parts.append(f"trained on {_count(f['tokens'])} tokens" + (f" of {f['corpus']}" if "corpus" in f else ""))
    elif "corpus" in f:
        parts.append(f"corpus {f['corpus']}")
    if "perplexity" in f:
        parts.append(f"validation perplexity {f['perplexity']:.1f}")
    if "device" in f:
        threads = f.get("threads")
        plural = "s" if threads != 1 else ""
        parts.append(f"timed on {f['device']}" + (f", {threads} thread{plural}" if threads else ""))
    elif "trained_on" in f:
        parts.append(f"run on {f['trained_on']}")
    return "; ".join(parts) if parts else None


def map_cells(winners: list[list[str]], B: list[int], L: list[int], values=None,
              differs: set[tuple[int, int]] = frozenset(), unresolved: set[tuple[int, int]] = frozenset()) -> dict:
    """A small heat map of the winner per cell: the L of its columns, and its rows with B down
    (largest on top), each cell with the winner's colour and initial, its multiplier in the tooltip;
    cells in `differs` outlined; cells in `unresolved` (a measured winner whose 95% CI overlaps
    another's or AD's) faded, with "?" after the initial and the reason in the tooltip."""
    rows = []
    for i in reversed(range(len(B))):
        cells = []
        for j in range(len(L)):
            w = winners[i][j]
            tip = f"B = {B[i]}, L = {L[j]}: {label(w) if w != '-' else 'not measured'}"
            if values and values[i][j] is not None:
                tip += f" ({'best draft ' if w == AD else ''}{values[i][j]:.2f}x)"
            initial, faded = _initial(w), (i, j) in unresolved
            if faded:
                tip += "; not resolved: its 95% CI overlaps another method's or AD's"
                initial += "?"
            cells.append(dict(initial=initial, color=color(w) if w != "-" else "#fff", tip=tip,
                              differs=(i, j) in differs, faded=faded))
        rows.append(dict(B=_pow2(B[i]), cells=cells))
    return dict(L=[_pow2(l) for l in L], rows=rows)


def _initial(method: str) -> str:
    """A method's letters in a winner map (an unknown one: its label's first two letters)."""
    return {"spire": "S", "magicdec": "M", "vanilla": "V", "guided": "G", "lookup": "P", "one_pass": "1", AD: "AD",
            "-": ""}.get(method, label(method)[:2])


# ---------------------------------------------------------------------------- the verdict

def _cell_text(values: dict[str, float]) -> Text:
    win = _winner(values)
    others = ", ".join(f"{label(m)} {v:.2f}x" for m, v in sorted(values.items(), key=lambda kv: -kv[1]) if m != win)
    return _text(Part(label(win), mark="strong"), f" {values[win]:.2f}x" if win != AD else "",
                 *((" ", Part(f"({others})", mark="aside")) if others else ()))


def _grid_text(winners: list[list[str]], B: list[int], L: list[int],
               unresolved: set[tuple[int, int]] = frozenset()) -> Text:
    """The cells each method wins, counting only resolved wins where `unresolved` names the others."""
    total = sum(w != "-" for row in winners for w in row)
    counts = _grid_counts([["-" if (i, j) in unresolved else w for j, w in enumerate(row)]
                           for i, row in enumerate(winners)])
    parts = [part for i, (m, n) in enumerate(counts.items())
             for part in ((Part(label(m), mark="strong"), f" {n}") if i == 0 else (f", {label(m)} {n}",))]
    open_cells = f", {len(unresolved)} with no winner resolved" if unresolved else ""
    return _text(*(parts or ["none"]), f" of {total} cells{open_cells} ",
                 Part(f"(B = {_span(B)}, L = {_span(L)})", mark="aside"))


def _modeled_winners(taus: dict[str, float], *, k: int = 4, hoi: float = perfmodel.PAPER_HOI,
                     B: list[int] = GRID_B, L: list[int] = GRID_L) -> list[list[str]]:
    """Per (B, L) cell of the grid, the winner at the paper's shapes (the settings of 01 and 06)."""
    drafts = perfmodel.PAPER_DRAFTS["seqax-67m"]
    b, l = np.asarray(B)[:, None], np.asarray(L)[None, :]
    grids = {m: np.broadcast_to(perfmodel.throughput_multiplier(m, t, b, l, "seqax-67m", drafts.get(m), k=k, hoi=hoi,
                                                                 window_factor=8), (len(B), len(L)))
             for m, t in taus.items()}
    return [[_winner({m: float(g[i, j]) for m, g in grids.items()}) for j in range(len(L))] for i in range(len(B))]


def _notebook_param(run: dict, stem: str, name: str, default):
    return run.get("notebooks", {}).get(stem, {}).get("parameters", {}).get(name, default)


def _cells(results: dict, key: str) -> dict[tuple[int, int], dict[str, float]]:
    """09's speedups `key` ("measured_speedup", "profiled_speedup") per (B, L), per method."""
    return by_cell(results.get("09_measured_vs_modeled", {}).get("cells") or [], key)


def _grid(cells: dict, Bs: list[int], Ls: list[int]) -> tuple[list[list[str]], list[list[float | None]]]:
    """(the winner, the best speedup) of every (B, L) of `_cells`, "-" and None where none was timed."""
    return ([[_winner(cells[b, l]) if (b, l) in cells else "-" for l in Ls] for b in Bs],
            [[max(cells[b, l].values()) if (b, l) in cells else None for l in Ls] for b in Bs])


def slower_than_ad(results: dict) -> tuple[int, int]:
    """(cells where speculative decoding measured slower than AD, cells measured), over 09's methods x (B, L)."""
    cells = results.get("09_measured_vs_modeled", {}).get("cells") or []
    return sum(c["measured_speedup"] < 1.0 for c in cells), len(cells)


def verdict_rows(run: dict, results: dict) -> list[dict]:
    """One row per way of answering "which draft wins": its name, the answer at (B, L), over
    the grid, and what to trust it for. Ways whose notebook recorded nothing are left out."""
    rows = []
    r01, r06, r09 = (results.get(s, {}) for s in ("01_performance_model", "06_speedup_explorer",
                                                 "09_measured_vs_modeled"))
    if r01.get("headline"):
        cell = r01.get("headline_cell", {"B": 64, "L": 512})
        paper_taus = perfmodel.PAPER_TAU[int(cell.get("tau_context", perfmodel.PAPER_TAU_CONTEXT))]
        rows.append(dict(
            key="paper", way="paper's shapes, paper's tau (modeled)", short="with the paper's shapes and tau",
            title="the paper's shapes and tau (HOI 600)",
            stem="01_performance_model", B=cell["B"], L=cell["L"],
            at=r01["headline"],
            grid=(_modeled_winners(paper_taus, hoi=float(cell.get("hoi", perfmodel.PAPER_HOI))), GRID_B, GRID_L),
            trust="checking that this workbook's model is the paper's (it redoes the paper's arithmetic on the "
                  "paper's numbers); not about the drafts trained here."))
    at_06 = r06.get("multipliers_at_highlight") or {}
    grids_06 = r06.get("winner_grid") or {}
    used = r06.get("taus_used") or {}
    source = "this run's tau" if used.get("source") == "measured" else "the paper's tau (no tau measured)"
    hoi_06 = float(_notebook_param(run, "06_speedup_explorer", "hoi", perfmodel.PAPER_HOI))
    if at_06.get("paper shapes"):
        recorded = grids_06.get("paper shapes")
        if recorded:
            grid = (recorded["winners"], recorded["B"], recorded["L"])
        elif used.get("taus"):
            k = int(results.get("04_measure_tau", {}).get("tau_protocol", {}).get("k", 4))
            grid = (_modeled_winners(used["taus"], k=k, hoi=hoi_06), GRID_B, GRID_L)
        else:
            grid = None
        at_l = f" at L = {used['context_length']}" if used.get("context_length") else ""
        rows.append(dict(
            key="paper-shapes", way=f"paper's shapes, {source} (modeled)", short=f"at the paper's shapes with {source}",
            title=f"the paper's shapes, {source} (HOI {hoi_06:g})",
            stem="06_speedup_explorer", B=at_06["B"], L=at_06["L"],
            at=at_06["paper shapes"], grid=grid,
            trust=f"how the drafts trained here would rank at the paper's scale, if their tau (measured{at_l} on "
                  "small models) carried over; the tau is the weak link."))
    if at_06.get("trained shapes"):
        recorded = grids_06.get("trained shapes")
        rows.append(dict(
            key="trained-shapes", way=f"trained shapes, {source} (modeled)", short="at the trained shapes (modeled)",
            title=f"this run's shapes, {source} (HOI {hoi_06:g})",
            stem="06_speedup_explorer", B=at_06["B"], L=at_06["L"],
            at=at_06["trained shapes"], grid=(recorded["winners"], recorded["B"], recorded["L"]) if recorded else None,
            trust="the model's prediction for the models trained here on the paper's hardware (HOI 600); "
                  "not a measurement."))
    measured = _cells(results, "measured_speedup")
    if measured:
        want = (int(rows[0]["B"]), int(rows[0]["L"])) if rows else min(measured)
        near = min(measured, key=lambda bl: (abs(np.log2(bl[0] / want[0])) + abs(np.log2(bl[1] / want[1])), bl))
        slower, total = slower_than_ad(results)
        machine = r09.get("machine", {})
        overhead = machine.get("ad_step_overhead")
        Bs, Ls = sorted({b for b, _ in measured}), sorted({l for _, l in measured})
        winners, values = _grid(measured, Bs, Ls)
        predicted = _cells(results, "profiled_speedup")
        row = dict(
            key="measured", way=f"this machine ({machine.get('device', '?')}), trained models (measured)",
            short=f"on this machine (measured at B = {near[0]}, L = {near[1]})",
            title="this machine, measured", stem="09_measured_vs_modeled", B=near[0], L=near[1], at=measured[near],
            grid=(winners, Bs, Ls), values=values,
            unresolved=unresolved_cells(results["09_measured_vs_modeled"]["cells"], Bs, Ls),
            note=(f"not measured at B = {want[0]}, L = {want[1]}; this is the nearest measured cell"
                  if near != want else ""),
            trust=(f"the truth for this machine at this scale only: SD was slower than AD in {slower} of {total} "
                   "measured (method, B, L) cells" + (f"; an AD step takes {times(overhead)} its modeled time: fixed "
                                                      "per-pass costs, not the paper's memory-bound regime, decide "
                                                      "here" if overhead else "") + "."))
        if predicted:
            row["profiled"] = _grid(predicted, Bs, Ls)
        rows.append(row)
    return rows


def decision_maps(run: dict, results: dict, rows: list[dict] | None = None) -> list[dict]:
    """One map per way of answering "which draft, where" that has a grid: its title, the notebook
    that made it, (winners, B, L), the winner's multiplier per cell where known, the cells where
    the profiled model and the clock disagree, and `where_sentence`. The measured grid is at the
    cells 09 timed, named at their real (B, L); the profiled model's follows it."""
    maps = []
    for r in rows if rows is not None else verdict_rows(run, results):
        if not r.get("grid"):
            continue
        winners, B, L = r["grid"]
        unresolved = r.get("unresolved", set())
        differs = set()
        if r.get("profiled"):  # a measured winner that is not resolved cannot be picked wrongly
            differs = {(i, j) for i in range(len(B)) for j in range(len(L))
                       if winners[i][j] != "-" and (i, j) not in unresolved and r["profiled"][0][i][j] != winners[i][j]}
        maps.append(dict(key=r["key"], title=r.get("title", r["way"]), stem=r["stem"], grid=(winners, B, L),
                         values=r.get("values"),
                         differs=differs, unresolved=unresolved, where=where_sentence(winners, B, L, unresolved)))
        if r.get("profiled"):
            p_winners, p_values = r["profiled"]
            wrong = ", ".join(f"B = {B[i]}, L = {L[j]} ({label(p_winners[i][j])}, not {label(winners[i][j])})"
                              for i, j in sorted(differs))
            maps.append(dict(key="profiled", title="this machine, profiled model", stem=r["stem"], grid=(p_winners, B, L),
                             values=p_values, differs=differs, unresolved=set(),
                             where=where_sentence(p_winners, B, L) + (
                                 f" It picks the wrong winner at {wrong}." if wrong else
                                 " It picks the measured winner in every cell where one is resolved." if unresolved
                                 else " It picks the measured winner in every cell.")))
    return maps


def _legend(maps: list[dict]) -> dict:
    """The maps' key: each winner shown (its initial, colour and name), whether any cell is
    outlined (the profiled model disagrees) or faded (not resolved)."""
    seen: list[str] = []
    for m in maps:
        for row in m["grid"][0]:
            for w in row:
                if w != "-" and w not in seen:
                    seen.append(w)
    return dict(winners=[dict(initial=_initial(w), color=color(w), label=label(w)) for w in seen],
                outlined=any(m["differs"] for m in maps), faded=any(m["unresolved"] for m in maps))


#: The index's abbreviations, spelled out once under its first screen's verdict.
ABBREVIATIONS = ("AD: autoregressive decoding, the target alone, one token per forward pass (a speedup of 1). SD: "
                 "speculative decoding. tau: tokens per round of speculative decoding (the drafts accepted, plus one). "
                 "TM: throughput multiplier, tokens/s over AD's as the paper's performance model gives them. HOI: "
                 "hardware operational intensity, a machine's peak FLOP/s over its memory bandwidth (FLOP/byte; the "
                 "paper's GPUs: 600). B: batch size, the rows decoded together; L: context length in tokens. 20 x N: "
                 "the paper's training budget, 20 tokens per parameter.")


def verdict(run: dict, results: dict) -> dict | None:
    """The index's first screen: the scale in one line (`scale_line`), the winner over (B, L) as a
    small map (`map_cells`) for every way of answering (the paper's shapes and tau; this run's tau
    at the paper's shapes and at the shapes trained here, HOI 600; this machine, measured and
    profiled), each titled with a link to its notebook and with a sentence on where the winner
    flips, the maps' key, the verdict's sentence (`verdict_lead`) and the abbreviations."""
    rows = verdict_rows(run, results)
    if not rows:
        return None
    maps = decision_maps(run, results, rows)
    return dict(scale=scale_line(run, results),
                maps=[dict(title=_text(_link(run, m["stem"], m["title"])), where=m["where"],
                           **map_cells(*m["grid"], values=m["values"], differs=m["differs"],
                                       unresolved=m["unresolved"]))
                      for m in maps],
                legend=_legend(maps), lead=verdict_lead(results, rows), abbreviations=ABBREVIATIONS)


def verdict_lead(results: dict, rows: list[dict]) -> Text:
    """The verdict's one sentence over `verdict_rows`: who wins at the highlighted cell by every
    modeled way of answering, and in how many measured cells SD was slower than AD. The index
    shows it under its maps; `spire run` ends with its words (`plain`)."""
    modeled = [r for r in rows if r["stem"] != "09_measured_vs_modeled"]
    lead: list[str | Part] = []
    if modeled:
        first = modeled[0]
        by_winner: dict[str, list[str]] = {}
        for r in modeled:
            by_winner.setdefault(_winner(r["at"]), []).append(r["short"])
        lead.append(f"At B = {first['B']}, L = {_pow2(first['L'])} (modeled): ")
        for i, (w, ways) in enumerate(by_winner.items()):
            lead += ["; " if i else "", Part(label(w), mark="strong"), f" wins {' and '.join(ways)}"]
        lead.append(".")
    slower, total = slower_than_ad(results)
    if total:
        lead += [" " if lead else "", Part(f"Measured on this machine, SD was slower than AD in {slower} of {total} "
                                           "measured (method, B, L) cells.", mark="strong")]
    return _text(*lead)


def answers(run: dict, results: dict) -> list[list[Text | str]]:
    """A row per way of answering: its name (linking its notebook), its winner at the highlighted
    cell (the measured one at the nearest cell it timed, named as such), the cells each method
    wins, and what the answer is good for."""
    table = []
    for r in verdict_rows(run, results):
        at = _text(f"B = {r['B']}, L = {_pow2(r['L'])}: ", *_cell_text(r["at"]),
                   *((" ", Part(f"({r['note']})", mark="aside")) if r.get("note") else ()))
        grid = (_grid_text(*r["grid"], r.get("unresolved", set())) if r.get("grid") else
                _text(Part("(no grid recorded)", mark="aside")))
        table.append([_text(_link(run, r["stem"], r["way"])), at, grid, r["trust"]])
    return table


# ---------------------------------------------------------------------------- reproduced or not

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
    got = results.get("01_performance_model", {}).get("headline")
    if not got:
        return []
    paper = perfmodel.PAPER_MULTIPLIERS["seqax-67m"]
    ok, numbers = _arithmetic_numbers(got, paper, [m for m in perfmodel.MODELED_METHODS if m in got])
    return [Claim(ARITHMETIC, ok, _text("Multipliers at B = 64, L = 512, the paper's shapes and tau: ",
                                        _link(run, "01_performance_model", numbers)), "arithmetic:multipliers")]


def _claim_70b(run: dict, results: dict) -> list[Claim]:
    got = results.get("07_llama3_70b_extrapolation", {}).get("headline_70b")
    if not got:
        return []
    paper = perfmodel.PAPER_MULTIPLIERS["llama3-70b"]
    ok, numbers = _arithmetic_numbers(got, paper, [m for m in perfmodel.MODELED_METHODS if m in got and m in paper])
    return [Claim(ARITHMETIC, ok, _text(f"Llama 3 70B at B = {paper['B']}, L = {_pow2(paper['L'])}: ",
                                        _link(run, "07_llama3_70b_extrapolation", numbers)), "arithmetic:llama3-70b")]


def _claim_costs(run: dict, results: dict) -> list[Claim]:
    """Each of the paper's cost numbers: the same from the full multipliers, or the same only
    from the multipliers rounded to two decimals first (the paper's arithmetic, as 08 shows:
    said so), or not the same (called a difference)."""
    checks = results.get("08_cost_analysis", {}).get("paper_cost_check") or {}
    out = []
    for quantity, c in checks.items():
        full, rounded, paper = c["from_full_tm"], c["from_rounded_tm"], c["paper"]
        if _same(full, paper):
            text, ok = f"{full:.2f} (paper {paper:.2f})", True
        elif _same(rounded, paper):
            text, ok = (f"{full:.2f} (paper {paper:.2f}: the paper rounded its multipliers to two decimals first; "
                        f"from the rounded multipliers {rounded:.2f})"), True
        else:
            text, ok = f"{full:.2f} (paper {paper:.2f}; {rounded:.2f} from rounded multipliers): differs", False
        out.append(Claim(ARITHMETIC, ok, _text(f"Serving savings, {quantity} (target-training units): ",
                                               _link(run, "08_cost_analysis", text)), f"arithmetic:savings:{quantity}"))
    return out


def _tau_order(results: dict) -> tuple[int, list[str], list[str]] | None:
    taus = results.get("04_measure_tau", {}).get("tau")
    if not taus:
        return None
    lengths = sorted({int(L) for by_l in taus.values() for L in by_l})
    at = min(lengths, key=lambda L: (abs(L - perfmodel.PAPER_TAU_CONTEXT), L))
    order = sorted((m for m in taus if str(at) in taus[m]), key=lambda m: -taus[m][str(at)]["mean"])
    paper_at = perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]
    paper_order = sorted((m for m in order if m in paper_at), key=lambda m: -paper_at[m])
    return at, order, paper_order


def budget_clause(results: dict) -> str:
    """The trained drafts' budgets as shares of the paper's 20 x N (notebook 03's "draft_budgets",
    `tables.training.draft_budgets`), for a claim built on their tau, after a semicolon; worded as
    about the budget, not the method, for a draft below `SMALL_BUDGET`; "" when 03 recorded none."""
    budgets = results.get("03_train_drafts", {}).get("draft_budgets")
    if not budgets:
        return ""
    small = [name for name, b in budgets.items() if b["fraction"] < SMALL_BUDGET]
    return ("; drafts trained on " + " and ".join(f"{percent(b['fraction'])} ({name})" for name, b in budgets.items())
            + " of the paper's 20 x N tokens" + (f": about that budget for the {' and the '.join(small)}, not about "
                                                 "the method" if small else ""))


def _claim_tau(run: dict, results: dict) -> list[Claim]:
    found = _tau_order(results)
    if not found:
        return []
    at, order, paper_order = found
    taus = results["04_measure_tau"]["tau"]
    paper_at = perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]
    here = ", ".join(f"{label(m)} {taus[m][str(at)]['mean']:.2f}" for m in order)
    paper = ", ".join(f"{label(m)} {paper_at[m]:.2f}" for m in paper_order)
    ours = [m for m in order if m in paper_at]
    return [Claim(REPRODUCED, ours == paper_order,
                  _text(f"Order of tau across drafts (measured): here at L = {at} ", _link(run, "04_measure_tau", here),
                        f"; paper at L = 512: {paper}{budget_clause(results)}"), "tau-order")]


def _claim_highlight_winner(run: dict, results: dict) -> list[Claim]:
    recorded = results.get("06_speedup_explorer", {})
    at = recorded.get("multipliers_at_highlight") or {}
    if not at.get("paper shapes") or (recorded.get("taus_used") or {}).get("source") != "measured":
        return []
    values = at["paper shapes"]
    win = _winner(values)
    numbers = ", ".join(f"{label(m)} {v:.2f}x" for m, v in sorted(values.items(), key=lambda kv: -kv[1]))
    return [Claim(REPRODUCED, win == "spire",
                  _text(f"SPIRe is the best draft at B = {at['B']}, L = {_pow2(at['L'])} (modeled with this run's tau "
                        "at the paper's shapes): ", _link(run, "06_speedup_explorer", numbers), budget_clause(results)),
                  "spire-best-at-highlight")]


def ablation_effects(ranked: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """05's ranking split by what this run resolves (`measure.ablations.effect_of`): (parts that
    help, ranked; parts resolved as harmful; parts not resolved)."""
    return tuple([r for r in ranked if effect_of(r) == effect]
                 for effect in ("helps", "harmful", "not resolved"))


def _tau_effect(recorded: dict, part: str) -> str:
    d = (recorded.get("component_delta_tau") or {}).get(part)
    return f"{d['mean']:+.3f} ± {d['ci95']:.3f} tau" if d else "modeled, no interval (cost model only)"


def ablation_source(run: dict, results: dict) -> str:
    """Which run 05's figures come from, in words: the params file that ran 05 (an output folder
    updated with `--only` keeps each notebook's own), when it started, its seeds and training
    tokens per variant; "" when run.json does not say."""
    entry = run.get("notebooks", {}).get("05_ablations", {})
    params_file = entry.get("params_file") or run.get("params_file")
    if not params_file:
        return ""
    protocol = results.get("05_ablations", {}).get("ablation_protocol", {})
    training, seeds = protocol.get("training") or {}, protocol.get("seeds") or []
    budget = ""
    if seeds and training:
        tokens = training["batch_size"] * training["seq_len"] * training["steps"]
        budget = f", {len(seeds)} seed{'s' if len(seeds) > 1 else ''} x {_count(tokens)} training tokens per variant"
    started = entry.get("started", "")[:10]
    return f"(05 run with {params_file}{f' on {started}' if started else ''}{budget})"


def _claim_ablations(run: dict, results: dict) -> list[Claim]:
    """05's importance of SPIRe's parts in 05's own words (`narrative.ablations.order_sentence`, as
    its lead says it): over training randomness with the target fixed, or, with one seed, about
    one trained draft per variant, which cannot reproduce a claim about training this way; what is
    resolved is resolved family-wise (method §10), in either direction, a variant against SPIRe
    included."""
    recorded = results.get("05_ablations", {})
    ranked = recorded.get("importance")
    if not ranked:
        return []
    helps, harmful, unresolved = ablation_effects(ranked)
    interval = recorded.get("interval")
    text = ("Importance of SPIRe's parts (measured tau, modeled at B = 64, L = 512): "
            + ablation_narrative.order_sentence(ranked, interval, recorded.get("component_delta_tau"),
                                             recorded.get("delta_tau")))
    ours = [r["part"] for r in helps]
    ok = (not harmful and not unresolved and ours == [p for p in PAPER_IMPORTANCE_ORDER if p in ours]
          and (interval or {}).get("scope") != "draft")
    source = ablation_source(run, results)
    paper = " Paper: " + " > ".join(PAPER_IMPORTANCE_ORDER) + (f" {source}" if source else "")
    return [Claim(REPRODUCED, ok, _text(_link(run, "05_ablations", text), paper), "importance-order")]


def past_note(recorded: dict, cell: dict) -> str:
    """What a measured cell of 09 (`recorded`: its results) carries next to its figure when its
    contexts ran past the target's training windows (`measure.cells.mark_past_training`)."""
    if not cell.get("past_training"):
        return ""
    trained = recorded.get("target_trained_length")
    return ("; past the " + (f"{trained:,}-token " if trained else "") + "windows the target was trained on, so "
            "about a target used beyond what it learned")


def _claim_measured(run: dict, results: dict) -> list[Claim]:
    recorded = results.get("09_measured_vs_modeled", {})
    cells = recorded.get("cells")
    if not cells:
        return []
    slower, total = slower_than_ad(results)
    best = max(cells, key=lambda c: c["measured_speedup"])
    errors = [abs(c["modeled_speedup"] / c["measured_speedup"] - 1) for c in cells]
    profiled = [abs(c["profiled_error"]) for c in cells if "profiled_error" in c]
    claims = [
        Claim(REPRODUCED, slower == 0, _text(
            "Speculative decoding is faster than AD on the clock (measured): ",
            _link(run, "09_measured_vs_modeled", f"faster in {total - slower} of {total} measured cells"),
            f" ({sum(c.get('ci_low', 0.0) > 1.0 for c in cells)} resolved: 95% CI above 1)"
            f" (best {best['measured_speedup']:.2f}x, {label(best['method'])} at B = {best['B']}, "
            f"L = {best['L']}{past_note(recorded, best)})"), "sd-faster-measured"),
        Claim(REPRODUCED, statistics.median(errors) <= 0.25, _text(
            "The paper's throughput model predicts measured speedups: ",
            _link(run, "09_measured_vs_modeled",
                  f"median error {statistics.median(errors):.0%} over all {total} cells"),
            f", at most {max(errors):.0%}"), "paper-model-predicts"),
    ]
    if profiled:
        model = recorded.get("profiled_model", {})
        held, bias = model.get("held_out_max_error"), model.get("mean_signed_error", 0.0)
        ok = statistics.median(profiled) <= 0.10 and abs(bias) <= 0.05 and (held is None or held <= 0.15)
        claims.append(Claim(REPRODUCED, ok, _text(
            "The profiled cost model of this machine predicts them (not a claim of the paper's): ",
            _link(run, "09_measured_vs_modeled",
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


# ---------------------------------------------------------------------------- details

def headline(run: dict, results: dict) -> dict | None:
    """Notebook 01's modeled multipliers at (64, 512) against the paper's: a row per method (its
    name, this run's multiplier linking 01, the paper's, whether they are the same to rounding)."""
    got = results.get("01_performance_model", {}).get("headline")
    if not got:
        return None
    paper = perfmodel.PAPER_MULTIPLIERS["seqax-67m"]
    return dict(rows=[[label(m), _text(_link(run, "01_performance_model", f"{got[m]:.2f}x")), f"{paper[m]:.2f}x",
                       "yes" if round(got[m], 2) == paper[m] else "no"]
                      for m in perfmodel.MODELED_METHODS if m in got])


def table1(run: dict, results: dict) -> dict | None:
    """Notebook 04's tau per method and L (95% CI) next to the paper's Table 1: the table, the
    order of the drafts at the L nearest 512 against the paper's, 03's budgets and 04's scale."""
    recorded = results.get("04_measure_tau", {})
    taus = recorded.get("tau")
    if not taus:
        return None
    lengths = sorted({int(L) for by_l in taus.values() for L in by_l}, reverse=True)
    methods = [(m, label(m)) for m in perfmodel.MODELED_METHODS if m in taus]
    methods += [(m, label(m)) for m in taus if m not in perfmodel.MODELED_METHODS]
    protocol = recorded.get("tau_protocol", {})
    trained_on, G = protocol.get("trained_on"), protocol.get("new_tokens", 0)
    rows = []
    for L in lengths:
        past = trained_on and L + G > trained_on  # said next to the figure (04 puts the target's loss beside it)
        row: list[Text | str] = [f"{L} (past the {trained_on:,}-token training windows)" if past else str(L)]
        for m, _ in methods:
            cell = taus[m].get(str(L))
            row.append(_text(_link(run, "04_measure_tau", f"{cell['mean']:.3f} ± {cell['ci95']:.3f}"))
                       if cell else "-")
        paper = perfmodel.PAPER_TAU.get(L)
        row += [f"{paper[m]:.3f}" if paper and m in paper else "-" for m, _ in methods]
        rows.append(row)
    header = (["L"] + [f"{name} (this run)" for _, name in methods]
              + [f"{name} (paper)" for _, name in methods])
    at, order, paper_order = _tau_order(results)
    paper_order_all = [m for m in order if m in perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]]
    budgets = results.get("03_train_drafts", {}).get("draft_budgets")
    return dict(header=header, rows=rows, at=at, order=" > ".join(label(m) for m in order),
                paper_order=" > ".join(label(m) for m in paper_order), same=paper_order_all == paper_order,
                budgets=budget_sentence(budgets) if budgets else "",
                scale=recorded.get("tau_protocol", {}).get("scale", ""))


def ablation_ranking(run: dict, results: dict) -> dict | None:
    """Notebook 05's parts of SPIRe: the ones resolved as helping, ranked, next to the paper's
    rank; the ones resolved as harmful and the unresolved ones without a rank; with one seed
    (`draft`), the same about one trained draft per variant (`narrative.ablations.EFFECT_WORDS`).
    Also what the interval is over (`about`), which run 05's figures come from and 05's scale."""
    recorded = results.get("05_ablations", {})
    ranked = recorded.get("importance")
    if not ranked:
        return None
    interval = recorded.get("interval")
    draft = (interval or {}).get("scope") == "draft"
    helps, harmful, unresolved = ablation_effects(ranked)

    def row(effect: str, r: dict) -> list[Text | str]:
        return [effect, _text(_link(run, "05_ablations", f"{r['part']} ({r['multiplier_lost']:+.2f}x)")),
                _tau_effect(recorded, r["part"]), str(PAPER_IMPORTANCE_ORDER.index(r["part"]) + 1)]

    labels = (("hurts this trained draft", "within the contexts' noise") if draft else
              ("harmful here", "not resolved"))
    rows = [row(str(i + 1), r) for i, r in enumerate(helps)]
    rows += [row(effect, r) for effect, group in zip(labels, (harmful, unresolved)) for r in group]
    return dict(draft=draft, about=ablation_narrative.scope_phrase(interval).rstrip(": "),
                source=ablation_source(run, results), rows=rows,
                scale=recorded.get("ablation_protocol", {}).get("scale", ""))


def measured_vs_modeled(run: dict, results: dict) -> dict | None:
    """Notebook 09's speedups on the clock against the throughput model: one sentence linking 09,
    and 09's scale."""
    recorded = results.get("09_measured_vs_modeled", {})
    cells = recorded.get("cells")
    if not cells:
        return None
    errors = [abs(c["modeled_speedup"] / c["measured_speedup"] - 1) for c in cells]
    worst = max(cells, key=lambda c: abs(c["modeled_speedup"] / c["measured_speedup"] - 1))
    best = max(cells, key=lambda c: c["measured_speedup"])
    slower, total = slower_than_ad(results)
    machine = recorded.get("machine", {})
    text = (f"SD was slower than AD in {slower} of {total} measured cells. "
            f"Over all {total} cells the paper's model is off by {statistics.median(errors):.0%} (median) and at most "
            f"{max(errors):.0%} ({label(worst['method'])} at B = {worst['B']}, L = {worst['L']}: modeled "
            f"{worst['modeled_speedup']:.2f}x, measured {worst['measured_speedup']:.2f}x). The fastest measured "
            f"speedup is {best['measured_speedup']:.2f}x ({label(best['method'])}, B = {best['B']}, "
            f"L = {best['L']}{past_note(recorded, best)}). "
            f"Calibrated HOI {recorded.get('hoi', float('nan')):.1f} FLOP/byte")
    if machine.get("ad_step_overhead"):
        text += f"; an AD step takes {times(machine['ad_step_overhead'])} its modeled time"
    return dict(text=_text(_link(run, "09_measured_vs_modeled", text)), scale=machine.get("scale", ""))


#: The details behind the verdict, in the index's order; each renders with the template of its name.
DETAILS = [headline, table1, ablation_ranking, measured_vs_modeled]
