"""Plotly figures for the ablations (notebook 05, method §3.8): each variant's tau difference to
SPIRe, measured paired with its 95% interval, next to the paper's difference."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from spirelib.modeling.methods import color, label
from spirelib.workbook.plots.perf import scale_title, title_layout


def delta_figure(deltas: Mapping[str, dict], paper: Mapping[str, float], scale: str = "") -> go.Figure:
    """Bars of tau(variant) - tau(SPIRe): `deltas[variant]` has "mean" and "ci95" (error bars) and
    "resolved"; `paper[variant]` is the paper's difference (no interval published)."""
    names = list(deltas)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[label(n) for n in names], y=[deltas[n]["mean"] for n in names], name="measured here",
                         marker_color=[color(n, i) for i, n in enumerate(names)],
                         error_y=dict(type="data", array=[deltas[n]["ci95"] for n in names]),
                         text=["" if deltas[n]["resolved"] else "not resolved" for n in names],
                         textposition="outside"))
    fig.add_trace(go.Scatter(x=[label(n) for n in names], y=[paper.get(n) for n in names], mode="markers",
                             name="paper (L = 512)", marker=dict(symbol="diamond-open", size=13, color="black")))
    fig.add_hline(y=0.0, line=dict(color="gray", width=1))
    fig.update_layout(**title_layout(scale_title("tau of each variant minus SPIRe's (paired, 95% CI)", scale)),
                      yaxis_title="delta tau (tokens per round)", template="plotly_white", height=480,
                      legend=dict(orientation="h", y=-0.25))
    return fig
