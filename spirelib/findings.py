"""The run index's lead section: what this run reproduced of the paper, and at what scale.

Built from the results the notebooks recorded (results.json) and the paper's numbers in the
spec (`perfmodel`, `ablations`); every number links to the report of the notebook that made
it. Sections whose notebook did not run (or recorded nothing) are left out, so a partial run
(`--only`) still gets an honest index.
"""

from __future__ import annotations

import html
import statistics
from typing import Any

from spirelib import perfmodel
from spirelib.ablations import PAPER_IMPORTANCE_ORDER
from spirelib.methods import label


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _link(run: dict, stem: str, text: str) -> str:
    page = run.get("notebooks", {}).get(stem, {}).get("html")
    return f"<a href='{_e(page)}'>{text}</a>" if page else text


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def headline(run: dict, results: dict) -> str | None:
    """Notebook 01's modeled multipliers at (64, 512) against the paper's."""
    got = results.get("01_performance_model", {}).get("headline")
    if not got:
        return None
    paper = perfmodel.PAPER_MULTIPLIERS["seqax-67m"]
    rows = [[label(m), _link(run, "01_performance_model", f"{got[m]:.2f}x"), f"{paper[m]:.2f}x",
             "yes" if round(got[m], 2) == paper[m] else "no"] for m in perfmodel.MODELED_METHODS if m in got]
    return ("<h3>Modeled throughput at B = 64, L = 512 (paper shapes, paper taus)</h3>"
            + _table(["method", "this run", "paper", "reproduced to rounding"], rows))


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
    at = min(lengths, key=lambda L: (abs(L - perfmodel.PAPER_TAU_CONTEXT), L))
    order = sorted((m for m, _ in methods if str(at) in taus[m]), key=lambda m: -taus[m][str(at)]["mean"])
    paper_at = perfmodel.PAPER_TAU[perfmodel.PAPER_TAU_CONTEXT]
    paper_order = sorted((m for m in order if m in paper_at), key=lambda m: -paper_at[m])
    scale = recorded.get("tau_protocol", {}).get("scale", "")
    return ("<h3>tau per method and context length (Table 1 analog)</h3>"
            + _table(header, rows)
            + f"<p>Order at L = {at}: {' > '.join(order)}; paper's order: {' > '.join(paper_order)} "
            f"({'the same' if order == paper_order else 'different'}).</p>"
            + (f"<p class='scale'>Scale: {_e(scale)}</p>" if scale else ""))


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
            + (f"<p class='scale'>Scale: {_e(scale)}</p>" if scale else ""))


def measured_vs_modeled(run: dict, results: dict) -> str | None:
    """Notebook 09's speedups on the clock against the throughput model."""
    recorded = results.get("09_measured_vs_modeled", {})
    cells = recorded.get("cells")
    if not cells:
        return None
    errors = [abs(c["modeled_speedup"] / c["measured_speedup"] - 1) for c in cells]
    worst = max(cells, key=lambda c: abs(c["modeled_speedup"] / c["measured_speedup"] - 1))
    best = max(cells, key=lambda c: c["measured_speedup"])
    machine = recorded.get("machine", {})
    text = (f"Over {len(cells)} cells the model is off by {statistics.median(errors):.0%} (median) and at most "
            f"{max(errors):.0%} ({_e(worst['method'])} at B = {worst['B']}, L = {worst['L']}: modeled "
            f"{worst['modeled_speedup']:.2f}x, measured {worst['measured_speedup']:.2f}x). The fastest measured "
            f"speedup is {best['measured_speedup']:.2f}x ({_e(best['method'])}, B = {best['B']}, L = {best['L']}). "
            f"Calibrated HOI {recorded.get('hoi', float('nan')):.1f} FLOP/byte")
    if machine.get("ad_step_overhead"):
        text += f"; an AD step takes {machine['ad_step_overhead']:.1f}x its modeled time"
    return ("<h3>The model against the clock</h3><p>"
            + _link(run, "09_measured_vs_modeled", text) + ".</p>"
            + (f"<p class='scale'>Scale: {_e(machine.get('scale', ''))}</p>" if machine.get("scale") else ""))


FINDINGS = [headline, table1, ablation_ranking, measured_vs_modeled]


def findings_section(run: dict, results: dict) -> str:
    """The index's first section: every finding whose notebook recorded its results."""
    parts = [part for finding in FINDINGS if (part := finding(run, results))]
    if not parts:
        return ""
    return ("<h2>Findings</h2><p>What this run reproduced of the SPIRe paper (arXiv 2504.06419), "
            "computed by the notebooks linked from every number.</p>\n" + "\n".join(parts))
