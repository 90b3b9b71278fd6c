"""Run the numbered notebook series headlessly and write the HTML reports (docs/ARCHITECTURE.md).

    spire run   --params params/default.yaml [--only 01,04] [--out DIR] [--log-output] [--plan] [--recalibrate]
    spire check --params params/smoke.yaml
    spire run   --params params/paper.yaml --dry-run [--corpus-path DIR]

`run` validates the params file against every notebook's `parameters` cell (`injection.prepare`:
no kernel starts if anything is wrong), then executes the selected `notebooks/NN_*.ipynb` in order with
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
(`injection.dry_run_parameters`: the series through `spirelib.training.series.dry_run`, each notebook's sizes
through their contracts, `notebooks.NOTEBOOKS`), on the CPU, into outputs/<params file stem>-dry-run/ with its own
model cache (<out>/cache, unless SPIRE_CACHE_DIR is set). A LongCrawl64 series whose
corpus_path holds no dataset runs on a generated fixture (<out>/longcrawl64-fixture,
`spirelib.training.corpus.write_longcrawl64_fixture`); `--corpus-path` points the series at another corpus
folder, in any run.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
from pathlib import Path

from spirelib.paths import project_root, resolve_path
from spirelib.training import corpus
from spirelib.training.devices import resolve_device
from spirelib.training.params import ParamsError, load_params
from spirelib.workbook import claims, deploy, findings, plan, probe, progress, results
from spirelib.workbook.injection import default_parameters, prepare

DRY_RUN_SUFFIX = "-dry-run"  # outputs/<params file stem>-dry-run
FIXTURE_FOLDER = "longcrawl64-fixture"  # under a dry run's output folder


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


# parameters: spire run's options, one per flag (`add_arguments`), the file and the folders first
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
    kernels = execute.Kernels(notebooks_dir, log_output, kernel, cell_timeout, dry_run)
    status = _run_notebooks(execute, report, selected, injected, record, out_dir, planned, kernels)
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
                   planned, kernels) -> str:
    """Each notebook executed in turn on `kernels` (`execute.Kernels`; the index rewritten as it starts), its progress
    on the terminal, its results merged, its report exported and its `record` entry written, until one does not
    finish "ok": that status, or "ok"."""
    run_file, results_file = out_dir / "run.json", out_dir / "results.json"
    status = "ok"
    log_output = kernels.log_output
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
            status, seconds, error = execute.execute(nb, injected[nb.stem], out_dir, kernels, feed)
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
