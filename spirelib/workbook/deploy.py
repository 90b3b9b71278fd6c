"""`spire deploy`: a finished run's answer in the forms serving engines take (docs/deploy.md).

From `outputs/<run>/results.json` (notebook 04's tau with its CI and per-position acceptance) and
`run.json` (the series' shapes, notebook 06's context), for every drafting method the run measured
that the model prices (`PRICED`: the paper's three, the verification-guided draft and prompt lookup): a
batch-size -> k schedule (`modeling.schedule`) on a device of the hardware table, or one given as
peak FLOP/s and bandwidth, at the params file's context mix (a fixed L, or 06's mixed-length
batches), and one per context of a grid. Written as our YAML (the intervals, the merges, the
inputs and, per engine, its release, its batch size, what it does past the last entry and what it
could not express) and in each engine's form (`modeling.engines`: the keys of a named release,
and vLLM's context form of an open PR in its own file). `--explain` reads an engine file back the
way that engine would, B by B, beside the workbook's schedule.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import yaml

from spirelib.modeling import engines, profiled
from spirelib.modeling import perfmodel as pm
from spirelib.modeling.hardware import BYTES_PER_VALUE, Hardware, hardware_table
from spirelib.modeling.methods import label
from spirelib.modeling.recorded import DeployError, recorded_acceptance
from spirelib.modeling.scenarios import Scenario
from spirelib.modeling.schedule import (
    Acceptance,
    Table,
    context_switches,
    expressed_cost,
    min_context_run,
    modeled_table,
    profiled_table,
    schedule,
)
from spirelib.paths import project_root
from spirelib.workbook.results import read_json

SHAPES = ("served", "trained", "paper")  # served: the imported target's (trained), else the paper's
MODELS = ("paper", "profiled")
CONTEXTS = tuple(int(v) for v in 2 ** np.arange(5, 14))  # 32 .. 8K, notebook 06's grid
MIN_CONTEXT_RUN = 512  # tokens of a request's growth a k must last in the context form (default)
SWITCH_SPAN = (64, 8192)  # the growth of one request whose switches of k schedule.yaml counts
#: The methods a schedule is made for: every one notebook 04 measures and both models price (a one-pass
#: drafter is a stated tau of notebook 06, never measured).
PRICED = (*pm.MODELED_METHODS, "guided", "lookup")


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a schedule is made from: per method its acceptance, the scenario's shapes and cost
    settings (`modeling.scenarios.Scenario`, k ignored), the device, the context mix and the grid."""

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
    profiled: dict | None = None  # the profiled model of this machine (notebook 09): see `profiled_inputs`
    graph_bs: tuple[int, ...] = engines.CUDA_GRAPH_BS  # SGLang's captured CUDA-graph batch sizes
    min_context_run: int = MIN_CONTEXT_RUN  # tokens: see `schedule.min_context_run`
    min_batch_run: int = 1  # batch sizes the narrowest range spans: see `schedule.schedule`

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
            p = self.profiled
            return profiled_table(p["cost"], p["drafts"][method], self.acceptance[method], np.arange(1, self.max_batch + 1),
                                  self.context if context is None else context, p["target"], p["vocab_size"],
                                  p["new_tokens"], bytes_per_value=p["bytes_per_value"], error=p["error"])
        s = self.scenario
        kwargs = {key: v for key, v in s.model_kwargs().items() if key != "k"}
        return modeled_table(method, self.acceptance[method], np.arange(1, self.max_batch + 1), self.mix(context),
                             s.target, s.drafts.get(method), **kwargs)


# ---------------------------------------------------------------------------- reading a run

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
    from spirelib.decoding.drafts import vanilla_draft_config  # torch: only when a series' scenarios are made

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
    from spirelib.training.series import Series  # torch: only when a schedule is made

    series = Series.from_dict(run.get("params", {}).get("series", {}))
    if shapes == "served":
        shapes = "trained" if series.imported else "paper"
    scenarios = series_scenarios(series, {}, hardware.hoi(dtype), "")
    return scenarios[f"{shapes} shapes"].with_hardware(hardware, dtype), shapes


def profiled_inputs(results: dict, run: dict) -> tuple[dict, Hardware, str]:
    """This machine's profiled cost model as notebook 09 fitted and recorded it, with what it
    prices: the series' target, each draft's `profiled.DraftShape` (09's own,
    `wallclock.profiled_draft_shapes`), the vocabulary, G, the bytes per value and the model's
    median |error| against the clock; and the calibrated machine as a Hardware entry with its dtype."""
    from spirelib.decoding.drafts import vanilla_draft_config  # torch: only when a schedule is made
    from spirelib.measure.wallclock import profiled_draft_shapes
    from spirelib.model.kvcache import SinkWindow
    from spirelib.training.series import Series

    recorded = results.get("09_measured_vs_modeled", {})
    model, machine = recorded.get("profiled_model"), recorded.get("machine")
    if not model or not machine:
        raise DeployError("--model profiled needs notebook 09's profiled model in the run (spire run --only 09)")
    fields = {f.name for f in dataclasses.fields(profiled.ProfiledCost)} - {"drafts", "paces"}
    cost = profiled.ProfiledCost(**{k: float(v) for k, v in model.items() if k in fields},
                                 drafts={m: profiled.DraftOverhead(**d) for m, d in model.get("drafts", {}).items()})
    series = Series.from_dict(run.get("params", {}).get("series", {}))
    target, spire = series.target, series.spire
    drafts = profiled_draft_shapes(vanilla_draft_config(target),
                                   dataclasses.replace(target, num_layers=spire.num_layers), spire,
                                   SinkWindow(series.magicdec.sink, series.magicdec.window), series.guided_options())
    value_bytes = int(machine["bytes_per_value"])
    dtype = next(d for d, b in BYTES_PER_VALUE.items() if b == value_bytes)
    device = Hardware("this-machine", {dtype: float(machine["peak_flops"])}, float(machine["bandwidth"]),
                      f"notebook 09's calibration ({machine.get('device', '?')})")
    return ({"cost": cost, "drafts": drafts, "target": target.shape(), "vocab_size": target.vocab_size,
             "new_tokens": series.new_tokens, "bytes_per_value": value_bytes, "error": float(model["median_error"]),
             "held_out_max_error": model.get("held_out_max_error")}, device, dtype)


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
    return Inputs(acceptance, tau_context, scenario, device.name, device, dtype, context,
                  spread, max_batch, switching_cost, tuple(contexts), shapes, run_dir.name, fitted,
                  tuple(sorted(graph_bs)), min_context_run_tokens, min_batch_run)


# ---------------------------------------------------------------------------- writing

def ngram_lengths() -> tuple[int, int]:
    """The n-gram lengths (shortest, longest) the workbook's prompt lookup tries, which its engine
    keys carry (`engines.ngram_keys`)."""
    from spirelib.decoding.lookup import MAX_N, MIN_N  # torch: only when a schedule is made

    return MIN_N, MAX_N


def method_schedules(inp: Inputs, method: str) -> dict:
    """One method's schedule at the context mix, its per-context schedules, each engine's form
    (`modeling.engines`), the schedule that form holds and what it costs; our YAML document."""
    table = inp.table(method)
    main = inp.schedule(table)
    tables = {L: inp.table(method, L) for L in inp.contexts}
    by_context = {L: inp.schedule(t) for L, t in tables.items()}
    collapsed = {str(L): round(expressed_cost(tables[L], main, by_context[L]), 4) for L in inp.contexts}
    long_runs = min_context_run(tables, by_context, inp.min_context_run, inp.max_batch)
    switches = {"from_to": list(SWITCH_SPAN), "min_context_run": inp.min_context_run,
                "largest_loss": round(max(expressed_cost(tables[L], long_runs[L], by_context[L]) for L in inp.contexts), 4),
                "per_batch": {str(b): {"before": context_switches(by_context, b, *SWITCH_SPAN),
                                       "after": context_switches(long_runs, b, *SWITCH_SPAN)}
                              for b in sorted({1, 8, 64, inp.max_batch}) if b <= inp.max_batch}}
    capped = bool(inp.acceptance[method].per_position) and any(r.k == int(table.ks[-1]) for r in main.ranges)
    ngram = ngram_lengths() if method == "lookup" else None
    trt, trt_expressed = engines.trtllm_config(main, table, ngram)
    algorithm = engines.SGLANG_ALGORITHM.get(method)
    sglang, sglang_args, sglang_expressed = engines.sglang_config(main, table, algorithm)
    configs = {"vllm": engines.vllm_config(main, ngram),
               "vllm_pr48944": engines.vllm_context_config(long_runs, ngram), "trtllm": trt, "sglang": sglang}
    expressed = {"vllm": main, "trtllm": trt_expressed, "sglang": sglang_expressed}
    notes = {
        "vllm": "batch only: the schedule at the context mix (per context L its largest loss: collapsed_cost)"
                + ("" if configs["vllm"] is None or "num_speculative_tokens_per_batch_size" in configs["vllm"] else
                   "; one k: the static key only, dynamic speculation stays off")
                + ("" if ngram is None or configs["vllm"] is None or "num_speculative_tokens_per_batch_size" not in
                   configs["vllm"] else "; method ngram: the release takes the per-batch-size key with any method, "
                   "its docs tested it with EAGLE, EAGLE-3 and DFlash only, and the n-gram proposer keeping its "
                   "startup k was raised in PR #32374's review: check your release's k per batch size in its "
                   "metrics"),
        "vllm_pr48944": "per (batch, context) bucket, a context bucket at the k of its upper end, no k lasting "
                        f"fewer than {inp.min_context_run} tokens of a request's growth (context_switches); loads "
                        "only on a vLLM built from the open PR #48944",
        "trtllm": ("NGramDecodingConfig at one static k: the algorithms dynamic draft length reaches "
                   "(TensorRT-LLM PR #12262) do not name NGram" if ngram is not None else "batch only, as vllm")
                  if trt else "off at B = 1: TensorRT-LLM's max_draft_len must be > 0; not written",
        "sglang": "batch only, as vllm; speculative_num_steps is the deepest k, never 0 (a slot may hold 0)" + (
            f"; {algorithm} ignores the adaptive config: served static" if algorithm not in
            (None, *engines.ADAPTIVE_ALGORITHMS) else "") + (
            "; one k: static server arguments only, no adaptive file" if sglang is None and sglang_args
            and algorithm in (None, *engines.ADAPTIVE_ALGORITHMS) else "") + (
            "; NGRAM drafts from its own cache of recent n-grams at its default match lengths (their keys changed in "
            "SGLang PR #21225); one BFS branch makes its drafts a chain, as measured" if algorithm == "NGRAM" else ""),
    }
    if ngram is not None and configs["vllm"] is not None:
        notes["vllm"] += (f"; method ngram at the workbook's n-gram lengths {ngram[0]}-{ngram[1]} (where none recurs "
                          "vLLM drafts nothing, the workbook's lookup its last token)")
    for name, held in expressed.items():
        if configs[name] is not None and held != main:
            notes[name] += (f"; holds k = {[r.k for r in held.ranges]} over the ranges (largest loss "
                            f"{expressed_cost(table, held):.4f} against the best k, "
                            f"{expressed_cost(table, held, main):.4f} against the schedule)")
    engine_doc = {name: {"file": engines.ENGINES[name].file if configs[name] is not None else None,
                         "release": engines.ENGINES[name].release, "batch_size": engines.ENGINES[name].batch,
                         "past_the_last_entry": engines.ENGINES[name].beyond, "note": notes[name]}
                  for name in configs}
    document = {
        "serving": engines.SERVING,
        "method": method, "label": label(method), "run": inp.run,
        "inputs": {"tau": inp.acceptance[method].tau, "tau_ci95": inp.acceptance[method].ci95,
                   "tau_depth": inp.acceptance[method].depth, "tau_context": inp.tau_context,
                   "per_position": list(inp.acceptance[method].per_position) or None,
                   "hardware": inp.device, "dtype": inp.dtype, "hoi": round(inp.hardware.hoi(inp.dtype), 3),
                   "bytes_per_value": BYTES_PER_VALUE[inp.dtype], "shapes": inp.shapes,
                   "context": inp.context, "length_spread": inp.length_spread,
                   "model": ("this machine's profiled cost model (notebook 09), interval from tau's 95% CI widened "
                             f"by its median |error| {inp.profiled['error']:.3f} (its largest on the held-out cells: "
                             f"{inp.profiled['held_out_max_error'] or float('nan'):.3f})" if inp.profiled else
                             "paper's throughput model (method §2), interval from tau's 95% CI"),
                   "k_searched": f"1..{int(table.ks[-1])}" + (
                       f", capped at the measured depth {inp.acceptance[method].depth} (the per-position curve is "
                       "not extrapolated; measure deeper in notebook 04 to search further)" if capped else ""),
                   "switching_cost": inp.switching_cost, "min_batch_run": inp.min_batch_run,
                   "max_batch": inp.max_batch,
                   "sglang_cuda_graph_bs": list(inp.graph_bs)},
        "schedule": [r.to_dict() for r in main.ranges],
        "merged": [m.to_dict() for m in main.merges],
        "by_context": {str(L): [r.to_dict() for r in s.ranges] for L, s in by_context.items()},
        "collapsed_cost": collapsed,
        "context_switches": switches,
        "engines": engine_doc,
        "sglang_server_args": sglang_args,
    }
    return {"document": document, "engines": configs, "schedule": main, "capped": capped, "expressed": expressed}


def _json(config: dict) -> str:
    """`config` as JSON, a list of numbers (a schedule entry) on one line."""
    def dump(value, indent):
        pad = " " * (indent + 2)
        if isinstance(value, dict):
            items = [f"{pad}{json.dumps(k)}: {dump(v, indent + 2)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        if isinstance(value, list) and value and not all(isinstance(v, (int, float)) for v in value):
            return "[\n" + ",\n".join(pad + dump(v, indent + 2) for v in value) + "\n" + " " * indent + "]"
        return json.dumps(value)
    return dump(config, 0)


def write(inp: Inputs, out_dir: Path) -> dict[str, dict]:
    """Every method's files under `out_dir`/<method>/ (our YAML is schedule.yaml); returns each
    method's `method_schedules`. JSON carries no comment and the engines' JSON readers refuse
    extra keys, so each file's release, batch size and end are in schedule.yaml's `engines`; the
    TensorRT-LLM YAML also says them in its header."""
    written = {}
    for method in inp.acceptance:
        made = method_schedules(inp, method)
        folder = out_dir / method
        folder.mkdir(parents=True, exist_ok=True)
        for name, config in made["engines"].items():
            engine = engines.ENGINES[name]
            path = folder / engine.file
            path.unlink(missing_ok=True)
            if config is None:
                continue
            if name == "trtllm":
                header = (f"{engines.SERVING} spire deploy: {label(method)} on {inp.device} {inp.dtype} at the "
                          f"{inp.shapes} shapes, B 1-{inp.max_batch}. Keys of "
                          f"{engine.release}. Batch size: {engine.batch}. Past the last key: {engine.beyond}. "
                          f"{made['document']['engines'][name]['note']}.")
                path.write_text("".join(f"# {line}\n" for line in textwrap.wrap(header, 110))
                                + yaml.safe_dump({"speculative_config": config}, sort_keys=False))
            else:
                path.write_text(_json(config) + "\n")
        written[method] = made
        (folder / "schedule.yaml").write_text(yaml.safe_dump(made["document"], sort_keys=False, width=120,
                                                        allow_unicode=True))
    return written


def summary(inp: Inputs, made: dict[str, dict], out_dir: Path) -> str:
    """What `spire deploy` prints: which drafts an engine can serve, then one line per method of
    `made` (`write`'s) with its batch ranges and k."""
    lines = [engines.SERVING, "",
             f"{inp.run} on {inp.device} {inp.dtype} (HOI {inp.hardware.hoi(inp.dtype):.1f}), {inp.shapes} shapes, "
             f"L = {inp.context}" + (f" mixed (sigma {inp.length_spread:g})" if inp.length_spread else "")
             + f", tau at L = {inp.tau_context}, B up to --max-batch {inp.max_batch}:"]
    for method, schedules in made.items():
        s = schedules["schedule"]
        lines.append(f"  {label(method)}: " + ", ".join(
            f"B {r.lo}-{r.hi}: k={r.k} ({r.speedup_min:.2f}-{r.speedup_max:.2f}x)" for r in s.ranges)
            + (f" [k capped at the measured depth {inp.acceptance[method].depth}]" if schedules["capped"] else ""))
        lines += [f"    {engines.ENGINES[name].label} cannot hold it: {schedules['document']['engines'][name]['note']}"
                  for name, held in schedules["expressed"].items() if held != s and schedules["engines"][name]]
    lines.append(f"written to {out_dir} (each engine's release and what it does past the last entry: "
                 "schedule.yaml's engines)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- an engine's reading of a file

EXPLAIN_ENGINES = ("vllm", "vllm_pr48944", "trtllm", "sglang")


def load_engine_file(path: Path) -> dict:
    """An engine file as data: YAML (.yaml, .yml; TensorRT-LLM's under `speculative_config`) or JSON."""
    if not path.is_file():
        raise DeployError(f"--explain {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text())
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise DeployError(f"--explain {path}: not valid YAML/JSON ({e}); give an engine file spire deploy wrote "
                          "or one in the same form") from e
    if not isinstance(data, dict):
        raise DeployError(f"--explain {path}: expected a mapping of the engine's keys")
    return data.get("speculative_config", data)


def engine_reading(engine: str, config: dict, batches, contexts=(None,), graph_bs=engines.CUDA_GRAPH_BS,
                   server_args: dict | None = None) -> tuple[list[str], dict]:
    """What `engine` refuses in `config` and the k it picks per (batch, context) of `batches` x
    `contexts` (context None where the engine reads none). SGLang reads the adaptive config with
    an EAGLE-family algorithm at the first slot's steps unless `server_args` says otherwise."""
    try:
        if engine == "vllm":
            return engines.vllm_problems(config), {(b, None): engines.vllm_k(config, b) for b in batches}
        if engine == "vllm_pr48944":
            return [], {(b, L): engines.vllm_context_k(config, b, L) for b in batches for L in contexts}
        if engine == "trtllm":
            return engines.trtllm_problems(config), {(b, None): engines.trtllm_k(config, b) for b in batches}
        first = config[min(config, key=int)]["candidate_steps"][0]
        args = server_args or {"speculative_algorithm": "EAGLE", "speculative_adaptive": True,
                               "speculative_num_steps": first, "speculative_eagle_topk": 1,
                               "speculative_num_draft_tokens": first + 1}
        return (engines.sglang_problems(config, args),
                {(b, None): engines.sglang_k(config, args, b, graph_bs) for b in batches})
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise DeployError(f"--engine {engine}: the file is not in that engine's form ({e!r}); see docs/deploy.md "
                          "for each engine's keys") from e


def explain(path: Path, engine: str, max_batch: int, contexts, inp: Inputs | None = None, method: str | None = None,
            graph_bs=engines.CUDA_GRAPH_BS) -> str:
    """`spire deploy --explain`: what `engine` would do with the file at `path`, B by B (runs of
    equal k in one row; per context where it reads one), next to the workbook's scheduled k and
    its modeled multiplier when a run's `inp` and `method` are given."""
    if engine not in EXPLAIN_ENGINES:
        raise DeployError(f"--engine {engine}: choose one of {', '.join(EXPLAIN_ENGINES)}")
    info = engines.ENGINES[engine]
    batches = range(1, max_batch + 1)
    reads_context = engine == "vllm_pr48944"
    problems, picked = engine_reading(engine, load_engine_file(path), batches,
                                      tuple(contexts) if reads_context else (None,), graph_bs)
    lines = [engines.SERVING, "", f"{info.label} ({info.release}) reading {path}:",
             f"  its batch size: {info.batch}; past the last entry: {info.beyond}"]
    if engine == "sglang":
        lines.append("  read as an EAGLE-family algorithm would (STANDALONE ignores the file and runs its "
                     "--speculative-num-steps); batches padded to the CUDA-graph sizes "
                     f"{', '.join(map(str, graph_bs))}")
    lines += [f"  refused: {p}" for p in problems] or ["  the engine's checks pass"]
    ours = {}  # (B, L) -> (the workbook's k, its modeled multiplier, the multiplier at the engine's k)
    if inp is not None:
        for L in (tuple(contexts) if reads_context else (None,)):
            table = inp.table(method, L)
            s = inp.schedule(table)
            ours.update({(b, L): (s.k_at(b), float(table.at(s.k_at(b))[0][b - 1]),
                                  float(table.at(picked[(b, L)])[0][b - 1]) if picked[(b, L)] <= table.ks[-1] else None)
                         for b in batches})
        lines.append(f"  beside the workbook's schedule for {label(method)} ({inp.run} on {inp.device} {inp.dtype}, "
                     f"{inp.shapes} shapes, L = {inp.context if not reads_context else 'per row'}); modeled "
                     "multipliers over AD (-: the engine's k is deeper than the acceptance was measured)")
    header = ["B", *(["L"] if reads_context else []), "engine k",
              *(["workbook k", "modeled x", "x at engine k"] if ours else [])]
    rows = []
    for L in (tuple(contexts) if reads_context else (None,)):
        for _, run in itertools.groupby(batches, key=lambda b, L=L: (picked[(b, L)], ours.get((b, L), (None,))[0])):
            run = list(run)
            k = picked[(run[0], L)]
            span = f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0])
            cells = [span, *([str(L)] if reads_context else []), str(k)]
            if ours:
                mine = ours[(run[0], L)][0]
                cells.append(str(mine) + ("" if mine == k else "  <- differs"))
                for column in (1, 2):
                    xs = [ours[(b, L)][column] for b in run if ours[(b, L)][column] is not None]
                    cells.append(f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-")
            rows.append(cells)
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in (header, *rows)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- a run's own schedules

READS = ("04_measure_tau", "09_measured_vs_modeled")  # the notebooks whose results a run's schedules read
RUN_DEVICE = "h100-sxm"  # the device every run writes a schedule for (the paper's)
RUN_PROFILED_BATCH = 8  # this machine's profiled schedule: B = 1..8 at the contexts notebook 09 timed


def reads_any(stems) -> bool:
    """Whether a run of the notebooks `stems` changed what its schedules read (`READS`)."""
    return bool(set(stems) & set(READS))


def write_run(out_dir: Path) -> dict:
    """The schedules a run writes into its own folder (`spire run` calls this after the last
    notebook when it ran one of `READS`): on an H100 (fp8) at the served shapes and, when notebook 09 ran, on this machine
    from its profiled model; what run.json keeps of them (folders, per method its ranges, or
    why none was written)."""
    results = read_json(out_dir / "results.json")
    measured = results.get("09_measured_vs_modeled", {}).get("cells") or []
    options = {f"{RUN_DEVICE}-fp8": {"hardware": RUN_DEVICE, "dtype": "fp8"}}
    if measured:
        lengths = tuple(sorted({int(c["L"]) for c in measured}))
        options["this-machine-profiled"] = {"model": "profiled", "max_batch": RUN_PROFILED_BATCH,
                                            "contexts": lengths, "context": lengths[-1]}
    written = {}
    for name, kwargs in options.items():
        try:
            inp = inputs(out_dir, **kwargs)
        except DeployError as e:
            written[name] = {"skipped": str(e)}
            continue
        made = write(inp, out_dir / "deploy" / name)
        written[name] = {"folder": f"deploy/{name}", "device": f"{inp.device} {inp.dtype}", "context": inp.context,
                         "methods": {m: {"ranges": s["schedule"].describe(),
                                         "files": ["schedule.yaml", *(engines.ENGINES[e].file for e, c in s["engines"].items()
                                                                      if c is not None)]}
                                     for m, s in made.items()}}
    return written


def index_rows(run: dict) -> list[dict]:
    """The run's schedules (run.json's "deploy", `write_run`) as its index lists them: a row per
    device and method with its batch ranges and the files written (each linked by its path in the
    run's folder), and per device that wrote none a row saying why ("skipped")."""
    rows = []
    for name, entry in (run.get("deploy") or {}).items():
        if "skipped" in entry:
            rows.append({"device": name, "skipped": entry["skipped"]})
            continue
        for method, written in entry["methods"].items():
            rows.append({"device": f"{entry['device']}, L = {entry['context']}", "skipped": None,
                         "draft": label(method), "ranges": written["ranges"],
                         "files": [{"href": f"{entry['folder']}/{method}/{f}", "name": f} for f in written["files"]]})
    return rows


# ---------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", type=Path, nargs="?",
                        help="a finished run's folder or name (optional with --explain)")
    parser.add_argument("--hardware", metavar="NAME", help="a device of the hardware table, e.g. h100-sxm")
    parser.add_argument("--dtype", help="serving dtype (default: fp8, else bf16, else fp32)")
    parser.add_argument("--peak-flops", type=float, metavar="F", help="instead of --hardware: peak FLOP/s in --dtype")
    parser.add_argument("--bandwidth", type=float, metavar="BPS", help="instead of --hardware: bytes/s")
    parser.add_argument("--draft", action="append", metavar="METHOD",
                        help="only this method (repeatable); with --explain, compare it")
    parser.add_argument("--shapes", default="served", choices=SHAPES, metavar="WHICH",
                        help=f"{', '.join(SHAPES)}: served (default) is an imported target's, else the paper's")
    parser.add_argument("--context", type=int, metavar="L", help="the context (default: 06's context_length)")
    parser.add_argument("--length-spread", type=float, metavar="SIGMA", help="sigma of log-length (default 0)")
    parser.add_argument("--contexts", type=_ints, default=CONTEXTS, metavar="L,L,...",
                        help="the per-context schedules' grid (default 32,...,8192)")
    parser.add_argument("--max-batch", type=int, default=256, metavar="B",
                        help="your server's largest batch (default 256)")
    parser.add_argument("--cuda-graph-bs", type=_ints, default=engines.CUDA_GRAPH_BS, metavar="B,B,...",
                        help="your SGLang server's --cuda-graph-bs (docs/deploy.md)")
    parser.add_argument("--min-context-run", type=int, default=MIN_CONTEXT_RUN, metavar="TOKENS",
                        help=f"tokens a k must last as L grows (default {MIN_CONTEXT_RUN})")
    parser.add_argument("--min-batch-run", type=int, default=1, metavar="N",
                        help="batch sizes the narrowest range must span (default 1: none)")
    parser.add_argument("--switching-cost", type=float, default=0.0, metavar="FRACTION",
                        help="of the speedup a switch of k must beat (e.g. 0.14; default 0)")
    parser.add_argument("--model", default="paper", choices=MODELS, metavar="MODEL",
                        help="paper (default, on --hardware) or profiled (09's, this machine)")
    parser.add_argument("--out", type=Path, metavar="DIR", help="default: RUN/deploy/HARDWARE-DTYPE")
    parser.add_argument("--explain", type=Path, metavar="FILE",
                        help="what --engine does with this file, B by B")
    parser.add_argument("--engine", choices=EXPLAIN_ENGINES, metavar="ENGINE",
                        help=f"the engine reading --explain's file: {', '.join(EXPLAIN_ENGINES)}")


def _ints(value: str) -> tuple[int, ...]:
    """A comma-separated list of integers, e.g. 1,2,4,8."""
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: give comma-separated integers, e.g. 1,2,4,8") from e


def run_folder(value: Path) -> Path:
    """A run's folder: the path as given, or outputs/<name>."""
    return value if value.is_dir() else project_root() / "outputs" / value


def _explain(args: argparse.Namespace) -> str:
    """`--explain`'s table; the run's schedule beside it when a RUN is given (one --draft)."""
    if args.engine is None:
        raise DeployError(f"--explain needs --engine: one of {', '.join(EXPLAIN_ENGINES)}")
    inp = method = None
    if args.run_dir is not None:
        if not args.draft or len(args.draft) != 1:
            raise DeployError(f"--explain with a RUN compares one draft: give --draft NAME ({', '.join(PRICED)})")
        inp = inputs(run_folder(args.run_dir), hardware=args.hardware, dtype=args.dtype, peak_flops=args.peak_flops,
                     bandwidth=args.bandwidth, context=args.context, length_spread=args.length_spread,
                     max_batch=args.max_batch, switching_cost=args.switching_cost, contexts=args.contexts,
                     shapes=args.shapes, methods=args.draft, model=args.model, graph_bs=args.cuda_graph_bs,
                     min_context_run_tokens=args.min_context_run, min_batch_run=args.min_batch_run)
        method = args.draft[0]
    if not (isinstance(args.max_batch, int) and args.max_batch >= 1):
        raise DeployError(f"--max-batch {args.max_batch}: must be a positive integer")
    return explain(args.explain, args.engine, args.max_batch, args.contexts, inp, method, args.cuda_graph_bs)


def command(args: argparse.Namespace) -> int:
    try:
        if args.explain is not None:
            print(_explain(args))
            return 0
        if args.run_dir is None:
            raise DeployError("give a finished run (outputs/RUN), or --explain FILE --engine NAME")
        run_dir = run_folder(args.run_dir)
        inp = inputs(run_dir, hardware=args.hardware, dtype=args.dtype, peak_flops=args.peak_flops,
                     bandwidth=args.bandwidth, context=args.context, length_spread=args.length_spread,
                     max_batch=args.max_batch, switching_cost=args.switching_cost, contexts=args.contexts,
                     shapes=args.shapes, methods=args.draft, model=args.model, graph_bs=args.cuda_graph_bs,
                     min_context_run_tokens=args.min_context_run, min_batch_run=args.min_batch_run)
    except DeployError as e:
        print(f"error: spire deploy: {e}", file=sys.stderr)
        return 2
    out_dir = args.out or run_dir / "deploy" / (f"{inp.device}-{inp.dtype}" + ("-profiled" if inp.profiled else ""))
    print(summary(inp, write(inp, out_dir), out_dir))
    return 0
