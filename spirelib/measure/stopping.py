"""When notebook 04 has measured a (method, L) well enough: a sequential stopping rule over batches
of contexts, the interval a stopped cell reports, and what the rule is expected to cost (method
§5, §8).

**The interval.** Method §5 reports tau with its 95% interval, and method §8 says a headline is no
stronger than that interval. The interval is the one `tau.AcceptCounts.stats()` reports: the pooled
ratio's delta-method t-interval with contexts as the unit, t_{0.975, n-1} * std / sqrt(n), where std
is the per-context standard deviation of the linearized estimate (`tau.linearize`).

**The rule** (`StoppingRule`, run by `tau.measure_tau`). Each method at each L draws contexts a batch
at a time, in batch order and on the same batches as every other method. It stops once it has at
least `floor` contexts and that half-width is at most `half_width`, and never goes past the cap (04's
n_contexts). A stopped cell then reports tau +- max(t half-width, `half_width`) (`reported`): the
fixed-width interval of a sequential rule (Chow and Robbins 1965 stop once the interval is at most
2 d wide and report mean +- d; their rule adds 1/n to the variance, where this one has its floor). A cell that reaches the cap unresolved reports its t half-width,
which is then the wider of the two.

Why the fixed width, and not the t-interval at the stop: where the per-context terms are skewed,
the t-interval under-covers, and this is worst at the small n where a cell with a tiny spread stops.
The example is a prompt-lookup-like draft near tau = 1, where a few contexts that repeat themselves
accept most of the drafts. In tests/measure/test_stopping.py such a draft (each context's alpha
drawn from a Gamma with mean 0.03 and shape 0.5) gets t coverage 0.93-0.94 at 64 contexts, and
0.946 at 192 contexts without any stopping. Where 5% of the contexts accept 35 times more than the
rest, t coverage is 0.87 at 64 contexts and 0.93 at 192. With the fixed width these get 1.000 and
0.998.

**Why `HALF_WIDTH` = 0.05.** It is the precision the comparisons of 04 and the index need, and
no finer:
- The index reads the order of the drafts at L = 512 (`paper_claims.tau_order`). There SPIRe
  against MagicDec differs by 0.49 in the paper and by 0.66 in the default run, and vanilla by
  more still.
- 04's words compare each method over L: the trend, and the fall past the training windows
  (`narrative.decoding.lead`, `past_training`). Such a change is resolved when it exceeds the two
  half-widths combined, sqrt(2) * 0.05 = 0.071. The paper's MagicDec falls 0.21 from L = 256 to 960.
- 06 and 09 divide tau by the modeled iteration time, so at tau 3.7 an error of +-0.05 is a
  1.4% error in the modeled speedup.
- It is also the precision the default run already had at its 192 contexts (vanilla 0.042,
  MagicDec 0.048, SPIRe 0.057). The rule keeps that precision where it costs contexts, and stops
  drawing where it is 7x finer than needed (prompt lookup's 1.03 +- 0.007).

**Why `FLOOR` = 64 contexts** (one batch of the default series). Below it the sample standard
deviation is too noisy to stop on. With a check after every 2 contexts and a floor of 2, the
stopped intervals cover only 0.915-0.923 (the test's mutation check: rare repeats, vanilla-like,
MagicDec-like). A skewed cell also needs its rarer contexts in the sample before it may stop: at
64 contexts, a 5% share of highly accepting contexts is missing from 3.7% of samples.

**Limits.** The rule is checked where it is used (h = 0.05, floor 64). When strongly skewed cells
are asked for a much finer h (0.01-0.02, with 5% of the contexts accepting 35 times more), they
stop early on samples that happen to lack their rare contexts and under-cover (0.89-0.90 simulated).
The fixed width cannot fix a rare mode that the sample never saw, so asking for such an h needs a
larger floor.

**The price** (`expected_contexts`): the contexts a (method, L) is expected to draw, from its tau
and per-context spread. That spread comes from a last run's `TauStats.std`, or from the paper's
(`PAPER_SPREAD`). Without either, the i.i.d.-acceptance spread at that tau (`iid_spread`) serves:
a lower bound, since real contexts differ more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from spirelib.measure.intervals import t_quantile
from spirelib.throughput.acceptance import alpha_from_tau

HALF_WIDTH = 0.05  # target 95% half-width of tau (module docstring: why)
FLOOR = 64  # contexts a (method, L) draws before it may stop
#: The paper's per-context spread of tau's linearized estimate: +-0.004 over 65,536 contexts (method §5,
#: 04's Table 1), 0.004 * sqrt(65,536) / 1.96. The default run measured 0.30-0.40 for its trained drafts.
PAPER_SPREAD = 0.004 * math.sqrt(65_536) / 1.96


def rule_problems(half_width, floor) -> list[str]:
    """What is wrong with notebook 04's stopping parameters, in words ([] when nothing is):
    `half_width` a number >= 0 (0: no stopping, every L on all contexts), `floor` an integer >= 2
    (a standard deviation needs two contexts)."""
    out = []
    if isinstance(half_width, bool) or not isinstance(half_width, (int, float)) or not half_width >= 0:
        out.append(f"tau_half_width must be a number >= 0 (0: no stopping), got {half_width!r}")
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 2:
        out.append(f"tau_floor must be an integer >= 2 (contexts before a method may stop), got {floor!r}")
    return out


class Rule(Protocol):
    """What `tau.measure_tau` asks of a stopping rule after each batch: which of the methods still
    running at one L stop now, given each one's `tau.AcceptCounts` so far (04's `StoppingRule`, one
    method at a time; 05's `ablations.DeltaRule`, its whole table at once)."""

    def stopped(self, counts: Mapping) -> list[str]: ...


@dataclass(frozen=True)
class StoppingRule:
    """Draw contexts until tau's 95% half-width is at most `half_width`, at least `floor` of them
    (module docstring). The cap is the caller's: the contexts it has."""

    half_width: float = HALF_WIDTH
    floor: int = FLOOR

    def __post_init__(self):
        problems = rule_problems(self.half_width, self.floor)
        if problems or not self.half_width > 0:
            raise ValueError("; ".join(problems) or "a StoppingRule needs half_width > 0")

    @staticmethod
    def interval(n: int, std):
        """tau's 95% t half-width at n contexts with per-context standard deviation `std` (a float
        or an array), as `AcceptCounts.stats()` computes it: t_{0.975, n-1} * std / sqrt(n); NaN
        below two contexts."""
        if n < 2:
            return np.full_like(np.asarray(std, dtype=float), np.nan)[()]
        return t_quantile(0.975, n - 1) * np.asarray(std, dtype=float)[()] / math.sqrt(n)

    def resolved(self, n: int, std):
        """Whether a cell with n contexts so far and per-context spread `std` stops (elementwise
        for an array of spreads): n >= floor and its half-width <= `half_width` (never on NaN)."""
        return (n >= self.floor) & (self.interval(n, std) <= self.half_width)

    def stopped(self, counts) -> list[str]:
        """The methods of `counts` (name -> its `tau.AcceptCounts` so far at one L) that stop now:
        each whose tau is `resolved`. `tau.measure_tau` asks after every batch."""
        out = []
        for name, c in counts.items():
            _, z = c.linearized()
            if z.numel() > 1 and bool(self.resolved(z.numel(), float(z.std()))):
                out.append(name)
        return out

    def reported(self, ci95):
        """The half-width a cell measured under this rule reports: its t half-width `ci95` or the
        rule's, whichever is wider (the fixed-width interval; NaN stays NaN)."""
        return np.maximum(np.asarray(ci95, dtype=float), self.half_width)[()]


# ---------------------------------------------------------------------------- its price


def context_outcomes(alpha: float, k: int = 4, new_tokens: int = 64) -> np.ndarray:
    """The joint distribution of one context's rounds X and tokens Y under the engine's stopping
    rule at i.i.d. acceptance `alpha`: P[X = r, Y = G + e], an array (G + 1, k + 1) over r = 0..G
    and e = 0..k. A round emits 1 + j tokens, P = alpha^j (1 - alpha) for j < k and alpha^k for
    j = k, and a context stops after the round that brings it to G = `new_tokens` tokens. That last
    round counts in full, so Y may pass G by up to k (`tau.AcceptCounts.tokens_and_rounds`)."""
    G = new_tokens
    p = np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    out = np.zeros((G + 1, k + 1))
    alive = np.zeros(G)  # P[t tokens after r rounds, not yet done], t < G
    alive[0] = 1.0
    for r in range(1, G + 1):  # every round emits a token: G rounds at most
        step = np.zeros(G)
        for j, pj in enumerate(p):
            e = j + 1
            step[e:] += alive[: G - e] * pj
            out[r, : e] += alive[G - e:] * pj  # from t >= G - e to t + e = G .. G + e - 1
        alive = step
    return out


def iid_spread(tau: float, k: int = 4, new_tokens: int = 64) -> float:
    """The per-context standard deviation of tau's linearized estimate, sd(Y - tau X) / E[X], when
    every context accepts i.i.d. at the alpha of `tau` (`context_outcomes`). This is a lower bound:
    real contexts differ more (the default run's trained drafts: 0.30-0.40)."""
    pmf = context_outcomes(float(alpha_from_tau(tau, k)), k, new_tokens)
    rounds = np.arange(new_tokens + 1)[:, None]
    tokens = new_tokens + np.arange(k + 1)[None, :]
    mean_x = float((pmf * rounds).sum())
    ratio = float((pmf * tokens).sum()) / mean_x  # E[Y] / E[X] = tau (Wald's identity)
    return math.sqrt(float((pmf * (tokens - ratio * rounds) ** 2).sum())) / mean_x


def _chi2_above(x: float, dof: int) -> float:
    """P[chi^2_dof > x], Wilson and Hilferty's cube-root normal approximation (numpy only)."""
    if x <= 0:
        return 1.0
    s = 2 / (9 * dof)
    w = ((x / dof) ** (1 / 3) - (1 - s)) / math.sqrt(s)
    return 0.5 * math.erfc(w / math.sqrt(2))


def expected_contexts(tau: float, sd: float | None, half_width: float = HALF_WIDTH, floor: int = FLOOR,
                      cap: int = 192, batch: int = 64, *, k: int = 4, new_tokens: int = 64) -> float:
    """The contexts a (method, L) is expected to draw under `StoppingRule(half_width, floor)` with
    at most `cap` in batches of `batch`, where its per-context spread is `sd` (a last run's
    `TauStats.std`, `PAPER_SPREAD`; None: `iid_spread(tau)`, a lower bound). `half_width` 0: the
    cap, no stopping.

    It decides after each batch. A batch's contexts are drawn unless the cell stopped before it.
    The chance that it has not is taken as that of not stopping at the last check alone, normal
    theory: S^2 ~ sd^2 chi^2_{n-1} / (n - 1), and the check passes when t_{0.975, n-1} S / sqrt(n)
    <= half_width. That bounds the chance of having stopped at no check so far from above. It
    matches the simulated rule within 1% from 70 to 1,060 contexts (tests/measure/test_stopping.py).
    With strongly skewed contexts it can err low: where 5% of contexts accept 35 times more, it
    gives 64 against 73 drawn at batches of 64."""
    if half_width <= 0:
        return float(cap)
    sd = iid_spread(tau, k, new_tokens) if sd is None else float(sd)
    expected, drawn, going = 0.0, 0, 1.0
    while drawn < cap:
        n = min(drawn + batch, cap)
        expected += (n - drawn) * going
        drawn = n
        if n >= max(floor, 2) and n < cap:
            limit = half_width * math.sqrt(n) / t_quantile(0.975, n - 1)  # S must fall to this
            going = min(going, 0.0 if sd == 0 else _chi2_above((n - 1) * (limit / sd) ** 2, n - 1))
    return expected


# ---------------------------------------------------------------------------- 09's speedups


def ratio_interval(ratios, level: float = 0.95) -> tuple[float, float, float]:
    """The mean of paired runs' speedups (SD's tokens/s over AD's, run by run) and its Student-t
    interval at `level`: (mean, low, high); infinite with one run."""
    ratios = np.asarray(ratios, dtype=float)
    mean = float(ratios.mean())
    if ratios.size < 2:
        return mean, -math.inf, math.inf
    half = t_quantile(0.5 + level / 2, ratios.size - 1) * float(ratios.std(ddof=1)) / math.sqrt(ratios.size)
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class SpeedupRule:
    """When a (B, L) cell of notebook 09 (and of `bench decode`) has been timed well enough: a
    two-look design over its paired runs (method §2's speedup, measured on the clock).

    Each method's speedup over AD is the mean of its runs' ratios with a t-interval
    (`ratio_interval`). At the first look, after `first` kept runs, the cell stops once every
    method's speedup is resolved: its interval excludes 1 (SD is faster, or slower, than AD) or its
    half-width is at most `width` of its mean. Otherwise it runs on to the second look, `cap` runs
    or as many as fit in its time (`second_look`), and stops there whatever its intervals.

    **Why two looks, each at level 1 - (1 - `level`) / 2.** Stopping when an interval excludes 1
    is a test repeated at every look: at a cell where SD and AD are equally fast, an interval
    looked at after every run and taken at 95% excludes 1 at some look far more often than 5% of the
    time, and a cell stopped so reports an interval that misses. With two looks whose places are
    fixed before any run, each taken at level 1 - (1 - `level`) / 2 (Bonferroni), the interval the
    cell stops at misses with probability at most 1 - `level`, whatever the rule that chose the
    look: P(the stopped look misses) <= P(some look misses) <= 2 (1 - `level`) / 2.
    tests/measure/test_stopping_speedup.py checks the coverage by simulation, with skewed ratios and
    at the worst place for it, a speedup of exactly 1. The price is a wider interval: t_{0.9875}
    against t_{0.975}, 1.35x at 5 runs and 1.15x at 30. With `cap` <= `first` there is one look, at
    `level`.

    The second look's place depends on the time the first runs took (a cell's budget), not on their
    ratios: it is set before any run it judges is made, which keeps the bound."""

    first: int
    cap: int
    width: float = 0.05
    level: float = 0.95

    def __post_init__(self):
        if not (isinstance(self.first, int) and self.first >= 1):
            raise ValueError(f"a SpeedupRule looks first after one run or more (repeats >= 1), got {self.first!r}")
        if not 0 < self.level < 1 or not self.width >= 0:
            raise ValueError(f"a SpeedupRule needs 0 < level < 1 and width >= 0, got {self.level}, {self.width}")

    @classmethod
    def from_repeats(cls, repeats: int, max_repeats: int | None, ci: float) -> SpeedupRule:
        """The rule of `wallclock.time_cells`' parameters (09's, `bench decode`'s), which the plan
        prices too: the first look after `repeats` runs, the second at `max_repeats` at most (None,
        or no more than `repeats`: no second look), resolved within +/- `ci`."""
        return cls(repeats, max(repeats, max_repeats or repeats), ci)

    @property
    def looks(self) -> int:
        """How many looks the design has: 1 where `cap` <= `first`, else 2."""
        return 1 if self.cap <= self.first else 2

    @property
    def look_level(self) -> float:
        """The level of the interval taken, and reported, at any look (Bonferroni over `looks`)."""
        return 1 - (1 - self.level) / self.looks

    def interval(self, ratios) -> tuple[float, float, float]:
        """A method's speedup and its interval at `look_level` (`ratio_interval`)."""
        return ratio_interval(ratios, self.look_level)

    def resolved(self, ratios) -> bool:
        """Whether a method's speedup is resolved: its interval (`interval`) excludes 1 or is at most
        `width` of its mean wide on either side."""
        mean, low, high = self.interval(ratios)
        return low > 1 or high < 1 or (high - low) / 2 <= self.width * abs(mean)

    def second_look(self, seconds_per_run: float, seconds: float) -> int:
        """The runs a cell has at its second look: as many as fit in `seconds` (its budget) at
        `seconds_per_run` (its mean kept run so far), at least `first` (no second look: the cell
        stops at its first) and at most `cap`."""
        fit = seconds / max(seconds_per_run, 1e-12)
        return max(self.first, min(self.cap, math.floor(fit) if math.isfinite(fit) else self.cap))
