"""Notebook 09's (B, L) cells on the clock: the grid it times and the cells held out from the
profiled model's fit (`timing_cells`; `timing_problems` checks them before any compute), the
measured speedup of every cell with its 95% CI beside the paper's model (method §2) and the
profiled one (`speedup_cells`), the cells that run past the target's training windows, what
the conclusion quotes (`summarize_cells`) and what this machine's schedule serves at each measured
cell (`scheduled_choices`, docs/deploy.md). From wallclock's and profiled's outputs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from spirelib.measure.wallclock import (
    DecodeTiming,
    interleave_problems,
    modeled_speedups,
    profiled_cells,
    profiled_verdict,
)
from spirelib.throughput import profile_fit, profiled
from spirelib.throughput.hardware import Machine
from spirelib.throughput.recorded import RecordedCell
from spirelib.throughput.schedule import OFF, ProfiledPricing, profiled_table, schedule
from spirelib.throughput.winners import AD


def timing_cells(batches, contexts, held_out) -> list[tuple[int, int]]:
    """The (B, L) cells 09 times, by L then B: the grid B x L and the `held_out` cells, which
    may lie beyond it (a larger B or L than any fitted cell)."""
    grid = {(int(b), int(length)) for b in batches for length in contexts}
    return sorted(grid | {(int(b), int(length)) for b, length in held_out}, key=lambda c: (c[1], c[0]))


def grid_problems(batches, contexts, held_out) -> list[str]:
    """Why a timing grid (B x L) with these `held_out` (B, L) cells cannot judge the profiled
    model (empty: it can): the cells left to fit must identify it, three or more at two batch
    sizes and two context lengths at least (`profile_fit.cell_problems`), and something must be held
    out. Checked before any compute."""
    held = {(int(b), int(length)) for b, length in held_out}
    rest = set(timing_cells(batches, contexts, ())) - held
    out = [] if held else ["held_out is empty: the profiled model would be judged only on the cells it was fitted to"]
    if profile_fit.cell_problems(rest):
        out.append(f"the cells left to fit, {sorted(rest)}, must be three or more at two batch sizes and two context "
                   "lengths at least; time more cells or hold out fewer")
    return out


def graphed_rounds(compile_decoding: bool, device: str) -> bool:
    """Whether a series on `device` ("auto", "cpu", "cuda[:N]") with `compile_decoding` replays its
    decoding rounds as CUDA graphs (`decoding.graphs`)."""
    return compile_decoding and (device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()))


def timing_problems(batches, contexts, held_out, interleave: str, graphed: bool) -> list[str]:
    """What 09's timing parameters taken together cannot do (empty: nothing): the grid
    (`grid_problems`), the interleaving (`wallclock.interleave_problems`), and, with `graphed`
    (the series decodes through compiled graphs on a GPU, each round one CUDA graph timed whole),
    the profiled model's fit, which needs each round's draft, verify and bookkeeping apart.
    Checked before any compute."""
    graphs = ["09 fits the profiled model to each round's draft, verify and bookkeeping, and a round replayed as "
              "one CUDA graph is timed whole: decode eagerly for 09 (series compile_decoding: false)"] if graphed else []
    return grid_problems(batches, contexts, held_out) + interleave_problems(interleave) + graphs


def split_held_out(timings: list[DecodeTiming], held_out) -> tuple[list[DecodeTiming], list[DecodeTiming]]:
    """(the timings the profiled model is fitted to, those it is judged on unseen): `held_out`
    lists (B, L) cells (`grid_problems` checks them)."""
    wanted = {(int(b), int(length)) for b, length in held_out}
    return ([t for t in timings if (t.batch, t.context) not in wanted],
            [t for t in timings if (t.batch, t.context) in wanted])


def speedup_cells(timings: list[DecodeTiming], target, shapes: dict[str, profiled.DraftShape],
                  cost: profiled.ProfiledCost, *, machine: Machine, k: int, held_out=()) -> list[RecordedCell]:
    """One cell per timed draft and (B, L) with an AD timing: the measured speedup with its 95%
    CI and the paper's model (`wallclock.modeled_speedups`), with the profiled model's speedup,
    its error profiled / measured - 1 and whether the
    cell is one of the `held_out` (B, L) the fit never saw (`wallclock.profiled_cells`, shapes
    from `wallclock.profiled_draft_shapes`)."""
    cells = modeled_speedups(timings, target, shapes, machine=machine, k=k)
    priced = profiled.PricedTarget(target.shape(), target.vocab_size, machine.bytes_per_value)
    predicted = {(c.method, c.B, c.L): c for c in profiled_cells(timings, cost, priced, shapes, k=k, held_out=held_out)}
    out = []
    for c in cells:
        p = predicted[c.method, c.B, c.L]
        out.append(replace(c, profiled_speedup=p.profiled_speedup, profiled_error=p.profiled_error, held_out=p.held_out))
    return out


def summarize_cells(cells: list[RecordedCell], ad_rows: list[dict]) -> dict:
    """What the conclusion quotes: the cells where the paper's model errs least and most, the
    median AD step overhead (measured / modeled), the cells where SD was slower than AD, the
    paper's model's median absolute error, the profiled model's `wallclock.profiled_verdict`
    and its worst cell."""
    return {"best": min(cells, key=lambda c: abs(c.error)), "worst": max(cells, key=lambda c: abs(c.error)),
            "overhead": float(np.median([r["ratio"] for r in ad_rows])),
            "losing": [c for c in cells if c.measured_speedup < 1.0],
            "median_error": float(np.median([abs(c.error) for c in cells])),
            "profiled": profiled_verdict(cells),
            "worst_profiled": max(cells, key=lambda c: abs(c.profiled_error))}


def trained_length(trained) -> int | None:
    """The window length the target was trained on (its training's seq_len; method §5's contexts
    should stay within it), or None for an imported target, trained elsewhere on windows this run
    does not know."""
    return None if trained.summary.get("imported_from") else int(trained.train_config.seq_len)


def mark_past_training(cells: list[RecordedCell], trained_len: int | None, new_tokens: int) -> list[RecordedCell]:
    """`cells` with "past_training": whether a cell's contexts and generated tokens (L + G) run past
    the `trained_length` of the target, so its figure is about a target used beyond what it
    learned (False where that length is unknown)."""
    return [replace(c, past_training=trained_len is not None and c.L + new_tokens > trained_len) for c in cells]


def scheduled_choices(cells: list[RecordedCell], pricing: ProfiledPricing, shapes: dict[str, profiled.DraftShape],
                      acceptance: dict[int, dict]) -> dict[tuple[int, int], tuple[str, int, float]]:
    """Per measured (B, L) what this machine's schedule serves: per method the profiled model's
    schedule over B = 1..the largest measured B at L (`throughput.schedule` priced by `pricing`, its
    interval widened by the model's error), its k and predicted speedup at B, and the method with the
    highest one; ("ad", 0, 1.0) where every method's schedule is off. `acceptance[L]`: method ->
    `schedule.Acceptance`."""
    batches = np.arange(1, max(c.B for c in cells) + 1)
    choices = {}
    for L in sorted({c.L for c in cells}):
        at_l = {}
        for method, a in acceptance[L].items():
            table = profiled_table(pricing, shapes[method], a, batches, L)
            at_l[method] = (table, schedule(table))
        for B in sorted({c.B for c in cells if c.L == L}):
            options = [(method, s.k_at(B), float(t.at(s.k_at(B))[0][B - 1])) for method, (t, s) in at_l.items()]
            best = max(options, key=lambda o: o[2])
            choices[(B, L)] = best if best[1] != OFF else (AD, OFF, 1.0)
    return choices
