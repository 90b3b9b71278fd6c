"""Calibration of tau's intervals (method §5, §8; issue 25): `AcceptCounts.stats()` and
`delta_tau` checked by simulation under the engine's stopping rule, and their widths checked
to 1e-9 against hand-chosen counts, so that a unit error in the delta-method linearization
fails at once.

Each test fails under at least one of these deliberate mistakes in tau.py: the mean of
per-context ratios instead of the pooled ratio; dividing the linearization by mean tokens
instead of mean rounds; n instead of n - 1 degrees of freedom (sample variance, t); dropping
delta_tau's between-seed term. Which test catches which is said in each test's docstring.
"""

import functools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from spirelib.engine.tau import AcceptCounts, delta_tau, t_quantile
from spirelib.modeling.acceptance import tau_from_alpha

K, G = 4, 64  # the protocol's draft depth and tokens per context (method §5)
N, REPS = 64, 400  # contexts per measurement (one batch) and replicates per calibration
# Student's t 0.975 quantiles in closed form (2 and 4 degrees of freedom), independent of t_quantile
T2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T4 = 2 * math.sqrt(math.cos(math.acos(math.sqrt(4 * 0.975 * 0.025)) / 3) / math.sqrt(4 * 0.975 * 0.025) - 1)


def stopped(uniforms: np.ndarray, alpha: float) -> np.ndarray:
    """Accept counts (..., n, G) of contexts under the engine's stopping rule, from uniforms
    (K, ..., n, G): draft j of a round is accepted when its uniform is below alpha and drafts
    1..j-1 were (i.i.d. acceptance alpha), so a round emits accepted + 1 tokens.

    Mirrors `speculative.Rows.settle`: a row takes part in a round while it has produced
    fewer than G tokens; that round's accepted count is recorded in full and all its
    accepted + 1 tokens count (the last round is not truncated to the tokens still needed,
    it may overshoot G); afterwards the row records -1. Every round emits at least one
    token, so G rounds always suffice. The same uniforms thresholded at two alphas are the
    common random numbers two drafts decoding the same batch see."""
    alive = uniforms[0] < alpha
    accepted = alive.astype(np.int64)
    for u in uniforms[1:]:
        alive &= u < alpha
        accepted += alive
    emitted = accepted + 1
    before = np.cumsum(emitted, axis=-1) - emitted  # tokens a row had produced before each round
    return np.where(before < G, accepted, -1)


def uniforms(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).random((K, *shape, N, G), dtype=np.float32)


def counts(accepted: np.ndarray) -> AcceptCounts:
    """One measurement's counts, as `measure_tau` builds them: (n, R) int64, -1 once a row finished."""
    return AcceptCounts(torch.from_numpy(accepted), K)


@functools.cache
def independent(alpha: float) -> np.ndarray:
    """REPS independent measurements of N contexts at acceptance alpha: (REPS, N, G)."""
    return stopped(uniforms(round(alpha * 1000), REPS), alpha)


@functools.cache
def stats_replicates(alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tau estimate, ci95 and std of each of the REPS measurements at alpha."""
    stats = [counts(a).stats() for a in independent(alpha)]
    return tuple(np.array([getattr(s, name) for s in stats]) for name in ("mean", "ci95", "std"))


@functools.cache
def paired(alpha_a: float, alpha_b: float, seed: int, *shape: int) -> tuple[np.ndarray, np.ndarray]:
    """Measurements of two drafts on the same contexts with common random numbers (as
    `measure_tau` gives two methods decoding the same batches): two (*shape, N, G) arrays."""
    u = uniforms(seed, *shape)
    return stopped(u, alpha_a), stopped(u, alpha_b)


# ---------------------------------------------------------------------------- known widths


def hand_counts(*rows: list[int]) -> AcceptCounts:
    return AcceptCounts(torch.tensor([row + [-1] * (6 - len(row)) for row in rows]), K)


# Three contexts, tokens Y_i (accepted + 1 summed, the last round in full) in X_i rounds:
A = hand_counts([4, 4, 4], [0, 1, 2, 0, 0], [3, 1, 0, 2])  # (Y, X) = (15, 3), (8, 5), (10, 4)
B = hand_counts([1, 1, 2, 1], [1, 1, 1, 1, 1], [2, 2, 4])  # (Y, X) = (9, 4), (10, 5), (11, 3)


def linearized(yx: list[tuple[int, int]]) -> tuple[Fraction, list[Fraction]]:
    """Pooled tau = sum Y / sum X and z_i = (Y_i - tau X_i) / mean(X), in exact arithmetic."""
    tau = Fraction(sum(y for y, _ in yx), sum(x for _, x in yx))
    mean_x = Fraction(sum(x for _, x in yx), len(yx))
    return tau, [(y - tau * x) / mean_x for y, x in yx]


def sample_variance(z: list[Fraction]) -> Fraction:
    mean = sum(z) / len(z)
    return sum((v - mean) ** 2 for v in z) / (len(z) - 1)


def test_stats_width_matches_a_hand_computed_variance():
    """tau = 33/12 = 2.75 (pooled; the mean of ratios would be (5 + 1.6 + 2.5) / 3); d_i =
    Y_i - tau X_i = (6.75, -5.75, -1); mean X = 4; std = sqrt(79.625 / 2) / 4; ci95 =
    t_{0.975, 2} std / sqrt(3). Catches: mean of ratios, tokens for rounds, n for n - 1 (in the
    sample variance and in the t's degrees of freedom)."""
    assert A.tokens_and_rounds()[0].tolist() == [15, 8, 10] and A.tokens_and_rounds()[1].tolist() == [3, 5, 4]
    tau, z = linearized([(15, 3), (8, 5), (10, 4)])
    assert tau == Fraction(11, 4) and z == [Fraction(27, 16), Fraction(-23, 16), Fraction(-1, 4)]
    std = math.sqrt(79.625 / 2) / 4
    assert std == pytest.approx(math.sqrt(sample_variance(z)), rel=1e-15)
    stats = A.stats()
    assert stats.mean == 2.75 and stats.n_contexts == 3 and stats.rounds == 12
    assert abs(stats.std - std) < 1e-9
    assert abs(stats.ci95 - T2 * std / math.sqrt(3)) < 1e-9


def test_delta_tau_width_matches_a_hand_computed_variance():
    """One seed: A - B on the same three contexts, tau 2.75 - 2.5; z_i = (d_A,i - d_B,i) / 4 =
    (1.9375, -0.8125, -1.125); within = s_z^2 / 3; ci95 = t_{0.975, 2} sqrt(within). Two seeds
    ((A, B) and (A, A)): the mean of (0.25, 0), variance (within + 0) / 2^2 plus the between-seed
    spread var(0.25, 0) / 2 = 1/64, t with 2 (3 - 1) = 4 degrees of freedom. Catches: mean of
    ratios, tokens for rounds, n for n - 1 (variance, t), dropping the between-seed term."""
    (tau_a, z_a), (tau_b, z_b) = linearized([(15, 3), (8, 5), (10, 4)]), linearized([(9, 4), (10, 5), (11, 3)])
    z = [x - y for x, y in zip(z_a, z_b)]
    assert tau_a - tau_b == Fraction(1, 4) and z == [Fraction(31, 16), Fraction(-13, 16), Fraction(-9, 8)]
    within = float(sample_variance(z) / 3)
    assert within == pytest.approx(5.6796875 / 2 / 3, rel=1e-15)

    one = delta_tau([A], [B])
    assert one.mean == 0.25 and one.per_seed == (0.25,)
    assert abs(one.ci95 - T2 * math.sqrt(within)) < 1e-9

    two = delta_tau([A, A], [B, A])
    assert two.per_seed == (0.25, 0.0) and two.mean == 0.125
    between = (0.25 - 0.125) ** 2 * 2 / (2 - 1) / 2  # sample variance of the seeds' differences / S
    assert between == 1 / 64
    assert abs(two.ci95 - T4 * math.sqrt((within + 0) / 2**2 + between)) < 1e-9


# ---------------------------------------------------------------------------- simulation


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.85])
def test_stats_interval_covers_the_closed_form(alpha):
    """REPS measurements of N contexts under the stopping rule: the 95% interval covers
    (1 - alpha^(k+1)) / (1 - alpha) in 90-99% of them (94% at each alpha). Catches: tokens for
    rounds (coverage 42-66%), mean of ratios (86-87%: its bias)."""
    means, ci95, _ = stats_replicates(alpha)
    coverage = float(np.mean(np.abs(means - tau_from_alpha(alpha, K)) < ci95))
    assert 0.90 <= coverage <= 0.99, coverage


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.85])
def test_stats_estimate_is_unbiased_and_its_std_is_the_spread_between_replicates(alpha):
    """The pooled ratio shows no bias beyond 3 standard errors of the mean of REPS estimates
    (the mean of per-context ratios is biased upwards by ~0.02-0.035 here, tens of standard
    errors), and std / sqrt(n) is, in root mean square, the standard deviation of the
    estimates between replicates (within 12%; 0.95-0.96 here). Catches: mean of ratios (bias
    15-17 standard errors), tokens for rounds (std tau times too small)."""
    means, _, std = stats_replicates(alpha)
    tau = tau_from_alpha(alpha, K)
    spread = float(means.std(ddof=1))
    assert abs(float(means.mean()) - tau) < 3 * spread / math.sqrt(REPS), (means.mean(), tau, spread)
    ratio = math.sqrt(float(np.mean(std**2)) / N) / spread
    assert 0.88 < ratio < 1.12, ratio


@pytest.mark.parametrize("alpha_a, alpha_b, pairing", [
    (0.7, 0.5, "independent"),
    (0.7, 0.5, "paired"),
    (0.72, 0.70, "paired"),  # two similar drafts, as 05's ablations
])
def test_delta_tau_covers_the_true_difference(alpha_a, alpha_b, pairing):
    """delta_tau's 95% interval covers tau(alpha_a) - tau(alpha_b) in 90-99% of REPS
    measurements, for independent contexts and for the same contexts with common random
    numbers (92%, 94%, 94%). Catches: tokens for rounds (the interval ~tau times too narrow:
    54-57%). Not the mean of ratios: its upward bias largely cancels in a difference (the
    hand-computed width test catches that one)."""
    if pairing == "independent":
        a, b = independent(alpha_a), independent(alpha_b)
    else:
        a, b = paired(alpha_a, alpha_b, 7, REPS)
    truth = tau_from_alpha(alpha_a, K) - tau_from_alpha(alpha_b, K)
    covered = [abs((d := delta_tau([counts(x)], [counts(y)])).mean - truth) < d.ci95 for x, y in zip(a, b)]
    coverage = float(np.mean(covered))
    assert 0.90 <= coverage <= 0.99, coverage


@pytest.mark.parametrize("seed_alphas", [(0.72, 0.72), (0.724, 0.716)], ids=["seeds-alike", "seeds-differ"])
def test_between_seed_term_adds_the_within_seed_noise_once_more(seed_alphas):
    """Two training seeds (05's ablation_seeds), each measured paired on its own contexts:
    draft b at alpha 0.70, draft a at `seed_alphas` (its quality may vary with the seed). The
    variance of the mean difference is the within-seed part sum_s w_s / S^2 plus the
    between-seed term var(per-seed differences) / S. That term holds the within-seed noise
    once more, plus the true spread of the seeds' differences / S: averaged over REPS
    measurements, term - within-seed part = var(true differences) / S (0 where the seeds are
    alike), within 4 Monte Carlo standard errors. So the interval is conservative for the
    mean of the seeds' true differences: it covers it in at least 94% of measurements
    (96% / 99% here; 93% without the term, as one seed's interval at this n). Catches:
    dropping the between-seed term (the added variance, decisively; the coverage, narrowly);
    tokens for rounds (seeds alike: coverage 80%)."""
    S, alpha_b = len(seed_alphas), 0.70
    runs = [paired(alpha_a, alpha_b, 100 + s, REPS) for s, alpha_a in enumerate(seed_alphas)]
    true = [tau_from_alpha(alpha_a, K) - tau_from_alpha(alpha_b, K) for alpha_a in seed_alphas]
    t_within, t_both = t_quantile(0.975, N - 1), t_quantile(0.975, S * (N - 1))
    added, covered = [], []
    for r in range(REPS):
        a, b = [counts(run[0][r]) for run in runs], [counts(run[1][r]) for run in runs]
        both = delta_tau(a, b)
        within_part = sum((delta_tau([x], [y]).ci95 / t_within) ** 2 for x, y in zip(a, b)) / S**2
        between = (both.ci95 / t_both) ** 2 - within_part
        added.append(between - within_part)
        covered.append(abs(both.mean - sum(true) / S) < both.ci95)
    expected = float(np.var(true, ddof=1)) / S
    mc_error = float(np.std(added, ddof=1)) / math.sqrt(REPS)
    assert abs(float(np.mean(added)) - expected) < 4 * mc_error, (np.mean(added), expected, mc_error)
    coverage = float(np.mean(covered))
    assert coverage >= 0.94, coverage
