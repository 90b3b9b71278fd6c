"""The words of notebook 08, the cost analysis (method §2, "Cost analysis"): where SPIRe's
training cost comes from, the tables' headings, SPIRe's margin over MagicDec, the paper's five
numbers against ours, and the conclusion (`lead`)."""

from __future__ import annotations

import numpy as np

from spirelib.throughput.recorded import RecordedTrainingCost
from spirelib.throughput.savings import relative_margin


def with_measured_training(modeled: dict[str, dict[str, float]], measured: RecordedTrainingCost | None
                           ) -> tuple[dict[str, dict[str, float]], str]:
    """The drafts' training units 08 prices with, and where SPIRe's come from, in words: the cost
    per token notebook 03 measured (`measured`: its "training_cost", `recorded.measured_training_cost`)
    for SPIRe at every target, where this run recorded one (it holds the frozen target's forward on
    every batch, which the body-parameter count leaves out), else the body-parameter model
    `modeled` (`savings.training_units_by_target`), said so (method §2, "Cost analysis")."""
    if not measured:
        return modeled, ("SPIRe's training is priced from its body parameters, "
                         + ", ".join(f"{units['spire']:.2f} units ({name})" for name, units in modeled.items())
                         + ": this run recorded no measured training cost (notebook 03).")
    units = measured.spire_units_per_token
    return ({name: {**m, "spire": units} for name, m in modeled.items()},
            f"SPIRe's training is priced at {units:.2f} target-training units, the cost per token notebook 03 measured "
            f"(the draft trained at {measured.spire_tokens_per_s:,.0f} tokens/s, the target at "
            f"{measured.target_tokens_per_s:,.0f}: every SPIRe step runs the frozen target forward), trained on as "
            f"many tokens as its target; its body parameters alone would say {measured.body_ratio:.2f}, the "
            "paper's \"about 1/4\".")


def cost_heading(name: str, B: int, L: int, serving_units: float) -> str:
    """The heading of one `cost_at` table."""
    return f"**{name} at B = {B}, L = {L}**, serving = {serving_units:g} units"


def margin_sentence(label: str, nets: dict[str, float]) -> str:
    """SPIRe's net savings minus MagicDec's (units, and `relative_margin` when MagicDec saves anything)."""
    m = relative_margin(nets)
    return (f"{label}: SPIRe's net savings minus MagicDec's = {nets['spire'] - nets['magicdec']:.3f} units"
            + (f" ({100 * m:+.1f}%)" if m is not None else " (MagicDec saves nothing here)"))


def check_sentences(checks: list[dict]) -> str:
    """SPIRe's net savings over MagicDec's at (64, 512) (checks 1 and 2) from the paper's numbers,
    the rounded and the full TM, one line each."""
    return "\n".join(f"SPIRe net over MagicDec at (64, 512), {column:>7}: "
                     f"{100 * (checks[1][column] / checks[2][column] - 1):.2f}%"
                     for column in ("paper", "rounded", "full"))


def max_training_sentence(limit: float) -> str:
    """`max_training_units` in words."""
    return f"SPIRe stays ahead while its training costs less than {limit:.2f} target-training units"


def mixed_heading(lengths, spread: float, seed: int, serving_units: float) -> str:
    """The heading of `mixed_length_savings`'s table: the batch's lengths (a `LengthDistribution` sample)."""
    values = lengths.lengths
    return (f"B = {len(values)} requests, lengths {values.min()}..{values.max()}, "
            f"mean {float(values.mean()):.0f} (sigma {spread:g}, seed {seed}); "
            f"net savings at serving = {serving_units:g}:")


def mixed_margin_sentences(margins: dict) -> str:
    """Per draft window, SPIRe's net savings minus MagicDec's in the mixed and the uniform batch."""
    return "\n".join(f"window {window}: SPIRe's net savings minus MagicDec's, mixed batch {mixed:.3f} units, "
                     f"uniform batch {uniform:.3f} units" for window, (mixed, uniform) in margins.items())


def lead(checks: list[dict], net: dict, net_70b: dict, break_even: dict, limit: float, serving_units: float,
         cells: tuple[tuple[int, int], tuple[int, int]], source: str) -> list[str]:
    """08's conclusion in words, before its evidence (Markdown paragraphs): whether training SPIRe
    pays at the cost tables' cells (`cells`: the small target's and the 70B's (B, L)) against
    MagicDec, from what serving volume, and up to what training cost (`max_training_units`), at
    the training cost `source` names (`with_measured_training`); and
    how the paper's five numbers (`paper_cost_checks`) come out: from the full multipliers, only
    from the multipliers rounded to two decimals first (the paper's arithmetic), or neither."""
    (b, l), (b70, l70) = cells
    spire_ahead = net["spire"] > net["magicdec"]
    verdict = (f"**Training SPIRe {'pays' if spire_ahead else 'does not pay'}** at serving = {serving_units:g} "
               f"target-training units: net savings {net['spire']:.2f} against MagicDec's {net['magicdec']:.2f} "
               f"(small target, B = {b}, L = {l}), {net_70b['spire']:.2f} against {net_70b['magicdec']:.2f} "
               f"(Llama 3 70B, B = {b70}, L = {l70}).")
    volume = break_even["spire_vs_magicdec"]
    verdict += (f" SPIRe's training is repaid against AD after {break_even['spire_vs_ad']:.2f} units of serving and "
                + (f"overtakes MagicDec from {volume:.2f} units" if np.isfinite(volume) else "never overtakes MagicDec")
                + f"; at {serving_units:g} units it stays ahead while its training costs less than {limit:.2f} units. "
                + source)
    full = [c for c in checks if "full" in c["which"]]
    rounded = [c for c in checks if c["which"] == "rounded"]
    neither = [c for c in checks if c["which"] == "neither"]
    paper = (f"**The paper's five numbers:** {len(full)} of {len(checks)} agree to two decimals from the model's "
             "full multipliers"
             + (f"; {len(rounded)} only from the multipliers rounded to two decimals first, as the paper quotes them: "
                + "; ".join(f"{c['quantity']}: {c['full']:.2f} from the full multipliers, {c['rounded']:.2f} from "
                            f"the rounded ones (the paper's {c['paper']:.2f})" for c in rounded) if rounded else "")
             + (f"; {len(neither)} from neither: "
                + "; ".join(f"{c['quantity']}: {c['full']:.2f} (the paper's {c['paper']:.2f})" for c in neither)
                if neither else "")
             + ".")
    return [verdict, paper]
