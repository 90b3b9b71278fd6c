"""The words of the throughput-model notebooks (method §2): 01's settings, sentences and
conclusion (`lead`, 07's too), 06's answer heading, best-k notes, schedules and where each
scenario's winner flips, and 07's memory line. They read what `throughput.scenarios` computed."""

from __future__ import annotations

import numpy as np

from spirelib.throughput import perfmodel as pm
from spirelib.throughput.methods import label as method_label
from spirelib.throughput.scenarios import Scenario
from spirelib.throughput.schedule import Schedule
from spirelib.throughput.winners import winner
from spirelib.workbook.narrative.winners import where_sentence


def settings_line(scenario: Scenario, tau_context: int) -> str:
    """The cost-model settings a notebook runs under: HOI, the overlap rule f, k and the taus
    (Table 1 at `tau_context`)."""
    return (f"HOI = {scenario.hoi:g} FLOP/byte, f = {'max' if scenario.overlap else 'sum'}, k = {scenario.k}, "
            f"tau from L = {tau_context}: {scenario.taus}")


def no_sparse_sentence(spread: dict, B: int = 64) -> str:
    """What SPIRe's TM without the sparse KV cache spans (`min_max`) at batch B over L = 8..1M."""
    return f"SPIRe without sparse KV at B = {B}, L = 8..1M: min {spread['min']:.4f}x, max {spread['max']:.4f}x"


def alpha_sentence(alphas: dict) -> str:
    """The i.i.d. acceptance rates implied by the taus (method §2's tau(k) inverted)."""
    return "Implied i.i.d. acceptance: " + ", ".join(f"{method_label(m)} alpha = {a:.3f}" for m, a in alphas.items())


def mixed_change_sentences(change: dict) -> str:
    """One line per draft window of `mixed_length_rows`'s change: the largest change per method."""
    return "\n".join(f"window {window}: largest change vs a uniform batch of the same mean: "
                     + ", ".join(f"{method_label(m)} {100 * v:.2f}%" for m, v in by_method.items())
                     for window, by_method in change.items())


def spire_over_magicdec_sentence(cell, summary: dict) -> str:
    """`spire_over_magicdec`'s numbers in one line, the headline cell (B, L) named."""
    return (f"SPIRe / MagicDec at (B, L) = {tuple(cell)}: {summary['at_highlight']:.3f}; "
            f"over the grid {summary['grid_min']:.3f} .. {summary['grid_max']:.3f}")


def tau_needed_sentence(rows: list[dict], B: int, L: int, k: int) -> str:
    """`tau_needed_rows` in words: per method the tau it needs at (B, L) to equal SPIRe and to beat AD,
    and whether a round of k drafts can yield it at all (at most k + 1 tokens)."""
    def reach(tau: float) -> str:
        return "" if tau <= k + 1 else f", out of reach at k = {k} (a round yields at most {k + 1})"
    parts = [f"{r['method']} would need tau {r['spire']:.2f} to equal SPIRe{reach(r['spire'])} and "
             f"{r['ad']:.2f} to beat AD{reach(r['ad'])}" for r in rows]
    return f"At B = {B}, L = {L} (modeled, the paper's shapes and SPIRe's paper tau): " + "; ".join(parts) + "."


def answer_heading(B: int, L: int) -> str:
    """The heading of the answer table at (B, L)."""
    return f"**The answer at B = {B}, L = {L}** (modeled throughput multiplier over AD):"


def searched_depths(caps: dict[str, int]) -> str:
    """How deep `best_k_maps` searched per method ("SPIRe k <= 4, ...")."""
    return ", ".join(f"{method_label(m)} k <= {c}" for m, c in caps.items())


def capped_note(best: dict, caps: dict[str, int], deeper: int | None = None) -> str | None:
    """A note for the methods whose best-k map reaches its search cap somewhere (a deeper draft
    may be better still), quoting notebook 01's best k for SPIRe at (64, 512) (`deeper`) when
    known; None when no map reaches its cap."""
    capped = [method_label(m) for m in best if int(np.max(best[m])) == caps[m]]
    if not capped:
        return None
    return (f"**Capped search:** measured acceptance reaches only the measured depth, so the map stops "
            f"there; where {', '.join(capped)} shows its cap a deeper draft may be better still"
            + (f" (notebook 01, with i.i.d. acceptance up to k = 12 and the paper's tau, finds k = {deeper} "
               "for SPIRe at (64, 512))." if deeper else "."))


def schedule_sentence(schedules: dict[str, Schedule], L: int) -> str:
    """The schedules' ranges at L in words, one method a line."""
    return "\n".join(f"- **{method_label(m)}** at L = {L}: {s.describe()}" for m, s in schedules.items())


def memory_sentence(target: str, B: int, L: int) -> str:
    """The target's KV cache for B rows of L tokens beside its body weights, in GB at one byte per value."""
    shape = pm.PRESETS[target]
    kv_bytes, weight_bytes = B * L * pm.kv_values_per_token(shape), pm.body_params(shape)
    return (f"B = {B}, L = {L}: target KV cache {kv_bytes / 1e9:,.0f} GB, body weights "
            f"{weight_bytes / 1e9:,.0f} GB (at 1 byte per value)")


def lead(scenario: Scenario, multipliers: dict, stated: dict | None, B: int, L: int, grid_B, grid_L,
         grid_name: str = "Figure 4") -> list[str]:
    """01's conclusion in words, before its evidence (Markdown paragraphs): the modeled multipliers
    at (B, L) against the paper's stated ones (`stated`, only on the paper's own cell: then "the
    same to the paper's two decimals" or which differ), and where the winner flips over the
    grid (`winners.where_sentence`; `grid_name` names it: 01's Figure 4, 07's Figure 6 heat maps)."""
    methods = [m for m in ("spire", "magicdec", "vanilla") if m in multipliers]
    values = ", ".join(f"{method_label(m)} {multipliers[m]:.2f}x" for m in methods)
    text = (f"**The paper's arithmetic, redone:** with the paper's shapes and tau (HOI {scenario.hoi:g}, "
            f"f = {'max' if scenario.overlap else 'sum'}, k = {scenario.k}) the model gives, at B = {B}, L = {L}: "
            f"{values}.")
    if stated:
        differ = [m for m in methods if m in stated and round(multipliers[m], 2) != stated[m]]
        text += (" The paper states " + ", ".join(f"{stated[m]:.2f}x" for m in methods if m in stated) + ": "
                 + ("the same to its two decimals." if not differ else
                    "different for " + ", ".join(method_label(m) for m in differ) + "."))
    else:
        text += " The paper states no multipliers for this cell."
    grids = scenario.multipliers(np.asarray(grid_B)[:, None], np.asarray(grid_L)[None, :])
    winners = [[winner({m: float(g[i, j]) for m, g in grids.items()}) for j in range(len(grid_L))]
               for i in range(len(grid_B))]
    where = (f"**Which draft, where ({grid_name}, modeled):** {where_sentence(winners, list(grid_B), list(grid_L))} "
             "This checks the model, not drafts trained here; notebook 06 answers with this run's tau.")
    return [text, where]


def where_sentences(grids: dict[str, dict], labels: dict[str, str]) -> str:
    """Per scenario's `winner_grid`, where the winner flips (`winners.where_sentence`), one
    Markdown line each under the scenario's label (`labels[name]`)."""
    return "\n".join(f"- **{labels.get(name, name)}:** {where_sentence(g['winners'], g['B'], g['L'])}"
                     for name, g in grids.items())


def one_pass_sentence(grid: dict, tau: float, spire_tau: float) -> str:
    """06's words on a one-pass drafter (method §2, "Beyond the paper's three"): in how many (B, L)
    cells of `grid` (method -> TM over the map, the paper's shapes with a one-pass drafter of SPIRe's
    draft shape at the stated `tau`) it would beat SPIRe (at `spire_tau`) and be the best method."""
    beats = np.asarray(grid["one_pass"]) > np.asarray(grid["spire"])
    best = pm.best_method(grid, baseline=1.0) == "one_pass"
    text = (f"**A one-pass drafter at a stated tau of {tau:g}** (a parameter of the question, not a measurement: "
            f"SPIRe's draft shape proposing all k tokens in one forward, as DFlash and P-EAGLE do) would beat SPIRe "
            f"at its tau of {spire_tau:.2f} in {int(beats.sum())} of {beats.size} cells of the map and be the best "
            f"method in {int(best.sum())}. ")
    if beats.all():
        return text + "At that tau one pass instead of k buys more than SPIRe's acceptance anywhere on the map."
    if not beats.any():
        return text + "At that tau SPIRe's acceptance is worth more than one pass instead of k everywhere on the map."
    return text + "The cells where it wins are those where the k sequential draft passes weigh most in a round."
