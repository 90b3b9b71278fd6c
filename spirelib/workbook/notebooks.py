"""One contract per notebook of the series (notebooks/NN_*.ipynb): its stem, the results keys it
records (`writes`: what results.json holds under its stem; `results.record` refuses any other, so
a reader can trust the names), the checks of its parameters taken together (`checks`, reported by
`spire run` and `spire check` before any notebook runs), and how a dry run scales its budgets
(`dry_run`: parameter -> the value it runs with, or a function of the value the run would use),
and whether it is `numpy_only`: its kernel imports no torch (it models, and reads what the others
measured), so its imports take half a second; no notebook's kernel imports the report stack
(`report`, nbconvert), which only the runner needs (tests/system/test_notebook_imports.py). The
plan's work per notebook is `work.WORK`, keyed by these stems (a test holds them together).

Light on purpose: the numpy-only notebooks (01, 06, 07, 08) record through it, so what a check or
a dry run needs from torch's layers is imported when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Notebook:
    """A notebook's contract (module docstring)."""

    stem: str
    writes: frozenset[str]
    checks: Callable[[dict], list[str]] | None = None
    dry_run: Mapping[str, Any] = field(default_factory=dict)
    numpy_only: bool = False


def _tau_checks(p: dict) -> list[str]:
    from spirelib.measure import stopping

    return stopping.rule_problems(p["tau_half_width"], p["tau_floor"])


def _ablation_checks(p: dict) -> list[str]:
    from spirelib.measure import ablations

    return ablations.look_problems(p["delta_first_look"], p["n_contexts"], p["decode_batch_size"],
                                   p["delta_half_width"])


def _timing_checks(p: dict) -> list[str]:
    from spirelib.measure import cells

    return cells.timing_problems(p["timing_batches"], p["timing_contexts"], p["held_out"], p["interleave"],
                                 cells.graphed_rounds(bool(p["series"].get("compile_decoding", False)),
                                                      str(p["series"].get("device", "auto"))))


def _dry_run_training(given):
    from spirelib.training.series_params import DRY_RUN_TRAINING

    return {**(given or {}), **DRY_RUN_TRAINING}


# The numpy-only notebooks (01, 06, 07 and 08) run unchanged in a dry run; the series itself is
# scaled by `training.series_params.dry_run`.
NOTEBOOKS: dict[str, Notebook] = {nb.stem: nb for nb in (
    Notebook("01_performance_model", frozenset({
        "headline", "headline_cell", "no_sparse_kv_b64", "ablations_b64_l512", "g_aware_vs_main_at_512",
        "best_k_spire_b64_l512", "mixed_length_max_change", "spire_over_magicdec", "tau_needed"}), numpy_only=True),
    Notebook("02_train_target", frozenset({"target"}),
             dry_run={"num_samples": 1, "prompt_tokens": 16, "sample_tokens": 8}),
    Notebook("03_train_drafts", frozenset({
        "vanilla_draft", "spire_draft", "eagle3_draft", "eagle3_export", "training_cost", "draft_budgets"})),
    Notebook("04_measure_tau", frozenset({
        "tau", "per_position_acceptance", "acceptance_rate", "target_loss", "kv_budget_sweep", "tau_protocol"}),
             checks=_tau_checks,
             dry_run={"context_lengths": [64, 256],  # below and above SPIRe's and MagicDec's sink + window
                      "n_contexts": 2, "decode_batch_size": 2}),
    Notebook("05_ablations", frozenset({
        "ablation_protocol", "component_delta_tau", "delta_tau", "importance", "importance_matches_paper",
        "interval", "learning_curves", "seeds", "step0", "tau"}),
             checks=_ablation_checks,
             dry_run={"ablation_training": _dry_run_training, "ablation_seeds": lambda given: (given or [0])[:1],
                      "ablation_context_length": 256, "n_contexts": 2, "decode_batch_size": 2}),
    Notebook("06_speedup_explorer", frozenset({
        "best_k_at_highlight", "multipliers_at_highlight", "one_pass", "schedule_at_highlight", "taus_used",
        "winner_at_highlight", "winner_changes_mixed_lengths", "winner_grid"}), numpy_only=True),
    Notebook("07_llama3_70b_extrapolation", frozenset({
        "critical_context_length", "headline_70b", "headline_70b_cell", "measured_taus_70b"}), numpy_only=True),
    Notebook("08_cost_analysis", frozenset({
        "break_even_serving", "mixed_length_margin", "paper_cost_check", "savings", "savings_70b",
        "savings_scheduled", "spire_max_training_units", "spire_training_units"}), numpy_only=True),
    Notebook("09_measured_vs_modeled", frozenset({
        "cells", "hoi", "machine", "profiled_model", "schedule_check", "target_trained_length"}),
             checks=_timing_checks,
             dry_run={"timing_batches": [1, 2], "timing_contexts": [64, 256], "held_out": [[2, 256]],
                      "repeats": 1, "max_repeats": 1, "cell_seconds": 0.0}),
)}


def undeclared(stem: str, key: str) -> str | None:
    """Why notebook `stem` may not record `key` (None: it may, or `stem` is no notebook of the series)."""
    nb = NOTEBOOKS.get(stem)
    if nb is None or key in nb.writes:
        return None
    return (f"{stem} records {key!r}, which its contract does not name: add it to its writes in "
            "spirelib/workbook/notebooks.py, so that results.json's readers can find it")
