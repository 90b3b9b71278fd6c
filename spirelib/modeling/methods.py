"""The decoding methods and SPIRe variants by name: display label and colour, one table for
every plot, report and the run index (numpy-free, so the performance-model layer can use it).

Keys are the names the library uses everywhere: "ad" (autoregressive decoding), the draft
methods of the engine and the performance model ("vanilla", "magicdec", "spire", "guided", "lookup",
"one_pass"), the
ablation variants of method §3.8 (`spire.ABLATIONS`, plus the paper's "no_sparse_kv"), and
"target" for the target model's own curves. An unknown key is shown as itself, coloured
from plotly's qualitative palette by its position.
"""

from __future__ import annotations

from dataclasses import dataclass

_PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
            "#FECB52")  # plotly.colors.qualitative.Plotly


@dataclass(frozen=True)
class MethodStyle:
    label: str
    color: str


STYLES: dict[str, MethodStyle] = {
    "ad": MethodStyle("AD", "#7f7f7f"),
    "target": MethodStyle("target", "#7f7f7f"),
    "vanilla": MethodStyle("vanilla SD", "#2ca02c"),
    "magicdec": MethodStyle("MagicDec", "#1f77b4"),
    "spire": MethodStyle("SPIRe", "#d62728"),
    "guided": MethodStyle("guided sparse", "#17a0a0"),  # the verification-guided sparse self-draft
    "lookup": MethodStyle("prompt lookup", "#8c8c3c"),
    "one_pass": MethodStyle("one-pass drafter", "#e8a33d"),
    "random_init": MethodStyle("random init", "#ff7f0e"),
    "distill_only": MethodStyle("distillation only", "#9467bd"),
    "hard_target": MethodStyle("hard target", "#8c564b"),
    "no_feedback": MethodStyle("no feedback", "#e377c2"),
    "no_feedback_no_target_acts": MethodStyle("no feedback, no target activations", "#bcbd22"),
    "no_sparse_kv": MethodStyle("no sparse KV", "#17becf"),
}


def label(key) -> str:
    """The display name of a method or variant (the key itself if it has none)."""
    style = STYLES.get(key)
    return style.label if style else str(key)


def color(key, i: int = 0) -> str:
    """The colour of a method or variant; an unknown key gets palette entry `i`."""
    style = STYLES.get(key)
    return style.color if style else _PALETTE[i % len(_PALETTE)]
