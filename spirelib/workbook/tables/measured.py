"""Tables of notebook 09, the throughput model against the clock: timed decoding
(`wallclock.DecodeTiming`), the measured speedup of every cell with its 95% CI next to the
paper's model (method §2) and the profiled model (`profiled`, fitted in the loop at some cells
and held out at others), AD steps, the FLOPs the paper's model leaves out, and the conclusion
drawn from them. They read wallclock's and profiled's outputs and
compute nothing of their own beyond medians and ratios."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spirelib.measure.wallclock import (
    GAIN,
    DecodeTiming,
    flops_per_token,
    half_width,
    interleave_problems,
    loop_timings,
    modeled_speedups,
    modeled_step_seconds,
    profiled_cells,
    profiled_verdict,
)
from spirelib.model.kvcache import SinkWindow
from spirelib.modeling import profiled
from spirelib.modeling.methods import label as method_label
from spirelib.modeling.schedule import OFF, Acceptance, profiled_table, schedule
from spirelib.workbook.tables.winners import AD, by_cell, unresolved_cells, where_sentence, winner

TIMING_COLUMNS = {"L": "L", "B": "B", "method": "method", "tps": "tokens/s (median)", "spread": "tokens/s (runs)",
                  "tau": "tau", "round": "ms per round (step)", "draft": "draft", "verify": "verify",
                  "book": "bookkeeping"}
CELL_COLUMNS = {"method": "method", "B": "B", "L": "L", "tau": "tau", "measured_speedup": "measured",
                "ci": "95% CI", "runs": "runs", "modeled_speedup": "paper's model", "error": "paper / measured - 1",
                "profiled_speedup": "profiled model", "profiled_error": "profiled / measured - 1",
                "role": "profiled fit", "past_training": "past the target's training windows?"}
CELL_FIELDS = ("method", "B", "L", "measured_speedup", "modeled_speedup", "profiled_speedup", "tau", "ci_low",
               "ci_high", "runs", "error", "profiled_error", "held_out",
               "past_training")  # what results.json's "cells" keep
FIT_COLUMNS = {"method": "method", "B": "B", "L": "L", "measured": "measured ms per round (AD: step)",
               "profiled": "profiled, ms", "error": "profiled / measured - 1", "role": "profiled fit"}
AD_COLUMNS = {"L": "L", "B": "B", "measured": "measured ms per AD step", "modeled": "paper's model, ms",
              "ratio": "measured / paper's", "profiled": "profiled model, ms"}
FLOP_COLUMNS = {"model": "model", "L": "L", "body": "body FLOPs per token (modeled)", "attention": "attention / body",
                "unembedding": "unembedding / body"}


def timing_cells(batches, contexts, held_out) -> list[tuple[int, int]]:
    """The (B, L) cells 09 times, by L then B: the grid B x L and the `held_out` cells, which
    may lie beyond it (a larger B or L than any fitted cell)."""
    grid = {(int(b), int(length)) for b in batches for length in contexts}
    return sorted(grid | {(int(b), int(length)) for b, length in held_out}, key=lambda c: (c[1], c[0]))


def grid_problems(batches, contexts, held_out) -> list[str]:
    """Why a timing grid (B x L) with these `held_out` (B, L) cells cannot judge the profiled
    model (empty: it can): the cells left to fit must identify it, three or more at two batch
    sizes and two context lengths at least (`profiled.cell_problems`), and something must be held
    out. Checked before any compute."""
    held = {(int(b), int(length)) for b, length in held_out}
    rest = set(timing_cells(batches, contexts, ())) - held
    out = [] if held else ["held_out is empty: the profiled model would be judged only on the cells it was fitted to"]
    if profiled.cell_problems(rest):
        out.append(f"the cells left to fit, {sorted(rest)}, must be three or more at two batch sizes and two context "
                   "lengths at least; time more cells or hold out fewer")
    return out


def timing_problems(batches, contexts, held_out, interleave: str, compiled: bool) -> list[str]:
    """What 09's timing parameters taken together cannot do (empty: nothing): the grid
    (`grid_problems`) and the interleaving (`wallclock.interleave_problems`; `compiled`: the
    series decodes through compiled graphs). Checked before any compute."""
    return grid_problems(batches, contexts, held_out) + interleave_problems(interleave, compiled)


def split_held_out(timings: list[DecodeTiming], held_out) -> tuple[list[DecodeTiming], list[DecodeTiming]]:
    """(the timings the profiled model is fitted to, those it is judged on unseen): `held_out`
    lists (B, L) cells (`grid_problems` checks them)."""
    wanted = {(int(b), int(length)) for b, length in held_out}
    return ([t for t in timings if (t.batch, t.context) not in wanted],
            [t for t in timings if (t.batch, t.context) in wanted])


def profile_summary(cost: profiled.ProfiledCost, fit_rows: list[dict]) -> str:
    """One line of the fitted profiled model: every term it prices, and its error on the timed
    rounds (`fit_rows`) of the fitted and of the held-out cells."""
    errors = {role: np.abs([r["error"] for r in fit_rows if r["role"] == role]) for role in ("fitted", "held out")}
    judged = "; ".join(f"{role} rounds: median error {np.median(e):.1%}, worst {e.max():.1%}"
                       for role, e in errors.items() if len(e))
    return (f"fitted in the loop: ({1e6 * cost.per_layer_s:.0f} us + {1e9 * cost.per_token_layer_s:.0f} ns per "
            f"token, + {1e6 * cost.multi_token_layer_s:.0f} us past one token) per layer + "
            f"{1e9 * cost.per_key_s:.1f} ns per key a row reads per layer + attention FLOPs / "
            f"{cost.attention_flops_per_s / 1e9:.1f} GFLOP/s "
            f"+ max(matmul FLOPs / {cost.flops_per_s / 1e9:.1f} GFLOP/s, bytes / {cost.bytes_per_s / 1e9:.1f} GB/s) "
            f"(both calibrated, pinned) per forward; a draw {1e6 * cost.sampling_s:.0f} us + "
            f"{1e12 * cost.sampling_per_logit_s:.0f} ps per logit; bookkeeping {1e6 * cost.bookkeeping_s:.0f} us + "
            f"{1e12 * cost.bookkeeping_per_logit_s:.0f} ps per logit per round"
            + ("; each method's own code per round: " + "; ".join(
                f"{method_label(m)} {1e6 * o.round_s:+.0f} us {1e9 * o.round_per_row_s:+.0f} ns per row"
                for m, o in cost.drafts.items()) if cost.drafts else "")
            + (f"; each fitted cell its own pace, a factor on every method's sections there that cancels in a "
               f"speedup (held-out cells at 1): {_pace_span(cost.paces)}" if cost.paces else "")
            + f". {judged}.")


def _pace_span(paces: dict) -> str:
    """The lowest (fastest) and the highest fitted cell's pace, with their cells."""
    (lo, fast), (hi, slow) = min(paces.items(), key=lambda kv: kv[1]), max(paces.items(), key=lambda kv: kv[1])
    return f"{fast:.2f} (B = {lo[0]}, L = {lo[1]}) to {slow:.2f} (B = {hi[0]}, L = {hi[1]})"


def fit_rows(timings: list[DecodeTiming], held_out: list[DecodeTiming], cost: profiled.ProfiledCost, target,
             drafts: dict[str, profiled.DraftShape], *, bytes_per_value: float, k: int) -> list[dict]:
    """Per timing, its measured seconds per round (AD: per step, averaged over runs,
    `wallclock.loop_timings`) against the profiled model's (`profiled.modeled_sections`), and
    whether the fit saw it."""
    unseen = {(t.method, t.batch, t.context) for t in held_out}
    rows = []
    for t in loop_timings(timings):
        modeled = profiled.modeled_sections(cost, t, target=target.shape(), vocab_size=target.vocab_size,
                                            drafts=drafts, k=k, bytes_per_value=bytes_per_value)
        rows.append({"method": method_label(t.method) if t.method != "ad" else "AD", "B": t.batch, "L": t.context,
                     "measured": 1e3 * t.round_s, "profiled": 1e3 * modeled, "error": modeled / t.round_s - 1,
                     "role": "held out" if (t.method, t.batch, t.context) in unseen else "fitted"})
    return rows


def timing_rows(timings: list[DecodeTiming]) -> list[dict]:
    """One row per timed method and (B, L): median tokens/s and the runs' range, tau, ms per
    round, and the fastest run's split of decode time into draft, verify and bookkeeping."""
    rows = []
    for t in timings:
        tps, split = t.tokens_per_s, t.split(t.best)
        rows.append({"L": t.context, "B": t.batch, "method": method_label(t.method) if t.method != "ad" else "AD",
                     "tps": float(np.median(tps)), "spread": f"{min(tps):,.0f} to {max(tps):,.0f}",
                     "tau": float(np.mean(t.taus)), "round": 1e3 * float(np.median(t.seconds)) / t.rounds[0],
                     "draft": split["draft"], "verify": split["verify"], "book": split["bookkeeping"]})
    return rows


def speedup_cells(timings: list[DecodeTiming], target, drafts: dict, shapes: dict[str, profiled.DraftShape],
                  cost: profiled.ProfiledCost, *, peak_flops: float, bandwidth: float, bytes_per_value: float,
                  k: int, sparse: dict[str, SinkWindow], held_out=()) -> list[dict]:
    """One cell per timed draft and (B, L) with an AD timing: the measured speedup with its 95%
    CI and the paper's model (`wallclock.modeled_speedups`; drafts: method -> ModelConfig or
    None), with the profiled model's speedup, its error profiled / measured - 1 and whether the
    cell is one of the `held_out` (B, L) the fit never saw (`wallclock.profiled_cells`, shapes
    from `wallclock.profiled_draft_shapes`)."""
    cells = modeled_speedups(timings, target, drafts, peak_flops=peak_flops, bandwidth=bandwidth,
                             bytes_per_value=bytes_per_value, k=k, sparse=sparse)
    profiled = {(c["method"], c["B"], c["L"]): c for c in profiled_cells(
        timings, cost, target, shapes, bytes_per_value=bytes_per_value, k=k, held_out=held_out)}
    for c in cells:
        c.update(profiled[c["method"], c["B"], c["L"]])
        c["role"] = "held out" if c["held_out"] else "fitted"
        c["ci"] = f"{c['ci_low']:.2f} to {c['ci_high']:.2f}"
    return cells


def ad_step_rows(timings: list[DecodeTiming], target, cost: profiled.ProfiledCost, *, peak_flops: float,
                 bandwidth: float, bytes_per_value: float, new_tokens: int) -> list[dict]:
    """Per AD timing, ms per step measured (median run), by the paper's model
    (`wallclock.modeled_step_seconds`, at the starting context) and by the profiled model (over
    the capacity L + G a step reads, at its cell's fitted pace), and measured / paper's."""
    rows = []
    for t in (t for t in timings if t.method == "ad"):
        measured = float(np.median(t.seconds)) / t.rounds[0]
        modeled = modeled_step_seconds(target, t.batch, t.context, peak_flops=peak_flops, bandwidth=bandwidth,
                                       bytes_per_value=bytes_per_value)
        fitted = cost.pace(t.batch, t.context) * profiled.ad_step_seconds(
            cost, target.shape(), target.vocab_size, t.batch, profiled.ad_keys(t.context, new_tokens), bytes_per_value)
        rows.append({"L": t.context, "B": t.batch, "measured": 1e3 * measured, "modeled": 1e3 * modeled,
                     "ratio": measured / modeled, "profiled": 1e3 * fitted})
    return rows


def flop_rows(models: dict, contexts, keys: dict[str, int] | None = None) -> list[dict]:
    """Per model (name -> ModelConfig) and context length, the body FLOPs per token the paper's
    model counts and, relative to them, the attention and unembedding FLOPs it leaves out
    (`wallclock.flops_per_token`); `keys[name]` caps the keys a model attends to (a sparse draft)."""
    rows = []
    for name, cfg in models.items():
        for L in contexts:
            f = flops_per_token(cfg, min(L, (keys or {}).get(name, L)))
            rows.append({"model": name, "L": L, "body": f["body"], "attention": f["attention"] / f["body"],
                         "unembedding": f["unembedding"] / f["body"]})
    return rows


def summarize(cells: list[dict], ad_rows: list[dict]) -> dict:
    """What the conclusion quotes: the cells where the paper's model errs least and most, the
    median AD step overhead (measured / modeled), the cells where SD was slower than AD, the
    paper's model's median absolute error, the profiled model's `wallclock.profiled_verdict`
    and its worst cell."""
    return {"best": min(cells, key=lambda c: abs(c["error"])), "worst": max(cells, key=lambda c: abs(c["error"])),
            "overhead": float(np.median([r["ratio"] for r in ad_rows])),
            "losing": [c for c in cells if c["measured_speedup"] < 1.0],
            "median_error": float(np.median([abs(c["error"]) for c in cells])),
            "profiled": profiled_verdict(cells),
            "worst_profiled": max(cells, key=lambda c: abs(c["profiled_error"]))}


def _half(c: dict) -> float:
    return half_width(c["measured_speedup"], c["ci_low"], c["ci_high"])


def _cell(c: dict) -> str:
    return f"{method_label(c['method'])} at B = {c['B']}, L = {c['L']}{PAST_NOTE if c.get('past_training') else ''}"


#: What a cell decoded past the target's training windows carries next to its figure.
PAST_NOTE = " (past the target's training windows)"


def trained_length(trained) -> int | None:
    """The window length the target was trained on (its training's seq_len; method §5's contexts
    should stay within it), or None for an imported target, trained elsewhere on windows this run
    does not know."""
    return None if trained.summary.get("imported_from") else int(trained.train_config.seq_len)


def mark_past_training(cells: list[dict], trained_len: int | None, new_tokens: int) -> list[dict]:
    """`cells` with "past_training": whether a cell's contexts and generated tokens (L + G) run past
    the `trained_length` of the target, so its figure is about a target used beyond what it
    learned (False where that length is unknown)."""
    return [{**c, "past_training": trained_len is not None and c["L"] + new_tokens > trained_len} for c in cells]


def _span_x(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}x"


def cell_winners(cells: list[dict], key: str = "measured_speedup") -> tuple[list[list[str]], list[int], list[int]]:
    """Per (B, L) cell of `cells` (one per method), the method with the highest `key` speedup, or
    "ad" where none beats AD ("-" where nothing was timed): (winners by B then L, B values, L values)."""
    grouped = by_cell(cells, key)
    Bs, Ls = sorted({b for b, _ in grouped}), sorted({l for _, l in grouped})
    return [[winner(grouped[b, l]) if (b, l) in grouped else "-" for l in Ls] for b in Bs], Bs, Ls


def both_sides(cells: list[dict]) -> str:
    """Where speculative decoding won on the clock and where it lost (Markdown): per method the
    (B, L) cells it won, resolved (`winners.resolved`), and its range of speedups there, where the
    winner flips (`winners.where_sentence`, only resolved winners counted), the lengths that run
    past the target's training windows (`mark_past_training`), the cells where every draft was
    resolved slower than AD, and each method's measurements slower than AD."""
    winners, Bs, Ls = cell_winners(cells)
    speedup = {(c["method"], c["B"], c["L"]): c["measured_speedup"] for c in cells}
    past = sorted({c["L"] for c in cells if c.get("past_training")})
    unresolved = unresolved_cells(cells, Bs, Ls)
    n_cells = sum(w != "-" for row in winners for w in row)
    won: dict[str, list[float]] = {}
    lost = []
    for i, b in enumerate(Bs):
        for j, length in enumerate(Ls):
            w = winners[i][j]
            if (i, j) in unresolved:
                continue
            if w == AD:
                lost.append((b, length))
            elif w != "-":
                won.setdefault(w, []).append(speedup[w, b, length])
    n_won = sum(len(v) for v in won.values())
    text = (f"**Where speculative decoding won** (resolved: the winner's 95% CI clear of every other method's and "
            f"of AD's): in {n_won} of {n_cells} (B, L) cells"
            + (": " + ", ".join(f"{method_label(m)} in {len(v)} ({_span_x(v)})"
                                for m, v in sorted(won.items(), key=lambda kv: -len(kv[1]))) if won else "")
            + f". Per cell: {where_sentence(winners, Bs, Ls, unresolved_cells(cells, Bs, Ls))} "
            + (f"The cells at L = {', '.join(map(str, past))} run past the target's training windows: their speedups "
               "are of a target used beyond what it learned. " if past else ""))
    slower = {}
    for c in cells:
        if c["measured_speedup"] < 1.0:
            slower.setdefault(c["method"], []).append(c)
    text += "**Where it lost:** " + (
        "every draft was resolved slower than AD at (B, L) = " + ", ".join(f"({b}, {length})" for b, length in lost)
        + "; " if lost else "no cell where every draft was resolved slower than AD; ")
    text += ("; ".join(f"{method_label(m)} was slower than AD in {len(v)} of "
                       f"{sum(c['method'] == m for c in cells)} cells ({_span_x([c['measured_speedup'] for c in v])})"
                       for m, v in slower.items()) or "no draft was slower than AD anywhere") + "."
    return text


def profiled_sides(cells: list[dict]) -> str:
    """The profiled model in one paragraph: which way it errs and by how much (mean signed
    error, how many cells it over- and under-predicts, median error), its error on the held-out
    cells next to the fitted ones, the (B, L) cells where it picks another winner than the clock
    (where the clock's winner is resolved, `winners.resolved`), and any cell it calls a gain that
    measured a loss."""
    s = profiled_verdict(cells)
    errors = [c["profiled_error"] for c in cells]
    over = sum(e > 0 for e in errors)
    measured, Bs, Ls = cell_winners(cells)
    predicted, _, _ = cell_winners(cells, "profiled_speedup")
    unresolved = unresolved_cells(cells, Bs, Ls)  # no winner on the clock to pick wrongly
    wrong = [f"B = {b}, L = {length} (it picks {method_label(predicted[i][j])}, the clock "
             f"{method_label(measured[i][j])})" for i, b in enumerate(Bs) for j, length in enumerate(Ls)
             if measured[i][j] != "-" and (i, j) not in unresolved and predicted[i][j] != measured[i][j]]
    direction = ("overpredicts" if s["mean_signed_error"] > 0 else "underpredicts")
    held = sorted({(c["B"], c["L"]) for c in cells if c.get("held_out")})
    text = (f"**The profiled model {direction} the speedup by {abs(s['mean_signed_error']):.1%} on average** (mean "
            f"signed error {s['mean_signed_error']:+.1%}; too high in {over} of {len(errors)} cells, too low in "
            f"{len(errors) - over}); its median error is {s['median_error']:.1%}. ")
    if held:
        text += (f"Fitted to the rounds timed at the other cells (median error there {s['fitted_median_error']:.1%}), "
                 f"it predicts the held-out cells {', '.join(f'(B = {b}, L = {length})' for b, length in held)} "
                 f"within {s['held_out_max_error']:.1%}. ")
    text += (f"It picks the wrong winner at {'; '.join(wrong)}. " if wrong else
             "It picks the measured winner in every cell where one is resolved. " if unresolved else
             "It picks the measured winner in every cell. ")
    text += ("It calls " + ", ".join(f"{_cell(c)} a gain ({c['profiled_speedup']:.2f}x) that measured a loss "
                                     f"({c['measured_speedup']:.2f}x)" for c in s["false_gains"]) + "."
             if s["false_gains"] else f"Every cell it predicts at {GAIN}x or more measured a gain.")
    return text


def for_your_gpu(verdict: dict, paces: dict | None = None) -> str:
    """What the profiled model's record here (`wallclock.profiled_verdict`) means for a user who
    profiles their own GPU with it; `paces`: the fitted cells' (`ProfiledCost.paces`), which
    bound what it can say of seconds, as against speedups, at a cell it did not see."""
    held = verdict["held_out_max_error"]
    return ("**Profiling your own GPU:** run this notebook with `device: cuda` and your grid; the model is fitted to "
            "your machine's own rounds at the cells you time, with its peak and bandwidth pinned to its calibration. "
            + (f"Here it predicted cells it never saw within {held:.0%}: trust its winner where the methods' "
               f"predicted speedups differ by more than that, hold out cells beyond your grid as this run does, "
               f"and time the cells where they differ by less." if held is not None else
               "Hold out cells beyond your grid (`held_out`) to learn how far it extrapolates before trusting it "
               "there.")
            + (f" It predicts speedups, not seconds: every method at a cell shares that cell's pace, which cancels "
               f"in a speedup but is unknown at a cell the fit did not see (the fitted cells' ranged from "
               f"{_pace_span(paces)}), so read tokens/s there from a timed run." if paces else ""))


def conclusion(summary: dict, n_cells: int, cost: profiled.ProfiledCost, hoi: float,
               cells: list[dict] | None = None, ci: float = 0.05) -> tuple[str, ...]:
    """09's conclusion (Markdown paragraphs): with `cells`, first both sides of the clock
    (`both_sides`), the profiled model's direction of error, held-out error and wrong winners
    (`profiled_sides`) and what that means for a GPU user (`for_your_gpu`); then how far the
    paper's model is off, where speculative decoding lost, how many cells' 95% CIs reached the
    +/- `ci` the timing asked for, and what the profiled model's terms say of the losses
    (`summarize`)."""
    best, worst, overhead, losing = summary["best"], summary["worst"], summary["overhead"], summary["losing"]
    paper = (f"At this scale the paper's model's error ranges from {best['error']:+.0%} "
             f"({method_label(best['method'])}, B = {best['B']}, L = {best['L']}) to {worst['error']:+.0%} "
             f"({method_label(worst['method'])}, B = {worst['B']}, L = {worst['L']}); a median AD step takes "
             f"{overhead:,.1f}x the modeled time. "
             + ("Fixed per-pass costs dominate: the model overstates what speculative decoding gains here. "
                if overhead > 3 else
                "Passes are close to their modeled cost, so the model's ranking of methods holds. ")
             + f"HOI here is {hoi:,.1f} FLOP/byte against the paper's 600.")
    clock = (f"**Speculative decoding was slower than AD in {len(losing)} of {n_cells} measured cells**"
             + (": " + ", ".join(f"{_cell(c)} ({c['measured_speedup']:.2f}x)" for c in losing) if losing else "")
             + f". Every measured speedup has a 95% CI within +/-{summary['profiled']['widest_ci']:.1%} of it"
             + (f" ({sum(_half(c) <= ci for c in cells)} of {len(cells)} within the +/-{ci:.0%} asked for: a speedup "
                "varies with the contexts each run draws, through their rounds, and with this machine's noise, and "
                "the others would need more runs than the time budget per cell allows)"
                if cells and any(_half(c) > ci for c in cells) else "")
             + ". Where the "
             f"profiled model predicts a loss, the reason is in its terms: each of the draft's k passes pays "
             f"{1e6 * cost.per_layer_s:.0f} us per layer in launches and a {1e6 * cost.sampling_s:.0f} us draw that "
             f"one AD step pays once per token.")
    lead = (both_sides(cells), profiled_sides(cells), for_your_gpu(summary["profiled"], cost.paces)) if cells else ()
    return (*lead, paper, clock)


def machine_sentence(machine: dict, dtype, bytes_per_value: int) -> str:
    """This machine as `calibrate.calibrate` measured it (matmul peak in its precision, memory bandwidth,
    the HOI they make, method §2) and the models' dtype (`dtype`, `bytes_per_value`), in one line."""
    peak, bandwidth = machine["peak_flops"], machine["bandwidth"]
    return (f"{machine['precision']} matmul peak {peak / 1e9:,.1f} GFLOP/s, memory bandwidth {bandwidth / 1e9:,.1f} GB/s "
            f"-> HOI {peak / bandwidth:,.1f} FLOP/byte (the paper's H100 FP8 figure: 600); models in {dtype}, "
            f"{bytes_per_value} bytes per value; "
            + (f"saved as the hardware table's \"this machine, measured\" entry ({Path(machine['saved_to']).name})"
               if machine.get("saved_to") else "not saved"))


def measured_results(cells: list[dict], cost: profiled.ProfiledCost, summary: dict, machine: dict, device: str,
                     bytes_per_value: int, scale: str, threads: int | None = None,
                     trained_len: int | None = None) -> dict:
    """What notebook 09 records: the cells (CELL_FIELDS, each marked by `mark_past_training`), the
    profiled model with `summarize`'s verdict on it (median, mean signed, fitted and held-out
    errors, false gains), the HOI, the machine (`calibrate`'s peak and bandwidth, the device, bytes
    per value, the AD step's overhead, the scale note) and the target's `trained_length`."""
    peak, bandwidth = machine["peak_flops"], machine["bandwidth"]
    verdict = summary["profiled"]
    return {"cells": [{key: c[key] for key in CELL_FIELDS} for c in cells],
            "profiled_model": {**cost.to_dict(), **verdict, "false_gains": len(verdict["false_gains"]),
                               "cells_slower_than_ad": len(summary["losing"])},
            "hoi": peak / bandwidth,
            "machine": {"peak_flops": peak, "precision": machine["precision"], "bandwidth": bandwidth, "device": device,
                        "bytes_per_value": bytes_per_value, "ad_step_overhead": summary["overhead"], "scale": scale,
                        **({"threads": threads} if threads else {})},
            "target_trained_length": trained_len}


# The CPU schedule (`spire deploy --model profiled`, docs/deploy.md) against the measured cells.

SCHEDULE_COLUMNS = {"B": "B", "L": "L", "scheduled": "schedule's choice (profiled)", "measured": "best measured",
                    "interval": "its 95% CI", "lands": "schedule within it"}


def schedule_acceptance(run: dict, cells: list[dict], k: int) -> dict[int, dict]:
    """Per measured L, per timed method the acceptance its schedule reads: notebook 04's tau, CI
    and per-position curve when the run recorded them at that L (`deploy.recorded_acceptance`),
    else the cells' own mean tau at depth k (i.i.d., no interval)."""
    from spirelib.workbook.deploy import DeployError, recorded_acceptance

    out = {}
    for L in sorted({int(c["L"]) for c in cells}):
        methods = {c["method"]: float(c["tau"]) for c in cells if int(c["L"]) == L}
        try:
            recorded, at = recorded_acceptance(run, L)
        except DeployError:
            recorded, at = {}, None
        out[L] = ({m: recorded[m] for m in methods} if at == L and set(methods) <= set(recorded) else
                  {m: Acceptance(min(tau, k + 1.0), 0.0, k) for m, tau in methods.items()})
    return out


def scheduled_choices(cells: list[dict], cost: profiled.ProfiledCost, shapes: dict[str, profiled.DraftShape],
                      acceptance: dict[int, dict], target, vocab_size: int, new_tokens: int, *,
                      bytes_per_value: float, error: float) -> dict[tuple[int, int], tuple[str, int, float]]:
    """Per measured (B, L) what this machine's schedule serves: per method the profiled model's
    schedule over B = 1..the largest measured B at L (`modeling.schedule`, its interval widened by
    `error`), its k and predicted speedup at B, and the method with the highest one; ("ad", 0,
    1.0) where every method's schedule is off. `acceptance[L]`: method -> `schedule.Acceptance`."""
    batches = np.arange(1, max(int(c["B"]) for c in cells) + 1)
    choices = {}
    for L in sorted({int(c["L"]) for c in cells}):
        at_l = {}
        for method, a in acceptance[L].items():
            table = profiled_table(cost, shapes[method], a, batches, L, target, vocab_size, new_tokens,
                                   bytes_per_value=bytes_per_value, error=error)
            at_l[method] = (table, schedule(table))
        for B in sorted({int(c["B"]) for c in cells if int(c["L"]) == L}):
            options = [(method, s.k_at(B), float(t.at(s.k_at(B))[0][B - 1])) for method, (t, s) in at_l.items()]
            best = max(options, key=lambda o: o[2])
            choices[(B, L)] = best if best[1] != OFF else (AD, OFF, 1.0)
    return choices


def schedule_check_rows(cells: list[dict], choices: dict[tuple[int, int], tuple[str, int, float]]) -> list[dict]:
    """Per measured (B, L): the schedule's choice and predicted speedup, the best measured option
    (AD at 1 exactly, or the method with the highest measured speedup, at the series' k) with its
    95% CI, and whether the predicted speedup lands in that interval."""
    rows = []
    for (B, L), (method, k, predicted) in sorted(choices.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        here = [c for c in cells if int(c["B"]) == B and int(c["L"]) == L]
        top = max(here, key=lambda c: c["measured_speedup"])
        low, high = (top["ci_low"], top["ci_high"]) if top["measured_speedup"] > 1.0 else (1.0, 1.0)
        name = method_label(top["method"]) if top["measured_speedup"] > 1.0 else "AD"
        rows.append({"B": B, "L": L,
                     "scheduled": "off (AD)" if method == AD else f"{method_label(method)} k={k}: {predicted:.2f}x",
                     "measured": name if name == "AD" else f"{name}: {top['measured_speedup']:.2f}x",
                     "interval": f"{low:.2f}..{high:.2f}", "lands": bool(low <= predicted <= high)})
    return rows


def schedule_check_sentence(rows: list[dict]) -> str:
    """How many measured cells the schedule's prediction lands in, in one line."""
    lands = sum(r["lands"] for r in rows)
    missed = ", ".join(f"(B = {r['B']}, L = {r['L']})" for r in rows if not r["lands"])
    return (f"**The CPU schedule against the clock:** at {lands} of {len(rows)} measured (B, L) cells the "
            "schedule's choice (from the profiled model) predicts a speedup within the 95% CI of the best measured "
            "option (AD counted at exactly 1)" + (f"; not at {missed}." if missed else "."))
