"""Tables of the throughput model (notebooks 01, 06) hold exactly what perfmodel computes."""

import dataclasses

import numpy as np
import pytest

from spirelib.throughput import intensity, scenarios
from spirelib.throughput import perfmodel as pm
from spirelib.throughput.acceptance import alpha_from_tau, best_k
from spirelib.throughput.scenarios import Scenario
from spirelib.workbook.narrative import perf as words
from spirelib.workbook.tables import perf as tables

PAPER = Scenario.paper()
B = 2 ** np.arange(0, 8)
L = 2 ** np.arange(5, 14)


def test_scenario_model_kwargs_and_mixed_and_uniform():
    on = dataclasses.replace(PAPER, hoi=300.0, window=64)
    assert on.model_kwargs() == dict(k=4, hoi=300.0, overlap=True, window_factor=8, window=64, bytes_per_weight=1.0,
                                     bytes_per_kv=1.0)
    lengths = pm.LengthDistribution(512, 1.0, seed=0).sample(8)
    both = on.mixed_and_uniform(8, lengths)
    assert list(both) == list(PAPER.taus)
    assert both["spire"] == pm.mixed_and_uniform("spire", PAPER.taus["spire"], 8, lengths, "seqax-67m", "spire-draft",
                                                 hoi=300.0, window=64)


def test_shape_rows_one_per_preset():
    rows = tables.shape_rows()
    assert [r["name"] for r in rows] == list(pm.PRESETS)
    first = rows[0]["name"]
    assert rows[0]["body"] == pm.body_params(first) and rows[0]["kv"] == pm.kv_values_per_token(first)
    assert set(tables.SHAPE_COLUMNS) <= set(rows[0])


def test_headline_rows_dt_is_tau_over_tm():
    tm = {"spire": 2.5, "vanilla": 1.25}
    rows = tables.headline_rows({"spire": 3.5, "vanilla": 2.5}, tm, {"spire": 2.78, "vanilla": 1.36})
    assert rows[0] == {"method": "SPIRe", "tau": 3.5, "dt": 1.4, "tm": 2.5, "paper": 2.78}
    assert rows[1]["dt"] == 2.0
    assert tables.headline_rows({"spire": 3.5}, {"spire": 2.5})[0]["paper"] == "(other cell)"


def test_critical_length_rows():
    rows = tables.critical_length_rows(("seqax-67m", "llama3-70b"), 600.0, 4)
    assert [r["target"] for r in rows] == ["seqax-67m", "llama3-70b"]
    assert rows[1]["exact"] == intensity.critical_context_length("llama3-70b", 600.0, 4, exact=True)
    assert rows[0]["grid"] == intensity.critical_context_length("seqax-67m", 600.0, 4)


def test_ablation_rows_best_first():
    rows = tables.ablation_rows({"spire": 2.0, "no_feedback": 2.5, "random_init": 1.0},
                                {"spire": 3.4, "no_feedback": 3.3, "random_init": 3.1})
    assert [r["ablation"] for r in rows] == ["no feedback", "spire", "random init"]
    assert rows[0]["tau"] == 3.3 and rows[0]["tm"] == 2.5


def test_multipliers_over_generation_per_length():
    out = scenarios.multipliers_over_generation(PAPER, 64, [64, 512], 32)  # method -> (2,)
    assert out["spire"].shape == (2,)
    assert out["spire"][1] == pm.throughput_multiplier_over_generation("spire", PAPER.taus["spire"], 64, 512, 32,
                                                                       "seqax-67m", "spire-draft")


def test_relative_change_rows_are_signed_percentages():
    rows = tables.relative_change_rows([8, 16], {"spire": np.array([0.0123, -0.5])}, first="L", header="vs main")
    assert rows == [{"L": 8, "SPIRe: vs main": "+1.2%"}, {"L": 16, "SPIRe: vs main": "-50.0%"}]


def test_device_rows_and_columns():
    cells = [(64, 512), (1024, 64)]
    rows = tables.device_rows(PAPER, cells, dtypes=("fp8",), per_device=1)
    h100 = next(r for r in rows if r["device"] == "h100-sxm fp8")
    on = dataclasses.replace(PAPER, hoi=h100["hoi"], bytes_per_value=1.0)
    assert h100["spire@(1024, 64)"] == float(on.multipliers(1024, 64)["spire"]) and h100["bytes"] == 1
    columns = tables.device_columns(PAPER.taus, cells)
    assert columns["spire@(1024, 64)"] == "SPIRe B=1024 L=64" and set(columns) == set(h100)


def test_best_k_rows_quote_the_best_depth_and_the_scenario_k():
    alpha = {"spire": float(alpha_from_tau(PAPER.taus["spire"], 4))}
    (row,) = tables.best_k_rows(PAPER, alpha, 64, [512], k_max=12)
    k, tm = best_k("spire", alpha["spire"], 64, 512, "seqax-67m", "spire-draft", k_max=12)
    assert row == {"L": 512, "spire": f"k={k}: {tm:.2f}x (k=4: {float(PAPER.multipliers(64, 512)['spire']):.2f}x)"}


def test_best_k_maps_search_the_measured_depth_or_the_cap():
    taus = {"spire": PAPER.taus["spire"], "vanilla": PAPER.taus["vanilla"]}
    best, caps = scenarios.best_k_maps(PAPER, taus, {"spire": [0.9, 0.8, 0.7]}, B[:, None], L[None, :])
    assert caps == {"spire": 3, "vanilla": 8}
    assert best["spire"].shape == (len(B), len(L)) and best["spire"].max() <= 3
    expected, _ = best_k("vanilla", float(alpha_from_tau(taus["vanilla"], 4)), 16, 512, "seqax-67m", "vanilla-draft")
    assert best["vanilla"][4, 4] == expected
    assert scenarios.best_k_maps(PAPER, taus, {}, 64, 512, default_cap=12)[1]["spire"] == 12


def test_window_name():
    assert tables.window_name(PAPER) == "L/8"
    assert tables.window_name(dataclasses.replace(PAPER, window=64)) == "64 tokens"


def test_mixed_length_rows_compare_with_a_uniform_batch():
    rows, change = tables.mixed_length_rows(PAPER, 16, 512, [0.0, 1.0], seed=3)
    assert [(r["window"], r["spread"]) for r in rows] == [("L/8", 0.0), ("L/8", 1.0), ("64 tokens", 0.0),
                                                          ("64 tokens", 1.0)]
    lengths = pm.LengthDistribution(512, 1.0, seed=3).sample(16)
    mixed, uniform = dataclasses.replace(PAPER, window=64).mixed_and_uniform(16, lengths)["spire"]
    assert rows[3]["spire"] == f"{mixed:.3f} ({100 * (mixed / uniform - 1):+.2f}%)"
    assert rows[0]["spire"].endswith("(+0.00%)")  # sigma 0: the batch is uniform
    assert list(change) == ["L/8", "64"] and change["64"]["spire"] == pytest.approx(abs(mixed / uniform - 1))


def test_winner_change_rows_list_the_cells_that_change():
    uniform = {"spire": np.array([[2.0, 1.0]]), "magicdec": np.array([[1.0, 2.0]])}  # (1, 2)
    mixed = {"spire": np.array([[2.0, 3.0]]), "magicdec": np.array([[1.0, 2.0]])}
    assert tables.winner_change_rows("s", np.array([4]), np.array([8, 16]), uniform, mixed) == [
        {"scale": "s", "B": 4, "L": 16, "uniform": "MagicDec", "mixed": "SPIRe"}]


def test_cell_index():
    assert tables.cell_index(B, L, 64, 512) == (6, 4)
    assert tables.cell_index(B, L, 64, 600) is None and tables.cell_index(B, L, 3, 512) is None


def test_taus_used_are_the_measured_ones_or_the_paper_table():
    taus, per_position, at, source = scenarios.taus_used(None)
    assert taus == pm.PAPER_TAU[pm.PAPER_TAU_CONTEXT] and per_position == {} and at is None
    assert source.startswith("the paper's Table 1 taus at L = 512")
    assert scenarios.taus_used(({"spire": 3.0}, {"spire": [0.9]}, 64)) == (
        {"spire": 3.0}, {"spire": [0.9]}, 64, "taus measured in this run by notebook 04 at L = 64")


def test_paper_ablation_multipliers_price_every_variant_as_spire():
    out = scenarios.paper_ablation_multipliers(dataclasses.replace(PAPER, hoi=30.0, overlap=False), 64, 512)
    assert list(out) == list(pm.PAPER_ABLATION_TAU)
    assert out["hard_target"] == pm.throughput_multiplier("spire", pm.PAPER_ABLATION_TAU["hard_target"], 64, 512,
                                                          "seqax-67m", "spire-draft", hoi=30.0, overlap=False)
    assert out["no_sparse_kv"] == pm.throughput_multiplier("spire", pm.PAPER_ABLATION_TAU["spire"], 64, 512,
                                                           "seqax-67m", "spire-draft", hoi=30.0, overlap=False,
                                                           window_factor=None)


def test_overlap_rows_and_columns_put_the_scenarios_rule_first():
    rows = tables.overlap_rows(PAPER, 64, 512)
    assert [r["method"] for r in rows] == ["vanilla SD", "MagicDec", "SPIRe"]
    assert rows[2]["ours"] == float(PAPER.multipliers(64, 512)["spire"])
    assert rows[2]["other"] == float(dataclasses.replace(PAPER, overlap=False).multipliers(64, 512)["spire"])
    assert tables.overlap_columns(PAPER, 64, 512) == {"method": "method (B = 64, L = 512)", "ours": "f = max",
                                                      "other": "f = sum"}
    summed = dataclasses.replace(PAPER, overlap=False)
    assert tables.overlap_columns(summed, 1, 2)["ours"] == "f = sum"
    assert tables.overlap_rows(summed, 64, 512)[2]["other"] == rows[2]["ours"]


def test_headline_quotes_the_paper_only_on_its_cell_and_records_both_results():
    tm, rows, results = tables.headline(PAPER, 64, 512, 512)
    assert tm == {m: float(v) for m, v in PAPER.multipliers(64, 512).items()}
    assert [r["paper"] for r in rows] == [pm.PAPER_MULTIPLIERS["seqax-67m"][m] for m in tm]
    assert list(results["headline"]) == ["spire", "magicdec", "vanilla"]
    assert results["headline_cell"] == {"B": 64, "L": 512, "hoi": 600.0, "overlap": True, "tau_context": 512}
    for off in (tables.headline(PAPER, 32, 512, 512), tables.headline(PAPER, 64, 512, 256),
                tables.headline(dataclasses.replace(PAPER, hoi=300.0), 64, 512, 512)):
        assert {r["paper"] for r in off[1]} == {"(other cell)"}


def test_settings_line_names_f_k_and_the_taus():
    line = words.settings_line(dataclasses.replace(PAPER, overlap=False), 960)
    assert line.startswith("HOI = 600 FLOP/byte, f = sum, k = 4, tau from L = 960: {")


def test_dense_scenario_drops_the_window_and_vanilla():
    dense = scenarios.dense_scenario(PAPER)
    assert dense.window_factor is None and list(dense.taus) == ["magicdec", "spire"]
    assert float(dense.multipliers(64, 512)["spire"]) < float(PAPER.multipliers(64, 512)["spire"])


def test_the_papers_stated_multipliers_only_on_its_own_cell_and_settings():
    assert scenarios.stated_on_cell(PAPER, 64, 512, 512) is pm.PAPER_MULTIPLIERS["seqax-67m"]
    big = Scenario.paper("llama3-70b")
    assert scenarios.stated_on_cell(big, 64, 65536, 512, "llama3-70b") is pm.PAPER_MULTIPLIERS["llama3-70b"]
    for scenario, cell, tau_context in ((PAPER, (64, 1024), 512), (PAPER, (64, 512), 960),
                                        (dataclasses.replace(PAPER, overlap=False), (64, 512), 512),
                                        (dataclasses.replace(PAPER, hoi=300.0), (64, 512), 512)):
        assert scenarios.stated_on_cell(scenario, *cell, tau_context) is None


def test_depth_free_settings_are_the_scenarios_without_its_k():
    on = dataclasses.replace(PAPER, k=6, hoi=300.0, window=64)
    free = scenarios.depth_free(on)
    assert "k" not in free and free == {key: v for key, v in on.model_kwargs().items() if key != "k"}
    assert best_k("spire", 0.8, 64, 512, on.target, on.drafts["spire"], k_max=8, **free)[0] >= 1  # k left to vary


def test_min_max_and_no_sparse_sentence():
    spread = tables.min_max(np.array([1.5, 0.25, 1.0]))
    assert spread == {"min": 0.25, "max": 1.5}
    assert words.no_sparse_sentence(spread) == "SPIRe without sparse KV at B = 64, L = 8..1M: min 0.2500x, max 1.5000x"


def test_ablation_curves_use_display_names():
    curves = scenarios.ablation_curves(PAPER, 64, L)
    assert "spire" in curves and "random init" in curves and "no sparse kv" in curves
    assert np.allclose(curves["random init"], scenarios.paper_ablation_multipliers(PAPER, 64, L)["random_init"])


def test_device_bars_pick_one_cell():
    cells = [(64, 512), (1024, 64)]
    rows = tables.device_rows(PAPER, cells)
    bars = tables.device_bars(rows, PAPER.taus, cells[1])
    assert list(bars) == [r["device"] for r in rows]
    assert bars[rows[0]["device"]]["spire"] == rows[0]["spire@(1024, 64)"]


def test_alpha_sentence_and_best_k_columns():
    assert words.alpha_sentence({"spire": 0.8, "vanilla": 0.51234}) == \
        "Implied i.i.d. acceptance: SPIRe alpha = 0.800, vanilla SD alpha = 0.512"
    assert tables.best_k_columns(["spire"]) == {"L": "L (B = 64)", "spire": "SPIRe"}


def test_mixed_columns_change_sentences_and_flat_change():
    assert list(tables.mixed_columns(["spire"])) == ["window", "spread", "mean", "spire"]
    change = {"L/8": {"spire": 0.0123, "vanilla": 0.0}, "64": {"spire": 0.5}}
    assert words.mixed_change_sentences(change).split("\n") == [
        "window L/8: largest change vs a uniform batch of the same mean: SPIRe 1.23%, vanilla SD 0.00%",
        "window 64: largest change vs a uniform batch of the same mean: SPIRe 50.00%"]
    assert tables.flat_change(change) == {"L/8:spire": 0.0123, "L/8:vanilla": 0.0, "64:spire": 0.5}


def test_spire_over_magicdec_and_its_sentence():
    summary = tables.spire_over_magicdec({"spire": 3.0, "magicdec": 2.0}, np.array([[1.0, 2.0], [0.5, 1.25]]))
    assert summary == {"at_highlight": 1.5, "grid_min": 0.5, "grid_max": 2.0}
    assert words.spire_over_magicdec_sentence((64, 512), summary) == \
        "SPIRe / MagicDec at (B, L) = (64, 512): 1.500; over the grid 0.500 .. 2.000"


def test_record_all_records_every_item_in_order(monkeypatch):
    from spirelib.workbook import results
    from spirelib.workbook.results import record_all
    monkeypatch.delenv(results.RESULTS_FILE_ENV, raising=False)
    monkeypatch.setattr(results, "_in_memory", {})
    record_all({"b": 1, "a": {"x": np.float64(0.5)}})
    assert results.recorded() == {"b": 1, "a": {"x": 0.5}}


def test_show_table_displays_the_markdown_table(monkeypatch):
    from spirelib.workbook import display
    shown = []
    monkeypatch.setattr(display, "display", shown.append)
    display.show_table([{"a": 1.23456}], {"a": "A"}, digits=2)
    assert [m.data for m in shown] == [display.markdown_table([{"a": 1.23456}], {"a": "A"}, digits=2).data]


def test_taus_rows_put_the_paper_tau_beside_each_method():
    rows = tables.taus_rows({"spire": 3.0, "ngram": 1.5})
    assert rows[0] == {"method": "spire", "tau": 3.0, "paper": pm.PAPER_TAU[512]["spire"]}
    assert np.isnan(rows[1]["paper"]) and list(tables.TAUS_COLUMNS) == ["method", "tau", "paper"]


def test_mixed_scenarios_keep_the_shapes_and_name_the_spread():
    mixed = scenarios.mixed_scenarios({"p": PAPER}, 1.0, 7)["p"]
    assert (mixed.length_spread, mixed.seed, mixed.target) == (1.0, 7, PAPER.target)
    assert mixed.label == PAPER.label + ", mixed lengths (sigma 1)"


def test_winner_grid_multipliers_at_winners_and_answer_rows():
    grid = {"vanilla": np.array([[0.5, 2.0]]), "spire": np.array([[0.9, 1.5]])}
    assert tables.winner_grid(np.array([1]), np.array([8, 16]), grid) == {"B": [1], "L": [8, 16],
                                                                          "winners": [["ad", "vanilla"]]}
    at = scenarios.multipliers_at({"p": PAPER}, 64, 512)
    assert at == {"p": {m: float(v) for m, v in PAPER.multipliers(64, 512).items()}}
    assert scenarios.scenario_winners({"a": {"x": 1.0, "y": 2.0}, "b": {"x": 3.0, "y": 2.0}}) == {"a": "y", "b": "x"}
    assert tables.answer_rows({"a": {"x": 1.0, "y": 2.0}}) == [{"scale": "a", "x": 1.0, "y": 2.0, "best": "y"}]
    assert words.answer_heading(8, 64) == "**The answer at B = 8, L = 64** (modeled throughput multiplier over AD):"


def test_searched_depths_and_capped_note():
    assert words.searched_depths({"spire": 4, "vanilla": 8}) == "SPIRe k <= 4, vanilla SD k <= 8"
    best, caps = {"spire": np.array([[2, 4]]), "vanilla": np.array([[3, 5]])}, {"spire": 4, "vanilla": 8}
    note = words.capped_note(best, caps)
    assert note.startswith("**Capped search:**") and "where SPIRe shows its cap" in note and note.endswith("still.")
    assert words.capped_note(best, caps, 7).endswith("finds k = 7 for SPIRe at (64, 512)).")
    assert words.capped_note(best, {"spire": 5, "vanilla": 8}) is None


def test_explorer_results_name_the_source_and_the_best_k_on_the_grid_only():
    at = {"p": {"spire": 2.0, "vanilla": 1.5}}
    best = {"spire": np.array([[3, 4]])}
    on = tables.explorer_results({"spire": 3.0}, 512, (64, 512), at, [], best, (0, 1))
    assert list(on) == ["taus_used", "multipliers_at_highlight", "winner_at_highlight",
                        "winner_changes_mixed_lengths", "best_k_at_highlight"]
    assert on["taus_used"] == {"source": "measured", "context_length": 512, "taus": {"spire": 3.0}}
    assert on["multipliers_at_highlight"] == {"B": 64, "L": 512, "p": at["p"]}
    assert on["winner_at_highlight"] == {"p": "spire"} and on["best_k_at_highlight"] == {"spire": 4}
    off = tables.explorer_results({"spire": 3.0}, None, (3, 512), at, [], best, None)
    assert off["taus_used"]["source"] == "paper" and "best_k_at_highlight" not in off


def test_device_rows_take_a_table_and_columns_can_leave_out_the_bytes():
    from spirelib.throughput.hardware import HARDWARE, operating_points
    one = dict(list(HARDWARE.items())[:1])
    rows = tables.device_rows(PAPER, [(64, 512)], ("fp8", "bf16"), per_device=1, table=one)
    assert [r["device"] for r in rows] == [p[0] for p in operating_points(("fp8", "bf16"), 1, table=one)]
    assert len(rows) == 1
    assert list(tables.device_columns(["spire"], [(64, 512)], with_bytes=False)) == ["device", "hoi", "spire@(64, 512)"]


def test_role_rows_share_the_target():
    rows = tables.role_rows("llama3-70b", pm.PAPER_DRAFTS["llama3-70b"])
    assert [r["role"] for r in rows] == ["target", "vanilla draft", "SPIRe draft", "MagicDec draft"]
    assert rows[0]["body_share"] == rows[3]["body_share"] == 1.0 == rows[0]["kv_share"]
    spire = pm.PRESETS[pm.PAPER_DRAFTS["llama3-70b"]["spire"]]
    assert rows[2]["kv_share"] == pm.kv_values_per_token(spire) / pm.kv_values_per_token(pm.PRESETS["llama3-70b"])
    assert rows[1]["body_share"] < 1.0


def test_extrapolation_headline_quotes_the_paper_on_its_cell_only():
    big = Scenario.paper("llama3-70b")
    stated = pm.PAPER_MULTIPLIERS["llama3-70b"]
    rows, results = tables.extrapolation_headline(big, stated["B"], stated["L"], 512)
    assert results["headline_70b"] == {m: float(v) for m, v in big.multipliers(stated["B"], stated["L"]).items()}
    assert results["headline_70b_cell"] == {"B": stated["B"], "L": stated["L"], "hoi": 600.0, "overlap": True}
    assert [r["paper"] for r in rows] == [stated.get(m, "not stated") for m in big.taus]
    off, _ = tables.extrapolation_headline(big, stated["B"], stated["L"], 960)
    assert {r["paper"] for r in off} == {"(other cell)"}


def test_memory_sentence_in_gigabytes():
    shape = pm.PRESETS["llama3-70b"]
    kv = 64 * 65536 * pm.kv_values_per_token(shape) / 1e9
    assert words.memory_sentence("llama3-70b", 64, 65536) == (
        f"B = 64, L = 65536: target KV cache {kv:,.0f} GB, body weights {pm.body_params(shape) / 1e9:,.0f} GB "
        "(at 1 byte per value)")


def test_implied_alphas_give_back_the_taus():
    alphas = scenarios.implied_alphas(PAPER)
    assert list(alphas) == list(PAPER.taus)
    for m, alpha in alphas.items():
        assert (1 - alpha ** (PAPER.k + 1)) / (1 - alpha) == pytest.approx(PAPER.taus[m])


def test_spire_best_k_is_best_k_with_spire_alone():
    grid = scenarios.spire_best_k(PAPER, B, L, cap=12)
    assert grid.shape == (len(B), len(L))
    alpha = alpha_from_tau(PAPER.taus["spire"], PAPER.k)
    expected, _ = best_k("spire", alpha, 64, 512, PAPER.target, PAPER.drafts["spire"], k_max=12,
                         **{k: v for k, v in PAPER.model_kwargs().items() if k != "k"})
    assert grid[tables.cell_index(B, L, 64, 512)] == expected


def test_01_leads_with_the_papers_arithmetic_and_where_the_winner_flips():
    paper = Scenario.paper("seqax-67m", 512, k=4, hoi=600.0, overlap=True)
    multipliers, _, _ = tables.headline(paper, 64, 512, 512)
    stated = pm.PAPER_MULTIPLIERS["seqax-67m"]
    arithmetic, where = words.lead(paper, multipliers, stated, 64, 512, 2 ** np.arange(0, 8), 2 ** np.arange(5, 14))
    assert arithmetic.startswith("**The paper's arithmetic, redone:** with the paper's shapes and tau (HOI 600, "
                                 "f = max, k = 4) the model gives, at B = 64, L = 512: SPIRe 2.78x, MagicDec 2.05x, "
                                 "vanilla SD 1.36x.")
    assert arithmetic.endswith("The paper states 2.78x, 2.05x, 1.36x: the same to its two decimals.")
    assert where.startswith("**Which draft, where (Figure 4, modeled):** vanilla SD wins at ")
    assert "; SPIRe everywhere else." in where
    off = words.lead(paper, {**multipliers, "vanilla": 1.40}, stated, 64, 512, [64], [512])[0]
    assert off.endswith("different for vanilla SD.")
    assert words.lead(paper, multipliers, None, 8, 64, [8], [64])[0].endswith("states no multipliers for this cell.")


def test_06_says_where_the_winner_flips_per_scenario():
    grid = {"spire": np.array([[2.0, 1.5], [2.0, 1.2]]), "magicdec": np.array([[1.0, 1.6], [1.0, 1.1]])}
    grids = {"trained shapes": tables.winner_grid([1, 16], [256, 960], grid)}
    assert words.where_sentences(grids, {"trained shapes": "the trained shapes"}) == (
        "- **the trained shapes:** MagicDec wins at L = 960 for B = 1; SPIRe everywhere else.")


def test_06_says_where_a_one_pass_drafter_of_a_stated_tau_would_beat_spire():
    import numpy as np

    from spirelib.workbook.narrative.perf import one_pass_sentence

    grid = {"spire": np.array([[2.0, 1.5], [1.2, 0.9]]), "one_pass": np.array([[2.5, 1.4], [1.3, 0.8]]),
            "magicdec": np.array([[2.6, 1.0], [1.0, 0.5]])}
    words = one_pass_sentence(grid, 3.0, 3.4)
    assert words.startswith("**A one-pass drafter at a stated tau of 3** (a parameter of the question, not a "
                            "measurement")
    assert "would beat SPIRe at its tau of 3.40 in 2 of 4 cells of the map and be the best method in 1." in words
    assert one_pass_sentence({**grid, "one_pass": grid["spire"] - 1}, 2.0, 3.4).endswith(
        "SPIRe's acceptance is worth more than one pass instead of k everywhere on the map.")


def test_01_says_the_tau_the_guided_draft_and_prompt_lookup_would_need_and_whether_a_round_can_yield_it():
    rows = tables.tau_needed_rows(PAPER, ("guided", "lookup"), 64, 512)
    assert [r["method"] for r in rows] == ["guided sparse", "prompt lookup"]
    for r, method in zip(rows, ("guided", "lookup")):
        assert r["ad"] == pytest.approx(float(PAPER.tau_to_match(method, 64, 512)))
        for rival in ("magicdec", "spire"):
            assert r[rival] == pytest.approx(float(PAPER.tau_to_match(method, 64, 512, rival)))
        assert set(r) == set(tables.TAU_NEEDED_COLUMNS)
    rows = [{"method": "guided sparse", "ad": 2.34, "magicdec": 4.8, "spire": 6.5},
            {"method": "prompt lookup", "ad": 1.0, "magicdec": 2.05, "spire": 2.78}]
    assert words.tau_needed_sentence(rows, 64, 512, 4) == (
        "At B = 64, L = 512 (modeled, the paper's shapes and SPIRe's paper tau): guided sparse would need tau 6.50 "
        "to equal SPIRe, out of reach at k = 4 (a round yields at most 5) and 2.34 to beat AD; prompt lookup would "
        "need tau 2.78 to equal SPIRe and 1.00 to beat AD.")
    # exactly k + 1 is within reach: a round of k accepted drafts and the bonus token
    assert "out of reach" not in words.tau_needed_sentence([{**rows[1], "spire": 5.0}], 64, 512, 4)
