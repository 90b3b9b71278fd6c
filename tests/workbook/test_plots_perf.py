"""Figure builders and explorers show exactly what the model computes."""

import dataclasses
import math
import re

import numpy as np
import pytest

from spirelib.throughput import perfmodel as pm
from spirelib.throughput.hardware import HARDWARE
from spirelib.workbook.plots.explorer import HOI_STEP, MANUAL_HOI, LiveExplorer, Scenario, slider_figure
from spirelib.workbook.plots.perf import heatmap_figure, pow2_label, slice_figure

B = 2 ** np.arange(0, 8)
L = 2 ** np.arange(5, 14)


def paper_tm(method, b, l, **kw):
    return pm.throughput_multiplier(method, pm.PAPER_TAU[512][method], b, l, "seqax-67m",
                                    pm.PAPER_DRAFTS["seqax-67m"].get(method), **kw)


def test_pow2_labels():
    assert [pow2_label(v) for v in (8, 512, 1024, 65536, 2**20, 1536)] == ["8", "512", "1K", "64K", "1M", "1536"]


def test_heatmap_outlines_the_highlighted_cell_only_when_it_is_on_the_grid():
    grids = {m: paper_tm(m, B[:, None], L[None, :]) for m in pm.MODELED_METHODS}
    fig = heatmap_figure(B, L, grids, title="t")
    assert len(fig.data) == 3 and len(fig.layout.shapes) == 3
    assert np.array_equal(fig.data[2].z, grids["spire"])
    assert len(heatmap_figure(B, L, grids, title="t", highlight=(64, 600)).layout.shapes) == 0
    with pytest.raises(ValueError, match="shape"):
        heatmap_figure(B, L[:-1], grids, title="t")


def test_heatmap_takes_a_named_colorscale_and_range_for_grids_that_are_not_multipliers():
    grid = {"spire": np.ones((len(B), len(L))) * 3}
    gain = heatmap_figure(B, L, grid, title="t").layout.coloraxis
    depth = heatmap_figure(B, L, grid, title="t", colorscale="Viridis", zrange=(1, 12)).layout.coloraxis
    assert (depth.cmin, depth.cmax) == (1, 12) and depth.colorbar.title.text == gain.colorbar.title.text
    assert depth.colorscale[0][1] == "#440154" and gain.colorscale != depth.colorscale


def test_slice_figure_keeps_series_order_and_values():
    fig = slice_figure(L, {"spire": paper_tm("spire", 64, L), "no_feedback": np.ones(len(L)), "custom_key": np.ones(len(L))},
                       title="t")
    assert [t.name for t in fig.data] == ["SPIRe", "no feedback", "custom_key"]  # display names; unknown keys as given
    assert np.array_equal(fig.data[0].y, paper_tm("spire", 64, L))


def test_slice_figure_draws_dashed_variants_in_their_main_lines_colours():
    fig = slice_figure(L, {"spire": np.ones(len(L)), "magicdec": np.ones(len(L))}, title="t",
                       dashed={"SPIRe (G = 64)": np.zeros(len(L)), "MagicDec (G = 64)": np.zeros(len(L))})
    assert [t.name for t in fig.data] == ["SPIRe", "MagicDec", "SPIRe (G = 64)", "MagicDec (G = 64)"]
    assert [t.line.dash for t in fig.data] == [None, None, "dash", "dash"]
    assert fig.data[2].line.color == fig.data[0].line.color != fig.data[3].line.color == fig.data[1].line.color


def test_slice_figure_takes_a_y_range():
    assert slice_figure(L, {"spire": np.ones(len(L))}, title="t").layout.yaxis.range is None
    assert slice_figure(L, {"spire": np.ones(len(L))}, title="t", y_range=(-0.5, 0.7)).layout.yaxis.range == (-0.5, 0.7)


def test_slice_figure_hovers_a_multiplier_with_x_and_a_tau_without():
    tm = slice_figure(L, {"spire": np.ones(len(L))}, title="t").data[0].hovertemplate
    assert tm.endswith(": %{y:.3f}x<extra></extra>")
    tau = slice_figure(L, {"guided": np.ones(len(L))}, title="t", unit="").data[0].hovertemplate
    assert tau.endswith(": %{y:.3f}<extra></extra>")


def test_slider_figure_shows_one_batch_at_a_time():
    fig = slider_figure(Scenario.paper(), batch_sizes=B, contexts=L)
    assert len(fig.data) == len(B) * 3
    steps = fig.layout.sliders[0].steps
    for i, step in enumerate(steps):
        visible = step.args[0]["visible"]
        assert sum(visible) == 3 and all(visible[3 * i: 3 * i + 3])
    start = fig.layout.sliders[0].active
    assert B[start] == 64
    shown = [t for t in fig.data if t.visible]
    assert np.allclose(shown[2].y, paper_tm("spire", 64, L))


def test_views_start_at_the_default_cell_when_asked_for_an_off_grid_one():
    explorer = LiveExplorer(Scenario.paper(), B=3, L=100)
    assert (explorer.batch.value, explorer.context.value) == (64, 512)
    explorer = LiveExplorer(Scenario.paper(), B=256, L=64)
    assert (explorer.batch.value, explorer.context.value) == (256, 64)
    fig = slider_figure(Scenario.paper(), batch_sizes=B, contexts=L, start_batch=1024)  # B stops at 128
    assert B[fig.layout.sliders[0].active] == 64
    with pytest.raises(ValueError, match="nor is the default"):
        LiveExplorer(Scenario.paper(), B=3, batch_sizes=[1, 2])


def test_trained_scenario_prunes_the_target_for_spire_and_fixes_its_window():
    from spirelib.model.config import ModelConfig

    target = ModelConfig(vocab_size=64, num_layers=4, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)
    vanilla = dataclasses.replace(target, num_layers=2, d_model=16, d_head=4, d_ff=32)
    s = Scenario.trained(target, vanilla, 1, 16, {"spire": 3.0}, hoi=50.0)
    assert s.target == target.shape() and s.drafts == {"vanilla": vanilla.shape(),
                                                       "spire": dataclasses.replace(target, num_layers=1).shape(),
                                                       "eagle3": dataclasses.replace(target, num_layers=1).shape()}
    assert (s.window, s.window_factor, s.hoi, s.taus) == (16, None, 50.0, {"spire": 3.0})


def test_scenario_with_mixed_lengths_uses_the_distribution():
    scenario = dataclasses.replace(Scenario.paper(), length_spread=1.0, seed=5)
    got = scenario.multipliers(64, 512)["spire"]
    assert got == pytest.approx(paper_tm("spire", 64, pm.LengthDistribution(512, 1.0, seed=5)))


def test_live_explorer_follows_its_controls():
    explorer = LiveExplorer(Scenario.paper(), hardware=HARDWARE)
    fig = explorer.figure()
    assert np.allclose(fig.data[4].y, paper_tm("spire", 64, explorer.contexts))
    explorer.device.value = "h200 bf16"
    assert explorer.hoi.value == pytest.approx(HARDWARE["h200"].hoi("bf16"))
    assert explorer.current().bytes_per_value == 2.0
    explorer.hoi.value = 50.0
    assert explorer.device.value.startswith("(") and explorer.current().bytes_per_value == 1.0
    explorer.sparse.value = False
    assert explorer.current().window_factor is None
    explorer.k.value = 2
    assert explorer.taus["magicdec"].value == 3.0  # tau can not exceed k + 1
    assert "Best" in explorer.summary_html()


def snapped(value, step=HOI_STEP):
    """What the browser writes back for a log slider given `value`: the nearest step."""
    return 10 ** (round(math.log10(value) / step) * step)


def test_hardware_choice_survives_the_slider_snapping_its_hoi():
    explorer = LiveExplorer(Scenario.paper(), B=1024, L=64, hardware=HARDWARE)
    explorer.hoi.value = snapped(600.0)  # the first render snaps the notebook's 600
    assert explorer.current().hoi == 600.0
    explorer.device.value = "h100-sxm bf16"
    explorer.hoi.value = snapped(HARDWARE["h100-sxm"].hoi("bf16"))  # ~0.4 s later, from the browser
    assert explorer.device.value == "h100-sxm bf16"
    scenario = explorer.current()
    assert scenario.hoi == HARDWARE["h100-sxm"].hoi("bf16") and scenario.bytes_per_value == 2.0
    want = pm.throughput_multiplier("spire", pm.PAPER_TAU[512]["spire"], 1024, 64, "seqax-67m", "spire-draft",
                                    hoi=scenario.hoi, bytes_per_weight=2.0, bytes_per_kv=2.0)
    assert f"SPIRe <b>{float(want):.2f}x</b>" in explorer.summary_html()
    assert "h100-sxm bf16" in explorer.summary_html() and "2 byte per value" in explorer.summary_html()
    explorer.hoi.value = snapped(explorer.hoi.value * 1.5)  # a real move is a hand-set HOI
    assert explorer.device.value == MANUAL_HOI and explorer.current().bytes_per_value == 1.0


def test_lowering_k_caps_tau_and_raising_it_gives_it_back():
    explorer = LiveExplorer(Scenario.paper())
    explorer.k.value = 2
    assert explorer.taus["magicdec"].value == 3.0 and explorer.taus["spire"].value == 3.0
    explorer.k.value = 4
    assert explorer.taus["magicdec"].value == pytest.approx(3.891)
    assert explorer.taus["spire"].value == pytest.approx(3.401)
    explorer.taus["spire"].value = 2.5  # a tau set by hand is what comes back
    explorer.k.value = 1
    explorer.k.value = 6
    assert explorer.taus["spire"].value == 2.5 and explorer.taus["spire"].max == 7.0


def test_sliders_redraw_on_release():
    explorer = LiveExplorer(Scenario.paper())
    sliders = [explorer.batch, explorer.context, explorer.k, explorer.hoi, explorer.spread, *explorer.taus.values()]
    assert all(s.continuous_update is False for s in sliders)


def test_winner_figure_names_the_best_method_and_ad_where_nothing_gains():
    from spirelib.workbook.plots.perf import winner_figure

    grids = {"spire": np.array([[2.0, 0.5]]), "vanilla": np.array([[1.5, 0.8]])}
    fig = winner_figure([64], [512, 1024], grids, title="t")
    heat = fig.data[0]
    assert heat.z.tolist() == [[0, 2]]  # SPIRe wins the first cell, AD the second
    assert heat.text[0][0].startswith("SPIRe") and heat.text[0][1].startswith("AD")


def test_long_titles_wrap_inside_the_figure_and_get_room_above_the_plot():
    from spirelib.workbook.plots.perf import TITLE_WIDTH, winner_figure, wrap_title

    title = ("Best method per (B, L): paper shapes, taus measured in this run by notebook 04 at L = 64, "
             "mixed lengths (sigma 1)")
    grids = {m: paper_tm(m, B[:, None], L[None, :]) for m in pm.MODELED_METHODS}
    fig = winner_figure(B, L, grids, title=title)
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) == 2 and all(len(line) <= TITLE_WIDTH for line in lines)
    assert lines[-1].endswith("mixed lengths (sigma 1)")  # the suffix is shown, not cut at the edge
    assert fig.layout.margin.t >= 30 + 2 * 24
    short = winner_figure(B, L, grids, title="short")
    assert fig.layout.margin.t > short.layout.margin.t
    scale = "target 2x64 (74k body params, 81.9k training tokens), vanilla draft 1x32 " * 3
    wrapped, big, small = wrap_title(f"tau<br><sup>{scale.strip()}</sup>")
    assert big == 1 and small >= 2 and wrapped.count("<sup>") == small
    assert all(len(re.sub("<[^>]+>", "", line)) <= int(TITLE_WIDTH * 1.4) for line in wrapped.split("<br>"))


def test_tables_and_legends_show_display_names():
    from spirelib.workbook.display import markdown_table

    table = markdown_table([{"scale": "paper shapes", "magicdec": 2.0, "winner": "magicdec"}]).data
    assert "| scale | MagicDec | winner |" in table and "| paper shapes | 2.000 | MagicDec |" in table
    assert "magicdec" not in table


def test_draft_training_legend_stays_short_for_six_runs():
    from spirelib.workbook.plots.training import draft_training_figure

    metrics = [{"kind": kind, "tokens": t, "distill_ce": 3.0, "hard_ce": 3.1, **{f"alpha_{j}": 0.5 for j in (1, 2, 3, 4)}}
               for t in (10, 20) for kind in ("train", "val")]
    runs = {name: metrics for name in ("spire", "random_init", "distill_only", "hard_target", "no_feedback",
                                       "no_feedback_no_target_acts")}
    fig = draft_training_figure(runs, 4, scale="tiny")
    entries = [t.name for t in fig.data if t.showlegend is not False]
    assert len(entries) == 6 + 6  # 2 losses + 4 alphas, then the 6 runs
    assert "random init" in entries and "random_init" not in entries  # display names
    assert len(fig.data) == len(entries) + 6 * 6 * 2  # every curve is still drawn
    assert fig.layout.legend.orientation != "h"  # a vertical legend beside the plots, never over the x axis


def test_ablation_learning_curves_are_small_multiples_in_the_methods_colours():
    from spirelib.throughput.methods import color
    from spirelib.workbook.plots.training import learning_curves_figure

    names = ("spire", "random_init", "distill_only", "hard_target", "no_feedback", "no_feedback_no_target_acts")
    curves = {panel: {n: [(0, 0.1), (10, 0.2 + i / 10)] for i, n in enumerate(names)} for panel in ("alpha", "CE")}
    fig = learning_curves_figure(curves, scale="tiny")
    assert len(fig.data) == 12 and [t.name for t in fig.data if t.showlegend] == [
        "SPIRe", "random init", "distillation only", "hard target", "no feedback",
        "no feedback, no target activations"]  # one legend entry per run, every run shown
    assert all(t.line.color == color(n) for t, n in zip(fig.data, names * 2))
    assert {t.xaxis for t in fig.data} == {"x", "x2"} and fig.layout.legend.orientation == "h"


def test_ablation_bars_one_colour_and_legend_entry_per_variant_and_no_label_on_the_error_bars():
    from spirelib.throughput.methods import color
    from spirelib.throughput.recorded_ablations import RecordedDelta
    from spirelib.workbook.plots.ablations import delta_figure

    deltas = {"random_init": RecordedDelta(-0.3, 0.1, resolved=True),
              "no_feedback": RecordedDelta(0.01, 0.05, resolved=False)}
    fig = delta_figure(deltas, {"random_init": -0.5}, scale="tiny")
    bars = [t for t in fig.data if t.type == "bar"]
    assert [b.name for b in bars] == ["random init", "no feedback"]
    assert [b.marker.color for b in bars] == [color("random_init"), color("no_feedback")]
    assert all(not b.text for b in bars)  # no text above a bar, where its error bar is
    assert list(bars[1].x) == ["no feedback<br>(not resolved)"]


def test_training_losses_draw_each_method_in_its_own_colour():
    from spirelib.throughput.methods import color
    from spirelib.workbook.plots.training import loss_curves

    metrics = [{"kind": "train", "tokens": 1, "loss": 3.0}, {"kind": "val", "tokens": 1, "val_loss": 3.1}]
    fig = loss_curves({"target": metrics, "vanilla": metrics}, scale="tiny")
    assert [t.line.color for t in fig.data] == [color("target")] * 2 + [color("vanilla")] * 2
    assert color("vanilla") != color("spire")  # 03 drew the vanilla draft in SPIRe's red


def test_subplot_titles_get_room_below_a_wrapped_title():
    """plotly centres a title in the top margin, so a figure with subplot titles needs SUBPLOT_TOP
    pixels under it, or the last line of the scale note runs into the panels' titles (04, 05)."""
    from types import SimpleNamespace

    from spirelib.workbook.plots.decoding import tau_figure
    from spirelib.workbook.plots.perf import SUBPLOT_TOP, title_layout
    from spirelib.workbook.plots.training import learning_curves_figure

    scale = "target 2x64 (74k body params, 81.9k training tokens), vanilla draft 1x32 " * 3
    stats = {"spire": {32: SimpleNamespace(mean=4.0, ci95=0.2, n_contexts=6)}}
    plain = title_layout(f"t<br><sup>{scale}</sup>")["margin"]["t"]
    assert SUBPLOT_TOP >= 100
    for fig in (tau_figure(stats, None, scale=scale), learning_curves_figure({"a": {"spire": [(0, 1.0)]}}, scale)):
        assert fig.layout.margin.t >= plain + SUBPLOT_TOP - 30  # the title's lines plus the room
