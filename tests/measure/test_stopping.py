"""The stopping rule of notebook 04 (`spirelib.measure.stopping`, method §5, §8): the interval a
stopped (method, L) reports still covers its tau in at least 94% of simulated measurements; the
rule decides on `AcceptCounts.stats()`' own interval; and its price (`expected_contexts`) matches
the simulation.

The simulation follows tests/measure/test_tau_calibration.py: contexts decode under the engine's
stopping rule (a context stops after the round that brings it to G tokens; that round counts in
full), at k = 4 and G = 64. Here each context's acceptance alpha is drawn from a known distribution
(i.i.d. rounds within a context, contexts that differ from each other). So one context's (rounds X,
tokens Y) is a draw from the mixture of `stopping.context_outcomes` over that distribution, which
is exact, and the truth, E[Y] / E[X], is exact too. The first test checks those outcomes against
rounds simulated from uniforms. Each case runs REPS replicate measurements of the rule at its
defaults (half-width 0.05, floor 64), deciding after every BATCH = 2 contexts (the harshest
schedule: 04 decides after each batch of its decode_batch_size), with a cap far enough out that the
rule, not the cap, stops them (checked).

Coverage per case at these seeds: lookup-like 1.000, lookup-like i.i.d. 1.000, rare repeats 0.998,
vanilla-like 0.960, MagicDec-like 0.953, spread contexts 0.955, high variance 0.949. Three mutation
checks were made by editing the rule once and then reverting it:
- without the floor (the rule asked from 2 contexts), coverage fails for rare repeats (0.915),
  vanilla-like (0.919) and MagicDec-like (0.923), and every case fails its floor check;
- reporting the t half-width at the stop instead of the fixed width fails lookup-like (0.929) and
  rare repeats (0.871);
- a quantile of 1.0 in place of Student's t fails MagicDec-like (0.738), spread contexts (0.682),
  high variance (0.684) and the price checks.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from spirelib.measure.stopping import (
    FLOOR,
    HALF_WIDTH,
    PAPER_SPREAD,
    StoppingRule,
    context_outcomes,
    expected_contexts,
    iid_spread,
    rule_problems,
)
from spirelib.measure.tau import AcceptCounts, linearize
from spirelib.throughput.acceptance import tau_from_alpha

K, G = 4, 64  # the protocol's draft depth and tokens per context (method §5)
REPS, BATCH = 4000, 2
RULE = StoppingRule(HALF_WIDTH, FLOOR)  # the rule at its defaults
ROUNDS = np.arange(G + 1)[:, None]  # the rows of `context_outcomes`: X = 0..G
TOKENS = G + np.arange(K + 1)[None, :]  # its columns: Y = G..G+k


def quantiles(draw, grid: int = 40) -> np.ndarray:
    return draw((np.arange(grid) + 0.5) / grid)


def gamma_alphas(mean: float, shape: float) -> np.ndarray:
    from scipy.stats import gamma

    return np.clip(quantiles(lambda q: gamma.ppf(q, shape, scale=mean / shape)), 0.0, 0.95)


def beta_alphas(mean: float, sd: float) -> np.ndarray:
    from scipy.stats import beta

    c = mean * (1 - mean) / sd**2 - 1
    return quantiles(lambda q: beta.ppf(q, mean * c, (1 - mean) * c))


#: Each case: the per-context alphas, equally likely, or (alphas, weights); and its cap of contexts.
CASES = {
    # prompt lookup near tau = 1: most contexts accept rarely, a few that repeat themselves accept more
    # (tau 1.030, spread 0.047: the default run's lookup was 1.03 +- 0.007 over 192 contexts, spread 0.049)
    "lookup-like": (gamma_alphas(0.03, 0.5), 512),
    "lookup-like, i.i.d.": (np.array([0.029]), 512),  # the same tau, no spread between contexts (0.022)
    "rare repeats": ((np.array([0.02, 0.7]), np.array([0.95, 0.05])), 512),  # tau 1.054, spread 0.154, skewed
    "vanilla-like": (np.array([0.5]), 512),  # tau 1.94, spread 0.21: resolved near the floor (66 contexts)
    "MagicDec-like": (np.array([0.8]), 512),  # tau 3.36, spread 0.36: about 200 contexts
    "spread contexts": (beta_alphas(0.72, 0.1), 1024),  # tau 2.84, spread 0.63 (the default run's SPIRe: 0.40)
    "high variance": (np.linspace(0.2, 0.95, 16), 1536),  # tau 2.11, spread 0.83: about 1,060 contexts
}


@functools.cache
def outcomes(case: str) -> np.ndarray:
    alphas = CASES[case][0]
    alphas, weights = alphas if isinstance(alphas, tuple) else (alphas, np.ones(len(alphas)))
    return sum(w * context_outcomes(float(a), K, G) for a, w in zip(alphas, weights)) / weights.sum()


def truth(pmf: np.ndarray) -> float:
    return float((pmf * TOKENS).sum() / (pmf * ROUNDS).sum())


def spread(pmf: np.ndarray) -> float:
    """The per-context standard deviation of the linearized estimate, sd(Y - tau X) / E[X], exactly."""
    tau, mean_x = truth(pmf), float((pmf * ROUNDS).sum())
    return math.sqrt(float((pmf * (TOKENS - tau * ROUNDS) ** 2).sum())) / mean_x


def draw_contexts(pmf: np.ndarray, rng: np.random.Generator, shape) -> tuple[np.ndarray, np.ndarray]:
    """Tokens Y and rounds X of `shape` independent contexts, each a draw from `pmf`: the inverse of
    its distribution function at uniforms, started from a guide table and stepped up to the first
    outcome whose cumulative probability passes the uniform (several times faster than a search)."""
    cdf = np.cumsum(pmf.ravel()) / pmf.sum()
    cdf[-1] = np.inf  # every uniform stops at the last outcome at the latest
    u = rng.random(math.prod(shape))
    index = np.searchsorted(cdf, np.arange(4096) / 4096, side="right")[(u * 4096).astype(np.int64)]
    todo = np.flatnonzero(cdf[index] <= u)
    while todo.size:
        index[todo] += 1
        todo = todo[cdf[index[todo]] <= u[todo]]
    rounds, extra = np.divmod(index.reshape(shape), K + 1)
    return (G + extra).astype(np.float64), rounds.astype(np.float64)


@functools.cache
def stopped_measurements(case: str, rule: StoppingRule = RULE) -> dict[str, np.ndarray]:
    """REPS measurements of `case` under `rule`: contexts in batches of BATCH up to the case's cap,
    the rule asked after each batch with the spread of the linearized estimate over the contexts so
    far (`linearize`, from running sums). Returns each measurement's tau, reported half-width and
    contexts, and the cap."""
    cap = CASES[case][1]
    tokens, rounds = draw_contexts(outcomes(case), np.random.default_rng(list(CASES).index(case)), (REPS, cap))
    per_batch = [(v.reshape(REPS, -1, BATCH).sum(-1)).cumsum(-1) for v in
                 (tokens, rounds, tokens * tokens, tokens * rounds, rounds * rounds)]
    done = np.zeros(REPS, bool)
    out = {name: np.zeros(REPS) for name in ("tau", "reported", "n")}
    for j in range(cap // BATCH):
        n = (j + 1) * BATCH
        y, x, yy, xy, xx = (s[:, j] for s in per_batch)
        tau = y / x
        std = np.sqrt(np.maximum(yy - 2 * tau * xy + tau**2 * xx, 0) / (n - 1)) / (x / n)  # sd(Y - tau X) / mean X
        stop = ~done & (rule.resolved(n, std) | (n == cap))
        out["tau"][stop], out["n"][stop] = tau[stop], n
        out["reported"][stop] = rule.reported(rule.interval(n, std[stop]))
        done |= stop
    return {**out, "cap": cap}


def simulate_rounds(alpha: float, n: int, seed: int) -> AcceptCounts:
    """n contexts decoded round by round from uniforms (test_tau_calibration's `stopped`): draft j
    accepted while its uniform is below alpha and 1..j-1 were; -1 after a context has G tokens."""
    u = np.random.default_rng(seed).random((K, n, G))
    alive = u[0] < alpha
    accepted = alive.astype(np.int64)
    for v in u[1:]:
        alive &= v < alpha
        accepted += alive
    before = np.cumsum(accepted + 1, axis=-1) - (accepted + 1)
    return AcceptCounts(torch.from_numpy(np.where(before < G, accepted, -1)), K)


# ---------------------------------------------------------------------------- the simulation


@pytest.mark.parametrize("alpha", [0.029, 0.5, 0.8])
def test_context_outcomes_are_the_engines_rounds(alpha):
    """`context_outcomes` is the distribution of (X, Y) that rounds simulated from uniforms give
    (each of its cells within 4.5 standard errors over 20,000 contexts). Its E[Y] / E[X] is
    tau(alpha) exactly (Wald's identity)."""
    pmf = context_outcomes(alpha, K, G)
    assert pmf.sum() == pytest.approx(1, abs=1e-12) and truth(pmf) == pytest.approx(tau_from_alpha(alpha, K), abs=1e-12)
    y, x = simulate_rounds(alpha, 20_000, seed=int(alpha * 1000)).tokens_and_rounds()
    seen = np.zeros_like(pmf)
    np.add.at(seen, (x.numpy().astype(int), y.numpy().astype(int) - G), 1 / 20_000)
    assert np.all(np.abs(seen - pmf) <= 4.5 * np.sqrt(pmf * (1 - pmf) / 20_000) + 1e-4)


def test_the_rule_decides_on_the_interval_stats_reports():
    """The rule's half-width is `AcceptCounts.stats()`' t half-width, and the running-sum spread the
    simulation asks it with is `linearize`'s."""
    counts = simulate_rounds(0.6, 50, seed=3)
    s = counts.stats()
    assert StoppingRule.interval(s.n_contexts, s.std) == pytest.approx(s.ci95, rel=1e-12)
    tokens, rounds = (v.numpy() for v in counts.tokens_and_rounds())
    n, tau = tokens.size, tokens.sum() / rounds.sum()
    running = math.sqrt(((tokens - tau * rounds) ** 2).sum() / (n - 1)) / rounds.mean()
    assert running == pytest.approx(float(linearize(*counts.tokens_and_rounds())[1].std()), rel=1e-12)
    rule = StoppingRule(0.1, 40)
    assert rule.resolved(50, s.std) == (s.ci95 <= 0.1) and not rule.resolved(39, 0.0)
    assert not rule.resolved(50, float("nan")) and math.isnan(rule.interval(1, 0.3))
    assert rule.reported(0.03) == 0.1 and rule.reported(0.2) == 0.2 and math.isnan(rule.reported(float("nan")))


@pytest.mark.parametrize("case", list(CASES))
def test_a_stopped_interval_covers_tau(case):
    """The reported interval covers the true tau in at least 94% of REPS stopped measurements
    (module docstring: the figures, and the mutations that fail). The rule, not the cap, stops
    them: fewer than 1% reach it."""
    m = stopped_measurements(case)
    coverage = float(np.mean(np.abs(m["tau"] - truth(outcomes(case))) < m["reported"]))
    assert coverage >= 0.94, (case, coverage, m["n"].mean())
    assert np.mean(m["n"] == m["cap"]) < 0.01 and m["n"].min() >= FLOOR


# ---------------------------------------------------------------------------- its price


@pytest.mark.parametrize("case", ["vanilla-like", "MagicDec-like", "spread contexts", "high variance"])
def test_expected_contexts_is_what_the_simulated_rule_draws(case):
    """Given a case's tau and spread, `expected_contexts` is within 3% of the contexts the
    simulated rule draws on average (the simulation: 71, 204, 614 and 1,061)."""
    pmf, m = outcomes(case), stopped_measurements(case)
    assert expected_contexts(truth(pmf), spread(pmf), cap=m["cap"], batch=BATCH) == pytest.approx(m["n"].mean(), rel=0.03)


def test_expected_contexts_at_its_limits():
    """No stopping (half-width 0): the cap. No spread: the first batch that reaches the floor.
    A spread too wide to resolve: the cap. More spread never costs fewer contexts. Without a
    spread, the i.i.d. one at that tau (a lower bound of real drafts'), which `iid_spread` checks
    against simulated rounds."""
    assert expected_contexts(3.0, 0.4, 0.0, 64, 192, 64) == 192
    assert expected_contexts(3.0, 0.0, 0.05, 64, 192, 64) == 64
    assert expected_contexts(3.0, 0.0, 0.05, 100, 192, 64) == 128
    assert expected_contexts(3.0, 0.0, 0.05, 64, 100, 64) == 64
    assert expected_contexts(3.7, PAPER_SPREAD, 0.05, 64, 192, 64) == pytest.approx(192, abs=0.5)
    costs = [expected_contexts(2.0, sd, 0.05, 64, 2048, 64) for sd in (0.1, 0.2, 0.3, 0.5, 1.0)]
    assert costs == sorted(costs) and costs[0] == 64 and costs[-1] > 1500
    assert expected_contexts(1.9375, None, cap=2048, batch=64) == expected_contexts(1.9375, iid_spread(1.9375),
                                                                                     cap=2048, batch=64)
    counts = simulate_rounds(0.5, 20_000, seed=5)
    assert iid_spread(1.9375) == pytest.approx(counts.stats().std, rel=0.03)
    assert iid_spread(5.0) == 0.0


def test_the_parameters_are_checked():
    assert rule_problems(0.05, 64) == [] and rule_problems(0, 2) == []
    assert len(rule_problems(-0.1, 1)) == 2 and len(rule_problems("0.05", 64.0)) == 2
    with pytest.raises(ValueError, match="half_width > 0"):
        StoppingRule(0.0, 64)
    with pytest.raises(ValueError, match="tau_floor"):
        StoppingRule(0.05, 1)
