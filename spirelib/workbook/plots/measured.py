"""Plotly figures for decoding on the clock (notebook 09): measured speedups against the
paper's model and the profiled cost model. Builders plot what they are given; every figure
says at what scale it was made.
"""

from __future__ import annotations

import plotly.graph_objects as go

from spirelib.throughput.methods import color, label
from spirelib.throughput.recorded import RecordedCell
from spirelib.workbook.plots.perf import scale_title, title_layout


def speedup_scatter(cells: list[RecordedCell], predictions: dict[str, str], scale: str = "") -> go.Figure:
    """Measured SD speedup over AD (y, with its 95% CI) against each prediction (x), one
    marker per cell; `predictions` maps a cell's field (e.g. "modeled_speedup") to its legend name.
    Cells are told apart on hover (method, B, L), so labels never overlap."""
    fig = go.Figure()
    symbols = ("circle-open", "circle", "diamond", "square")
    methods = list(dict.fromkeys(c.method for c in cells))
    for p, (key, name) in enumerate(predictions.items()):
        for i, method in enumerate(methods):
            mine = [c for c in cells if c.method == method and getattr(c, key) is not None]
            fig.add_trace(go.Scatter(
                x=[getattr(c, key) for c in mine], y=[c.measured_speedup for c in mine], mode="markers",
                name=f"{label(method)}, {name}", legendgroup=key,
                marker=dict(color=color(method, i), size=11, symbol=symbols[p % len(symbols)],
                            line=dict(width=2, color=color(method, i))),
                customdata=[[c.B, c.L, "held out" if c.held_out else "fitted"] for c in mine],
                hovertemplate=f"{label(method)} B=%{{customdata[0]}} L=%{{customdata[1]}} (%{{customdata[2]}})"
                              f"<br>{name}: %{{x:.2f}}x"
                              "<br>measured: %{y:.2f}x<extra></extra>",
                error_y=dict(type="data", symmetric=False,
                             array=[c.ci_high - c.measured_speedup for c in mine],
                             arrayminus=[c.measured_speedup - c.ci_low for c in mine])))
    top = 1.1 * max([c.ci_high for c in cells]
                    + [getattr(c, key) for c in cells for key in predictions if getattr(c, key) is not None])
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="prediction exact",
                             line=dict(dash="dot", color="gray")))
    fig.add_hline(y=1.0, line=dict(color="gray", width=1), annotation_text="AD", annotation_position="bottom right")
    fig.update_layout(**title_layout(scale_title("Speedup over AD: measured vs predicted", scale)),
                      xaxis_title="predicted speedup", yaxis_title="measured speedup", template="plotly_white",
                      height=560, legend=dict(orientation="h", y=-0.18))
    return fig
