"""Every notebook of the series executes under params/smoke.yaml through the runner.

One runner invocation per notebook (`--only NN`), in series order, all into one output
folder, so a notebook sees the results of the earlier ones (as in a full run) and a failure
is attributed to the notebook that failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spirelib import cli
from spirelib.workbook import runner

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SERIES = runner.discover(NOTEBOOKS) if NOTEBOOKS.is_dir() else []


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke")


@pytest.mark.parametrize("notebook", SERIES, ids=[p.stem for p in SERIES])
def test_notebook_runs_under_smoke_params(notebook, smoke_out):
    rc = cli.main(["run", "--params", str(ROOT / "params" / "smoke.yaml"), "--notebooks", str(NOTEBOOKS),
                        "--only", notebook.stem, "--out", str(smoke_out), "--cell-timeout", "900"])
    entry = json.loads((smoke_out / "run.json").read_text())["notebooks"][notebook.stem]
    assert rc == 0 and entry["status"] == "ok", f"{notebook.name}: {entry.get('error')} (report: {smoke_out})"
    assert (smoke_out / f"{notebook.stem}.html").is_file()
