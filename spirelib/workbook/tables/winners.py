"""Winners over a (B, L) grid and where they flip, in words: shared by the run index
(`findings`) and the notebooks' conclusions (09's measured cells, 06's modeled grids)."""

from __future__ import annotations

from spirelib.modeling.methods import label

AD = "ad"


def pow2(value: int) -> str:
    """1024 as "1K", 2048 as "2K", 2**20 as "1M"; other values as themselves."""
    value = int(value)
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def span(values: list[int]) -> str:
    """A grid axis in short: "32..8K", or its values when there are at most two."""
    return f"{pow2(min(values))}..{pow2(max(values))}" if len(values) > 2 else ", ".join(map(pow2, values))


def winner(values: dict[str, float]) -> str:
    """The method with the highest multiplier, or "ad" when none beats autoregressive decoding."""
    best = max(values, key=values.get)
    return best if values[best] >= 1.0 else AD


def grid_counts(winners: list[list[str]]) -> dict[str, int]:
    """Cells won per method ("-": a cell without a result, not counted), most first."""
    counts: dict[str, int] = {}
    for row in winners:
        for w in row:
            if w != "-":
                counts[w] = counts.get(w, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _range(values: list[int], lo: int, hi: int, name: str, grid: list[int]) -> str:
    """`name` over grid values lo..hi as a condition: "" when it is the whole grid."""
    if lo == grid[0] and hi == grid[-1]:
        return ""
    if lo == hi:
        return f"{name} = {pow2(lo)}"
    if lo == grid[0]:
        return f"{name} ≤ {pow2(hi)}"
    if hi == grid[-1]:
        return f"{name} ≥ {pow2(lo)}"
    return f"{name} = {pow2(lo)}..{pow2(hi)}"


def _columns(js: list[int], L: list[int]) -> str:
    """The L columns `js` (indices into L) as a condition on L."""
    if js == list(range(js[0], js[-1] + 1)):
        return _range(L, L[js[0]], L[js[-1]], "L", L)
    return "L in {" + ", ".join(pow2(L[j]) for j in js) + "}"


def where_sentence(winners: list[list[str]], B: list[int], L: list[int]) -> str:
    """Where the winner flips over a (B, L) grid (`winners[i][j]` at B[i], L[j]), in one sentence:
    every method but the most frequent one with the cells it wins (rows of B with the same L
    columns grouped), then "<most frequent> everywhere else"; e.g. "MagicDec wins at L ≥ 2K for
    B ≥ 16; SPIRe everywhere else"."""
    counts = grid_counts(winners)
    if not counts:
        return ""
    common = next(iter(counts))
    if len(counts) == 1:
        return f"{label(common)} wins in every cell (B = {span(B)}, L = {span(L)})."
    parts = []
    for method in list(counts)[1:]:
        groups: list[tuple[list[int], list[int]]] = []  # (rows of B, columns of L) with the same columns
        for i, row in enumerate(winners):
            js = [j for j, w in enumerate(row) if w == method]
            if not js:
                continue
            if groups and groups[-1][1] == js and groups[-1][0][-1] == i - 1:
                groups[-1][0].append(i)
            else:
                groups.append(([i], js))
        regions = []
        for rows, js in groups:
            on_l = _columns(js, L)
            on_b = _range(B, B[rows[0]], B[rows[-1]], "B", B) if rows == list(range(rows[0], rows[-1] + 1)) else ""
            regions.append(" for ".join(c for c in (on_l, on_b) if c) or "every cell")
        joined = regions[0] if len(regions) == 1 else ", ".join(regions[:-1]) + " and " + regions[-1]
        parts.append(f"{label(method)} wins at {joined}" if len(regions) < 4 else
                     f"{label(method)} wins {counts[method]} scattered cells")
    return "; ".join(parts) + f"; {label(common)} everywhere else."
