"""Where the winner flips over a (B, L) grid, in words (`where_sentence`: "MagicDec wins at L ≥
2K for B ≥ 16; SPIRe everywhere else"), with a grid's values in short (`pow2`, `span`): for the
run index and the notebooks' conclusions. The winners themselves come from `throughput.winners`."""

from __future__ import annotations

from spirelib.throughput.methods import label
from spirelib.throughput.winners import grid_counts


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


def _condition(indices: list[int], grid: list[int], name: str) -> str:
    """Grid values `indices` (into `grid`) as a condition on `name`: a range, or the values listed."""
    if indices == list(range(indices[0], indices[-1] + 1)):
        return _range(grid, grid[indices[0]], grid[indices[-1]], name, grid)
    return f"{name} in {{" + ", ".join(pow2(grid[i]) for i in indices) + "}"


def _regions(cells: list[list[bool]], outer: list[int], inner: list[int], outer_name: str,
             inner_name: str) -> list[str]:
    """The cells (`cells[i][j]` for outer value i, inner value j) as conditions: runs of
    consecutive outer values with the same inner values grouped, e.g. "L ≥ 2K for B ≥ 16"."""
    groups: list[tuple[list[int], list[int]]] = []
    for i, row in enumerate(cells):
        js = [j for j, hit in enumerate(row) if hit]
        if not js:
            continue
        if groups and groups[-1][1] == js and groups[-1][0][-1] == i - 1:
            groups[-1][0].append(i)
        else:
            groups.append(([i], js))
    return [" for ".join(c for c in (_condition(js, inner, inner_name), _condition(rows, outer, outer_name)) if c)
            or "every cell" for rows, js in groups]


def where_sentence(winners: list[list[str]], B: list[int], L: list[int],
                   unresolved: set[tuple[int, int]] = frozenset()) -> str:
    """Where the winner flips over a (B, L) grid (`winners[i][j]` at B[i], L[j]), in one sentence:
    every method but the most frequent one with the cells it wins (runs of B with the same L
    values grouped, or of L with the same B values, whichever takes fewer clauses), then
    "<most frequent> everywhere else"; e.g. "MagicDec wins at L ≥ 2K for B ≥ 16; SPIRe everywhere
    else". Measured grids pass the cells whose winner is not resolved (`unresolved_cells`): only
    resolved wins are counted, and those cells are named after."""
    if unresolved:
        shown = [["-" if (i, j) in unresolved else w for j, w in enumerate(row)] for i, row in enumerate(winners)]
        cells = ", ".join(f"B = {B[i]}, L = {pow2(L[j])} ({label(winners[i][j])} leads)" for i, j in sorted(unresolved))
        head = where_sentence(shown, B, L).replace("in every cell", "in every resolved cell").replace(
            "everywhere else", "in every other resolved cell")
        return ((head + " " if head else "") + f"No winner is resolved at {cells}: the leader's 95% CI overlaps "
                "another method's or AD's.")
    counts = grid_counts(winners)
    if not counts:
        return ""
    common = next(iter(counts))
    if len(counts) == 1:
        return f"{label(common)} wins in every cell (B = {span(B)}, L = {span(L)})."
    parts = []
    for method in list(counts)[1:]:
        cells = [[w == method for w in row] for row in winners]
        by_b = _regions(cells, B, L, "B", "L")
        by_l = _regions([list(col) for col in zip(*cells)], L, B, "L", "B")
        regions = by_l if len(by_l) < len(by_b) else by_b
        joined = regions[0] if len(regions) == 1 else ", ".join(regions[:-1]) + " and " + regions[-1]
        scattered = len(regions) > 6 or sum(" in {" in r for r in regions) > 1  # no region to speak of
        parts.append(f"{label(method)} wins {counts[method]} scattered cells" if scattered else
                     f"{label(method)} wins at {joined}")
    return "; ".join(parts) + f"; {label(common)} everywhere else."
