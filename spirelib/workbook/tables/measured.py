"""Tables of notebook 09, the throughput model against the clock: timed decoding
(`wallclock.DecodeTiming`), the measured speedup of every cell next to the paper's model
(method §2) and the profiled model (`profiled`), AD steps, the FLOPs the paper's model leaves
out, and the conclusion drawn from them. They read wallclock's and profiled's outputs and
compute nothing of their own beyond medians and ratios."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spirelib.engine.kvcache import SinkWindow
from spirelib.engine.wallclock import (
    DecodeTiming,
    flops_per_token,
    modeled_speedups,
    modeled_step_seconds,
    profiled_speedups,
)
from spirelib.modeling import profiled
from spirelib.modeling.methods import label as method_label
from spirelib.workbook.tables.winners import AD, where_sentence, winner

TIMING_COLUMNS = {"L": "L", "B": "B", "method": "method", "tps": "tokens/s (median)", "spread": "tokens/s (runs)",
                  "tau": "tau", "round": "ms per round (step)", "draft": "draft", "verify": "verify",
                  "book": "bookkeeping"}
CELL_COLUMNS = {"method": "method", "B": "B", "L": "L", "tau": "tau", "measured_speedup": "measured",
                "measured_low": "lowest run", "measured_high": "highest run", "modeled_speedup": "paper's model",
                "error": "paper / measured - 1", "profiled_speedup": "profiled model",
                "profiled_error": "profiled / measured - 1"}
CELL_FIELDS = ("method", "B", "L", "measured_speedup", "modeled_speedup", "profiled_speedup", "tau", "measured_low",
               "measured_high", "error", "profiled_error")  # what results.json's "cells" keep
AD_COLUMNS = {"L": "L", "B": "B", "measured": "measured ms per AD step", "modeled": "paper's model, ms",
              "ratio": "measured / paper's", "profiled": "profiled model, ms"}
FLOP_COLUMNS = {"model": "model", "L": "L", "body": "body FLOPs per token (modeled)", "attention": "attention / body",
                "unembedding": "unembedding / body"}


def profile_summary(cost: profiled.ProfiledCost, fit_error: np.ndarray, seconds: float) -> str:
    """One line of the fitted profiled model: every term it prices, and the fit's relative
    error over the profiled forwards (`fit_error`, (n_forwards,))."""
    return (f"profiled {len(fit_error)} forwards in {seconds:.1f} s: fixed {1e6 * cost.fixed_s:.0f} us "
            f"+ ({1e6 * cost.per_layer_s:.0f} us + {1e9 * cost.per_token_layer_s:.0f} ns per token) per layer "
            f"+ max(matmul FLOPs / {cost.flops_per_s / 1e9:.1f} GFLOP/s, bytes / {cost.bytes_per_s / 1e9:.1f} GB/s) "
            f"+ attention FLOPs / {cost.attention_flops_per_s / 1e9:.1f} GFLOP/s; "
            f"bookkeeping {1e6 * cost.bookkeeping_s:.0f} us per round, "
            f"sampling {1e6 * cost.sampling_s:.0f} us per draft pass; fit error median {np.median(fit_error):.1%}, "
            f"worst {fit_error.max():.1%}"
            + (". Each method's own code, fitted to its timed calls, adds " + "; ".join(
                f"{method_label(m)} {1e6 * o.pass_s:+.0f} us {1e9 * o.pass_per_row_s:+.0f} ns per row per pass, "
                f"{1e6 * o.accept_s:+.0f} us {1e9 * o.accept_per_row_s:+.0f} ns per row per accept"
                for m, o in cost.drafts.items()) if cost.drafts else ""))


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


def profiled_draft_shapes(vanilla, spire_layers, spire, ring: SinkWindow) -> dict[str, profiled.DraftShape]:
    """What the profiled model needs of each timed draft: the vanilla draft's shape (its
    `ModelConfig`), MagicDec's ring of sink + window + 1 keys over the target's own layers, and
    the SPIRe draft's layer stack (`spire_layers`) reading its sink + window with target-activation
    memory in every layer when `spire` (its `SpireConfig`) has it (method §3.3)."""
    return {"vanilla": profiled.DraftShape("vanilla", vanilla.shape()),
            "magicdec": profiled.DraftShape("magicdec", None, keys=ring.sink + ring.window + 1),
            "spire": profiled.DraftShape("spire", spire_layers.shape(), keys=spire.sink + spire.window,
                                         memory_layers=spire.num_layers if spire.target_activations else 0)}


def speedup_cells(timings: list[DecodeTiming], target, drafts: dict, shapes: dict[str, profiled.DraftShape],
                  cost: profiled.ProfiledCost, *, peak_flops: float, bandwidth: float, bytes_per_value: float,
                  k: int, sparse: dict[str, SinkWindow]) -> list[dict]:
    """One cell per timed draft and (B, L) with an AD timing: the measured speedup and the
    paper's model (`wallclock.modeled_speedups`; drafts: method -> ModelConfig or None), with
    the profiled model's speedup (`wallclock.profiled_speedups`, shapes from
    `profiled_draft_shapes`) and its error profiled / measured - 1 added."""
    cells = modeled_speedups(timings, target, drafts, peak_flops=peak_flops, bandwidth=bandwidth,
                             bytes_per_value=bytes_per_value, k=k, sparse=sparse)
    predicted = profiled_speedups(timings, cost, target, shapes, bytes_per_value=bytes_per_value, k=k)
    for c in cells:
        c["profiled_speedup"] = predicted[c["method"], c["B"], c["L"]]
        c["profiled_error"] = c["profiled_speedup"] / c["measured_speedup"] - 1.0
    return cells


def ad_step_rows(timings: list[DecodeTiming], target, cost: profiled.ProfiledCost, *, peak_flops: float,
                 bandwidth: float, bytes_per_value: float, new_tokens: int) -> list[dict]:
    """Per AD timing, ms per step measured (median run), by the paper's model
    (`wallclock.modeled_step_seconds`, at the starting context) and by the profiled model (over
    the capacity L + G a step reads), and measured / paper's."""
    rows = []
    for t in (t for t in timings if t.method == "ad"):
        measured = float(np.median(t.seconds)) / t.rounds[0]
        modeled = modeled_step_seconds(target, t.batch, t.context, peak_flops=peak_flops, bandwidth=bandwidth,
                                       bytes_per_value=bytes_per_value)
        fitted = profiled.ad_step_seconds(cost, target.shape(), target.vocab_size, t.batch,
                                          profiled.ad_keys(t.context, new_tokens), bytes_per_value)
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
    models' median absolute errors and the profiled model's worst cell."""
    return {"best": min(cells, key=lambda c: abs(c["error"])), "worst": max(cells, key=lambda c: abs(c["error"])),
            "overhead": float(np.median([r["ratio"] for r in ad_rows])),
            "losing": [c for c in cells if c["measured_speedup"] < 1.0],
            "median_error": float(np.median([abs(c["error"]) for c in cells])),
            "profiled_error": float(np.median([abs(c["profiled_error"]) for c in cells])),
            "worst_profiled": max(cells, key=lambda c: abs(c["profiled_error"]))}


def _cell(c: dict) -> str:
    return f"{method_label(c['method'])} at B = {c['B']}, L = {c['L']}"


def _span_x(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}x"


def cell_winners(cells: list[dict], key: str = "measured_speedup") -> tuple[list[list[str]], list[int], list[int]]:
    """Per (B, L) cell of `cells` (one per method), the method with the highest `key` speedup, or
    "ad" where none beats AD ("-" where nothing was timed): (winners by B then L, B values, L values)."""
    by_cell: dict[tuple[int, int], dict[str, float]] = {}
    for c in cells:
        by_cell.setdefault((c["B"], c["L"]), {})[c["method"]] = c[key]
    Bs, Ls = sorted({b for b, _ in by_cell}), sorted({l for _, l in by_cell})
    return [[winner(by_cell[b, l]) if (b, l) in by_cell else "-" for l in Ls] for b in Bs], Bs, Ls


def both_sides(cells: list[dict]) -> str:
    """Where speculative decoding won on the clock and where it lost (Markdown): per method the
    (B, L) cells it won and its range of speedups there, where the winner flips
    (`winners.where_sentence`), the cells where no draft beat AD, and each method's measurements
    slower than AD."""
    winners, Bs, Ls = cell_winners(cells)
    speedup = {(c["method"], c["B"], c["L"]): c["measured_speedup"] for c in cells}
    n_cells = sum(w != "-" for row in winners for w in row)
    won: dict[str, list[float]] = {}
    lost = []
    for i, b in enumerate(Bs):
        for j, length in enumerate(Ls):
            w = winners[i][j]
            if w == AD:
                lost.append((b, length))
            elif w != "-":
                won.setdefault(w, []).append(speedup[w, b, length])
    n_won = sum(len(v) for v in won.values())
    text = (f"**Where speculative decoding won:** in {n_won} of {n_cells} (B, L) cells"
            + (": " + ", ".join(f"{method_label(m)} in {len(v)} ({_span_x(v)})"
                                for m, v in sorted(won.items(), key=lambda kv: -len(kv[1]))) if won else "")
            + f". Per cell: {where_sentence(winners, Bs, Ls)} ")
    slower = {}
    for c in cells:
        if c["measured_speedup"] < 1.0:
            slower.setdefault(c["method"], []).append(c)
    text += "**Where it lost:** " + (
        "no draft beat AD at (B, L) = " + ", ".join(f"({b}, {length})" for b, length in lost) + "; " if lost else
        "some draft beat AD in every cell; ")
    text += ("; ".join(f"{method_label(m)} was slower than AD in {len(v)} of "
                       f"{sum(c['method'] == m for c in cells)} cells ({_span_x([c['measured_speedup'] for c in v])})"
                       for m, v in slower.items()) or "no draft was slower than AD anywhere") + "."
    return text


def profiled_sides(cells: list[dict]) -> str:
    """The profiled model's direction of error (how many measurements it over- and under-predicts,
    its median signed error) and the (B, L) cells where it picks another winner than the clock."""
    errors = [c["profiled_error"] for c in cells]
    over = sum(e > 0 for e in errors)
    measured, Bs, Ls = cell_winners(cells)
    predicted, _, _ = cell_winners(cells, "profiled_speedup")
    wrong = [f"B = {b}, L = {length} (it picks {method_label(predicted[i][j])}, the clock "
             f"{method_label(measured[i][j])})" for i, b in enumerate(Bs) for j, length in enumerate(Ls)
             if measured[i][j] != "-" and predicted[i][j] != measured[i][j]]
    direction = ("overpredicts" if over > len(errors) / 2 else "underpredicts" if over < len(errors) / 2 else
                 "errs both ways on")
    return (f"**The profiled model** {direction} the speedup: too high in {over} of {len(errors)} measurements, too "
            f"low in {len(errors) - over} (median signed error {float(np.median(errors)):+.0%}). "
            + (f"It picks the wrong winner at {'; '.join(wrong)}." if wrong else
               "It picks the measured winner in every cell."))


def conclusion(summary: dict, n_cells: int, cost: profiled.ProfiledCost, hoi: float,
               cells: list[dict] | None = None) -> tuple[str, ...]:
    """09's conclusion (Markdown paragraphs): with `cells`, first both sides of the clock
    (`both_sides`) and the profiled model's direction of error and wrong winners (`profiled_sides`);
    then how far the paper's model is off, and where speculative decoding lost and what the
    profiled model's terms say of it (`summarize`)."""
    best, worst, overhead, losing = summary["best"], summary["worst"], summary["overhead"], summary["losing"]
    worst_profiled = summary["worst_profiled"]
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
             + f". The profiled model's median error is {summary['profiled_error']:.0%} (the paper's model: "
             f"{summary['median_error']:.0%}); its worst cell is {_cell(worst_profiled)} "
             f"({worst_profiled['profiled_error']:+.0%}). Where it predicts a loss, the reason is in its terms: the "
             f"draft's k passes each pay the fixed {1e6 * (cost.fixed_s + cost.per_layer_s):.0f} us-plus of a forward "
             f"that one AD step pays once per token.")
    lead = (both_sides(cells), profiled_sides(cells)) if cells else ()
    return (*lead, paper, clock)


def machine_sentence(machine: dict, dtype, bytes_per_value: int) -> str:
    """This machine as `calibrate.calibrate` measured it (fp32 matmul peak, memory bandwidth, the
    HOI they make, method §2) and the models' dtype (`dtype`, `bytes_per_value`), in one line."""
    peak, bandwidth = machine["fp32_flops"], machine["bandwidth"]
    return (f"fp32 matmul peak {peak / 1e9:,.1f} GFLOP/s, memory bandwidth {bandwidth / 1e9:,.1f} GB/s "
            f"-> HOI {peak / bandwidth:,.1f} FLOP/byte (the paper's H100 FP8 figure: 600); models in {dtype}, "
            f"{bytes_per_value} bytes per value; "
            + (f"saved as the hardware table's \"this machine, measured\" entry ({Path(machine['saved_to']).name})"
               if machine.get("saved_to") else "not saved"))


def measured_results(cells: list[dict], cost: profiled.ProfiledCost, fit_error: np.ndarray, summary: dict,
                     machine: dict, device: str, bytes_per_value: int, scale: str, threads: int | None = None) -> dict:
    """What notebook 09 records: the cells (CELL_FIELDS), the profiled model with its fit errors
    and `summarize`'s verdict, the HOI and the machine (`calibrate`'s peak and bandwidth, the
    device, bytes per value, the AD step's overhead, the scale note)."""
    peak, bandwidth = machine["fp32_flops"], machine["bandwidth"]
    return {"cells": [{key: c[key] for key in CELL_FIELDS} for c in cells],
            "profiled_model": {**cost.to_dict(), "fit_error_median": float(np.median(fit_error)),
                               "fit_error_max": float(fit_error.max()), "median_error": summary["profiled_error"],
                               "cells_slower_than_ad": len(summary["losing"])},
            "hoi": peak / bandwidth,
            "machine": {"fp32_flops": peak, "bandwidth": bandwidth, "device": device,
                        "bytes_per_value": bytes_per_value, "ad_step_overhead": summary["overhead"], "scale": scale,
                        **({"threads": threads} if threads else {})}}
