"""The schedule in the reports: 06's k per B beside the winner map, 08's savings at the schedule's
k, 09's CPU schedule against the measured cells."""

import numpy as np
import pytest

from spirelib.measure import cells as measured_cells
from spirelib.throughput import costs as cost_model
from spirelib.throughput import profiled, scenarios
from spirelib.throughput import recorded as run_record
from spirelib.throughput.acceptance import alpha_from_tau, best_k
from spirelib.throughput.methods import KVBudget
from spirelib.throughput.scenarios import Scenario
from spirelib.throughput.schedule import Acceptance, ProfiledPricing, Range, Schedule, profiled_table, schedule
from spirelib.workbook.narrative import measured as measured_words
from spirelib.workbook.narrative import perf as perf_words
from spirelib.workbook.tables import costs, measured, perf

TAU_04 = {"04_measure_tau": {"tau": {"spire": {"64": {"mean": 3.5, "ci95": 0.2}}, "vanilla": {"64": {"mean": 2.4,
                                                                                                   "ci95": 0.1}}},
                             "per_position_acceptance": {"spire": {"64": {"p": [0.9, 0.8, 0.7, 0.6]}}},
                             "tau_protocol": {"k": 4}}}


def test_06_reads_04s_acceptance_with_its_interval_or_falls_back_to_the_taus_it_shows():
    recorded = run_record.acceptance_or_taus(TAU_04, {"spire": 3.5, "vanilla": 2.4}, 4, 512)
    assert recorded["spire"] == Acceptance(3.5, 0.2, 4, (0.9, 0.8, 0.7, 0.6))
    assert recorded["vanilla"] == Acceptance(2.4, 0.1, 4)
    paper = run_record.acceptance_or_taus({}, {"spire": 3.401, "magicdec": 3.891}, 4, 512)
    assert paper == {"spire": Acceptance(3.401, 0.0, 4), "magicdec": Acceptance(3.891, 0.0, 4)}


def test_06_shows_each_methods_scheduled_k_at_the_winner_maps_batch_sizes():
    scenario = Scenario.paper()
    alpha = float(alpha_from_tau(3.401, 4))
    long = scenarios.schedules_at(scenario, {"spire": Acceptance(3.401, 0.0, 4)}, 8192, 128)
    for b in (1, 16, 128):
        assert long["spire"].k_at(b) == best_k("spire", alpha, b, 8192, "seqax-67m", "spire-draft", k_max=8)[0]
    schedules = scenarios.schedules_at(scenario, {"spire": Acceptance(3.401, 0.0, 4)}, 512, 128)
    grid = {"B": [1, 16, 128], "L": [256, 512], "winners": [["ad", "spire"], ["spire", "magicdec"], ["ad", "ad"]]}
    rows = perf.schedule_rows(schedules, grid, 512)
    assert [r["winner"] for r in rows] == ["SPIRe", "MagicDec", "AD"]
    assert [r["SPIRe"] for r in rows] == [schedules["spire"].k_at(b) for b in (1, 16, 128)]
    assert {r["winner"] for r in perf.schedule_rows(schedules, grid, 1000)} == {"-"}
    assert perf_words.schedule_sentence(schedules, 512).startswith("- **SPIRe** at L = 512: B 1-")


def test_08_prices_each_method_at_its_scheduled_k():
    scenario = Scenario.paper()
    training = {"spire": 0.25}
    rows = {r["method"]: r for r in costs.scheduled_savings(scenario, 64, 512, training, 10.0)}
    for m, tau in scenario.taus.items():
        k, tm = best_k(m, float(alpha_from_tau(tau, 4)), 64, 512, "seqax-67m", scenario.drafts.get(m), k_max=8)
        assert rows[m]["k"] == k and rows[m]["tm"] == pytest.approx(tm)
        assert rows[m]["net"] == pytest.approx(cost_model.serving_savings(tm, serving_units=10.0)
                                               - training.get(m, 0.0))
        assert rows[m]["tm_fixed"] == pytest.approx(float(scenario.multipliers(64, 512)[m]))
    assert rows["spire"]["net"] > rows["spire"]["net_fixed"]  # k = 4 is not SPIRe's best at (64, 512)
    assert costs.scheduled_result({"seqax-67m": list(rows.values())})["seqax-67m"]["spire"]["k"] == rows["spire"]["k"]


def cell(method, B, L, speedup, low, high, tau=3.0):
    return run_record.RecordedCell(method=method, B=B, L=L, measured_speedup=speedup, ci_low=low, ci_high=high, tau=tau)


def test_09_checks_the_schedules_prediction_against_the_best_measured_cells_interval():
    cells = [cell("spire", 1, 32, 1.30, 1.20, 1.40), cell("vanilla", 1, 32, 1.10, 1.00, 1.20),
             cell("spire", 2, 32, 0.80, 0.70, 0.90), cell("vanilla", 2, 32, 0.60, 0.50, 0.70),
             cell("spire", 4, 32, 1.50, 1.45, 1.55)]
    choices = {(1, 32): ("spire", 4, 1.25), (2, 32): ("ad", 0, 1.0), (4, 32): ("vanilla", 2, 1.2)}
    rows = measured.schedule_check_rows(cells, choices)
    assert [(r["B"], r["measured"], r["lands"]) for r in rows] == [(1, "SPIRe: 1.30x", True), (2, "AD", True),
                                                                   (4, "SPIRe: 1.50x", False)]
    assert rows[1]["scheduled"] == "off (AD)" and rows[1]["interval"] == "1.00..1.00"
    assert rows[0]["scheduled"] == "SPIRe k=4: 1.25x"
    sentence = measured_words.schedule_check_sentence(rows)
    assert "at 2 of 3 measured (B, L) cells" in sentence and "not at (B = 4, L = 32)" in sentence
    speculating_where_ad_won = measured.schedule_check_rows(cells, {(2, 32): ("spire", 4, 1.05)})
    assert speculating_where_ad_won[0]["lands"] is False


COST = profiled.ProfiledCost(2e10, 5e9, per_token_layer_s=1.5e-4, per_key_s=7e-6, sampling_per_logit_s=4.7e-7,
                             bookkeeping_s=1.7e-4, bookkeeping_per_logit_s=2.5e-7)


def test_09_chooses_per_cell_the_method_whose_schedule_predicts_the_most():
    from spirelib.throughput.perfmodel import ModelShape

    target = ModelShape(2, 64, 2, 2, 16, 128)
    shapes = {"spire": profiled.DraftShape("spire", ModelShape(1, 64, 2, 2, 16, 128), KVBudget(1, 16), memory_layers=1),
              "vanilla": profiled.DraftShape("vanilla", ModelShape(1, 32, 2, 2, 8, 64))}
    cells = [cell("spire", 1, 64, 0.8, 0.5, 1.1, tau=4.5), cell("vanilla", 1, 64, 0.5, 0.3, 0.7, tau=2.8),
             cell("spire", 2, 64, 0.9, 0.5, 1.3, tau=4.5), cell("vanilla", 2, 64, 0.6, 0.3, 0.9, tau=2.8)]
    acceptance = run_record.acceptance_or_cells({}, cells, 4)
    assert acceptance[64] == {"spire": Acceptance(4.5, 0.0, 4), "vanilla": Acceptance(2.8, 0.0, 4)}
    assert run_record.acceptance_or_cells({"04_measure_tau": {"tau": {"spire": {"64": {"mean": 4.4, "ci95": 0.3}},
                                                                  "vanilla": {"64": {"mean": 2.7, "ci95": 0.2}}}}},
                                        cells, 4)[64]["spire"] == Acceptance(4.4, 0.3, 4)
    pricing = ProfiledPricing(COST, profiled.PricedTarget(target, 256, 4), 64, 0.1)
    choices = measured_cells.scheduled_choices(cells, pricing, shapes, acceptance)
    for B in (1, 2):
        options = []
        for m in ("spire", "vanilla"):
            t = profiled_table(pricing, shapes[m], acceptance[64][m], np.arange(1, 3), 64)
            k = schedule(t).k_at(B)
            options.append((float(t.at(k)[0][B - 1]), m, k))
        predicted, method, k = max(options)
        assert k > 0 and choices[(B, 64)] == (method, k, predicted)
    hopeless = {64: {"spire": Acceptance(1.02, 0.0, 4), "vanilla": Acceptance(1.01, 0.0, 4)}}
    off = measured_cells.scheduled_choices(cells, pricing, shapes, hopeless)
    assert set(off.values()) == {("ad", 0, 1.0)}


def test_a_schedule_describes_its_ranges_in_one_line():
    s = Schedule((Range(1, 8, 4, 1.5, 2.0, 1.4, 2.1), Range(9, 256, 0, 1.0, 1.0, 1.0, 1.0)))
    assert s.describe() == "B 1-8: k=4, B 9-256: k=0"
