"""Params files: safe YAML with a `series`, a `shared` and a `notebooks` section (params/README.md).

The file format and its errors live here, below the workbook, because every command reads it:
`spire train` takes the `series` section (`spirelib.training.series.Series`), `spire run` and
`spire check` resolve the other two against the notebooks' `parameters` cells
(`spirelib.workbook.runner`). Every problem is reported at once, with a close match where one
exists, and nothing runs.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml

SECTIONS = ("series", "shared", "notebooks")


class ParamsError(ValueError):
    """A params file that does not fit the series or the notebooks; the message lists every problem."""


def suggest(word: str, candidates) -> str:
    """' (did you mean ...?)' naming the closest of `candidates` to a mistyped `word`, or ''."""
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def problem_report(source, problems: list[str]) -> str:
    """One message for every problem found in `source`, saying that nothing ran."""
    head = f"{source}: {len(problems)} problem{'s' if len(problems) > 1 else ''}, nothing was run:"
    return "\n".join([head] + [f"  {p}" for p in problems])


def load_params(path: Path) -> dict[str, dict]:
    """Read a params file (safe YAML) into {"series": {...}, "shared": {...}, "notebooks": {stem: {...}}}."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping with the keys {', '.join(SECTIONS)}")
    problems = [f"{k}: unknown top-level key{suggest(k, SECTIONS)}; allowed: {', '.join(SECTIONS)}"
                for k in raw if k not in SECTIONS]
    series, shared, notebooks = raw.get("series") or {}, raw.get("shared") or {}, raw.get("notebooks") or {}
    if not isinstance(series, dict):
        problems.append("series: must map series fields to values (spirelib.training.series)")
        series = {}
    if not isinstance(shared, dict):
        problems.append("shared: must map parameter names to values")
        shared = {}
    if not isinstance(notebooks, dict):
        problems.append("notebooks: must map notebook stems to sections of parameter values")
        notebooks = {}
    for stem, section in notebooks.items():
        if section is not None and not isinstance(section, dict):
            problems.append(f"notebooks.{stem}: must map parameter names to values")
    if problems:
        raise ParamsError(problem_report(path, problems))
    return {"series": series, "shared": shared,
            "notebooks": {s: sec if isinstance(sec, dict) else {} for s, sec in notebooks.items()}}
