"""Decoding throughput on the clock, and what the throughput models predict for it (method §2).

The paper models throughput and never measures it. `time_cells` (and `time_decoding`, one cell)
runs autoregressive decoding (AD) and speculative decoding (SD) with each draft, the methods
interleaved round by round and the cells run by run, each run after one target prefill its
methods share (prefill is not decoding and is excluded), a warm-up run first; it keeps every
run's decode seconds, tau and the split between draft, verify and bookkeeping
(`sections.SectionTimer`), and adds runs (over fresh contexts, when given a function of the
run) until every method's speedup over AD is known to within a 95% CI of the
width asked for (`speedup_interval`). `bench decode` reports the best run; notebook 09 the mean
speedup and its CI, next to `modeled_speedups`: the paper's G-aware throughput model for the
same shapes, the tau of the same runs, and this machine's calibrated peak FLOP/s and memory
bandwidth, and `profiled_speedups`: the profiled cost model (`spirelib.throughput.profiled`),
fitted to the same runs' sections at some cells (`loop_timings`) and judged at all of them,
held-out cells included.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from spirelib.decoding.graphs import GRAPHS
from spirelib.decoding.prefill import prefill, prefill_needs, speculative_capacity
from spirelib.decoding.sections import SectionTimer
from spirelib.decoding.speculative import Generation, Options, autoregressive_rounds, finish, speculative_rounds
from spirelib.frontend import feed
from spirelib.measure.stopping import SpeedupRule, ratio_interval
from spirelib.measure.tau import DecodingProtocol
from spirelib.model.config import ModelConfig, SpireConfig
from spirelib.model.transformer import Transformer
from spirelib.throughput import perfmodel, profile_fit, profiled
from spirelib.throughput.hardware import Machine
from spirelib.throughput.methods import BUDGET, DECODED, KVBudget, card
from spirelib.throughput.recorded import RecordedCell

#: The sections of a decoding loop (`sections.SectionTimer`); "round" is a round replayed as one
#: CUDA graph, timed whole (no split inside a graph).
DECODE_SECTIONS = ("draft", "verify", "bookkeeping", "round")


@dataclass
class DecodeTiming:
    """Timed runs of one method ("ad" or a draft's name) at one (batch, context)."""

    method: str
    batch: int
    context: int
    new_tokens: int
    seconds: list[float]  # decode seconds of each timed run
    taus: list[float]  # mean accepted + 1 over each run's rounds (1 for AD)
    rounds: list[int]  # rounds (AD: steps) of each run
    sections: list[dict[str, float]]  # seconds per section of each run
    prefill_s: float  # the shared target prefill (once)
    compiled: bool = False  # decoded through compiled graphs (`Transformer.compile_decoding`: static reads)
    retaken: int = 0  # runs not kept because a round's graph was recorded while they were timed
    level: float = 0.95  # the level of its speedup's interval at any look (`stopping.SpeedupRule.look_level`)

    @property
    def tokens_per_s(self) -> list[float]:
        return [self.batch * self.new_tokens / s for s in self.seconds]

    @property
    def best(self) -> int:
        """Index of the fastest run."""
        return min(range(len(self.seconds)), key=self.seconds.__getitem__)

    def split(self, run: int) -> dict[str, float]:
        """Fractions of run `run`'s decode time per section."""
        return {s: self.sections[run].get(s, 0.0) / self.seconds[run] for s in DECODE_SECTIONS}


def time_decoding(target: Transformer, factories: Mapping[str, Callable[[], object]],
                  contexts: torch.Tensor | Callable[[int], torch.Tensor], decoding: DecodingProtocol,
                  rule: SpeedupRule, **options) -> list[DecodeTiming]:
    """AD and SD with every draft factory at one (B, L): one timing each (`time_cells` of one cell)."""
    return time_cells(target, factories, [contexts], decoding, rule, **options)


def time_cells(target: Transformer, factories: Mapping[str, Callable[[], object]],
               cells: Sequence[torch.Tensor | Callable[[int], torch.Tensor]], decoding: DecodingProtocol,
               rule: SpeedupRule, *, include_ad: bool = True, max_seconds: float = float("inf"),
               interleave: str = "rounds") -> list[DecodeTiming]:
    """AD and SD with every draft factory (`drafts.draft_factory`) at each (B, L) cell, each
    generation decoding as `decoding` says (G, k, T): one timing per cell and method, cell by cell.

    A cell is a (B, L) batch that every run decodes, or a function of the run's index that
    returns one (fresh contexts per run: the measured speedup is then one over contexts). Each
    run decodes with every method after one target prefill they share; a cell's run 0 warms up
    and is not kept. The cells take turns run by run: every pass runs each unfinished cell once,
    so that a slow minute of a shared machine falls on every cell alike rather than on the one
    being timed (timed cell after cell, whole cells drifted against the profiled model, all four
    methods together, docs/benchmarks.md: the fit prices absolute seconds across cells).
    A cell stops by `rule` (`stopping.SpeedupRule`): after its first look's kept runs, once every
    method's speedup over AD is resolved (its interval excludes 1, or is at most +/- the rule's width
    of it wide); else at its second look, capped at as many runs as fit in `max_seconds` at the first
    runs' pace: cheap cells get many runs, costly ones few. Every timing keeps the
    level its intervals are taken at (`DecodeTiming.level`: 95% over the two looks). A run during
    which a round's CUDA graph was recorded (`graphs.GRAPHS.watch`: a sync and a capture inside
    the timed region) is not kept but taken again, up to the first look's runs more times a cell, and counted
    (`DecodeTiming.retaken`); a cell that still records raises rather than average recordings in.

    `interleave`: how a run's methods share the machine's time.
    - "rounds" (the default): every method decodes from its own copy of the prefill, and the
      method that has so far taken the least decode time runs its next round (AD: its next
      step), so all of them progress through the same spans of wall time. A shared machine's
      slow spells (longer than a round, shorter than a run) then slow every method alike and
      cancel in the speedup (docs/benchmarks.md). It holds one target cache per method.
      Under compiled decoding every generation decodes in a cache of its own anyway (kept for
      the process, so its round's graph replays), into which the prefill is copied.
    - "runs": the methods one after another on the shared prefill: one cache, for when the
      copies do not fit."""
    problems = interleave_problems(interleave)
    if problems:
        raise ValueError("; ".join(problems))
    device = next(target.parameters()).device
    methods = (["ad"] if include_ad else []) + list(factories)
    contest = _Contest(target, factories, methods, decoding, interleave,
                       prefill_needs((factory() for factory in factories.values()), decoding.k))
    timed = [{} for _ in cells]  # per cell: method -> DecodeTiming
    runs, spent, done = [0] * len(cells), [0.0] * len(cells), [False] * len(cells)
    retaken, look = [0] * len(cells), [rule.first] * len(cells)  # kept runs at the cell's next look
    warm = [0.0] * len(cells)  # the warm-up run's seconds (it compiles): out of the kept runs' pace
    while not all(done):
        for c, contexts in enumerate(cells):
            if done[c]:
                continue
            start = time.perf_counter()
            batch = (contexts(runs[c]) if callable(contexts) else contexts).to(device)
            kept = contest.run(batch, runs[c] + retaken[c], timed[c] if runs[c] else None)  # run 0 warms up
            if not kept:
                retaken[c] += 1
                if retaken[c] > rule.first:
                    raise RuntimeError(f"round graphs were recorded in {retaken[c]} timed runs at (B, L) = "
                                       f"{tuple(batch.shape)}: the generations' buffers move between runs, so the "
                                       "timings would hold recordings; keep them (kvcache.reuse) or decode eagerly")
                continue
            seconds = time.perf_counter() - start
            spent[c] += seconds
            warm[c] = warm[c] if runs[c] else seconds
            runs[c] += 1
            if runs[c] - 1 == look[c]:  # a look: stop, or set the second look's place from the pace so far
                first = look[c] == rule.first and include_ad and not all(
                    rule.resolved(_ratios(t, timed[c]["ad"])) for m, t in timed[c].items() if m != "ad")
                pace = (spent[c] - warm[c]) / look[c]
                look[c] = rule.second_look(pace, max_seconds - warm[c]) if first else look[c]
                done[c] = runs[c] - 1 == look[c]
            # cells done of all (how many runs a cell gets is known only once it has them)
            feed("time AD and SD", sum(done), len(cells), unit="cell", postfix=f"(B, L) = {tuple(batch.shape)}, "
                 f"run {runs[c] - 1} of {look[c]}",
                 tokens_per_s=len(methods) * batch.shape[0] * decoding.new_tokens / seconds)
    for cell, again in zip(timed, retaken):
        for timing in cell.values():
            timing.retaken, timing.level = again, rule.look_level
    return [t for cell in timed for t in cell.values()]


@dataclass(frozen=True)
class _Contest:
    """What every run of `time_cells` decodes: the target, the drafts' factories, the methods in
    their turn ("ad" first when timed), the decoding protocol, how the methods share the machine's
    time (`interleave`) and what the drafts need of the shared prefill (`prefill.prefill_needs`)."""

    target: Transformer
    factories: Mapping
    methods: list[str]
    decoding: DecodingProtocol
    interleave: str
    needs: dict

    def run(self, batch: torch.Tensor, run: int, timings: dict[str, DecodeTiming] | None) -> bool:
        """One run of a cell: one shared prefill, every method decoding after it (`interleave`),
        each method's decode seconds, sections, rounds and tau added to `timings` (None: not kept).
        Whether it was kept: a run during which a round's graph was recorded is not."""
        target, factories, methods, decoding, interleave = (self.target, self.factories, self.methods, self.decoding,
                                                            self.interleave)
        device = batch.device
        B, L = batch.shape
        G, k = decoding.new_tokens, decoding.k
        timer = SectionTimer(device)  # on a GPU the prefill's own time, from CUDA events
        with timer("prefill"):
            shared = prefill(target, batch, capacity=speculative_capacity(L, G, k), **self.needs)
        sections = {m: SectionTimer(device) for m in methods}
        decodes = {}
        for i, method in enumerate(methods):
            share = interleave == "runs" or i == 0 or target.compiled_decoding  # a compiled generation copies it anyway
            options = {"temperature": decoding.temperature, "generator": torch.Generator(device).manual_seed(run),
                       "timer": sections[method], "prefilled": shared if share else shared.copy()}
            decodes[method] = (autoregressive_rounds(target, batch, G, **options) if method == "ad" else
                               speculative_rounds(target, factories[method](), batch, G, k, Options(**options)))
        with GRAPHS.watch() as recorded:
            outs = ({m: finish(rounds) for m, rounds in decodes.items()} if interleave == "runs" else
                    _lockstep(decodes, sections))
        if timings is not None and recorded[0]:
            return False
        for method in methods if timings is not None else ():
            timing = timings.setdefault(method, DecodeTiming(method, B, L, G, [], [], [], [],
                                                              timer.seconds["prefill"], target.compiled_decoding))
            timing.seconds.append(_decode_seconds(sections[method].seconds))
            timing.sections.append({s: sections[method].seconds.get(s, 0.0) for s in DECODE_SECTIONS})
            if method == "ad":
                rounds, tau = G, 1.0
            else:
                done = outs[method].accepted[outs[method].accepted >= 0]
                rounds, tau = outs[method].accepted.shape[1], float((done + 1).double().mean())
            timing.rounds.append(rounds)
            timing.taus.append(tau)
        return True


def interleave_problems(interleave: str) -> list[str]:
    """Why `time_cells` cannot interleave so (empty: it can)."""
    if interleave not in ("rounds", "runs"):
        return [f"interleave is 'rounds' or 'runs', not {interleave!r}"]
    return []


def _decode_seconds(seconds: dict[str, float]) -> float:
    """Decode seconds of a `SectionTimer`'s seconds per section."""
    return sum(seconds.get(s, 0.0) for s in DECODE_SECTIONS)


def _lockstep(decodes: dict[str, Iterator[None]], sections: dict[str, SectionTimer]) -> dict[str, Generation]:
    """Run generations (`speculative_rounds`, `autoregressive_rounds`) interleaved round by round,
    always advancing the one with the least decode time so far (on a GPU, of the rounds the device has
    finished: looking makes no host sync): their results."""
    outs, running = {}, dict(decodes)
    while running:
        method = min(running, key=lambda m: _decode_seconds(sections[m].finished_seconds()))
        try:
            next(running[method])
        except StopIteration as end:
            outs[method] = end.value
            del running[method]
    return outs


def _ratios(sd: DecodeTiming, ad: DecodeTiming) -> list[float]:
    """SD's tokens/s over AD's, run by run (paired in order: the same contexts and the same slot of
    a shared machine)."""
    return [s / a for s, a in zip(sd.tokens_per_s, ad.tokens_per_s)]


def speedup_interval(sd: DecodeTiming, ad: DecodeTiming, level: float | None = None) -> tuple[float, float, float]:
    """SD's speedup over AD from runs paired in order: the mean of the runs' tokens/s ratios and its
    Student-t interval (`stopping.ratio_interval`) at `level`, by default the level `sd` was
    measured to (`DecodeTiming.level`: 95% over the looks of its stopping rule): (mean, low, high)."""
    return ratio_interval(_ratios(sd, ad), sd.level if level is None else level)


def _measured(t: DecodeTiming, base: DecodeTiming) -> RecordedCell:
    """The clock's side of a cell: SD timing `t` against the AD timing `base` at its (B, L), its
    mean tau and its speedup over AD with the 95% CI (`speedup_interval`) and the runs."""
    measured, low, high = speedup_interval(t, base)
    return RecordedCell(method=t.method, B=t.batch, L=t.context, tau=statistics.fmean(t.taus),
                        measured_speedup=measured, ci_low=low, ci_high=high, runs=len(t.seconds))


def modeled_speedups(timings: list[DecodeTiming], target: ModelConfig, shapes: Mapping[str, profiled.DraftShape], *,
                     machine: Machine, k: int = 4) -> list[RecordedCell]:
    """Measured vs modeled speedup over AD, one cell per SD timing with an AD timing at the
    same (batch, context). Measured: the mean over runs of SD tokens/s / AD tokens/s (runs
    paired in order) with its 95% CI (`speedup_interval`) and the number of runs. Modeled: the G-aware throughput
    model (method §2) with the runs' mean tau, the `machine`'s HOI and bytes per value for
    weights and KV, each draft's shape and each sparse draft's KV budget as its cache (`shapes`,
    `profiled_draft_shapes`)."""
    ad = {(t.batch, t.context): t for t in timings if t.method == "ad"}
    cells = []
    for t in timings:
        base = ad.get((t.batch, t.context))
        if t.method == "ad" or base is None:
            continue
        cell = _measured(t, base)
        shape = shapes[t.method]
        budget = shape.budget
        cache = dict(sink_size=budget.sink, window=budget.entries - budget.sink) if budget else {}
        model = perfmodel.throughput_multiplier_over_generation(
            t.method, min(cell.tau, k + 1.0), t.batch, t.context, t.new_tokens, target.shape(), shape.shape,
            k=k, hoi=machine.hoi, window_factor=None, bytes_per_weight=machine.bytes_per_value,
            bytes_per_kv=machine.bytes_per_value, **cache)
        cells.append(replace(cell, modeled_speedup=float(model), error=float(model) / cell.measured_speedup - 1.0))
    return cells


def modeled_step_seconds(cfg: ModelConfig, batch: int, context: int, machine: Machine) -> float:
    """The throughput model's seconds for one AD step of `cfg` on `machine` (method §2 cost over peak FLOP/s)."""
    cost = perfmodel.step_cost(cfg.shape(), batch, context, hoi=machine.hoi, bytes_per_weight=machine.bytes_per_value,
                               bytes_per_kv=machine.bytes_per_value)
    return float(cost) / machine.peak_flops


def flops_per_token(cfg: ModelConfig, context: int) -> dict[str, float]:
    """Matmul FLOPs of one decoded token: the body (what the model counts, 2 per body
    parameter) and what it ignores: attention over `context` keys and the unembedding."""
    return {"body": 2.0 * perfmodel.body_params(cfg),
            "attention": 4.0 * cfg.num_layers * cfg.n_q * cfg.d_head * context,  # q.k and p.v
            "unembedding": 2.0 * cfg.d_model * cfg.vocab_size}


def repeat_seconds(fn, repeats: int, before=None, device=None) -> list[float]:
    """Wall seconds of `repeats` calls of `fn` after one untimed warm-up call; `before()`, untimed,
    runs ahead of every call (e.g. what precedes the call in a round, leaving the caches as it does).
    On a CUDA `device` each call is timed to the end of its kernels."""
    sync = torch.cuda.synchronize if device is not None and torch.device(device).type == "cuda" else None
    times = []
    for i in range(repeats + 1):
        if before is not None:
            before()
        if sync:
            sync(device)
        start = time.perf_counter()
        fn()
        if sync:
            sync(device)
        if i:
            times.append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------------------- the profiled model


def loop_timings(timings: list[DecodeTiming]) -> list[profile_fit.LoopTiming]:
    """What the profiled model is fitted to (`profile_fit.fit`): every timing's sections per round
    (AD: per step), each averaged over its runs. Rounds replayed as one CUDA graph have no split
    between draft, verify and bookkeeping: refused."""
    out = []
    for t in timings:
        if any(run.get("round") for run in t.sections):
            raise ValueError(f"{t.method} at (B, L) = ({t.batch}, {t.context}) decoded through round graphs, timed "
                             "whole: the profiled model is fitted to eager sections (decode without compile_decoding)")
        per_round = {s: statistics.fmean(run.get(s, 0.0) / r for run, r in zip(t.sections, t.rounds))
                     for s in DECODE_SECTIONS}
        out.append(profile_fit.LoopTiming(t.method, t.batch, t.context, t.new_tokens, per_round["draft"],
                                       per_round["verify"], per_round["bookkeeping"]))
    return out


def profiled_draft_shapes(models: Mapping[str, ModelConfig], budgets: Mapping[str, KVBudget],
                          spire: SpireConfig | None = None) -> dict[str, profiled.DraftShape]:
    """What the profiled model needs of each decoded draft (`methods.DECODED`) that can be priced
    here: a draft model's shape from `models` (method -> `ModelConfig`: the vanilla draft's, the
    SPIRe draft's layer stack), a sparse draft's KV budget from `budgets` (`Series.kv_budgets`),
    and SPIRe's memory layers: every layer when `spire` has target activations (method §3.3). A
    method missing its model or its budget is left out."""
    shapes = {}
    for m in DECODED:
        c = card(m)
        if (c.needs_model and m not in models) or (c.reads == BUDGET and c.drafter is not None and m not in budgets):
            continue
        memory = spire.num_layers if c.memory and spire is not None and spire.target_activations else 0
        shapes[m] = profiled.DraftShape(m, models[m].shape() if m in models else None,
                                        budgets.get(m) if c.reads == BUDGET else None, memory)
    return shapes


def profiled_speedups(timings: list[DecodeTiming], cost: profiled.ProfiledCost, target: profiled.PricedTarget,
                      drafts: Mapping[str, profiled.DraftShape], *, k: int = 4) -> dict:
    """The profiled model's SD speedup over AD for every SD timing with an AD timing at the
    same (batch, context), at the runs' mean tau: {(method, B, L): speedup}."""
    ad = {(t.batch, t.context) for t in timings if t.method == "ad"}
    return {(t.method, t.batch, t.context): profiled.speedup(
                cost, drafts[t.method], statistics.fmean(t.taus), target, t.batch, t.context, t.new_tokens, k)
            for t in timings if t.method != "ad" and (t.batch, t.context) in ad}


GAIN = 1.1  # a predicted speedup a user would act on


def profiled_cells(timings: list[DecodeTiming], cost: profiled.ProfiledCost, target: profiled.PricedTarget,
                   drafts: Mapping[str, profiled.DraftShape], *, k: int = 4, held_out=()) -> list[RecordedCell]:
    """The profiled model against the clock, one cell per SD timing with an AD timing at the
    same (B, L): the measured speedup with its 95% CI (`speedup_interval`) and runs, the
    profiled speedup (`profiled_speedups`), profiled / measured - 1, and whether the cell is one
    of the `held_out` (B, L) the fit never saw."""
    ad = {(t.batch, t.context): t for t in timings if t.method == "ad"}
    predicted = profiled_speedups(timings, cost, target, drafts, k=k)
    unseen = {(int(b), int(length)) for b, length in held_out}
    cells = []
    for t in timings:
        speedup = predicted.get((t.method, t.batch, t.context))
        if speedup is not None:
            cell = _measured(t, ad[t.batch, t.context])
            cells.append(replace(cell, profiled_speedup=speedup, profiled_error=speedup / cell.measured_speedup - 1,
                                 held_out=(t.batch, t.context) in unseen))
    return cells


def profiled_verdict(cells: list[RecordedCell]) -> dict:
    """How the profiled model did on `profiled_cells`: its median |error|, its mean signed
    error (its bias), its median |error| on the fitted cells and its worst on the held-out ones
    (None without), the cells it predicts at `GAIN` or more that measured a loss, and the widest
    measured 95% CI relative to its speedup."""
    errors = [c.profiled_error for c in cells]
    fitted = [abs(c.profiled_error) for c in cells if not c.held_out]
    held = [abs(c.profiled_error) for c in cells if c.held_out]
    return {"median_error": statistics.median(abs(e) for e in errors), "mean_signed_error": statistics.fmean(errors),
            "fitted_median_error": statistics.median(fitted) if fitted else None,
            "held_out_max_error": max(held) if held else None,
            "false_gains": [c for c in cells if c.profiled_speedup >= GAIN and c.measured_speedup < 1.0],
            "widest_ci": max(c.half_width for c in cells)}
