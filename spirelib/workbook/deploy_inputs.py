"""What a schedule of `spire deploy` is made from (`Inputs`), read from a finished run and checked.

From `outputs/<run>/results.json` (notebook 04's tau with its CI and per-position acceptance) and
`run.json` (the series' shapes, notebook 06's context): per drafting method the model prices
(`PRICED`: every decoded draft whose card is priced) its acceptance and its acceptance profile
(`throughput.acceptance_profile`), where the run exported it the draft model an engine serves
(`exported_draft`: EAGLE-3's folder, notebook 03's `eagle3_export`), the series' scenario at the
served, trained or paper shapes (`series_scenarios`) on a device of the hardware table or one given
as peak FLOP/s and bandwidth (`resolve_hardware`), or this machine as notebook 09's profiled model
prices it (`profiled_inputs`); every option is checked before any is
used (`inputs`). Apart from the writing, so that what a schedule rests on reads in one place.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from spirelib.model.config import vanilla_draft_config
from spirelib.throughput import engines, profiled
from spirelib.throughput import perfmodel as pm
from spirelib.throughput.acceptance_profile import acceptance_profile
from spirelib.throughput.hardware import BYTES_PER_VALUE, Hardware, hardware_table
from spirelib.throughput.methods import DECODED, card
from spirelib.throughput.recorded import DeployError, profiled_record, recorded_acceptance, timed_machine
from spirelib.throughput.scenarios import Scenario
from spirelib.throughput.schedule import Acceptance, ProfiledPricing, Table, modeled_table, profiled_table, schedule
from spirelib.training.series import Series
from spirelib.workbook.results import read_json

SHAPES = ("served", "trained", "paper")  # served: the imported target's (trained), else the paper's
MODELS = ("paper", "profiled")
CONTEXTS = tuple(int(v) for v in 2 ** np.arange(5, 14))  # 32 .. 8K, notebook 06's grid
MIN_CONTEXT_RUN = 512  # tokens of a request's growth a k must last in the context form (default)
#: The methods a schedule is made for: every one notebook 04 measures and both models price (a one-pass
#: drafter is a stated tau of notebook 06, never measured).
PRICED = tuple(m for m in DECODED if card(m).priced)  # the decoded drafts a model prices (their cards)


@dataclasses.dataclass(frozen=True)
class Export:
    """Where a run records a draft model it exported for an engine (results.json: `notebook`'s `key`),
    the placeholder its serving lines carry without one, and how to export it."""

    notebook: str
    key: str
    placeholder: str
    how: str


#: The drafts an engine serves from a model the run exports (their cards name engines and need a model).
EXPORTS = {"eagle3": Export("03_train_drafts", "eagle3_export", "<EAGLE3_DRAFT_DIR>",
                            "export it with spirelib.training.eagle3_export.export_eagle3(draft, DIR, verifier=TARGET) "
                            "(notebook 03 does, and records DIR under 03_train_drafts.eagle3_export), then give DIR "
                            "for <EAGLE3_DRAFT_DIR> or rerun spire deploy")}
TARGET_PLACEHOLDER = "<TARGET_MODEL>"


@dataclasses.dataclass(frozen=True)
class DraftModel:
    """The draft model a served draft's lines load: its folder (`path`, absolute) or None (the lines
    carry `Export.placeholder`), the target its config.json names (None: unknown) and a sentence
    saying where the folder came from or how to export it."""

    path: str | None
    target: str | None
    note: str


def exported_draft(run_dir: Path, results: dict, method: str) -> DraftModel | None:
    """The folder a run exported `method`'s draft to (`EXPORTS`; None for a draft it does not
    export), read tolerantly: a path, or a mapping with one under "path", "folder" or "dir";
    absolute, or relative to the run's folder (else to the working directory). A folder without a
    config.json is treated as missing, so no line carries a broken path."""
    export = EXPORTS.get(method)
    if export is None:
        return None
    value = results.get(export.notebook, {}).get(export.key)
    if isinstance(value, dict):
        value = next((value[k] for k in ("path", "folder", "dir") if value.get(k)), None)
    where = f"results.json's {export.notebook}.{export.key}"
    if not value or not isinstance(value, str):
        return DraftModel(None, None, f"the run recorded no {export.key} ({where}): {export.how}")
    recorded = Path(value).expanduser()
    folder = next((f for f in (recorded if recorded.is_absolute() else run_dir / recorded, recorded)
                   if (f / "config.json").is_file()), None)
    if folder is None:
        return DraftModel(None, None, f"the run recorded {value} ({where}), which holds no config.json here: "
                                      f"{export.how}")
    try:
        verifier = json.loads((folder / "config.json").read_text()).get("speculators_config", {}).get("verifier", {})
    except (json.JSONDecodeError, AttributeError):
        verifier = {}
    target = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    return DraftModel(str(folder.resolve()), target if isinstance(target, str) and target else None,
                      f"exported to {folder.resolve()} ({where})")


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a schedule is made from: per method its acceptance, the scenario's shapes and cost
    settings (`throughput.scenarios.Scenario`, k ignored), the device, the context mix and the grid."""

    acceptance: dict[str, Acceptance]
    tau_context: int
    scenario: Scenario  # its taus unused
    device: str
    hardware: Hardware
    dtype: str
    context: int
    length_spread: float
    max_batch: int
    switching_cost: float
    contexts: tuple[int, ...]
    shapes: str
    run: str
    profiled: ProfiledModel | None = None  # the profiled model of this machine (notebook 09): `profiled_inputs`
    graph_bs: tuple[int, ...] = engines.CUDA_GRAPH_BS  # SGLang's captured CUDA-graph batch sizes
    min_context_run: int = MIN_CONTEXT_RUN  # tokens: see `schedule.min_context_run`
    min_batch_run: int = 1  # batch sizes the narrowest range spans: see `schedule.schedule`
    profiles: dict = dataclasses.field(default_factory=dict)  # per method its acceptance profile (JSON-ready)
    drafts: dict = dataclasses.field(default_factory=dict)  # per served method with an export: its `DraftModel`

    def schedule(self, table: Table):
        """The schedule of `table` with this deployment's switching cost and minimum run along B."""
        return schedule(table, max_batch=self.max_batch, switching_cost=self.switching_cost,
                        min_batch_run=self.min_batch_run)

    def mix(self, context: int | None = None):
        """The context argument of the model: L, or a `LengthDistribution` around it (06's mix)."""
        L = self.context if context is None else context
        return pm.LengthDistribution(L, self.length_spread, seed=0) if self.length_spread > 0 else L

    def table(self, method: str, context: int | None = None) -> Table:
        """`method`'s multipliers per k and B at `context` (default: the context mix)."""
        if self.profiled is not None:
            return profiled_table(self.profiled.pricing, self.profiled.drafts[method], self.acceptance[method],
                                  np.arange(1, self.max_batch + 1), self.context if context is None else context)
        s = self.scenario
        kwargs = {key: v for key, v in s.model_kwargs().items() if key != "k"}
        return modeled_table(method, self.acceptance[method], np.arange(1, self.max_batch + 1), self.mix(context),
                             s.target, s.drafts.get(method), **kwargs)


def resolve_hardware(name: str | None, dtype: str | None, peak_flops: float | None, bandwidth: float | None,
                     table: dict[str, Hardware] | None = None) -> tuple[Hardware, str]:
    """A device of the hardware table by `name`, or one given as `peak_flops` (for `dtype`) and
    `bandwidth`; the dtype defaults to the device's first of fp8, bf16, fp32."""
    table = hardware_table() if table is None else table
    if peak_flops is not None or bandwidth is not None:
        if name is not None or peak_flops is None or bandwidth is None:
            raise DeployError("give either --hardware NAME or both --peak-flops and --bandwidth (with --dtype)")
        dtype = dtype or "bf16"
        if dtype not in BYTES_PER_VALUE:
            raise DeployError(f"--dtype {dtype}: unknown; known: {', '.join(sorted(BYTES_PER_VALUE))}")
        try:
            return Hardware("custom", {dtype: float(peak_flops)}, float(bandwidth), "given on the command line"), dtype
        except ValueError as e:
            raise DeployError(str(e)) from e
    if name is None:
        raise DeployError(f"--hardware: name a device ({', '.join(table)}) or give --peak-flops and --bandwidth")
    if name not in table:
        raise DeployError(f"--hardware {name}: unknown device; known: {', '.join(table)} (or give --peak-flops "
                          "and --bandwidth for the serving dtype)")
    device = table[name]
    dtype = dtype or next(d for d in ("fp8", "bf16", "fp32", *device.peak_flops) if d in device.peak_flops)
    if dtype not in device.peak_flops:
        raise DeployError(f"--dtype {dtype}: {name} has no {dtype} peak; it has {', '.join(device.peak_flops)}")
    return device, dtype


def series_scenarios(series, taus: dict, hoi: float, source: str) -> dict[str, Scenario]:
    """The two scales a series is compared at (method §2): the paper's shapes and the series' trained
    shapes (its target, vanilla draft and SPIRe's pruned layers and window), with `taus` at the
    series' k and `hoi`; `source` names where the taus come from in each label."""

    spire = series.spire
    return {
        "paper shapes": dataclasses.replace(Scenario.paper(), k=series.k, hoi=hoi).with_taus(
            taus, f"paper shapes, {source}"),
        "trained shapes": Scenario.trained(series.target, vanilla_draft_config(series.target), spire.num_layers,
                                           spire.window, taus, k=series.k, hoi=hoi,
                                           label=f"trained shapes (window {spire.window}), {source}"),
    }


def _scenario(run: dict, shapes: str, hardware: Hardware, dtype: str):
    """The scenario of the run's series (`series_scenarios`) at `shapes` on the device,
    and the shapes it is: "served" is the imported target's (its trained shapes) when the series
    imports one, else the paper's (a series trained from scratch is a CPU-sized stand-in)."""
    series = Series.from_dict(run.get("params", {}).get("series", {}))
    if shapes == "served":
        shapes = "trained" if series.imported else "paper"
    scenarios = series_scenarios(series, {}, hardware.hoi(dtype), "")
    return scenarios[f"{shapes} shapes"].with_hardware(hardware, dtype), shapes


@dataclasses.dataclass(frozen=True)
class ProfiledModel:
    """Notebook 09's profiled model as `--model profiled` schedules with it: how it prices
    (`schedule.ProfiledPricing`: its cost, the series' target in the machine's dtype, G, its median
    |error| against the clock), each draft's `profiled.DraftShape` (09's own,
    `wallclock.profiled_draft_shapes`) and its largest error on the cells its fit never saw (None:
    none was held out)."""

    pricing: ProfiledPricing
    drafts: dict[str, profiled.DraftShape]
    held_out_max_error: float | None = None


def profiled_inputs(results: dict, run: dict) -> tuple[ProfiledModel, Hardware, str]:
    """This machine's profiled cost model as notebook 09 fitted and recorded it, with what it
    prices (`ProfiledModel`); and the calibrated machine as a Hardware entry with its dtype."""
    model, machine = profiled_record(results), timed_machine(results)
    if model is None or model.median_error is None or machine.peak_flops is None:
        raise DeployError("--model profiled needs notebook 09's profiled model in the run (spire run --only 09)")
    series = Series.from_dict(run.get("params", {}).get("series", {}))
    target, drafts = series.target, series.draft_shapes()
    value_bytes = int(machine.bytes_per_value)
    dtype = next(d for d, b in BYTES_PER_VALUE.items() if b == value_bytes)
    device = Hardware("this-machine", {dtype: float(machine.peak_flops)}, float(machine.bandwidth),
                      f"notebook 09's calibration ({machine.device or '?'})")
    pricing = ProfiledPricing(model.cost, profiled.PricedTarget(target.shape(), target.vocab_size, value_bytes),
                              series.new_tokens, float(model.median_error))
    return ProfiledModel(pricing, drafts, model.held_out_max_error), device, dtype


# parameters: spire deploy's options, one keyword per flag (docs/deploy.md), checked together first
def inputs(run_dir: Path, *, hardware: str | None = None, dtype: str | None = None, peak_flops: float | None = None,
           bandwidth: float | None = None, context: int | None = None, length_spread: float | None = None,
           max_batch: int = 256, switching_cost: float = 0.0, contexts=CONTEXTS, shapes: str = "served",
           methods=None, model: str = "paper", graph_bs=engines.CUDA_GRAPH_BS,
           min_context_run_tokens: int = MIN_CONTEXT_RUN, min_batch_run: int = 1) -> Inputs:
    """Everything a schedule of the run in `run_dir` needs, every option checked first (DeployError)."""
    problems = []
    if not (run_dir / "results.json").is_file():
        raise DeployError(f"{run_dir}: no results.json; deploy reads a finished run (spire run --params ...)")
    if shapes not in SHAPES:
        problems.append(f"--shapes {shapes}: choose {' or '.join(SHAPES)}")
    if not (isinstance(max_batch, int) and max_batch >= 1):
        problems.append(f"--max-batch {max_batch}: must be a positive integer")
    if not (0.0 <= switching_cost < 1.0):
        problems.append(f"--switching-cost {switching_cost}: a fraction of the speedup in [0, 1), e.g. 0.14")
    if length_spread is not None and length_spread < 0:
        problems.append(f"--length-spread {length_spread}: must be >= 0 (0: every request at L)")
    if not contexts or any(c < 1 for c in contexts) or list(contexts) != sorted(set(contexts)):
        problems.append(f"--contexts {contexts}: increasing positive lengths")
    if not (isinstance(min_batch_run, int) and min_batch_run >= 1):
        problems.append(f"--min-batch-run {min_batch_run}: batch sizes the narrowest range spans, >= 1 (1: none)")
    if not (isinstance(min_context_run_tokens, int) and min_context_run_tokens >= 0):
        problems.append(f"--min-context-run {min_context_run_tokens}: tokens a k must last, >= 0 (0: no minimum)")
    if not graph_bs or any(b < 1 for b in graph_bs):
        problems.append(f"--cuda-graph-bs {graph_bs}: your SGLang server's captured batch sizes, e.g. 1,2,4,8,16")
    if model not in MODELS:
        problems.append(f"--model {model}: choose {' or '.join(MODELS)}")
    elif model == "profiled":
        if hardware is not None or peak_flops is not None or bandwidth is not None or dtype is not None:
            problems.append("--model profiled prices the machine notebook 09 measured: drop --hardware, --dtype, "
                            "--peak-flops and --bandwidth")
    else:
        try:
            device, dtype = resolve_hardware(hardware, dtype, peak_flops, bandwidth)
        except DeployError as e:
            problems.append(str(e))
    if problems:
        raise DeployError("; ".join(problems))
    results, run = read_json(run_dir / "results.json"), read_json(run_dir / "run.json")
    fitted = None
    if model == "profiled":
        fitted, device, dtype = profiled_inputs(results, run)
    explorer = run.get("notebooks", {}).get("06_speedup_explorer", {}).get("parameters", {})
    context = int(context if context is not None else explorer.get("context_length", 512))
    spread = float(length_spread if length_spread is not None else 0.0)
    acceptance, tau_context = recorded_acceptance(results, context)
    if methods:
        unknown = [m for m in methods if m not in acceptance]
        if unknown:
            raise DeployError(f"--draft {', '.join(unknown)}: no such draft in this run; it measured "
                              f"{', '.join(acceptance)} at L = {tau_context}")
        acceptance = {m: acceptance[m] for m in methods}
    unmodeled = [m for m in acceptance if m not in PRICED]
    acceptance = {m: a for m, a in acceptance.items() if m in PRICED}
    if not acceptance:
        raise DeployError(f"the run measured only {', '.join(unmodeled)}, which the throughput model does not price")
    if fitted is not None and spread > 0:
        raise DeployError("--model profiled prices batches of one context length: drop --length-spread")
    scenario, shapes = _scenario(run, shapes, device, dtype)
    if fitted is not None:
        shapes = "trained"  # the profiled model prices the series' own target and drafts on this machine
    profiles = {m: acceptance_profile(results, m, context, run_dir.name) for m in acceptance}
    drafts = {m: d for m in acceptance if (d := exported_draft(run_dir, results, m)) is not None}
    return Inputs(acceptance, tau_context, scenario, device.name, device, dtype, context,
                  spread, max_batch, switching_cost, tuple(contexts), shapes, run_dir.name, fitted,
                  tuple(sorted(graph_bs)), min_context_run_tokens, min_batch_run, profiles, drafts)
