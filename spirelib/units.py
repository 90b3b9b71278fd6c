"""How the workbook writes a big number: counts of parameters and tokens (`count`: 67.1M, 1.34B),
amounts of FLOPs and bytes (`si`: 1.2T, 3.4G) and durations (`duration`: 42 s, 3.5 min), one way
everywhere a report, the plan or an error message states one."""

from __future__ import annotations

import math


def count(n: float) -> str:
    """A count to 3 significant digits with B, M or k (8,390,656 -> "8.39M"; below 1,000 as is)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def si(x: float) -> str:
    """An amount (FLOPs, bytes) to one decimal with P, T, G, M or k; "" for none."""
    if not x:
        return ""
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def duration(seconds: float) -> str:
    """Seconds as the plan, the run's summary and the reports show them: "8.0 s", "42 s", "3.5 min", "1.2 h".
    Not tqdm's `format_interval`: its clock form ("03:30", "1:12:00") is not the units these sentences read in."""
    if math.isnan(seconds):
        return "-"
    if seconds < 0.05:
        return "0 s"
    if seconds < 90:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
