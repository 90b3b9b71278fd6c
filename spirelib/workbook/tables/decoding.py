"""Tables of measured acceptance (method §5, 8) as notebook 04 shows them: tau per method and
context length shaped like the paper's Table 1 (or per KV budget), tau beside the target's own loss
past the training windows, and every measurement's counts and rates.
They take `tau.TauStats` per method and context length ({method: {L: TauStats}})."""

from __future__ import annotations

from collections.abc import Mapping

from spirelib.measure.context_loss import LossStats
from spirelib.throughput.methods import label as method_label
from spirelib.workbook.plots.decoding import Stats


def table1_rows(stats: Stats, paper: Mapping[int, Mapping[str, float]] | None = None, key: str = "L") -> list[dict]:
    """Rows shaped like the paper's Table 1: one per context length (longest first), per
    method "tau ± CI" measured here and, where the paper has that L, the paper's tau. Keys are
    the methods' display names (they are the table's headers). `key` names the first column:
    another integer may stand where L does (04's KV-budget sweep: {method: {budget: TauStats}})."""
    lengths = sorted({L for by_length in stats.values() for L in by_length}, reverse=True)
    rows = []
    for L in lengths:
        row = {key: L}
        for method, by_length in stats.items():
            s = by_length.get(L)
            row[method_label(method)] = f"{s.mean:.3f} ± {s.ci95:.3f}" if s else ""
            if paper:
                row[f"{method_label(method)} (paper)"] = (f"{paper[L][method]:.3f}" if L in paper and method in paper[L]
                                                          else "—")
        rows.append(row)
    return rows


def length_rows(stats: Stats, losses: Mapping[int, LossStats], trained_on: int, new_tokens: int) -> list[dict]:
    """One row per context length (shortest first): whether L + G fits the `trained_on`-token
    training windows, the target's loss on the continuation and every method's tau, each ± its
    95% CI (method §5, "Past the training length")."""
    rows = []
    for L in sorted(losses):
        row = {"L": L, "L + G": L + new_tokens, "within the training windows": "yes" if L + new_tokens <= trained_on
               else f"no ({(L + new_tokens) / trained_on:.1f}x)",
               "target's loss (nats/token)": f"{losses[L].mean:.3f} ± {losses[L].ci95:.3f}"}
        for method, by_length in stats.items():
            s = by_length.get(L)
            row[method_label(method)] = f"{s.mean:.3f} ± {s.ci95:.3f}" if s else ""
        rows.append(row)
    return rows


def acceptance_rows(stats: Stats) -> list[dict]:
    """One row per method and context length: n, rounds, tau, acceptance rate, per position."""
    rows = []
    for method, by_length in stats.items():
        for L in sorted(by_length):
            s = by_length[L]
            rows.append({"method": method, "L": L, "n_contexts": s.n_contexts, "rounds": s.rounds,
                         "tau": f"{s.mean:.3f} ± {s.ci95:.3f}", "acceptance_rate": s.acceptance_rate,
                         "per_position": ", ".join(f"{p:.3f}" for p in s.per_position)})
    return rows
