"""Tables of notebook 09 (the model against the clock) hold what wallclock and profiled compute."""

import dataclasses
from types import SimpleNamespace

import pytest

from spirelib.measure import cells as measured_cells
from spirelib.measure.wallclock import (
    DecodeTiming,
    flops_per_token,
    modeled_speedups,
    modeled_step_seconds,
    profiled_draft_shapes,
    profiled_verdict,
)
from spirelib.model.config import ModelConfig, SpireConfig
from spirelib.throughput import profiled, winners
from spirelib.throughput.hardware import Machine
from spirelib.throughput.methods import KVBudget
from spirelib.throughput.recorded import RecordedCell, RecordedMachine, profiled_record, timed_cells, timed_machine
from spirelib.workbook.narrative import measured as words
from spirelib.workbook.tables import measured as tables

TARGET = ModelConfig(vocab_size=64, num_layers=2, d_model=32, n_q_per_kv=2, n_kv=2, d_head=8, d_ff=64)
DRAFT = ModelConfig(vocab_size=64, num_layers=1, d_model=16, n_q_per_kv=2, n_kv=2, d_head=4, d_ff=32)
SPIRE = SpireConfig(num_layers=1, window=4)
BUDGETS = {"magicdec": KVBudget(1, 8), "spire": KVBudget(SPIRE.sink, SPIRE.window)}
MODELS = {"vanilla": DRAFT, "spire": DRAFT}
COST = profiled.ProfiledCost(flops_per_s=1e10, bytes_per_s=1e10, per_layer_s=2e-5, sampling_s=3e-5)
PRICED = profiled.PricedTarget(TARGET.shape(), TARGET.vocab_size, 4)  # in fp32, as 09 prices it


def timing(method, seconds, tau=1.0, rounds=8, batch=2, context=16):
    return DecodeTiming(method, batch, context, 16, seconds, [tau] * len(seconds), [rounds] * len(seconds),
                        [{"draft": s / 2, "verify": s / 4} for s in seconds], 0.01)


TIMINGS = [timing("ad", [0.02, 0.01], rounds=16), timing("vanilla", [0.008, 0.004], tau=2.0),
           timing("spire", [0.01, 0.02], tau=3.0)]


def test_profile_summary_names_every_term_and_the_fit_and_held_out_errors():
    rows = [{"error": 0.1, "role": "fitted"}, {"error": -0.3, "role": "fitted"}, {"error": 0.05, "role": "fitted"},
            {"error": -0.2, "role": "held out"}]
    text = words.profile_summary(COST, rows)
    assert text.startswith("fitted in the loop: (20 us + 0 ns per token, + 0 us past one token) per layer + 0.0 ns per key")
    assert "max(matmul FLOPs / 10.0 GFLOP/s, bytes / 10.0 GB/s) (both calibrated, pinned)" in text
    assert text.endswith("fitted rounds: median error 10.0%, worst 30.0%; held out rounds: median error 20.0%, "
                         "worst 20.0%.")
    fitted = dataclasses.replace(COST, drafts={"spire": profiled.DraftOverhead(5e-5, -2e-9)})
    assert "each method's own code per round: SPIRe +50 us -2 ns per row." in words.profile_summary(fitted, rows)
    paced = dataclasses.replace(COST, paces={(1, 256): 1.1, (64, 256): 0.85, (16, 960): 1.0})
    assert ("each fitted cell its own pace, a factor on every method's sections there that cancels in a speedup "
            "(held-out cells at 1): 0.85 (B = 64, L = 256) to 1.10 (B = 1, L = 256).") in words.profile_summary(paced, rows)


def test_fit_rows_set_each_timings_round_against_the_model_and_say_if_the_fit_saw_it():
    shapes = profiled_draft_shapes(MODELS, BUDGETS, SPIRE)
    rows = tables.fit_rows(TIMINGS, [TIMINGS[2]], COST, PRICED, shapes, k=4)
    assert [(r["method"], r["role"]) for r in rows] == [("AD", "fitted"), ("vanilla SD", "fitted"),
                                                        ("SPIRe", "held out")]
    ad = profiled.ad_step_seconds(COST, PRICED, 2, 32)
    assert rows[0]["measured"] == pytest.approx(1e3 * (0.02 + 0.01) * 0.75 / 2 / 16)  # draft + verify of a step
    assert rows[0]["profiled"] == pytest.approx(1e3 * ad)
    assert rows[0]["error"] == pytest.approx(rows[0]["profiled"] / rows[0]["measured"] - 1)
    paced = dataclasses.replace(COST, paces={(2, 16): 1.25})  # the fitted cell's own pace prices its rounds
    assert tables.fit_rows(TIMINGS, [], paced, PRICED, shapes, k=4)[0]["profiled"] == pytest.approx(1.25 * 1e3 * ad)


def test_the_timed_cells_are_the_grid_and_the_held_out_cells_beyond_it():
    assert measured_cells.timing_cells([1, 16], [256, 960], [[16, 2048]]) == [(1, 256), (16, 256), (1, 960), (16, 960),
                                                                      (16, 2048)]
    assert measured_cells.grid_problems([1, 16], [256, 960], [[16, 2048]]) == []
    (why,) = measured_cells.grid_problems([1, 16], [256], [[16, 2048]])
    assert "the cells left to fit, [(1, 256), (16, 256)], must be three or more" in why
    assert measured_cells.grid_problems([1, 16], [256, 960], []) == [
        "held_out is empty: the profiled model would be judged only on the cells it was fitted to"]
    assert len(measured_cells.grid_problems([1], [256, 960], [[1, 960]])) == 1  # one B left


def test_timing_problems_join_the_grids_and_the_interleavings_and_held_out_cells_split_off():
    assert measured_cells.timing_problems([1, 16], [256, 960], [[16, 2048]], "rounds", graphed=False) == []
    problems = measured_cells.timing_problems([1, 16], [256, 960], [], "together", graphed=True)
    assert len(problems) == 3 and problems[0].startswith("held_out is empty") and "'rounds' or 'runs'" in problems[1]
    assert "timed whole" in problems[2]
    beyond = [timing("ad", [0.04], batch=4, context=32), timing("spire", [0.02], tau=3.0, batch=4, context=32)]
    fitted, unseen = measured_cells.split_held_out([*TIMINGS, *beyond], [[4, 32]])
    assert fitted == TIMINGS and unseen == beyond


def test_timing_rows():
    rows = tables.timing_rows(TIMINGS)
    assert [r["method"] for r in rows] == ["AD", "vanilla SD", "SPIRe"]
    assert rows[0]["tps"] == 2400.0 and rows[0]["round"] == pytest.approx(1e3 * 0.015 / 16)
    assert rows[0]["spread"] == "1,600 to 3,200" and rows[0]["draft"] == 0.5 and rows[2]["tau"] == 3.0


def test_profiled_draft_shapes():
    shapes = profiled_draft_shapes(MODELS, BUDGETS, SPIRE)
    assert shapes["magicdec"] == profiled.DraftShape("magicdec", None, KVBudget(1, 8))
    assert shapes["spire"] == profiled.DraftShape("spire", DRAFT.shape(), KVBudget(SPIRE.sink, SPIRE.window),
                                                  memory_layers=SPIRE.num_layers)
    no_memory = SpireConfig(num_layers=1, window=4, feedback=False, target_activations=False)
    assert profiled_draft_shapes(MODELS, BUDGETS, no_memory)["spire"].memory_layers == 0


def test_speedup_cells_add_the_profiled_model():
    shapes = profiled_draft_shapes(MODELS, BUDGETS, SPIRE)
    kw = dict(machine=Machine(1e10, 1e10, 4), k=4)
    cells = measured_cells.speedup_cells(TIMINGS, TARGET, shapes, COST, held_out=[[2, 16]], **kw)
    unprofiled = [dataclasses.replace(c, profiled_speedup=None, profiled_error=None, held_out=False) for c in cells]
    assert unprofiled == modeled_speedups(TIMINGS, TARGET, shapes, **kw)
    spire = cells[1]
    expected = profiled.speedup(COST, shapes["spire"], 3.0, PRICED, 2, 16, 16, 4)
    assert spire.profiled_speedup == pytest.approx(expected)
    assert spire.profiled_error == pytest.approx(expected / spire.measured_speedup - 1)
    assert spire.held_out and spire.runs == 2
    row = tables.cell_rows(cells)[1]
    assert row["role"] == "held out" and row["ci"] == f"{spire.ci_low:.2f} to {spire.ci_high:.2f}"
    assert set(tables.CELL_COLUMNS) <= set(row)  # every column the table shows, from the cell


def test_ad_step_rows():
    machine = Machine(1e10, 1e10, 4)
    (row,) = tables.ad_step_rows(TIMINGS, TARGET, COST, machine=machine, new_tokens=16)
    modeled = modeled_step_seconds(TARGET, 2, 16, machine)
    assert row["measured"] == pytest.approx(1e3 * 0.015 / 16) and row["modeled"] == pytest.approx(1e3 * modeled)
    assert row["ratio"] == pytest.approx(0.015 / 16 / modeled)
    # a step reads its cache's whole capacity L + G
    assert row["profiled"] == pytest.approx(1e3 * profiled.ad_step_seconds(COST, PRICED, 2, 16 + 16))
    (paced,) = tables.ad_step_rows(TIMINGS, TARGET, dataclasses.replace(COST, paces={(2, 16): 0.8}), machine=machine,
                                   new_tokens=16)
    assert paced["profiled"] == pytest.approx(0.8 * row["profiled"])  # at its cell's fitted pace


def test_flop_rows_cap_a_sparse_draft_keys():
    rows = tables.flop_rows({"target": TARGET, "draft": DRAFT}, [32, 64], {"draft": 5})
    assert [(r["model"], r["L"]) for r in rows] == [("target", 32), ("target", 64), ("draft", 32), ("draft", 64)]
    f = flops_per_token(DRAFT, 5)
    assert rows[3]["attention"] == pytest.approx(f["attention"] / f["body"]) and rows[3]["body"] == f["body"]
    assert rows[1]["attention"] == pytest.approx(flops_per_token(TARGET, 64)["attention"] / rows[1]["body"])


def cell(method, B, L, measured, profiled_speedup, error=0.1, held_out=False, half=0.04):
    return RecordedCell(method=method, B=B, L=L, measured_speedup=measured, profiled_speedup=profiled_speedup,
                        profiled_error=profiled_speedup / measured - 1, error=error, held_out=held_out,
                        ci_low=measured * (1 - half), ci_high=measured * (1 + half))


CELLS = [cell("spire", 1, 32, 0.8, 0.72, error=0.5), cell("vanilla", 4, 64, 1.2, 1.56, error=-0.1, held_out=True)]


def test_summarize_cells():
    s = measured_cells.summarize_cells(CELLS, [{"ratio": 2.0}, {"ratio": 4.0}, {"ratio": 9.0}])
    assert s["worst"] is CELLS[0] and s["best"] is CELLS[1] and s["worst_profiled"] is CELLS[1]
    assert s["overhead"] == 4.0 and s["losing"] == [CELLS[0]]
    assert s["median_error"] == pytest.approx(0.3) and s["profiled"] == profiled_verdict(CELLS)


def test_conclusion():
    summary = measured_cells.summarize_cells(CELLS, [{"ratio": 4.0}])
    paper, clock = words.conclusion(summary, 2, COST, 12.5)
    assert paper.startswith("At this scale the paper's model's error ranges from -10% (vanilla SD, B = 4, L = 64) "
                            "to +50%")
    assert "Fixed per-pass costs dominate" in paper
    assert paper.endswith("HOI here is 12.5 FLOP/byte against the paper's 600.")
    assert clock.startswith("**Speculative decoding was slower than AD in 1 of 2 measured cells**: "
                            "SPIRe at B = 1, L = 32 (0.80x). Every measured speedup has a 95% CI within +/-4.0% of it.")
    assert "pays 20 us per layer in launches and a 30 us draw" in clock
    summary = measured_cells.summarize_cells(CELLS, [{"ratio": 2.0}])
    assert "Passes are close" in words.conclusion(summary, 2, COST, 1.0)[0]


def test_machine_sentence_states_peak_bandwidth_hoi_and_dtype():
    machine = {"peak_flops": 3e11, "precision": "fp32", "bandwidth": 1e11, "saved_to": "/x.json"}
    assert words.machine_sentence(machine, "torch.float32", 4) == (
        "fp32 matmul peak 300.0 GFLOP/s, memory bandwidth 100.0 GB/s -> HOI 3.0 FLOP/byte (the paper's H100 FP8 "
        "figure: 600); models in torch.float32, 4 bytes per value; saved as the hardware table's \"this machine, "
        "measured\" entry (x.json)")
    assert words.machine_sentence({"peak_flops": 1e9, "precision": "bf16", "bandwidth": 1e9}, "f", 2).startswith(
        "bf16 matmul peak 1.0 GFLOP/s")
    assert words.machine_sentence({"peak_flops": 1e9, "precision": "tf32", "bandwidth": 1e9}, "f", 2).endswith(
        "not saved")
    saved = words.machine_sentence({**machine, "saved_to": "/tmp/abc123/cache/this_machine.json"}, "f", 2)
    assert "/tmp" not in saved and "(this_machine.json)" in saved  # no path of the machine in a report


def test_measured_results_keep_the_results_keys():
    cells = [dataclasses.replace(CELLS[1], modeled_speedup=1.08, tau=2.5, runs=3, past_training=True)]
    verdict = profiled_verdict(CELLS)
    summary = {"profiled": verdict, "losing": [1, 2], "overhead": 5.0}
    machine = RecordedMachine(3e11, "fp32", 1e11, "cpu", 4, 5.0, "s", 2)
    results = tables.measured_results(cells, COST, summary, machine, trained_len=1024)
    assert list(results) == ["cells", "profiled_model", "hoi", "machine", "target_trained_length"]
    assert results["target_trained_length"] == 1024
    assert [list(c) for c in results["cells"]] == [[
        "method", "B", "L", "measured_speedup", "modeled_speedup", "profiled_speedup", "tau", "ci_low", "ci_high",
        "runs", "error", "profiled_error", "held_out", "past_training"]]  # results.json's schema, in its order
    assert timed_cells({"09_measured_vs_modeled": results}) == cells  # read back typed as written
    assert results["profiled_model"] == {**COST.to_dict(), **verdict, "false_gains": 0, "cells_slower_than_ad": 2}
    recorded = profiled_record({"09_measured_vs_modeled": results})  # read back typed as written
    assert recorded.cost == COST and recorded.median_error == verdict["median_error"]
    assert recorded.false_gains == 0 and recorded.cells_slower_than_ad == 2
    assert results["hoi"] == 3.0
    assert results["machine"] == {"peak_flops": 3e11, "precision": "fp32", "bandwidth": 1e11, "device": "cpu",
                                  "bytes_per_value": 4, "ad_step_overhead": 5.0, "scale": "s", "threads": 2}
    assert timed_machine({"09_measured_vs_modeled": results}) == machine  # read back typed as written


def clock_cell(method, B, L, measured, profiled_speedup):
    return cell(method, B, L, measured, profiled_speedup, held_out=L == 960 and B == 16)


CLOCK = [clock_cell("spire", 1, 256, 1.32, 1.5), clock_cell("magicdec", 1, 256, 0.9, 1.0),
         clock_cell("spire", 16, 256, 1.05, 1.2), clock_cell("magicdec", 16, 256, 0.95, 0.9),
         clock_cell("spire", 1, 960, 0.8, 0.9), clock_cell("magicdec", 1, 960, 0.7, 0.8),
         clock_cell("spire", 16, 960, 1.1, 1.3), clock_cell("magicdec", 16, 960, 1.2, 1.1)]


def test_09_leads_with_where_sd_won_and_where_it_lost():
    assert winners.cell_winners(CLOCK) == ([["spire", "ad"], ["spire", "magicdec"]], [1, 16], [256, 960])
    assert words.both_sides(CLOCK) == (
        "**Where speculative decoding won** (resolved: the winner's 95% CI clear of every other method's and of AD's): "
        "in 3 of 4 (B, L) cells: SPIRe in 2 (1.05-1.32x), MagicDec in 1 "
        "(1.20x). Per cell: AD wins at L = 960 for B = 1; MagicDec wins at L = 960 for B = 16; SPIRe everywhere else. "
        "**Where it lost:** every draft was resolved slower than AD at (B, L) = (1, 960); MagicDec was slower than AD "
        "in 3 of 4 cells (0.70-0.95x); SPIRe was slower than AD in 1 of 4 cells (0.80x).")
    close = [clock_cell("spire", 16, 256, 1.02, 1.2) if (c.method, c.B, c.L) == ("spire", 16, 256) else c
             for c in CLOCK]  # 0.98-1.06: its CI overlaps AD's
    text = words.both_sides(close)
    assert "in 2 of 4 (B, L) cells: SPIRe in 1 (1.32x), MagicDec in 1 (1.20x)" in text
    assert "No winner is resolved at B = 16, L = 256 (SPIRe leads)" in text


def test_09_says_which_way_the_profiled_model_errs_how_far_unseen_and_where_it_picks_the_wrong_winner():
    text = words.profiled_sides(CLOCK)
    # errors: +13.6, +11.1, +14.3, -5.3, +12.5, +14.3, +18.2 (held out), -8.3% (held out)
    assert text.startswith("**The profiled model overpredicts the speedup by 8.8% on average** (mean signed error "
                           "+8.8%; too high in 6 of 8 cells, too low in 2); its median error is 13.1%. ")
    assert ("Fitted to the rounds timed at the other cells (median error there 13.1%), it predicts the held-out "
            "cells (B = 16, L = 960) within 18.2%. ") in text
    assert "It picks the wrong winner at B = 16, L = 960 (it picks SPIRe, the clock MagicDec). " in text
    assert text.endswith("Every cell it predicts at 1.1x or more measured a gain.")
    right = [dataclasses.replace(c, profiled_speedup=c.measured_speedup, profiled_error=0.0) for c in CLOCK]
    assert "It picks the measured winner in every cell." in words.profiled_sides(right)
    overlapping = [*CLOCK[:7], clock_cell("magicdec", 16, 960, 1.12, 1.1)]  # 1.12 (1.08-1.16) against SPIRe's 1.10
    assert "It picks the measured winner in every cell where one is resolved." in words.profiled_sides(overlapping)
    wrong = [*CLOCK[:5], clock_cell("magicdec", 1, 960, 0.7, 1.15), *CLOCK[6:]]
    assert words.profiled_sides(wrong).endswith(
        "It calls MagicDec at B = 1, L = 960 a gain (1.15x) that measured a loss (0.70x).")
    summary = measured_cells.summarize_cells([dataclasses.replace(c, error=0.1) for c in CLOCK], [{"ratio": 4.0}])
    paragraphs = words.conclusion(summary, 8, COST, 2.0, CLOCK)
    assert paragraphs[0].startswith("**Where speculative decoding won** (resolved") and paragraphs[1] == text
    assert paragraphs[2].startswith("**Profiling your own GPU:**") and "within 18%" in paragraphs[2]
    assert "pace" not in paragraphs[2]  # no paces fitted: nothing to say of them
    paced = words.conclusion(summary, 8, dataclasses.replace(COST, paces={(1, 256): 0.8, (64, 256): 1.3}), 2.0,
                             CLOCK)[2]
    assert paced.endswith("It predicts speedups, not seconds: every method at a cell shares that cell's pace, which "
                          "cancels in a speedup but is unknown at a cell the fit did not see (the fitted cells' ranged "
                          "from 0.80 (B = 1, L = 256) to 1.30 (B = 64, L = 256)), so read tokens/s there from a timed "
                          "run.")
    assert "Every measured speedup has a 95% CI within +/-4.0% of it. Where" in paragraphs[-1]
    wide = [*CLOCK[:7], dataclasses.replace(CLOCK[7], ci_low=1.2 * 0.9, ci_high=1.2 * 1.1)]
    clock = words.conclusion(measured_cells.summarize_cells([dataclasses.replace(c, error=0.1) for c in wide],
                                                            [{"ratio": 4.0}]), 8, COST, 2.0, wide)[-1]
    assert ("Every measured speedup has a 95% CI within +/-10.0% of it (7 of 8 within the +/-5% asked for, 1 more "
            "wider but clear of 1, SD faster or slower than AD there, and 0 unresolved when their time per cell ran "
            "out: a speedup varies with the contexts each run draws") in clock
    straddles = [*CLOCK[:7], dataclasses.replace(CLOCK[7], ci_low=0.95, ci_high=1.15)]
    clock = words.conclusion(measured_cells.summarize_cells([dataclasses.replace(c, error=0.1) for c in straddles],
                                                            [{"ratio": 4.0}]), 8, COST, 2.0, straddles)[-1]
    assert "(7 of 8 within the +/-5% asked for, 0 more wider but clear of 1, SD faster or slower than AD there, " \
           "and 1 unresolved" in clock


def test_cells_past_the_targets_training_windows_are_flagged_next_to_their_figures():
    """A target trained on 1,024-token windows, timed at L = 2048 (and at L = 960 with G = 64: 1,024
    positions, within; L = 1000 runs past): the 2048 cells are marked, 09's words say so beside the figure, and so
    does the index beside the fastest speedup; an imported target (length unknown) marks none."""
    from spirelib.workbook import details, findings, paper_claims

    cells = [dataclasses.replace(cell(m, 16, L, x, x), modeled_speedup=1.5)
             for m, L, x in (("spire", 2048, 1.59), ("magicdec", 2048, 1.2), ("spire", 960, 1.3),
                             ("magicdec", 960, 0.9))]
    marked = measured_cells.mark_past_training(cells, 1024, 64)
    assert [c.past_training for c in marked] == [True, True, False, False]
    assert not any(c.past_training for c in measured_cells.mark_past_training(cells, None, 64))
    at_1000 = RecordedCell(method="spire", B=1, L=1000, measured_speedup=1.0)
    assert measured_cells.mark_past_training([at_1000], 1024, 64)[0].past_training  # its generated tokens: past
    assert "The cells at L = 2048 run past the target's training windows" in words.both_sides(marked)
    trained = SimpleNamespace(summary={}, train_config=SimpleNamespace(seq_len=1024))
    assert measured_cells.trained_length(trained) == 1024
    assert measured_cells.trained_length(SimpleNamespace(summary={"imported_from": "/m"}, train_config=None)) is None
    results = {"09_measured_vs_modeled": {"cells": [c.to_dict() for c in marked], "target_trained_length": 1024}}
    note = "L = 2048; past the 1,024-token windows the target was trained on"
    assert note in findings.plain(details.measured_vs_modeled({}, results)["text"])
    assert any(note in findings.plain(t) for _, _, t, _ in paper_claims._claim_measured({}, results))
