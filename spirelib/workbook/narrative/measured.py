"""The words of notebook 09, the throughput model against the clock: the fitted profiled model
in one line, the machine, where speculative decoding won and where it lost, which way the
profiled model errs, what that means for profiling one's own GPU, the CPU schedule against the
measured cells, and the conclusion (`conclusion`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spirelib.measure.wallclock import GAIN, profiled_verdict
from spirelib.throughput import profiled
from spirelib.throughput.methods import label as method_label
from spirelib.throughput.recorded import RecordedCell
from spirelib.throughput.winners import AD, cell_winners, unresolved_cells
from spirelib.workbook.narrative.winners import where_sentence


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


def _cell(c: RecordedCell) -> str:
    return f"{method_label(c.method)} at B = {c.B}, L = {c.L}{PAST_NOTE if c.past_training else ''}"


#: What a cell decoded past the target's training windows carries next to its figure.
PAST_NOTE = " (past the target's training windows)"


def _span_x(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}x"


def both_sides(cells: list[RecordedCell]) -> str:
    """Where speculative decoding won on the clock and where it lost (Markdown): per method the
    (B, L) cells it won, resolved (`winners.resolved`), and its range of speedups there, where the
    winner flips (`winners.where_sentence`, only resolved winners counted), the lengths that run
    past the target's training windows (`mark_past_training`), the cells where every draft was
    resolved slower than AD, and each method's measurements slower than AD."""
    winners, Bs, Ls = cell_winners(cells)
    speedup = {(c.method, c.B, c.L): c.measured_speedup for c in cells}
    past = sorted({c.L for c in cells if c.past_training})
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
        if c.measured_speedup < 1.0:
            slower.setdefault(c.method, []).append(c)
    text += "**Where it lost:** " + (
        "every draft was resolved slower than AD at (B, L) = " + ", ".join(f"({b}, {length})" for b, length in lost)
        + "; " if lost else "no cell where every draft was resolved slower than AD; ")
    text += ("; ".join(f"{method_label(m)} was slower than AD in {len(v)} of "
                       f"{sum(c.method == m for c in cells)} cells ({_span_x([c.measured_speedup for c in v])})"
                       for m, v in slower.items()) or "no draft was slower than AD anywhere") + "."
    return text


def profiled_sides(cells: list[RecordedCell]) -> str:
    """The profiled model in one paragraph: which way it errs and by how much (mean signed
    error, how many cells it over- and under-predicts, median error), its error on the held-out
    cells next to the fitted ones, the (B, L) cells where it picks another winner than the clock
    (where the clock's winner is resolved, `winners.resolved`), and any cell it calls a gain that
    measured a loss."""
    s = profiled_verdict(cells)
    errors = [c.profiled_error for c in cells]
    over = sum(e > 0 for e in errors)
    measured, Bs, Ls = cell_winners(cells)
    predicted, _, _ = cell_winners(cells, "profiled_speedup")
    unresolved = unresolved_cells(cells, Bs, Ls)  # no winner on the clock to pick wrongly
    wrong = [f"B = {b}, L = {length} (it picks {method_label(predicted[i][j])}, the clock "
             f"{method_label(measured[i][j])})" for i, b in enumerate(Bs) for j, length in enumerate(Ls)
             if measured[i][j] != "-" and (i, j) not in unresolved and predicted[i][j] != measured[i][j]]
    direction = ("overpredicts" if s["mean_signed_error"] > 0 else "underpredicts")
    held = sorted({(c.B, c.L) for c in cells if c.held_out})
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
    text += ("It calls " + ", ".join(f"{_cell(c)} a gain ({c.profiled_speedup:.2f}x) that measured a loss "
                                     f"({c.measured_speedup:.2f}x)" for c in s["false_gains"]) + "."
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


def _resolution(cells: list[RecordedCell], ci: float) -> str:
    """How the cells' speedups were resolved under 09's stopping rule (`stopping.SpeedupRule`):
    within the +/- `ci` asked for, else excluding 1, else not at all (their time ran out)."""
    narrow = sum(c.half_width <= ci for c in cells)
    beyond = sum(c.half_width > ci and (c.ci_low > 1 or c.ci_high < 1) for c in cells)
    return (f" ({narrow} of {len(cells)} within the +/-{ci:.0%} asked for, {beyond} more wider but clear of 1, SD "
            f"faster or slower than AD there, and {len(cells) - narrow - beyond} unresolved when their time per cell "
            "ran out: a speedup varies with the contexts each run draws, through their rounds, and with this "
            "machine's noise)")


def conclusion(summary: dict, n_cells: int, cost: profiled.ProfiledCost, hoi: float,
               cells: list[RecordedCell] | None = None, ci: float = 0.05) -> tuple[str, ...]:
    """09's conclusion (Markdown paragraphs): with `cells`, first both sides of the clock
    (`both_sides`), the profiled model's direction of error, held-out error and wrong winners
    (`profiled_sides`) and what that means for a GPU user (`for_your_gpu`); then how far the
    paper's model is off, where speculative decoding lost, how many cells' 95% CIs reached the
    +/- `ci` the timing asked for, and what the profiled model's terms say of the losses
    (`summarize_cells`)."""
    best, worst, overhead, losing = summary["best"], summary["worst"], summary["overhead"], summary["losing"]
    paper = (f"At this scale the paper's model's error ranges from {best.error:+.0%} "
             f"({method_label(best.method)}, B = {best.B}, L = {best.L}) to {worst.error:+.0%} "
             f"({method_label(worst.method)}, B = {worst.B}, L = {worst.L}); a median AD step takes "
             f"{overhead:,.1f}x the modeled time. "
             + ("Fixed per-pass costs dominate: the model overstates what speculative decoding gains here. "
                if overhead > 3 else
                "Passes are close to their modeled cost, so the model's ranking of methods holds. ")
             + f"HOI here is {hoi:,.1f} FLOP/byte against the paper's 600.")
    clock = (f"**Speculative decoding was slower than AD in {len(losing)} of {n_cells} measured cells**"
             + (": " + ", ".join(f"{_cell(c)} ({c.measured_speedup:.2f}x)" for c in losing) if losing else "")
             + f". Every measured speedup has a 95% CI within +/-{summary['profiled']['widest_ci']:.1%} of it"
             + (_resolution(cells, ci) if cells and any(c.half_width > ci for c in cells) else "")
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


def schedule_check_sentence(rows: list[dict]) -> str:
    """How many measured cells the schedule's prediction lands in, in one line."""
    lands = sum(r["lands"] for r in rows)
    missed = ", ".join(f"(B = {r['B']}, L = {r['L']})" for r in rows if not r["lands"])
    return (f"**The CPU schedule against the clock:** at {lands} of {len(rows)} measured (B, L) cells the "
            "schedule's choice (from the profiled model) predicts a speedup within the 95% CI of the best measured "
            "option (AD counted at exactly 1)" + (f"; not at {missed}." if missed else "."))
