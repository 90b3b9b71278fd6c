"""The run index's lead: which draft wins where, at what scale, as data; and the words every section is built of.

Built from the results the notebooks recorded (results.json) and the paper's numbers (`perfmodel`;
docs/method.md §2) as data, not HTML: sentences are `Text`, runs of plain text (`Part`) that link the
report of the notebook that made a number (`link`); `report` renders them with its templates, `plain`
gives the terminal and the claims' record the same words. Sections whose notebook did not run (or
recorded nothing) are left out, so a partial run (`--only`) still gets an honest index.

The first screen (`verdict`) is one line of scale (target, training tokens, perplexity, corpus,
machine) and the winner over (B, L) as a small map per way of answering, each with a sentence
saying where the winner flips (`narrative.winners.where_sentence`): the paper's shapes and tau
(01), this run's tau at the paper's and at the trained shapes (06), this machine measured at the
cells 09 timed and its profiled model (09); then SPIRe against EAGLE-3 alone, the draft the
engines serve (`duel_maps`), modeled and measured. What this run checked of the paper's claims is
`paper_claims`'; the numbers behind the verdict are `details`'.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spirelib.throughput import perfmodel
from spirelib.throughput.methods import color, label, letter
from spirelib.throughput.recorded import (
    explored,
    modeled_headline,
    tau_protocol,
    timed_cells,
    timed_machine,
    trained_target,
)
from spirelib.throughput.winners import AD, by_cell, unresolved_cells
from spirelib.throughput.winners import grid_counts as _grid_counts
from spirelib.throughput.winners import winner as _winner
from spirelib.units import count
from spirelib.workbook.narrative.winners import pow2 as _pow2
from spirelib.workbook.narrative.winners import span as _span
from spirelib.workbook.narrative.winners import where_sentence

# The grid "over the grid" refers to when a notebook recorded none (06's grid).
DUEL = ("spire", "eagle3")  # the index's head-to-head: SPIRe or the draft the engines serve today (EAGLE-3)
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


def as_text(*parts: str | Part) -> Text:
    """A `Text` of `parts`, each a Part or plain words (empty ones left out)."""
    return tuple(p if isinstance(p, Part) else Part(p) for p in parts if p)


def link(run: dict, stem: str, text: str) -> Part:
    """`text` linking the report of notebook `stem`, plain where the run has no report of it."""
    page = run.get("notebooks", {}).get(stem, {}).get("html")
    return Part(text, href=page or None)


def times(value: float) -> str:
    """A ratio of times (an AD step's measured over its modeled time), one format everywhere."""
    return f"{value:,.1f}x"


def scale_facts(run: dict, results: dict) -> dict:
    """What the index's scale line says, from what the notebooks recorded: the target's shape and
    body parameters, its training tokens, validation perplexity, the corpus and the machine."""
    target = trained_target(results)
    protocol = tau_protocol(results)
    machine = timed_machine(results)
    series = (run.get("params") or {}).get("series") or {}
    shape = protocol.target or series.get("target") or {}
    facts = {"layers": shape.get("num_layers"), "d_model": shape.get("d_model"),
             "body_params": target.body_params, "tokens": target.tokens or protocol.target_tokens,
             "perplexity": float(np.exp(target.val_loss)) if target.val_loss is not None else None,
             "corpus": series.get("corpus") or None, "device": machine.device,
             "trained_on": target.device, "threads": machine.threads}
    return {k: v for k, v in facts.items() if v is not None}


def scale_line(run: dict, results: dict) -> str | None:
    """One line: the scale every answer below was made at (None when nothing of it was recorded)."""
    f = scale_facts(run, results)
    parts = []
    if "layers" in f:
        parts.append(f"target {f['layers']} layers x d_model {f['d_model']}"
                     + (f" ({count(f['body_params'])} body parameters; the paper's: "
                        f"{count(perfmodel.body_params('seqax-67m'))})" if "body_params" in f else ""))
    if "tokens" in f:
        parts.append(f"trained on {count(f['tokens'])} tokens" + (f" of {f['corpus']}" if "corpus" in f else ""))
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
    """A method's letters in a winner map (its card's, `methods.letter`); none for an empty cell."""
    return "" if method == "-" else letter(method)


# ---------------------------------------------------------------------------- the verdict

def _cell_text(values: dict[str, float]) -> Text:
    win = _winner(values)
    others = ", ".join(f"{label(m)} {v:.2f}x" for m, v in sorted(values.items(), key=lambda kv: -kv[1]) if m != win)
    return as_text(Part(label(win), mark="strong"), f" {values[win]:.2f}x" if win != AD else "",
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
    return as_text(*(parts or ["none"]), f" of {total} cells{open_cells} ",
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
    return by_cell(timed_cells(results), key)


def _grid(cells: dict, Bs: list[int], Ls: list[int]) -> tuple[list[list[str]], list[list[float | None]]]:
    """(the winner, the best speedup) of every (B, L) of `_cells`, "-" and None where none was timed."""
    return ([[_winner(cells[b, l]) if (b, l) in cells else "-" for l in Ls] for b in Bs],
            [[max(cells[b, l].values()) if (b, l) in cells else None for l in Ls] for b in Bs])


def slower_than_ad(results: dict) -> tuple[int, int]:
    """(cells where speculative decoding measured slower than AD, cells measured), over 09's methods x (B, L)."""
    cells = timed_cells(results)
    return sum(c.measured_speedup < 1.0 for c in cells), len(cells)


def verdict_rows(run: dict, results: dict) -> list[dict]:
    """One row per way of answering "which draft wins": its name, the answer at (B, L), over
    the grid, and what to trust it for. Ways whose notebook recorded nothing are left out."""
    rows = []
    r01, r06 = modeled_headline(results, "01_performance_model"), explored(results)
    if r01 is not None:
        paper_taus = perfmodel.PAPER_TAU[int(r01.tau_context or perfmodel.PAPER_TAU_CONTEXT)]
        rows.append(dict(
            key="paper", way="paper's shapes, paper's tau (modeled)", short="with the paper's shapes and tau",
            title="the paper's shapes and tau (HOI 600)",
            stem="01_performance_model", B=r01.B or 64, L=r01.L or 512,
            at=r01.multipliers,
            grid=(_modeled_winners(paper_taus, hoi=float(r01.hoi or perfmodel.PAPER_HOI)), GRID_B, GRID_L),
            trust="checking that this workbook's model is the paper's (it redoes the paper's arithmetic on the "
                  "paper's numbers); not about the drafts trained here."))
    source = "this run's tau" if r06.measured else "the paper's tau (no tau measured)"
    hoi_06 = float(_notebook_param(run, "06_speedup_explorer", "hoi", perfmodel.PAPER_HOI))
    if r06.at.get("paper shapes"):
        recorded = r06.grids.get("paper shapes")
        if recorded:
            grid = (recorded.winners, recorded.B, recorded.L)
        elif r06.taus:
            k = tau_protocol(results).k
            grid = (_modeled_winners(r06.taus, k=k, hoi=hoi_06), GRID_B, GRID_L)
        else:
            grid = None
        at_l = f" at L = {r06.tau_context}" if r06.tau_context else ""
        rows.append(dict(
            key="paper-shapes", way=f"paper's shapes, {source} (modeled)", short=f"at the paper's shapes with {source}",
            title=f"the paper's shapes, {source} (HOI {hoi_06:g})",
            stem="06_speedup_explorer", B=r06.B, L=r06.L,
            at=r06.at["paper shapes"], grid=grid,
            trust=f"how the drafts trained here would rank at the paper's scale, if their tau (measured{at_l} on "
                  "small models) carried over; the tau is the weak link."))
    if r06.at.get("trained shapes"):
        recorded = r06.grids.get("trained shapes")
        rows.append(dict(
            key="trained-shapes", way=f"trained shapes, {source} (modeled)", short="at the trained shapes (modeled)",
            title=f"this run's shapes, {source} (HOI {hoi_06:g})",
            stem="06_speedup_explorer", B=r06.B, L=r06.L,
            at=r06.at["trained shapes"], grid=(recorded.winners, recorded.B, recorded.L) if recorded else None,
            trust="the model's prediction for the models trained here on the paper's hardware (HOI 600); "
                  "not a measurement."))
    measured = _cells(results, "measured_speedup")
    if measured:
        want = (int(rows[0]["B"]), int(rows[0]["L"])) if rows else min(measured)
        near = min(measured, key=lambda bl: (abs(np.log2(bl[0] / want[0])) + abs(np.log2(bl[1] / want[1])), bl))
        slower, total = slower_than_ad(results)
        machine = timed_machine(results)
        overhead = machine.ad_step_overhead
        Bs, Ls = sorted({b for b, _ in measured}), sorted({l for _, l in measured})
        winners, values = _grid(measured, Bs, Ls)
        predicted = _cells(results, "profiled_speedup")
        row = dict(
            key="measured", way=f"this machine ({machine.device or '?'}), trained models (measured)",
            short=f"on this machine (measured at B = {near[0]}, L = {near[1]})",
            title="this machine, measured", stem="09_measured_vs_modeled", B=near[0], L=near[1], at=measured[near],
            grid=(winners, Bs, Ls), values=values,
            unresolved=unresolved_cells(timed_cells(results), Bs, Ls),
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
            maps.append(dict(key="profiled", title="this machine, profiled model", stem=r["stem"],
                             grid=(p_winners, B, L), values=p_values, differs=differs, unresolved=set(),
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


def duel_maps(run: dict, results: dict, duel: tuple[str, str] = DUEL) -> list[dict]:
    """`duel`'s two drafts alone (SPIRe or EAGLE-3, where?), as `decision_maps` draws the others:
    modeled at the paper's shapes with the taus this run measured (06's, HOI 06's), and measured on
    this machine where 09 timed both, a cell unresolved where the two speedups' 95% CIs (or AD's)
    overlap (`unresolved_cells`); AD wins a cell where neither beats it. None of a way that lacks
    either draft."""
    a, b = duel
    title = f"{label(a)} or {label(b)}"
    maps = []
    used = explored(results)
    taus = {m: t for m, t in used.taus.items() if m in duel}
    if len(taus) == 2 and used.measured:
        k = tau_protocol(results).k
        hoi = float(_notebook_param(run, "06_speedup_explorer", "hoi", perfmodel.PAPER_HOI))
        winners = _modeled_winners(taus, k=k, hoi=hoi)
        maps.append(dict(key="duel-paper-shapes", title=f"{title}: the paper's shapes, this run's tau (HOI {hoi:g})",
                         stem="06_speedup_explorer", grid=(winners, GRID_B, GRID_L), values=None, differs=set(),
                         unresolved=set(), where=where_sentence(winners, GRID_B, GRID_L)))
    cells = [c for c in timed_cells(results) if c.method in duel]
    measured = {bl: v for bl, v in by_cell(cells, "measured_speedup").items() if len(v) == 2}
    if measured:
        Bs, Ls = sorted({bl[0] for bl in measured}), sorted({bl[1] for bl in measured})
        winners, values = _grid(measured, Bs, Ls)
        unresolved = unresolved_cells([c for c in cells if (c.B, c.L) in measured], Bs, Ls)
        maps.append(dict(key="duel-measured", title=f"{title}: this machine, measured", stem="09_measured_vs_modeled",
                         grid=(winners, Bs, Ls), values=values, differs=set(), unresolved=unresolved,
                         where=where_sentence(winners, Bs, Ls, unresolved)))
    return maps


def verdict(run: dict, results: dict) -> dict | None:
    """The index's first screen: the scale in one line (`scale_line`), the winner over (B, L) as a
    small map (`map_cells`) for every way of answering (the paper's shapes and tau; this run's tau
    at the paper's shapes and at the shapes trained here, HOI 600; this machine, measured and
    profiled), each titled with a link to its notebook and with a sentence on where the winner
    flips, the maps' key, the verdict's sentence (`verdict_lead`) and the abbreviations."""
    rows = verdict_rows(run, results)
    if not rows:
        return None
    maps = decision_maps(run, results, rows) + duel_maps(run, results)
    return dict(scale=scale_line(run, results),
                maps=[dict(title=as_text(link(run, m["stem"], m["title"])), where=m["where"],
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
    return as_text(*lead)


def answers(run: dict, results: dict) -> list[list[Text | str]]:
    """A row per way of answering: its name (linking its notebook), its winner at the highlighted
    cell (the measured one at the nearest cell it timed, named as such), the cells each method
    wins, and what the answer is good for."""
    table = []
    for r in verdict_rows(run, results):
        at = as_text(f"B = {r['B']}, L = {_pow2(r['L'])}: ", *_cell_text(r["at"]),
                   *((" ", Part(f"({r['note']})", mark="aside")) if r.get("note") else ()))
        grid = (_grid_text(*r["grid"], r.get("unresolved", set())) if r.get("grid") else
                as_text(Part("(no grid recorded)", mark="aside")))
        table.append([as_text(link(run, r["stem"], r["way"])), at, grid, r["trust"]])
    return table
