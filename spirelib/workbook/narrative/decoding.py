"""The words of notebook 04, measured acceptance (method §5, 8): its conclusion against the
paper's Table 1 (`lead`), what the ± intervals cover, acceptance past the training windows beside
the target's own loss (`past_training`) and the KV-budget sweep (`kv_budget_sentence`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from spirelib.throughput.methods import label as method_label


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


def _change(a: float, b: float, ci_a: float, ci_b: float) -> tuple[float, float, bool]:
    """b - a, its 95% half-width (the two intervals combined: contexts drawn apart per L) and whether
    it is resolved (the change exceeds the half-width)."""
    both = float(np.hypot(ci_a, ci_b))
    return b - a, both, abs(b - a) > both


def _and(names: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def past_training(taus: Mapping[str, Mapping[int, float]], ci95: Mapping[str, Mapping[int, float]],
                  loss: Mapping[int, float], loss_ci95: Mapping[int, float], trained_on: int,
                  new_tokens: int) -> str | None:
    """04's words on acceptance past the training length (method §5): from the longest L whose L + G
    fits the `trained_on`-token training windows to the longest L measured past them, the target's
    loss on the continuation and each method's tau, each change with its interval; then who gives
    out first, the target (its loss rises, resolved) or a draft (its tau falls while the target's
    loss does not rise). None when no L lies on both sides."""
    within = [L for L in loss if L + new_tokens <= trained_on]
    past = [L for L in loss if L + new_tokens > trained_on]
    if not within or not past:
        return None
    a, b = max(within), max(past)
    d, half, resolved = _change(loss[a], loss[b], loss_ci95[a], loss_ci95[b])
    target_rises = resolved and d > 0
    parts, fallen = [], []
    for m in taus:
        if a not in taus[m] or b not in taus[m]:
            continue
        dm, hm, rm = _change(taus[m][a], taus[m][b], ci95[m][a], ci95[m][b])
        if rm and dm < 0:
            fallen.append(method_label(m))
        parts.append(f"{method_label(m)} {taus[m][a]:.2f} to {taus[m][b]:.2f} ({dm:+.3f} ± {hm:.3f}"
                     + ("" if rm else ", not resolved") + ")")
    text = (f"**Past the training windows:** the target and the drafts trained on {trained_on:,}-token windows; "
            f"at L = {b:,}, L + G = {b + new_tokens:,} positions, {(b + new_tokens) / trained_on:.1f}x those windows. "
            f"From L = {a:,} to {b:,} the target's own loss on the continuation goes from {loss[a]:.3f} to "
            f"{loss[b]:.3f} nats ({d:+.3f} ± {half:.3f}" + ("" if resolved else ", not resolved") + "); tau: "
            + "; ".join(parts) + ". ")
    s = "s" if len(fallen) == 1 else ""
    if target_rises:
        text += ("The target itself gives out past its windows (its loss rises beyond the noise), so a draft's tau "
                 "there is measured against a weaker target: "
                 + (f"{_and(fallen)} fall{s} with it." if fallen else "no draft's tau falls."))
    elif fallen:
        text += (f"The target holds (its loss does not rise beyond the noise) while {_and(fallen)} give{s} out "
                 "first: tau falls where the target does not.")
    else:
        text += ("Neither gives out at this length: no draft's tau falls and the target's loss does not rise beyond "
                 "the noise.")
    return text


def kv_budget_sentence(deltas: Mapping[int, tuple[float, float]], resolved: Mapping[int, bool], L: int) -> str:
    """04's words on the KV-budget sweep (method §4): the guided draft's tau minus MagicDec's at each
    budget (`deltas`: budget -> (mean, 95% half-width), paired by context and random stream), which
    of them are resolved family-wise over the budgets (`resolved`, Holm), and what that says."""
    budgets = sorted(deltas)
    cells = [f"{b}: {deltas[b][0]:+.3f} ± {deltas[b][1]:.3f}" + (" (resolved)" if resolved[b] else "")
             for b in budgets]
    better = [b for b in budgets if resolved[b] and deltas[b][0] > 0]
    worse = [b for b in budgets if resolved[b] and deltas[b][0] < 0]
    text = (f"**KV budget at L = {L:,}** (entries per layer and KV head; the guided draft's tau minus MagicDec's, "
            "paired on the same contexts and random streams, resolved family-wise over the budgets by Holm's "
            "step-down, uncorrected intervals shown): " + "; ".join(cells) + ". ")
    if better and not worse:
        text += ("Choosing entries by the verification's attention buys acceptance at budgets "
                 + ", ".join(map(str, better)))
        text += "; elsewhere the difference is not resolved." if len(better) < len(budgets) else "."
    elif worse and not better:
        text += f"MagicDec's fixed window accepts more at budgets {', '.join(map(str, worse))}."
    elif better and worse:
        text += (f"The guided draft accepts more at budgets {', '.join(map(str, better))} and MagicDec at "
                 f"{', '.join(map(str, worse))}.")
    else:
        text += "No budget resolves a difference between the two at this scale."
    return text
