"""Plotly figures of measured acceptance (method §5, 8): tau per method and context length next
to the paper's Table 1 (or per KV budget), the target's own loss past its training windows, and
per-position acceptance (the tables: `tables.decoding`).

Builders take `tau.TauStats` per method and context length ({method: {L: TauStats}}) and
compute nothing but what they plot (intervals included). `scale` is a short note of the
model and data scale, shown in the title: every figure says at what scale it was made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from spirelib.measure.context_loss import LossStats
from spirelib.measure.tau import TauStats
from spirelib.throughput.methods import color as method_color
from spirelib.throughput.methods import label as method_label
from spirelib.workbook.plots.perf import SUBPLOT_TOP, scale_title, title_layout

Stats = Mapping[str, Mapping[int, TauStats]]


def tau_figure(stats: Stats, paper: Mapping[int, Mapping[str, float]] | None = None, scale: str = "", *,
               trained_to: int | None = None, x_title: str = "context length L") -> go.Figure:
    """tau (95% CI) against context length per method; beside it, the paper's Table 1
    (paper[L][method]) on its own context lengths, since ours may be scaled down. `trained_to`: the
    longest L whose L + G fits the training windows, marked. The x axis may be another integer
    (`x_title`), e.g. the KV budget of 04's sweep ({method: {budget: TauStats}})."""
    panels = 2 if paper else 1
    fig = make_subplots(rows=1, cols=panels, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("measured here", "paper, Table 1")[:panels])
    for i, (method, by_length) in enumerate(stats.items()):
        lengths = sorted(by_length)
        fig.add_trace(go.Scatter(
            x=lengths, y=[by_length[L].mean for L in lengths], mode="lines+markers", name=method_label(method),
            legendgroup=method, line=dict(color=method_color(method, i)),
            error_y=dict(type="data", array=[by_length[L].ci95 for L in lengths], visible=True),
            customdata=[[by_length[L].n_contexts] for L in lengths],
            hovertemplate=f"{x_title.split()[-1]} = " + "%{x}<br>tau = %{y:.3f} ± %{error_y.array:.3f}<br>"
                          "%{customdata[0]} contexts<extra></extra>",
        ), row=1, col=1)
        if paper and all(method in paper[L] for L in paper):
            paper_lengths = sorted(paper)
            fig.add_trace(go.Scatter(
                x=paper_lengths, y=[paper[L][method] for L in paper_lengths], mode="lines+markers",
                name=f"{method_label(method)} (paper)", legendgroup=method, showlegend=False,
                line=dict(color=method_color(method, i), dash="dash"), marker=dict(symbol="circle-open", size=9),
            ), row=1, col=2)
    if trained_to is not None:
        mark_training(fig, trained_to)
    fig.update_xaxes(title_text=x_title, type="log")
    fig.update_yaxes(title_text="tau (tokens per round, bonus included)", col=1)
    fig.update_layout(**title_layout(scale_title("tau = E[tokens per round]", scale), top=SUBPLOT_TOP),
                      template="plotly_white",
                      legend=dict(orientation="h", y=-0.25))
    return fig


def mark_training(fig: go.Figure, trained_to: int) -> None:
    """A dotted line at `trained_to` on the first panel: to its right L + G runs past the windows the
    target and drafts were trained on."""
    fig.add_vline(x=trained_to, line=dict(color="#7f7f7f", dash="dot"), row=1, col=1,
                  annotation_text="past the training windows →", annotation_position="top right")


def target_loss_figure(losses: Mapping[int, LossStats], trained_to: int, scale: str = "") -> go.Figure:
    """The target's loss on the G tokens after a context of L tokens (95% CI over contexts) against
    L, the training windows' end marked as in `tau_figure`: does the target itself give out there?"""
    lengths = sorted(losses)
    fig = make_subplots(rows=1, cols=1)
    fig.add_trace(go.Scatter(
        x=lengths, y=[losses[L].mean for L in lengths], mode="lines+markers", name=method_label("target"),
        line=dict(color=method_color("target")),
        error_y=dict(type="data", array=[losses[L].ci95 for L in lengths], visible=True),
        customdata=[[losses[L].n_contexts] for L in lengths],
        hovertemplate="L = %{x}<br>loss = %{y:.3f} ± %{error_y.array:.3f} nats<br>%{customdata[0]} contexts"
                      "<extra></extra>"), row=1, col=1)
    mark_training(fig, trained_to)
    fig.update_xaxes(title_text="context length L", type="log")
    fig.update_yaxes(title_text="target's loss on the continuation (nats/token)")
    fig.update_layout(**title_layout(scale_title("The target past its training windows", scale)),
                      template="plotly_white")
    return fig


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (NaNs without trials)."""
    if trials == 0:
        return math.nan, math.nan
    p = successes / trials
    center = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return center - half, center + half


def per_position_figure(stats: Stats, scale: str = "") -> go.Figure:
    """P[draft j accepted | drafts 1..j-1 accepted] against j, one panel per context length,
    with 95% Wilson intervals from the counts (rounds are treated as independent trials)."""
    lengths = sorted({L for by_length in stats.values() for L in by_length})
    fig = make_subplots(rows=1, cols=len(lengths), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"L = {L}" for L in lengths])
    for i, (method, by_length) in enumerate(stats.items()):
        for col, L in enumerate(lengths, start=1):
            if L not in by_length:
                continue
            s = by_length[L]
            j = list(range(1, len(s.per_position) + 1))
            bounds = [wilson_interval(a, n) for a, n in zip(s.accepted_at, s.reached)]
            fig.add_trace(go.Scatter(
                x=j, y=list(s.per_position), mode="lines+markers", name=method_label(method), legendgroup=method,
                showlegend=col == 1, line=dict(color=method_color(method, i)),
                error_y=dict(type="data", symmetric=False, visible=True,
                             array=[hi - p for (_, hi), p in zip(bounds, s.per_position)],
                             arrayminus=[p - lo for (lo, _), p in zip(bounds, s.per_position)]),
                customdata=list(zip(s.accepted_at, s.reached)),
                hovertemplate="draft %{x}: %{y:.3f}<br>%{customdata[0]} of %{customdata[1]} rounds<extra></extra>",
            ), row=1, col=col)
    fig.update_xaxes(title_text="draft position j", dtick=1)
    fig.update_yaxes(title_text="P[accepted | reached]", range=[0, 1.08], col=1)  # room for the top error bars
    fig.update_layout(**title_layout(scale_title("Per-position acceptance", scale), top=SUBPLOT_TOP),
                      template="plotly_white",
                      legend=dict(orientation="h", y=-0.25))
    return fig
