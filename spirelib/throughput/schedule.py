"""A deployment schedule: per batch-size range (and context range) the draft depth k that maximizes
the modeled throughput multiplier (method §2, §8), 0 where no depth beats autoregressive decoding,
with the predicted speedup and its interval, and neighbouring ranges merged where switching k
would not pay.

The input is a `Table`: for each depth k = 1..K and each batch size B the multiplier over AD and
its interval (`modeled_table` from the paper's model, `perfmodel`, and a measured acceptance;
`profiled_table` from this machine's profiled cost model, `profiled`). `schedule` reads the best k per B off it and
cuts B into ranges; `merge_noise` then merges neighbouring ranges whose choice of k is not
resolved: a range is merged into its neighbour's k when, at every batch size of both, that k's
interval overlaps the interval of the batch size's own best k (the difference is within the
noise), or it loses no more than `switching_cost` (a fraction of the speedup: the price of
changing k at run time, e.g. the CUDA-graph downgrade that dynamic k brings in vLLM). Every merge
is recorded with the largest modeled loss it costs.

Numpy only, like the models it reads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from spirelib.throughput import perfmodel, profiled
from spirelib.throughput.acceptance import alpha_from_tau, tau_at_depth

OFF = 0  # k = 0: speculation off, autoregressive decoding (multiplier 1 exactly)


@dataclass(frozen=True)
class Acceptance:
    """A draft's measured acceptance: tau (bonus token included) and its 95% CI half-width at depth
    `depth`, and the per-position acceptance p_j measured there (method §8; empty: none, the
    i.i.d. alpha that gives tau at `depth` is used)."""

    tau: float
    ci95: float
    depth: int
    per_position: tuple[float, ...] = ()

    def __post_init__(self):
        if not (isinstance(self.depth, (int, np.integer)) and self.depth >= 1):
            raise ValueError(f"Acceptance.depth must be a positive integer, got {self.depth!r}")
        if not 1.0 <= self.tau <= self.depth + 1:
            raise ValueError(f"Acceptance.tau must lie in [1, depth + 1] = [1, {self.depth + 1}], got {self.tau!r}")
        if not (np.isfinite(self.ci95) and self.ci95 >= 0):
            raise ValueError(f"Acceptance.ci95 must be a non-negative number, got {self.ci95!r}")
        if self.per_position and len(self.per_position) != self.depth:
            raise ValueError(f"Acceptance.per_position has {len(self.per_position)} entries; it needs depth = "
                             f"{self.depth}")

    def k_max(self, default: int = 8) -> int:
        """The deepest k the acceptance speaks for: the measured depth with a per-position curve
        (it is not extrapolated), else `default` (i.i.d. alpha)."""
        return self.depth if self.per_position else default

    def taus(self, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """tau at k = 1..k_max and its interval, each (k_max,). The interval scales the accepted
        drafts tau - 1 at every depth by the measured interval's (tau -+ ci95 - 1) / (tau - 1):
        one acceptance curve moved up or down, never below 1 nor above k + 1."""
        ks = np.arange(1, k_max + 1)
        acceptance = np.asarray(self.per_position) if self.per_position else float(alpha_from_tau(self.tau, self.depth))
        tau = np.array([float(tau_at_depth(acceptance, int(k))) for k in ks])  # (K,)
        if self.tau > 1:
            low = 1 + (tau - 1) * max(0.0, self.tau - self.ci95 - 1) / (self.tau - 1)
            high = np.minimum(ks + 1.0, 1 + (tau - 1) * (self.tau + self.ci95 - 1) / (self.tau - 1))
        else:  # nothing accepted: the interval is the CI itself
            low, high = tau, np.minimum(ks + 1.0, tau + self.ci95)
        return tau, low, high


@dataclass(frozen=True)
class Table:
    """Multipliers over AD per depth and batch size: `tm`, `low`, `high` of shape (len(ks), len(B))."""

    ks: np.ndarray  # (K,) depths 1..K
    B: np.ndarray  # (N,) batch sizes, increasing
    tm: np.ndarray  # (K, N)
    low: np.ndarray  # (K, N)
    high: np.ndarray  # (K, N)

    def __post_init__(self):
        if not np.array_equal(self.ks, np.arange(1, len(self.ks) + 1)):
            raise ValueError(f"Table.ks must be the depths 1..K, got {self.ks!r}")
        for name in ("tm", "low", "high"):
            if np.shape(getattr(self, name)) != (len(self.ks), len(self.B)):
                raise ValueError(f"Table.{name} must have shape (len(ks), len(B)) = {(len(self.ks), len(self.B))}, "
                                 f"got {np.shape(getattr(self, name))}")

    def at(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tm, low, high) at depth k over B, (N,) each; k = 0 is AD: 1 with no spread."""
        if k == OFF:
            one = np.ones(len(self.B))
            return one, one, one
        return self.tm[k - 1], self.low[k - 1], self.high[k - 1]

    def best(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per B the best depth (0 where no k beats AD), its multiplier and the low end of its
        interval, (N,) each."""
        i, cols = self.tm.argmax(axis=0), np.arange(len(self.B))
        on = self.tm[i, cols] > 1.0
        return (np.where(on, self.ks[i], OFF), np.where(on, self.tm[i, cols], 1.0),
                np.where(on, self.low[i, cols], 1.0))


def modeled_table(method: str, acceptance: Acceptance, B, L, target, draft=None, *, k_max: int | None = None,
                  **model_kwargs) -> Table:
    """The paper's model (method §2) at every batch size of `B` (1-D, increasing) and context `L`
    (a length, or a `perfmodel.LengthDistribution` for mixed-length batches): TM = tau(k) / dt(k)
    at k = 1..k_max (default `acceptance.k_max()`), the interval from tau's (dt has none: the model
    is deterministic). `model_kwargs` go to `perfmodel.iteration_time_multiplier` (hoi, window, ...)."""
    B = np.asarray(B)
    if B.ndim != 1 or B.size == 0 or np.any(np.diff(B) <= 0) or np.any(B < 1):
        raise ValueError(f"B must be increasing batch sizes >= 1, got {B!r}")
    k_max = acceptance.k_max() if k_max is None else k_max
    if k_max > acceptance.k_max(default=k_max):
        raise ValueError(f"k_max = {k_max} exceeds the measured per-position acceptance's depth {acceptance.depth}")
    tau, low, high = acceptance.taus(k_max)
    dt = np.stack([np.asarray(perfmodel.iteration_time_multiplier(method, B, L, target, draft, k=int(k), **model_kwargs),
                              dtype=float).reshape(len(B)) for k in range(1, k_max + 1)])  # (K, N)
    return Table(np.arange(1, k_max + 1), B, tau[:, None] / dt, low[:, None] / dt, high[:, None] / dt)


@dataclass(frozen=True)
class ProfiledPricing:
    """This machine's profiled cost model as a schedule prices with it (`profiled_table`): the fitted
    `cost`, the `target` it prices rounds against, G = `new_tokens` generated per row, and the
    model's own relative `error` against the clock (notebook 09's median |profiled / measured - 1|),
    which widens every interval it gives."""

    cost: profiled.ProfiledCost
    target: profiled.PricedTarget
    new_tokens: int
    error: float


def profiled_table(pricing: ProfiledPricing, draft: profiled.DraftShape, acceptance: Acceptance, B, L: int,
                   k_max: int | None = None) -> Table:
    """The profiled cost model of this machine (`profiled.speedup` under `pricing`: G tokens per
    row after a context of L, the batch's slowest row setting its rounds) at every batch size of
    `B` and k = 1..k_max. The interval is tau's, widened by the model's own relative error
    against the clock: low / (1 + error), high x (1 + error)."""
    B = np.asarray(B)
    if B.ndim != 1 or B.size == 0 or np.any(np.diff(B) <= 0) or np.any(B < 1):
        raise ValueError(f"B must be increasing batch sizes >= 1, got {B!r}")
    error = pricing.error
    if not (np.isfinite(error) and error >= 0):
        raise ValueError(f"error must be a non-negative fraction, got {error!r}")
    k_max = acceptance.k_max() if k_max is None else k_max
    taus = acceptance.taus(k_max)  # tau, low, high: (K,) each

    def speedups(tau: np.ndarray) -> np.ndarray:  # (K, N)
        return np.array([[profiled.speedup(pricing.cost, draft, float(tau[k - 1]), pricing.target, int(b), int(L),
                                           pricing.new_tokens, k) for b in B] for k in range(1, k_max + 1)])

    tm, low, high = (speedups(t) for t in taus)
    return Table(np.arange(1, k_max + 1), B, tm, low / (1 + error), high * (1 + error))


@dataclass(frozen=True)
class Range:
    """Batch sizes lo..hi (inclusive) served at depth k; over them the modeled speedup spans
    speedup_min..speedup_max and its interval low..high; `loss`: the largest fraction of the
    speedup a batch size of the range gives up against its own best k (0 unless merged);
    `drafting`: the best speedup any depth k >= 1 reaches in the range (below 1 where k = 0)."""

    lo: int
    hi: int
    k: int
    speedup_min: float
    speedup_max: float
    low: float
    high: float
    loss: float = 0.0
    drafting: float = float("nan")

    def to_dict(self) -> dict:
        return {"batch": [self.lo, self.hi], "k": self.k, "speedup": [round(self.speedup_min, 4),
                                                                    round(self.speedup_max, 4)],
                "interval": [round(self.low, 4), round(self.high, 4)], "loss": round(self.loss, 4),
                "best_with_drafting": round(self.drafting, 4)}


@dataclass(frozen=True)
class Merge:
    """Ranges (lo, hi, k) merged into one at depth k, and the largest modeled loss it costs."""

    merged: tuple[tuple[int, int, int], ...]
    k: int
    loss: float
    reason: str  # "noise" (intervals overlap) or "switching cost"

    def to_dict(self) -> dict:
        return {"merged": [list(m) for m in self.merged], "into_k": self.k, "loss": round(self.loss, 4),
                "reason": self.reason}


@dataclass(frozen=True)
class Schedule:
    """Ranges covering B[0]..`max_batch`, increasing, and the merges that made them."""

    ranges: tuple[Range, ...]
    merges: tuple[Merge, ...] = field(default=())

    def describe(self) -> str:
        """The ranges in one line: "B 1-8: k=4, B 9-256: k=0"."""
        return ", ".join(f"B {r.lo}-{r.hi}: k={r.k}" for r in self.ranges)

    def k_at(self, batch: int) -> int:
        """The scheduled depth at `batch` (the last range's k beyond its end)."""
        for r in self.ranges:
            if batch <= r.hi:
                return r.k
        return self.ranges[-1].k


def _segments(ks: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of equal k over grid indices: (first index, last index, k)."""
    out, start = [], 0
    for i in range(1, len(ks) + 1):
        if i == len(ks) or ks[i] != ks[start]:
            out.append((start, i - 1, int(ks[start])))
            start = i
    return out


def _range(table: Table, first: int, last: int, k: int, max_batch: int) -> Range:
    """The Range of grid indices first..last at depth k: batch sizes B[first] .. B[last + 1] - 1
    (a grid point's k holds until the next grid point; the last up to `max_batch`)."""
    tm, low, high = table.at(k)
    _, best_tm, _ = table.best()
    hi = int(table.B[last + 1]) - 1 if last + 1 < len(table.B) else max_batch
    span = slice(first, last + 1)
    loss = float(np.max(1.0 - tm[span] / best_tm[span]))
    return Range(int(table.B[first]), hi, k, float(tm[span].min()), float(tm[span].max()), float(low[span].min()),
                 float(high[span].max()), max(0.0, loss), float(table.tm[:, span].max()))


def schedule(table: Table, *, max_batch: int | None = None, switching_cost: float = 0.0, merge: bool = True,
             min_batch_run: int = 1) -> Schedule:
    """The best k per batch size of `table` as ranges (`Range`), neighbours merged where the
    choice is not resolved (`merge_noise`, unless `merge` is False), then no range narrower than
    `min_batch_run` batch sizes (`lengthen_runs`; 1: none). The last range runs to `max_batch`
    (default: the table's largest B)."""
    max_batch = int(table.B[-1]) if max_batch is None else int(max_batch)
    if max_batch < table.B[-1]:
        raise ValueError(f"max_batch = {max_batch} is below the table's largest batch size {int(table.B[-1])}")
    if not (np.isfinite(switching_cost) and 0.0 <= switching_cost < 1.0):
        raise ValueError(f"switching_cost must be a fraction of the speedup in [0, 1), got {switching_cost!r}")
    if not (isinstance(min_batch_run, (int, np.integer)) and min_batch_run >= 1):
        raise ValueError(f"min_batch_run must be a positive number of batch sizes, got {min_batch_run!r}")
    segments = _segments(table.best()[0])
    merges: list[Merge] = []
    if merge:
        segments, merges = merge_noise(table, segments, switching_cost, max_batch)
    if min_batch_run > 1:
        ks = np.concatenate([np.full(b - a + 1, k) for a, b, k in segments])  # (N,)
        widths = np.diff([*table.B, max_batch + 1])  # (N,) batch sizes each grid point's k holds for
        segments = _segments(lengthen_runs(ks, widths, min_batch_run, [table] * len(ks), np.arange(len(ks))))
    return Schedule(tuple(_range(table, a, b, k, max_batch) for a, b, k in segments), tuple(merges))


def _fits(table: Table, first: int, last: int, k: int, switching_cost: float) -> tuple[bool, float, str]:
    """Whether depth k may serve grid indices first..last: at each, k's interval overlaps the
    interval of that batch size's best k, or k loses at most `switching_cost` of the best
    speedup. Returns (fits, the largest loss, the reason that holds everywhere)."""
    _, best_tm, best_low = table.best()
    tm, _, high = table.at(k)
    span = slice(first, last + 1)
    overlap = high[span] >= best_low[span]
    loss = 1.0 - tm[span] / best_tm[span]
    cheap = loss <= switching_cost
    if not np.all(overlap | cheap):
        return False, float(loss.max()), ""
    return True, float(max(0.0, loss.max())), "noise" if np.all(overlap) else "switching cost"


def merge_noise(table: Table, segments: list[tuple[int, int, int]], switching_cost: float, max_batch: int
                ) -> tuple[list[tuple[int, int, int]], list[Merge]]:
    """Merge neighbouring segments (first index, last index, k) while a merge fits (`_fits`): of
    every neighbouring pair and either of its two ks, the fitting merge with the smallest loss
    first, until none fits. Returns the segments and the merges, in the order made."""
    segments, merges = list(segments), []
    while len(segments) > 1:
        candidates = []
        for i in range(len(segments) - 1):
            (a, _, k_a), (_, d, k_c) = segments[i], segments[i + 1]
            for k in dict.fromkeys((k_a, k_c)):
                fits, loss, reason = _fits(table, a, d, k, switching_cost)
                if fits:
                    candidates.append((loss, i, k, reason))
        if not candidates:
            break
        loss, i, k, reason = min(candidates)
        (a, b, k_a), (c, d, k_c) = segments[i], segments[i + 1]
        merges.append(Merge((_span(table, a, b, k_a, max_batch), _span(table, c, d, k_c, max_batch)), k, loss, reason))
        segments[i:i + 2] = [(a, d, k)]
    return segments, merges


def _span(table: Table, first: int, last: int, k: int, max_batch: int) -> tuple[int, int, int]:
    r = _range(table, first, last, k, max_batch)
    return r.lo, r.hi, r.k


def expressed_cost(table: Table, expressed: Schedule, against: Schedule | None = None) -> float:
    """The largest fraction of the modeled speedup a batch size of `table` gives up under the
    `expressed` schedule's k (what an engine's form can hold), against `against`'s k (None: the
    batch size's own best k)."""
    def speedups(s: Schedule) -> np.ndarray:  # (N,)
        return np.array([table.at(s.k_at(int(b)))[0][i] for i, b in enumerate(table.B)])

    reference = table.best()[1] if against is None else speedups(against)
    return float(max(0.0, np.max(1.0 - speedups(expressed) / reference)))


def context_switches(by_context: dict[int, Schedule], batch: int, lo: int = 64, hi: int = 8192) -> int:
    """How many times k changes for one request at batch size `batch` as its context grows from
    `lo` to `hi` tokens, read off the per-context schedules `by_context` (context L -> Schedule)."""
    ks = [by_context[L].k_at(batch) for L in sorted(by_context) if lo <= L <= hi]
    return sum(a != b for a, b in itertools.pairwise(ks))


def lengthen_runs(ks: np.ndarray, widths: np.ndarray, min_length: float, tables: list[Table], columns: np.ndarray
                  ) -> np.ndarray:
    """`ks` (n,) with no run of equal k shorter than `min_length` (its `widths` summed): the
    shortest short run takes the k of the neighbouring run that loses less of the multiplier over
    it (entry i priced on `tables[i]` at batch column `columns[i]`), until no run is short or one
    is left. Returns the new ks (n,)."""
    ks = np.array(ks)
    while True:
        runs = _segments(ks)
        short = [(float(widths[a:b + 1].sum()), a, b) for a, b, _ in runs if widths[a:b + 1].sum() < min_length]
        if len(runs) == 1 or not short:
            return ks
        _, a, b = min(short)
        options = [int(ks[i]) for i in (a - 1, b + 1) if 0 <= i < len(ks)]
        losses = [max(1.0 - tables[i].at(k)[0][columns[i]] / tables[i].at(int(ks[i]))[0][columns[i]]
                      for i in range(a, b + 1)) for k in options]
        ks[a:b + 1] = options[int(np.argmin(losses))]


def min_context_run(tables: dict[int, Table], by_context: dict[int, Schedule], min_tokens: int,
                    max_batch: int | None = None) -> dict[int, Schedule]:
    """`by_context` with no k that lasts fewer than `min_tokens` tokens of a request's growth: at
    each batch size, a context bucket (L_prev, L] lasts L - L_prev tokens (the first from 1), and
    short runs take a neighbouring run's k (`lengthen_runs`). A run length along the context, not
    hysteresis in time: an engine still switches where it crosses."""
    lengths = sorted(by_context)
    B = tables[lengths[0]].B
    spans = np.diff([0, *lengths])  # (n_L,) tokens per bucket
    ks = np.array([[by_context[L].k_at(int(b)) for b in B] for L in lengths])  # (n_L, N)
    for col in range(len(B)):
        ks[:, col] = lengthen_runs(ks[:, col], spans, min_tokens, [tables[L] for L in lengths],
                                   np.full(len(lengths), col))
    max_batch = int(B[-1]) if max_batch is None else max_batch
    return {L: Schedule(tuple(_range(tables[L], f, t, k, max_batch) for f, t, k in _segments(ks[i])))
            for i, L in enumerate(lengths)}
