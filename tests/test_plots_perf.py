"""Figure builders and explorers show exactly what the model computes."""

import dataclasses

import numpy as np
import pytest

from spirelib import perfmodel as pm
from spirelib.hardware import HARDWARE
from spirelib.plots.explorer import LiveExplorer, Scenario, slider_figure
from spirelib.plots.perf import heatmap_figure, pow2_label, slice_figure

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


def test_slice_figure_keeps_series_order_and_values():
    fig = slice_figure(L, {"spire": paper_tm("spire", 64, L), "no_feedback": np.ones(len(L)), "custom_key": np.ones(len(L))},
                       title="t")
    assert [t.name for t in fig.data] == ["SPIRe", "no feedback", "custom_key"]  # display names; unknown keys as given
    assert np.array_equal(fig.data[0].y, paper_tm("spire", 64, L))


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


def test_winner_figure_names_the_best_method_and_ad_where_nothing_gains():
    from spirelib.plots.perf import winner_figure

    grids = {"spire": np.array([[2.0, 0.5]]), "vanilla": np.array([[1.5, 0.8]])}
    fig = winner_figure([64], [512, 1024], grids, title="t")
    heat = fig.data[0]
    assert heat.z.tolist() == [[0, 2]]  # SPIRe wins the first cell, AD the second
    assert heat.text[0][0].startswith("SPIRe") and heat.text[0][1].startswith("AD")
