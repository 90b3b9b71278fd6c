"""The run index leads with the verdict and the reproduced / not reproduced lists, built from
recorded results, each number linked to its notebook."""

import html
import re

from spirelib.workbook import details, findings, paper_claims
from spirelib.workbook.findings import Part, plain
from spirelib.workbook.report import findings_section, verdict_section

RUN = {"notebooks": {"01_performance_model": {"html": "01_performance_model.html"},
                     "04_measure_tau": {"html": "04_measure_tau.html"},
                     "06_speedup_explorer": {"html": "06_speedup_explorer.html"},
                     "09_measured_vs_modeled": {"html": "09_measured_vs_modeled.html"}}}


def cell(method, B, L, measured, modeled=1.5, half=0.05):
    return {"method": method, "B": B, "L": L, "measured_speedup": measured, "modeled_speedup": modeled,
            "ci_low": measured - half, "ci_high": measured + half, "error": modeled / measured - 1}


RESULTS = {
    "01_performance_model": {"headline": {"spire": 2.7812, "magicdec": 2.0512, "vanilla": 1.40},
                             "headline_cell": {"B": 64, "L": 512, "hoi": 600.0, "tau_context": 512}},
    "04_measure_tau": {"tau": {"spire": {"512": {"mean": 3.2, "ci95": 0.05, "n_contexts": 10}},
                               "vanilla": {"512": {"mean": 2.5, "ci95": 0.04, "n_contexts": 10}},
                               "magicdec": {"512": {"mean": 2.9, "ci95": 0.04, "n_contexts": 10}}},
                       "tau_protocol": {"scale": "tiny models", "k": 4}},
    "05_ablations": {"importance": [{"part": "sparse KV", "multiplier_lost": 1.0}],
                     "importance_matches_paper": True},
    "06_speedup_explorer": {
        "taus_used": {"source": "measured", "context_length": 512, "taus": {"vanilla": 2.5, "magicdec": 2.9,
                                                                            "spire": 3.2}},
        "multipliers_at_highlight": {"B": 64, "L": 512,
                                     "paper shapes": {"vanilla": 1.5, "magicdec": 2.0, "spire": 2.6},
                                     "trained shapes": {"vanilla": 0.7, "magicdec": 1.8, "spire": 1.2}},
        "winner_grid": {"trained shapes": {"B": [1, 2], "L": [32, 64], "winners": [["spire", "ad"], ["ad", "ad"]]}}},
    "09_measured_vs_modeled": {
        "cells": [cell("spire", 1, 32, 1.2), cell("vanilla", 1, 32, 0.9), cell("spire", 4, 64, 0.5),
                  cell("vanilla", 4, 64, 0.6)],
        "machine": {"device": "cpu", "ad_step_overhead": 40.0}},
}


def text(page):
    plain = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))
    return plain.replace(" ,", ",").replace(" .", ".").replace(" :", ":")


text_of = text


def test_verdict_answers_four_ways_at_the_cell_and_over_the_grid():
    rows = findings.verdict_rows(RUN, RESULTS)
    assert [r["stem"] for r in rows] == ["01_performance_model", "06_speedup_explorer", "06_speedup_explorer",
                                         "09_measured_vs_modeled"]
    assert [findings._winner(r["at"]) for r in rows] == ["spire", "spire", "magicdec", "ad"]  # 09: nearest cell (4, 64)
    html = verdict_section(RUN, RESULTS)
    plain = text(html)
    assert plain.index("Which draft, where") < plain.index("Reproduced") < plain.index("Not reproduced")
    assert "SD was slower than AD in 3 of 4 measured (method, B, L) cells" in plain  # 1.2: the only cell SD wins
    assert "MagicDec wins at the trained shapes (modeled)" in plain
    assert "SPIRe 1 , AD 3 of 4 cells" in plain or "AD 3, SPIRe 1 of 4 cells" in plain  # the recorded grid
    assert "not measured at B = 64, L = 512; this is the nearest measured cell" in plain
    paper_grid = findings._modeled_winners({"vanilla": 2.647, "magicdec": 3.891, "spire": 3.401})
    assert sum(row.count("spire") for row in paper_grid) == 66  # the paper's model, B 1..128 x L 32..8K
    assert "SPIRe 66" in plain and "of 72 cells" in plain
    assert "magicdec" not in plain and "MagicDec" in plain  # display names, never code names


def test_claims_separate_the_papers_arithmetic_from_what_this_scale_reproduces():
    found = paper_claims.claims(RUN, RESULTS)
    arithmetic, done, not_done = found["arithmetic"], found["reproduced"], found["not reproduced"]
    assert [plain(c.text).startswith("Multipliers at B = 64, L = 512") for c in arithmetic] == [True]
    (_, ok, text, key), = arithmetic
    assert key == "arithmetic:multipliers"
    assert not ok and "vanilla SD 1.40x (paper 1.36x; differs at the second decimal: 1.4000)" in plain(text)
    assert any("SPIRe is the best draft" in plain(t) and "SPIRe 2.60x" in plain(t) for _, _, t, _ in done)
    assert any(Part("faster in 1 of 4 measured cells", href="09_measured_vs_modeled.html") in t
               and "cells (1 resolved: 95% CI above 1)" in plain(t) for _, _, t, _ in not_done)
    assert any("Order of tau" in plain(t) and "SPIRe 3.20, MagicDec 2.90" in plain(t)
               for _, _, t, _ in not_done)  # paper: MagicDec first
    assert any("Importance" in plain(t) for _, _, t, _ in done)
    assert not any("Multipliers at B = 64" in plain(t) for _, _, t, _ in done + not_done)
    page = verdict_section(RUN, RESULTS)
    assert "faster in 1 of 4 measured cells</a> (1 resolved: 95% CI above 1)" in page
    words = text_of(page)
    assert "The paper's arithmetic, checked (0 of 1 agree)" in words and "differs: Multipliers" in words
    assert "Reproduced at this scale (2)" in words and "Not reproduced at this scale (3)" in words


def test_a_cost_number_off_at_the_second_decimal_says_why_or_is_not_a_match():
    checks = {"a": {"paper": 5.12, "from_rounded_tm": 5.1204, "from_full_tm": 5.1349},
              "b": {"paper": 6.40, "from_rounded_tm": 6.4012, "from_full_tm": 6.3991},
              "c": {"paper": 6.20, "from_rounded_tm": 6.2149, "from_full_tm": 6.2139}}
    out = paper_claims._claim_costs({}, {"08_cost_analysis": {"paper_cost_check": checks}})
    (_, ok_a, a, _), (_, ok_b, b, _), (_, ok_c, c, _) = ((kind, ok, plain(t), key) for kind, ok, t, key in out)
    assert ok_a and "5.13 (paper 5.12: the paper rounded its multipliers to two decimals first" in a
    assert ok_b and "6.40 (paper 6.40)" in b and "rounded" not in b
    assert not ok_c and c.endswith("differs")


def test_details_compare_with_the_paper_and_link_the_notebook():
    html = findings_section(RUN, RESULTS)
    assert "<a href='01_performance_model.html'>2.78x</a>" in html
    assert html.count(">yes<") == 2 and ">no<" in html  # vanilla 1.40 is not the paper's 1.36
    assert "<a href='04_measure_tau.html'>3.200 ± 0.050</a>" in html and "3.401" in html
    assert "SPIRe &gt; MagicDec &gt; vanilla SD" in html
    assert "Scale: tiny models" in html and "<td>1</td><td>sparse KV (+1.00x)</td>" in html
    assert "05_ablations.html" not in html  # no report for 05 in this run: plain text, no dead link


def test_no_recorded_results_means_no_verdict_and_no_details():
    assert findings_section(RUN, {}) == "" and verdict_section(RUN, {}) == ""


def test_unresolved_ablation_parts_and_the_profiled_model_are_reported_as_such():
    from spirelib.workbook.paper_claims import _claim_ablations, _claim_measured

    results = {"05_ablations": {"importance": [
        {"part": "sparse KV", "multiplier_lost": 0.76, "resolved": True, "rank": 1},
        {"part": "feedback", "multiplier_lost": 0.01, "resolved": False, "rank": None}]},
        "09_measured_vs_modeled": {"cells": [
            {"method": "spire", "B": 1, "L": 256, "measured_speedup": 0.9, "modeled_speedup": 1.8, "error": 1.0,
             "profiled_speedup": 1.0, "profiled_error": 0.111}]}}
    (kind, good, claim, _), = _claim_ablations({}, results)
    words = plain(claim)
    assert kind == "reproduced" and not good
    assert "sparse KV (modeled, no interval, +0.76x)" in words
    assert "Not resolved at this scale (no rank): feedback" in words
    assert "feedback (+0.01x)" not in words
    claims = _claim_measured({}, results)
    assert any("profiled cost model" in plain(t) and "median error 11% over all 1 cells" in plain(t) and not ok
               for _, ok, t, _ in claims)


def test_a_harmful_part_is_reported_as_harmful_with_its_tau_difference():
    results = {"05_ablations": {
        "importance": [{"part": "sparse KV", "multiplier_lost": 0.76, "resolved": True, "rank": 1, "effect": "helps"},
                       {"part": "target activations", "multiplier_lost": -0.08, "resolved": True, "rank": None,
                        "effect": "harmful"}],
        "component_delta_tau": {"target activations": {"mean": -0.131, "ci95": 0.053, "resolved": True}}}}
    (_, ok, claim, _), = paper_claims._claim_ablations({}, results)
    claim = plain(claim)
    assert not ok and "harmful here, removing it raises tau: target activations (-0.131 ± 0.053 tau, -0.08x;" in claim
    assert "own 95% interval, uncorrected" in claim and "sparse KV (modeled, no interval, +0.76x)" in claim
    details = text(findings_section({}, results))
    assert "harmful here target activations (-0.08x) -0.131 ± 0.053 tau 2" in details
    assert "1 sparse KV (+0.76x)" in details


def ablation_run(seeds: int) -> tuple[dict, list[str]]:
    """05's recorded results and its lead, as notebook 05 computes them, for differences over `seeds`."""
    from spirelib.measure import ablations
    from spirelib.measure.tau import DeltaTau
    from spirelib.throughput.recorded_ablations import AblationProtocol
    from spirelib.workbook.narrative import ablations as words
    from spirelib.workbook.tables import ablations as tables

    per_seed = (-0.034, -0.054)[:seeds]
    deltas = {"target activations": DeltaTau(sum(per_seed) / seeds, 0.02, per_seed, 128),
              "feedback": DeltaTau(0.01, 0.3, (0.01,) * seeds, 128)}
    shown = {"target activations": True, "feedback": False}
    ranked = ablations.ranking([("sparse KV", 0.76), ("feedback", 0.01), ("target activations", -0.08)], deltas, shown)
    stats = {"spire": DeltaTau(3.0, 0.1, (3.0,) * seeds, 128)}
    recorded = tables.ablation_results(stats, ranked, {}, deltas, shown, list(range(seeds)), False,
                                       AblationProtocol(scale="tiny"))
    lead = words.lead(ranked, 100, 100, interval=recorded.interval, taus=recorded.component_delta_tau)
    return {"05_ablations": recorded.to_dict()}, lead


def test_the_index_claims_of_the_ablations_what_05_leads_with_in_its_words():
    """The run index's claim of 05 reads as 05's lead: the same sentence, over training randomness
    (two seeds, the target fixed) or about one trained draft per variant (one seed), where it is
    never resolved and never reproduces the paper's claim."""
    for seeds in (2, 1):
        results, lead = ablation_run(seeds)
        (_, ok, claim, _), = paper_claims._claim_ablations({}, results)
        assert lead[0] in plain(claim) and not ok, (seeds, claim, lead[0])
        details = text(findings_section({}, results))
        if seeds == 2:
            assert lead[0].startswith("Over training randomness (2 seeds per variant, the target fixed; family-wise "
                                      "over the table's 2 comparisons, Holm at 5%): 1 of 3 parts help at this scale "
                                      "(a measured part only when resolved): sparse KV (modeled, no interval, +0.76x)")
            assert "harmful here target activations (-0.08x) -0.044 ± 0.020 tau 2" in details
        else:
            assert lead[0].startswith("For one trained draft per variant (one seed, the target fixed; not over "
                                      "training randomness; family-wise over the table's 2 comparisons, Holm at "
                                      "5%): 1 of 3 parts help this trained draft (a measured part only beyond its "
                                      "contexts' noise)")
            assert "resolved" not in lead[0] and "hurts this trained draft target activations (-0.08x)" in details
            assert "rank (only parts that help this trained draft)" in details
        assert "For one trained draft" in details if seeds == 1 else "Over training randomness" in details
    helping = {"05_ablations": {"importance": [{"part": "sparse KV", "multiplier_lost": 0.76, "effect": "helps"},
                                               {"part": "feedback", "multiplier_lost": 0.2, "effect": "helps"}]}}
    assert paper_claims._claim_ablations({}, helping)[0][1]  # all help, in the paper's order: reproduced
    helping["05_ablations"]["interval"] = ablation_run(1)[0]["05_ablations"]["interval"]
    assert not paper_claims._claim_ablations({}, helping)[0][1]  # but not by one trained draft per variant


def test_the_index_names_the_run_its_ablation_claim_comes_from():
    """An output folder updated with `--only` by another params file (05 at the full budget) names
    that file, the day and the budget beside 05's claim and its details, not the folder's first run."""
    results, _ = ablation_run(2)
    results["05_ablations"]["ablation_protocol"] = {"training": {"batch_size": 4, "seq_len": 1024, "steps": 300},
                                                    "seeds": [0, 1, 2]}
    run = {"params_file": "params/default.yaml",
           "notebooks": {"05_ablations": {"params_file": "params/ablations-full.yaml",
                                          "started": "2026-12-02T19:04:11+00:00", "html": "05_ablations.html"}}}
    source = "(05 run with params/ablations-full.yaml on 2026-12-02, 3 seeds x 1.23M training tokens per variant)"
    (_, _, claim, _), = paper_claims._claim_ablations(run, results)
    assert plain(claim).endswith(source) and source in findings_section(run, results)
    del run["notebooks"]["05_ablations"]["params_file"]
    assert "(05 run with params/default.yaml on 2026-12-02" in plain(paper_claims._claim_ablations(run, results)[0][2])


def test_where_the_winner_flips_in_one_sentence():
    B, L = findings.GRID_B, findings.GRID_L
    grid = [["spire"] * len(L) for _ in B]
    assert findings.where_sentence(grid, B, L) == "SPIRe wins in every cell (B = 1..128, L = 32..8K)."
    for i in range(4, len(B)):
        for j in range(6, len(L)):
            grid[i][j] = "magicdec"
    assert findings.where_sentence(grid, B, L) == "MagicDec wins at L ≥ 2K for B ≥ 16; SPIRe everywhere else."
    grid[0][:2] = ["ad", "ad"]
    assert findings.where_sentence(grid, B, L) == (
        "MagicDec wins at L ≥ 2K for B ≥ 16; AD wins at L ≤ 64 for B = 1; SPIRe everywhere else.")
    measured = [["spire", "spire"], ["spire", "magicdec"], ["spire", "magicdec"]]
    assert findings.where_sentence(measured, [1, 16, 64], [256, 960]) == (
        "MagicDec wins at L = 960 for B ≥ 16; SPIRe everywhere else.")


def test_first_screen_has_the_scale_and_a_map_per_answer_with_measured_cells_at_their_real_b_and_l():
    run = {**RUN, "params": {"series": {"corpus": "sotu"}}}
    results = {**RESULTS,
               "02_train_target": {"target": {"body_params": 1_050_000, "tokens": 2_457_600, "val_loss": 4.0,
                                              "device": "cpu"}},
               "04_measure_tau": {**RESULTS["04_measure_tau"],
                                  "tau_protocol": {"k": 4, "target": {"num_layers": 8, "d_model": 64}}}}
    results["09_measured_vs_modeled"] = {**RESULTS["09_measured_vs_modeled"], "cells": [
        {**c, "profiled_speedup": p} for c, p in zip(RESULTS["09_measured_vs_modeled"]["cells"], (1.1, 1.3, 0.4, 0.5))]}
    html = verdict_section(run, results)
    words = text(html)
    assert ("Scale: target 8 layers x d_model 64 (1.05M body parameters; the paper's: 67.1M); trained on 2.46M "
            "tokens of sotu; validation perplexity 54.6; timed on cpu.") in words
    partial = {"02_train_target": results["02_train_target"]}  # 04 and 09 not run yet: the params' shape
    line = findings.scale_line({"params": {"series": {"target": {"num_layers": 4, "d_model": 32}}}}, partial)
    assert line == (
        "target 4 layers x d_model 32 (1.05M body parameters; the paper's: 67.1M); trained on 2.46M tokens; "
        "validation perplexity 54.6; run on cpu")
    maps = findings.decision_maps(run, results)
    assert [m["title"] for m in maps] == [
        "the paper's shapes and tau (HOI 600)", "the paper's shapes, this run's tau (HOI 600)",
        "this run's shapes, this run's tau (HOI 600)", "this machine, measured", "this machine, profiled model"]
    measured, profiled_map = maps[-2:]
    assert measured["grid"] == ([["spire", "-"], ["-", "ad"]], [1, 4], [32, 64])  # the cells 09 timed, not 06's grid
    assert measured["where"] == "AD wins at L = 64 for B = 4; SPIRe everywhere else."
    assert profiled_map["grid"][0] == [["vanilla", "-"], ["-", "ad"]] and measured["differs"] == {(0, 0)}
    assert "It picks the wrong winner at B = 1, L = 32 (vanilla SD, not SPIRe)." in profiled_map["where"]
    assert html.count("<table class='map'>") == 5 and "class='differs'" in html
    assert "B = 1, L = 32: SPIRe (1.20x)" in html  # a cell's tooltip: its real (B, L) and multiplier


def test_a_measured_winner_whose_interval_overlaps_is_marked_and_not_counted():
    """SPIRe at 1.014x (0.97-1.06) against AD (vanilla SD far below): no winner is resolved; the map
    fades the cell with a "?", the words count only resolved wins and name the cell, and the
    profiled model is not said to pick a wrong winner there. A winner whose CI overlaps the
    runner-up's (B = 64: 1.5 against 1.45, +/-0.05) is not resolved either."""
    results = {"09_measured_vs_modeled": {"cells": [
        {**cell("spire", 1, 256, 1.014), "ci_low": 0.97, "ci_high": 1.06, "profiled_speedup": 0.9},
        {**cell("vanilla", 1, 256, 0.8), "profiled_speedup": 0.95},  # far below: only AD overlaps
        {**cell("spire", 16, 256, 1.5), "profiled_speedup": 1.4}, {**cell("vanilla", 16, 256, 1.2),
                                                                    "profiled_speedup": 1.1},
        {**cell("spire", 64, 256, 1.5), "profiled_speedup": 1.4}, {**cell("vanilla", 64, 256, 1.45),
                                                                    "profiled_speedup": 1.1}],
        "machine": {"device": "cpu"}}}
    measured, profiled = findings.decision_maps({}, results)
    assert measured["unresolved"] == {(0, 0), (2, 0)}
    assert measured["where"] == (
        "SPIRe wins in every resolved cell (B = 1..64, L = 256). No winner is resolved at B = 1, L = 256 (SPIRe "
        "leads), B = 64, L = 256 (SPIRe leads): the leader's 95% CI overlaps another method's or AD's.")
    assert measured["differs"] == set() and "picks the measured winner in every cell where one is resolved" in (
        profiled["where"])
    page = verdict_section({}, results)
    assert page.count("opacity:0.4") == 2 and ">S?</td>" in page and "no winner resolved" in page
    assert "SPIRe 1 of 3 cells, 2 with no winner resolved" in text(page)


def test_a_staircase_is_described_cell_row_by_row_and_scattered_cells_as_such():
    B, L = [1, 2, 4, 8, 16], [4096, 8192, 16384, 32768, 65536]
    grid = [["vanilla" if j < 4 - i else "spire" for j in range(5)] for i in range(5)]
    assert findings.where_sentence(grid, B, L) == (
        "vanilla SD wins at L ≤ 32K for B = 1, L ≤ 16K for B = 2, L ≤ 8K for B = 4 and L = 4K for B = 8; "
        "SPIRe everywhere else.")
    column = [["magicdec" if j == 2 else "spire" for j in range(5)] for _ in range(5)]
    assert findings.where_sentence(column, B, L) == "MagicDec wins at L = 16K; SPIRe everywhere else."
    checker = [["ad" if (i + j) % 2 else "spire" for j in range(5)] for i in range(5)]
    assert findings.where_sentence(checker, B, L) == "AD wins 12 scattered cells; SPIRe everywhere else."


def test_where_the_winner_flips_reads_by_columns_when_that_is_shorter():
    grid = [["magicdec", "spire", "spire"], ["magicdec", "spire", "magicdec"], ["magicdec", "spire", "spire"]]
    assert findings.where_sentence(grid, [1, 2, 4], [256, 512, 960]) == (
        "MagicDec wins at L = 256 and B = 2 for L = 960; SPIRe everywhere else.")


def test_claims_built_on_a_trained_drafts_tau_state_its_budget():
    """The tau order (04) and the best draft at the paper's shapes (06), both built on trained
    drafts' tau, carry 03's budgets, and the Table 1 analog says them in full."""
    budgets = {"SPIRe draft": {"tokens": 123_000, "body_params": 25_000_000, "paper_tokens": 500_000_000,
                               "fraction": 0.000246}}
    results = {**RESULTS, "03_train_drafts": {"draft_budgets": budgets}}
    clause = "drafts trained on 0.025% (SPIRe draft) of the paper's 20 x N tokens: about that budget"
    (_, _, tau, _), = paper_claims._claim_tau(RUN, results)
    (_, _, best, _), = paper_claims._claim_highlight_winner(RUN, results)
    assert clause in plain(tau) and clause in plain(best)
    assert "Training budgets: the SPIRe draft trained on 123,000 tokens" in text(findings_section(RUN, results))
    assert "20 x N" not in plain(paper_claims._claim_tau(RUN, RESULTS)[0][2])


def test_the_index_spells_out_its_abbreviations_once_and_the_profiled_models_goals():
    words = text(verdict_section(RUN, RESULTS))
    for term in ("AD: autoregressive decoding", "SD: speculative decoding", "TM: throughput multiplier",
                 "HOI: hardware operational intensity", "tau: tokens per round", "20 x N: the paper's training budget"):
        assert words.count(term) == 1, term
    cells = [{**c, "profiled_speedup": 1.0, "profiled_error": 0.05} for c in RESULTS["09_measured_vs_modeled"]["cells"]]
    claims = paper_claims._claim_measured({}, {"09_measured_vs_modeled": {"cells": cells}})
    profiled = next(plain(t) for _, _, t, _ in claims if "profiled cost model" in plain(t))
    assert "the goals it is held to: a median error of at most 10%, a mean signed error within +/-5%" in profiled


def test_the_terminal_ends_with_the_indexs_verdict_sentence_in_its_words():
    """`spire run` prints the verdict from the same data the index renders (`findings.plain`), not
    from its HTML: the words are the page's, the page marks the winners."""
    page = verdict_section(RUN, RESULTS)
    lead = re.search(r"<p class='verdict'>(.*?)</p>", page).group(1)
    terminal = plain(findings.verdict_lead(RESULTS, findings.verdict_rows(RUN, RESULTS)))
    assert terminal == html.unescape(re.sub(r"<[^>]+>", "", lead)).strip()
    assert terminal.startswith("At B = 64, L = 512 (modeled): SPIRe wins with the paper's shapes and tau") and (
        "<b>SPIRe</b> wins" in lead)
    assert terminal.endswith("Measured on this machine, SD was slower than AD in 3 of 4 measured (method, B, L) cells.")


def test_the_index_says_next_to_a_tau_when_its_length_ran_past_the_training_windows():
    recorded = {m: {**by_l, "2048": {"mean": 2.0, "ci95": 0.1, "n_contexts": 10}}
                for m, by_l in RESULTS["04_measure_tau"]["tau"].items()}
    results = {**RESULTS, "04_measure_tau": {"tau": recorded, "tau_protocol": {"scale": "tiny models", "k": 4,
                                                                               "new_tokens": 64, "trained_on": 1024}}}
    rows = details.table1(RUN, results)["rows"]
    assert [r[0] for r in rows] == ["2048 (past the 1,024-token training windows)", "512"]
    assert "past the" not in details.table1(RUN, RESULTS)["rows"][0][0]  # a run that did not record it says nothing


def test_every_drafting_method_has_its_own_letter_in_a_winner_map():
    got = findings.map_cells([["guided", "lookup", "one_pass", "spire", "ad"]], [64], [256, 512, 960, 2048, 4096])
    assert [c["initial"] for c in got["rows"][0]["cells"]] == ["G", "P", "1", "S", "AD"]


def test_the_index_answers_spire_or_eagle3_where_modeled_and_measured_with_the_same_intervals():
    """SPIRe against EAGLE-3 alone (`findings.duel_maps`): at the paper's shapes with the taus this run
    measured, SPIRe's sparse KV wins long contexts at a large batch, where EAGLE-3's dense cache is
    read whole; measured, a cell whose two CIs overlap is unresolved and said so, as in every map."""
    results = {
        "04_measure_tau": {"tau_protocol": {"k": 4}},
        "06_speedup_explorer": {"taus_used": {"source": "measured", "taus": {"vanilla": 2.5, "spire": 3.0,
                                                                             "eagle3": 3.0}}},
        "09_measured_vs_modeled": {"cells": [cell("spire", 1, 32, 1.30), cell("eagle3", 1, 32, 1.29),
                                             cell("spire", 8, 256, 1.50), cell("eagle3", 8, 256, 1.20),
                                             cell("vanilla", 8, 256, 1.90)], "machine": {"device": "cpu"}}}
    modeled, measured = findings.duel_maps({}, results)
    winners, B, L = modeled["grid"]
    assert {w for row in winners for w in row} <= {"spire", "eagle3", "ad"}
    assert winners[B.index(128)][L.index(8192)] == "spire"  # at equal tau, EAGLE-3's dense reads lose long contexts
    assert measured["grid"] == ([["spire", "-"], ["-", "spire"]], [1, 8], [32, 256])  # vanilla SD is not in it
    assert measured["unresolved"] == {(0, 0)} and "No winner is resolved at B = 1, L = 32" in measured["where"]
    assert "SPIRe or EAGLE-3: this machine, measured" in text(verdict_section({}, results | {
        "01_performance_model": RESULTS["01_performance_model"]}))
    assert findings.duel_maps({}, {"06_speedup_explorer": RESULTS["06_speedup_explorer"]}) == []  # no EAGLE-3
