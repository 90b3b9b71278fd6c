"""The run index leads with findings built from recorded results, each linked to its notebook."""

from spirelib.findings import findings_section

RUN = {"notebooks": {"01_performance_model": {"html": "01_performance_model.html"},
                     "04_measure_tau": {"html": "04_measure_tau.html"}}}


def test_findings_compare_with_the_paper_and_link_the_notebook():
    results = {
        "01_performance_model": {"headline": {"spire": 2.7812, "magicdec": 2.0512, "vanilla": 1.40}},
        "04_measure_tau": {"tau": {"spire": {"512": {"mean": 3.2, "ci95": 0.05, "n_contexts": 10}},
                                   "vanilla": {"512": {"mean": 2.5, "ci95": 0.04, "n_contexts": 10}}},
                           "tau_protocol": {"scale": "tiny models"}},
        "05_ablations": {"importance": [{"part": "sparse KV", "multiplier_lost": 1.0}],
                         "importance_matches_paper": True},
    }
    html = findings_section(RUN, results)
    assert "<a href='01_performance_model.html'>2.78x</a>" in html
    assert html.count(">yes<") == 2 and ">no<" in html  # vanilla 1.40 is not the paper's 1.36
    assert "<a href='04_measure_tau.html'>3.200 ± 0.050</a>" in html and "3.401" in html
    assert "spire &gt; vanilla" in html or "spire > vanilla" in html
    assert "Scale: tiny models" in html and "matches" in html
    assert "05_ablations.html" not in html  # no report for 05 in this run: plain text, no dead link


def test_no_recorded_results_means_no_findings_section():
    assert findings_section(RUN, {}) == ""
