"""Plotly figures for the ablations (notebook 05, method §3.8): each variant's tau difference to
SPIRe, measured paired with its 95% interval, next to the paper's difference."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from spirelib.throughput.ablations import DRAFT
from spirelib.throughput.methods import color, label
from spirelib.throughput.recorded_ablations import RecordedDelta
from spirelib.workbook.plots.perf import scale_title, title_layout


def delta_figure(deltas: Mapping[str, RecordedDelta], paper: Mapping[str, float], scale: str = "") -> go.Figure:
    """Bars of tau(variant) - tau(SPIRe): `deltas[variant]` (`tables.ablations.delta_record`) has
    its mean and ci95 (error bars: each difference's own 95% interval, uncorrected) and the
    family-wise verdicts `resolved` and `family_excludes_zero` (method §10); `paper[variant]` is
    the paper's difference (no interval published). One bar per variant in its own colour
    (`methods.color`) with its own legend entry; a difference that is not resolved family-wise
    says so in its axis label, where an error bar clear of 0 cannot show it. With one seed
    ("scope" "draft") the intervals cover the contexts only: the title says the bars are about
    one trained draft per variant, and a label says whether the difference shows for it."""
    names = list(deltas)
    draft = any(d.scope == DRAFT for d in deltas.values())
    ticks = {n: label(n) + _tick_note(deltas[n]) for n in names}
    fig = go.Figure()
    for i, n in enumerate(names):
        fig.add_trace(go.Bar(x=[ticks[n]], y=[deltas[n].mean], name=label(n), marker_color=color(n, i),
                             error_y=dict(type="data", array=[deltas[n].ci95], color="#333"),
                             hovertemplate=f"{label(n)}: %{{y:+.3f}} ± {deltas[n].ci95:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[ticks[n] for n in names], y=[paper.get(n) for n in names], mode="markers",
                             name="paper (L = 512)", marker=dict(symbol="diamond-open", size=13, color="black")))
    fig.add_hline(y=0.0, line=dict(color="gray", width=1))
    what = ("tau of each variant minus SPIRe's, one trained draft each (paired, each bar's own 95% CI over contexts "
            "only, uncorrected; labels family-wise)" if draft
            else "tau of each variant minus SPIRe's (paired, each bar's own 95% CI over training seeds and contexts, "
                 "uncorrected; \"not resolved\": family-wise, Holm)")
    fig.update_layout(**title_layout(scale_title(what, scale)),
                      yaxis_title="delta tau (tokens per round)", template="plotly_white", height=500,
                      showlegend=True, legend=dict(orientation="h", y=-0.3))
    return fig


def _tick_note(d: RecordedDelta) -> str:
    if d.scope == DRAFT:
        return "<br>(this draft only)" if d.family_excludes_zero else "<br>(within noise)"
    return "" if d.resolved else "<br>(not resolved)"
