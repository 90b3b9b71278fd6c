"""The run index leads with the verdict and the reproduced / not reproduced lists, built from
recorded results, each number linked to its notebook."""

import re

from spirelib.workbook import findings
from spirelib.workbook.findings import findings_section, verdict_section

RUN = {"notebooks": {"01_performance_model": {"html": "01_performance_model.html"},
                     "04_measure_tau": {"html": "04_measure_tau.html"},
                     "06_speedup_explorer": {"html": "06_speedup_explorer.html"},
                     "09_measured_vs_modeled": {"html": "09_measured_vs_modeled.html"}}}


def cell(method, B, L, measured, modeled=1.5):
    return {"method": method, "B": B, "L": L, "measured_speedup": measured, "modeled_speedup": modeled}


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


def text(html):
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


def test_verdict_answers_four_ways_at_the_cell_and_over_the_grid():
    rows = findings.verdict_rows(RUN, RESULTS)
    assert [r["stem"] for r in rows] == ["01_performance_model", "06_speedup_explorer", "06_speedup_explorer",
                                         "09_measured_vs_modeled"]
    assert [findings._winner(r["at"]) for r in rows] == ["spire", "spire", "magicdec", "ad"]  # 09: nearest cell (4, 64)
    html = verdict_section(RUN, RESULTS)
    plain = text(html)
    assert plain.index("Verdict") < plain.index("Reproduced") < plain.index("Not reproduced")
    assert "SD was slower than AD in 3 of 4 cells" in plain  # 1.2 is the only cell SD wins
    assert "MagicDec wins at the trained shapes (modeled)" in plain
    assert "SPIRe 1 , AD 3 of 4 cells" in plain or "AD 3, SPIRe 1 of 4 cells" in plain  # the recorded grid
    assert "nearest cell" in plain  # 09 did not measure (64, 512)
    paper_grid = findings._modeled_winners({"vanilla": 2.647, "magicdec": 3.891, "spire": 3.401})
    assert sum(row.count("spire") for row in paper_grid) == 66  # the paper's model, B 1..128 x L 32..8K
    assert "SPIRe 66" in plain and "of 72 cells" in plain
    assert "magicdec" not in plain and "MagicDec" in plain  # display names, never code names


def test_reproduced_and_not_reproduced_lists_carry_numbers():
    done, not_done = findings.claims(RUN, RESULTS)
    assert any("SPIRe is the best draft" in t and "SPIRe 2.60x" in t for t in done)
    assert any(t.startswith("Modeled multipliers") and "vanilla SD 1.40x (paper 1.36x)" in t for t in not_done)
    assert any("faster in 1 of 4 measured cells" in t for t in not_done)
    assert any("Order of tau" in t and "SPIRe 3.20, MagicDec 2.90" in t for t in not_done)  # paper: MagicDec first
    assert any("Importance" in t for t in done)


def test_details_compare_with_the_paper_and_link_the_notebook():
    html = findings_section(RUN, RESULTS)
    assert "<a href='01_performance_model.html'>2.78x</a>" in html
    assert html.count(">yes<") == 2 and ">no<" in html  # vanilla 1.40 is not the paper's 1.36
    assert "<a href='04_measure_tau.html'>3.200 ± 0.050</a>" in html and "3.401" in html
    assert "SPIRe &gt; MagicDec &gt; vanilla SD" in html
    assert "Scale: tiny models" in html and "matches" in html
    assert "05_ablations.html" not in html  # no report for 05 in this run: plain text, no dead link


def test_no_recorded_results_means_no_verdict_and_no_details():
    assert findings_section(RUN, {}) == "" and verdict_section(RUN, {}) == ""


def test_unresolved_ablation_parts_and_the_profiled_model_are_reported_as_such():
    from spirelib.workbook.findings import _claim_ablations, _claim_measured

    results = {"05_ablations": {"importance": [
        {"part": "sparse KV", "multiplier_lost": 0.76, "resolved": True, "rank": 1},
        {"part": "feedback", "multiplier_lost": 0.01, "resolved": False, "rank": None}]},
        "09_measured_vs_modeled": {"cells": [
            {"method": "spire", "B": 1, "L": 256, "measured_speedup": 0.9, "modeled_speedup": 1.8,
             "profiled_speedup": 1.0, "profiled_error": 0.111}]}}
    (good, text), = _claim_ablations({}, results)
    assert "sparse KV (+0.76x)" in text and "not resolved at this scale: feedback" in text
    assert "feedback (+0.01x)" not in text
    claims = _claim_measured({}, results)
    assert any("profiled cost model" in t and "median error 11%" in t and not ok for ok, t in claims)
