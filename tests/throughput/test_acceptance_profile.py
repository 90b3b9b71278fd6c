"""A draft's acceptance profile as serving simulators read it (`throughput.acceptance_profile`): the
conditional and marginal vectors from notebook 04's round counts, the mean accepted length they
imply, the contexts measured, and Dynamo's mocker flags."""

import numpy as np
import pytest

from spirelib.throughput.acceptance import per_position_from_counts, tau_from_per_position
from spirelib.throughput.acceptance_profile import (
    NOTEBOOK,
    SCHEMA,
    acceptance_profile,
    dynamo_args,
    histogram_from_counts,
    position_profile,
)

# rounds by accepted drafts 0..4 (k = 4): 20 rounds accepted none, 30 one, ..., 5 all four
HISTOGRAM = np.array([20, 30, 25, 20, 5])


def counts(histogram):
    """Notebook 04's counts of a histogram: rounds that accepted draft j, rounds that reached it."""
    at_least = np.cumsum(histogram[::-1])[::-1]  # rounds with >= n accepted, n = 0..k
    return at_least[1:].tolist(), at_least[:-1].tolist()


def test_the_vectors_of_the_rounds_counts_and_the_mean_accepted_length_they_imply():
    accepted, reached = counts(HISTOGRAM)
    assert accepted == [80, 50, 25, 5] and reached == [100, 80, 50, 25]
    assert histogram_from_counts(accepted, reached).tolist() == HISTOGRAM.tolist()
    profile = position_profile(accepted=accepted, reached=reached)
    conditional = np.array(profile["conditional_accept_rates"])
    assert conditional == pytest.approx(per_position_from_counts(HISTOGRAM)) and conditional == pytest.approx(
        [0.8, 50 / 80, 25 / 50, 5 / 25])
    rounds = HISTOGRAM.sum()
    marginal = np.array(profile["marginal_accept_rates"])
    assert marginal == pytest.approx(np.array(accepted) / rounds)  # P(at least j accepted)
    assert marginal == pytest.approx(np.cumprod(conditional), abs=1e-6)  # = the cumulative product of conditionals
    pooled = (HISTOGRAM * (np.arange(5) + 1)).sum() / rounds  # tokens over rounds, the bonus token included
    assert profile["mean_accept_length"] == pytest.approx(pooled) == pytest.approx(1 + marginal.sum())
    assert profile["mean_accept_length"] == pytest.approx(tau_from_per_position(conditional))
    assert profile["rounds"] == rounds
    from_p = position_profile(p=profile["conditional_accept_rates"])  # the curve alone: the same, no rounds
    assert from_p["marginal_accept_rates"] == pytest.approx(profile["marginal_accept_rates"], abs=1e-6)
    assert from_p["rounds"] is None


def test_a_position_never_reached_has_no_conditional_and_a_zero_marginal():
    profile = position_profile(accepted=[10, 0, 0], reached=[20, 10, 0])
    assert profile["conditional_accept_rates"] == [0.5, 0.0, None]
    assert profile["marginal_accept_rates"] == [0.5, 0.0, 0.0] and profile["mean_accept_length"] == 1.5
    assert position_profile(p=[0.5, 0.0, float("nan")])["conditional_accept_rates"] == [0.5, 0.0, None]
    assert dynamo_args(profile["conditional_accept_rates"]) == ["--aic-nextn", "3", "--aic-nextn-accept-rates",
                                                                "0.5,0,0"]


def test_counts_that_are_not_one_set_of_rounds_are_refused():
    for accepted, reached in (([10, 5], [20, 9]), ([30], [20]), ([], []), ([1, 1], [0, 1])):
        with pytest.raises(ValueError, match="not one set of rounds"):
            histogram_from_counts(accepted, reached)
    with pytest.raises(ValueError):
        position_profile(p=[1.2, 0.5])
    with pytest.raises(ValueError, match="needs the per-position"):
        position_profile()


RUN = {"04_measure_tau": {
    "tau_protocol": {"k": 6, "n_contexts": 64, "temperature": 0.0, "new_tokens": 32, "batch_size": 8, "seed": 3},
    "tau": {"eagle3": {"256": {"mean": 3.1, "ci95": 0.1, "n_contexts": 40}, "1024": {"mean": 2.7, "ci95": 0.2}},
            "spire": {"1024": {"mean": 3.0, "ci95": 0.1}}},
    "per_position_acceptance": {"eagle3": {"256": {"p": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]}}}}}


def test_a_runs_profile_at_the_nearest_context_with_every_context_it_measured_and_its_source():
    profile = acceptance_profile(RUN, "eagle3", 300, "demo")
    assert profile["schema"] == SCHEMA and profile["label"] == "EAGLE-3" and profile["context"] == 256
    assert profile["num_speculative_tokens"] == 6 and profile["context_lengths"] == [256, 1024]
    assert profile["conditional_accept_rates"] == [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    assert profile["marginal_accept_rates"] == pytest.approx(np.cumprod([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), abs=1e-6)
    assert profile["tau_measured"] == {"mean": 3.1, "ci95": 0.1} and profile["n_contexts"] == 40
    assert profile["by_context"]["1024"]["n_contexts"] == 64  # none recorded there: the protocol's
    assert profile["by_context"]["1024"]["conditional_accept_rates"] is None  # no curve at 1024: tau alone
    assert profile["source"] == {"run": "demo", "notebook": NOTEBOOK, "file": "results.json", "keys": [
        "04_measure_tau.tau", "04_measure_tau.per_position_acceptance", "04_measure_tau.tau_protocol"]}
    assert profile["measurement"] == {"temperature": 0.0, "new_tokens": 32, "batch_size": 8, "seed": 3}
    assert profile["dynamo_mocker_args"] == ["--aic-nextn", "5", "--aic-nextn-accept-rates", "0.9,0.8,0.7,0.6,0.5"]
    at_1024 = acceptance_profile(RUN, "eagle3", 2000, "demo")
    assert at_1024["context"] == 1024 and at_1024["conditional_accept_rates"] is None
    assert at_1024["dynamo_mocker_args"] is None and at_1024["num_speculative_tokens"] == 6
    assert acceptance_profile(RUN, "spire", 300, "demo") is None  # not measured at 256, the nearest
    assert acceptance_profile({}, "eagle3", 300, "demo") is None
