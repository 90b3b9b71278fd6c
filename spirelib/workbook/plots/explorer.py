"""Explore the throughput model interactively (method §2): which draft wins at which (B, L)?

A `Scenario` (`throughput.scenarios`) says what is compared. Two views of a scenario:

- `LiveExplorer(scenario).widget`: an ipywidgets panel that redraws live in JupyterLab;
- `slider_figure(scenario)`: a plotly figure with a batch-size slider, interactive in HTML.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go
from IPython.display import Markdown, clear_output, display

from spirelib.frontend import live_frontend
from spirelib.throughput.hardware import Hardware
from spirelib.throughput.methods import color as _color
from spirelib.throughput.methods import label as _label
from spirelib.throughput.scenarios import Scenario
from spirelib.workbook.plots.perf import TM_TITLE, pow2_label, title_layout
from spirelib.workbook.templating import render

DEFAULT_BATCHES = 2 ** np.arange(0, 11)  # 1 .. 1024
DEFAULT_CONTEXTS = 2 ** np.arange(3, 21)  # 8 .. 1M
MANUAL_HOI = "(set HOI by hand)"
K_MAX = 8  # the largest draft depth the explorer offers
HOI_STEP = 0.001  # the HOI slider's step in log10 (0.23%)
DEFAULT_B, DEFAULT_L = 64, 512  # the paper's headline cell (method §2), where a view starts when asked for an off-grid one


def _on_grid(value: int, grid, default: int, name: str) -> int:
    """`value` when it is on `grid`, else `default` (a notebook's highlighted cell may lie off a
    view's grid); ValueError when the default is off the grid too."""
    if value in grid:
        return value
    if default not in grid:
        raise ValueError(f"{name} {value} is not one of {list(grid)}, nor is the default {default}")
    return default


def slider_figure(scenario: Scenario, *, batch_sizes=DEFAULT_BATCHES[:8], contexts=DEFAULT_CONTEXTS[:11],
                  start_batch: int = 64, title: str | None = None) -> go.Figure:
    """Throughput multiplier vs context, one curve per method, with a slider over batch size.

    Every slider position is precomputed, so the figure stays interactive in static HTML. A
    `start_batch` off `batch_sizes` starts at B = 64 (the paper's batch).
    """
    batch_sizes, contexts = np.asarray(batch_sizes), np.asarray(contexts)
    start_batch = _on_grid(start_batch, batch_sizes, DEFAULT_B, "start_batch")
    grids = scenario.multipliers(batch_sizes[:, None], contexts[None, :])  # method -> (nB, nL)
    methods = list(grids)
    start = int(np.flatnonzero(batch_sizes == start_batch)[0])
    fig = go.Figure()
    for i, _ in enumerate(batch_sizes):
        for j, method in enumerate(methods):
            fig.add_trace(go.Scatter(x=contexts, y=grids[method][i], name=_label(method), mode="lines+markers",
                                     line=dict(color=_color(method, j)), visible=i == start, legendgroup=method,
                                     hovertemplate=f"{_label(method)}<br>L=%{{x}}: %{{y:.3f}}x<extra></extra>"))
    steps = []
    for i, b in enumerate(batch_sizes):
        visible = [k // len(methods) == i for k in range(len(fig.data))]
        steps.append(dict(method="update", label=pow2_label(b), args=[{"visible": visible}]))
    top = max(float(np.max(g)) for g in grids.values())
    fig.add_hline(y=1.0, line=dict(color="gray", dash="dot"))
    fig.update_xaxes(type="log", title="context length L (tokens)", tickvals=list(contexts),
                     ticktext=[pow2_label(c) for c in contexts])
    fig.update_yaxes(title=TM_TITLE, range=[0, top * 1.08])
    layout = title_layout(title or f"Throughput multiplier vs context: drag the batch size ({scenario.label})",
                          top=50)  # the legend sits above the plot
    fig.update_layout(
        **layout, sliders=[dict(active=start, currentvalue=dict(prefix="batch B = "), pad=dict(t=50), steps=steps)],
        legend=dict(orientation="h", y=1.02, yanchor="bottom"), height=500 + layout["margin"]["t"])
    return fig


class LiveExplorer:
    """An ipywidgets panel over a `Scenario`: B, L, k, HOI (or a hardware entry), tau per
    method, overlap, sparse KV and length spread; redraws the two slices through (B, L).

    Display it (last expression of a cell, or `display(explorer)`) to draw it. A B or L off the
    grids starts the sliders at (64, 512).
    """

    def __init__(self, scenario: Scenario, *, B: int = DEFAULT_B, L: int = DEFAULT_L, batch_sizes=DEFAULT_BATCHES,
                 contexts=DEFAULT_CONTEXTS, hardware: Mapping[str, Hardware] | None = None):
        self.scenario = scenario
        self.batch_sizes, self.contexts = np.asarray(batch_sizes), np.asarray(contexts)
        B = _on_grid(B, self.batch_sizes, DEFAULT_B, "B")  # an off-grid B or L starts at the default cell
        L = _on_grid(L, self.contexts, DEFAULT_L, "L")
        style = dict(description_width="110px")
        layout = w.Layout(width="380px")
        slider = dict(style=style, layout=layout, continuous_update=False)  # redraw on release, not per step
        self.batch = w.SelectionSlider(options=[(pow2_label(b), int(b)) for b in self.batch_sizes], value=B,
                                       description="batch B", **slider)
        self.context = w.SelectionSlider(options=[(pow2_label(c), int(c)) for c in self.contexts], value=L,
                                         description="context L", **slider)
        self.k = w.IntSlider(scenario.k, min=1, max=K_MAX, description="draft depth k", **slider)
        # The slider moves in steps of HOI_STEP in log10; the HOI used is `_hoi`, exact: a device's, or the
        # notebook's, or where the reader dragged the slider (a move of less than half a step is the
        # browser snapping the value to its step, not a choice).
        self._hoi = float(scenario.hoi)
        self.hoi = w.FloatLogSlider(scenario.hoi, base=10, min=0.5, max=3.5, step=HOI_STEP, readout_format=".0f",
                                    description="HOI (FLOP/B)", **slider)
        self.device_options = {MANUAL_HOI: None}
        for name, device in (hardware or {}).items():
            for dtype in device.peak_flops:
                self.device_options[f"{name} {dtype}"] = (device, dtype)
        self.device = w.Dropdown(options=list(self.device_options), description="hardware", style=style,
                                 layout=layout)
        # The tau each slider was set to: lowering k caps the sliders at k + 1, raising it gives these back.
        self._tau_wanted = {m: float(t) for m, t in scenario.taus.items()}
        self.taus = {m: w.FloatSlider(min(t, scenario.k + 1.0), min=1.0, max=scenario.k + 1.0, step=0.01,
                                      description=f"tau {_label(m)}", **slider) for m, t in scenario.taus.items()}
        self.overlap = w.Checkbox(scenario.overlap, description="overlap (f = max)")
        self.sparse = w.Checkbox(scenario.window_factor is not None or scenario.window is not None,
                                 description="sparse draft KV cache")
        self.spread = w.FloatSlider(scenario.length_spread, min=0.0, max=2.0, step=0.1,
                                    description="length spread", **slider)
        self.summary = w.HTML()
        self.output = w.Output()
        controls = [self.batch, self.context, self.k, self.hoi, self.device, *self.taus.values(), self.spread,
                    self.overlap, self.sparse]
        for control in controls:
            control.observe(self._on_change, names="value")
        half = (len(controls) + 1) // 2
        self.widget = w.VBox([w.HBox([w.VBox(controls[:half]), w.VBox(controls[half:])]), self.summary, self.output])
        self._syncing = False

    def _ipython_display_(self) -> None:
        if not live_frontend():  # a headless run: no one to drive the controls
            display(Markdown("*The live explorer appears when this notebook runs in JupyterLab; "
                             "the slider figure below stays interactive in this report.*"))
            return
        display(self.widget)
        self.redraw()

    def current(self) -> Scenario:
        """The scenario the controls describe now."""
        base = self.scenario
        choice = self.device_options[self.device.value]
        scenario = dataclasses.replace(
            base, k=self.k.value, hoi=self._hoi, overlap=self.overlap.value, length_spread=self.spread.value,
            taus={m: min(s.value, self.k.value + 1.0) for m, s in self.taus.items()},
            window_factor=base.window_factor if self.sparse.value else None,
            window=base.window if self.sparse.value else None)
        if self.sparse.value and base.window_factor is None and base.window is None:
            scenario = dataclasses.replace(scenario, window_factor=8)
        return scenario if choice is None else scenario.with_hardware(*choice)

    def figure(self) -> go.Figure:
        """Multiplier vs L at the chosen B, and vs B at the chosen L, the chosen point marked.

        Built from plain dicts (no make_subplots / add_vline): a redraw takes milliseconds.
        """
        scenario, B, L = self.current(), self.batch.value, self.context.value
        over_l = scenario.multipliers(B, self.contexts)
        over_b = scenario.multipliers(self.batch_sizes, L)
        data = []
        for j, method in enumerate(over_l):
            line = dict(color=_color(method, j))
            data.append(dict(type="scatter", x=self.contexts, y=over_l[method], name=_label(method), line=line,
                             legendgroup=method, xaxis="x", yaxis="y"))
            data.append(dict(type="scatter", x=self.batch_sizes, y=over_b[method], name=_label(method), line=line,
                             legendgroup=method, showlegend=False, xaxis="x2", yaxis="y2"))

        def axis(values, title, domain):
            return dict(type="log", title=title, domain=domain, tickvals=list(values),
                        ticktext=[pow2_label(v) for v in values])

        def marker(x, axis_name):
            return dict(type="line", xref=axis_name, yref=f"{axis_name.replace('x', 'y')} domain", x0=x, x1=x,
                        y0=0, y1=1, line=dict(dash="dash", color="black", width=1))

        def unity(axis_name):
            return dict(type="line", xref=f"{axis_name} domain", yref=axis_name.replace("x", "y"), x0=0, x1=1,
                        y0=1, y1=1, line=dict(dash="dot", color="gray"))

        titles = [(0.22, f"over context, B = {pow2_label(B)}"), (0.78, f"over batch, L = {pow2_label(L)}")]
        layout = dict(
            xaxis=axis(self.contexts, "context length L", [0, 0.45]),
            xaxis2=axis(self.batch_sizes, "batch B", [0.55, 1]),
            yaxis=dict(title=TM_TITLE), yaxis2=dict(anchor="x2"),
            shapes=[marker(L, "x"), marker(B, "x2"), unity("x"), unity("x2")],
            annotations=[dict(text=t, x=x, y=1.0, xref="paper", yref="paper", yanchor="bottom", showarrow=False)
                         for x, t in titles],
            height=420, margin=dict(t=40), legend=dict(orientation="h", y=-0.25))
        return go.Figure(data=data, layout=layout)

    def summary_html(self) -> str:
        scenario, B, L = self.current(), self.batch.value, self.context.value
        point = {m: float(v) for m, v in scenario.multipliers(B, L).items()}
        best = max(point, key=point.get)
        device = "" if self.device_options[self.device.value] is None else f"{self.device.value}, "
        return render("explorer_summary.html", B=B, L=L, device=device, hoi=scenario.hoi,
                      bytes_per_value=scenario.bytes_per_value, k=scenario.k,
                      cells=[(_label(m), v) for m, v in point.items()],
                      best=_label(best) if point[best] >= 1 else "AD").strip()

    def redraw(self) -> None:
        self.summary.value = self.summary_html()
        with self.output:
            clear_output(wait=True)
            self.figure().show()

    def _on_change(self, change) -> None:
        if self._syncing:  # a control this handler set itself: one redraw at the end
            return
        self._syncing = True
        try:
            owner = change["owner"]
            if owner is self.k:
                top = self.k.value + 1.0
                for method, slider in self.taus.items():
                    slider.max = max(top, slider.min)
                    slider.value = min(self._tau_wanted[method], top)
            elif owner is self.device and self.device_options[self.device.value] is not None:
                device, dtype = self.device_options[self.device.value]
                self._hoi = float(device.hoi(dtype))
                self.hoi.value = self._hoi
            elif owner is self.hoi:
                if abs(math.log10(change["new"]) - math.log10(self._hoi)) <= HOI_STEP / 2 + 1e-9:
                    return  # the slider snapping the value it was given to its step: keep HOI and device
                self._hoi = float(change["new"])
                self.device.value = MANUAL_HOI  # a hand-set HOI belongs to no device
            elif owner in self.taus.values():
                method = next(m for m, slider in self.taus.items() if slider is owner)
                self._tau_wanted[method] = float(change["new"])
        finally:
            self._syncing = False
        self.redraw()
