"""Tables of notebook 09, the throughput model against the clock: timed decoding
(`wallclock.DecodeTiming`), the profiled model's fit per timed round, AD steps, the FLOPs the
paper's model leaves out, the CPU schedule against the measured cells, and what 09 records of
the cells (`measure.cells`: the measured speedups beside the paper's and the profiled model).
They read wallclock's and profiled's outputs and compute nothing of their own beyond medians
and ratios."""

from __future__ import annotations

import numpy as np

from spirelib.measure.wallclock import DecodeTiming, flops_per_token, loop_timings, modeled_step_seconds
from spirelib.throughput import profile_fit, profiled
from spirelib.throughput.hardware import Machine
from spirelib.throughput.methods import label as method_label
from spirelib.throughput.recorded import RecordedCell, RecordedMachine, RecordedProfile
from spirelib.throughput.winners import AD

TIMING_COLUMNS = {"L": "L", "B": "B", "method": "method", "tps": "tokens/s (median)", "spread": "tokens/s (runs)",
                  "tau": "tau", "round": "ms per round (step)", "draft": "draft", "verify": "verify",
                  "book": "bookkeeping"}
CELL_COLUMNS = {"method": "method", "B": "B", "L": "L", "tau": "tau", "measured_speedup": "measured",
                "ci": "95% CI", "runs": "runs", "modeled_speedup": "paper's model", "error": "paper / measured - 1",
                "profiled_speedup": "profiled model", "profiled_error": "profiled / measured - 1",
                "role": "profiled fit", "past_training": "past the target's training windows?"}
FIT_COLUMNS = {"method": "method", "B": "B", "L": "L", "measured": "measured ms per round (AD: step)",
               "profiled": "profiled, ms", "error": "profiled / measured - 1", "role": "profiled fit"}
AD_COLUMNS = {"L": "L", "B": "B", "measured": "measured ms per AD step", "modeled": "paper's model, ms",
              "ratio": "measured / paper's", "profiled": "profiled model, ms"}
FLOP_COLUMNS = {"model": "model", "L": "L", "body": "body FLOPs per token (modeled)", "attention": "attention / body",
                "unembedding": "unembedding / body"}


def fit_rows(timings: list[DecodeTiming], held_out: list[DecodeTiming], cost: profiled.ProfiledCost,
             target: profiled.PricedTarget, drafts: dict[str, profiled.DraftShape], *, k: int) -> list[dict]:
    """Per timing, its measured seconds per round (AD: per step, averaged over runs,
    `wallclock.loop_timings`) against the profiled model's (`profile_fit.modeled_sections`), and
    whether the fit saw it."""
    unseen = {(t.method, t.batch, t.context) for t in held_out}
    rows = []
    for t in loop_timings(timings):
        modeled = profile_fit.modeled_sections(cost, t, target=target, drafts=drafts, k=k)
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


def ad_step_rows(timings: list[DecodeTiming], target, cost: profiled.ProfiledCost, *, machine: Machine,
                 new_tokens: int) -> list[dict]:
    """Per AD timing, ms per step measured (median run), by the paper's model
    (`wallclock.modeled_step_seconds`, at the starting context) and by the profiled model (over
    the capacity L + G a step reads, at its cell's fitted pace), and measured / paper's."""
    rows, priced = [], profiled.PricedTarget(target.shape(), target.vocab_size, machine.bytes_per_value)
    for t in (t for t in timings if t.method == "ad"):
        measured = float(np.median(t.seconds)) / t.rounds[0]
        modeled = modeled_step_seconds(target, t.batch, t.context, machine)
        fitted = cost.pace(t.batch, t.context) * profiled.ad_step_seconds(cost, priced, t.batch,
                                                                          profiled.ad_keys(t.context, new_tokens))
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


def cell_rows(cells: list[RecordedCell]) -> list[dict]:
    """One row per cell (`CELL_COLUMNS`): its recorded fields, its 95% CI in words and whether the
    profiled model was fitted to it or judged on it unseen."""
    return [{**c.to_dict(), "ci": f"{c.ci_low:.2f} to {c.ci_high:.2f}", "role": "held out" if c.held_out else "fitted"}
            for c in cells]


def measured_results(cells: list[RecordedCell], cost: profiled.ProfiledCost, summary: dict, machine: RecordedMachine,
                     trained_len: int | None = None) -> dict:
    """What notebook 09 records: the cells (`RecordedCell`, each marked by `mark_past_training`), the
    profiled model with `summarize_cells`'s verdict on it (median, mean signed, fitted and held-out
    errors, false gains), the HOI, the `machine` (`calibrate`'s peak and bandwidth, the device, bytes
    per value, the AD step's overhead, the scale note, the threads) and the target's `trained_length`."""
    verdict = summary["profiled"]
    return {"cells": [c.to_dict() for c in cells],
            "profiled_model": RecordedProfile(cost, **{**verdict, "false_gains": len(verdict["false_gains"])},
                                              cells_slower_than_ad=len(summary["losing"])).to_dict(),
            "hoi": machine.peak_flops / machine.bandwidth,
            "machine": machine.to_dict(),
            "target_trained_length": trained_len}


# The CPU schedule (`spire deploy --model profiled`, docs/deploy.md) against the measured cells.

SCHEDULE_COLUMNS = {"B": "B", "L": "L", "scheduled": "schedule's choice (profiled)", "measured": "best measured",
                    "interval": "its 95% CI", "lands": "schedule within it"}


def schedule_check_rows(cells: list[RecordedCell], choices: dict[tuple[int, int], tuple[str, int, float]]) -> list[dict]:
    """Per measured (B, L): the schedule's choice and predicted speedup, the best measured option
    (AD at 1 exactly, or the method with the highest measured speedup, at the series' k) with its
    95% CI, and whether the predicted speedup lands in that interval."""
    rows = []
    for (B, L), (method, k, predicted) in sorted(choices.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        top = max((c for c in cells if c.B == B and c.L == L), key=lambda c: c.measured_speedup)
        low, high = (top.ci_low, top.ci_high) if top.measured_speedup > 1.0 else (1.0, 1.0)
        name = method_label(top.method) if top.measured_speedup > 1.0 else "AD"
        rows.append({"B": B, "L": L,
                     "scheduled": "off (AD)" if method == AD else f"{method_label(method)} k={k}: {predicted:.2f}x",
                     "measured": name if name == "AD" else f"{name}: {top.measured_speedup:.2f}x",
                     "interval": f"{low:.2f}..{high:.2f}", "lands": bool(low <= predicted <= high)})
    return rows
