"""A params file against the notebook series (docs/ARCHITECTURE.md, params/README.md): the series'
notebooks (`discover`, `select`), each notebook's `parameters` cell read without a kernel
(`parameters_cell`: what papermill would report), and the injections a params file gives each
notebook (`resolve`: the `series` section to every notebook declaring `series`, shared keys where
declared, a notebook's own section over them, every value checked against its annotation), scaled
down for a dry run (`dry_run_parameters`) and checked together by each notebook's contract
(`consistency_problems`). `prepare` does all of it before any kernel starts, every problem reported
at once with a close match (`training.params`); `spire run` and `spire check` call it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from pathlib import Path
from typing import Any

from spirelib.training import series as series_config
from spirelib.training.params import ParamsError, load_params, problem_report, suggest
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
