"""Named results that notebooks record, and the results of earlier notebooks of a run.

A notebook calls `record("tau", 3.2)`; the runner (`spirelib.workbook.runner`) tells the kernel,
through environment variables, where this notebook's results go and where the run's merged
results live, and after every notebook it merges them into `outputs/<run>/results.json`,
keyed by notebook stem. A later notebook reads them back with
`run_results()["04_measure_tau"]["tau"]`.

Run interactively (no runner, e.g. in JupyterLab) results are kept in memory only:
`recorded()` shows them and `run_results()` is `{}`.

Values must be JSON-able: None, bool, int, float (NaN and inf are kept), str, and lists,
tuples and str-keyed dicts of those. numpy scalars and arrays, and anything with `.tolist()`
(torch tensors), are converted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from spirelib.paths import write_atomically
from spirelib.workbook.notebooks import undeclared

RESULTS_FILE_ENV = "SPIRE_RESULTS_FILE"
"""Where the runner wants this notebook's results (a JSON object, key -> value)."""

RUN_RESULTS_ENV = "SPIRE_RUN_RESULTS"
"""The run's merged results.json (notebook stem -> {key: value})."""

_in_memory: dict[str, Any] = {}


def to_jsonable(value: Any, where: str = "value") -> Any:
    """`value` as plain JSON types; TypeError naming `where` if it cannot be converted."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: dict keys must be str, got {k!r} ({type(k).__name__})")
            out[k] = to_jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "to_dict"):
        return to_jsonable(value.to_dict(), where)  # a shape `throughput.recorded` reads back typed
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
        return to_jsonable(value.item(), where)  # numpy scalar, 0-d array or tensor
    if hasattr(value, "tolist"):
        return to_jsonable(value.tolist(), where)  # numpy array, torch tensor
    raise TypeError(f"{where}: cannot record a {type(value).__name__}; use numbers, str, lists or dicts")


def record(key: str, value: Any) -> None:
    """Record the result `key` of this notebook; recording the same key again replaces it."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"result key must be a non-empty str, got {key!r}")
    value = to_jsonable(value, key)
    path = os.environ.get(RESULTS_FILE_ENV)
    problem = undeclared(Path(path).stem, key) if path else None  # the runner names the file after the notebook
    if problem:
        raise ValueError(problem)
    if not path:
        _in_memory[key] = value
        return
    results = read_json(Path(path))
    results[key] = value
    write_json(Path(path), results)


def record_all(results: dict[str, Any]) -> None:
    """`record(key, value)` for every item of `results`, in order (one call for a cell's
    several results; the keys are results.json's)."""
    for key, value in results.items():
        record(key, value)


def recorded() -> dict[str, Any]:
    """What this notebook has recorded so far."""
    path = os.environ.get(RESULTS_FILE_ENV)
    return read_json(Path(path)) if path else dict(_in_memory)


def run_results() -> dict[str, dict[str, Any]]:
    """Results of earlier notebooks of this run, keyed by notebook stem; {} without the runner."""
    path = os.environ.get(RUN_RESULTS_ENV)
    return read_json(Path(path)) if path else {}


def read_json(path: Path) -> dict:
    """A JSON object from `path`, or {} if the file does not exist."""
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def write_json(path: Path, obj: Any) -> None:
    """Write `obj` to `path` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, allow_nan=True) + "\n"))
