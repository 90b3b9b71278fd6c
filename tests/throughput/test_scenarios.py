"""Scenarios of the throughput model (method §2): what a one-pass drafter of a stated tau adds."""

import numpy as np
import pytest

from spirelib.throughput import perfmodel as pm
from spirelib.throughput.scenarios import Scenario


def test_a_one_pass_drafter_is_priced_at_spires_draft_shape_and_its_stated_tau():
    paper = Scenario.paper()
    one = paper.with_one_pass(3.0)
    assert one.taus == {**paper.taus, "one_pass": 3.0} and one.drafts["one_pass"] == paper.drafts["spire"]
    assert "stated tau of 3" in one.label and paper.taus.keys() == pm.PAPER_TAU[pm.PAPER_TAU_CONTEXT].keys()
    B, L = np.array([[1], [64]]), np.array([[256, 4096]])
    got = one.multipliers(B, L)
    expected = pm.throughput_multiplier("one_pass", 3.0, B, L, paper.target, paper.drafts["spire"],
                                        **paper.model_kwargs())
    np.testing.assert_allclose(got["one_pass"], expected)
    np.testing.assert_allclose(got["spire"], paper.multipliers(B, L)["spire"])
    # at SPIRe's own tau one pass instead of k is never slower
    same = paper.with_one_pass(paper.taus["spire"]).multipliers(B, L)
    assert np.all(same["one_pass"] >= same["spire"])
    for bad in (0.5, 5.5):
        with pytest.raises(ValueError, match=r"lies in \[1, 5\]"):
            paper.with_one_pass(bad)


def test_a_runs_taus_price_every_measured_method_at_the_comparisons_shapes():
    big = Scenario.paper("llama3-70b")
    taus = {"vanilla": 2.5, "magicdec": 4.3, "spire": 3.7, "guided": 4.3, "lookup": 1.03}
    ours = big.with_taus(taus, "llama3-70b, this run's taus")
    assert ours.taus == taus and ours.label == "llama3-70b, this run's taus" and ours.drafts == big.drafts
    B, L = np.array([[1], [64]]), np.array([[4096, 65536]])
    got = ours.multipliers(B, L)
    for method in ("guided", "lookup", "spire"):  # self-drafts with no shape; SPIRe with the 70B's preset
        expected = pm.throughput_multiplier(method, taus[method], B, L, big.target, big.drafts.get(method),
                                            **big.model_kwargs())
        np.testing.assert_allclose(got[method], expected)
    # the same budget at the same tau: the guided draft's scoring makes it dearer than MagicDec, never cheaper
    assert np.all(got["guided"] < got["magicdec"])
    with pytest.raises(ValueError, match="no draft shape for one_pass"):
        big.with_taus({"one_pass": 3.0}, "x")


def test_the_tau_a_method_needs_to_match_a_rival_is_the_rivals_multiplier_times_its_round_time():
    paper = Scenario.paper()
    B, L = np.array([[1], [64]]), np.array([[256, 4096]])
    spire = paper.multipliers(B, L)["spire"]
    for method in ("guided", "lookup", "vanilla"):
        dt = pm.iteration_time_multiplier(method, B, L, paper.target, paper.drafts.get(method), **paper.model_kwargs())
        np.testing.assert_allclose(paper.tau_to_match(method, B, L, "spire"), spire * dt, rtol=1e-12)
        np.testing.assert_allclose(paper.tau_to_match(method, B, L), dt, rtol=1e-12)  # against AD: TM 1
    # at its own tau SPIRe needs exactly that tau to match itself
    np.testing.assert_allclose(paper.tau_to_match("spire", B, L, "spire"), paper.taus["spire"], rtol=1e-12)
    # prompt lookup drafts for free, so it needs less tau than any draft that runs a forward
    assert np.all(paper.tau_to_match("lookup", B, L, "spire") < paper.tau_to_match("guided", B, L, "spire"))
