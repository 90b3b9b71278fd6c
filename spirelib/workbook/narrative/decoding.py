"""The words of notebook 04, measured acceptance (method §5, 8): its conclusion against the
paper's Table 1 (`lead`) and what the ± intervals cover."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from spirelib.modeling.methods import label as method_label


def _fmt_range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:+.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:+.2f} to {hi:+.2f}"


#: What 04's ± intervals are about, said in its lead: the contexts, for the one trained target and
#: drafts of this run; retraining them moves tau by more (docs/method.md §10 measures by how much).
INTERVAL_SCOPE = ("**What the ± intervals cover:** the contexts only (95%, over the contexts drawn at each L), "
                  "for this run's one trained target and the drafts trained on it, both held fixed. Training "
                  "them again (another seed, another machine's rounding) is not in them and moves tau by more "
                  "than they show (docs/method.md §10): compare runs through their intervals only when the "
                  "models are the same checkpoints.")


def lead(taus: Mapping[str, Mapping[int, float]], paper: Mapping[int, Mapping[str, float]],
         ci95: Mapping[str, Mapping[int, float]] | None = None) -> list[str]:
    """04's conclusion in words, before its evidence (Markdown paragraphs), from the measured mean
    tau per method and L (`taus`) and the paper's Table 1 (`paper`): the order of the methods at
    the L nearest the paper's 512 against the paper's; each method's difference to the paper's tau
    at the lengths both measured; and the trend over L against the paper's, with what this run can
    say of it: with `ci95` (the 95% half-widths per method and L), a change between the shortest
    and the longest L within the two intervals combined (sqrt(a^2 + b^2), contexts drawn apart per
    L) is not resolved; a rise every method shares, the dense vanilla draft's included, comes from
    the text and the target, not from one draft's design. With `ci95`, the second paragraph says
    what the intervals are about (`INTERVAL_SCOPE`)."""
    lengths = sorted({int(L) for by_l in taus.values() for L in by_l})
    at = min(lengths, key=lambda L: (abs(L - 512), L))
    order = sorted((m for m in taus if at in taus[m]), key=lambda m: -taus[m][at])
    paper_at = min(paper, key=lambda L: (abs(L - at), L))
    paper_order = sorted((m for m in order if m in paper[paper_at]), key=lambda m: -paper[paper_at][m])
    same = [m for m in order if m in paper[paper_at]] == paper_order
    out = [f"**Order at L = {at}:** " + " > ".join(f"{method_label(m)} {taus[m][at]:.2f}" for m in order)
           + f"; the paper's at L = {paper_at}: " + " > ".join(f"{method_label(m)} {paper[paper_at][m]:.2f}"
                                                             for m in paper_order)
           + (" (the same order)." if same else " (a different order).")]
    if ci95:
        out.append(INTERVAL_SCOPE)
    diffs = {m: [taus[m][L] - paper[L][m] for L in lengths if L in taus[m] and L in paper and m in paper[L]]
             for m in order}
    diffs = {m: d for m, d in diffs.items() if d}
    if diffs:
        out.append("**Against the paper's tau** at the lengths both measured, this run's minus the paper's: "
                   + "; ".join(f"{method_label(m)} {_fmt_range(d)}" for m, d in diffs.items())
                   + ". The models, vocabulary and corpus are this run's (see the scale line), not the paper's: the "
                   "digits are not expected to agree, the order and the trend over L are what can be compared.")
    trends, shared = [], []
    for m in order:
        ours = [L for L in lengths if L in taus[m]]
        theirs = [L for L in ours if L in paper and m in paper[L]]
        if len(ours) < 2:
            continue
        change = taus[m][ours[-1]] - taus[m][ours[0]]
        rise = change > 0
        text = (f"{method_label(m)}'s tau {'rises' if rise else 'falls'} with L here "
                f"({taus[m][ours[0]]:.2f} at L = {ours[0]} to {taus[m][ours[-1]]:.2f} at L = {ours[-1]}")
        resolved = True
        if ci95 and m in ci95:
            both = float(np.hypot(ci95[m][ours[0]], ci95[m][ours[-1]]))
            resolved = abs(change) > both
            text += f", {change:+.3f} ± {both:.3f}" + ("" if resolved else ": not resolved, within the noise")
        text += ")"
        shared.append(rise if resolved else None)
        if len(theirs) >= 2:
            first, last = paper[theirs[0]][m], paper[theirs[-1]][m]
            if round(first, 2) == round(last, 2):
                text += f", where the paper's stays at {first:.2f}"
            else:
                text += (f", {'as' if (last > first) == rise else 'where'} the paper's "
                         f"{'rises' if last > first else 'falls'} ({first:.2f} to {last:.2f})")
        trends.append(text)
    if trends:
        cause = ""
        if len(shared) > 1 and all(r is True for r in shared):
            cause = (" Every method's tau rises with L here, the vanilla draft's too, which reads its own dense "
                     "cache and shares nothing with SPIRe's window or MagicDec's: the rise comes from the text and "
                     "the target (later positions of a document are easier to predict for draft and target alike), "
                     "not from one draft's design.")
        elif len(shared) > 1 and all(r is False for r in shared):
            cause = " Every method's tau falls with L here."
        out.append("**Over L:** " + "; ".join(trends) + "." + cause)
    return out
