"""Each notebook's contract (`workbook.notebooks`): the series' notebooks are the contracts' stems,
the plan prices only notebooks with a contract, and a notebook may record only the results keys its
contract names (what results.json's readers rely on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spirelib.workbook import results
from spirelib.workbook.notebooks import NOTEBOOKS
from spirelib.workbook.work import WORK

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def test_every_notebook_of_the_series_has_a_contract_and_the_plan_prices_only_those():
    assert sorted(NOTEBOOKS) == sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert set(WORK) <= set(NOTEBOOKS)


def test_a_notebook_records_only_the_keys_its_contract_names(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_FILE_ENV, str(tmp_path / "04_measure_tau.json"))
    results.record("tau", {"spire": 3.2})
    with pytest.raises(ValueError, match="04_measure_tau records 'taus', which its contract does not name"):
        results.record("taus", {"spire": 3.2})
    assert results.recorded() == {"tau": {"spire": 3.2}}
    monkeypatch.setenv(results.RESULTS_FILE_ENV, str(tmp_path / "01_record.json"))  # no notebook of the series
    results.record("anything", 1)
