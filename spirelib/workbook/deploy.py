"""`spire deploy`: a finished run's answer in the forms serving engines take (docs/deploy.md).

For every drafting method the run measured that the model prices, from what `deploy_inputs.inputs`
reads of the run: a batch-size -> k schedule (`throughput.schedule`) at the params file's context
mix, and one per context of a grid (`method_schedules`), written as our YAML (the intervals, the
merges, the inputs and, per engine, its release, its batch size, what it does past the last entry
and what it could not express) and in each engine's form (`throughput.engines`: the keys of a named
release, and vLLM's context form of an open PR in its own file), beside them the draft's acceptance
profile (`throughput.acceptance_profile`) and, for a draft an engine serves, its serving command
lines with its method and exported model (`serve_scripts`). `spire run` writes a run's own
schedules into its folder (`write_run`); `--explain` reads an engine file back the way that engine
would, B by B, beside the workbook's schedule (`deploy_explain`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
from pathlib import Path

import yaml

from spirelib.paths import project_root
from spirelib.throughput import engines
from spirelib.throughput.hardware import BYTES_PER_VALUE
from spirelib.throughput.methods import card, label
from spirelib.throughput.recorded import DeployError, timed_cells
from spirelib.throughput.schedule import context_switches, expressed_cost, min_context_run
from spirelib.workbook.deploy_explain import EXPLAIN_ENGINES, explain
from spirelib.workbook.deploy_inputs import (
    CONTEXTS,
    EXPORTS,
    MIN_CONTEXT_RUN,
    MODELS,
    PRICED,
    SHAPES,
    TARGET_PLACEHOLDER,
    Inputs,
    inputs,
)
from spirelib.workbook.results import read_json

SWITCH_SPAN = (64, 8192)  # the growth of one request whose switches of k schedule.yaml counts
PROFILE = "acceptance_profile.json"  # each draft's measured acceptance, as serving simulators read it


# ---------------------------------------------------------------------------- writing

def method_schedules(inp: Inputs, method: str) -> dict:
    """One method's schedule at the context mix, its per-context schedules, each engine's form
    (`throughput.engines`), the schedule that form holds and what it costs; our YAML document."""
    table = inp.table(method)
    main = inp.schedule(table)
    tables = {L: inp.table(method, L) for L in inp.contexts}
    by_context = {L: inp.schedule(t) for L, t in tables.items()}
    collapsed = {str(L): round(expressed_cost(tables[L], main, by_context[L]), 4) for L in inp.contexts}
    long_runs = min_context_run(tables, by_context, inp.min_context_run, inp.max_batch)
    switches = {"from_to": list(SWITCH_SPAN), "min_context_run": inp.min_context_run,
                "largest_loss": round(max(expressed_cost(tables[L], long_runs[L], by_context[L])
                                          for L in inp.contexts), 4),
                "per_batch": {str(b): {"before": context_switches(by_context, b, *SWITCH_SPAN),
                                       "after": context_switches(long_runs, b, *SWITCH_SPAN)}
                              for b in sorted({1, 8, 64, inp.max_batch}) if b <= inp.max_batch}}
    capped = bool(inp.acceptance[method].per_position) and any(r.k == int(table.ks[-1]) for r in main.ranges)
    ngram = card(method).ngrams  # prompt lookup's n-gram lengths, which its engine keys carry
    trt, trt_expressed = engines.trtllm_config(main, table, ngram)
    algorithm = card(method).engines.get("sglang")  # SGLang's --speculative-algorithm, if it serves the draft
    sglang, sglang_args, sglang_expressed = engines.sglang_config(main, table, algorithm)
    draft = inp.drafts.get(method)  # the draft model an engine loads, where the run exports one (`EXPORTS`)
    model = None if draft is None else draft.path or EXPORTS[method].placeholder
    named = {"method": card(method).engines["vllm"], "model": model} if model and "vllm" in card(method).engines else {}
    configs = {"vllm": engines.vllm_config(main, ngram),
               "vllm_pr48944": engines.vllm_context_config(long_runs, ngram), "trtllm": trt, "sglang": sglang}
    configs.update({name: {**named, **configs[name]} for name in ("vllm", "vllm_pr48944") if configs[name] and named})
    if model and sglang_args:  # the draft's folder right after its algorithm
        sglang_args = {"speculative_algorithm": algorithm, "speculative_draft_model_path": model, **sglang_args}
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
                             f"by its median |error| {inp.profiled.pricing.error:.3f} (its largest on the held-out "
                             f"cells: {inp.profiled.held_out_max_error or float('nan'):.3f})" if inp.profiled else
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
        "draft_model": None if draft is None else {"path": draft.path, "placeholder": None if draft.path else model,
                                                   "target": draft.target, "note": draft.note},
        "acceptance_profile": PROFILE if inp.profiles.get(method) else None,
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
        (folder / PROFILE).unlink(missing_ok=True)
        if inp.profiles.get(method):
            (folder / PROFILE).write_text(_json(inp.profiles[method]) + "\n")
        scripts = serve_scripts(inp, method, made, folder)
        for name in ("serve-vllm.sh", "serve-sglang.sh"):
            (folder / name).unlink(missing_ok=True)
            if name in scripts:
                (folder / name).write_text(scripts[name])
                (folder / name).chmod(0o755)
        made["files"] = ["schedule.yaml", *(engines.ENGINES[e].file for e, c in made["engines"].items() if c),
                         *([PROFILE] if inp.profiles.get(method) else []), *scripts]
        written[method] = made
        (folder / "schedule.yaml").write_text(yaml.safe_dump(made["document"], sort_keys=False, width=120,
                                                        allow_unicode=True))
    return written


def _script(about: list[str], argv: list[str]) -> str:
    """A shell script that runs `argv` (one flag and its values a line), `about` as its comment."""
    words, lines = [shlex.quote(a) for a in argv], []
    for word in words:
        if word.startswith("--") or not lines:
            lines.append(word)
        else:
            lines[-1] += " " + word
    return ("#!/bin/sh\n" + "".join(f"# {line}\n" for line in textwrap.wrap(" ".join(about), 100))
            + "exec " + " \\\n  ".join(lines) + "\n")


def serve_scripts(inp: Inputs, method: str, made: dict, folder: Path) -> dict[str, str]:
    """The command lines that serve `method` with its schedule (serve-vllm.sh, serve-sglang.sh), for
    a draft an engine serves (its card names them) that needs no model or whose export the run
    records (`EXPORTS`; without the folder, its placeholder and how to export it); else none. The
    target is the one the exported draft names, else `TARGET_PLACEHOLDER`."""
    names, draft = card(method).engines, inp.drafts.get(method)
    if not names or (card(method).needs_model and draft is None):
        return {}
    target = (draft.target if draft else None) or TARGET_PLACEHOLDER
    about = [f"spire deploy: {label(method)} of run {inp.run} on {inp.device} {inp.dtype}, B 1-{inp.max_batch}",
             "(schedule.yaml: the schedule, its inputs and each engine's note). Its card names the engines that serve",
             f"it: {', '.join(f'{engines.ENGINES[e].label} {n}' for e, n in names.items())}."]
    if draft is not None:
        placeholder = made["document"]["draft_model"]["placeholder"]
        about.append(f"The draft model: {draft.note}." if draft.path else
                     f"The draft model is the placeholder {placeholder}: {draft.note}.")
    if target == TARGET_PLACEHOLDER:
        about.append(f"{TARGET_PLACEHOLDER}: the target the run measured the draft against (the series' imported "
                     "target, or ours exported by spirelib.training.hf_export.save_model).")
    scripts, vllm, args = {}, made["engines"]["vllm"], made["document"]["sglang_server_args"]
    if "vllm" in names and vllm:
        scripts["serve-vllm.sh"] = _script([*about, f"Keys of {engines.ENGINES['vllm'].release}."],
                                           engines.vllm_command(vllm, target, inp.max_batch))
    if "sglang" in names and args:
        adaptive = str((folder / engines.ENGINES["sglang"].file).resolve()) if made["engines"]["sglang"] else None
        scripts["serve-sglang.sh"] = _script(
            [*about, f"Flags of {engines.ENGINES['sglang'].release}; the adaptive file and --cuda-graph-bs only where "
             "k changes with B."], engines.sglang_command(args, target, inp.max_batch, adaptive, inp.graph_bs))
    return scripts


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
        served = [f for f in schedules.get("files", ()) if f.startswith("serve-")]
        draft = schedules["document"]["draft_model"]
        if served:
            model = "" if draft is None else f" (draft model: {draft['path']})" if draft["path"] else (
                f" (draft model: the placeholder {draft['placeholder']}; schedule.yaml's draft_model says how to "
                "export it)")
            lines.append(f"    served by {', '.join(served)}{model}")
    lines.append(f"written to {out_dir} (each engine's release and what it does past the last entry: "
                 "schedule.yaml's engines)")
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
    notebook when it ran one of `READS`): on an H100 (fp8) at the served shapes and, when notebook
    09 ran, on this machine from its profiled model; what run.json keeps of them (folders, per
    method its ranges, or why none was written)."""
    results = read_json(out_dir / "results.json")
    measured = timed_cells(results)
    options = {f"{RUN_DEVICE}-fp8": {"hardware": RUN_DEVICE, "dtype": "fp8"}}
    if measured:
        lengths = tuple(sorted({c.L for c in measured}))
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
                         "methods": {m: {"ranges": s["schedule"].describe(), "files": s["files"]}
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
