"""Run the numbered notebook series headlessly and write the HTML reports (docs/ARCHITECTURE.md).

    spire run   --params params/default.yaml [--only 01,04] [--out DIR] [--log-output] [--plan] [--recalibrate]
    spire check --params params/smoke.yaml
    spire run   --params params/paper.yaml --dry-run [--corpus-path DIR]

`run` validates the params file against every notebook's `parameters` cell (no kernel starts
if anything is wrong), then executes the selected `notebooks/NN_*.ipynb` in order with
papermill (cwd = notebooks/), exporting each to HTML in the output folder, merging the
results notebooks record (`spirelib.workbook.results`) into `results.json`, and writing `run.json`
(parameters, status and timing per notebook, the plan, the claims the index makes) and `index.html`,
written before the first notebook (its path printed), as each starts and at the end (`report.write_index`).
After the notebooks, the run's measured times go back into the plan's calibration
(`spirelib.workbook.plan.learn`), and its claims are compared with the previous run's in the same
folder on the same params and machine (`spirelib.workbook.claims`): each changed verdict is printed.
The first failing notebook stops the run (exit 1); its partial notebook is still exported with the
error visible. While a notebook runs, the terminal shows its kernel's progress (`spirelib.workbook.progress`,
fed through <out>/progress/NN_name.jsonl); the run ends with a table of its notebooks and the index's verdict.

A run without `--only` starts a fresh record; with `--only` it updates the existing record
of that output folder, so a re-run notebook still sees the results of earlier notebooks.

Params files are YAML with a `series`, a `shared` and a `notebooks` section (params/README.md):
`series` is the one series configuration (`spirelib.training.series.Series`), injected as the `series`
parameter of every notebook that declares it and checked in full before anything runs.

`--dry-run` runs the same notebooks at the same shapes with every budget scaled down
(`dry_run_parameters`: the series through `spirelib.training.series.dry_run`, each notebook's sizes
through their contracts, `notebooks.NOTEBOOKS`), on the CPU, into outputs/<params file stem>-dry-run/ with its own
model cache (<out>/cache, unless SPIRE_CACHE_DIR is set). A LongCrawl64 series whose
corpus_path holds no dataset runs on a generated fixture (<out>/longcrawl64-fixture,
`spirelib.training.corpus.write_longcrawl64_fixture`); `--corpus-path` points the series at another corpus
folder, in any run.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from spirelib.paths import project_root, resolve_path
from spirelib.training import corpus
from spirelib.training import series as series_config
from spirelib.training.devices import resolve_device
from spirelib.training.params import ParamsError, load_params, problem_report, suggest
from spirelib.workbook import claims, deploy, findings, plan, probe, progress, results
from spirelib.workbook.notebooks import NOTEBOOKS

NOTEBOOK_NAME = re.compile(r"^\d\d_\w+\.ipynb$")
SERIES_PARAMETER = "series"  # the notebook parameter that receives the params file's series section

# Checks for the annotations papermill reports; other annotations are not checked.
_TYPE_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
}


DRY_RUN_SUFFIX = "-dry-run"  # outputs/<params file stem>-dry-run
FIXTURE_FOLDER = "longcrawl64-fixture"  # under a dry run's output folder


# ---------------------------------------------------------------------------- the series

def discover(notebooks_dir: Path) -> list[Path]:
    """The series: `NN_name.ipynb` files of `notebooks_dir`, in order."""
    if not notebooks_dir.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {notebooks_dir}")
    return sorted(p for p in notebooks_dir.iterdir() if NOTEBOOK_NAME.match(p.name))


def select(series: list[Path], only: str | None) -> list[Path]:
    """The notebooks named by `only` ("01,04": numbers or full stems), in series order."""
    if not only:
        return series
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    for w in wanted:
        if not any(_matches(p.stem, w) for p in series):
            stems = [p.stem for p in series]
            raise ParamsError(f"--only {w}: no such notebook{suggest(w, stems)}; notebooks: {', '.join(stems)}")
    return [p for p in series if any(_matches(p.stem, w) for w in wanted)]


def _matches(stem: str, wanted: str) -> bool:
    return stem == wanted or stem.split("_", 1)[0] == wanted


# ---------------------------------------------------------------------------- params

def parameters_cell(notebook: Path) -> dict[str, dict[str, str]]:
    """The notebook's `parameters` cell read without a kernel or papermill (a core install checks params
    files too): name -> {"inferred_type_name": its annotation, "default": its value's source}, as
    `papermill.inspect_notebook` reports them ("None" for an assignment without an annotation)."""
    cells = [c for c in json.loads(notebook.read_text())["cells"]
             if c["cell_type"] == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ParamsError(f"{notebook.name}: needs exactly one cell tagged 'parameters', found {len(cells)}")
    source = "".join(cells[0]["source"])
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ParamsError(f"{notebook.name}: its parameters cell is not valid Python: {e}") from None
    found = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found[node.target.id] = {"inferred_type_name": ast.unparse(node.annotation),
                                     "default": ast.get_source_segment(source, node.value)}
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = {"inferred_type_name": "None",
                                         "default": ast.get_source_segment(source, node.value)}
    return found


def declared_parameters(notebook: Path | dict) -> dict[str, str]:
    """Parameter name -> annotated type name of the notebook's `parameters` cell (no kernel);
    `notebook` may be its `parameters_cell` already."""
    cell = notebook if isinstance(notebook, dict) else parameters_cell(notebook)
    return {name: p["inferred_type_name"] for name, p in cell.items()}


def default_parameters(notebook: Path | dict) -> dict[str, Any]:
    """Parameter name -> default value of the notebook's `parameters` cell, for those whose
    default is a Python literal (no kernel); `notebook` may be its `parameters_cell`."""
    cell = notebook if isinstance(notebook, dict) else parameters_cell(notebook)
    out = {}
    for name, p in cell.items():
        with contextlib.suppress(ValueError, SyntaxError):
            out[name] = ast.literal_eval(p["default"])
    return out


def consistency_problems(injected: dict[str, dict], defaults: dict[str, dict[str, Any]]) -> list[str]:
    """What each notebook's contract checks (`notebooks.NOTEBOOKS`) find wrong with its parameters
    taken together (its injections over its defaults), before any notebook runs."""
    problems = []
    for stem, nb in NOTEBOOKS.items():
        if nb.checks and stem in injected:
            problems += [f"notebooks.{stem}: {p}" for p in nb.checks({**defaults.get(stem, {}), **injected[stem]})]
    return problems


def type_error(value: Any, type_name: str) -> str | None:
    """Why `value` does not fit the annotation `type_name`; None if it fits or is unchecked."""
    optional = re.fullmatch(r"Optional\[(.*)\]", type_name)
    if optional:
        if value is None:
            return None
        type_name = optional.group(1)
    check = _TYPE_CHECKS.get(type_name.split("[", 1)[0].strip())
    if check is None or check(value):
        return None
    return f"expected {type_name}, got {type(value).__name__} {value!r}"


def resolve(params: dict[str, dict], declared: dict[str, dict[str, str]], source: str = "params") -> dict[str, dict]:
    """The parameters to inject into each notebook (stem -> {name: value}).

    `declared` maps every notebook stem of the series to its parameters and their types.
    The `series` section goes to each notebook that declares the `series` parameter (checked
    field by field, `spirelib.training.series.problems`). A shared key goes to each notebook that
    declares it; a notebook's section overrides it. Raises ParamsError listing every unknown,
    misplaced or mistyped key.
    """
    series = params.get("series", {})
    problems = [f"series.{p}" for p in series_config.problems(series)]
    every_name = sorted({name for names in declared.values() for name in names})
    for key in params["shared"]:
        if key == SERIES_PARAMETER:
            problems.append(f"shared.{key}: the series configuration is its own top-level section, `series:`")
        elif key not in every_name:
            problems.append(f"shared.{key}: no notebook of the series declares it{suggest(key, every_name)}; "
                            f"declared: {', '.join(every_name) or '(none)'}")
    for stem in params["notebooks"]:
        if stem not in declared:
            problems.append(f"notebooks.{stem}: no such notebook{suggest(stem, declared)}; "
                            f"notebooks: {', '.join(declared) or '(none)'}")
    resolved = {}
    for stem, names in declared.items():
        section = params["notebooks"].get(stem, {})
        for key in section:
            if key not in names:
                problems.append(f"notebooks.{stem}.{key}: not a parameter of {stem}{suggest(key, names)}; "
                                f"allowed: {', '.join(names) or '(none)'}")
        chosen = {k: v for k, v in params["shared"].items() if k in names}
        if SERIES_PARAMETER in names and series:
            chosen[SERIES_PARAMETER] = series
        if isinstance(section.get(SERIES_PARAMETER), dict):  # a notebook's own changes to the series
            merged = {**series, **section[SERIES_PARAMETER]}
            problems += [f"notebooks.{stem}.series.{p}" for p in series_config.problems(merged)]
            section = {**section, SERIES_PARAMETER: merged}
        chosen.update({k: v for k, v in section.items() if k in names})
        for key, value in chosen.items():
            why = type_error(value, names[key])
            if why:
                where = f"notebooks.{stem}.{key}" if key in section else f"shared.{key} (for {stem})"
                problems.append(f"{where}: {why}")
        resolved[stem] = chosen
    if problems:
        raise ParamsError(problem_report(source, problems))
    return resolved


def dry_run_parameters(injected: dict[str, dict], declared: dict[str, dict[str, str]],
                       source: str = "params") -> dict[str, dict]:
    """The resolved injections (`resolve`) with every budget scaled down and every shape kept:
    each notebook declaring `series` gets `spirelib.training.series.dry_run` of its series, and each
    parameter its contract scales (`notebooks.NOTEBOOKS`) that it declares gets its dry-run value. The
    result is checked as `resolve` checks a file (ParamsError)."""
    problems, out = [], {}
    for stem, chosen in injected.items():
        names, chosen = declared.get(stem, {}), dict(chosen)
        if SERIES_PARAMETER in names:
            chosen[SERIES_PARAMETER] = series_config.dry_run(chosen.get(SERIES_PARAMETER, {}))
            problems += [f"dry run of {stem}: series.{p}" for p in series_config.problems(chosen[SERIES_PARAMETER])]
        for key, rule in (NOTEBOOKS[stem].dry_run if stem in NOTEBOOKS else {}).items():
            if key in names:
                chosen[key] = rule(chosen.get(key)) if callable(rule) else rule
                why = type_error(chosen[key], names[key])
                if why:
                    problems.append(f"dry run of {stem}: {key}: {why}")
        out[stem] = chosen
    if problems:
        raise ParamsError(problem_report(source, problems))
    return out


def with_corpus_path(params: dict[str, dict], corpus_path: str | None) -> dict[str, dict]:
    """The params with the series' corpus_path replaced (`--corpus-path`), or unchanged (None)."""
    if corpus_path is None:
        return params
    return {**params, "series": {**params["series"], "corpus_path": str(corpus_path)}}


def prepare(params_file: Path, notebooks_dir: Path, only: str | None = None, *, dry_run: bool = False,
            corpus_path: str | None = None) -> tuple[dict, list[Path], dict[str, dict]]:
    """Validate `params_file` (its series' corpus_path replaced by `corpus_path`, if given)
    against the whole series: (params, selected notebooks, injections), the injections scaled
    down by `dry_run_parameters` for a dry run."""
    params = with_corpus_path(load_params(params_file), corpus_path)
    series = discover(notebooks_dir)
    cells = {p.stem: parameters_cell(p) for p in series}  # each parameters cell, read once
    declared = {stem: declared_parameters(cell) for stem, cell in cells.items()}
    injected = resolve(params, declared, source=str(params_file))
    if dry_run:
        injected = dry_run_parameters(injected, declared, source=str(params_file))
    problems = consistency_problems(injected, {stem: default_parameters(cell) for stem, cell in cells.items()})
    if problems:
        raise ParamsError(problem_report(str(params_file), problems))
    return params, select(series, only), injected


def dry_run_corpus(params_file: Path, out_dir: Path, write: bool = True) -> str | None:
    """The corpus folder a dry run uses instead of the file's: for a LongCrawl64 series whose
    corpus_path holds no dataset, a fixture generated under `out_dir` (`FIXTURE_FOLDER`, kept
    for later runs; `write=False` only names it); None (the file's corpus) otherwise."""
    series = load_params(params_file)["series"]
    if series.get("corpus") != "longcrawl64":
        return None
    given = series.get("corpus_path")
    if isinstance(given, str) and given and all((resolve_path(given) / s / ".zarray").is_file()
                                                for s in corpus.LONGCRAWL64_SPLITS):
        return None
    fixture = out_dir / FIXTURE_FOLDER
    if write and not all((fixture / s / ".zarray").is_file() for s in corpus.LONGCRAWL64_SPLITS):
        corpus.write_longcrawl64_fixture(fixture)
    print(f"dry run: no LongCrawl64 at {given!r}; {'using' if write else 'a run uses'} the generated fixture "
          f"{fixture}", flush=True)
    return str(fixture.resolve())


# ---------------------------------------------------------------------------- running

def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def work_plan(params: dict, selected: list[Path], injected: dict[str, dict], out_dir: Path | None = None,
              recalibrate: bool = False) -> plan.Plan:
    """The work of running `selected` with these injections (`spirelib.workbook.plan`): each
    notebook's parameters are its defaults with the injections over them. SD rounds at the taus
    the last run into `out_dir` measured, for the same series, where it holds them; every figure
    measured again with `recalibrate`."""
    parameters = {nb.stem: {**default_parameters(nb), **injected[nb.stem]} for nb in selected}
    series = params.get("series", {})
    taus, spreads = plan.measured(out_dir, series)
    return plan.make_plan([nb.stem for nb in selected], parameters, series, taus, recalibrate, spreads)


class MissingExtra(RuntimeError):
    """`spire run` was asked to execute notebooks on an install without the notebook extra."""


def notebook_stack():
    """The modules that execute notebooks and export them (`execute`, `report`: papermill, jupyter,
    nbconvert, plotly), imported only when a run executes notebooks: every other command starts on
    a core install. Raises `MissingExtra`, saying what to install, where they are missing."""
    try:
        from spirelib.workbook import execute, report
    except ModuleNotFoundError as e:
        raise MissingExtra(f"spire run executes the notebooks, which needs the notebook extra ({e.name} is missing): "
                           "pip install 'spire-workbook[notebooks]' (or make setup); spire train, bench, check "
                           "and deploy run without it") from None
    return execute, report


def run(params_file: Path, notebooks_dir: Path, out_dir: Path, only: str | None = None,
        log_output: bool = False, kernel: str = "python3", cell_timeout: float | None = 3600.0, *,
        dry_run: bool = False, corpus_path: str | None = None, plan_only: bool = False,
        recalibrate: bool = False) -> int:
    """Execute the series (or the `only` selection); 0 if every notebook succeeded, else 1.
    `dry_run`: every budget scaled down (module docstring); `corpus_path` replaces the series'.
    The run's plan (`work_plan`, every figure measured again with `recalibrate`) is printed first
    and kept in run.json (not for a dry run, whose budgets are not the file's); `plan_only`: print
    it, run nothing."""
    if not plan_only:  # before any compute: the plan calibrates
        execute, report = notebook_stack()
    if dry_run and corpus_path is None:
        load_params(params_file)  # a broken file is reported before any fixture is written
        corpus_path = dry_run_corpus(params_file, out_dir)
    params, selected, injected = prepare(params_file, notebooks_dir, only, dry_run=dry_run, corpus_path=corpus_path)
    if not selected:
        raise ParamsError(f"no notebooks NN_name.ipynb in {notebooks_dir}")
    planned = None
    if plan_only or not dry_run:
        planned = work_plan(params, selected, injected, out_dir, recalibrate)
        print(planned.render(), flush=True)
    if plan_only:
        return 0
    if log_output:  # papermill streams cell output through logging
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    record, previous = _start_record(params_file, out_dir, only, params, dry_run, planned, selected, injected)
    print(f"index: {report.write_index(out_dir)} (rewritten as each notebook starts and when the run ends)", flush=True)
    status = _run_notebooks(execute, report, selected, injected, record, out_dir, notebooks_dir, planned, log_output,
                            kernel, cell_timeout, dry_run)
    merged, why_not = _finish_record(record, previous, status, selected, planned, out_dir)
    _print_closing(record, previous, why_not, merged, selected, out_dir, report.write_index(out_dir))
    return 0 if status == "ok" else (130 if status == "interrupted" else 1)


def _start_record(params_file: Path, out_dir: Path, only: str | None, params: dict, dry_run: bool, planned,
                  selected: list[Path], injected: dict[str, dict]) -> tuple[dict, dict]:
    """The run's record (run.json) before any notebook runs, written: the params, the plan, every
    selected notebook pending with its parameters and planned seconds (with `only`, over the folder's
    existing record; else a fresh one, results.json removed); and the folder's previous record, whose
    claims this run's are compared with (read again where kept in an older form, or not at all)."""
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    run_file, results_file = out_dir / "run.json", out_dir / "results.json"
    previous = results.read_json(run_file)  # the folder's last run, whose claims this one's are compared with
    if previous and not claims.current(previous.get("claims")):  # kept in an older form, or not at all: read again
        previous["claims"] = claims.record(previous, results.read_json(results_file))
    record = results.read_json(run_file) if only else {}
    if not only:
        results_file.unlink(missing_ok=True)
    record.update(params_file=str(params_file), params=params, dry_run=dry_run, started=_now(), finished=None,
                  status="running", claims_compared=None, plan=None if planned is None else planned.to_dict(),
                  machine=planned.machine if planned else probe.machine_name(resolve_device("cpu")))
    record.setdefault("notebooks", {})
    for nb in selected:
        record["notebooks"][nb.stem] = {"status": "pending", "parameters": injected[nb.stem],
                                        "params_file": str(params_file),
                                        "planned_s": None if planned is None else round(planned.seconds(nb.stem), 2),
                                        "planned_at_tau_1_s": (None if planned is None
                                                               else round(planned.seconds_at_tau_1(nb.stem), 2))}
    record["notebooks"] = dict(sorted(record["notebooks"].items()))
    results.write_json(run_file, record)
    return record, previous


def _run_notebooks(execute, report, selected: list[Path], injected: dict[str, dict], record: dict, out_dir: Path,
                   notebooks_dir: Path, planned, log_output: bool, kernel: str, cell_timeout: float | None,
                   dry_run: bool) -> str:
    """Each notebook executed in turn (the index rewritten as it starts), its progress on the terminal, its results
    merged, its report exported and its `record` entry written, until one does not finish "ok": that status, or "ok"."""
    run_file, results_file = out_dir / "run.json", out_dir / "results.json"
    status = "ok"
    live = sys.stdout.isatty() and not log_output  # a person at a terminal: one line rewritten in place
    (out_dir / "progress").mkdir(exist_ok=True)
    for i, nb in enumerate(selected, 1):
        header = f"[{i}/{len(selected)}] {nb.stem}"
        if log_output:
            print(f"{header} started", flush=True)
        elif not live:
            print(f"{header} ", end="", flush=True)
        entry = record["notebooks"][nb.stem]
        entry.update(status="running", started=_now())
        results.write_json(run_file, record)
        report.write_index(out_dir)  # the index while the run runs: this notebook running, the rest to come
        feed = out_dir / "progress" / f"{nb.stem}.jsonl"
        feed.unlink(missing_ok=True)
        with progress.Watch(header, feed, entry["planned_s"], sys.stdout, live) as watch:
            status, seconds, error = execute.execute(nb, injected[nb.stem], out_dir, notebooks_dir, log_output, kernel,
                                              cell_timeout, dry_run, feed)
        entry.update(status=status, seconds=round(seconds, 2), error=error)
        all_results = results.read_json(results_file)
        all_results[nb.stem] = results.read_json(out_dir / "results" / f"{nb.stem}.json")
        results.write_json(results_file, all_results)
        against = "" if planned is None else f" (plan {entry['planned_s']:.0f} s)"
        if (out_dir / f"{nb.stem}.ipynb").is_file():
            report.export_html(out_dir / f"{nb.stem}.ipynb", out_dir / f"{nb.stem}.html",
                               note=report.timing_note(seconds, entry["planned_s"], planned and planned.machine))
            entry["html"] = f"{nb.stem}.html"
        outcome = f"{status} in {seconds:.1f} s{against}" + (f": {error}" if error else "")
        print(f"{header} {outcome}" if log_output or live or watch.printed else outcome, flush=True)
        results.write_json(run_file, record)
        if status != "ok":
            break
    return status


def _finish_record(record: dict, previous: dict, status: str, selected: list[Path], planned,
                   out_dir: Path) -> tuple[dict, str | None]:
    """The record completed and written after the notebooks: those not run marked skipped, the run's
    status, its serving schedules (`deploy`), what it taught the plan (`plan.learn`), its claims and
    those changed since `previous`. Returns (the merged results, why the claims were not compared
    or None)."""
    run_file, results_file = out_dir / "run.json", out_dir / "results.json"
    for entry in record["notebooks"].values():
        if entry["status"] == "pending":
            entry.update(status="skipped", error="not run: the run stopped at an earlier notebook")
    record.update(status=status, finished=_now())
    if deploy.reads_any(nb.stem for nb in selected):
        record["deploy"] = deploy.write_run(out_dir)
    if planned is not None:
        record["calibration_learned"] = plan.learn(planned, record, str(out_dir))
    merged = results.read_json(results_file)
    record["claims"] = claims.record(record, merged)
    why_not = claims.comparable(previous, record) if previous else "no earlier run in this folder"
    record["claims_changed"] = None if why_not else claims.changes(previous["claims"], record["claims"])
    record["claims_compared"] = {"with": previous.get("started") if previous else None, "why_not": why_not}
    results.write_json(run_file, record)
    return merged, why_not


def _print_closing(record: dict, previous: dict, why_not: str | None, merged: dict, selected: list[Path],
                   out_dir: Path, index: Path) -> None:
    """The run's last words on the terminal: what it taught the plan, which claims changed since the previous
    run (or why none were compared), the table of its notebooks with the index's verdict, where the reports are."""
    for line in record.get("calibration_learned") or []:
        print(f"calibration: {line}")
    if record["claims_changed"]:
        print(claims.report(record["claims_changed"], previous.get("started", "?")))
    elif why_not is None:
        print(f"claims: the same verdicts as the run of {previous.get('started', '?')} here")
    else:
        print(f"claims: not compared ({why_not})")
    rows = findings.verdict_rows(record, merged)
    verdict = findings.plain(findings.verdict_lead(merged, rows)) if rows else None
    print(progress.summary(record, [nb.stem for nb in selected], out_dir, verdict or None))
    print(f"reports: {index}")


# ---------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The options of `spire run` (command "run") or `spire check` ("check")."""
    parser.add_argument("--params", type=Path, required=True, help="params YAML (see params/README.md)")
    parser.add_argument("--notebooks", type=Path, default=project_root() / "notebooks", help="the series' folder")
    parser.add_argument("--only", help="comma-separated notebook numbers or stems, e.g. 01,04")
    parser.add_argument("--dry-run", action="store_true",
                        help="the same shapes with every budget scaled down, on the CPU (params/README.md)")
    parser.add_argument("--corpus-path", help="replaces the series' corpus_path (e.g. a LongCrawl64 fixture)")
    if command == "run":
        parser.add_argument("--out", type=Path,
                            help="output folder (default: outputs/STEM, or outputs/STEM-dry-run; STEM: the params "
                                 "file's stem)")
        parser.add_argument("--plan", action="store_true",
                            help="print what the run will cost (work, FLOPs, predicted time here and on GPUs); "
                                 "run nothing")
        parser.add_argument("--recalibrate", action="store_true",
                            help="measure every figure of the plan again, ignoring the calibration's cache "
                                 "(after a calibration made while the machine was busy)")
        parser.add_argument("--log-output", action="store_true", help="stream cell output while running")
        parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")
        parser.add_argument("--cell-timeout", type=float, default=3600.0,
                            help="seconds one cell may run before the notebook fails (default: 3600; 0: no limit)")


def command(args: argparse.Namespace) -> int:
    """`spire run` or `spire check` (args.command): 0 when it ran or checked clean, 1 when a notebook
    failed, 2 when the params file (or the notebooks' folder) was refused before anything ran."""
    notebooks_dir = args.notebooks.resolve()
    try:
        default_out = project_root() / "outputs" / (args.params.stem + (DRY_RUN_SUFFIX if args.dry_run else ""))
        if args.command == "check":
            corpus_path = args.corpus_path
            if args.dry_run and corpus_path is None:
                corpus_path = dry_run_corpus(args.params, default_out, write=False)
            _, selected, injected = prepare(args.params, notebooks_dir, args.only, dry_run=args.dry_run,
                                            corpus_path=corpus_path)
            for nb in selected:
                print(f"{nb.stem}: {injected[nb.stem] or '(defaults)'}")
            print(f"{args.params}: ok ({len(selected)} notebooks)")
            return 0
        out_dir = args.out or default_out
        return run(args.params, notebooks_dir, out_dir, args.only, args.log_output, args.kernel,
                   args.cell_timeout or None, dry_run=args.dry_run, corpus_path=args.corpus_path,
                   plan_only=args.plan, recalibrate=args.recalibrate)
    except (ParamsError, FileNotFoundError, MissingExtra) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
