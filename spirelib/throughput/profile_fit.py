"""The profiled cost model's fit (method §2, `profiled`): its overhead coefficients fitted to the
engine's own sections, timed inside real decoding rounds (`LoopTiming`, `wallclock.loop_timings`),
with the roofline's peak and bandwidth pinned to this machine's calibration so that the overheads
cannot trade against the rates; what a fit needs of its cells (`cell_problems`, `fit_problems`);
and the sections the fitted model predicts for a timing (`modeled_sections`).

Numpy only, like the paper's model.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from spirelib.throughput.hardware import Machine
from spirelib.throughput.perfmodel import ModelShape
from spirelib.throughput.profiled import (
    DraftOverhead,
    DraftShape,
    PricedTarget,
    ProfiledCost,
    ad_keys,
    ad_step_seconds,
    forward_work,
    round_seconds,
    sd_keys,
)


@dataclass(frozen=True)
class LoopTiming:
    """One method ("ad" or a draft's) generating G = `new_tokens` per row after contexts of L at
    batch B, timed inside the decoding loop (`sections.SectionTimer`): seconds per round (AD:
    per step) of each section, averaged over runs (`wallclock.loop_timings`). For AD, "verify" is
    the target's forward and "bookkeeping" the draw."""

    method: str
    batch: int
    context: int
    new_tokens: int
    draft_s: float
    verify_s: float
    bookkeeping_s: float

    @property
    def round_s(self) -> float:
        return self.draft_s + self.verify_s + self.bookkeeping_s


def cell_problems(cells) -> list[str]:
    """Why timings at these (B, L) `cells` cannot identify the model's coefficients (empty: they
    can): at least three cells, two batch sizes (the per-token and per-row costs) and two
    context lengths (attention's)."""
    cells = set(cells)
    Bs, Ls = sorted({b for b, _ in cells}), sorted({c for _, c in cells})
    out = []
    if len(cells) < 3:
        out.append(f"{len(cells)} (B, L) cell(s) timed; the fit needs at least 3")
    if len(Bs) == 1:
        out.append(f"every cell is at B = {Bs[0]}; the per-token and per-row costs need at least "
                   "two batch sizes")
    if len(Ls) == 1:
        out.append(f"every cell is at L = {Ls[0]}; attention's cost needs at least two context lengths")
    return out


def fit_problems(timings: list[LoopTiming], drafts: dict[str, DraftShape]) -> list[str]:
    """Why `timings` cannot identify the model's coefficients (empty: they can): their cells
    (`cell_problems`), AD timings (the target's forward and the draw), and every drafting method
    at two batch sizes (its overhead per round and per row) with a known shape."""
    out = cell_problems((t.batch, t.context) for t in timings)
    if not any(t.method == "ad" for t in timings):
        out.append("no AD timings: the target's forward and the draw are fitted to AD steps")
    for method in sorted({t.method for t in timings} - {"ad"}):
        if method not in drafts:
            out.append(f"{method!r} was timed but has no DraftShape")
        elif len({t.batch for t in timings if t.method == method}) < 2:
            out.append(f"{method!r} was timed at one batch size; its overhead per row needs two")
    return out


def fit(timings: list[LoopTiming], *, target: ModelShape, vocab_size: int, drafts: dict[str, DraftShape], k: int,
        machine: Machine) -> ProfiledCost:
    """The coefficients that explain decoding sections timed in the loop, with the roofline's
    peak FLOP/s and bandwidth pinned to this `machine`'s calibration (its bytes per value too). The sections are the engine's
    own, timed inside real decoding rounds (`LoopTiming`, from `wallclock.time_cells`'
    `SectionTimer`: draft, verify, bookkeeping), where the cost is paid: caches as a round leaves
    them, not warm as in an isolated call. Every stage is a
    least-squares fit in relative error (each timing counts alike), non-negative but for the
    methods' overheads:

    1. the forward's per-layer, per-token-layer, multi-token per-layer, per-key and attention-FLOP
       costs, to the target's forwards: AD steps (1 token over L + G keys) and the verifications
       of the drafts that read no target activations (k + 1 tokens over L + G + 2k keys); without
       a single-token forward (no B = 1 cell) the multi-token kernels' cost is part of per_layer_s;
    2. the draw, to AD's draws (B V logits);
    3. the bookkeeping, to the speculative rounds' (B (k + 1) V logits);
    4. each method's `DraftOverhead`, to what its whole rounds leave unexplained.

    Each cell also gets its own pace (`ProfiledCost.paces`): one factor on the seconds of every
    section of every method timed there (above 1: slower than the coefficients price it), their
    geometric mean 1, fitted alternately with the coefficients until no pace moves. The methods
    of a cell decode in lockstep (`wallclock.time_cells`), so what sets a cell's level slows them
    all alike: the machine's state while the cell ran and how its working set sits in the caches
    (docs/benchmarks.md: both move a cell's level, every method alike). Unabsorbed, such a level
    bends the coefficients; absorbed, the coefficients explain how the methods
    compare within each cell, which is all a speedup depends on (the pace cancels in it). A cell
    the fit did not see is priced at pace 1. What the paces take away is identified only through
    those comparisons, so the coefficients move more from run to run than the speedups do.

    Refuses timings that cannot identify them (`fit_problems`)."""
    problems = fit_problems(timings, drafts)
    if problems:
        raise ValueError("cannot fit the profiled model: " + "; ".join(problems))
    by_cell: dict[tuple[int, int], list[LoopTiming]] = {}
    for t in timings:
        by_cell.setdefault((t.batch, t.context), []).append(t)
    paces, priced = dict.fromkeys(by_cell, 1.0), PricedTarget(target, vocab_size, machine.bytes_per_value)
    for _ in range(PACE_ITERATIONS):
        cost = _coefficients([_at_pace(t, paces[cell]) for cell, own in by_cell.items() for t in own], target=priced,
                             drafts=drafts, k=k, machine=machine)
        logs = {cell: np.mean([np.log(t.round_s / modeled_sections(cost, t, target=priced, drafts=drafts, k=k))
                               for t in own]) for cell, own in by_cell.items()}
        center = np.mean(list(logs.values()))
        moved, paces = paces, {cell: float(np.exp(v - center)) for cell, v in logs.items()}
        if max(abs(paces[c] / moved[c] - 1.0) for c in paces) < PACE_TOLERANCE:
            break
    return dataclasses.replace(cost, paces=paces)


# The alternating fit of coefficients and cell paces stops once no pace moves by more than
# PACE_TOLERANCE in an iteration: on 09's timings after a few hundred iterations (docs/benchmarks.md).
PACE_ITERATIONS, PACE_TOLERANCE = 3000, 1e-9


def _at_pace(timing: LoopTiming, pace: float) -> LoopTiming:
    """`timing`'s sections divided by its cell's pace."""
    return dataclasses.replace(timing, draft_s=timing.draft_s / pace, verify_s=timing.verify_s / pace,
                               bookkeeping_s=timing.bookkeeping_s / pace)


def _coefficients(timings: list[LoopTiming], *, target: PricedTarget, drafts: dict[str, DraftShape], k: int,
                  machine: Machine) -> ProfiledCost:
    """`fit`'s four stages on timings at pace 1."""
    cost = ProfiledCost(float(machine.peak_flops), float(machine.bandwidth))
    shape, vocab_size, bytes_per_value = target.shape, target.vocab_size, target.bytes_per_value
    forwards = [(forward_work(shape, vocab_size, t.batch, 1, ad_keys(t.context, t.new_tokens),
                              bytes_per_value=bytes_per_value), t.verify_s) for t in timings if t.method == "ad"]
    forwards += [(forward_work(shape, vocab_size, t.batch, k + 1, sd_keys(t.context, t.new_tokens, k),
                               bytes_per_value=bytes_per_value), t.verify_s)
                 for t in timings if t.method != "ad" and not drafts[t.method].memory_layers
                 and not drafts[t.method].scores]  # a verification that also writes memory or scores is not plain
    seconds = np.array([s for _, s in forwards])
    a = np.array([[w.layers, w.tokens * w.layers, w.key_reads, w.attention_flops, w.layers * (w.tokens > 1)]
                  for w, _ in forwards], dtype=float)
    if all(w.tokens > 1 for w, _ in forwards):  # no single-token forward: per_layer_s prices the multi-token kernels
        a = a[:, :4]
    rest = seconds - np.array([cost.roofline(w) for w, _ in forwards])
    per_layer, per_token_layer, per_key, per_flop, *multi = _nonnegative_lstsq(a / seconds[:, None], rest / seconds)
    cost = dataclasses.replace(cost, per_layer_s=float(per_layer), per_token_layer_s=float(per_token_layer),
                               per_key_s=float(per_key), multi_token_layer_s=float(sum(multi)),
                               attention_flops_per_s=1.0 / per_flop if per_flop > 0 else float("inf"))
    sampling = _affine([(t.batch * vocab_size, t.bookkeeping_s) for t in timings if t.method == "ad"])
    bookkeeping = _affine([(t.batch * (k + 1) * vocab_size, t.bookkeeping_s) for t in timings if t.method != "ad"])
    cost = dataclasses.replace(cost, sampling_s=sampling[0], sampling_per_logit_s=sampling[1],
                               bookkeeping_s=bookkeeping[0], bookkeeping_per_logit_s=bookkeeping[1])
    overheads = {}
    for method in sorted({t.method for t in timings} - {"ad"}):
        own = [t for t in timings if t.method == method]
        measured = np.array([t.round_s for t in own])
        modeled = np.array([round_seconds(cost, drafts[method], target, t.batch, k,
                                          sd_keys(t.context, t.new_tokens, k), overhead=False) for t in own])
        a = np.array([[1.0, t.batch] for t in own]) / measured[:, None]
        round_s, per_row = np.linalg.lstsq(a, 1.0 - modeled / measured, rcond=None)[0]
        overheads[method] = DraftOverhead(float(round_s), float(per_row))
    return dataclasses.replace(cost, drafts=overheads)


def _affine(pairs: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) >= 0 of seconds ~ a + b x n, fitted in relative error."""
    n = np.array([float(c) for c, _ in pairs])
    s = np.array([float(v) for _, v in pairs])
    a = np.stack([np.ones_like(s), n], axis=1) / s[:, None]
    return tuple(float(c) for c in _nonnegative_lstsq(a, np.ones_like(s)))


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0 (a few unknowns): the best least-squares solution over
    every subset of coefficients left free, the others at 0, that comes out non-negative."""
    n = a.shape[1]
    best, best_err = np.zeros(n), float(np.sum(b**2))
    for size in range(1, n + 1):
        for free in itertools.combinations(range(n), size):
            x = np.zeros(n)
            x[list(free)] = np.linalg.lstsq(a[:, list(free)], b, rcond=None)[0]
            err = float(np.sum((a @ x - b) ** 2))
            if np.all(x >= 0) and err < best_err:
                best, best_err = x, err
    return best


def modeled_sections(cost: ProfiledCost, timing: LoopTiming, *, target: PricedTarget, drafts: dict[str, DraftShape],
                     k: int) -> float:
    """What the model says one round (AD: one step) of `timing` takes, at its cell's pace: the
    seconds its fit is judged on, against `timing.round_s`."""
    pace = cost.pace(timing.batch, timing.context)
    if timing.method == "ad":
        return pace * ad_step_seconds(cost, target, timing.batch, ad_keys(timing.context, timing.new_tokens))
    return pace * round_seconds(cost, drafts[timing.method], target, timing.batch, k,
                                 sd_keys(timing.context, timing.new_tokens, k))
