"""Which method wins a (B, L) cell, and whether the clock resolves it (method §8's intervals):
the winner of modeled multipliers or measured speedups (`winner`, "ad" where none beats
autoregressive decoding), measured cell records grouped per cell (`by_cell`, `cell_winners`),
the cells whose winner is not resolved and the cells won per method. Shared by the run index
(`findings`) and the notebooks; `narrative.winners` says where the winner flips, in words."""

from __future__ import annotations

from spirelib.throughput.recorded import RecordedCell

AD = "ad"


def winner(values: dict[str, float]) -> str:
    """The method with the highest multiplier, or "ad" when none beats autoregressive decoding."""
    best = max(values, key=values.get)
    return best if values[best] >= 1.0 else AD


def by_cell(cells: list[RecordedCell], key: str) -> dict[tuple[int, int], dict[str, float]]:
    """09's cells grouped per (B, L): {method: its `key` field (a speedup or a CI bound)}; cells
    without that field (None) are left out."""
    out: dict[tuple[int, int], dict[str, float]] = {}
    for c in cells:
        value = getattr(c, key)
        if value is not None:
            out.setdefault((c.B, c.L), {})[c.method] = float(value)
    return out


def resolved(values: dict[str, float], lows: dict[str, float], highs: dict[str, float]) -> bool:
    """Whether a cell's winner on the clock is resolved (method §8's intervals): the winner's 95% CI
    (`lows`..`highs` per method, as 09 records each speedup's) lies above every other method's and
    above AD's (a speedup of 1); where no method beats AD, every method's CI lies below 1. A
    method without a recorded interval leaves the cell unresolved."""
    if any(m not in lows or m not in highs for m in values):
        return False
    win = winner(values)
    if win == AD:
        return all(highs[m] < 1.0 for m in values)
    return lows[win] > 1.0 and all(highs[m] < lows[win] for m in values if m != win)


def unresolved_cells(cells: list[RecordedCell], B: list[int], L: list[int]) -> set[tuple[int, int]]:
    """Grid indices (i, j) of the measured cells at (B[i], L[j]) (09's, with each speedup's CI)
    whose winner is not `resolved`."""
    values, lows, highs = (by_cell(cells, key) for key in ("measured_speedup", "ci_low", "ci_high"))
    return {(i, j) for i, b in enumerate(B) for j, length in enumerate(L)
            if (b, length) in values and not resolved(values[b, length], lows.get((b, length), {}),
                                                     highs.get((b, length), {}))}


def grid_counts(winners: list[list[str]]) -> dict[str, int]:
    """Cells won per method ("-": a cell without a result, not counted), most first."""
    counts: dict[str, int] = {}
    for row in winners:
        for w in row:
            if w != "-":
                counts[w] = counts.get(w, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def cell_winners(cells: list[RecordedCell], key: str = "measured_speedup") -> tuple[list[list[str]], list[int], list[int]]:
    """Per (B, L) cell of `cells` (one per method), the method with the highest `key` speedup, or
    "ad" where none beats AD ("-" where nothing was timed): (winners by B then L, B values, L values)."""
    grouped = by_cell(cells, key)
    Bs, Ls = sorted({b for b, _ in grouped}), sorted({l for _, l in grouped})
    return [[winner(grouped[b, l]) if (b, l) in grouped else "-" for l in Ls] for b in Bs], Bs, Ls
