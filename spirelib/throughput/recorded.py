"""What a finished run recorded, read back typed (docs/deploy.md), and the acceptance deployment
schedules read from it: notebook 04's tau, its 95% CI and per-position acceptance per method at the
recorded context nearest the one asked for (`recorded_acceptance`; the means alone, as the
notebooks' comparisons read them: `recorded_taus`); where the run recorded none, the taus a notebook
was given (06, `acceptance_or_taus`) or the mean tau of its own timed cells (09,
`acceptance_or_cells`). `DeployError` says what a run or an option lacks. `spire deploy` and the
notebooks' tables both read these, so they sit below both.

What a notebook records has one shape, written by the notebook (`to_dict`) and read back typed,
not by string keys: 04's "tau" and "tau_protocol" (`RecordedTau`, `RecordedProtocol`: `tau_records`,
`tau_protocol`), 09's "cells", "profiled_model" and "machine" (`RecordedCell`, `RecordedProfile`,
`RecordedMachine`: `timed_cells`, `profiled_record`, `timed_machine`; its target's trained length:
`timed_trained_length`), 01's and 07's headline (`RecordedHeadline`: `modeled_headline`), 02's
target (`RecordedTarget`: `trained_target`), 03's budgets (`RecordedBudget`: `trained_budgets`),
06's answers (`RecordedExplorer`: `explored`) and 08's check of the paper's costs
(`RecordedCostCheck`: `paper_cost_checks`); what one notebook reads of another's, 03's training cost
(`RecordedTrainingCost`: `measured_training_cost`, read by 08) and 01's best k (`paper_best_k`, read by
06), too. 05's ablations, the most nested record, have their own module (`recorded_ablations`) on the
same base (`Recorded`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from spirelib.throughput.profiled import ProfiledCost
from spirelib.throughput.schedule import Acceptance


class Recorded:
    """A shape a notebook records in results.json: written as a dict (`to_dict`), read back typed
    (`from_dict`: a field an older run did not record at its default)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, recorded: dict):
        return cls(**{f.name: recorded[f.name] for f in fields(cls) if f.name in recorded})


@dataclass(frozen=True)
class RecordedTau(Recorded):
    """One method at one context length as notebook 04 records it under "tau" in results.json: the
    mean tau, its reported 95% half-width, the contexts drawn and their per-context spread (the
    fields a run from before they were recorded lacks are None)."""

    mean: float
    ci95: float | None = None
    n_contexts: int | None = None
    std: float | None = None


def tau_records(results: dict) -> dict[str, dict[int, RecordedTau]]:
    """Notebook 04's "tau" in a run's results, typed: method -> context length -> `RecordedTau`;
    empty where the run recorded none (a notebook run on its own)."""
    taus = results.get("04_measure_tau", {}).get("tau") or {}
    return {m: {int(L): RecordedTau.from_dict(v) for L, v in by_l.items()} for m, by_l in taus.items()}


@dataclass(frozen=True)
class RecordedProtocol(Recorded):
    """How notebook 04 measured its taus, as it records it under "tau_protocol" in results.json: the
    decoding (k, G, T), the contexts (lengths, the most drawn per length, the batch, the seed, the
    stopping rule), MagicDec's options and every sparse draft's KV budget, the windows the target
    was trained on, the models measured (shapes and training tokens), its seconds and its scale
    note. A field a run from before it was recorded lacks reads as None (k: the paper's 4)."""

    k: int = 4
    new_tokens: int | None = None
    temperature: float | None = None
    context_lengths: list[int] | None = None
    n_contexts: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    stopping: dict | None = None  # {"half_width", "floor"} of 04's stopping rule; None: every context
    magicdec: dict | None = None
    kv_budgets: dict | None = None  # method -> its KVBudget's fields
    trained_on: int | None = None
    target: dict | None = None  # the target's ModelConfig fields
    target_tokens: int | None = None
    vanilla_draft: dict | None = None
    vanilla_tokens: int | None = None
    spire_draft: dict | None = None
    spire_tokens: int | None = None
    seconds: float | None = None
    scale: str = ""


def tau_protocol(results: dict) -> RecordedProtocol:
    """Notebook 04's "tau_protocol" in a run's results, typed; every field at its default where the
    run recorded none (a notebook run on its own)."""
    recorded = results.get("04_measure_tau", {}).get("tau_protocol") or {}
    return RecordedProtocol.from_dict(recorded)


@dataclass(frozen=True)
class RecordedMachine(Recorded):
    """The machine notebook 09 timed on, as it records it under "machine": its calibrated peak
    (FLOP/s, in `precision`) and bandwidth (bytes/s), the device, the bytes a value took, the AD
    step's measured over its modeled time, the scale note and the threads. A field a run did not
    record reads as None (the scale: empty)."""

    peak_flops: float | None = None
    precision: str | None = None
    bandwidth: float | None = None
    device: str | None = None
    bytes_per_value: int | None = None
    ad_step_overhead: float | None = None
    scale: str = ""
    threads: int | None = None

    @property
    def hoi(self) -> float | None:
        """Its hardware operational intensity, peak FLOP/s over bandwidth (method §2; None: not recorded)."""
        return None if self.peak_flops is None or self.bandwidth is None else self.peak_flops / self.bandwidth


@dataclass(frozen=True, kw_only=True)
class RecordedCell(Recorded):
    """One timed draft at one (B, L) of notebook 09, as it records it under "cells": its mean tau, its
    measured speedup over AD with the 95% CI and the runs, the paper's model's speedup and its error
    modeled / measured - 1 (method §2), the profiled model's and its error, whether the profiled fit
    never saw the cell (`held_out`) and whether its contexts and tokens ran past the target's training
    windows. A prediction not made (yet), or a field a run from before it was recorded lacks, is None."""

    method: str
    B: int
    L: int
    measured_speedup: float
    modeled_speedup: float | None = None
    profiled_speedup: float | None = None
    tau: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    runs: int | None = None
    error: float | None = None
    profiled_error: float | None = None
    held_out: bool = False
    past_training: bool = False

    @property
    def half_width(self) -> float:
        """The measured speedup's 95% CI half width relative to it."""
        return (self.ci_high - self.ci_low) / 2 / self.measured_speedup


def timed_cells(results: dict) -> list[RecordedCell]:
    """Notebook 09's "cells" in a run's results, typed; empty where the run recorded none (09 did not run)."""
    return [RecordedCell.from_dict(c) for c in results.get("09_measured_vs_modeled", {}).get("cells") or ()]


@dataclass(frozen=True)
class RecordedProfile:
    """Notebook 09's profiled model as it records it under "profiled_model", one flat dict: the fitted
    `ProfiledCost` and its record against the clock (`wallclock.profiled_verdict`): its median |error|,
    mean signed error, the fitted cells' median and the held-out cells' worst |error| (None: none
    held out), how many cells it called a gain that measured a loss, the widest measured CI relative
    to its speedup, and the cells where SD was slower than AD. A field a run did not record is None."""

    cost: ProfiledCost
    median_error: float | None = None
    mean_signed_error: float | None = None
    fitted_median_error: float | None = None
    held_out_max_error: float | None = None
    false_gains: int | None = None
    widest_ci: float | None = None
    cells_slower_than_ad: int | None = None

    def to_dict(self) -> dict:
        return {**self.cost.to_dict(), **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "cost"}}


def profiled_record(results: dict) -> RecordedProfile | None:
    """Notebook 09's "profiled_model" in a run's results, typed; None where the run recorded none."""
    recorded = results.get("09_measured_vs_modeled", {}).get("profiled_model")
    if not recorded:
        return None
    verdict = {f.name: recorded[f.name] for f in fields(RecordedProfile) if f.name != "cost" and f.name in recorded}
    return RecordedProfile(ProfiledCost.from_dict(recorded), **verdict)


def timed_trained_length(results: dict) -> int | None:
    """The window length the target 09 timed was trained on, as 09 records it ("target_trained_length");
    None for an imported target, or where 09 did not run."""
    return results.get("09_measured_vs_modeled", {}).get("target_trained_length")


def timed_machine(results: dict) -> RecordedMachine:
    """Notebook 09's "machine" in a run's results, typed; every field at its default where the run
    recorded none (09 did not run)."""
    recorded = results.get("09_measured_vs_modeled", {}).get("machine") or {}
    return RecordedMachine.from_dict(recorded)


def tau_lengths(taus: dict[str, dict[int, RecordedTau]]) -> list[int]:
    """The context lengths `taus` (`tau_records`) holds a tau at, shortest first."""
    return sorted({L for by_l in taus.values() for L in by_l})


class DeployError(ValueError):
    """A run or an option `spire deploy` cannot make a schedule from; the message says what to do."""


def nearest_record(results: dict, context: int) -> tuple[dict[str, dict[int, RecordedTau]], int] | None:
    """Notebook 04's tau in a run's results (`tau_records`) and its measured context nearest
    `context` (the shorter on a tie); None when the run recorded no tau (a notebook run on its own)."""
    taus = tau_records(results)
    if not taus:
        return None
    return taus, min(tau_lengths(taus), key=lambda length: (abs(length - context), length))


def recorded_taus(results: dict, context: int) -> tuple[dict[str, float], dict[str, list], int] | None:
    """Notebook 04's mean tau and per-position acceptance per method at the recorded context
    nearest `context`, and that context, as the notebooks' comparisons read them
    (`scenarios.taus_used`); None when the run recorded no tau."""
    found = nearest_record(results, context)
    if found is None:
        return None
    taus, L = found
    per_position = results["04_measure_tau"].get("per_position_acceptance", {})
    return ({m: by_l[L].mean for m, by_l in taus.items() if L in by_l},
            {m: by_l[str(L)]["p"] for m, by_l in per_position.items() if str(L) in by_l}, L)


def recorded_acceptance(results: dict, context: int) -> tuple[dict[str, Acceptance], int]:
    """Notebook 04's tau (mean, 95% CI) and per-position acceptance per method at the recorded
    context nearest `context`, and that context."""
    found = nearest_record(results, context)
    if found is None:
        raise DeployError("the run recorded no tau (notebook 04): run the series, or `spire run --only 04` "
                          "after the drafts are trained, then deploy")
    taus, L = found
    depth = tau_protocol(results).k
    per_position = results["04_measure_tau"].get("per_position_acceptance", {})
    out = {}
    for method, by_l in taus.items():
        if L not in by_l:
            continue
        p = per_position.get(method, {}).get(str(L), {}).get("p") or ()
        out[method] = Acceptance(float(by_l[L].mean), float(by_l[L].ci95), depth,
                                 tuple(float(v) for v in p) if len(p) == depth else ())
    return out, L


def acceptance_or_taus(run: dict, taus: dict, k: int, context: int) -> dict[str, Acceptance]:
    """The acceptance a deployment schedule reads: notebook 04's tau with its CI and per-position
    curve at the recorded context nearest `context` when the run has them
    (`recorded_acceptance`), else `taus` (the paper's) at depth k with no interval."""
    try:
        recorded, _ = recorded_acceptance(run, context)
    except DeployError:
        return {m: Acceptance(float(t), 0.0, k) for m, t in taus.items()}
    return {m: a for m, a in recorded.items() if m in taus}


def acceptance_or_cells(run: dict, cells: list[RecordedCell], k: int) -> dict[int, dict]:
    """Per measured L, per timed method the acceptance its schedule reads: notebook 04's tau, CI
    and per-position curve when the run recorded them at that L (`recorded_acceptance`),
    else the cells' own mean tau at depth k (i.i.d., no interval)."""
    out = {}
    for L in sorted({c.L for c in cells}):
        methods = {c.method: float(c.tau) for c in cells if c.L == L}
        try:
            recorded, at = recorded_acceptance(run, L)
        except DeployError:
            recorded, at = {}, None
        out[L] = ({m: recorded[m] for m in methods} if at == L and set(methods) <= set(recorded) else
                  {m: Acceptance(min(tau, k + 1.0), 0.0, k) for m, tau in methods.items()})
    return out


@dataclass(frozen=True)
class RecordedHeadline:
    """The paper's throughput model at one (B, L) as a notebook records it: 01 under "headline" and
    "headline_cell" (the paper's shapes and tau), 07 under "headline_70b" and "headline_70b_cell"
    (Llama 3 70B): method -> multiplier over AD, the cell, its HOI, whether drafting overlaps
    verification, and the context length of the paper's tau (01's; None where not recorded)."""

    multipliers: dict[str, float]
    B: int | None = None
    L: int | None = None
    hoi: float | None = None
    overlap: bool | None = None
    tau_context: int | None = None


#: The keys of each notebook's `RecordedHeadline`: (its multipliers, its cell).
HEADLINES = {"01_performance_model": ("headline", "headline_cell"),
             "07_llama3_70b_extrapolation": ("headline_70b", "headline_70b_cell")}


def modeled_headline(results: dict, stem: str) -> RecordedHeadline | None:
    """Notebook `stem`'s headline (`HEADLINES`: 01's or 07's) in a run's results, typed; None where it
    recorded none."""
    multipliers_key, cell_key = HEADLINES[stem]
    recorded = results.get(stem, {})
    if not recorded.get(multipliers_key):
        return None
    cell = recorded.get(cell_key) or {}
    return RecordedHeadline(dict(recorded[multipliers_key]),
                            **{f.name: cell[f.name] for f in fields(RecordedHeadline) if f.name in cell})


@dataclass(frozen=True)
class RecordedCostCheck(Recorded):
    """One of the paper's serving-savings numbers as notebook 08 checks it (under "paper_cost_check",
    per quantity): the paper's figure, ours from the multipliers rounded to two decimals first (the
    paper's arithmetic) and from the full multipliers."""

    paper: float
    from_rounded_tm: float
    from_full_tm: float


def paper_cost_checks(results: dict) -> dict[str, RecordedCostCheck]:
    """Notebook 08's "paper_cost_check" in a run's results, typed: quantity -> `RecordedCostCheck`; empty
    where 08 recorded none."""
    checks = results.get("08_cost_analysis", {}).get("paper_cost_check") or {}
    return {quantity: RecordedCostCheck.from_dict(c) for quantity, c in checks.items()}


@dataclass(frozen=True)
class RecordedTarget(Recorded):
    """The target notebook 02 trained (or imported), as it records it under "target": its parameters
    (all, the body's, the embedding's), validation loss, training tokens and steps, throughput and
    MFU (the session's and the run's), the peak they are taken against, the device, its config hash,
    whether a finished run was reused and the folder it was imported from. A field a run did not
    record reads as None."""

    params: int | None = None
    body_params: int | None = None
    val_loss: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    run_mfu: float | None = None
    run_tokens_per_s: float | None = None
    peak_flops: float | None = None
    tokens: int | None = None
    steps: int | None = None
    device: str | None = None
    config_hash: str | None = None
    reused: bool | None = None
    imported_from: str | None = None
    embedding_params: int | None = None


def trained_target(results: dict) -> RecordedTarget:
    """Notebook 02's "target" in a run's results, typed; every field None where 02 did not run."""
    return RecordedTarget.from_dict(results.get("02_train_target", {}).get("target") or {})


@dataclass(frozen=True)
class RecordedGrid:
    """A winner map as a notebook records it: the method that wins each (B, L) cell, "ad" where none
    gains, by B (rows) then L."""

    B: list[int]
    L: list[int]
    winners: list[list[str]]


@dataclass(frozen=True)
class RecordedExplorer:
    """Notebook 06's answers as it records them: the taus it modeled with ("taus_used": this run's,
    measured at `tau_context`, or the paper's, as `source` says), and per scenario ("paper shapes",
    "trained shapes") the multipliers at the highlighted (B, L) ("multipliers_at_highlight") and its
    winner map ("winner_grid"). Empty where 06 did not run."""

    source: str | None = None
    tau_context: int | None = None
    taus: dict[str, float] = field(default_factory=dict)
    B: int | None = None
    L: int | None = None
    at: dict[str, dict[str, float]] = field(default_factory=dict)  # scenario -> method -> multiplier at (B, L)
    grids: dict[str, RecordedGrid] = field(default_factory=dict)  # scenario -> its winner map

    @property
    def measured(self) -> bool:
        """Whether 06 modeled with this run's tau (04's), not the paper's."""
        return self.source == "measured"


def explored(results: dict) -> RecordedExplorer:
    """Notebook 06's answers in a run's results, typed (`RecordedExplorer`)."""
    recorded = results.get("06_speedup_explorer", {})
    used, at = recorded.get("taus_used") or {}, dict(recorded.get("multipliers_at_highlight") or {})
    cell = {k: at.pop(k) for k in ("B", "L") if k in at}
    return RecordedExplorer(used.get("source"), used.get("context_length"), dict(used.get("taus") or {}), **cell,
                            at=at, grids={name: RecordedGrid(g["B"], g["L"], g["winners"])
                                          for name, g in (recorded.get("winner_grid") or {}).items()})


@dataclass(frozen=True)
class RecordedBudget(Recorded):
    """A trained draft's training budget as notebook 03 records it (under "draft_budgets", per draft):
    its training tokens, its body parameters N, the paper's budget 20 x N (method §6), the share of it
    the draft got, and what training on the paper's budget would take, per machine (seconds; this
    machine's at its measured speed, each GPU's as the plan models it)."""

    tokens: int
    body_params: int
    paper_tokens: int
    fraction: float
    paper_seconds: dict[str, float] | None = None


def trained_budgets(results: dict) -> dict[str, RecordedBudget]:
    """Notebook 03's "draft_budgets" in a run's results, typed: draft -> `RecordedBudget`; empty where 03
    recorded none."""
    budgets = results.get("03_train_drafts", {}).get("draft_budgets") or {}
    return {name: RecordedBudget.from_dict(b) for name, b in budgets.items()}


@dataclass(frozen=True)
class RecordedTrainingCost(Recorded):
    """SPIRe's measured training cost as notebook 03 records it (under "training_cost"; 08 prices with
    it): the target's and the SPIRe draft's training tokens/s, the draft's cost per token in
    target-training units (method §2) and its body parameters over the target's."""

    target_tokens_per_s: float
    spire_tokens_per_s: float
    spire_units_per_token: float
    body_ratio: float


def measured_training_cost(results: dict) -> RecordedTrainingCost | None:
    """Notebook 03's "training_cost" in a run's results, typed; None where it recorded none (an imported
    target, never trained here, or 03 did not run)."""
    cost = results.get("03_train_drafts", {}).get("training_cost")
    return RecordedTrainingCost.from_dict(cost) if cost else None


def paper_best_k(results: dict) -> int | None:
    """The best draft depth k notebook 01 finds for SPIRe at (64, 512) with the paper's tau ("best_k_spire_b64_l512");
    None where 01 did not run."""
    return results.get("01_performance_model", {}).get("best_k_spire_b64_l512")
