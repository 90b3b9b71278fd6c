"""Plotly figures for training runs: loss curves and throughput from the trainer's metrics log.

Builders take metrics logs (`TrainResult.metrics`: lists of {"kind": "train"|"val", ...})
and return `go.Figure`s; they compute nothing but the plotted series. `scale` is a short
note of the model and data scale, shown in the title (every figure says its scale).
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from spirelib.throughput.methods import color, label
from spirelib.workbook.plots.perf import SUBPLOT_TOP, scale_title, title_layout


def _series(metrics: list[dict], kind: str, key: str) -> tuple[list[int], list[float]]:
    rows = [m for m in metrics if m["kind"] == kind and key in m]
    return [m["tokens"] for m in rows], [m[key] for m in rows]


def loss_curves(runs: Mapping[str, list[dict]], scale: str = "", log_x: bool = False) -> go.Figure:
    """Training loss (lines) and validation loss (markers) against tokens seen, one colour per run:
    a run named by a method key ("target", "vanilla", "spire") in that method's colour everywhere."""
    fig = go.Figure()
    for i, (key, metrics) in enumerate(runs.items()):
        name, run_color = label(key), color(key, i)
        x, y = _series(metrics, "train", "loss")
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{name} train", line=dict(color=run_color)))
        x, y = _series(metrics, "val", "val_loss")
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"{name} validation",
                                 line=dict(color=run_color, dash="dot"), marker=dict(size=8)))
    fig.update_layout(**title_layout(scale_title("Cross-entropy (nats/token)", scale), top=SUBPLOT_TOP),
                      xaxis_title="training tokens", yaxis_title="loss (nats/token)", template="plotly_white",
                      legend=dict(orientation="h", y=-0.2))
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def training_dashboard(metrics: list[dict], scale: str = "") -> go.Figure:
    """Three panels over training tokens: loss (train, validation), learning rate, tokens/s."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("loss (nats/token)", "learning rate", "tokens/s"))
    x, y = _series(metrics, "train", "loss")
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="train loss"), row=1, col=1)
    x, y = _series(metrics, "val", "val_loss")
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name="validation loss"), row=1, col=1)
    x, y = _series(metrics, "train", "lr")
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="learning rate"), row=2, col=1)
    x, y = _series(metrics, "train", "tokens_per_s")
    fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="tokens/s"), row=3, col=1)
    fig.update_xaxes(title_text="training tokens", row=3, col=1)
    fig.update_layout(**title_layout(scale_title("Training run", scale), top=SUBPLOT_TOP), template="plotly_white",
                      height=700, showlegend=True, legend=dict(orientation="h", y=-0.1))
    return fig


def draft_training_figure(runs: Mapping[str, list[dict]], k: int, scale: str = "") -> go.Figure:
    """SPIRe draft training (method §3.7): distillation CE(p, q) and cross-entropy with the data
    (left), and alpha = E[sum_i min(p_i, q_i)] per draft position j = 1..k (right), the
    training-time estimate of P[draft j accepted | drafts before it accepted]. Lines are
    training intervals, markers validation. Colour is the quantity, line style the run: the
    legend has one entry per quantity (click to hide it in every run) and one per run, so it
    stays short however many runs there are (05 has six)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("losses (nats/token)", "alpha per draft position"))
    dashes = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
    quantities = [("distill_ce", "distillation CE(p, q)", 1), ("hard_ce", "CE with data", 1)]
    quantities += [(f"alpha_{j}", f"alpha_{j}", 2) for j in range(1, k + 1)]
    palette = qualitative.Plotly
    runs = {label(name): metrics for name, metrics in runs.items()}  # "random_init" -> "random init"
    for r, (name, metrics) in enumerate(runs.items()):
        dash = dashes[r % len(dashes)]
        for i, (key, text, col) in enumerate(quantities):
            shade = palette[(i + 1 if i >= 2 else i) % len(palette)]
            for kind, mode in (("train", "lines"), ("val", "markers")):
                x, y = _series(metrics, kind, key)
                fig.add_trace(go.Scatter(x=x, y=y, mode=mode, name=f"{name}: {text} ({kind})", legendgroup=key,
                                         showlegend=False, line=dict(color=shade, dash=dash),
                                         marker=dict(color=shade, size=7),
                                         hovertemplate=f"{name}: {text} ({kind})<br>%{{x}} tokens: %{{y:.3f}}"
                                                       "<extra></extra>"), row=1, col=col)
    for i, (key, text, _) in enumerate(quantities):  # legend keys: colour = quantity
        shade = palette[(i + 1 if i >= 2 else i) % len(palette)]
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=text, legendgroup=key,
                                 legendgrouptitle_text="quantity" if i == 0 else None, line=dict(color=shade)))
    if len(runs) > 1:
        for r, name in enumerate(runs):  # legend keys: line style = run
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=name, legendgroup=f"run:{name}",
                                     legendgrouptitle_text="run" if r == 0 else None,
                                     line=dict(color="#444", dash=dashes[r % len(dashes)])))
    fig.update_xaxes(title_text="training tokens")
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(**title_layout(scale_title("Draft training: lines training, markers validation", scale),
                                     top=SUBPLOT_TOP),
                      template="plotly_white", height=520, legend=dict(tracegroupgap=4))
    return fig


def learning_curves_figure(curves: Mapping[str, Mapping[str, list[tuple[int, float]]]], scale: str = "") -> go.Figure:
    """Small multiples of learning curves, one panel per quantity (`curves`: panel title -> run ->
    [(training tokens, value)], e.g. from `measure.ablations.learning_curve`), one line per run in
    its method colour (`methods.color`) in every panel, one legend entry per run."""
    panels = list(curves)
    fig = make_subplots(rows=1, cols=len(panels), horizontal_spacing=0.1, subplot_titles=panels)
    names: list[str] = []
    for col, panel in enumerate(panels, 1):
        for name, points in curves[panel].items():
            if name not in names:
                names.append(name)
            x, y = [p[0] for p in points], [p[1] for p in points]
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=label(name), legendgroup=name,
                                     showlegend=col == 1, line=dict(color=color(name, names.index(name))),
                                     hovertemplate=f"{label(name)}: %{{y:.3f}} at %{{x:,}} tokens<extra></extra>"),
                          row=1, col=col)
    fig.update_xaxes(title_text="training tokens")
    fig.update_layout(**title_layout(scale_title("Learning curves on the validation windows (step 0 first)", scale),
                                     top=SUBPLOT_TOP),
                      template="plotly_white", height=460, legend=dict(orientation="h", y=-0.25))
    return fig
