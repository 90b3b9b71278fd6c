"""What a finished run recorded of acceptance, as the schedules read it (`throughput.recorded`):
notebook 04's tau, CI and per-position curve at the recorded context nearest the one asked for,
the refusal when the run recorded none, and 04's "tau" and "tau_protocol" and 09's "cells" read back typed
as written."""

import pytest

from spirelib.throughput.profiled import DraftOverhead, ProfiledCost
from spirelib.throughput.recorded import (
    DeployError,
    RecordedCell,
    RecordedCostCheck,
    RecordedExplorer,
    RecordedGrid,
    RecordedHeadline,
    RecordedMachine,
    RecordedProfile,
    RecordedProtocol,
    RecordedTau,
    explored,
    modeled_headline,
    paper_best_k,
    paper_cost_checks,
    profiled_record,
    recorded_acceptance,
    recorded_taus,
    tau_lengths,
    tau_protocol,
    tau_records,
    timed_cells,
    timed_machine,
    timed_trained_length,
    trained_target,
)
from spirelib.throughput.schedule import Acceptance

RUN = {"04_measure_tau": {
    "tau_protocol": {"k": 3},
    "tau": {"spire": {"64": {"mean": 3.1, "ci95": 0.2}, "256": {"mean": 3.3, "ci95": 0.1}},
            "vanilla": {"64": {"mean": 2.2, "ci95": 0.3}}},
    "per_position_acceptance": {"spire": {"256": {"p": [0.9, 0.8, 0.7]}}, "vanilla": {"64": {"p": [0.6, 0.5]}}}}}


def test_the_nearest_recorded_context_with_its_interval_and_a_curve_only_at_the_protocols_depth():
    at_256, L = recorded_acceptance(RUN, 1000)
    assert L == 256 and at_256 == {"spire": Acceptance(3.3, 0.1, 3, (0.9, 0.8, 0.7))}  # vanilla has no L = 256
    at_64, L = recorded_acceptance(RUN, 160)  # as far from 64 as from 256: the shorter one
    assert L == 64
    assert at_64 == {"spire": Acceptance(3.1, 0.2, 3), "vanilla": Acceptance(2.2, 0.3, 3)}  # 2 values at k = 3: none


def test_a_run_without_taus_is_refused_with_what_to_run():
    for run in ({}, {"04_measure_tau": {}}, {"04_measure_tau": {"tau": {}}}):
        with pytest.raises(DeployError, match="notebook 04"):
            recorded_acceptance(run, 512)


def test_recorded_taus_picks_the_nearest_measured_context_length():
    run = {"04_measure_tau": {
        "tau": {"spire": {"256": {"mean": 3.1}, "960": {"mean": 2.9}}, "vanilla": {"256": {"mean": 2.5}}},
        "per_position_acceptance": {"spire": {"256": {"p": [0.9, 0.8]}}}}}
    taus, per_position, L = recorded_taus(run, 512)
    assert L == 256 and taus == {"spire": 3.1, "vanilla": 2.5} and per_position == {"spire": [0.9, 0.8]}
    assert recorded_taus(run, 900)[2] == 960 and recorded_taus(run, 900)[0] == {"spire": 2.9}
    assert recorded_taus({}, 512) is None


def test_04s_tau_reads_back_typed_as_written_and_an_older_runs_missing_fields_are_none():
    written = {"spire": {"960": RecordedTau(2.9, 0.05, 192, 0.31).to_dict(),
                         "256": RecordedTau(3.1, 0.04, 64, 0.2).to_dict()}}
    run = {"04_measure_tau": {"tau": {**written, "vanilla": {"512": {"mean": 2.5}}}}}  # a run before ci95 and the rest
    taus = tau_records(run)
    assert taus == {"spire": {960: RecordedTau(2.9, 0.05, 192, 0.31), 256: RecordedTau(3.1, 0.04, 64, 0.2)},
                    "vanilla": {512: RecordedTau(2.5)}}
    assert {m: {str(L): t.to_dict() for L, t in by_l.items()} for m, by_l in taus.items() if m == "spire"} == written
    assert tau_lengths(taus) == [256, 512, 960]
    assert tau_records({}) == tau_records({"04_measure_tau": {"tau": None}}) == {}


def test_04s_protocol_reads_back_typed_as_written_and_an_older_runs_missing_fields_are_defaults():
    written = RecordedProtocol(k=3, new_tokens=64, temperature=1.0, context_lengths=[256, 960], n_contexts=192,
                               batch_size=64, seed=0, stopping={"half_width": 0.05, "floor": 64},
                               magicdec={"sink": 1, "window": 64, "rope_mode": "cache"},
                               kv_budgets={"magicdec": {"sink": 1, "window": 64, "chosen": 0}}, trained_on=1024,
                               target={"num_layers": 8, "d_model": 64}, target_tokens=2_457_600,
                               vanilla_draft={"num_layers": 1}, vanilla_tokens=10, spire_draft={"num_layers": 2},
                               spire_tokens=20, seconds=12.5, scale="8 x 64; L = 256, 960").to_dict()
    assert tau_protocol({"04_measure_tau": {"tau_protocol": written}}).to_dict() == written
    older = tau_protocol({"04_measure_tau": {"tau_protocol": {"new_tokens": 64}}})  # before k and the rest were kept
    assert older == RecordedProtocol(new_tokens=64) and older.k == 4 and older.trained_on is None and older.scale == ""
    assert tau_protocol({}) == tau_protocol({"04_measure_tau": {"tau_protocol": None}}) == RecordedProtocol()
    assert recorded_acceptance(RUN, 256)[0]["spire"].depth == 3  # the schedules' depth is the protocol's k


def test_09s_machine_reads_back_typed_and_a_run_without_09_reads_as_unrecorded():
    written = RecordedMachine(2.5e11, "fp32", 3e10, "cpu", 4, 12.5, "8 x 64; 2 threads", 2).to_dict()
    assert timed_machine({"09_measured_vs_modeled": {"machine": written}}).to_dict() == written
    older = timed_machine({"09_measured_vs_modeled": {"machine": {"peak_flops": 1e11, "bandwidth": 1e10}}})
    assert older == RecordedMachine(peak_flops=1e11, bandwidth=1e10) and older.threads is None and older.scale == ""
    assert timed_machine({}) == RecordedMachine() and timed_machine({}).peak_flops is None


def test_09s_cells_read_back_typed_an_older_runs_missing_fields_as_none():
    written = RecordedCell(method="spire", B=2, L=64, measured_speedup=1.3, modeled_speedup=1.6, profiled_speedup=1.2,
                           tau=3.1, ci_low=1.2, ci_high=1.4, runs=3, error=0.23, profiled_error=-0.08, held_out=True)
    older = {"method": "vanilla", "B": 1, "L": 64, "measured_speedup": 0.9, "role": "fitted"}  # no CI, a dropped key
    read = timed_cells({"09_measured_vs_modeled": {"cells": [written.to_dict(), older]}})
    assert read[0] == written and read[0].half_width == pytest.approx(0.1 / 1.3)
    assert read[1] == RecordedCell(method="vanilla", B=1, L=64, measured_speedup=0.9)
    assert read[1].ci_low is None and not read[1].held_out and not read[1].past_training
    assert timed_cells({}) == [] and timed_cells({"09_measured_vs_modeled": {}}) == []  # 09 did not run


def test_09s_profiled_model_reads_back_typed_its_cost_whole_and_a_run_without_it_as_none():
    cost = ProfiledCost(2e10, 5e9, per_layer_s=3e-5, attention_flops_per_s=float("inf"),
                        drafts={"spire": DraftOverhead(1e-4, -2e-6)}, paces={(1, 64): 0.9, (2, 64): 1.1})
    written = RecordedProfile(cost, median_error=0.04, mean_signed_error=-0.01, fitted_median_error=0.03,
                              held_out_max_error=0.08, false_gains=0, widest_ci=0.05, cells_slower_than_ad=3)
    flat = written.to_dict()
    assert flat["per_layer_s"] == 3e-5 and flat["median_error"] == 0.04  # one flat dict, as 09 records it
    assert profiled_record({"09_measured_vs_modeled": {"profiled_model": flat}}) == written
    older = profiled_record({"09_measured_vs_modeled": {"profiled_model": {**cost.to_dict(), "median_error": 0.1}}})
    assert older.cost == cost and older.median_error == 0.1 and older.held_out_max_error is None
    assert profiled_record({}) is None and profiled_record({"09_measured_vs_modeled": {}}) is None


def test_01s_and_07s_headlines_their_cost_checks_02s_target_and_09s_scalars_read_back_typed():
    run = {"01_performance_model": {"headline": {"spire": 2.78, "vanilla": 1.36},
                                    "headline_cell": {"B": 64, "L": 512, "hoi": 600.0, "overlap": True,
                                                      "tau_context": 512}},
           "07_llama3_70b_extrapolation": {"headline_70b": {"spire": 2.82}, "headline_70b_cell": {"B": 64, "L": 65536}},
           "08_cost_analysis": {"paper_cost_check": {"SPIRe gross, (64, 512)": {
               "paper": 6.4, "from_rounded_tm": 6.4029, "from_full_tm": 6.4012}}},
           "02_train_target": {"target": {"body_params": 73984, "val_loss": 3.08, "device": "cpu", "unknown": 1}},
           "09_measured_vs_modeled": {"target_trained_length": 256,
                                      "machine": {"peak_flops": 5e10, "bandwidth": 1e10}}}
    assert modeled_headline(run, "01_performance_model") == RecordedHeadline(
        {"spire": 2.78, "vanilla": 1.36}, B=64, L=512, hoi=600.0, overlap=True, tau_context=512)
    assert modeled_headline(run, "07_llama3_70b_extrapolation") == RecordedHeadline({"spire": 2.82}, B=64, L=65536)
    assert paper_cost_checks(run) == {"SPIRe gross, (64, 512)": RecordedCostCheck(6.4, 6.4029, 6.4012)}
    target = trained_target(run)
    assert (target.body_params, target.val_loss, target.device, target.tokens) == (73984, 3.08, "cpu", None)
    assert timed_trained_length(run) == 256 and timed_machine(run).hoi == 5.0
    assert paper_best_k({"01_performance_model": {"best_k_spire_b64_l512": 7}}) == 7 and paper_best_k(run) is None
    assert modeled_headline({}, "01_performance_model") is None and paper_cost_checks({}) == {}
    assert trained_target({}).body_params is None and timed_trained_length({}) is None
    assert timed_machine({}).hoi is None  # 09 did not run


def test_06s_answers_read_back_typed_and_a_run_without_06_reads_as_empty():
    grid = {"B": [1, 64], "L": [512, 1024], "winners": [["spire", "spire"], ["magicdec", "ad"]]}
    run = {"06_speedup_explorer": {
        "taus_used": {"source": "measured", "context_length": 256, "taus": {"spire": 4.8, "vanilla": 2.8}},
        "multipliers_at_highlight": {"B": 64, "L": 512, "paper shapes": {"spire": 3.95, "vanilla": 1.44},
                                     "trained shapes": {"spire": 4.4}},
        "winner_grid": {"paper shapes": grid}}}
    assert explored(run) == RecordedExplorer(
        "measured", 256, {"spire": 4.8, "vanilla": 2.8}, B=64, L=512,
        at={"paper shapes": {"spire": 3.95, "vanilla": 1.44}, "trained shapes": {"spire": 4.4}},
        grids={"paper shapes": RecordedGrid([1, 64], [512, 1024], [["spire", "spire"], ["magicdec", "ad"]])})
    assert explored(run).measured and "B" in run["06_speedup_explorer"]["multipliers_at_highlight"]  # left as read
    assert explored({}) == RecordedExplorer() and not explored({}).measured
