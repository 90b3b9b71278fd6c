"""tau from acceptance and the best draft depth (method §8 vocabulary: tau includes the bonus token)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spirelib.throughput.acceptance import (
    acceptance_rate,
    alpha_from_tau,
    best_k,
    per_position_from_counts,
    tau_at_depth,
    tau_from_alpha,
    tau_from_per_position,
)
from spirelib.throughput.perfmodel import throughput_multiplier


def test_tau_from_alpha_matches_the_closed_form_and_its_limits():
    assert tau_from_alpha(0.0, 4) == 1.0
    assert tau_from_alpha(1.0, 4) == 5.0
    assert tau_from_alpha(0.5, 4) == pytest.approx((1 - 0.5**5) / (1 - 0.5))
    assert np.allclose(tau_from_alpha(np.array([0.2, 0.8]), 3), [(1 - 0.2**4) / 0.8, (1 - 0.8**4) / 0.2])


@settings(max_examples=100, deadline=None)
@given(alpha=st.floats(0.0, 1.0), k=st.integers(1, 12))
def test_alpha_and_tau_invert_each_other(alpha, k):
    tau = tau_from_alpha(alpha, k)
    assert 1 <= tau <= k + 1
    assert tau_from_alpha(alpha_from_tau(tau, k), k) == pytest.approx(tau, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(alpha=st.floats(0.0, 1.0), k=st.integers(1, 12))
def test_iid_per_position_acceptance_gives_the_iid_tau(alpha, k):
    assert tau_from_per_position(np.full(k, alpha)) == pytest.approx(tau_from_alpha(alpha, k))


def test_acceptance_rate_of_a_round_histogram_counts_the_bonus_token_in_tau():
    # 10 rounds: 2 accepted none (1 token each), 3 accepted 2 (3 each), 5 accepted all 4 (5 each)
    tau = (2 * 1 + 3 * 3 + 5 * 5) / 10
    assert acceptance_rate(tau, 4) == pytest.approx((3 * 2 + 5 * 4) / (10 * 4))


def test_per_position_acceptance_from_a_histogram_reproduces_its_tau():
    counts = np.array([[2, 0, 3, 0, 5], [10, 20, 30, 25, 15]])  # rounds that accepted n = 0..4 drafts
    p = per_position_from_counts(counts)
    assert p.shape == (2, 4)
    assert p[0, 0] == pytest.approx(8 / 10)  # 8 of 10 rounds accepted draft 1
    assert p[0, 1] == pytest.approx(8 / 8)
    tau = (counts * np.arange(1, 6)).sum(-1) / counts.sum(-1)  # a round accepting n drafts emits n + 1 tokens
    assert np.allclose(tau_from_per_position(p), tau)


def test_unreached_positions_are_nan_not_zero():
    p = per_position_from_counts([4, 0, 0])
    assert p[0] == 0 and np.isnan(p[1])


def test_tau_at_depth_truncates_a_measured_curve_but_never_extrapolates():
    p = np.array([0.9, 0.8, 0.7, 0.6])
    assert tau_at_depth(p, 2) == pytest.approx(1 + 0.9 + 0.9 * 0.8)
    assert tau_at_depth(0.8, 6) == tau_from_alpha(0.8, 6)
    with pytest.raises(ValueError, match="k=5"):
        tau_at_depth(p, 5)


def test_best_k_is_the_argmax_over_depths():
    k, tm = best_k("spire", 0.8, 64, 512, "seqax-67m", "spire-draft", k_max=8)
    by_depth = [throughput_multiplier("spire", tau_from_alpha(0.8, d), 64, 512, "seqax-67m", "spire-draft", k=d)
                for d in range(1, 9)]
    assert k == int(np.argmax(by_depth)) + 1
    assert tm == max(by_depth)


def test_best_k_grows_with_acceptance_and_broadcasts():
    low, _ = best_k("spire", 0.5, 64, 512, "seqax-67m", "spire-draft")
    high, _ = best_k("spire", 0.95, 64, 512, "seqax-67m", "spire-draft")
    assert low < high
    ks, tms = best_k("magicdec", 0.8, np.array([[1], [64]]), np.array([[64, 8192]]), "seqax-67m")
    assert ks.shape == tms.shape == (2, 2)
    assert ks[1, 1] == best_k("magicdec", 0.8, 64, 8192, "seqax-67m")[0]


def test_best_k_from_a_per_position_curve_searches_its_measured_depths():
    k, _ = best_k("spire", np.array([0.99, 0.99, 0.1]), 64, 512, "seqax-67m", "spire-draft")
    assert k == 2  # a third draft is almost never accepted: not worth its pass


@pytest.mark.parametrize("call, name", [
    (lambda: tau_from_alpha(1.2), "alpha"),
    (lambda: tau_from_alpha(0.5, 0), "k"),
    (lambda: alpha_from_tau(6.0, 4), "tau"),
    (lambda: tau_from_per_position([0.5, 1.5]), "per_position"),
    (lambda: per_position_from_counts([0, 0, 0]), "counts"),
    (lambda: per_position_from_counts([-1, 3]), "counts"),
])
def test_bad_inputs_raise_value_errors_naming_them(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_a_position_never_reached_counts_nothing_after_one_that_accepted_nothing():
    assert tau_from_per_position([0.0, float("nan"), float("nan")]) == 1.0
    assert tau_from_per_position([[0.5, 0.0, float("nan")], [1.0, 0.5, 0.5]]).tolist() == [1.5, 2.75]
    with pytest.raises(ValueError, match="per_position"):
        tau_from_per_position([0.5, float("nan")])  # reached with probability 0.5: nan is no probability
