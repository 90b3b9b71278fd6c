"""Plotly figures for the throughput model (method §2; paper Figures 1, 3, 4, 5, 6).

Builders take computed arrays and return `go.Figure`s (or a Markdown table); they compute
nothing themselves.
Batch sizes and context lengths are powers of two on log2 axes.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from spirelib.throughput.methods import color as _color
from spirelib.throughput.methods import label as _label

TM_TITLE = "throughput multiplier over AD"
TITLE_WIDTH = 80  # characters per title line: plotly never wraps a title, and cuts it at the figure's edge
_SUP = re.compile(r"^<sup>(.*)</sup>$", re.S)


def wrap_title(text: str, width: int = TITLE_WIDTH) -> tuple[str, int, int]:
    """`text` broken at spaces into lines of at most `width` characters (`<sup>` lines, a smaller
    font, at 1.4x that), keeping the `<br>`s it has; also its number of full-size and `<sup>` lines."""
    lines, big, small = [], 0, 0
    for part in text.split("<br>"):
        sup = _SUP.match(part.strip())
        inner = sup.group(1) if sup else part
        wrapped = textwrap.wrap(inner, int(width * 1.4) if sup else width, break_long_words=False) or [""]
        lines += [f"<sup>{line}</sup>" if sup else line for line in wrapped]
        small, big = (small + len(wrapped), big) if sup else (small, big + len(wrapped))
    return "<br>".join(lines), big, small


def scale_title(text: str, scale: str) -> str:
    """A title with its scale note on a line of its own (every figure says at what scale it was made)."""
    return text + (f"<br><sup>{scale}</sup>" if scale else "")


SUBPLOT_TOP = 110  # pixels below a title for subplot titles: plotly centres the title in the margin


def title_layout(text: str, width: int = TITLE_WIDTH, top: int = 30) -> dict:
    """Layout settings for a title that stays inside the figure: wrapped (`wrap_title`), left
    aligned, and a top margin that holds every line above `top` pixels of plot decorations."""
    wrapped, big, small = wrap_title(text, width)
    # plotly centres the title in the top margin (anchoring it at the top cuts a multi-line title off)
    return dict(title=dict(text=wrapped, x=0.01, xanchor="left"), margin=dict(t=top + 24 * big + 22 * small))


def pow2_label(value) -> str:
    """512 -> "512", 4096 -> "4K", 2**20 -> "1M" (whole powers of two keep their exact value)."""
    value = round(float(value))
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def _log2_ticks(values) -> dict:
    values = np.asarray(values)
    return dict(tickvals=list(np.log2(values)), ticktext=[pow2_label(v) for v in values])


# parameters: a figure's options, keyword-only, each with its default
def slice_figure(x, series: dict, *, title: str, x_title: str = "context length L (tokens)",
                 y_title: str = TM_TITLE, highlight_x=None, baseline: float | None = 1.0,
                 baseline_label: str = "autoregressive", x_axis: str = "pow2", dashed: dict | None = None,
                 y_range: tuple[float, float] | None = None, unit: str = "x") -> go.Figure:
    """Lines of `series` (label or method -> values over x) (paper Figures 1, 5, 6); `unit` follows
    each value on hover ("x" for a multiplier, "" for a tau).

    x_axis: "pow2" (log axis ticked at the x values, 1K/1M labels), "log" or "linear".
    dashed: more lines (label -> values), the i-th dashed in the colour of the i-th of `series`
    (a variant of each, e.g. the G-aware model beside the main one). y_range: (low, high) of the
    y axis (default: plotly's, fitted to the lines).
    """
    x = np.asarray(x)
    fig = go.Figure()
    colors = [_color(key, i) for i, key in enumerate(series)]
    lines = [(key, values, dict(color=c)) for (key, values), c in zip(series.items(), colors)]
    lines += [(key, values, dict(color=c, dash="dash")) for (key, values), c in zip((dashed or {}).items(), colors)]
    for key, values, line in lines:
        fig.add_trace(go.Scatter(x=x, y=np.asarray(values), name=_label(key), mode="lines+markers", line=line,
                                 hovertemplate=f"{_label(key)}<br>%{{x}}: %{{y:.3f}}{unit}<extra></extra>"))
    if baseline is not None:
        fig.add_hline(y=baseline, line=dict(color="gray", dash="dot"), annotation_text=baseline_label,
                      annotation_position="bottom right")
    if highlight_x is not None:
        fig.add_vline(x=highlight_x, line=dict(color="black", dash="dash", width=1))
    if x_axis == "pow2":
        fig.update_xaxes(type="log", tickvals=list(x), ticktext=[pow2_label(v) for v in x])
    elif x_axis in ("log", "linear"):
        fig.update_xaxes(type=x_axis)
    else:
        raise ValueError(f"x_axis must be 'pow2', 'log' or 'linear', got {x_axis!r}")
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title)
    fig.update_layout(**title_layout(title), hovermode="x unified", legend=dict(orientation="h", y=-0.2))
    if y_range is not None:
        fig.update_yaxes(range=list(y_range))
    return fig


# parameters: a figure's options, keyword-only, each with its default
def heatmap_figure(B, L, grids: dict, *, title: str, highlight=(64, 512), colorbar_title: str = "TM",
                   decimals: int = 2, center: float = 1.0, colorscale: str | None = None,
                   zrange: tuple[float, float] | None = None) -> go.Figure:
    """One heat map per entry of `grids` (values of shape (len(B), len(L))), shared color scale
    white at `center` (1: no gain), log2 axes, the cell (B, L) = `highlight` outlined (paper
    Figures 4, 6). A named `colorscale` ("Viridis") and `zrange` (cmin, cmax) replace the gain
    scale, for grids that are not multipliers (a best draft depth k)."""
    B, L = np.asarray(B), np.asarray(L)
    keys = list(grids)
    values = [np.asarray(grids[key]) for key in keys]
    for key, grid in zip(keys, values):
        if grid.shape != (len(B), len(L)):
            raise ValueError(f"grid {key!r} has shape {grid.shape}, expected {(len(B), len(L))}")
    zmax = max(float(np.max(v)) for v in values)
    zmin = min(float(np.min(v)) for v in values)
    fig = make_subplots(rows=1, cols=len(keys), subplot_titles=[_label(k) for k in keys],
                        horizontal_spacing=0.06, shared_yaxes=True)
    x, y = np.log2(L), np.log2(B)
    for col, (key, grid) in enumerate(zip(keys, values), start=1):
        fig.add_trace(go.Heatmap(
            x=x, y=y, z=grid, coloraxis="coloraxis", text=np.round(grid, decimals), texttemplate="%{text}",
            customdata=np.broadcast_to(L, grid.shape),
            hovertemplate=f"{_label(key)}<br>B=%{{y}} (log2)<br>L=%{{customdata}}<br>TM=%{{z:.3f}}<extra></extra>",
        ), row=1, col=col)
        fig.update_xaxes(title="context L", row=1, col=col, **_log2_ticks(L))
        if highlight is not None and highlight[0] in B and highlight[1] in L:
            hx, hy = np.log2(highlight[1]), np.log2(highlight[0])
            fig.add_shape(type="rect", x0=hx - 0.5, x1=hx + 0.5, y0=hy - 0.5, y1=hy + 0.5,
                          line=dict(color="black", width=3), row=1, col=col)
    fig.update_yaxes(title="batch B", row=1, col=1, **_log2_ticks(B))
    layout = title_layout(title, top=SUBPLOT_TOP)  # room for the subplot titles
    fig.update_layout(**layout, height=400 + layout["margin"]["t"],
                      coloraxis=gain_coloraxis(zmin, zmax, colorbar_title, center))
    if colorscale is not None:
        fig.update_layout(coloraxis=dict(colorscale=colorscale))
    if zrange is not None:
        fig.update_layout(coloraxis=dict(cmin=zrange[0], cmax=zrange[1]))
    return fig


def winner_figure(B, L, grids: dict, *, title: str, highlight=(64, 512)) -> go.Figure:
    """Which method has the highest throughput multiplier per (B, L) cell, and by how much; a
    cell where every method is below 1 goes to autoregressive decoding ("AD")."""
    B, L = np.asarray(B), np.asarray(L)
    keys = list(grids)
    stack = np.stack([np.asarray(grids[k]) for k in keys])  # (methods, nB, nL)
    best = stack.argmax(axis=0)
    top = stack.max(axis=0)
    names = [_label(k) for k in keys] + ["AD"]
    choice = np.where(top < 1.0, len(keys), best)
    colors = [_color(k, i) for i, k in enumerate(keys)] + ["#bbbbbb"]
    n = len(names)
    scale = [[edge, colors[i]] for i in range(n) for edge in (i / n, (i + 1) / n)]
    text = np.vectorize(lambda c, t: f"{names[c]}<br>{t:.2f}x")(choice, top)
    fig = go.Figure(go.Heatmap(
        x=np.log2(L), y=np.log2(B), z=choice, zmin=-0.5, zmax=n - 0.5, colorscale=scale, text=text,
        texttemplate="%{text}", customdata=np.broadcast_to(L, choice.shape), showscale=False,
        hovertemplate="B=%{y} (log2)<br>L=%{customdata}<br>%{text}<extra></extra>"))
    if highlight is not None and highlight[0] in B and highlight[1] in L:
        hx, hy = np.log2(highlight[1]), np.log2(highlight[0])
        fig.add_shape(type="rect", x0=hx - 0.5, x1=hx + 0.5, y0=hy - 0.5, y1=hy + 0.5, line=dict(color="black", width=3))
    fig.update_xaxes(title="context L", **_log2_ticks(L))
    fig.update_yaxes(title="batch B", **_log2_ticks(B))
    layout = title_layout(title)
    fig.update_layout(**layout, height=440 + layout["margin"]["t"])
    return fig


def gain_coloraxis(zmin: float, zmax: float, title: str, center: float = 1.0) -> dict:
    """A color axis that is white at `center` (1: no gain), red below it and blue above it."""
    lo, hi = min(zmin, center), max(zmax, center + 1e-9)
    mid = (center - lo) / (hi - lo)
    scale = [[0.0, "#b2182b"], [mid, "#f7f7f7"], [1.0, "#2166ac"]] if mid > 0 else [[0.0, "#f7f7f7"], [1.0, "#2166ac"]]
    return dict(colorscale=scale, cmin=lo, cmax=hi, colorbar=dict(title=title))


def intensity_figure(B, intensities: dict, hoi: float, *, title: str) -> go.Figure:
    """Operational intensity of verification vs batch for several contexts, with the HOI line (paper Figure 3)."""
    B = np.asarray(B)
    fig = go.Figure()
    for i, (key, values) in enumerate(intensities.items()):
        name = f"L = {pow2_label(key)}" if np.isscalar(key) and not isinstance(key, str) else str(key)
        fig.add_trace(go.Scatter(x=B, y=np.asarray(values), name=name, mode="lines+markers",
                                 line=dict(color=qualitative.Plotly[i % len(qualitative.Plotly)])))
    fig.add_hline(y=hoi, line=dict(color="black", dash="dash"), annotation_text=f"HOI = {hoi:g}",
                  annotation_position="top left")
    fig.update_xaxes(type="log", title="batch B", tickvals=list(B), ticktext=[pow2_label(b) for b in B])
    fig.update_yaxes(type="log", title="FLOP / byte")
    fig.update_layout(**title_layout(title), legend=dict(orientation="h", y=-0.2))
    return fig


def bar_figure(groups: dict, *, title: str, y_title: str) -> go.Figure:
    """Grouped bars: groups maps a category (x) to {series: value} (hardware, cost tables)."""
    categories = list(groups)
    series = list(dict.fromkeys(s for values in groups.values() for s in values))
    fig = go.Figure()
    for i, key in enumerate(series):
        ys = [groups[c].get(key, np.nan) for c in categories]
        fig.add_trace(go.Bar(x=categories, y=ys, name=_label(key), marker_color=_color(key, i),
                             text=[f"{y:.2f}" for y in ys], textposition="outside"))
    fig.update_layout(**title_layout(title), barmode="group", yaxis_title=y_title,
                      legend=dict(orientation="h", y=-0.2))
    return fig

