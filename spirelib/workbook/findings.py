"""The run index's lead: the deploy verdict, what this run reproduced of the paper and what not.

Built from the results the notebooks recorded (results.json) and the paper's numbers
(`perfmodel`, `ablations`; docs/method.md §2); numbers link to the report of the notebook that made them.
Sections whose notebook did not run (or recorded nothing) are left out, so a partial run
(`--only`) still gets an honest index.

The verdict answers one question four ways: which draft wins at the highlighted (B, L) and
over the grid, (1) at the paper's shapes with the paper's tau (01), (2) at the paper's shapes
with this run's tau (06), (3) at the shapes trained here, modeled (06), and (4) on this
machine, measured (09); and says what each answer is good for. `claims` then sorts the
paper's claims this run could check into "reproduced" and "not reproduced", with numbers.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from spirelib.modeling import perfmodel
from spirelib.modeling.ablations import PAPER_IMPORTANCE_ORDER
from spirelib.modeling.methods import label

# The grid "over the grid" refers to when a notebook recorded none (06's grid).
GRID_B = [int(b) for b in 2 ** np.arange(0, 8)]  # 1 .. 128
GRID_L = [int(L) for L in 2 ** np.arange(5, 14)]  # 32 .. 8K
AD = "ad"


def escape(value: Any) -> str:
    """`value` as text safe inside HTML (attributes included)."""
    return html.escape(str(value), quote=True)


def _link(run: dict, stem: str, text: str) -> str:
    page = run.get("notebooks", {}).get(stem, {}).get("html")
    return f"<a href='{escape(page)}'>{text}</a>" if page else text


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{f' class={cls!r}' if cls else ''}><tr>{head}</tr>{body}</table>"


def _pow2(value: int) -> str:
    value = int(value)
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _span(values: list[int]) -> str:
    return f"{_pow2(min(values))}..{_pow2(max(values))}" if len(values) > 2 else ", ".join(map(_pow2, values))


# ---------------------------------------------------------------------------- the verdict

def _winner(values: dict[str, float]) -> str:
    """The method with the highest multiplier, or "ad" when none beats autoregressive decoding."""
    best = max(values, key=values.get)
    return best if values[best] >= 1.0 else AD


def _cell_text(values: dict[str, float]) -> str:
    win = _winner(values)
    others = ", ".join(f"{label(m)} {v:.2f}x" for m, v in sorted(values.items(), key=lambda kv: -kv[1]) if m != win)
    head = f"<b>{escape(label(win))}</b>" + (f" {values[win]:.2f}x" if win != AD else "")
    return head + (f" <span class='aside'>({others})</span>" if others else "")


def _grid_counts(winners: list[list[str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in winners:
        for w in row:
            counts[w] = counts.get(w, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _grid_text(winners: list[list[str]], B: list[int], L: list[int]) -> str:
    counts = _grid_counts(winners)
    total = sum(counts.values())
    parts = [f"<b>{escape(label(m))}</b> {n}" if i == 0 else f"{escape(label(m))} {n}" for i, (m, n) in enumerate(counts.items())]
    return f"{', '.join(parts)} of {total} cells <span class='aside'>(B = {_span(B)}, L = {_span(L)})</span>"


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


def _measured_cells(results: dict) -> dict[tuple[int, int], dict[str, float]]:
    cells: dict[tuple[int, int], dict[str, float]] = {}
    for c in results.get("09_measured_vs_modeled", {}).get("cells") or []:
        cells.setdefault((int(c["B"]), int(c["L"])), {})[c["method"]] = float(c["measured_speedup"])
    return cells


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
            way="paper's shapes, paper's tau (modeled)", short="with the paper's shapes and tau",
            stem="01_performance_model", B=cell["B"], L=cell["L"],
            at=r01["headline"],
            grid=(_modeled_winners(paper_taus, hoi=float(cell.get("hoi", perfmodel.PAPER_HOI))), GRID_B, GRID_L),
            trust="checking that this workbook's model is the paper's (it redoes the paper's arithmetic on the "
                  "paper's numbers); not about the drafts trained here."))
    at_06 = r06.get("multipliers_at_highlight") or {}
    grids_06 = r06.get("winner_grid") or {}
    used = r06.get("taus_used") or {}
    source = "this run's tau" if used.get("source") == "measured" else "the paper's tau (no tau measured)"
    if at_06.get("paper shapes"):
        recorded = grids_06.get("paper shapes")
        if recorded:
            grid = (recorded["winners"], recorded["B"], recorded["L"])
        elif used.get("taus"):
            k = int(results.get("04_measure_tau", {}).get("tau_protocol", {}).get("k", 4))
            hoi = float(_notebook_param(run, "06_speedup_explorer", "hoi", perfmodel.PAPER_HOI))
            grid = (_modeled_winners(used["taus"], k=k, hoi=hoi), GRID_B, GRID_L)
        else:
            grid = None
        at_l = f" at L = {used['context_length']}" if used.get("context_length") else ""
        rows.append(dict(
            way=f"paper's shapes, {source} (modeled)", short=f"at the paper's shapes with {source}",
            stem="06_speedup_explorer", B=at_06["B"], L=at_06["L"],
            at=at_06["paper shapes"], grid=grid,
            trust=f"how the drafts trained here would rank at the paper's scale, if their tau (measured{at_l} on "
                  "small models) carried over; the tau is the weak link."))
    if at_06.get("trained shapes"):
        recorded = grids_06.get("trained shapes")
        rows.append(dict(
            way=f"trained shapes, {source} (modeled)", short="at the trained shapes (modeled)",
            stem="06_speedup_explorer", B=at_06["B"], L=at_06["L"],
            at=at_06["trained shapes"], grid=(recorded["winners"], recorded["B"], recorded["L"]) if recorded else None,
            trust="the model's prediction for the models trained here on the paper's hardware (HOI 600); "
                  "not a measurement."))
    measured = _measured_cells(results)
    if measured:
        want = (int(rows[0]["B"]), int(rows[0]["L"])) if rows else min(measured)
        near = min(measured, key=lambda bl: (abs(np.log2(bl[0] / want[0])) + abs(np.log2(bl[1] / want[1])), bl))
        slower, total = slower_than_ad(results)
        machine = r09.get("machine", {})
        overhead = machine.get("ad_step_overhead")
        Bs, Ls = sorted({b for b, _ in measured}), sorted({l for _, l in measured})
        winners = [[_winner(measured[b, l]) if (b, l) in measured else "-" for l in Ls] for b in Bs]
        rows.append(dict(
            way=f"this machine ({machine.get('device', '?')}), trained models (measured)",
            short=f"on this machine (measured{', nearest cell' if near != want else ''})",
            stem="09_measured_vs_modeled", B=near[0], L=near[1], at=measured[near], grid=(winners, Bs, Ls),
            note=(f"nearest measured cell to ({want[0]}, {want[1]})" if near != want else ""),
            trust=(f"the truth for this machine at this scale only: SD was slower than AD in {slower} of {total} "
                   f"measured cells" + (f"; an AD step takes {overhead:.0f}x its modeled time: fixed per-pass costs, "
                                        "not the paper's memory-bound regime, decide here" if overhead else "") + ".")))
    return rows


def verdict(run: dict, results: dict) -> str | None:
    """The first section of the index: the deploy verdict, four ways, and what each is good for."""
    rows = verdict_rows(run, results)
    if not rows:
        return None
    table = []
    for r in rows:
        at = f"B = {r['B']}, L = {_pow2(r['L'])}: " + _cell_text(r["at"]) + (
            f" <span class='aside'>({r['note']})</span>" if r.get("note") else "")
        grid = _grid_text(*r["grid"]) if r.get("grid") else "<span class='aside'>(no grid recorded)</span>"
        table.append([_link(run, r["stem"], escape(r["way"])), at, grid, escape(r["trust"])])
    first = rows[0]
    by_winner: dict[str, list[str]] = {}
    for r in rows:
        by_winner.setdefault(_winner(r["at"]), []).append(r["short"])
    lead = f"At B = {first['B']}, L = {_pow2(first['L'])}: " + "; ".join(
        f"<b>{escape(label(w))}</b> wins {' and '.join(ways)}" for w, ways in by_winner.items())
    slower, total = slower_than_ad(results)
    lead += (f". <b>Measured on this machine, SD was slower than AD in {slower} of {total} cells.</b>" if total
             else ".")
    return ("<h2 id='verdict'>Verdict: which draft to deploy</h2>"
            f"<p class='verdict'>{lead}</p>"
            + _table(["answer from", "winner at the highlighted cell", "winner over the grid (cells won)",
                      "what it is good for"], table, cls="verdict"))


# ---------------------------------------------------------------------------- reproduced or not

Claim = tuple[bool, str]  # (reproduced, the claim with its numbers, HTML)


def _claim_headline(run: dict, results: dict) -> list[Claim]:
    got = results.get("01_performance_model", {}).get("headline")
    if not got:
        return []
    paper = perfmodel.PAPER_MULTIPLIERS["seqax-67m"]
    methods = [m for m in perfmodel.MODELED_METHODS if m in got]
    ok = all(round(got[m], 2) == paper[m] for m in methods)
    numbers = ", ".join(f"{label(m)} {got[m]:.2f}x (paper {paper[m]:.2f}x)" for m in methods)
    return [(ok, "Modeled multipliers at B = 64, L = 512 with the paper's shapes and tau: "
             + _link(run, "01_performance_model", numbers))]


def _claim_70b(run: dict, results: dict) -> list[Claim]:
    got = results.get("07_llama3_70b_extrapolation", {}).get("headline_70b")
    if not got:
        return []
    paper = perfmodel.PAPER_MULTIPLIERS["llama3-70b"]
    methods = [m for m in perfmodel.MODELED_METHODS if m in got and m in paper]
    ok = all(round(got[m], 2) == paper[m] for m in methods)
    numbers = ", ".join(f"{label(m)} {got[m]:.2f}x (paper {paper[m]:.2f}x)" for m in methods)
    return [(ok, f"Llama 3 70B at B = {paper['B']}, L = {_pow2(paper['L'])}: "
             + _link(run, "07_llama3_70b_extrapolation", numbers))]


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
    return [(ours == paper_order, f"Order of tau across drafts: here at L = {at} "
             + _link(run, "04_measure_tau", escape(here)) + f"; paper at L = 512: {escape(paper)}")]


def _claim_highlight_winner(run: dict, results: dict) -> list[Claim]:
    recorded = results.get("06_speedup_explorer", {})
    at = recorded.get("multipliers_at_highlight") or {}
    if not at.get("paper shapes") or (recorded.get("taus_used") or {}).get("source") != "measured":
        return []
    values = at["paper shapes"]
    win = _winner(values)
    numbers = ", ".join(f"{label(m)} {v:.2f}x" for m, v in sorted(values.items(), key=lambda kv: -kv[1]))
    return [(win == "spire", f"SPIRe is the best draft at B = {at['B']}, L = {_pow2(at['L'])} with this run's tau "
             "at the paper's shapes: " + _link(run, "06_speedup_explorer", escape(numbers)))]


def _claim_ablations(run: dict, results: dict) -> list[Claim]:
    recorded = results.get("05_ablations", {})
    ranked = recorded.get("importance")
    if not ranked:
        return []
    resolved = [r for r in ranked if r.get("resolved", True)]
    unresolved = [r["part"] for r in ranked if not r.get("resolved", True)]
    ours = " > ".join(f"{r['part']} ({r['multiplier_lost']:+.2f}x)" for r in resolved)
    rest = f"; not resolved at this scale: {', '.join(unresolved)}" if unresolved else ""
    return [(bool(recorded.get("importance_matches_paper")), "Importance of SPIRe's parts: here "
             + _link(run, "05_ablations", escape(ours + rest)) + "; paper " + escape(" > ".join(PAPER_IMPORTANCE_ORDER)))]


def _claim_costs(run: dict, results: dict) -> list[Claim]:
    checks = results.get("08_cost_analysis", {}).get("paper_cost_check") or {}

    def ok(c):
        return round(c["from_rounded_tm"], 2) == c["paper"] or round(c["from_full_tm"], 2) == c["paper"]

    def text(items):
        return ", ".join(f"{escape(q)} {c['from_full_tm']:.2f} (paper {c['paper']:.2f})" for q, c in items)

    out = []
    for good in (True, False):
        items = [(q, c) for q, c in checks.items() if ok(c) == good]
        if items:
            head = (f"Serving savings (target-training units), {len(items)} of {len(checks)} the paper's to 2 decimals: "
                    if good else "Serving savings that differ from the paper's at 2 decimals: ")
            out.append((good, head + _link(run, "08_cost_analysis", text(items))))
    return out


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
        (slower == 0, "Speculative decoding is faster than AD on the clock: "
         + _link(run, "09_measured_vs_modeled", f"faster in {total - slower} of {total} measured cells")
         + f" (best {best['measured_speedup']:.2f}x, {escape(label(best['method']))} at B = {best['B']}, L = {best['L']})"),
        (statistics.median(errors) <= 0.25, "The paper's throughput model predicts measured speedups: "
         + _link(run, "09_measured_vs_modeled", f"median error {statistics.median(errors):.0%}")
         + f", at most {max(errors):.0%}"),
    ]
    if profiled:
        claims.append((statistics.median(profiled) <= 0.10, "The profiled cost model of this machine predicts them: "
                       + _link(run, "09_measured_vs_modeled", f"median error {statistics.median(profiled):.0%}")
                       + f", at most {max(profiled):.0%} (fitted to single forwards, not to these runs)"))
    return claims


CLAIMS: list[Callable[[dict, dict], list[Claim]]] = [_claim_headline, _claim_70b, _claim_costs, _claim_tau,
                                                     _claim_highlight_winner, _claim_ablations, _claim_measured]


def claims(run: dict, results: dict) -> tuple[list[str], list[str]]:
    """The paper's claims this run checked: (reproduced, not reproduced), each a list of HTML lines."""
    done, not_done = [], []
    for check in CLAIMS:
        for ok, text in check(run, results):
            (done if ok else not_done).append(text)
    return done, not_done


def reproduced_section(run: dict, results: dict) -> str | None:
    done, not_done = claims(run, results)
    if not done and not not_done:
        return None

    def items(lines):
        return "<ul>" + "".join(f"<li>{t}</li>" for t in lines) + "</ul>" if lines else "<p>none</p>"

    return (f"<div class='claims'><div><h3>Reproduced ({len(done)})</h3>{items(done)}</div>"
            f"<div><h3>Not reproduced ({len(not_done)})</h3>{items(not_done)}</div></div>")


# ---------------------------------------------------------------------------- details

def headline(run: dict, results: dict) -> str | None:
    """Notebook 01's modeled multipliers at (64, 512) against the paper's."""
    got = results.get("01_performance_model", {}).get("headline")
    if not got:
        return None
    paper = perfmodel.PAPER_MULTIPLIERS["seqax-67m"]
    rows = [[label(m), _link(run, "01_performance_model", f"{got[m]:.2f}x"), f"{paper[m]:.2f}x",
             "yes" if round(got[m], 2) == paper[m] else "no"] for m in perfmodel.MODELED_METHODS if m in got]
    return ("<h3>Modeled throughput at B = 64, L = 512 (paper shapes, paper taus)</h3>"
            "<p class='scale'>This re-does the paper's arithmetic on the paper's tau: it checks the model, "
            "not the drafts trained here.</p>"
            + _table(["method", "this run", "paper", "same to rounding"], rows))


def table1(run: dict, results: dict) -> str | None:
    """Notebook 04's tau per method and L (95% CI) next to the paper's Table 1."""
    recorded = results.get("04_measure_tau", {})
    taus = recorded.get("tau")
    if not taus:
        return None
    lengths = sorted({int(L) for by_l in taus.values() for L in by_l}, reverse=True)
    methods = [(m, label(m)) for m in perfmodel.MODELED_METHODS if m in taus]
    methods += [(m, label(m)) for m in taus if m not in perfmodel.MODELED_METHODS]
    rows = []
    for L in lengths:
        row = [str(L)]
        for m, _ in methods:
            cell = taus[m].get(str(L))
            row.append(_link(run, "04_measure_tau", f"{cell['mean']:.3f} ± {cell['ci95']:.3f}") if cell else "-")
        paper = perfmodel.PAPER_TAU.get(L)
        row += [f"{paper[m]:.3f}" if paper and m in paper else "-" for m, _ in methods]
        rows.append(row)
    header = (["L"] + [f"{name} (this run)" for _, name in methods]
              + [f"{name} (paper)" for _, name in methods])
    at, order, paper_order = _tau_order(results)
    paper_order_all = [m for m in order if m in perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]]
    scale = recorded.get("tau_protocol", {}).get("scale", "")
    return ("<h3>tau per method and context length (Table 1 analog)</h3>"
            + _table(header, rows)
            + f"<p>Order at L = {at}: {escape(' > '.join(label(m) for m in order))}; paper's order at L = 512: "
            f"{escape(' > '.join(label(m) for m in paper_order))} "
            f"({'the same' if paper_order_all == paper_order else 'different'}).</p>"
            + (f"<p class='scale'>Scale: {escape(scale)}</p>" if scale else ""))


def ablation_ranking(run: dict, results: dict) -> str | None:
    """Notebook 05's importance order of SPIRe's parts next to the paper's."""
    recorded = results.get("05_ablations", {})
    ranked = recorded.get("importance")
    if not ranked:
        return None
    rows = [[str(i + 1), _link(run, "05_ablations", f"{r['part']} ({r['multiplier_lost']:+.2f}x)"),
             PAPER_IMPORTANCE_ORDER[i] if i < len(PAPER_IMPORTANCE_ORDER) else ""] for i, r in enumerate(ranked)]
    matches = recorded.get("importance_matches_paper")
    scale = recorded.get("ablation_protocol", {}).get("scale", "")
    return ("<h3>Which part of SPIRe matters most (ablations)</h3>"
            + _table(["rank", "this run (multiplier lost without it)", "paper"], rows)
            + f"<p>The order {'matches' if matches else 'differs from'} the paper's.</p>"
            + (f"<p class='scale'>Scale: {escape(scale)}</p>" if scale else ""))


def measured_vs_modeled(run: dict, results: dict) -> str | None:
    """Notebook 09's speedups on the clock against the throughput model."""
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
            f"Over them the model is off by {statistics.median(errors):.0%} (median) and at most "
            f"{max(errors):.0%} ({escape(label(worst['method']))} at B = {worst['B']}, L = {worst['L']}: modeled "
            f"{worst['modeled_speedup']:.2f}x, measured {worst['measured_speedup']:.2f}x). The fastest measured "
            f"speedup is {best['measured_speedup']:.2f}x ({escape(label(best['method']))}, B = {best['B']}, L = {best['L']}). "
            f"Calibrated HOI {recorded.get('hoi', float('nan')):.1f} FLOP/byte")
    if machine.get("ad_step_overhead"):
        text += f"; an AD step takes {machine['ad_step_overhead']:.1f}x its modeled time"
    return ("<h3>The model against the clock</h3><p>"
            + _link(run, "09_measured_vs_modeled", text) + ".</p>"
            + (f"<p class='scale'>Scale: {escape(machine.get('scale', ''))}</p>" if machine.get("scale") else ""))


DETAILS = [headline, table1, ablation_ranking, measured_vs_modeled]
FINDINGS = DETAILS  # kept for callers of the earlier name


def verdict_section(run: dict, results: dict) -> str:
    """The index's first section: the verdict, then the reproduced and not reproduced lists."""
    parts = [part for part in (verdict(run, results), reproduced_section(run, results)) if part]
    return "\n".join(parts)


def findings_section(run: dict, results: dict) -> str:
    """The details behind the verdict: every finding whose notebook recorded its results."""
    parts = [part for finding in DETAILS if (part := finding(run, results))]
    if not parts:
        return ""
    return ("<h2>Details</h2><p>The numbers behind the verdict, computed by the notebooks linked from every "
            "number.</p>\n" + "\n".join(parts))
