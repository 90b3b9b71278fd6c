"""What notebooks show besides figures: Markdown tables and the one-line scale note that every
figure and table of a run carries (a report says at what scale its numbers were made)."""

from __future__ import annotations

import numpy as np
from IPython.display import Markdown, display

from spirelib.throughput.methods import STYLES, label
from spirelib.units import count


def markdown_table(rows: list[dict], columns: dict[str, str] | None = None, *, digits: int = 3) -> Markdown:
    """Rows of dicts as a Markdown table (renders in JupyterLab and in the HTML export).

    columns maps row keys to headers (default: the first row's keys, a method's key as its
    display name); floats get `digits` decimals (scientific from 1e7), integers thousands
    separators; a string cell that is a method's key ("magicdec") shows its display name.
    """
    columns = columns or {key: label(key) for key in rows[0]}

    def cell(value) -> str:
        if isinstance(value, str) and value in STYLES:
            return label(value)
        if isinstance(value, (bool, np.bool_)) or value is None:
            return str(value)
        if isinstance(value, (int, np.integer)):
            return f"{int(value):,}"
        if isinstance(value, (float, np.floating)):
            return f"{float(value):.3e}" if abs(value) >= 1e7 else f"{float(value):.{digits}f}"
        return str(value)

    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(key, "")) for key in columns) + " |" for row in rows]
    return Markdown("\n".join(lines))


def show_table(rows: list[dict], columns: dict[str, str] | None = None, *, digits: int = 3) -> None:
    """Display `markdown_table(rows, columns, digits=digits)` (a notebook's table in one call)."""
    display(markdown_table(rows, columns, digits=digits))


def model_scale(target, drafts=None) -> str:
    """A one-line note of the scale of a trained target and its drafts (`pipeline.TrainedModel`s,
    `drafts` a mapping name -> model): shapes, body parameters, training tokens, corpus, vocabulary."""
    parts = []
    for name, m in {"target": target, **(drafts or {})}.items():
        cfg = m.layers_config
        trained = ("imported" if m.summary.get("imported_from") else f"{count(m.summary['tokens'])} training tokens")
        parts.append(f"{name} {cfg.num_layers}x{cfg.d_model} ({count(cfg.body_params())} body params, {trained})")
    return ", ".join(parts) + f"; corpus {target.data.corpus_name}, vocab {target.config.vocab_size}"
